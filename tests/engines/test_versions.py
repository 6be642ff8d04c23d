"""Engine profiles by release, profile options, host overlap, and the error bands."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.cli import cli
from capplan.errors import InputError
from capplan.models.engine import VERSIONS, engine_profile
from capplan.plan.bands import attach_bands, auto_headroom, band, band_table, signed_error_range
from capplan.plan.schema import PlanFile


@pytest.mark.parametrize(("spec", "version", "overlap"), [
    ("vllm", "0.19", True), ("vllm@0.6.0", "0.6", False), ("vllm@0.10", "0.11", False),
    ("sglang@0.3.0", "0.3", False), ("vllm@0.13.1", "0.11", False),
    ("vllm@0.14.0", "0.14", True), ("vllm@0.18.1", "0.17", True), ("vllm@0.19.0", "0.19", True),
    ("sglang@0.4.6.post1", "0.4", True), ("sglang", "0.5", True),
    ("trtllm@1.1.0rc2.post2", "1.0", True), ("tensorrt-llm@1.3.0rc5", "1.2", True)])
def test_a_release_maps_to_the_newest_profile_not_later_than_it(spec, version, overlap):
    p = engine_profile(spec)
    assert (p.version, p.host_overlap) == (version, overlap)
    assert engine_profile(p.spec) == p  # the spec round-trips


def test_the_default_is_the_newest_profile_of_each_engine():
    for name, versions in VERSIONS.items():
        assert engine_profile(name) == versions[-1]
        assert engine_profile(name).spec == name


def test_profile_options():
    mixed = engine_profile("sglang+mixed-chunk")
    assert not mixed.scheduler.prefill_first and engine_profile("sglang").scheduler.prefill_first
    assert mixed.label == "sglang 0.5 +mixed-chunk"
    assert not engine_profile("trtllm+no-overlap").host_overlap
    assert engine_profile("vllm@0.11+overlap").host_overlap  # --async-scheduling on 0.11
    assert engine_profile("vllm@0.11+overlap").spec == "vllm@0.11+overlap"


@pytest.mark.parametrize(("spec", "words"), [
    ("vllm@0.5.3", "from 0.6"), ("vllm@nightly", "release number"),
    ("vllm+mixed-chunk", "applies to sglang"), ("sglang+turbo", "unknown engine option"),
    ("vlm", "did you mean vllm"),
    # options a release does not have: vLLM 0.6 has no --async-scheduling (from 0.10), SGLang
    # 0.3 no overlap scheduler (from 0.4)
    ("vllm@0.6+overlap", "vllm@0.6 .*has no such option; its options: none"),
    ("sglang@0.3+overlap", "sglang@0.3 .*its options: \\+mixed-chunk "),
    ("vllm+overlap+no-overlap", "overlap and no-overlap contradict"),
    ("trtllm+no-overlap+no-overlap", "no-overlap given twice"),
    ("vllm@", "optionally one @VERSION"), ("vllm@0.11@0.14", "optionally one @VERSION")])
def test_bad_engine_specs_say_what_is_accepted(spec, words):
    with pytest.raises(InputError, match=words):
        engine_profile(spec)


def test_release_options():
    assert engine_profile("vllm@0.6").release_options == ()
    assert engine_profile("sglang@0.3").release_options == ("mixed-chunk",)
    assert engine_profile("vllm@0.11").release_options == ("overlap", "no-overlap")
    # overlap restates SGLang 0.5's and TensorRT-LLM's default; each has its own options
    assert engine_profile("sglang").release_options == ("mixed-chunk", "overlap", "no-overlap")
    assert engine_profile("trtllm").release_options == ("chunked-prefill", "overlap",
                                                        "no-overlap")


def test_recommend_help_names_every_option():
    r = CliRunner().invoke(cli, ["recommend", "--help"], terminal_width=200)
    assert "+chunked-prefill" in r.output.replace("\n", "")


@pytest.mark.parametrize("spec", ["vllm@0.6+overlap", "vllm@", "vllm+overlap+no-overlap"])
def test_cli_refuses_an_option_the_release_lacks_in_one_line(run_cli, spec):
    from tests.cli._asserts import assert_one_line_error

    assert_one_line_error(run_cli("speed", "--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb",
                                  "--batch", "1", "--engine", spec), spec)


def test_cli_takes_a_release_and_refuses_a_bad_one_in_one_line():
    r = CliRunner().invoke(cli, ["speed", "--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb",
                                 "--batch", "1", "--engine", "vllm@0.5"])
    assert r.exit_code == 2 and "capplan models vllm from 0.6" in r.output
    assert "Traceback" not in r.output


def _step_ms(engine: str, batch: int) -> float:
    r = CliRunner().invoke(cli, ["speed", "--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb",
                                 "--batch", str(batch), "--context", "1024", "--engine", engine,
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)["rows"][0]["step_time_s"] * 1e3


def test_host_overlap_hides_the_per_sequence_host_work_behind_the_gpu_step():
    # Same profile but the overlap: synchronous steps add per_seq x batch; overlapped ones
    # hide it while it is shorter than the GPU's step (~10 ms here, the host ~0.1-2 ms).
    p = engine_profile("vllm@0.11")
    for b in (1, 32):
        sync, over = _step_ms("vllm@0.11", b), _step_ms("vllm@0.11+overlap", b)
        assert sync - over == pytest.approx(p.per_seq_overhead_s * b * 1e3, rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(gpu=st.floats(1e-4, 0.1), host=st.floats(0, 0.1), fixed=st.floats(0, 0.01))
def test_overlapped_step_is_max_of_gpu_and_host_plus_the_fixed_cost(gpu, host, fixed):
    import numpy as np

    # perf.step_parts: step = gpu + fixed + host - overlap * min(host, gpu)
    sync = gpu + fixed + host
    over = gpu + fixed + host - 1.0 * np.minimum(host, gpu)
    assert over == pytest.approx(max(gpu, host) + fixed)
    assert over <= sync + 1e-15


def test_plan_files_name_the_release_either_way():
    base = {"model": "llama-3.1-8b", "workloads": [{"name": "a", "rate_per_s": 1}]}
    a = PlanFile.model_validate({**base, "engine": {"name": "vllm", "version": "0.11"}})
    b = PlanFile.model_validate({**base, "engine": {"name": "vllm@0.11"}})
    assert a.engine.profile_spec == b.engine.profile_spec == "vllm@0.11"
    with pytest.raises(ValueError, match="from 0.6"):
        PlanFile.model_validate({**base, "engine": {"name": "vllm", "version": "0.5"}})


# --- error bands --------------------------------------------------------------------------

def test_shipped_bands_have_provenance_and_every_engine():
    t = band_table()
    assert "validate_silicon.py --loso" in t["provenance"]
    assert set(t["engines"]) == {"vllm", "sglang", "trtllm"}
    for eng in t["engines"].values():
        for r in eng["regimes"]:
            for m in ("ttft", "tpot"):
                lo, hi = r[m]
                assert -1 < lo <= hi


def test_band_is_where_measurements_fell_for_the_held_out_rows():
    # measured = predicted / (1 + e): e at p90 gives the low end, e at p10 the high end.
    e10, e90 = signed_error_range("vllm", "tpot", 16)
    lo, hi = band(0.020, "vllm", "tpot", 16)
    assert lo == pytest.approx(0.020 / (1 + e90)) and hi == pytest.approx(0.020 / (1 + e10))
    res = attach_bands({"ttft_s": {"mean": 0.2, "p99": 0.3}, "tbt_s": {"mean": 0.02},
                        "e2e_s": {"mean": 5.0}}, "vllm", 16)
    assert res["tbt_s"]["band"] == [lo, hi]
    assert "band" not in res["e2e_s"] and res["ttft_s"]["p99"] == 0.3


def test_latency_json_and_table_carry_the_band():
    args = ["latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "2",
            "--input-len", "512", "--output-len", "128"]
    r = CliRunner().invoke(cli, args + ["--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert len(d["ttft_s"]["band"]) == 2 and len(d["tbt_s"]["band"]) == 2
    t = CliRunner().invoke(cli, args)
    assert "80% band" in t.output


def test_auto_headroom_covers_the_worst_optimistic_tpot():
    e10 = band_table()["engines"]["vllm"]["all"]["tpot"][0]
    assert auto_headroom("vllm") == pytest.approx(max(0.0, 1 / (1 + e10) - 1))
    plan = PlanFile.model_validate({"model": "llama-3.1-8b", "headroom": "auto",
                                    "workloads": [{"name": "a", "rate_per_s": 1}]})
    assert plan.headroom == pytest.approx(round(auto_headroom("vllm"), 3))


def test_vllm_v0_budget_covers_max_model_len_unless_given():
    # vLLM 0.6 SchedulerConfig without chunked prefill: max(max_model_len, 2048).
    from capplan import api

    d = api.simulate("llama-3.1-8b", "a100-sxm", rate=1.0, requests=5, input_len=100,
                     output_len=5, engine="vllm@0.6", max_model_len=4096).data
    assert (d["max_num_batched_tokens"], d["max_num_seqs"]) == (4096, 256)
    d = api.simulate("llama-3.1-8b", "a100-sxm", rate=1.0, requests=5, input_len=100,
                     output_len=5, engine="vllm@0.6", max_model_len=1024,
                     max_num_batched_tokens=3000).data
    assert d["max_num_batched_tokens"] == 3000
    d = api.simulate("llama-3.1-8b", "a100-sxm", rate=1.0, requests=5, input_len=100,
                     output_len=5, engine="vllm@0.6", max_model_len=1024).data
    assert d["max_num_batched_tokens"] == 2048


@pytest.mark.parametrize(("gpu", "tp", "fraction", "chunk"), [
    ("l4", 1, 0.88, 8192), ("a100-sxm", 2, 0.87, 8192), ("h100-sxm", 4, 0.85, 8192),
    ("h100-sxm", 8, 0.83, 8192), ("h100-sxm", 16, 0.79, 8192)])
def test_sglang_03_defaults_are_those_of_its_own_source(gpu, tp, fraction, chunk):
    # SGLang v0.3.0 server_args.py: ServerArgs.chunked_prefill_size = 8192 on every GPU;
    # __post_init__ mem_fraction_static 0.79 (tp >= 16), 0.83 (>= 8), 0.85 (>= 4), 0.87 (>= 2),
    # else 0.88. 0.4 differs at TP 8 (0.81) and below 25 GB (chunk 2048).
    from capplan.catalog.loader import load_catalog

    d = engine_profile("sglang@0.3").defaults(load_catalog(()).gpu(gpu), tp)
    assert (d.memory_fraction, d.max_num_batched_tokens) == (fraction, chunk)
