"""One replica's layout: each engine's notation mapped to GPUs once, and the traffic of a replica
that spans several NVLink domains (docs/multinode.md).

capplan's own notation (EngineSettings) is the one AIConfigurator's rows use: `tp` GPUs of
attention tensor parallelism per data-parallel rank, `attention_dp` ranks, so a pipeline stage
has world = tp x attention_dp GPUs, which the MoE layers split as expert_parallel x moe_tp.
The engines write it differently:

- vLLM: `--tensor-parallel-size T --data-parallel-size D` is T x D GPUs (D engines of T GPUs;
  vllm/config/parallel.py ParallelConfig.world_size_across_dp = T x PP x D, v0.10);
- SGLang: `--tp W --enable-dp-attention --dp D` is W GPUs: the D attention ranks live INSIDE the
  TP group, each of W / D GPUs (python/sglang/srt/server_args.py: "assert tp_size % dp_size == 0"
  under enable_dp_attention; layers/dp_attention.py attn_tp_size = tp_size // dp_size, v0.5);
- TensorRT-LLM: `tensor_parallel_size W` with `enable_attention_dp: true` makes every one of the
  W ranks its own attention group (attention TP 1, D = W; tensorrt_llm/mapping.py Mapping,
  enable_attention_dp, 1.x).

Pure functions of numbers and specs: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capplan.errors import InputError

ENGINE_NOTATION = {
    "vllm": "--tensor-parallel-size x --data-parallel-size GPUs",
    "sglang": "--tp is the world; --enable-dp-attention --dp splits it",
    "trtllm": "tensor_parallel_size is the world; enable_attention_dp gives attention TP 1",
}


def tp_from_engine_notation(engine: str, tp: int, attention_dp: int) -> int:
    """capplan's attention TP per DP rank for an engine's own `--tp` and attention-DP size.

    vLLM's TP already is the per-rank size. SGLang's and TensorRT-LLM's `--tp` is the world:
    SGLang `--tp 8 --dp 8` is 8 GPUs of attention TP 1; `--tp 16 --dp 4` is 16 GPUs, 4 per
    rank. A `--tp 1` with attention DP D reads as D ranks of one GPU (the same 8 GPUs as
    `--tp 8 --dp 8`), the only reading of it either engine could launch.
    """
    if attention_dp <= 1 or engine == "vllm" or tp == 1:
        return tp
    if engine == "trtllm":
        if tp != attention_dp:
            raise InputError(
                f"--tp {tp} --attention-dp {attention_dp}: TensorRT-LLM's enable_attention_dp "
                f"makes each of its tensor_parallel_size ranks an attention rank (use --tp "
                f"{attention_dp} or --tp 1 with --attention-dp {attention_dp})")
        return 1
    if tp % attention_dp:
        raise InputError(
            f"--tp {tp} --attention-dp {attention_dp}: SGLang's --tp is the world size and "
            f"must be a multiple of --dp (server_args.py asserts tp_size % dp_size == 0)")
    return tp // attention_dp


def engine_world(engine: str, tp: int, attention_dp: int) -> dict[str, int]:
    """The sizes an engine's launch flags carry for capplan's (tp per rank, attention_dp):
    `tp` (its own --tp meaning), `dp`, and `gpus` per pipeline stage."""
    world = tp * attention_dp
    if engine == "vllm":
        return {"tp": tp, "dp": attention_dp, "gpus": world}
    return {"tp": world, "dp": attention_dp, "gpus": world}


def nodes_spanned(gpus: int, gpus_per_domain: int) -> int:
    """NVLink domains (nodes; racks on NVL72) that `gpus` GPUs fill, packed."""
    return max(1, math.ceil(gpus / max(gpus_per_domain, 1)))


def describe(tp: int, pp: int, attention_dp: int, expert_parallel: int,
             gpus_per_domain: int) -> str:
    """The footer's words for a replica: its GPUs first, never a bare "TP 1" for 8 GPUs.

    >>> describe(1, 1, 8, 8, 8)
    '8 GPUs: attention TP 1 x DP 8, EP 8'
    >>> describe(16, 1, 1, 1, 8)
    '16 GPUs over 2 nodes: TP 16'
    """
    gpus = tp * pp * attention_dp
    n = nodes_spanned(gpus, gpus_per_domain)
    head = f"{gpus} GPU{'s' if gpus > 1 else ''}" + (f" over {n} nodes" if n > 1 else "")
    parts = [f"attention TP {tp} x DP {attention_dp}" if attention_dp > 1 else f"TP {tp}"]
    if pp > 1:
        parts.append(f"PP {pp}")
    if expert_parallel > 1:
        parts.append(f"EP {expert_parallel}")
    return f"{head}: {', '.join(parts)}"


# ---------------------------------------------------------------------------------------------
# Traffic across NVLink domains
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Links:
    """The two paths of a multi-domain replica, effective (achievable) figures per GPU."""

    nvlink_bytes_per_s: float
    nvlink_latency_s: float
    net_bytes_per_s: float
    net_latency_s: float
    gpus_per_domain: int


def allreduce_cost(n_gpus: int, links: Links) -> tuple[float, float]:
    """(latency s, s per byte of the message) of one all-reduce over `n_gpus` that span
    domains: hierarchical, as NCCL runs it across nodes: reduce-scatter inside each domain over
    NVLink, all-reduce of each GPU's 1/g shard across the n domains over its own NIC (ring:
    2 (n-1)/n of the shard), all-gather inside the domain (Jia et al. 2018, "Highly scalable
    deep learning training system with mixed-precision", hierarchical all-reduce; NCCL's
    tree/ring over one NIC per GPU). Per byte of the message S:

        2 (g-1)/g / nvlink_bw  +  2 (n-1)/n / (g * net_bw)

    Latency: two NVLink phases plus 2 (n-1) ring steps across the network.
    Worked: TP 16 over two 8-GPU H100 nodes, S = 7168 x 2 B: 2 x 7/8 x S / 315 GB/s +
    2 x 1/2 x S / (8 x 35 GB/s) = 79.6 ns + 51.2 ns per token per all-reduce."""
    g = min(links.gpus_per_domain, n_gpus)
    n = nodes_spanned(n_gpus, links.gpus_per_domain)
    per_byte = 2 * (g - 1) / g / links.nvlink_bytes_per_s
    per_byte += 2 * (n - 1) / n / (g * links.net_bytes_per_s)
    latency = 2 * links.nvlink_latency_s + 2 * (n - 1) * links.net_latency_s
    return latency, per_byte


def gather_scatter_cost(n_gpus: int, links: Links) -> tuple[float, float]:
    """(latency s, s per byte of the replica's whole batch) of one all-gather plus one
    reduce-scatter over `n_gpus` GPUs spanning domains, hierarchical as `allreduce_cost`
    (each GPU ends with (W-1)/W of the batch: inside its domain over NVLink, from the other
    n-1 domains through the g NICs of its own domain)."""
    g = min(links.gpus_per_domain, n_gpus)
    n = nodes_spanned(n_gpus, links.gpus_per_domain)
    per_byte = 2 * ((g - 1) / n_gpus / links.nvlink_bytes_per_s
                    + (n - 1) / n / (g * links.net_bytes_per_s))
    latency = 2 * (links.nvlink_latency_s + (n - 1) * links.net_latency_s)
    return latency, per_byte


DEEPEP_SCALE_GROUP = 128
"""DeepEP's FP8 dispatch quantises each token per 128 channels, one fp32 scale each
(deepseek-ai/DeepEP docs/legacy.md: "FP8 dispatching and BF16 combining"; DeepSeek-V3 report
section 3.3: 1x128 activation tiles)."""


@dataclass(frozen=True)
class AllToAll:
    """Expert-parallel dispatch + combine of one MoE layer (DeepEP, docs/multinode.md)."""

    dispatch_bytes_per_copy: float
    combine_bytes_per_copy: float
    remote_frac: float
    """Share of a token's k expert copies whose expert lives in another domain."""
    local_frac: float
    """Share that goes to another GPU of the same domain (NVLink)."""
    latency_s: float
    """Per MoE layer: dispatch and combine, one network message round each."""
    s_per_token_per_gpu: float
    """Seconds per token a GPU sends (dispatch and combine, slowest path, imbalance included)."""


def ep_all_to_all(hidden: int, experts_per_tok: int, expert_parallel: int, links: Links, *,
                  fp8_dispatch: bool = True, imbalance: float = 1.0) -> AllToAll:
    """Dispatch and combine of one MoE layer as DeepEP runs them (low-latency mode: each of a
    token's k expert copies sent directly to its expert's GPU, FP8 out, BF16 back; the
    normal mode sends a token once per destination node and forwards it over NVLink, fewer
    network bytes than counted here: docs/perf.md, "Prefill of DeepSeek-V3/R1 against
    published deployments"):

        dispatch copy = hidden x 1 B + hidden / 128 x 4 B  (FP8 + per-128 scales; BF16: 2 B)
        combine copy  = hidden x 2 B
        network s per token = k x remote x (dispatch + combine) / net_bw x imbalance
        NVLink  s per token = k x local  x (dispatch + combine) / nvlink_bw x imbalance

    with remote = (EP - g) / EP of the copies under uniform routing over EP ranks of which g
    share a domain; the two paths run concurrently, so the slower sets the time. `imbalance`
    (>= 1) is the busiest rank's load over the mean: 1 assumes a balanced placement, what
    EPLB's redundant experts aim for (DeepSeek-V3 report section 3.4)."""
    if imbalance < 1:
        raise InputError(f"expert imbalance {imbalance}: must be >= 1 (max over mean load)")
    ep = max(expert_parallel, 1)
    g = min(links.gpus_per_domain, ep)
    disp = hidden * (1 + 4 / DEEPEP_SCALE_GROUP) if fp8_dispatch else hidden * 2.0
    comb = hidden * 2.0
    remote = (ep - g) / ep
    local = (g - 1) / ep
    k = experts_per_tok
    net = k * remote * (disp + comb) / links.net_bytes_per_s
    nvl = k * local * (disp + comb) / links.nvlink_bytes_per_s
    lat = 2 * (links.net_latency_s if remote > 0 else links.nvlink_latency_s)
    return AllToAll(disp, comb, remote, local, lat, max(net, nvl) * imbalance)
