"""Hypothesis properties of the step-time model over dense, MoE, MLA and sliding-window models
and several GPUs (NVIDIA HBM3, HBM2e, GDDR and AMD)."""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.catalog.loader import load_catalog
from capplan.models.calibration import default_calibration
from capplan.models.engine import EngineSettings
from capplan.models.perf import build_step_model

_CAT = load_catalog()
# dense GQA, MoE (Mixtral), MoE + MLA (DeepSeek-V2-Lite), sliding-window layers (Gemma-2),
# fine-grained MoE (Qwen3-30B-A3B), a small dense model
MODEL_KEYS = ("llama-3.1-8b", "mixtral-8x7b", "deepseek-v2-lite", "gemma-2-9b", "qwen3-30b-a3b",
              "qwen3-4b")
GPU_KEYS = ("h100-sxm", "a100-sxm-80gb", "l40s", "mi300x")
TPS = (1, 2, 4)

PROPS = settings(max_examples=120, deadline=None)
REL = 1e-12  # float rounding slack on "non-decreasing"


@cache
def _model(model: str, gpu: str, tp: int = 1, ideal_comm: bool = False, kv: str = "auto"):
    g = _CAT.gpus[gpu]
    cal = default_calibration(g)
    if ideal_comm:
        # all-reduces free: no latency, a link 1e9 x faster than the datasheet
        cal = cal.with_(allreduce_latency_s=0.0, allreduce_bw_frac=1e9)
    return build_step_model(_CAT.models[model], g, EngineSettings(tp=tp, kv_dtype=kv), cal)


configs = st.tuples(st.sampled_from(MODEL_KEYS), st.sampled_from(GPU_KEYS),
                    st.sampled_from(TPS), st.sampled_from(("auto", "fp8")))
batches = st.integers(1, 2048)
contexts = st.integers(0, 131_072)


def _step(cfg, b, c) -> float:
    return float(_model(*cfg[:3], kv=cfg[3]).decode_step(b, c)["step_s"])


@PROPS
@given(cfg=configs, b=st.lists(batches, min_size=2, max_size=2).map(sorted), c=contexts)
def test_step_non_decreasing_in_batch(cfg, b, c):
    assert _step(cfg, b[1], c) >= _step(cfg, b[0], c) * (1 - REL)


@PROPS
@given(cfg=configs, b=batches, c=st.lists(contexts, min_size=2, max_size=2).map(sorted))
def test_step_non_decreasing_in_context(cfg, b, c):
    assert _step(cfg, b, c[1]) >= _step(cfg, b, c[0]) * (1 - REL)


@PROPS
@given(cfg=configs, chunk=st.lists(st.integers(1, 16_384), min_size=2, max_size=2).map(sorted),
       prefix=st.integers(0, 32_768), dec=st.integers(0, 256))
def test_mixed_step_non_decreasing_in_chunk(cfg, chunk, prefix, dec):
    sm = _model(*cfg[:3], kv=cfg[3])
    lo = float(sm.prefill_chunk(chunk[0], prefix, dec, dec * 1000)["step_s"])
    hi = float(sm.prefill_chunk(chunk[1], prefix, dec, dec * 1000)["step_s"])
    assert hi >= lo * (1 - REL)


@PROPS
@given(cfg=configs, b=st.lists(batches, min_size=2, max_size=2).map(sorted), c=contexts)
def test_decode_throughput_non_decreasing_while_memory_bound(cfg, b, c):
    sm = _model(*cfg[:3], kv=cfg[3])
    r0, r1 = sm.decode_step(b[0], c), sm.decode_step(b[1], c)
    if int(r0["bound_index"]) == 0 and int(r1["bound_index"]) == 0:  # both "memory"
        assert b[1] / float(r1["step_s"]) >= b[0] / float(r0["step_s"]) * (1 - 1e-9)


@PROPS
@given(model=st.sampled_from(MODEL_KEYS), gpu=st.sampled_from(GPU_KEYS), b=batches, c=contexts)
def test_tp2_not_slower_than_tp1_before_communication(model, gpu, b, c):
    one = _model(model, gpu, 1, True).decode_step(b, c)
    two = _model(model, gpu, 2, True).decode_step(b, c)
    if int(one["bound_index"]) == 0:  # a memory-bound decode: each GPU streams less at TP=2
        assert float(two["step_s"]) <= float(one["step_s"]) * (1 + 1e-9)
        assert float(two["memory_s"]) <= float(one["memory_s"]) * (1 + 1e-9)


@PROPS
@given(cfg=configs, b=batches, c=contexts, chunk=st.integers(1, 16_384))
def test_mixed_step_reads_the_weights_once(cfg, b, c, chunk):
    """A chunked-prefill step (DESIGN: "weights read once") costs at least the decode alone
    and at most the decode step plus the chunk's own step: never two weight reads, two
    step overheads or two all-reduce latencies."""
    sm = _model(*cfg[:3], kv=cfg[3])
    w = min(c, sm.window)
    pairs = chunk * (chunk + 1) / 2
    pairs_w = pairs if chunk <= sm.window else float(chunk * sm.window)  # an upper bound
    pre = dict(prefill_tokens=chunk, prefill_pairs=pairs, prefill_pairs_window=pairs_w,
               num_prefill_seqs=1)
    mixed = float(sm.step(num_decode=b, decode_kv_tokens=b * c, decode_kv_tokens_window=b * w,
                          **pre)["step_s"])
    decode = float(sm.decode_step(b, c)["step_s"])
    alone = float(sm.step(**pre)["step_s"])
    assert max(decode, alone) * (1 - REL) <= mixed <= (decode + alone) * (1 + REL)


@PROPS
@given(cfg=configs, b=batches, c=contexts, chunk=st.integers(1, 16_384),
       prefix=st.integers(0, 32_768))
def test_step_positive_for_positive_tokens(cfg, b, c, chunk, prefix):
    sm = _model(*cfg[:3], kv=cfg[3])
    for r in (sm.decode_step(b, c), sm.prefill_chunk(chunk, prefix)):
        s = float(r["step_s"])
        assert 0 < s < 3600
        # the step is at least each roof's total (a smooth max never undercuts a roof)
        assert s >= max(float(r["memory_s"]), float(r["compute_s"])) * (1 - REL)
