"""`capplan latency`: open loop (--rate), closed loop (--concurrency), traces; the JSON contract;
overload; bad input."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from _asserts import assert_one_line_error

LAT = ("latency", "--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb")
DIST_KEYS = ("ttft_s", "tbt_s", "e2e_s")
STATS = {"mean", "p50", "p90", "p99"}
SCALARS = ("output_tokens_per_s", "input_tokens_per_s", "requests_per_s", "mean_running_batch",
           "preemptions", "kv_peak_utilization")

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.0000000,400,100
2023-11-16 18:15:46.5000000,600,300
2023-11-16 18:15:47.0000000,500,200
2023-11-16 18:15:48.0000000,500,200
"""


def _json(run_cli, *args: str) -> dict:
    res = run_cli(*LAT, *args, "--format", "json")
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert res.stderr == ""
    return res.json()


def _assert_contract(d: dict) -> None:
    for key in DIST_KEYS:
        assert set(d[key]) - {"band"} == STATS, key  # band: the mean's error band
        assert len(d[key].get("band", [0, 0])) == 2, key
    for key in SCALARS:
        assert isinstance(d[key], float), key
    assert isinstance(d["stable"], bool)
    if d["stable"]:
        for key in DIST_KEYS:
            v = d[key]
            assert all(math.isfinite(v[s]) and v[s] > 0 for s in STATS), (key, v)
            assert v["p50"] <= v["p90"] <= v["p99"], (key, v)
        assert d["e2e_s"]["mean"] > d["ttft_s"]["mean"]
        assert 0 <= d["kv_peak_utilization"] <= 1
        assert d["preemptions"] == 0.0
        assert d["mean_running_batch"] > 0




# ---------------------------------------------------------------------------------------------
# Open loop
# ---------------------------------------------------------------------------------------------


def _simulated(run_cli, *args: str) -> dict:
    res = run_cli("simulate", *LAT[1:], *args, "--requests", "600", "--seed", "11",
                  "--format", "json")
    assert res.exit_code == 0, (res.stderr, res.exception)
    return res.json()


@pytest.fixture
def steps_only(tmp_path) -> str:
    """A calibration with no per-request overhead outside engine steps: both doors add the
    same constant request_overhead_s to TTFT and E2E, so the comparison is of what each models
    independently, the engine's steps."""
    p = tmp_path / "steps-only.yaml"
    p.write_text("version: 1\ngpu: a100-sxm-80gb\nparams:\n  request_overhead_s: 0\n",
                 encoding="utf-8")
    return str(p)


def test_rate_contract_and_latency_against_the_simulator(run_cli, steps_only):
    """The analytic means against the step-by-step simulator (an independent implementation
    of the same engine, its own seed) on the same deployment and load: within 5 %."""
    args = ("--rate", "2", "--input-len", "512", "--output-len", "256",
            "--calibration", steps_only)
    d = _json(run_cli, *args)
    _assert_contract(d)
    assert d["stable"] is True
    sim = _simulated(run_cli, *args)
    for key in DIST_KEYS:
        assert d[key]["mean"] == pytest.approx(sim[key]["mean"], rel=0.05), key
    # Little's law on the simulator's own numbers: the running batch is the arrival rate
    # times the time a request spends decoding (E2E - TTFT); 10% for the finite run's ends
    decoding_s = sim["e2e_s"]["mean"] - sim["ttft_s"]["mean"]
    assert d["mean_running_batch"] == pytest.approx(2 * decoding_s, rel=0.10)
    # every gap is at least one bf16 weight read: 15,009,849,344 B / 2.039e12 B/s = 7.36 ms
    assert d["tbt_s"]["p50"] >= 15_009_849_344 / 2.039e12
    assert (d["model"], d["gpu"], d["tp"]) == ("llama-3.1-8b", "a100-sxm-80gb", 1)


def test_latency_grows_with_rate(run_cli):
    lo = _json(run_cli, "--rate", "1")
    hi = _json(run_cli, "--rate", "10")
    assert hi["ttft_s"]["mean"] > lo["ttft_s"]["mean"]
    assert hi["tbt_s"]["mean"] > lo["tbt_s"]["mean"]
    assert hi["mean_running_batch"] > lo["mean_running_batch"]


