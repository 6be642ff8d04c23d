"""Step time of one engine iteration, per GPU: decode, prefill and mixed chunked-prefill steps.

For a step that pushes T tokens through the model (decode tokens plus prefill-chunk tokens):

    linear   = smax(weight_bytes / (BW * mem_bw_frac),  linear_flops / (peak * gemm_eff(T)))
    attention= smax(kv_read_bytes / (BW * attn_bw_frac), attn_flops / (peak16 * attn_frac))
    comm     = 2 * layers * min(latency + (tp-1) * T * hidden * 2 B / link_bw,        (one-shot)
                                 2 latency + 2 (tp-1)/tp * T * hidden * 2 B / link_bw) (two-shot)
    gpu      = pp * (linear + attention + comm + layers * per_layer_overhead)
    host     = per_seq_overhead * seqs
    step     = step_overhead + layers * layer_step_overhead
               + (max(gpu, host) with host overlap, else gpu + host)

- weights are read once per step (roofline, Williams et al. 2009); for MoE only the experts
  the batch touches, E * (1 - (1 - k/E)^T) per layer in expectation under uniform routing;
- every decode sequence reads its whole KV cache (sliding-window layers at most the window);
- attention FLOPs: 4 * heads * head_dim per query-key pair (QK^T and PV; FlashAttention paper);
  causal prefill of a chunk of c tokens after p cached ones has c*p + c(c+1)/2 pairs;
- two all-reduces per layer under tensor parallelism (Megatron-LM, Shoeybi et al. 2019);
- smax is a smooth maximum (p-norm, p=4): kernels near the ridge point reach neither roof.
- speculative decoding (models/speculative.py): a step with decoders verifies V tokens per
  decoder after the drafter's passes and emits tau; it is charged per emitted token,
  step_spec = [step(V tokens per decoder, tau x the prefill work) + draft] / tau
              + per_seq_overhead * decoders * (1 - 1/tau)      (exactly step at V = tau = 1);
- LoRA (models/lora.py): + distinct adapters in the batch x adapter bytes / BW + the punica
  kernels' fixed cost; vision (models/vision.py): + encoder FLOPs per prefill token.

Everything is numpy-vectorised: each input may be an array; constants may be arrays too
(one per configuration), so a whole grid evaluates in one call. Derivation: docs/perf.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from capplan.catalog.schema import GpuSpec, ModelSpec
from capplan.models import layers as model_layers
from capplan.models import lora, speculative
from capplan.models.calibration import Calibration, default_calibration
from capplan.models.engine import EngineProfile, EngineSettings
from capplan.models.layout import (
    Links,
    allreduce_cost,
    deepep_mode,
    ep_all_to_all,
    ep_all_to_all_normal,
    gather_scatter_cost,
)
from capplan.models.memory import (
    kv_bytes_per_token_per_layer,
    kv_dtype_bytes,
    param_counts,
    validate_settings,
    weight_dtypes,
)
from capplan.units import cdiv

SMOOTH_P = 4.0
LOW_PRECISION = ("fp8", "int8", "fp4")
BOUNDS = ("memory", "compute", "communication", "overhead")


def smooth_max(a: np.ndarray, b: np.ndarray, p: float = SMOOTH_P) -> np.ndarray:
    """p-norm of (a, b): max(a, b) <= smax <= 2^(1/p) max(a, b)."""
    if p == 4.0:  # the default: two squarings are much cheaper than a general power
        a2, b2 = a * a, b * b
        return np.sqrt(np.sqrt(a2 * a2 + b2 * b2))
    return (a**p + b**p) ** (1.0 / p)


def select(cond: Any, a: Any, b: Any) -> Any:
    """np.where(cond, a, b) for `step_parts`; the compiled simulator gives numba a scalar
    version (numba's np.where makes a 0-d array of scalars, a heap allocation per call)."""
    return np.where(cond, a, b)


def busiest_share(nps: Any, dp: Any) -> Any:
    """The share of a step's prompt work on its busiest attention-DP rank.

    Each prompt runs on one DP rank (its TP group) and the step waits for the busiest rank
    ("the execution time of the Attention module in any given iteration is bounded by the
    rank with the highest workload", TensorRT-LLM tech blog 10, ADP Balance Strategy; SGLang's
    and vLLM's DP ranks run their own schedulers in lockstep through the MoE layers alike).
    The engines deal prompts to ranks round-robin, so n chunks of a step (n <= dp) sit one per
    rank and the busiest holds 1 / n of the prompt work; from dp chunks on every rank fills its
    own token budget (each rank chunks its prompts) and holds 1 / dp. A fraction of a chunk (a
    mean below one, as the analytic screen passes) is one prompt's: all of it on one rank.
    Exactly 1 at dp = 1."""
    return np.maximum(1.0 / dp, 1.0 / np.maximum(nps * 1.0, 1.0))


def chunk_attention(chunk_tokens: Any, prefix_tokens: Any, window: Any) -> tuple[Any, Any, Any]:
    """Attention work of a causal prefill chunk: c new tokens after p cached ones.

    Returns (pairs, pairs_window, kv_read_window):
      pairs = c*p + c(c+1)/2 (the chunk's i-th query sees p + i keys, i = 1..c; causal mask);
      pairs_window = min(pairs, c*w - [p = 0] cw(cw-1)/2), cw = min(c, w): each query sees at
        most w keys of a sliding window (exact when p = 0 or p + c <= w, an upper bound between);
      kv_read_window = min(p, w), the cached tokens a window layer reads.
    The one home of this formula (StepModel.prefill_chunk, the simulator and request batching
    call it). Python numbers in, Python numbers out, so the simulator can call it per chunk;
    numpy arrays broadcast.
    """
    c, p, w = chunk_tokens, prefix_tokens, window
    arrays = isinstance(c, np.ndarray) or isinstance(p, np.ndarray) or isinstance(w, np.ndarray)
    mn = np.minimum if arrays else min
    pairs = c * p + c * (c + 1) / 2
    cw = mn(c, w)
    pairs_w = mn(pairs, c * w - (p <= 0) * (cw * (cw - 1) / 2))
    return pairs, pairs_w, mn(p, w)


STEP_CONSTANTS = ("dense_weight_bytes", "expert_bytes", "num_moe_layers", "num_experts",
                  "experts_per_tok", "kv_bytes_per_token_layer", "full_layers", "window_layers",
                  "dense_flops_per_token", "expert_flops_per_token", "lm_head_flops_per_token",
                  "attn_flops_per_pair_decode", "attn_flops_per_pair_prefill", "mem_bytes_per_s",
                  "kv_bytes_per_s", "expert_bytes_per_s", "gemm_flops_per_s", "attn_flops_per_s",
                  "gemm_half_tokens", "allreduce_s_fixed", "allreduce_s_per_token", "pp",
                  "p2p_s_per_token", "step_overhead_s", "per_seq_overhead_s", "layer_overhead_s",
                  "state_bytes_per_seq", "allreduce_s_per_token_oneshot", "attention_dp",
                  "expert_parallel", "moe_comm_s_fixed", "moe_comm_s_per_token", "host_overlap",
                  "spec_verify_tokens", "spec_accept_len", "draft_weight_bytes",
                  "draft_flops_per_token", "draft_steps", "draft_width",
                  "draft_kv_bytes_per_token", "draft_overhead_s", "lora_adapter_bytes",
                  "lora_n1", "lora_q1", "lora_n2", "lora_q2", "lora_n3", "lora_q3", "lora_n4",
                  "lora_q4", "lora_max_loras", "lora_flops_per_token", "lora_overhead_s",
                  "prefill_extra_flops_per_token", "spec_step_overhead_s", "expert_flops_per_s",
                  "prefill_rate_frac", "moe_comm_s_fixed_prefill", "moe_comm_s_per_token_prefill")
"""`StepModel` fields that `step_parts` takes, in its order."""
_N_BASE = STEP_CONSTANTS.index("spec_verify_tokens")
"""Constants before the feature terms (speculative decoding, LoRA, vision)."""
(_KV_BPTL, _FULL, _WINDOW, _ATTN_DEC, _ATTN_PRE, _KV_BW, _ATTN_FLOPS, _STATE, _ATTN_DP,
 _DRAFT_KV, _PREFILL_RATE) = (STEP_CONSTANTS.index(n) for n in (
    "kv_bytes_per_token_layer", "full_layers", "window_layers", "attn_flops_per_pair_decode",
    "attn_flops_per_pair_prefill", "kv_bytes_per_s", "attn_flops_per_s", "state_bytes_per_seq",
    "attention_dp", "draft_kv_bytes_per_token", "prefill_rate_frac"))
"""Positions of the constants `attention_parts` reads."""


def step_parts(x: tuple, c: tuple, moe: bool, features: bool = True) -> tuple:
    """The step-time formula (module docstring), written once for numpy and numba.

    `x` = (num_decode, decode_kv_tokens, decode_kv_tokens_window, prefill_tokens, prefill_pairs,
    prefill_pairs_window, prefill_kv_read, prefill_kv_read_window, num_prefill_seqs, num_logits)
    as floats or arrays; `c` = the `STEP_CONSTANTS` values; `moe`: any num_experts > 0;
    `features` False: speculative decoding and LoRA are off (`features_off`: their terms are
    exact zeros and are skipped; the same result).
    Only operations that numpy and numba's nopython mode both accept on scalars and arrays, so
    `StepModel.step` evaluates it on arrays and the compiled simulator
    (`capplan.sim.compiled`) calls `numba.njit(step_parts)` per step on floats.
    Returns (step_s, dense_mem, expert_mem, kv_mem, dense_cmp, expert_cmp, attn_cmp, comm, p2p,
    overhead, pp).

    It is `combine_parts(fixed_parts(x, c, moe), attention_parts(x, c))`: the compiled
    simulator evaluates `fixed_parts` once for a stretch of decode steps that differ only in
    their KV reads and `attention_parts` per step (the same operations, so the same bits).
    """
    return combine_parts(fixed_parts(x, c, moe, features), attention_parts(x, c, features))


_OFF = {"spec_verify_tokens": 1.0, "spec_accept_len": 1.0, "draft_weight_bytes": 0.0,
        "draft_flops_per_token": 0.0, "draft_steps": 0.0, "draft_kv_bytes_per_token": 0.0,
        "draft_overhead_s": 0.0, "spec_step_overhead_s": 0.0, "lora_adapter_bytes": 0.0,
        "lora_n1": 0.0, "lora_n2": 0.0, "lora_n3": 0.0, "lora_n4": 0.0,
        "lora_flops_per_token": 0.0, "lora_overhead_s": 0.0}
"""The constants of speculative decoding and LoRA at which their terms of `step_parts` are
exact zeros (no drafter, one token verified and emitted per decoder, no adapter)."""


def _shape(consts: tuple) -> tuple[int, ...]:
    """The broadcast shape of the constants (of their distinct shapes: the same, faster)."""
    return np.broadcast_shapes(*{np.shape(v) for v in consts})


def features_off(c: tuple) -> bool:
    """Whether speculative decoding and LoRA are off in every configuration of the constants
    `c` (`STEP_CONSTANTS` order): `step_parts(..., features=False)` then gives its result."""
    return all(bool(np.all(np.asarray(c[STEP_CONSTANTS.index(k)]) == v))
               for k, v in _OFF.items())


def feature_inputs(x: tuple, c: tuple) -> tuple:
    """Speculative decoding's view of a step's inputs: (x', g, v) (`step_parts`).

    A step with decoders is 1/tau of a speculative step (capplan/models/speculative.py): each
    decoder is verified over V tokens and, in the tau emitted tokens' time, the step takes tau
    of its prefill work (chunk tokens, pairs, KV reads, sequences and their logits). g = tau
    when the step has decoders, else 1. Without speculation V = tau = 1: x' is x exactly.
    """
    bd, kv_full, kv_win, tp_, pairs, pairs_w, pre_read, pre_read_w, nps, logits = x
    v = c[_N_BASE] * 1.0  # spec_verify_tokens
    g = select(bd > 0, c[_N_BASE + 1] * 1.0, 1.0)  # spec_accept_len
    return ((bd, kv_full, kv_win, tp_ * g, pairs * g, pairs_w * g, pre_read * g,
             pre_read_w * g, nps * g, bd * v + (logits - bd) * g), g, v)


def fixed_parts(x: tuple, c: tuple, moe: bool, features: bool = True) -> tuple:
    """The step's terms that do not read the KV cache: (linear, dense_mem, expert_mem,
    dense_cmp, expert_cmp, comm, p2p, overhead, pp, tokens, host, host_overlap, layer, fixed,
    extra, g, seq_cost, kv_passes) (`step_parts`; overhead as if nothing overlapped:
    `combine_parts` hides the host's share); extra = LoRA and the drafter's weights, FLOPs and
    fixed costs, g the speculative scale, seq_cost the per-sequence host cost of the decoders,
    kv_passes the draft passes that read the drafter's KV (all 0/1 without the features).
    `features` False: the caller knows speculative decoding and LoRA are off (`features_off`),
    so their terms, exact zeros then, are not evaluated (the same result, fewer operations)."""
    if features:
        x, g, v = feature_inputs(x, c)
    else:  # feature_inputs at V = tau = 1: x itself, the logits as it rounds them
        x, g, v = x[:9] + (x[0] + (x[9] - x[0]),), 1.0, 1.0
    bd, _, _, tp_, _, _, _, _, nps, logits = x
    (dense_weight_bytes, expert_bytes, num_moe_layers, num_experts, experts_per_tok,
     kv_bytes_per_token_layer, full_layers, window_layers, dense_flops_per_token,
     expert_flops_per_token, lm_head_flops_per_token, attn_flops_per_pair_decode,
     attn_flops_per_pair_prefill, mem_bytes_per_s, kv_bytes_per_s, expert_bytes_per_s,
     gemm_flops_per_s, attn_flops_per_s, gemm_half_tokens, allreduce_s_fixed,
     allreduce_s_per_token, pp, p2p_s_per_token, step_overhead_s, per_seq_overhead_s,
     layer_overhead_s, state_bytes_per_seq, allreduce_s_per_token_oneshot, attention_dp,
     expert_parallel, moe_comm_s_fixed, moe_comm_s_per_token, host_overlap, spec_verify_tokens,
     spec_accept_len, draft_weight_bytes, draft_flops_per_token, draft_steps, draft_width,
     draft_kv_bytes_per_token, draft_overhead_s, lora_adapter_bytes, lora_n1, lora_q1, lora_n2,
     lora_q2, lora_n3, lora_q3, lora_n4, lora_q4, lora_max_loras, lora_flops_per_token,
     lora_overhead_s, prefill_extra_flops_per_token, spec_step_overhead_s,
     expert_flops_per_s, prefill_rate_frac, moe_comm_s_fixed_prefill,
     moe_comm_s_per_token_prefill) = c
    dec = bd > 0
    bd_rows = bd * v
    tokens = bd_rows + tp_
    seqs_all = bd + nps
    extra_flops = tp_ * prefill_extra_flops_per_token  # vision encoder (models/vision.py)
    # The engine's prefill GEMMs at prefill_rate_frac of the catalog's rate
    # (EngineProfile.prefill_rate_frac): each prompt token's FLOPs count 1 / frac times;
    # exactly 0 extra at 1.
    slow = tp_ * (1.0 / prefill_rate_frac - 1.0)
    # Attention data parallelism: each rank is a TP group running attention and the dense
    # layers on its own requests (vLLM --data-parallel-size, SGLang --enable-dp-attention,
    # TensorRT-LLM enable_attention_dp) and the step waits for the busiest: the decoders split
    # evenly, the prompt chunks by `busiest_share`; the MoE layers below see every rank's
    # tokens. Exact at DP 1 (dividing by 1.0, a share of 1.0).
    dp = attention_dp * 1.0
    global_tokens = tokens
    share = busiest_share(nps, dp)
    tokens = bd_rows / dp + tp_ * share
    logits = select(dp > 1.0, bd_rows / dp + (logits - bd_rows) * share, logits)
    bd, nps = bd / dp, nps * share
    bd_rows, extra_flops = bd_rows / dp, extra_flops * share
    dense_mem = dense_weight_bytes / mem_bytes_per_s
    eff = tokens / (tokens + gemm_half_tokens)
    dense_flops = ((tokens + slow * share) * dense_flops_per_token
                   + logits * lm_head_flops_per_token + extra_flops)
    if features:
        dense_flops = dense_flops + tokens * lora_flops_per_token
    dense_cmp = dense_flops / (gemm_flops_per_s * np.maximum(eff, 1e-12))
    linear = smooth_max(dense_mem, dense_cmp)
    expert_mem = expert_cmp = 0.0
    if moe:
        # MoE: expected distinct experts touched per layer by the global batch, uniform
        # routing; with expert parallelism a GPU holds num_experts / ep of them (its own
        # slice of each, expert_bytes) and does 1 / ep of the expert FLOPs (expert_size is
        # already 1 / moe_tp), every rank's tokens included.
        e = num_experts * 1.0
        k = experts_per_tok * 1.0
        ep = expert_parallel * 1.0
        safe_e = select(e > 0, e, 1.0)
        touched = select(e > 0, e / ep * (1.0 - (1.0 - k / safe_e) ** global_tokens), 0.0)
        expert_mem = num_moe_layers * touched * expert_bytes / expert_bytes_per_s
        rows = select(touched > 0, global_tokens * k / np.maximum(touched * ep, 1e-12), 0.0)
        eff_e = rows / (rows + gemm_half_tokens)
        expert_rate = select(expert_flops_per_s > 0, expert_flops_per_s * 1.0, gemm_flops_per_s)
        expert_cmp = (global_tokens + slow) * expert_flops_per_token / ep / (
            expert_rate * np.maximum(eff_e, 1e-12))
        linear = linear + smooth_max(expert_mem, expert_cmp)
    # The engines' custom all-reduce: one-shot (each rank reads every peer's buffer: one
    # latency, (n-1) S bytes) for small messages, two-shot (reduce-scatter + all-gather: two
    # latencies, 2 (n-1)/n S bytes) for larger ones (vLLM csrc/custom_all_reduce.cuh: 1-stage
    # below 512 KB at <= 4 GPUs, 256 KB at 8, always at 2; TensorRT-LLM AllReduceStrategy
    # ONESHOT/TWOSHOT); the faster of the two (alpha-beta costs, Thakur et al. 2005).
    comm = select(tokens > 0, np.minimum(
        allreduce_s_fixed + tokens * allreduce_s_per_token_oneshot,
        2 * allreduce_s_fixed + tokens * allreduce_s_per_token), 0.0)
    # DP attention: each MoE layer gathers every rank's hidden states and scatters the summed
    # outputs back (all-gather + reduce-scatter over the tp x dp GPUs; constants 0 at DP 1);
    # with EP across domains DeepEP's all-to-all, in the engine's mode: auto runs its normal
    # kernels in a step with prompt tokens, its low-latency kernels in a decode-only step
    # (SGLang --deepep-mode auto: layers/moe/utils.py DeepEPMode.resolve(is_extend_in_batch));
    # a pinned mode sets both constants alike (build_step_model).
    has_prompt = tp_ > 0
    comm = comm + select(global_tokens > 0, select(
        has_prompt, moe_comm_s_fixed_prefill, moe_comm_s_fixed) + global_tokens * select(
        has_prompt, moe_comm_s_per_token_prefill, moe_comm_s_per_token), 0.0)
    pp = pp * 1.0
    p2p = (pp - 1) * tokens * p2p_s_per_token
    host = per_seq_overhead_s * (bd + nps)
    overhead = step_overhead_s + host + pp * layer_overhead_s
    if not features:
        return (linear, dense_mem, expert_mem, dense_cmp, expert_cmp, comm, p2p, overhead, pp,
                tokens, host, host_overlap * 1.0, pp * layer_overhead_s, step_overhead_s * 1.0,
                0.0, g, per_seq_overhead_s * bd, 0.0)
    # LoRA (models/lora.py): the A and B matrices of the batch's distinct adapters, read once,
    # and the shrink/expand kernels' fixed cost; 0 without adapters.
    distinct = (lora_n1 * (1.0 - (1.0 - lora_q1) ** seqs_all)
                + lora_n2 * (1.0 - (1.0 - lora_q2) ** seqs_all)
                + lora_n3 * (1.0 - (1.0 - lora_q3) ** seqs_all)
                + lora_n4 * (1.0 - (1.0 - lora_q4) ** seqs_all))
    distinct = np.minimum(distinct, lora_max_loras)
    lora_s = distinct * lora_adapter_bytes / mem_bytes_per_s + lora_overhead_s
    # The draft passes: the drafter's weights read per pass, FLOPs of its rows, and a fixed
    # cost per pass (its layers' small kernels); its KV read is in attention_parts. The first
    # pass runs over the V verified positions of each decoder (it refreshes the drafter's KV
    # and hidden states: vLLM EagleProposer.propose, SGLang draft extend), the others over
    # draft_width tokens each.
    w_mem = draft_weight_bytes / mem_bytes_per_s
    rows_w, rows_v = bd * draft_width, bd_rows
    pass_w = smooth_max(w_mem, rows_w * draft_flops_per_token / (gemm_flops_per_s * np.maximum(
        rows_w / np.maximum(rows_w + gemm_half_tokens, 1e-12), 1e-12)))
    pass_v = smooth_max(w_mem, rows_v * draft_flops_per_token / (gemm_flops_per_s * np.maximum(
        rows_v / np.maximum(rows_v + gemm_half_tokens, 1e-12), 1e-12)))
    extra = pp * lora_s + select(dec, (draft_steps - 1.0) * pass_w + pass_v + draft_steps
                                 * draft_overhead_s + spec_step_overhead_s, 0.0)
    return (linear, dense_mem, expert_mem, dense_cmp, expert_cmp, comm, p2p, overhead, pp,
            tokens, host, host_overlap * 1.0, pp * layer_overhead_s, step_overhead_s * 1.0,
            extra, g, per_seq_overhead_s * bd, select(dec, draft_steps * 1.0, 0.0))


def attention_parts(x: tuple, c: tuple, features: bool = True) -> tuple:
    """The step's attention: (kv_mem, attn_cmp, attention, draft_kv), KV read and FLOPs, full
    and sliding-window layers, and one draft pass's read of the drafter's KV (`step_parts`;
    `features` as `fixed_parts`: draft_kv is 0 without them)."""
    v = 1.0
    if features:
        x, _, v = feature_inputs(x, c)
    bd, kv_full, kv_win, tp_, pairs, pairs_w, pre_read, pre_read_w, nps, _ = x
    # the constants it reads, by position in STEP_CONSTANTS (compile-time under numba)
    kv_bytes_per_token_layer, full_layers, window_layers = c[_KV_BPTL], c[_FULL], c[_WINDOW]
    attn_flops_per_pair_decode, attn_flops_per_pair_prefill = c[_ATTN_DEC], c[_ATTN_PRE]
    kv_bytes_per_s, attn_flops_per_s = c[_KV_BW], c[_ATTN_FLOPS]
    state_bytes_per_seq, attention_dp = c[_STATE], c[_ATTN_DP]
    draft_kv_bytes_per_token = c[_DRAFT_KV]
    prefill_rate_frac = c[_PREFILL_RATE]  # the engine's prefill rate (fixed_parts)
    dp = attention_dp * 1.0  # the busiest attention-DP rank's share (fixed_parts)
    share = busiest_share(nps, dp)
    bd, tp_, nps = bd / dp, tp_ * share, nps * share
    kv_full, kv_win, pairs, pairs_w = kv_full / dp, kv_win / dp, pairs * share, pairs_w * share
    pre_read, pre_read_w = pre_read * share, pre_read_w * share
    kv_tokens = full_layers * (kv_full + pre_read + tp_) + window_layers * (
        kv_win + pre_read_w + tp_)
    kv_mem = (kv_tokens * kv_bytes_per_token_layer
              + 2 * (bd + nps) * state_bytes_per_seq) / kv_bytes_per_s
    # V verified queries per decoder each attend to its context; the KV is read once.
    attn_pairs_dec = (full_layers * kv_full + window_layers * kv_win) * v
    attn_pairs_pre = full_layers * pairs + window_layers * pairs_w
    attn_cmp = (attn_pairs_dec * attn_flops_per_pair_decode
                + attn_pairs_pre * attn_flops_per_pair_prefill / prefill_rate_frac
                ) / attn_flops_per_s
    draft_kv = kv_full * draft_kv_bytes_per_token / kv_bytes_per_s if features else 0.0
    return kv_mem, attn_cmp, smooth_max(kv_mem, attn_cmp), draft_kv


def combine_parts(f: tuple, a: tuple) -> tuple:
    """`step_parts`' result from `fixed_parts` f and `attention_parts` a."""
    (linear, dense_mem, expert_mem, dense_cmp, expert_cmp, comm, p2p, overhead, pp, tokens,
     host, host_overlap, layer, fixed, extra, g, seq_cost, kv_passes) = f
    kv_mem, attn_cmp, attention, draft_kv = a
    # Host overlap (vLLM async scheduling, SGLang/TensorRT-LLM overlap schedulers): the CPU
    # prepares step n+1 while the GPU runs step n, so only host work beyond the GPU's step
    # shows: gpu + host - min(host, gpu) = max(gpu, host) (host_overlap 1); 0 adds it all.
    # The fixed step cost (launch, sampling, synchronisation) stays on the critical path.
    # max(gpu, host) itself (not gpu + host - gpu: its rounding would break the ordering of
    # steps that differ only in hidden prefill work). The draft passes (extra, draft_kv) are
    # GPU work of the same step.
    gpu = pp * (linear + attention + comm) + p2p + layer + extra + kv_passes * draft_kv
    overlapped = select(host_overlap > 0, np.maximum(gpu, host), gpu + host)
    step = fixed + overlapped
    overhead = step - (pp * (linear + attention + comm) + p2p)
    # Emitted tokens share the speculative step; the per-sequence host cost (output
    # processing, detokenisation, streaming) stays per emitted token: a conservative choice
    # (docs/features.md). At g = 1 the added term is exactly 0.
    step = step / g + seq_cost * (1.0 - 1.0 / g)
    step = select(tokens > 0, step, 0.0)
    return (step, dense_mem, expert_mem, kv_mem, dense_cmp, expert_cmp, attn_cmp, comm, p2p,
            overhead, pp)


@dataclass(frozen=True)
class StepModel:
    """Per-configuration constants of the step-time model (floats, or arrays for grids)."""

    # bytes read per step
    dense_weight_bytes: Any
    expert_bytes: Any
    num_moe_layers: Any
    num_experts: Any
    experts_per_tok: Any
    kv_bytes_per_token_layer: Any
    full_layers: Any
    window_layers: Any
    window: Any
    # FLOPs
    dense_flops_per_token: Any
    expert_flops_per_token: Any
    lm_head_flops_per_token: Any
    attn_flops_per_pair_decode: Any
    attn_flops_per_pair_prefill: Any
    # hardware x calibration
    mem_bytes_per_s: Any
    kv_bytes_per_s: Any
    expert_bytes_per_s: Any
    gemm_flops_per_s: Any
    attn_flops_per_s: Any
    gemm_half_tokens: Any
    allreduce_s_fixed: Any
    allreduce_s_per_token: Any
    pp: Any
    p2p_s_per_token: Any
    step_overhead_s: Any
    per_seq_overhead_s: Any
    layer_overhead_s: Any
    request_overhead_s: Any = 0.0
    """Per-request latency outside steps (added to TTFT by the queueing model)."""
    calibration_source: str = "default"
    state_bytes_per_seq: Any = 0.0
    """Recurrent state per sequence, read and written back every step it runs (no growth)."""
    allreduce_s_per_token_oneshot: Any = 0.0
    """All-reduce seconds per token with the one-shot algorithm ((n-1) S bytes per rank);
    `allreduce_s_per_token` is the two-shot/ring cost (2 (n-1)/n S)."""
    attention_dp: Any = 1.0
    """Attention data-parallel ranks the step's batch is split over (models/engine.py)."""
    expert_parallel: Any = 1.0
    """Expert-parallel size: each GPU holds num_experts / expert_parallel experts."""
    moe_comm_s_fixed: Any = 0.0
    """MoE dispatch + combine latency per step with attention DP (all MoE layers)."""
    moe_comm_s_per_token: Any = 0.0
    """MoE dispatch + combine seconds per token of the whole replica's batch."""
    moe_comm_s_fixed_prefill: Any = 0.0
    """`moe_comm_s_fixed` of a step with prompt tokens (DeepEP's normal kernels across
    domains; the same value otherwise)."""
    moe_comm_s_per_token_prefill: Any = 0.0
    """`moe_comm_s_per_token` of a step with prompt tokens (as `moe_comm_s_fixed_prefill`)."""
    host_overlap: Any = 0.0
    """1.0: the per-sequence host cost overlaps the GPU's step (EngineProfile.host_overlap)."""
    # Speculative decoding, LoRA, vision (capplan/models/features.py; 0/1 = off).
    spec_verify_tokens: Any = 1.0
    """Tokens verified per decoding sequence per step (K + 1 for a chain of K drafts)."""
    spec_accept_len: Any = 1.0
    """Mean tokens emitted per decoding sequence per speculative step (tau)."""
    draft_weight_bytes: Any = 0.0
    """Drafter weights read per draft pass, per GPU."""
    draft_flops_per_token: Any = 0.0
    draft_steps: Any = 0.0
    """Draft passes per speculative step."""
    draft_width: Any = 1.0
    """Tokens per sequence in each draft pass (tree top-k)."""
    draft_kv_bytes_per_token: Any = 0.0
    """Drafter KV bytes read per context token per draft pass, per GPU."""
    draft_overhead_s: Any = 0.0
    """Fixed cost of one draft pass (its layers' small kernels, head and sampling)."""
    lora_adapter_bytes: Any = 0.0
    """One adapter's A and B matrices on one GPU, read once per step it is in the batch."""
    lora_n1: Any = 0.0
    """Adapters in popularity group 1 (of 4; models/lora.py adapter_groups); 0: no LoRA."""
    lora_q1: Any = 0.0
    """Probability a request picks one given adapter of group 1."""
    lora_n2: Any = 0.0
    lora_q2: Any = 0.0
    lora_n3: Any = 0.0
    lora_q3: Any = 0.0
    lora_n4: Any = 0.0
    lora_q4: Any = 0.0
    lora_max_loras: Any = 0.0
    lora_flops_per_token: Any = 0.0
    lora_overhead_s: Any = 0.0
    """Fixed cost per step of the punica shrink/expand kernels (all layers)."""
    prefill_extra_flops_per_token: Any = 0.0
    """Vision-encoder FLOPs charged per prefill token (models/vision.py)."""
    spec_step_overhead_s: Any = 0.0
    """Host cost of one speculative step beyond a plain one (EngineProfile.spec_host_costs)."""
    spec_source: str = ""
    """Where the acceptance length came from (empty without speculation)."""
    expert_flops_per_s: Any = 0.0
    """FLOP/s the routed experts' grouped GEMMs reach at large row counts (0: the dense
    GEMMs' `gemm_flops_per_s`)."""
    prefill_rate_frac: Any = 1.0
    """The engine's prefill GEMMs and attention at this fraction of the rates above
    (EngineProfile.prefill_rate_frac; 1: the catalog's)."""


    # ------------------------------------------------------------------------------------------
    def step(self, num_decode: ArrayLike = 0, decode_kv_tokens: ArrayLike = 0,
             decode_kv_tokens_window: ArrayLike | None = None, prefill_tokens: ArrayLike = 0,
             prefill_pairs: ArrayLike = 0, prefill_pairs_window: ArrayLike | None = None,
             prefill_kv_read: ArrayLike = 0, prefill_kv_read_window: ArrayLike | None = None,
             num_prefill_seqs: ArrayLike = 0, num_logits: ArrayLike | None = None,
             detail: bool = True) -> dict[str, np.ndarray]:
        """Time of one step and its parts, in seconds.

        Args:
            num_decode: sequences decoding one token this step.
            decode_kv_tokens: sum of their context lengths (KV tokens read), full layers.
            decode_kv_tokens_window: the same, each capped at the sliding window.
            prefill_tokens: prompt tokens computed this step (all chunks).
            prefill_pairs: causal query-key pairs of those chunks, sum of c*p + c(c+1)/2.
            prefill_pairs_window: the same with keys limited to the window.
            prefill_kv_read: cached prefix tokens the chunks attend to (KV read), sum of p.
            prefill_kv_read_window: the same capped at the window.
            num_prefill_seqs: sequences with a prefill chunk this step.
            num_logits: tokens needing logits (default: decode tokens + prefill sequences).
            detail: False returns only step_s (faster; for solvers).

        Returns:
            dict with step_s, memory_s, compute_s, communication_s, overhead_s, bound_index.
        """
        return self._kernel(*_step_inputs(
            num_decode, decode_kv_tokens, decode_kv_tokens_window, prefill_tokens,
            prefill_pairs, prefill_pairs_window, prefill_kv_read, prefill_kv_read_window,
            num_prefill_seqs, num_logits), detail)

    def steps(self, *calls: dict[str, ArrayLike]) -> list[np.ndarray]:
        """step_s of several steps (each a dict of `step`'s inputs) in one evaluation: the
        inputs stacked on a new first axis, so the formula's per-call cost is paid once. Each
        result has the values `step(**call, detail=False)` gives (elementwise operations)."""
        xs = [_step_inputs(**c) for c in calls]
        # the constants' shape too: the new axis goes in front of everything
        shape = np.broadcast_shapes(*(np.shape(v) for x in xs for v in x), self._parts_args[3])
        stacked, apart = [], False
        for vals in zip(*xs, strict=True):
            if all(v.ndim == 0 and v == vals[0] for v in vals):  # the same number in all
                stacked.append(vals[0])
                continue
            a = np.empty((len(xs), *shape))
            for i, v in enumerate(vals):
                a[i] = v
            stacked.append(a)
            apart = True
        out = self._kernel(*stacked, detail=False)["step_s"]
        return list(out) if apart else [out] * len(xs)

    def constants(self) -> tuple:
        """The model's constants in `STEP_CONSTANTS` order (the second argument of
        `step_parts`)."""
        return tuple(getattr(self, k) for k in STEP_CONSTANTS)

    @cached_property
    def _parts_args(self) -> tuple[tuple, bool, bool, tuple[int, ...]]:
        """`step_parts`' constants, MoE flag and feature flag, and the constants' broadcast
        shape, computed once per model (it is frozen)."""
        consts = self.constants()
        return (consts, bool(np.any(np.asarray(self.num_experts) > 0)),
                not features_off(consts), _shape(consts))

    def gathered(self, arrays: dict[str, np.ndarray]) -> StepModel:
        """This model with the array constants `arrays`, each gathered from this model's (the
        same positions of every one: a subset of its configurations), as
        `dataclasses.replace`; `step_parts`' MoE and feature flags follow from this model's
        where they are off (so they are in any subset) instead of being collected again, the
        same values (`_parts_args`)."""
        new = replace(self, **arrays)
        _, moe, features, _ = self._parts_args
        consts = new.constants()
        moe = moe and bool(np.any(np.asarray(new.num_experts) > 0))
        features = features and not features_off(consts)
        # the cached_property's value, set on the frozen instance as functools caches it
        object.__setattr__(new, "_parts_args", (consts, moe, features, _shape(consts)))
        return new

    def _kernel(self, bd, kv_full, kv_win, tp_, pairs, pairs_w, pre_read, pre_read_w, nps,
                logits, detail=True) -> dict[str, np.ndarray]:  # noqa: ANN001
        consts, moe, features, _ = self._parts_args
        (step, dense_mem, expert_mem, kv_mem, dense_cmp, expert_cmp, attn_cmp, comm, p2p,
         overhead, pp) = step_parts((bd, kv_full, kv_win, tp_, pairs, pairs_w, pre_read,
                                     pre_read_w, nps, logits), consts, moe, features)
        if not detail:
            return {"step_s": step}
        memory_s = pp * (dense_mem + expert_mem + kv_mem)
        compute_s = pp * (dense_cmp + expert_cmp + attn_cmp)
        comm_s = pp * comm + p2p
        parts = np.stack(np.broadcast_arrays(memory_s, compute_s, comm_s,
                                             overhead + 0 * memory_s))
        return {"step_s": step, "memory_s": memory_s, "compute_s": compute_s,
                "communication_s": comm_s, "overhead_s": overhead + 0 * memory_s,
                "bound_index": np.argmax(parts, axis=0)}

    # ------------------------------------------------------------------------------------------
    def decode_step(self, batch: ArrayLike, context_len: ArrayLike, detail: bool = True
                    ) -> dict[str, np.ndarray]:
        """A pure decode step: `batch` sequences, each with `context_len` tokens of context."""
        b = np.asarray(batch, float)
        c = np.asarray(context_len, float)
        return self.step(num_decode=b, decode_kv_tokens=b * c,
                         decode_kv_tokens_window=b * np.minimum(c, self.window), detail=detail)

    def prefill_chunk(self, chunk_tokens: ArrayLike, prefix_tokens: ArrayLike = 0,
                      num_decode: ArrayLike = 0, decode_kv_tokens: ArrayLike = 0,
                      last_chunk: ArrayLike = True, detail: bool = True
                      ) -> dict[str, np.ndarray]:
        """One step with a prefill chunk of one sequence (after `prefix_tokens` cached tokens),
        optionally mixed with `num_decode` decode sequences (chunked prefill)."""
        return self.step(**self.prefill_chunk_inputs(chunk_tokens, prefix_tokens, num_decode,
                                                     decode_kv_tokens, last_chunk),
                         detail=detail)

    def prefill_chunk_inputs(self, chunk_tokens: ArrayLike, prefix_tokens: ArrayLike = 0,
                             num_decode: ArrayLike = 0, decode_kv_tokens: ArrayLike = 0,
                             last_chunk: ArrayLike = True) -> dict[str, np.ndarray]:
        """`step`'s inputs of `prefill_chunk` (for `steps`)."""
        c = np.asarray(chunk_tokens, float)
        p = np.asarray(prefix_tokens, float)
        w = np.asarray(self.window, float)
        pairs, pairs_w, read_w = chunk_attention(c, p, w)
        bd = np.asarray(num_decode, float)
        dkv = np.asarray(decode_kv_tokens, float)
        return {"num_decode": bd, "decode_kv_tokens": dkv,
                "decode_kv_tokens_window": np.minimum(dkv, bd * w),
                "prefill_tokens": c, "prefill_pairs": pairs, "prefill_pairs_window": pairs_w,
                "prefill_kv_read": p, "prefill_kv_read_window": read_w,
                "num_prefill_seqs": (c > 0).astype(float),
                "num_logits": bd + np.asarray(last_chunk, float) * (c > 0)}

    def prefill_time(self, prompt_len: ArrayLike, chunk: int) -> np.ndarray:
        """Seconds to prefill a prompt alone, in chunks of `chunk` tokens (the TTFT floor less
        the request overhead, capplan.plan.speed.prefill_rows)."""
        lens = np.atleast_1d(np.asarray(prompt_len, float))
        n_chunks = int(np.max(np.ceil(lens / chunk))) if lens.size else 0
        total = np.zeros_like(lens)
        for i in range(n_chunks):  # a handful of chunks; vectorised over prompts
            start = i * chunk
            c = np.clip(lens - start, 0, chunk)
            last = (start + c) >= lens
            t = self.prefill_chunk(c, start, last_chunk=last)["step_s"]
            total = total + np.where(c > 0, t, 0.0)
        return total.reshape(np.shape(prompt_len))


def _step_inputs(num_decode: ArrayLike = 0, decode_kv_tokens: ArrayLike = 0,
                 decode_kv_tokens_window: ArrayLike | None = None, prefill_tokens: ArrayLike = 0,
                 prefill_pairs: ArrayLike = 0, prefill_pairs_window: ArrayLike | None = None,
                 prefill_kv_read: ArrayLike = 0, prefill_kv_read_window: ArrayLike | None = None,
                 num_prefill_seqs: ArrayLike = 0, num_logits: ArrayLike | None = None
                 ) -> tuple[np.ndarray, ...]:
    """`step_parts`' x from `StepModel.step`'s inputs (the windowed ones default to the full
    ones, the logits to one per sequence)."""
    bd = np.asarray(num_decode, float)
    kv_full = np.asarray(decode_kv_tokens, float)
    kv_win = kv_full if decode_kv_tokens_window is None else np.asarray(
        decode_kv_tokens_window, float)
    tp_ = np.asarray(prefill_tokens, float)
    pairs = np.asarray(prefill_pairs, float)
    pairs_w = pairs if prefill_pairs_window is None else np.asarray(prefill_pairs_window, float)
    pre_read = np.asarray(prefill_kv_read, float)
    pre_read_w = pre_read if prefill_kv_read_window is None else np.asarray(
        prefill_kv_read_window, float)
    nps = np.asarray(num_prefill_seqs, float)
    logits = bd + nps if num_logits is None else np.asarray(num_logits, float)
    return bd, kv_full, kv_win, tp_, pairs, pairs_w, pre_read, pre_read_w, nps, logits


def mla_layers(model: ModelSpec) -> int:
    """Layers of multi-head latent attention in a model (0 for any other attention)."""
    return model.num_layers if model.mla is not None else 0


def request_overhead(model: ModelSpec, profile: EngineProfile) -> float:
    """The engine profile's default per-request overhead for a model: its base plus, for a
    model with multi-head latent attention, a cost per layer (docs/engines.md). A measured
    calibration (`calibrate --endpoint`, `--from-results`) replaces the whole sum."""
    return profile.request_overhead_s + mla_layers(model) * profile.mla_layer_request_overhead_s


def feature_step_constants(model: ModelSpec, settings: EngineSettings, cal: Calibration,
                           kv_bytes_per_token_layer: float, need_accept_len: bool = True
                           ) -> dict[str, Any]:
    """StepModel fields of speculative decoding and LoRA (capplan/models/speculative.py,
    lora.py); empty when both are off, so the defaults (no effect) apply. need_accept_len
    False (a memory answer): no acceptance length is demanded (plan_speculation)."""
    out: dict[str, Any] = {}
    tp = settings.tp
    sp = speculative.plan_speculation(model, settings, cal.spec_acceptance_length,
                                      need_accept_len)
    if sp is not None:
        host = settings.profile.spec_host_costs
        out.update(
            spec_verify_tokens=float(sp.verify_tokens), spec_accept_len=float(sp.accept_len),
            draft_weight_bytes=sp.draft_params * (weight_dtypes(model, settings.weight_dtype).linear
                                                  if sp.method == "mtp" else model.dtype_bytes)
            / tp,
            draft_flops_per_token=sp.draft_flops_per_token / tp,
            draft_steps=float(sp.num_steps), draft_width=float(sp.topk),
            draft_kv_bytes_per_token=sp.draft_kv_layers * kv_bytes_per_token_layer,
            # A draft pass runs its layers' small kernels plus a head, sampling and input
            # preparation, each costing what the calibration charges a decoder layer.
            draft_overhead_s=((sp.draft_layers + 1) * cal.per_layer_overhead_s + host[1]
                              if sp.num_steps else 0.0),
            spec_step_overhead_s=host[0],
            spec_source=f"{sp.method}: tau {sp.accept_len:.2f}, {sp.accept_source}")
    lp = lora.plan_lora(model, settings, model.dtype_bytes)
    if lp is not None:
        # Punica launches a shrink and an expand kernel per adapted module and layer, each
        # costing what one of a layer's ~10 small kernels does (Calibration.per_layer_overhead_s).
        out.update(lora_adapter_bytes=lp.slot_bytes_per_gpu,
                   **{f"lora_{k}{g + 1}": v for g, grp in enumerate(lp.groups)
                      for k, v in zip(("n", "q"), grp, strict=True)},
                   lora_max_loras=float(lp.max_loras),
                   lora_flops_per_token=lp.flops_per_token,
                   lora_overhead_s=(lp.num_layers * lora.LORA_KERNELS_PER_LAYER
                                    * cal.per_layer_overhead_s / 10))
    return out


_OUT_OF_REACH_S = 1.0
"""Per-token seconds that keep the step formula's min() off an algorithm that cannot run."""


def _span(gpu: GpuSpec, cal: Calibration) -> Links | None:
    """Effective NVLink and network figures of a GPU with a scale-out network: the
    calibration's all-reduce bandwidth fraction applies to both (achievable over peak), the
    catalog's latencies (None: the GPU has no network; replicas stay in one domain)."""
    if gpu.network is None:
        return None
    return Links(gpu.interconnect.bytes_per_s * cal.allreduce_bw_frac, cal.allreduce_latency_s,
                 gpu.network.bytes_per_s * cal.allreduce_bw_frac, gpu.network.latency_s,
                 gpu.interconnect.max_gpus_per_node)


def settings_deepep_mode(s: EngineSettings, gpus_per_domain: int | None) -> str | None:
    """The DeepEP mode the settings' replica runs (models/layout.py deepep_mode): the
    settings' own, else the engine profile's; None without DeepEP. Launch lines print it."""
    p = s.profile
    return deepep_mode(s.tp, s.attention_dp, s.expert_parallel, s.deepep_mode or p.deepep_mode,
                       gpus_per_domain, p.deepep_flags)


def _moe_span_comm(model: ModelSpec, s: EngineSettings, span: Links, moe_layers: int,
                   fp8: bool) -> tuple[float, float, float, float]:
    """(fixed s, s per token of the replica's batch) of the MoE layers' traffic when attention
    DP spans domains, for a decode-only step and then for a step with prompt tokens: with
    DeepEP (`settings_deepep_mode`), its dispatch + combine all-to-all, the low-latency or
    normal kernels as the mode runs them in each step (each GPU sends batch / world tokens);
    without, the hierarchical all-gather + reduce-scatter of the hidden states in both
    (models/layout.py)."""
    world = s.tp * s.attention_dp
    moe = model.moe
    mode = settings_deepep_mode(s, span.gpus_per_domain)
    if mode is not None and moe is not None:
        low = ep_all_to_all(model.hidden_size, moe.num_experts_per_tok, s.expert_parallel, span,
                            fp8_dispatch=fp8)
        normal = ep_all_to_all_normal(model.hidden_size, moe, s.expert_parallel, span,
                                      fp8_dispatch=fp8)
        decode = normal if mode == "normal" else low
        prefill = low if mode == "low_latency" else normal
        return (moe_layers * decode.latency_s, moe_layers * decode.s_per_token_per_gpu / world,
                moe_layers * prefill.latency_s, moe_layers * prefill.s_per_token_per_gpu / world)
    lat, per_byte = gather_scatter_cost(world, span)
    fixed, token = moe_layers * lat, moe_layers * model.hidden_size * 2.0 * per_byte
    return fixed, token, fixed, token


def build_step_model(model: ModelSpec, gpu: GpuSpec, settings: EngineSettings,
                     calibration: Calibration | None = None, need_accept_len: bool = True
                     ) -> StepModel:
    """Constants of the step model for one (model, GPU, settings, calibration);
    need_accept_len False: a memory answer's, which demands no acceptance length."""
    validate_settings(model, settings, gpu)
    cal = calibration or default_calibration(gpu)
    tp, pp, dp = settings.tp, settings.pp, settings.attention_dp
    counts = param_counts(model, tp, pp, dp, settings.expert_parallel)
    dt = weight_dtypes(model, settings.weight_dtype)
    act_bytes = 2.0
    lm_head_params = counts.lm_head if counts.lm_head else counts.embedding
    if pp > 1:
        lm_head_params = counts.embedding  # worst stage holds one vocab table
    dense_params = counts.attention + counts.dense_mlp + counts.shared_experts + counts.router
    mixer_b = dt.linear if dt.mixer is None else dt.mixer
    dense_bytes = (counts.attention * mixer_b
                   + (counts.dense_mlp + counts.shared_experts) * dt.linear) + (
        counts.router + counts.norms + lm_head_params) * dt.unquantized
    expert_bytes = counts.expert_size * dt.experts
    moe = model.moe
    layers = cdiv(model.num_layers, pp)
    stage = model_layers.stage_layers(model, pp)
    window_layers = stage.count(*model_layers.WINDOW_KINDS)
    kv_dtype = kv_dtype_bytes(model, settings.kv_dtype)
    kvb = kv_bytes_per_token_per_layer(model, tp, kv_dtype)
    # Recurrent layers read and write their fixed state once per step per sequence.
    state = sum(model_layers.recurrent_state_bytes(model, k, tp) for k in stage.mixers)
    heads = model.num_attention_heads / tp
    if model.mla is not None:
        m = model.mla
        # Decode uses the absorbed form: scores over kv_lora + rope dims, values over kv_lora.
        per_pair_dec = 2 * heads * (m.kv_lora_rank + m.qk_rope_head_dim + m.kv_lora_rank)
        per_pair_pre = 2 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    else:
        per_pair_dec = per_pair_pre = 4 * heads * model.head_dim
    compute = dt.compute_dtype if gpu.supports(dt.compute_dtype) else "bf16"
    frac = cal.gemm_frac_low_precision if compute in LOW_PRECISION else cal.gemm_frac
    link = gpu.interconnect.bytes_per_s * cal.allreduce_bw_frac
    ar_fixed = ar_token = 0.0
    if tp > 1:
        ar_fixed = 2 * layers * cal.allreduce_latency_s
        ar_token = 2 * layers * 2 * (tp - 1) / tp * model.hidden_size * act_bytes / link
        ar_one = 2 * layers * (tp - 1) * model.hidden_size * act_bytes / link
    span = _span(gpu, cal)
    if tp > 1 and span is not None and tp > span.gpus_per_domain:
        # TP across NVLink domains: the hierarchical all-reduce (models/layout.py); no
        # one-shot kernel spans nodes, so its per-token cost is set out of reach.
        lat, per_byte = allreduce_cost(tp, span)
        ar_fixed = layers * lat  # the two-shot branch counts it twice: 2 per layer
        ar_token = 2 * layers * model.hidden_size * act_bytes * per_byte
        ar_one = _OUT_OF_REACH_S
    moe_fixed = moe_token = 0.0
    if dp > 1 and moe is not None:
        # With DP attention each MoE layer all-gathers the dp ranks' hidden states before the
        # experts and reduce-scatters their outputs after (SGLang layers/dp_attention.py
        # dp_gather/dp_scatter, v0.5; TensorRT-LLM attention-DP fused MoE allgather +
        # reducescatter, 1.x). Ring cost over W = tp x dp GPUs: (W-1)/W of the replica's
        # T x hidden x 2 B per collective, two per MoE layer (Thakur et al. 2005). The same
        # link as TP (NVLink inside a node; multi-node worlds are optimistic).
        world = tp * dp
        moe_fixed = 2 * counts.num_moe_layers * cal.allreduce_latency_s
        moe_token = (2 * counts.num_moe_layers * (world - 1) / world * model.hidden_size
                     * act_bytes / link)
    moe_fixed_pre, moe_token_pre = moe_fixed, moe_token
    if dp > 1 and moe is not None and span is not None and tp * dp > span.gpus_per_domain:
        moe_fixed, moe_token, moe_fixed_pre, moe_token_pre = _moe_span_comm(
            model, settings, span, counts.num_moe_layers, dt.compute_dtype in LOW_PRECISION)
    return StepModel(
        **feature_step_constants(model, settings, cal, kvb, need_accept_len),
        dense_weight_bytes=dense_bytes,
        expert_bytes=expert_bytes,
        num_moe_layers=counts.num_moe_layers,
        num_experts=moe.num_experts if moe else 0,
        experts_per_tok=moe.num_experts_per_tok if moe else 0,
        kv_bytes_per_token_layer=kvb,
        full_layers=stage.count("full_attention"),
        window_layers=window_layers,
        window=float(model.sliding_window or 2**62),
        dense_flops_per_token=2 * dense_params,
        expert_flops_per_token=2 * counts.num_moe_layers * (moe.num_experts_per_tok if moe else 0)
        * counts.expert_size,
        lm_head_flops_per_token=2 * lm_head_params,
        attn_flops_per_pair_decode=per_pair_dec,
        attn_flops_per_pair_prefill=per_pair_pre,
        mem_bytes_per_s=gpu.hbm_bytes_per_s * cal.mem_bw_frac,
        kv_bytes_per_s=gpu.hbm_bytes_per_s * cal.attn_bw_frac,
        expert_bytes_per_s=gpu.hbm_bytes_per_s * (cal.expert_bw_frac or cal.mem_bw_frac),
        gemm_flops_per_s=gpu.dense_flops_per_s(compute) * frac,
        # Quantized routed experts (fp8/fp4/int4 weights): grouped GEMMs at expert_gemm_frac
        # of the dense rate (fused-MoE kernel timings: 0.14-0.46; default 1), 16-bit ones at
        # the dense rate (docs/perf.md "Routed experts at prefill").
        expert_flops_per_s=gpu.dense_flops_per_s(compute) * frac * (
            cal.expert_gemm_frac if dt.experts < 2.0 else 1.0),
        attn_flops_per_s=gpu.dense_flops_per_s("bf16") * cal.attn_frac,
        gemm_half_tokens=cal.gemm_half_tokens,
        allreduce_s_fixed=ar_fixed,
        allreduce_s_per_token=ar_token,
        pp=pp,
        p2p_s_per_token=model.hidden_size * act_bytes / (
            span.net_bytes_per_s if span is not None and tp * dp * pp > span.gpus_per_domain
            else link),
        step_overhead_s=(cal.step_overhead_s if cal.step_overhead_s is not None
                         else settings.profile.step_overhead_s
                         + layers * settings.profile.layer_step_overhead_s),
        per_seq_overhead_s=(cal.per_seq_overhead_s if cal.per_seq_overhead_s is not None
                            else settings.profile.per_seq_overhead_s),
        layer_overhead_s=(layers * cal.per_layer_overhead_s
                          + counts.num_moe_layers * (cal.per_moe_layer_overhead_s + (
                              settings.profile.moe_layer_step_s_without_fp4
                              if gpu.fp4_dense_tflops is None else 0.0))),
        request_overhead_s=(cal.request_overhead_s if cal.request_overhead_s is not None
                            else request_overhead(model, settings.profile)),
        calibration_source=cal.source,
        state_bytes_per_seq=state,
        allreduce_s_per_token_oneshot=ar_one if tp > 1 else 0.0,
        attention_dp=dp,
        expert_parallel=settings.expert_parallel,
        moe_comm_s_fixed=moe_fixed,
        moe_comm_s_per_token=moe_token,
        moe_comm_s_fixed_prefill=moe_fixed_pre,
        moe_comm_s_per_token_prefill=moe_token_pre,
        host_overlap=1.0 if settings.profile.host_overlap else 0.0,
        prefill_rate_frac=settings.profile.prefill_rate_frac,
    )


def knee_batch(batches: np.ndarray, tokens_per_s: np.ndarray, gain: float = 0.15) -> int | None:
    """The batch past which doubling adds under `gain` throughput (diminishing returns).

    Evaluated on the model's own curve at b and 2b; None when it never bends in range.
    """
    b = np.asarray(batches, float)
    t = np.asarray(tokens_per_s, float)
    order = np.argsort(b)
    b, t = b[order], t[order]
    for i in range(len(b)):
        j = np.searchsorted(b, 2 * b[i])
        if j < len(b) and b[j] == 2 * b[i] and t[j] < t[i] * (1 + gain):
            return int(b[i])
    return None
