"""`capplan simulate` through click's CliRunner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from capplan.cli import cli

BASE = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--requests", "60"]
KEYS = {"ttft_s", "tbt_s", "e2e_s", "tpot_s", "queue_s", "output_tokens_per_s",
        "input_tokens_per_s", "requests_per_s", "goodput_requests_per_s", "mean_running_batch",
        "preemptions", "kv_peak_utilization", "mean_in_system", "time_series", "calibration"}


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPPLAN_HOME", str(tmp_path))


def invoke(*args: str):
    return CliRunner().invoke(cli, [*BASE, *args], catch_exceptions=False)


@pytest.mark.parametrize("mode", [["--rate", "4"], ["--concurrency", "8"]])
def test_json_keys(mode):
    r = invoke(*mode, "--format", "json", "--input-len", "lognormal:mean=200,p99=800")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert KEYS <= set(d)
    assert set(d["ttft_s"]) - {"band"} == {"mean", "p50", "p90", "p99"}  # band: error band
    assert d["num_requests"] == 60


def test_trace_and_side_by_side(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text("timestamp,input_tokens,output_tokens\n" +
                 "".join(f"{i * 0.1},{100 + i},{20 + i}\n" for i in range(30)))
    r = invoke("--trace", str(p), "--format", "json", "--scheduler", "continuous,static,dynamic",
               "--batch-size", "8")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert set(d["schedulers"]) == {"continuous", "static", "dynamic"}
    assert d["schedulers"]["static"]["num_requests"] == 30
    r = invoke("--trace", str(p), "--scheduler", "continuous,static")
    assert r.exit_code == 0
    assert "TTFT p99 (ms)" in r.stdout and "static" in r.stdout


@pytest.mark.parametrize("args, msg", [
    (["--rate", "-1"], "--rate"),
    (["--rate", "1", "--concurrency", "2"], "exactly one of"),
    ([], "exactly one of"),
    (["--rate", "1", "--input-len", "lognormal:mean=10,p99=1000"], "no lognormal"),
    (["--rate", "1", "--scheduler", "fifo"], "--scheduler"),
    (["--trace", "/nonexistent/t.csv"], "no such trace"),
    (["--concurrency", "2", "--scheduler", "static"], "concurrency"),
])
def test_bad_input_exit_2(args, msg):
    r = invoke(*args)
    assert r.exit_code == 2
    assert msg in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_slow_trace_rate_is_not_rounded_to_zero():
    """3 BurstGPT requests over about 115 s: 3 / 115 = 0.026 req/s, shown as such (one
    decimal rounded it, and the mean batch of a mostly idle engine, to 0.0)."""
    from pathlib import Path

    trace = Path(__file__).resolve().parents[1] / "data" / "traces" / "burstgpt_1_head3.csv"
    r = invoke("--trace", str(trace))
    assert r.exit_code == 0, r.output
    rows = {ln[:27].strip(): ln[27:].strip() for ln in r.output.splitlines()}
    makespan_s = float(rows["makespan (s)"])
    assert 113 <= makespan_s <= 125  # arrivals at 5 s and 118 s, each served in seconds
    assert float(rows["requests (req/s)"]) == pytest.approx(3 / makespan_s, rel=0.05)
    assert float(rows["mean running batch (seqs)"]) > 0