def test_overloaded_rate_reports_capacity(run_cli):
    d = _json(run_cli, "--rate", "200")
    assert d["stable"] is False
    assert "exceeds" in d["reason"] and "200" in d["reason"]
    cap = d["capacity_requests_per_s"]
    assert 0 < cap < 200
    # one replica cannot decode faster than a bf16 weight read per step at the 256-sequence
    # cap: 256 seqs / 7.36 ms / 256 tokens per request = 136 req/s at the very most
    assert cap < 256 / (15_009_849_344 / 2.039e12) / 256
    for key in DIST_KEYS:  # no numbers where the queue grows without bound
        assert all(d[key][s] is None for s in STATS), (key, d[key])
    assert d["bound"] in ("prefill compute", "concurrency cap", "decode bandwidth")
    # the capacity is itself a stable rate, and just above it is not
    at_cap = _json(run_cli, "--rate", f"{cap * 0.97:.6g}")
    assert at_cap["stable"] is True
    above = _json(run_cli, "--rate", f"{cap * 1.05:.6g}")
    assert above["stable"] is False


def test_overloaded_table_says_so(run_cli):
    res = run_cli(*LAT, "--rate", "200")
    assert res.exit_code == 0
    assert "200" in res.stdout and "exceeds" in res.stdout


def test_table_format(run_cli):
    res = run_cli(*LAT, "--rate", "2")
    assert res.exit_code == 0 and res.stderr == ""
    for word in ("TTFT", "TBT", "E2E", "p99 (ms)", "output tokens (tok/s)", "512"):
        assert word in res.stdout, word


# ---------------------------------------------------------------------------------------------
# Closed loop
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("conc", [1, 8])
def test_concurrency_against_the_simulator(run_cli, conc, steps_only):
    """A closed loop of C clients: throughput and E2E against the simulator's closed loop of
    the same C clients (within 5 %), and about C sequences running."""
    d = _json(run_cli, "--concurrency", str(conc), "--calibration", steps_only)
    _assert_contract(d)
    assert d["stable"] is True
    assert "closed loop" in d["load"]
    sim = _simulated(run_cli, "--concurrency", str(conc), "--calibration", steps_only)
    assert d["output_tokens_per_s"] == pytest.approx(sim["output_tokens_per_s"], rel=0.05)
    assert d["e2e_s"]["mean"] == pytest.approx(sim["e2e_s"]["mean"], rel=0.05)
    # each client spends nearly all of its time decoding: about C sequences running
    assert d["mean_running_batch"] == pytest.approx(conc, rel=0.05)


def test_more_clients_more_throughput(run_cli):
    one = _json(run_cli, "--concurrency", "1")
    many = _json(run_cli, "--concurrency", "16")
    # memory-bound decode: 16 clients share each weight read; far more than 8x the throughput
    assert many["output_tokens_per_s"] > 8 * one["output_tokens_per_s"]


# ---------------------------------------------------------------------------------------------
# Trace
# ---------------------------------------------------------------------------------------------


def test_azure_trace(run_cli, tmp_path):
    f = tmp_path / "azure.csv"
    f.write_text(AZURE)
    d = _json(run_cli, "--trace", str(f))
    _assert_contract(d)
    # what was read: 4 requests over 2.0 s, (4 - 1) / 2 = 1.5 req/s
    assert d["trace"]["rows"] == 4 and d["trace"]["span_s"] == pytest.approx(2.0)
    assert d["trace"]["mean_rate_per_s"] == pytest.approx(1.5, rel=1e-12)
    # the replay serves the trace as it arrives: 4 requests, 800 output and 2000 prompt tokens
    # ((100+300+200+200), (400+600+500+500)) from the first arrival to the last completion
    assert d["answered_by"] == "replay" and not d["warnings"]
    span = d["makespan_s"]
    assert span > 2.0
    assert d["requests_per_s"] == pytest.approx(4 / span, rel=1e-12)
    assert d["output_tokens_per_s"] == pytest.approx(800 / span, rel=1e-12)
    assert d["input_tokens_per_s"] == pytest.approx(2000 / span, rel=1e-12)
    assert str(f) in d["load"]
    assert "4 requests over 2 s" in d["load"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,400\n",
                     ":1: no output tokens column", id="missing-output-column"),
        pytest.param("ContextTokens,GeneratedTokens\n400,100\n",
                     ":1: no arrival time column", id="missing-arrival-column"),
        pytest.param(AZURE.replace("600,300", "abc,300"), ":3: ContextTokens 'abc'",
                     id="bad-value-line-3"),
        pytest.param(AZURE.replace("500,200\n2023", "-5,200\n2023", 1), ":4: ContextTokens",
                     id="negative-length"),
        pytest.param("TIMESTAMP,ContextTokens,GeneratedTokens\n", "empty trace", id="empty"),
        pytest.param("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,4,1\n",
                     "at least two requests", id="one-request"),
    ],
)
def test_bad_trace_one_line_names_file(run_cli, tmp_path, text, fragment):
    f = tmp_path / "trace.csv"
    f.write_text(text)
    res = run_cli(*LAT, "--trace", str(f))
    assert_one_line_error(res, fragment)
    assert str(f) in res.stderr


