"""Benchmark protocol presets (capplan.sim.protocol): counts, lengths and metric definitions."""

from __future__ import annotations

import pytest

import capplan
from capplan.errors import InputError
from capplan.sim.protocol import PRESETS, BenchmarkRun, length_spec, preset, reported_ttft

KW = dict(input_len=1024, output_len=128)


def _sim(name: str, c: int = 8, **kw):
    return capplan.simulate("llama-3.1-8b", "h100-sxm", concurrency=c, requests=80,
                            benchmark=name, **{**KW, **kw}).data


def test_every_preset_cites_its_source_and_parses():
    for name, p in PRESETS.items():
        assert p.source and p.tool and preset(name.upper()) is p
    with pytest.raises(InputError, match="vllm"):
        preset("locust")


def test_inferencex_counts_and_lengths():
    # benchmark_lib.sh: 10 x C measured, 2 x C warm-ups, lengths uniform in [0.8 L, L]
    # warm-ups drained before the measured run (vllm bench serve gathers them), which starts
    # all clients together again: the replay sends the 80 measured requests only
    run = BenchmarkRun.of(PRESETS["inferencex"], 8)
    assert (run.measured, run.warmups, run.drained) == (80, 16, True)
    assert run.workload("1024", "128") == (80, "uniform:min=819,max=1024",
                                           "uniform:min=102,max=128")
    d = _sim("inferencex")
    assert d["num_requests"] == 80 and d["benchmark"]["warmup_prompts"] == 16
    assert d["benchmark"]["warmup_drained"] is True
    mean_in = d["input_tokens_per_s"] / d["requests_per_s"]
    assert 819 <= mean_in <= 1024 and mean_in == pytest.approx((819 + 1024) / 2, rel=0.05)


def test_sglang_random_lengths_span_one_to_nominal():
    # bench_serving's default --random-range-ratio 0.0: input lengths uniform in [1, L]
    assert length_spec(1024, 0.0) == "uniform:min=1,max=1024"
    assert length_spec(1024, 1.0) == "1024"
    d = _sim("sglang")
    assert d["benchmark"]["warmup_prompts"] == 1 and d["num_requests"] == 80


def _quantiles(entry):
    """A latency entry without the error band attach_bands adds (capplan.plan.bands)."""
    return {k: v for k, v in entry.items() if k != "band"}


def test_tpot_and_itl_definitions():
    vl = _sim("vllm")
    gl = _sim("guidellm")
    ap = _sim("aiperf")
    # vllm: TPOT excludes the first token, ITL is every gap (capplan's TBT)
    assert vl["benchmark"]["metrics"]["tpot_s"] == pytest.approx(_quantiles(vl["tpot_s"]),
                                                                 rel=1e-12)
    assert vl["benchmark"]["metrics"]["itl_s"] == pytest.approx(_quantiles(vl["tbt_s"]),
                                                                rel=1e-12)
    # GuideLLM: TPOT = E2E / output tokens (first token included); same run as vllm's here
    # (no warm-ups, fixed lengths), so with 128 tokens its mean is the mean E2E / 128
    assert gl["benchmark"]["metrics"]["tpot_s"]["mean"] == pytest.approx(
        vl["e2e_s"]["mean"] / 128, rel=1e-9)
    assert gl["benchmark"]["metrics"]["itl_s"] == pytest.approx(_quantiles(vl["tpot_s"]),
                                                                rel=1e-12)
    # AIPerf: "inter token latency" is the per-request (E2E - TTFT) / (output - 1)
    assert ap["benchmark"]["metrics"]["itl_s"]["mean"] == pytest.approx(
        ap["tpot_s"]["mean"], rel=1e-9)


def test_warmups_leave_the_start_up_wave_out():
    # 32 clients send 2,048-token prompts together: the start-up wave prefills them in
    # ceil(32 x 2048 / 8192) = 8 steps, the slowest TTFTs of the run; after 2 x C warm-ups sent
    # in the same loop (--warmup-prompts) the measured requests arrive as the loop's cohorts
    # return, never 32 at once
    kw = dict(concurrency=32, input_len=2048, output_len=64, num_prompts=96)
    cold = capplan.latency("llama-3.1-8b", "h100-sxm", **kw)
    warm = capplan.latency("llama-3.1-8b", "h100-sxm", warmup_prompts=64, **kw)
    assert warm.data["benchmark"]["warmup_prompts"] == 64 and warm.data["num_requests"] == 96
    assert warm.data["benchmark"]["warmup_drained"] is False
    assert warm.ttft_s["p99"] < cold.ttft_s["p99"]
    # a tool's drained warm-ups leave the measured run as a cold one: its own start-up wave
    ix = capplan.latency("llama-3.1-8b", "h100-sxm", benchmark="inferencex",
                         **{**kw, "num_prompts": None})
    plain = capplan.latency("llama-3.1-8b", "h100-sxm", benchmark="vllm",
                            **{**kw, "num_prompts": 320, "input_len": "uniform:min=1638,max=2048",
                               "output_len": "uniform:min=51,max=64"})
    assert ix.data["num_requests"] == 320
    assert ix.ttft_s == plain.ttft_s


def test_reported_ttft_weights_one_wave_per_client():
    # 4 measured requests per client: one start-up wave of 1.0 s, three steady of 0.2 s, and a
    # 0.1 s overhead in both: 0.1 + (0.9 + 3 x 0.1) / 4 = 0.4
    assert reported_ttft(0.1, 1.0, 0.2, 4.0) == pytest.approx(0.4)


def test_simulate_cli_prints_the_tools_own_figures(run_cli):
    args = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "4",
            "--input-len", "256", "--output-len", "32", "--benchmark", "guidellm")
    table = run_cli(*args, "--requests", "40")
    assert table.exit_code == 0, table.stderr
    assert "TPOT mean as the benchmark reports it (ms)" in table.stdout
    d = run_cli(*args, "--requests", "40", "--format", "json").json()
    assert d["benchmark"]["tool"] == "GuideLLM" and d["num_requests"] == 40
    bad = run_cli(*args[:-1], "locust")
    assert bad.exit_code == 2 and "locust" in bad.stderr
