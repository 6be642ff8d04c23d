"""Engines whose default stops every running decode for a prompt's work: SGLang runs each
prompt chunk alone (prefill-first; `--enable-mixed-chunk` rides it with the decode batch),
TensorRT-LLM runs each prompt whole in one step (`enable_chunked_prefill` splits it into the
budget the decodes leave). Where that makes a TBT SLO bind, a plan says what the option would
need (plan/alternatives.py)."""

from __future__ import annotations

import pytest

from capplan import api

LANES = {"model": "llama-3.3-70b", "candidates": {"gpus": ["h200"], "tp": [2, 4]},
         "engine": {"max_model_len": 16384},
         "workloads": [{"rate_per_s": 3, "input_len": "lognormal:mean=1200,p99=6000",
                        "output_len": "lognormal:mean=300,p99=1200",
                        "slo": {"ttft_p99_s": 1.5, "tbt_p99_s": 0.08}}]}


def _plan(engine: str) -> dict:
    spec = {**LANES, "engine": {**LANES["engine"], "name": engine}}
    return api.run_plan(spec, verify=False).to_dict()


@pytest.mark.parametrize(("engine", "option", "flag"), [
    ("sglang", "mixed-chunk", "--enable-mixed-chunk"),
    ("trtllm", "chunked-prefill", "enable_chunked_prefill: true")])
def test_a_tbt_bound_default_is_offered_the_option_and_it_is_that_plan(engine, option, flag):
    default = _plan(engine)
    best = default["recommendations"][0]
    assert best["binding_constraint"] == "TBT SLO"
    alt = default["scheduler_alternative"]
    assert (alt["option"], alt["flag"], alt["engine"]) == (option, flag, f"{engine}+{option}")
    assert alt["gpus_total"] < best["gpus_total"]
    assert f"--engine {engine}+{option}" in alt["note"]
    # the same search with the option named in the plan (no replay, as the alternative)
    planned = _plan(f"{engine}+{option}")
    got = planned["recommendations"][0]
    assert (alt["gpu"], alt["tp"], alt["replicas"]) == (got["gpu"], got["tp"], got["replicas"])
    assert "scheduler_alternative" not in planned  # already on


def test_engines_whose_steps_already_mix_chunks_have_no_such_alternative():
    assert "scheduler_alternative" not in _plan("vllm")


def test_the_chunked_tensorrt_llm_line_enables_it_and_launches_the_planned_chunk():
    best = _plan("trtllm+chunked-prefill")["recommendations"][0]
    flags = best["engine_flags"]
    assert "enable_chunked_prefill: true" in flags["file:trtllm:llm_api_options.yaml"]
    assert f"--max_num_tokens {best['max_num_batched_tokens']} " in flags["trtllm"]
    assert best["max_num_batched_tokens"] < best["max_model_len"]  # chunks, not whole prompts


@pytest.mark.parametrize("spec", ["vllm+chunked-prefill", "sglang+chunked-prefill",
                                  "trtllm+mixed-chunk"])
def test_an_option_for_another_scheduler_is_refused(spec):
    from capplan.errors import InputError
    from capplan.models.engine import engine_profile

    with pytest.raises(InputError, match="it applies to"):
        engine_profile(spec)


def test_latency_names_the_option_when_its_tbt_tail_is_prompt_work():
    kw = {"gpu": "h200", "tp": 2, "weight_dtype": "fp8", "rate": 2.0,
          "input_len": "lognormal:mean=1900,p99=8000",
          "output_len": "lognormal:mean=380,p99=1500", "max_num_batched_tokens": 2048,
          "max_num_seqs": 256}

    def notes(engine: str) -> tuple[list[str], dict]:
        d = api.latency("llama-3.3-70b", engine=engine, **kw).data
        return [n for n in d["notes"] if n.startswith("TBT p99 is")], d["tbt_s"]

    stalled, tbt = notes("sglang")
    assert tbt["p99"] > 3 * tbt["p50"]  # the stall the note reads
    assert len(stalled) == 1 and "--engine sglang+mixed-chunk" in stalled[0]
    mixed, tbt_mixed = notes("sglang+mixed-chunk")
    assert tbt_mixed["p99"] < tbt["p99"]
    # with the option on, what is left of the tail is the chunks' size: the note names the
    # budget (2,048 tokens here), not the option again; vLLM's mixed chunks read the same
    for got in (mixed, notes("vllm")[0]):
        assert len(got) == 1 and "mixed-chunk" not in got[0]
        assert "up to 2048 prompt tokens" in got[0]