@pytest.mark.parametrize("rows,shown", [
    (["5,100,10"], "1 request;"),
    (["0,100,10", "0,100,10", "0,100,10"], "3 requests at one instant (no rate);")],
    ids=["one-row", "one-instant"])
def test_a_trace_without_a_rate_is_refused_as_a_rate_and_replayed_as_it_is(run_cli, tmp_path,
                                                                            rows, shown):
    """One row, or every row at one instant (an offline `--request-rate inf` burst), has no
    rate: `latency`, which answers for a rate, refuses it in one line (exit 2); `simulate`
    replays the requests as they are and says what it read (it printed "1 requests over 0 s")."""
    f = tmp_path / "t.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    res = run_cli(*LAT, "--trace", str(f))
    assert_one_line_error(res, f"{f}: needs at least two requests at different times")
    res = run_cli("simulate", *LAT[1:], "--trace", str(f), "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["num_requests"] == len(rows)
    assert f"{f}: {shown}" in res.stderr


def test_missing_trace_file(run_cli, tmp_path):
    assert_one_line_error(run_cli(*LAT, "--trace", str(tmp_path / "none.csv")),
                          "no such trace file")


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(("--rate", "-1"), "--rate", id="rate-negative"),
        pytest.param(("--rate", "0"), "--rate", id="rate-0"),
        pytest.param(("--rate", "inf"), "finite", id="rate-inf"),
        pytest.param(("--rate", "nan"), "finite", id="rate-nan"),
        pytest.param(("--rate", "fast"), "'fast' is not a number", id="rate-word"),
        pytest.param(("--rate", "1", "--concurrency", "2"), "exactly one of", id="rate-and-conc"),
        pytest.param((), "exactly one of --rate, --concurrency or --trace", id="neither"),
        pytest.param(("--concurrency", "0"), "--concurrency", id="conc-0"),
        pytest.param(("--concurrency", "-3"), "--concurrency", id="conc-negative"),
        pytest.param(("--concurrency", "2.5"), "--concurrency", id="conc-float"),
        pytest.param(("--rate", "1", "--burstiness", "0"), "--burstiness", id="burstiness-0"),
        pytest.param(("--rate", "1", "--input-len", "abc"), "", id="input-len-word"),
        pytest.param(("--rate", "1", "--output-len", "-4"), "", id="output-len-negative"),
    ],
)
def test_bad_input_one_line(run_cli, args, fragment):
    assert_one_line_error(run_cli(*LAT, *args), fragment)


def test_bad_rate_subprocess_no_traceback(run_module):
    res = run_module(*LAT, "--rate", "nan")
    assert res.exit_code == 2
    assert "Traceback" not in res.stderr
    assert len(res.stderr_lines) == 1 and res.stderr_lines[0].startswith("Error: ")


# ---------------------------------------------------------------------------------------------
# Sweeps (issue 15): one row per level, JSON a list
# ---------------------------------------------------------------------------------------------


def test_rate_sweep_one_row_per_level(run_cli):
    res = run_cli(*LAT, "--rate", "1,2,4")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("---"))
    rows = [ln.split() for ln in lines[head + 1:] if ln.strip()][:3]
    assert [r[0] for r in rows] == ["1", "2", "4"]
    for word in ("TTFT ms", "TBT ms", "E2E ms", "p50", "p90", "p99"):
        assert word in res.stdout, word


