"""Ingest a `vllm bench serve --save-result` file and a GuideLLM report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from capplan.cli import cli
from capplan.probe.results import load_results

DATA = Path(__file__).parent.parent / "data"
VLLM = DATA / "vllm_bench_serve_result.json"
GUIDELLM = DATA / "guidellm_report.json"


def test_vllm_result_levels_match_its_own_summary() -> None:
    (lv,) = load_results([VLLM])
    raw = json.loads(VLLM.read_text())
    assert lv["concurrency"] == 8
    assert lv["ttft_s"]["mean"] == pytest.approx(raw["mean_ttft_ms"] / 1e3, rel=1e-9)
    assert lv["tbt_s"]["mean"] == pytest.approx(raw["mean_itl_ms"] / 1e3, rel=1e-9)
    assert lv["tpot_s"]["mean"] == pytest.approx(raw["mean_tpot_ms"] / 1e3, rel=1e-9)
    assert lv["output_tokens_per_s"] == pytest.approx(raw["output_throughput"])


def test_guidellm_concurrent_benchmarks_become_levels() -> None:
    levels = load_results([GUIDELLM])
    assert [lv["concurrency"] for lv in levels] == [1, 4, 16]  # the poisson run is skipped
    assert levels[0]["ttft_s"]["p50"] == pytest.approx(0.038, rel=0.15)


def test_cli_from_results_fits_tbt_law_and_overheads() -> None:
    r = CliRunner().invoke(cli, ["calibrate", "--from-results", str(VLLM), str(GUIDELLM),
                                 "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [lv["concurrency"] for lv in out["levels"]] == [1, 4, 8, 16]
    assert out["fit"]["tbt_law"]["per_concurrency_s"] > 0
    assert out["fit"]["calibration_params"]["step_overhead_s"] >= 0


def test_not_a_result_file_is_one_line_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text('{"a": 1}')
    r = CliRunner().invoke(cli, ["calibrate", "--from-results", str(p)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# Real files from public repositories (tests/data/results/SOURCES.md)
# ---------------------------------------------------------------------------------------------
RESULTS = DATA / "results"


def test_llmperf_summary_converted_to_vllm_tpot() -> None:
    (lv,) = load_results([RESULTS / "llmperf_groq_70b_summary.json"])
    raw = json.loads((RESULTS / "llmperf_groq_70b_summary.json").read_text())
    assert lv["concurrency"] == 5
    assert lv["ttft_s"]["mean"] == raw["results_ttft_s_mean"]
    assert lv["ttft_s"]["p99"] == raw["results_ttft_s_quantiles_p99"]
    # vLLM TPOT from the means, 150 output tokens for every request (stddev 0):
    # (0.8151081097 s E2E - 0.2278603458 s TTFT) / 149 = 3.94126 ms
    assert lv["tpot_s"]["mean"] == pytest.approx((0.8151081097126007 - 0.22786034579078357)
                                                 / 149, rel=1e-12)
    assert lv["tpot_s"]["mean"] == pytest.approx(3.94126e-3, rel=1e-5)
    # LLMPerf's own "inter token latency" is E2E / N (5.38 ms), kept apart
    assert lv["llmperf_inter_token_latency_s"]["mean"] == pytest.approx(5.384e-3, rel=1e-3)
    assert lv["requests_per_s"] == pytest.approx(176.73895115400083 / 60)
    assert lv["completed"] == 150 and lv["errors"] == 0


def test_aiperf_export() -> None:
    (lv,) = load_results([RESULTS / "aiperf_gpt-oss-20b_c100_profile_export_aiperf.json"])
    assert lv["concurrency"] == 100
    assert lv["ttft_s"]["mean"] == pytest.approx(2.343219436988764)
    assert lv["tpot_s"]["mean"] == pytest.approx(27.763065454471807e-3)  # (E2E-TTFT)/(N-1)
    assert lv["tbt_s"]["mean"] is not None  # inter_chunk_latency: every gap
    assert lv["completed"] == 89 and lv["errors"] == 11  # 10% cancellation requested
    assert lv["output_tokens_per_s"] == pytest.approx(2320.7222350404572)


def test_guidellm_inter_token_latency_is_vllm_tpot() -> None:
    path = RESULTS / "guidellm_synchronous_benchmarks_stripped.json"
    (lv,) = load_results([path])
    m = json.loads(path.read_text())["benchmarks"][0]["metrics"]

    def mean(k: str) -> float:
        return m[k]["successful"]["mean"]
    assert lv["concurrency"] == 1  # synchronous
    # GuideLLM's inter_token_latency is (E2E - TTFT) / (N - 1): its means agree to 0.02%
    # (644.47 ms - 16.79 ms) / 127 = 4.9424 ms vs 4.9416 ms reported
    tpot = (mean("request_latency") * 1e3 - mean("time_to_first_token_ms")) / (
        mean("output_token_count") - 1)
    assert lv["tpot_s"]["mean"] * 1e3 == pytest.approx(tpot, rel=5e-4)
    # ... and time_per_output_token divides by N: (E2E - TTFT) / 128
    per_n = (mean("request_latency") * 1e3 - mean("time_to_first_token_ms")) / mean(
        "output_token_count")
    assert lv["guidellm_time_per_output_token_s"]["mean"] * 1e3 == pytest.approx(per_n,
                                                                                 rel=5e-4)


def test_vllm_summary_only_uses_file_percentiles_and_says_save_detailed(tmp_path) -> None:
    raw = json.loads(VLLM.read_text())
    for k in ("ttfts", "itls", "input_lens", "output_lens", "generated_texts", "errors"):
        raw.pop(k, None)
    raw["p95_ttft_ms"] = 123.0
    p = tmp_path / "summary.json"
    p.write_text(json.dumps(raw))
    (lv,) = load_results([p])
    assert lv["ttft_s"]["p99"] == pytest.approx(raw["p99_ttft_ms"] / 1e3)
    assert lv["ttft_s"]["p95"] == pytest.approx(0.123)
    assert "--save-detailed" in lv["note"]


def test_sglang_bench_serving_line(tmp_path) -> None:
    # Keys as python/sglang/bench_serving.py writes them (--output-file, one JSON per line);
    # no public result file was found to copy, see SOURCES.md
    line = {"backend": "sglang", "dataset_name": "random", "request_rate": float("inf"),
            "max_concurrency": 16, "completed": 64, "total_input_tokens": 65536,
            "total_output_tokens": 16384, "request_throughput": 4.0,
            "output_throughput": 1024.0, "mean_e2e_latency_ms": 4000.0,
            "median_e2e_latency_ms": 3900.0, "p99_e2e_latency_ms": 4500.0,
            "mean_ttft_ms": 120.0, "median_ttft_ms": 110.0, "p99_ttft_ms": 300.0,
            "mean_tpot_ms": 15.2, "median_tpot_ms": 15.0, "p99_tpot_ms": 18.0,
            "mean_itl_ms": 15.1, "median_itl_ms": 14.0, "p95_itl_ms": 20.0, "p99_itl_ms": 40.0}
    p = tmp_path / "sglang.jsonl"
    p.write_text(json.dumps(line) + "\n" + json.dumps({**line, "max_concurrency": 4}) + "\n")
    levels = load_results([p])
    assert [lv["concurrency"] for lv in levels] == [4, 16]
    lv = levels[1]
    assert lv["e2e_s"]["p99"] == pytest.approx(4.5) and lv["tbt_s"]["p95"] == pytest.approx(0.02)
    assert lv["mean_input_tokens"] == 1024 and lv["mean_context_tokens"] == 1024 + 128


def test_goodput_as_vllm_counts_it() -> None:

    raw = json.loads(VLLM.read_text())
    ttft = [t for t in raw["ttfts"] if t]
    mid = float(np.median(ttft))
    (lv,) = load_results([VLLM], slo_s={"ttft": mid})
    # requests whose TTFT is at most the median, over the run's duration
    good = sum(1 for t in ttft if t <= mid)
    assert lv["goodput_per_s"] == pytest.approx(good / raw["duration"])
    (lv,) = load_results([VLLM], slo_s={"ttft": max(ttft), "e2el": 1e6})
    assert lv["goodput_per_s"] == pytest.approx(len(ttft) / raw["duration"])
    (lv,) = load_results([VLLM], slo_s={"tpot": 0.0})
    assert lv["goodput_per_s"] == 0.0
    (lv,) = load_results([VLLM])
    assert "goodput_per_s" not in lv  # only where SLOs are given


def test_real_vllm_bench_serve_result_closed_loop_summary() -> None:
    # vllm bench sweep serve, vLLM 0.25.1, opt-125m, --max-concurrency 2 (SOURCES.md); no
    # --save-detailed, so the file's own statistics are taken, converted ms -> s
    path = RESULTS / "vllm_bench_serve_opt-125m_c2_run0.json"
    (lv,) = load_results([path])
    assert lv["concurrency"] == 2 and "open_loop" not in lv
    assert lv["ttft_s"]["mean"] == pytest.approx(217.27289337468392e-3, rel=1e-12)
    assert lv["ttft_s"]["p50"] == pytest.approx(44.92285849846667e-3, rel=1e-12)
    assert lv["ttft_s"]["p99"] == pytest.approx(762.4942294094944e-3, rel=1e-12)
    assert lv["ttft_s"]["p90"] is None  # not in the file: null, never filled in
    assert lv["tbt_s"]["mean"] == pytest.approx(8.204563008257537e-3, rel=1e-12)  # ITL
    assert lv["tbt_s"]["p99"] == pytest.approx(22.26501848665066e-3, rel=1e-12)
    assert lv["tpot_s"]["mean"] == pytest.approx(8.204553624697533e-3, rel=1e-12)
    assert lv["e2e_s"]["mean"] == pytest.approx(340.3411977451469e-3, rel=1e-12)
    assert lv["e2e_s"]["p50"] == pytest.approx(166.47808399284258e-3, rel=1e-12)
    assert lv["output_tokens_per_s"] == 93.74767963046673
    assert lv["requests_per_s"] == 5.859229976904171
    assert lv["completed"] == 8 and lv["errors"] == 0
    # 256 input and 128 output tokens over 8 requests: 32 in, 32 + 16 / 2 = 40 mean context
    assert lv["mean_input_tokens"] == 32 and lv["mean_context_tokens"] == 40
    assert "--save-detailed" in lv["note"]


def test_real_sglang_bench_serving_jsonl_open_loop() -> None:
    # datacrunch-research/h200-benchmarks: Llama-3.3-70B on H200, bench_serving --request-rate
    # 1..16 (no --max-concurrency), an older key set: medians of TTFT and ITL, mean and
    # median E2E, no request_throughput
    path = RESULTS / "sglang_bench_serving_llama-3.3-70b_h200_online.jsonl"
    levels = load_results([path])
    assert len(levels) == 7
    by_rate = {(lv["source"], round(lv["requests_per_s"], 3)): lv for lv in levels}
    assert len(by_rate) == 7
    first = json.loads(path.read_text().splitlines()[0])  # random 1024/1024, rate 1.0
    (lv,) = [x for x in levels if x["completed"] == 300]
    assert first["request_rate"] == 1.0
    assert lv["ttft_s"]["p50"] == pytest.approx(85.74514742940664e-3, rel=1e-12)
    assert lv["ttft_s"]["mean"] is None  # the line has no mean_ttft_ms
    assert lv["tbt_s"]["p50"] == pytest.approx(13.638956006616354e-3, rel=1e-12)
    assert lv["e2e_s"]["mean"] == pytest.approx(7840.616212638561e-3, rel=1e-12)
    assert lv["output_tokens_per_s"] == 537.4142851849319
    # no request_throughput: completed / duration = 300 / 298.3675805060193 s
    assert lv["requests_per_s"] == pytest.approx(300 / 298.3675805060193, rel=1e-12)
    # Little's law: 1.005471 req/s x 7.840616 s = 7.8835 requests in the system
    assert lv["in_flight_mean"] == pytest.approx(1.0054711691 * 7.8406162126, rel=1e-9)
    assert lv["in_flight_mean"] == pytest.approx(7.8835, abs=1e-4)
    assert lv["concurrency"] == 8 and lv["open_loop"] is True
    assert "Little's law" in lv["note"]
    # 152612 input / 300 = 508.71 tokens; context 508.71 + 160347 / 300 / 2 = 775.95
    assert lv["mean_input_tokens"] == pytest.approx(508.70666, rel=1e-6)
    assert lv["mean_context_tokens"] == pytest.approx(508.70666 + 267.245, rel=1e-6)


def test_real_sglang_file_fits_on_medians_and_says_so() -> None:
    path = RESULTS / "sglang_bench_serving_llama-3.3-70b_h200_online.jsonl"
    r = CliRunner().invoke(cli, ["calibrate", "--from-results", str(path), "--format", "json"])
    assert r.exit_code == 0, r.output
    fit = json.loads(r.output)["fit"]
    assert fit["tbt_law"]["n_levels"] == 7
    assert "median" in fit["centre"]
    # the fit's x is the Little's-law mean in flight, not the rounded concurrency
    levels = load_results([path])
    x = np.array([lv["in_flight_mean"] for lv in levels])
    y = np.array([lv["tbt_s"]["p50"] for lv in levels])
    b, a = np.polyfit(x, y, 1)
    assert fit["tbt_law"]["per_concurrency_s"] == pytest.approx(b, rel=1e-9)
    assert fit["tbt_law"]["intercept_s"] == pytest.approx(a, rel=1e-9)


def test_open_loop_without_e2e_is_one_line_refusal(tmp_path: Path) -> None:
    # a real vLLM nightly summary keeps no duration/completed: concurrency cannot be estimated
    p = tmp_path / "nightly.json"
    p.write_text(json.dumps({"backend": "vllm", "request_rate": 16.0, "max_concurrency": None,
                             "mean_ttft_ms": 333.0, "mean_itl_ms": 107.0}))
    r = CliRunner().invoke(cli, ["calibrate", "--from-results", str(p)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert "Little" not in r.output and "max-concurrency" in r.output


def test_aiperf_export_without_request_count_leaves_it_null(tmp_path: Path) -> None:
    """A metric the export lacks is null, never filled in (docs/probe.md): no request_count
    is `completed: null` (it was 0), the other figures as the file gives them."""
    d = json.loads((RESULTS / "aiperf_gpt-oss-20b_c100_profile_export_aiperf.json").read_text())
    d.get("records", d).pop("request_count")
    p = tmp_path / "profile_export_aiperf.json"
    p.write_text(json.dumps(d))
    (lv,) = load_results([p])
    assert lv["completed"] is None and lv["errors"] == 11
    r = CliRunner().invoke(cli, ["calibrate", "--from-results", str(p), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["levels"][0]["completed"] is None


@pytest.mark.parametrize(("edit", "msg"), [
    (lambda d: d.update(itls=d["itls"][:5]),
     "the per-request lists differ in length (16 ttfts, 5 itls, 16 output_lens, "
     "16 input_lens); vllm bench serve --save-detailed writes one entry per request"),
    (lambda d: d.update(completed=20), "completed 20 but the per-request lists hold 16 requests"),
    (lambda d: d.update(completed=0, ttfts=[], itls=[], output_lens=[], input_lens=[]),
     "completed 0: no request finished in this run"),
])
def test_inconsistent_vllm_file_is_refused(tmp_path: Path, edit, msg) -> None:
    d = json.loads(VLLM.read_text())
    edit(d)
    p = tmp_path / "vllm-result.json"
    p.write_text(json.dumps(d))
    r = CliRunner().invoke(cli, ["calibrate", "--from-results", str(p)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert f"vllm-result.json: {msg}" in r.output


def test_guidellm_request_totals_on_the_benchmark_itself() -> None:
    """Audit defect 3: this file (from the guidellm repository) has benchmarks[0].request_totals
    = {successful 46, errored 0, incomplete 1, total 47} and none under metrics; it read as
    done 0, errors 0. Expected: done 46, errors 0 + 1 = 1."""
    (lv,) = load_results([RESULTS / "guidellm_synchronous_benchmarks_stripped.json"])
    assert lv["completed"] == 46 and lv["errors"] == 1


def test_guidellm_lengths_fit_its_ttft_and_the_overhead_from_the_lowest_concurrency() -> None:
    """Audit defect 4: every GuideLLM benchmark has prompt_token_count and output_token_count
    (means 512 and 128 in guidellm_report.json): mean context = 512 + 128 / 2 = 576. With them
    its levels go through the latency model (TTFT too), and the request overhead comes from the
    lowest concurrency, GuideLLM's c=1 (TTFT 37.89 ms), not vLLM's c=8 (51.22 ms, queueing
    included), which gave request_overhead_s = 7e-15."""
    levels = load_results([GUIDELLM])
    assert [(lv["mean_input_tokens"], lv["mean_context_tokens"]) for lv in levels] == [
        (512.0, 576.0)] * 3
    r = CliRunner().invoke(cli, ["calibrate", "--from-results", str(VLLM), str(GUIDELLM),
                                 "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    fit = json.loads(r.output)["fit"]
    assert {row["forward_model"] for row in fit["round_trip"]} == {"latency"}
    assert "request overhead from the TTFT at concurrency 1" in fit["note"]
    c1 = fit["round_trip"][0]
    assert c1["concurrency"] == 1
    assert c1["ttft_measured_s"] == pytest.approx(0.03789, abs=1e-5)
    # the fitted overhead makes the c=1 TTFT: a 512-token prefill on an H100 is a few ms, so
    # the overhead is most of the 37.89 ms (between 20 and 37.89 ms)
    assert c1["ttft_predicted_s"] == pytest.approx(c1["ttft_measured_s"], rel=0.03)
    assert 0.020 < fit["calibration_params"]["request_overhead_s"] < 0.03789


def _summary_only(d: dict) -> dict:
    for k in ("ttfts", "itls", "input_lens", "output_lens", "errors"):
        d.pop(k, None)
    return d


AIPERF = RESULTS / "aiperf_gpt-oss-20b_c100_profile_export_aiperf.json"


def _ai(d: dict) -> dict:
    return d.get("records", d)


@pytest.mark.parametrize(("base", "edit", "msg"), [
    (VLLM, lambda d: _summary_only(d).pop("output_throughput"),
     "output_throughput is missing or null; expected a number"),
    (VLLM, lambda d: _summary_only(d).update(request_throughput=None),
     "request_throughput is missing or null; expected a number"),
    (VLLM, lambda d: d.update(completed="abc"), "completed is 'abc', not a number"),
    (VLLM, lambda d: d.update(max_concurrency="eight"), "max_concurrency is 'eight', not a number"),
    (VLLM, lambda d: d.update(max_concurrency=2.5), "max_concurrency is 2.5, not a whole number"),
    (AIPERF, lambda d: d["input_config"]["loadgen"].update(concurrency="four"),
     "input_config concurrency is 'four', not a number"),
    (AIPERF, lambda d: _ai(d)["ttft"].update(avg="abc"), "ttft.avg is 'abc', not a number"),
])
def test_a_bad_field_of_a_known_file_is_named(tmp_path: Path, run_cli, base, edit, msg) -> None:
    """Audit defect 10: a recognised file with a field of the wrong type said "not a results
    file capplan reads (vllm bench serve --save-result or GuideLLM report): TypeError"."""
    d = json.loads(base.read_text())
    edit(d)
    p = tmp_path / "r.json"
    p.write_text(json.dumps(d))
    r = run_cli("calibrate", "--from-results", str(p))
    assert r.exit_code == 2 and r.stderr == f"Error: r.json: {msg}\n", r.stderr


