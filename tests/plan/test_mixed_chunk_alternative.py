"""SGLang's default scheduler runs each prompt chunk alone while every running decode waits
(prefill-first); `--enable-mixed-chunk` rides the chunk with the decode batch. Where the
default's TBT SLO binds, a plan says what the option would need (plan/alternatives.py)."""

from __future__ import annotations

import pytest

from capplan import api

LANES = {"model": "llama-3.3-70b", "candidates": {"gpus": ["h200"], "tp": [2, 4]},
         "engine": {"max_model_len": 16384},
         "workloads": [{"rate_per_s": 3, "input_len": "lognormal:mean=1200,p99=6000",
                        "output_len": "lognormal:mean=300,p99=1200",
                        "slo": {"ttft_p99_s": 1.5, "tbt_p99_s": 0.08}}]}


def _plan(engine: str, verify: bool = False):
    spec = {**LANES, "engine": {**LANES["engine"], "name": engine}}
    return api.run_plan(spec, verify=verify)


@pytest.fixture(scope="module")
def default():
    return _plan("sglang").to_dict()


def test_the_default_scheduler_is_tbt_bound_and_the_option_is_offered(default):
    best = default["recommendations"][0]
    assert best["binding_constraint"] == "TBT SLO"
    alt = default["mixed_chunk_alternative"]
    assert alt["flag"] == "--enable-mixed-chunk" and alt["engine"] == "sglang+mixed-chunk"
    assert alt["gpus_total"] < best["gpus_total"]
    assert "--engine sglang+mixed-chunk" in alt["note"]


def test_the_alternative_is_the_plan_with_the_option(default):
    # the same search with the option named in the plan (no replay, as the alternative)
    mixed = _plan("sglang+mixed-chunk").to_dict()
    alt, best = default["mixed_chunk_alternative"], mixed["recommendations"][0]
    assert (alt["gpu"], alt["tp"], alt["replicas"]) == (best["gpu"], best["tp"],
                                                        best["replicas"])
    assert "mixed_chunk_alternative" not in mixed  # already on


def test_engines_whose_steps_already_mix_have_no_such_alternative():
    assert "mixed_chunk_alternative" not in _plan("vllm").to_dict()
