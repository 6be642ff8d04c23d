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
Each engine's profile states which it is (EngineProfile.tp_flag_is_world, attention_dp_tp1;
sources["layouts"]).

Pure functions of numbers and specs: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from capplan.catalog.schema import MoeSpec
from capplan.errors import InputError
from capplan.models.engine import engine_profile


def tp_from_engine_notation(engine: str, tp: int, attention_dp: int, flags: str = "") -> int:
    """capplan's attention TP per DP rank for an engine's own `--tp` and attention-DP size.

    vLLM's TP already is the per-rank size. SGLang's and TensorRT-LLM's `--tp` is the world:
    SGLang `--tp 8 --dp 8` is 8 GPUs of attention TP 1; `--tp 16 --dp 4` is 16 GPUs, 4 per
    rank. A `--tp 1` with attention DP D reads as D ranks of one GPU (the same 8 GPUs as
    `--tp 8 --dp 8`), the only reading of it either engine could launch. The engine's profile
    says which notation it writes (EngineProfile.tp_flag_is_world) and whether its attention-DP
    ranks are single GPUs (attention_dp_tp1). `flags`: the options' prefix in an error (a P/D
    pool's "decode-" names --decode-tp and --decode-attention-dp).
    """
    prof = engine_profile(engine)
    tp_f, dp_f = f"--{flags}tp", f"--{flags}attention-dp"
    if attention_dp <= 1 or not prof.tp_flag_is_world or tp == 1:
        return tp
    if prof.attention_dp_tp1:
        if tp != attention_dp:
            raise InputError(
                f"{tp_f} {tp} {dp_f} {attention_dp}: TensorRT-LLM's enable_attention_dp "
                f"makes each of its tensor_parallel_size ranks an attention rank (use {tp_f} "
                f"{attention_dp} or {tp_f} 1 with {dp_f} {attention_dp})")
        return 1
    if tp % attention_dp:
        raise InputError(
            f"{tp_f} {tp} {dp_f} {attention_dp}: SGLang's --tp is the world size and "
            f"must be a multiple of --dp (server_args.py asserts tp_size % dp_size == 0)")
    return tp // attention_dp


def engine_world(engine: str, tp: int, attention_dp: int) -> dict[str, int]:
    """The sizes an engine's launch flags carry for capplan's (tp per rank, attention_dp):
    `tp` (its own --tp meaning: EngineProfile.tp_flag_is_world), `dp`, and `gpus` per pipeline
    stage."""
    world = tp * attention_dp
    return {"tp": world if engine_profile(engine).tp_flag_is_world else tp, "dp": attention_dp,
            "gpus": world}


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


DEEPEP_MODES = ("auto", "normal", "low_latency")
"""DeepEP's kernel sets as the engines name a choice between them: `normal` (high-throughput,
NVLink + RDMA forwarding), `low_latency` (pure RDMA) or `auto`, normal in a step with prompt
tokens and low-latency in a decode-only one (SGLang --deepep-mode, server_args.py, v0.5)."""


def deepep_mode(tp: int, attention_dp: int, expert_parallel: int, chosen: str,
                gpus_per_domain: int | None, runs: Iterable[str] = DEEPEP_MODES) -> str | None:
    """The DeepEP mode a MoE replica's expert all-to-all runs in, None when it runs none.

    DeepEP carries the MoE layers' traffic when attention DP ranks span NVLink domains with
    the experts sharded over every GPU of the world (EP = tp x attention_dp: SGLang sets
    ep_size = tp_size under --moe-a2a-backend deepep, server_args.py _handle_a2a_moe; vLLM's
    EP is the world; TensorRT-LLM's wide-EP MoE shards experts only) and a network joins the
    domains (`gpus_per_domain` None: none does). `chosen` is the mode the replica's engine
    runs (EngineSettings.deepep_mode, else its profile's), `runs` the modes its release
    launches (EngineProfile.deepep_flags). Otherwise the hidden states are all-gathered and
    reduce-scattered (`gather_scatter_cost`), each engine's default without DeepEP."""
    world = tp * attention_dp
    if (gpus_per_domain is None or attention_dp <= 1 or expert_parallel <= 1
            or expert_parallel != world or world <= gpus_per_domain):
        return None
    if chosen not in DEEPEP_MODES:
        raise InputError(f"DeepEP mode {chosen!r}: expected one of {', '.join(DEEPEP_MODES)}")
    return chosen if chosen in runs else None


DEEPEP_SCALE_GROUP = 128
"""DeepEP's FP8 dispatch quantises each token per 128 channels, one fp32 scale each
(deepseek-ai/DeepEP docs/legacy.md: "FP8 dispatching and BF16 combining"; DeepSeek-V3 report
section 3.3: 1x128 activation tiles)."""


@dataclass(frozen=True)
class AllToAll:
    """Expert-parallel dispatch + combine of one MoE layer (DeepEP, docs/multinode.md)."""

    dispatch_bytes_per_copy: float
    combine_bytes_per_copy: float
    network_copies: float
    """Copies of a token its GPU sends across the network (expected, per MoE layer)."""
    nvlink_copies: float
    """Copies of a token sent or forwarded to another GPU of a domain over NVLink."""
    latency_s: float
    """Per MoE layer: dispatch and combine, one network message round each."""
    s_per_token_per_gpu: float
    """Seconds per token a GPU sends (dispatch and combine, slowest path, imbalance included)."""


def _copy_bytes(hidden: int, fp8_dispatch: bool) -> tuple[float, float]:
    """(dispatch, combine) bytes of one copy of a token: FP8 + one fp32 scale per 128
    channels out (BF16 without FP8 dispatch), BF16 back."""
    disp = hidden * (1 + 4 / DEEPEP_SCALE_GROUP) if fp8_dispatch else hidden * 2.0
    return disp, hidden * 2.0