def test_calibrate_help_lists_every_results_format(run_cli) -> None:
    out = " ".join(run_cli("calibrate", "--help").stdout.split())
    for tool in ("vllm bench serve", "GuideLLM", "LLMPerf", "AIPerf", "genai-perf", "SGLang"):
        assert tool in out, tool


@pytest.mark.parametrize(("unit", "avg", "want_ms"), [("ns", 50e6, 50.0), ("s", 0.05, 50.0)])
def test_aiperf_aggregate_time_units(tmp_path: Path, unit: str, avg: float,
                                     want_ms: float) -> None:
    d = json.loads(AIPERF.read_text())
    _ai(d)["ttft"] = {"unit": unit, "avg": avg}
    p = tmp_path / "profile_export_aiperf.json"
    p.write_text(json.dumps(d))
    (lv,) = load_results([p])
    assert lv["ttft_s"]["mean"] * 1e3 == pytest.approx(want_ms, rel=1e-12)


def test_aiperf_aggregate_unknown_time_unit_is_refused(tmp_path: Path, run_cli) -> None:
    """Audit defect 11: {"unit": "furlongs", "avg": 5} read as 5 ms; the per-record reader
    refuses it."""
    d = json.loads(AIPERF.read_text())
    _ai(d)["ttft"] = {"unit": "furlongs", "avg": 5}
    p = tmp_path / "profile_export_aiperf.json"
    p.write_text(json.dumps(d))
    r = run_cli("calibrate", "--from-results", str(p))
    assert r.exit_code == 2 and len(r.stderr_lines) == 1
    assert "ttft.unit is 'furlongs'; a latency needs a time unit (ns, us, ms, s)" in r.stderr


