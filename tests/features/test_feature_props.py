"""Invariants of the feature terms in the step model (hypothesis)."""

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import capplan

PROPS = settings(max_examples=40, deadline=None)
PLAIN = capplan.deployment("llama-3.1-8b", "h100-sxm", max_model_len=8192).step
K0 = capplan.deployment("llama-3.1-8b", "h100-sxm", max_model_len=8192, speculative="eagle3",
                        spec_tokens=0).step
SPEC = capplan.deployment("llama-3.1-8b", "h100-sxm", max_model_len=8192,
                          speculative="eagle3").step
LORA = capplan.deployment("llama-3.1-8b", "h100-sxm", max_model_len=8192, max_loras=64,
                          max_lora_rank=16, lora_adapters=64).step

steps = st.fixed_dictionaries({
    "num_decode": st.integers(0, 512), "ctx": st.integers(1, 8192),
    "chunk": st.integers(0, 8192), "prefix": st.integers(0, 8192)})


def _mixed(sm, x):
    return float(sm.prefill_chunk(x["chunk"], x["prefix"], num_decode=x["num_decode"],
                                  decode_kv_tokens=x["num_decode"] * x["ctx"])["step_s"])


@PROPS
@given(steps)
def test_k0_is_bitwise_plain(x):
    assert _mixed(K0, x) == _mixed(PLAIN, x)


@PROPS
@given(steps)
def test_speculation_changes_only_steps_with_decoders(x):
    if x["num_decode"] == 0:
        assert _mixed(SPEC, x) == _mixed(PLAIN, x)
    else:
        assert _mixed(SPEC, x) != _mixed(PLAIN, x)


@PROPS
@given(st.integers(1, 1024), st.integers(1, 63))
def test_lora_step_grows_with_adapters_in_use(batch, n):
    few = replace(LORA, lora_n1=float(n), lora_q1=1.0 / n)
    more = replace(LORA, lora_n1=float(n + 1), lora_q1=1.0 / (n + 1))
    t_few = float(few.decode_step(batch, 1024)["step_s"])
    t_more = float(more.decode_step(batch, 1024)["step_s"])
    assert t_more >= t_few
    assert t_few > float(PLAIN.decode_step(batch, 1024)["step_s"])
    assert np.isfinite(t_more)
