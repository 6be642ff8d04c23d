"""Disaggregated prefill/decode: a pool of P prefill replicas and one of D decode replicas.

A request is prefilled on a prefill replica, its KV cache moves to a decode replica, which
decodes the rest (vLLM with a KV connector, `vllm/distributed/kv_transfer`, NixlConnector;
SGLang `--disaggregation-mode prefill|decode`; DistServe, Zhong et al., OSDI 2024; Splitwise,
Patel et al., ISCA 2024). Per request:

    TTFT = prefill-pool queue + prefill + KV transfer + decode-pool admission + one step
    TBT  = the decode pool's step alone (no prefill chunk ever shares a decode step)

Each pool is one replica's analytic queue (models/queueing/) at its share of the rate:
- the prefill pool serves prompts with a one-token output (its first token, which vLLM's
  disaggregated proxy requests with max_tokens=1);
- the decode pool receives prompts whose KV arrived with the request: a prefix-cache hit on
  all but the last prompt token (models/prefix.py `PrefixCache`), so its prefill work is one
  token per request while the KV and attention still cover the whole prompt.

KV transfer: each decode GPU receives its own shard, kv_bytes_per_token_per_gpu per token,
over its own link, all shards in parallel: t = latency + tokens * bytes / bandwidth
(AIConfigurator's P2POp: bytes / inter_node_bw + p2p_latency).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from capplan.models.prefix import PrefixCache
from capplan.models.queueing import LengthStats


@dataclass(frozen=True)
class Link:
    """The path a KV cache takes from a prefill GPU to a decode GPU."""

    name: str
    bytes_per_s: float
    """Per GPU, per direction."""
    latency_s: float
    source: str
    in_domain: bool = False
    """Inside one NVLink domain (the node's own GPU link), not over the network."""


INTER_NODE = Link(
    "network (400 Gb/s per GPU)", 50e9, 10e-6,
    "AIConfigurator systems/*.yaml node: inter_node_bw 50e9 B/s (one 400 Gb/s NDR InfiniBand "
    "NIC per GPU, as DGX H100/B200) and p2p_latency 1e-5 s")
NVLINK_LATENCY_S = 10e-6
"""Per-transfer latency within an NVLink domain: AIConfigurator uses the same p2p_latency
(1e-5 s) for its point-to-point operator; bandwidth is the GPU's own NVLink figure."""


def kv_link(nvlink_bytes_per_s: float, same_domain: bool, name: str = "NVLink") -> Link:
    """The node's own GPU link when prefill and decode GPUs share its domain (a node; a GB200
    NVL72 rack), named as the catalog's interconnect is (NVLink, or PCIe on PCIe cards), else
    the network."""
    if same_domain:
        return Link(name, nvlink_bytes_per_s, NVLINK_LATENCY_S,
                    "the GPU catalog's interconnect bandwidth (per GPU, per direction)", True)
    return INTER_NODE


def kv_transfer_s(prompt_tokens: ArrayLike, kv_bytes_per_token_per_gpu: float,
                  link: Link) -> np.ndarray:
    """Seconds to move a prompt's KV cache: latency + tokens * bytes per token / bandwidth.

    Worked: Llama-3.1-8B in bf16 holds 128 KiB per token (32 layers x 8 KV heads x 128 x 2
    x 2 bytes); a 4096-token prompt is 512 MiB: 10.7 ms over a 50 GB/s NIC, 1.2 ms over
    H100 NVLink (450 GB/s)."""
    t = np.asarray(prompt_tokens, float)
    return link.latency_s + t * kv_bytes_per_token_per_gpu / link.bytes_per_s


def decode_side_prefix(inp: LengthStats) -> PrefixCache:
    """What the decode pool computes of a prompt whose KV arrived: its last token only (the
    connector's loaded tokens are a cache hit capped at prompt - 1, as any vLLM hit)."""
    ones = np.ones(len(inp.table) or 1)
    return PrefixCache(cached_tokens_mean=max(inp.mean - 1.0, 0.0),
                       prefill_tokens=tuple(ones.tolist()))