def test_from_results_with_another_model_warns_and_the_file_records_it(tmp_path: Path,
                                                                        run_cli) -> None:
    """Audit defect 12: the vLLM file says model_id meta-llama/Llama-3.1-8B-Instruct (catalog
    llama-3.1-8b); fitted as --model qwen2.5-7b it said nothing, and the calibration did not
    record its model. Now: a warning, measured.model, and a warning when the file is used
    with another model."""
    out = tmp_path / "cal.yaml"
    r = run_cli("calibrate", "--from-results", str(VLLM), "--model", "qwen2.5-7b", "--gpu",
                "h100-sxm", "--out", str(out))
    assert r.exit_code == 0, r.stderr
    assert ("warning: the results files measured meta-llama/Llama-3.1-8B-Instruct, and --model "
            "qwen2.5-7b is qwen2.5-7b") in r.stderr
    r = run_cli("calibrate", "--from-results", str(VLLM), "--model", "llama-3.1-8b", "--gpu",
                "h100-sxm", "--out", str(out))
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr
    import yaml

    measured = yaml.safe_load(out.read_text())["measured"]
    assert measured["model"] == "llama-3.1-8b"
    assert measured["served_model"] == "meta-llama/Llama-3.1-8B-Instruct"
    args = ("speed", "--gpu", "h100-sxm", "--calibration", str(out), "--batch", "1")
    r = run_cli(*args, "--model", "qwen2.5-7b")
    assert r.exit_code == 0 and "measured with llama-3.1-8b, this run is of qwen2.5-7b" in r.stderr
    r = run_cli(*args, "--model", "llama-3.1-8b")
    assert r.exit_code == 0 and "warning" not in r.stderr, r.stderr


def test_from_results_of_a_served_name_is_silenced_by_served_model(tmp_path: Path,
                                                                   run_cli) -> None:
    """Review finding 6: a file naming the served name (model_id my-llama) warned with the
    right --model llama-3.1-8b, and the remedy (--served-model) was refused without
    --endpoint. --served-model names it: no warning when either name matches."""
    d = json.loads(VLLM.read_text())
    d["model_id"] = "my-llama"
    p = tmp_path / "served.json"
    p.write_text(json.dumps(d))
    args = ("calibrate", "--from-results", str(p), "--model", "llama-3.1-8b", "--gpu",
            "h100-sxm")
    r = run_cli(*args)
    assert r.exit_code == 0 and "--served-model my-llama" in r.stderr, r.stderr
    r = run_cli(*args, "--served-model", "my-llama")
    assert r.exit_code == 0 and "the results files measured" not in r.stderr, r.stderr
    r = run_cli(*args, "--served-model", "other-name")
    assert r.exit_code == 0 and "the results files measured my-llama" in r.stderr