def _a2a(disp: float, comb: float, net_copies: float, nvl_copies: float, links: Links,
         imbalance: float) -> AllToAll:
    """The two paths run concurrently: the slower sets the time; one network latency each
    way when any copy crosses it."""
    if imbalance < 1:
        raise InputError(f"expert imbalance {imbalance}: must be >= 1 (max over mean load)")
    net = net_copies * (disp + comb) / links.net_bytes_per_s
    nvl = nvl_copies * (disp + comb) / links.nvlink_bytes_per_s
    lat = 2 * (links.net_latency_s if net_copies > 0 else links.nvlink_latency_s)
    return AllToAll(disp, comb, net_copies, nvl_copies, lat, max(net, nvl) * imbalance)


def ep_all_to_all(hidden: int, experts_per_tok: int, expert_parallel: int, links: Links, *,
                  fp8_dispatch: bool = True, imbalance: float = 1.0) -> AllToAll:
    """Dispatch and combine of one MoE layer as DeepEP's low-latency kernels run them (decode
    steps): each of a token's k expert copies goes straight to its expert's GPU over RDMA or
    NVLink (deepseek-ai/DeepEP README, "Low-latency kernels with pure RDMA"):

        dispatch copy = hidden x 1 B + hidden / 128 x 4 B  (FP8 + per-128 scales; BF16: 2 B)
        combine copy  = hidden x 2 B
        network s per token = k x (EP - g) / EP x (dispatch + combine) / net_bw x imbalance
        NVLink  s per token = k x (g - 1) / EP  x (dispatch + combine) / nvlink_bw x imbalance

    under uniform routing over EP ranks of which g share a domain; the slower path sets the
    time. `imbalance` (>= 1) is the busiest rank's load over the mean: 1 assumes a balanced
    placement, what EPLB's redundant experts aim for (DeepSeek-V3 report section 3.4).
    Prefill steps use the normal kernels: `ep_all_to_all_normal`."""
    ep = max(expert_parallel, 1)
    g = min(links.gpus_per_domain, ep)
    disp, comb = _copy_bytes(hidden, fp8_dispatch)
    k = experts_per_tok
    return _a2a(disp, comb, k * (ep - g) / ep, k * (g - 1) / ep, links, imbalance)


def _miss(pool: float, held: float, picks: int) -> float:
    """P(`picks` distinct items drawn uniformly from `pool` all avoid the `held` ones):
    C(pool - held, picks) / C(pool, picks), as a product (held may be fractional)."""
    out = 1.0
    for i in range(picks):
        out *= max(pool - held - i, 0.0) / (pool - i)
    return out


def p_touched(held: float, moe: MoeSpec) -> float:
    """Probability that a token's experts include one of the `held` experts of a unit (a GPU
    or a domain): 1 - P(no expert of the token on the unit), uniform routing. Without group
    limits the k experts are k distinct of E: 1 - C(E - held, k) / C(E, k). With DeepSeek's
    group-limited routing (config n_group G, topk_group m: the k experts lie in m of G equal
    groups, picked by the sum of each group's top k / m affinities, DeepSeek-V3 report section
    2.1.2) the m groups are drawn uniformly, each receiving k / m of the experts: a unit of
    whole groups (held G / E of them) is touched when one is drawn, 1 - C(G - held G / E, m) /
    C(G, m); a unit inside a group when its group is drawn and one of the group's k / m experts
    is the unit's, m / G x (1 - C(E / G - held, k / m) / C(E / G, k / m))."""
    e, k = float(moe.num_experts), moe.num_experts_per_tok
    groups, chosen = moe.n_group, moe.topk_group
    if chosen >= groups:
        return 1.0 - _miss(e, held, k)
    per_group = e / groups
    if held >= per_group:
        return 1.0 - _miss(groups, held / per_group, chosen)
    return chosen / groups * (1.0 - _miss(per_group, held, max(k // chosen, 1)))


def ep_all_to_all_normal(hidden: int, moe: MoeSpec, expert_parallel: int, links: Links, *,
                         fp8_dispatch: bool = True, imbalance: float = 1.0) -> AllToAll:
    """Dispatch and combine of one MoE layer as DeepEP's normal kernels run them (prefill
    steps): a token crosses the network once to each other domain holding one of its experts,
    to the GPU of its own local index there, which forwards it over NVLink to each distinct
    GPU of that domain holding one (deepseek-ai/DeepEP README, "Normal kernels with NVLink and
    RDMA forwarding"; `is_token_in_rank` is one boolean per token and rank); the combine
    reduces inside the domain and returns once per domain. Copies as `ep_all_to_all`'s:

        network copies = (EP - g) / g x p_touched(E g / EP)  (other domains holding one)
        NVLink copies  = (EP - EP / g) x p_touched(E / EP)   (GPUs not at its local index)

    Worked: DeepSeek-V3 (256 experts in 8 groups, 4 groups per token) at EP 32 over 4
    domains: 3 x (1 - C(6,4) / C(8,4)) = 2.36 network copies against the low-latency
    kernels' 6 (tests/unit/test_multinode.py)."""
    ep = max(expert_parallel, 1)
    g = min(links.gpus_per_domain, ep)
    disp, comb = _copy_bytes(hidden, fp8_dispatch)
    e = moe.num_experts
    net_copies = (ep - g) / g * p_touched(e * g / ep, moe)
    nvl_copies = (ep - ep / g) * p_touched(e / ep, moe)
    return _a2a(disp, comb, net_copies, nvl_copies, links, imbalance)