def test_rate_sweep_json_is_a_list_matching_single_runs(run_cli):
    res = run_cli(*LAT, "--rate", "1,3", "--format", "json")
    assert res.exit_code == 0, res.stderr
    levels = res.json()
    assert isinstance(levels, list) and len(levels) == 2
    for d in levels:
        _assert_contract(d)
    assert [d["requests_per_s"] for d in levels] == [1.0, 3.0]
    single = _json(run_cli, "--rate", "3")
    assert levels[1]["ttft_s"] == single["ttft_s"] and levels[1]["e2e_s"] == single["e2e_s"]


def test_rate_sweep_rows_share_one_key_set_whoever_answers(run_cli):
    # Llama-3.1-8B on an H100, 1024/256 tokens: 5 req/s is screened analytic, 20 req/s is
    # replayed (docs/queueing.md's screen table: TBT p99 26% off) and 40 req/s is above the
    # analytic capacity (~25 req/s): all three answerers in one sweep.
    res = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate",
                  "5,20,40", "--input-len", "1024", "--output-len", "256", "--format", "json")
    assert res.exit_code == 0, res.stderr
    rows = res.json()
    assert [(r["answered_by"], r["stable"]) for r in rows] == [
        ("analytic", True), ("replay", True), ("analytic", False)]
    assert set(rows[0]) == set(rows[1]) == set(rows[2])
    ana, rep, over = rows
    assert ana["step_s"] > 0 and rep["step_s"] is None  # the analytic queue's own figure
    assert rep["makespan_s"] > 0 and ana["makespan_s"] is None  # the replay's own figure
    assert over["capacity_requests_per_s"] > 0 and ana["capacity_requests_per_s"] is None
    assert ana["engine"] == rep["engine"] and ana["engine"].startswith("vllm")


def test_concurrency_sweep_csv_numbers_only(run_cli):
    res = run_cli(*LAT, "--concurrency", "1,8", "--format", "csv")
    assert res.exit_code == 0, res.stderr
    rows = list(csv.reader(io.StringIO(res.stdout)))
    assert rows[0][0] == "clients" and len(rows) == 3
    assert [r[0] for r in rows[1:]] == ["1", "8"]
    assert rows[0][1:3] == ["stable", "answered by"]
    for r in rows[1:]:
        assert r[2] == "replay"  # a closed loop is replayed
        for cell in r[3:]:
            float(cell)  # numbers, no "5%" or "12 ms" strings


def test_sweep_marks_unstable_levels(run_cli):
    res = run_cli(*LAT, "--rate", "2,500")
    assert res.exit_code == 0, res.stderr
    assert "unstable" in res.stdout and "unstable at 500" in res.stdout


def test_single_level_csv_has_numbers_not_percent_strings(run_cli):
    res = run_cli(*LAT, "--rate", "2", "--format", "csv")
    assert res.exit_code == 0
    assert "%," not in res.stdout and not any(ln.endswith("%") for ln in res.stdout.splitlines())
    kv = next(r for r in csv.reader(io.StringIO(res.stdout)) if r and r[0].startswith("KV peak"))
    assert 0 <= float(kv[1]) <= 100


def test_auto_dtypes_resolved(run_cli):
    d = _json(run_cli, "--rate", "2", "--kv-dtype", "fp8")
    assert d["weight_dtype"] == "bf16" and d["kv_dtype"] == "fp8"
    res = run_cli(*LAT, "--rate", "2")
    assert "weight dtype" in res.stdout and "auto" not in res.stdout


def test_replayed_rate_says_its_throughput_counts_the_drain(run_cli):
    # 23 req/s on Llama-3.1-8B / H100, 1024/256 tokens is replayed (the screen's TBT p99 is
    # off): its request throughput is completed / (first arrival to last completion), as vllm
    # bench serve divides by the benchmark's duration, so it is below the offered rate.
    res = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "23",
                  "--input-len", "1024", "--output-len", "256", "--format", "json")
    d = res.json()
    assert d["answered_by"] == "replay" and d["stable"]
    assert d["requests_per_s"] == pytest.approx(d["num_requests"] / d["makespan_s"])
    assert d["requests_per_s"] < 23
    note = next(n for n in d["notes"] if n.startswith("throughput is completed requests"))
    assert f"{d['num_requests']} requests / {d['makespan_s']:.4g} s, at 23 req/s offered" in note
