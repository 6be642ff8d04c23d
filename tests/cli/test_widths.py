"""Every command's default table fits 120 columns (issue 15: the demo table was 178 wide).

Launch lines (`vLLM:`, `vLLM (lane):`, `SGLang:`, `verify:`, and under a label a fleet's
further replicas, router and hosts, or a replica's further hosts) are exempt: they are commands
to copy whole.
`calibrate` is left out (it runs microbenchmarks or needs a server; its tables are the
probe's) and `schema` prints JSON.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

WIDTH = 120
LAUNCH_MORE = re.compile(r" +(replica \d+ \(|router: |hosts: |node \d+: |any node: )")
"""A launch block's line under its label's first one."""
EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
M8 = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm")

COMMANDS = [
    pytest.param(("gpus",), id="gpus"),
    pytest.param(("models",), id="models"),
    pytest.param(("memory", *M8), id="memory"),
    pytest.param(("memory", "--model", "gpt-oss-120b", "--gpu", "h100-sxm"), id="memory-no-fit"),
    pytest.param(("speed", *M8, "--prefill", "512,8192"), id="speed"),
    pytest.param(("latency", *M8, "--rate", "10"), id="latency"),
    pytest.param(("latency", *M8, "--rate", "5,10,20,400"), id="latency-rate-sweep"),
    pytest.param(("latency", *M8, "--concurrency", "1,8,64"), id="latency-concurrency-sweep"),
    pytest.param(("latency", *M8, "--rate", "400"), id="latency-unstable"),
    pytest.param(("simulate", *M8, "--rate", "10", "--requests", "200",
                  "--scheduler", "continuous,static,dynamic"), id="simulate"),
    pytest.param(("recommend", "--model", "llama-3.1-8b", "--rate", "10", "--ttft-p99", "0.5",
                  "--tbt-p99", "0.05", "--verify-top", "0"), id="recommend"),
    *(pytest.param(("plan", str(p), "--no-verify"), id=f"plan-{p.stem}") for p in EXAMPLES),
]


@pytest.mark.parametrize("args", COMMANDS)
def test_default_table_fits_120_columns(run_cli, args):
    res = run_cli(*args)
    assert res.exit_code == 0, (res.stderr, res.exception)
    lines = [ln for ln in res.stdout.splitlines()
             if not ln.startswith(("vLLM", "SGLang", "TensorRT-LLM", "verify"))
             and not LAUNCH_MORE.match(ln)]
    assert lines, "no output"
    wide = [(len(ln), ln) for ln in lines if len(ln) > WIDTH]
    assert not wide, wide


def test_wrapped_headers_are_one_line_in_csv(run_cli):
    """Headers wrapped for the table come out whole in CSV ("$ per GPU-hour", not split)."""
    res = run_cli("gpus", "--format", "csv")
    header = res.stdout.splitlines()[0]
    assert "memory (GiB)" in header and "$ per GPU-hour" in header
    res = run_cli("models", "--format", "csv")
    assert "meta-llama/Llama-3.1-8B-Instruct" in res.stdout


def test_simulate_prints_ms_without_e_notation(run_cli):
    """Issue 15: simulate printed `3.242e+04` and E2E in seconds where latency prints ms."""
    res = run_cli("simulate", *M8, "--rate", "30", "--requests", "300",
                  "--scheduler", "continuous,static")
    assert res.exit_code == 0, res.stderr
    assert "E2E p99 (ms)" in res.stdout and "(s)" not in res.stdout.split("makespan")[0]
    assert "e+" not in res.stdout


def test_memory_names_resolved_dtypes(run_cli):
    res = run_cli("memory", "--model", "gpt-oss-120b", "--gpu", "h200")
    assert res.exit_code == 0, res.stderr
    assert "mxfp4 (auto)" in res.stdout and "bf16 (auto)" in res.stdout


@pytest.mark.parametrize("cmd,cols", [("models", ("key", "hf_id", "attention")),
                                      ("gpus", ("key", "name"))])
def test_csv_cells_are_the_json_values_never_wrapped(run_cli, cmd, cols):
    # "linear_attention" once came out as "linear_a ttention": a table's wrap split the word
    data = json.loads(run_cli(cmd, "--format", "json").stdout)
    rows = list(csv.reader(io.StringIO(run_cli(cmd, "--format", "csv").stdout)))[1:]
    index = {"models": {"key": 0, "hf_id": 1, "attention": 5}, "gpus": {"key": 0, "name": 1}}
    assert len(rows) == len(data)
    for row, want in zip(rows, data, strict=True):
        for c in cols:
            assert row[index[cmd][c]] == want[c], (c, row, want)
