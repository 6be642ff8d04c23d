"""Hypothesis properties of the memory model over every catalog model and a few GPUs."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from capplan.catalog.loader import load_catalog
from capplan.catalog.schema import ModelSpec
from capplan.models.engine import EngineSettings
from capplan.models.layers import state_bytes_per_seq
from capplan.models.memory import (
    kv_bytes_for_sequence,
    kv_bytes_per_token,
    memory_report,
    param_counts,
    validate_settings,
    weight_bytes,
    weight_dtypes,
)

_CAT = load_catalog()
MODELS: list[ModelSpec] = [_CAT.models[k] for k in sorted(_CAT.models)]
GPUS = [_CAT.gpus[k] for k in ("h100-sxm", "a100-sxm-80gb", "l40s", "h200", "mi300x", "l4")]
TPS = (1, 2, 4, 8)  # the largest NVLink node of the GPUs below
WEIGHT_DTYPES = ("auto", "bf16", "fp8", "int4", "fp4")

PROPS = settings(max_examples=150, deadline=None)


def _valid(model: ModelSpec, s: EngineSettings) -> bool:
    try:
        validate_settings(model, s)
    except ValueError:
        return False
    return True


@st.composite
def model_and_tp(draw):
    model = draw(st.sampled_from(MODELS))
    tp = draw(st.sampled_from([t for t in TPS if _valid(model, EngineSettings(tp=t))]))
    return model, tp


@PROPS
@given(mt=model_and_tp(), gpu=st.sampled_from(GPUS),
       u=st.lists(st.floats(0.05, 1.0), min_size=2, max_size=2).map(sorted),
       kv=st.sampled_from(("auto", "fp8")), wd=st.sampled_from(WEIGHT_DTYPES))
def test_kv_tokens_non_decreasing_in_utilization(mt, gpu, u, kv, wd):
    model, tp = mt
    s = EngineSettings(tp=tp, kv_dtype=kv, weight_dtype=wd,
                       max_model_len=min(4096, model.max_position_embeddings))
    lo = memory_report(model, gpu, s.with_(gpu_memory_utilization=u[0]))
    hi = memory_report(model, gpu, s.with_(gpu_memory_utilization=u[1]))
    assert hi.kv_cache_tokens >= lo.kv_cache_tokens
    assert hi.kv_cache_bytes_per_gpu >= lo.kv_cache_bytes_per_gpu
    assert hi.num_gpu_blocks >= lo.num_gpu_blocks
    # the budget is exactly util * total
    assert hi.budget_bytes == gpu.total_memory_bytes * u[1]


@PROPS
@given(mt=model_and_tp(), gpu=st.sampled_from(GPUS),
       lens=st.lists(st.integers(1, 262_144), min_size=2, max_size=2).map(sorted),
       tokens=st.sampled_from((512, 2048, 8192, 16384)))
def test_max_model_len_moves_concurrency_not_capacity(mt, gpu, lens, tokens):
    """V1 profiles max_num_batched_tokens, not max_model_len: capacity is independent of it."""
    model, tp = mt
    s = EngineSettings(tp=tp, max_num_batched_tokens=tokens, max_num_seqs=256)
    cap = model.max_position_embeddings
    short = memory_report(model, gpu, s.with_(max_model_len=min(lens[0], cap)))
    long = memory_report(model, gpu, s.with_(max_model_len=min(lens[1], cap)))
    assert short.kv_cache_tokens == long.kv_cache_tokens
    assert short.activation_peak_bytes_per_gpu == long.activation_peak_bytes_per_gpu
    assert short.max_concurrency >= long.max_concurrency
    assert short.contiguous_max_concurrency >= long.contiguous_max_concurrency


@PROPS
@given(mt=model_and_tp(), gpu=st.sampled_from(GPUS),
       toks=st.lists(st.integers(16, 65_536), min_size=2, max_size=2).map(sorted))
def test_activation_non_decreasing_in_batched_tokens(mt, gpu, toks):
    model, tp = mt
    s = EngineSettings(tp=tp, max_model_len=min(4096, model.max_position_embeddings),
                       max_num_seqs=256)
    a = memory_report(model, gpu, s.with_(max_num_batched_tokens=toks[0]))
    b = memory_report(model, gpu, s.with_(max_num_batched_tokens=toks[1]))
    assert b.activation_peak_bytes_per_gpu >= a.activation_peak_bytes_per_gpu
    assert b.kv_cache_tokens <= a.kv_cache_tokens


def _replicated_params(model: ModelSpec, tp2: int) -> float:
    """Parameters every GPU keeps whole at tensor-parallel size tp2 (written from the shapes,
    not from capplan): norms, MoE routers, MLA down-projections, and the K/V projections once
    the KV heads run out (tp2 > num_kv_heads)."""
    h, layers = model.hidden_size, model.num_layers
    rep = (2 * layers + 1) * h  # RMSNorm/LayerNorm weights
    if model.moe is not None:
        rep += model.num_moe_layers * h * model.moe.num_experts  # router
    if model.mla is not None:
        m = model.mla
        rep += layers * (h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank)
        if m.q_lora_rank:
            rep += layers * (h * m.q_lora_rank + m.q_lora_rank)
    elif tp2 > model.num_kv_heads:
        rep += layers * 2 * h * model.head_dim  # one replicated K and V head per GPU
    return rep


@PROPS
@given(mt=model_and_tp(), wd=st.sampled_from(WEIGHT_DTYPES))
def test_doubling_tp_halves_weights_up_to_replicated_parts(mt, wd):
    model, tp = mt
    assume(_valid(model, EngineSettings(tp=2 * tp)))
    dt = weight_dtypes(model, wd)
    w1 = weight_bytes(param_counts(model, tp), dt)
    w2 = weight_bytes(param_counts(model, 2 * tp), dt)
    per_param = max(dt.linear, dt.experts, dt.unquantized)
    assert w2 >= w1 / 2 * (1 - 1e-12)
    assert w2 <= w1 / 2 + _replicated_params(model, 2 * tp) * per_param * (1 + 1e-12)


@PROPS
@given(model=st.sampled_from(MODELS), tp=st.sampled_from((1, 2, 4, 8)),
       lens=st.lists(st.integers(1, 300_000), min_size=2, max_size=2).map(sorted),
       kvb=st.sampled_from((1.0, 2.0)), block=st.sampled_from((16, 32)))
def test_sequence_bytes_monotone_in_context(model, tp, lens, kvb, block):
    a = kv_bytes_for_sequence(model, lens[0], tp, kvb, block)
    b = kv_bytes_for_sequence(model, lens[1], tp, kvb, block)
    assert 0 < a <= b
    # never more than every attention layer at full attention, in whole blocks, plus the
    # fixed recurrent state of hybrid layers (models/layers.py)
    per_token = kv_bytes_per_token(model, tp, kvb)
    state = state_bytes_per_seq(model, tp, kvb, block)
    full_blocks = -(-lens[1] // block)
    assert b <= full_blocks * block * per_token + state
    if model.num_sliding_layers == 0:
        assert b == full_blocks * block * per_token + state


@PROPS
@given(model=st.sampled_from(MODELS), kvb=st.sampled_from((1.0, 2.0)))
def test_kv_per_token_non_increasing_in_tp(model, kvb):
    values = [kv_bytes_per_token(model, tp, kvb) for tp in TPS]
    assert values == sorted(values, reverse=True)
    if model.mla is not None:  # the MLA latent is replicated on every rank
        assert len(set(values)) == 1
