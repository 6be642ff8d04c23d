"""`capplan speed`: batch lists and ranges, contexts, prefill rows, every format, bad input."""

from __future__ import annotations

import csv
import io

import pytest
from _asserts import assert_one_line_error

SPEED = ("speed", "--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb")
ROW_KEYS = {"batch", "context_len", "step_time_s", "tokens_per_s_total", "tokens_per_s_per_seq",
            "bound"}
PREFILL_KEYS = {"prompt_len", "prefill_s", "ttft_floor_s", "prefill_tokens_per_s"}


def _json(run_cli, *args: str) -> dict:
    res = run_cli(*SPEED, *args, "--format", "json")
    assert res.exit_code == 0, (res.stderr, res.exception)
    assert res.stderr == ""
    return res.json()




# ---------------------------------------------------------------------------------------------
# --batch / --context parsing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "batches"),
    [
        ("1,8,32", [1, 8, 32]),
        ("1-64", [1, 2, 4, 8, 16, 32, 64]),  # a doubling range
        ("3-20", [3, 6, 12]),  # doubling from 3; 24 > 20 stops
        ("8:32:8", [8, 16, 24, 32]),  # start:stop:step
        ("1,4-16", [1, 4, 8, 16]),
        ("5", [5]),
    ],
)
def test_batch_lists_and_ranges(run_cli, spec, batches):
    d = _json(run_cli, "--batch", spec)
    assert [r["batch"] for r in d["rows"]] == batches
    assert all(r["context_len"] == 1024 for r in d["rows"])  # default context
    assert d["prefill"] == []


def test_several_contexts_rows_per_pair(run_cli):
    d = _json(run_cli, "--batch", "1,8", "--context", "512,4096")
    # context-major: every batch at 512, then every batch at 4096
    assert [(r["batch"], r["context_len"]) for r in d["rows"]] == [
        (1, 512), (8, 512), (1, 4096), (8, 4096)]
    for r in d["rows"]:
        assert set(r) >= ROW_KEYS
    by = {(r["batch"], r["context_len"]): r["step_time_s"] for r in d["rows"]}
    # more context, more KV read: batch 8 at 4096 reads 8 * 3584 * 131,072 B = 3.76 GB more
    # than at 512 -> at least 3.76e9 / 2.039e12 = 1.84 ms slower
    assert by[(8, 4096)] - by[(8, 512)] >= 8 * 3584 * 131_072 / 2.039e12
    assert set(d["knee_batch"]) == {"512", "4096"}


def test_json_row_arithmetic(run_cli):
    d = _json(run_cli, "--batch", "1,16")
    for r in d["rows"]:
        assert r["tokens_per_s_total"] == pytest.approx(r["batch"] / r["step_time_s"], rel=1e-12)
        assert r["tokens_per_s_per_seq"] == pytest.approx(1 / r["step_time_s"], rel=1e-12)
        # physics floor: 15,009,849,344 B of bf16 weights at <= 2.039e12 B/s -> >= 7.36 ms
        assert r["step_time_s"] >= 15_009_849_344 / 2.039e12
    assert d["calibration"].startswith("default")


# ---------------------------------------------------------------------------------------------
# --prefill
# ---------------------------------------------------------------------------------------------


def test_prefill_rows(run_cli):
    d = _json(run_cli, "--batch", "1", "--prefill", "512,2048,8192")
    pre = d["prefill"]
    assert [p["prompt_len"] for p in pre] == [512, 2048, 8192]
    for p in pre:
        assert set(p) == PREFILL_KEYS
        # the floor a client measures: the prefill and vLLM's request overhead (45 ms)
        assert p["ttft_floor_s"] == pytest.approx(p["prefill_s"] + 0.045, rel=1e-12)
        assert p["prefill_s"] > 0
        assert p["prefill_tokens_per_s"] == pytest.approx(p["prompt_len"] / p["prefill_s"],
                                                          rel=1e-12)
        # compute floor: 2 FLOPs x 6,979,321,856 linear params per token at <= 312 TFLOP/s
        assert p["prefill_s"] >= p["prompt_len"] * 2 * 6_979_321_856 / 312e12
    t = {p["prompt_len"]: p["prefill_s"] for p in pre}
    # A100 default token budget 2048: 8192 tokens are 4 chunks, each later one attending to a
    # longer prefix, so at least 4 x the one-chunk time
    assert t[8192] >= 4 * t[2048]
    assert t[2048] > t[512]


def test_prefill_budget_option_changes_chunking(run_cli):
    small = _json(run_cli, "--batch", "1", "--prefill", "8192")["prefill"][0]["prefill_s"]
    big = _json(run_cli, "--batch", "1", "--prefill", "8192", "--max-num-batched-tokens",
                "8192")["prefill"][0]["prefill_s"]
    # one 8192-token pass reads the weights once instead of four times: faster
    assert big < small


# ---------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------


def test_table_format(run_cli):
    res = run_cli(*SPEED, "--batch", "1,8", "--prefill", "512")
    assert res.exit_code == 0 and res.stderr == ""
    out = res.stdout
    for header in ("batch", "context (tokens)", "step (ms)", "throughput (tok/s)",
                   "per sequence (tok/s)", "bound", "prompt (tokens)", "TTFT floor (ms)"):
        assert header in out, header
    assert "knee (doubling the batch adds < 15% throughput)" in out
    assert "calibration: default" in out
    assert "memory" in out


def test_csv_format(run_cli):
    res = run_cli(*SPEED, "--batch", "1,8", "--format", "csv")
    assert res.exit_code == 0 and res.stderr == ""
    rows = list(csv.reader(io.StringIO(res.stdout)))
    assert rows[0] == ["batch", "context (tokens)", "step (ms)", "throughput (tok/s)",
                       "per sequence (tok/s)", "bound"]
    body = [r for r in rows[1:] if r]
    assert [r[0] for r in body] == ["1", "8"]
    j = _json(run_cli, "--batch", "1,8")
    for r, jr in zip(body, j["rows"], strict=True):
        # step in milliseconds in the human-facing formats, seconds in JSON
        assert float(r[2]) == pytest.approx(jr["step_time_s"] * 1e3, rel=1e-9)
        assert float(r[3]) == pytest.approx(jr["tokens_per_s_total"], rel=1e-9)


def test_markdown_format(run_cli):
    res = run_cli(*SPEED, "--batch", "1,8,32", "--format", "markdown")
    assert res.exit_code == 0 and res.stderr == ""
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert all(ln.startswith("|") and ln.endswith("|") for ln in lines)
    assert len(lines) == 2 + 3  # header, rule, three rows
    assert "throughput (tok/s)" in lines[0]


def test_calibration_file_named_in_json(run_cli, tmp_path):
    f = tmp_path / "cal.yaml"
    f.write_text("gpu: a100-sxm-80gb\nparams:\n  mem_bw_frac: 0.5\n")
    d = _json(run_cli, "--batch", "1", "--calibration", str(f))
    assert str(f) in d["calibration"] and d["calibration"].startswith("measured")


# ---------------------------------------------------------------------------------------------
# Bad input: exit 2, one line
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(("--batch", "0"), "--batch", id="batch-0"),
        pytest.param(("--batch", "-1"), "--batch", id="batch-negative"),
        pytest.param(("--batch", "a,b"), "'a,b' is not a list of integers", id="batch-words"),
        pytest.param(("--batch", "1,,8"), "--batch", id="batch-empty-item"),
        pytest.param(("--batch", "1-"), "--batch", id="batch-open-range"),
        pytest.param(("--batch", "1.5"), "--batch", id="batch-float"),
        pytest.param(("--context", "0"), "--context", id="context-0"),
        pytest.param(("--context", "x"), "--context", id="context-word"),
        pytest.param(("--prefill", "0"), "--prefill", id="prefill-0"),
        pytest.param(("--format", "xml"), "--format", id="format"),
        pytest.param(("--tp", "3"), "--tp 3", id="tp-3"),
    ],
)
def test_bad_input_one_line(run_cli, args, fragment):
    assert_one_line_error(run_cli(*SPEED, *args), fragment)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  mem_bw_frac: 0.9\n  bogus: 1\n",
                     "unknown key 'params.bogus'", id="unknown-param"),
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  mem_bw_fraction: 0.9\n",
                     "did you mean 'mem_bw_frac'", id="typo-param"),
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  step_overhead_s: -0.001\n",
                     "params.step_overhead_s", id="negative-overhead"),
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  mem_bw_frac: -0.5\n",
                     "params.mem_bw_frac", id="negative-fraction"),
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  gemm_frac: 1.5\n",
                     "params.gemm_frac", id="fraction-above-1"),
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  attn_frac: .inf\n",
                     "params.attn_frac is not a finite number", id="inf"),
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  attn_frac: .nan\n",
                     "params.attn_frac is not a finite number", id="nan"),
        pytest.param("gpu: a100-sxm-80gb\nparams: {mem_bw_frac: 0.9\n",
                     "YAML", id="malformed-yaml"),
        pytest.param("- 1\n- 2\n", "a calibration file is a YAML mapping", id="not-a-mapping"),
    ],
)
def test_bad_calibration_file_one_line(run_cli, tmp_path, text, fragment):
    f = tmp_path / "cal.yaml"
    f.write_text(text)
    res = run_cli(*SPEED, "--calibration", str(f))
    assert_one_line_error(res, fragment)
    assert str(f) in res.stderr  # the message names the file


def test_missing_calibration_file_one_line(run_cli, tmp_path):
    assert_one_line_error(run_cli(*SPEED, "--calibration", str(tmp_path / "none.yaml")),
                          "none.yaml")


def test_bad_batch_subprocess_no_traceback(run_module):
    # what a user's shell sees, end to end
    res = run_module(*SPEED, "--batch", "0")
    assert res.exit_code == 2
    assert "Traceback" not in res.stderr
    assert len(res.stderr_lines) == 1 and res.stderr_lines[0].startswith("Error: ")


def test_knee_only_within_the_requested_batches(run_cli):
    """Issue 15: the knee was reported at batches the user never asked for. With batches 1-4
    the curve is still rising (memory-bound decode: doubling the batch nearly doubles the
    throughput), so no knee lies within them and none is named as if it did. (On this A100
    the search finds none up to max_num_seqs 256 either, and says what it evaluated.)"""
    res = run_cli(*SPEED, "--batch", "1,2,4")
    assert res.exit_code == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("knee"))
    assert "none within batches 1-256" in line and ": batch " not in line, line


def test_no_knee_names_the_batches_evaluated_not_the_ones_asked(run_cli):
    # Llama-3.1-8B on an H100 at context 1024: 445,152 KV tokens (vLLM 0.19, `capplan
    # memory`) / 1,024 per sequence = 434 sequences fit, so of 1-1024 only the powers of two
    # up to 256 were evaluated (and none is the knee there: decode is still memory bound).
    args = ("speed", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "1-1024")
    d = run_cli(*args, "--format", "json").json()
    assert d["max_batch"] == {"1024": 434}
    assert d["knee_batch"] == {"1024": None} and d["knee_checked_up_to"] == {"1024": 256}
    res = run_cli(*args)
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("knee"))
    assert "none within batches 1-256 (at most 434 fit)" in line, line
    assert "1-1024" not in line


def test_repeated_batches_and_contexts_are_one_row_each(run_cli):
    d = _json(run_cli, "--batch", "8,1,8,1", "--context", "512,512")
    assert [(r["batch"], r["context_len"]) for r in d["rows"]] == [(8, 512), (1, 512)]


def test_the_ttft_floor_is_what_one_client_measures(run_cli):
    """`speed`'s TTFT floor for a prompt alone equals `latency`'s TTFT with one client sending
    that prompt (SGLang, Llama-3.1-70B on 4 H200s: 130 ms of prefill and 220 ms of request
    overhead), so an SLO set from it is one the replica can meet."""
    floor = run_cli("speed", "--model", "llama-3.1-70b", "--gpu", "h200", "--tp", "4",
                    "--engine", "sglang", "--prefill", "2048", "--format", "json").json()
    one = run_cli("latency", "--model", "llama-3.1-70b", "--gpu", "h200", "--tp", "4",
                  "--engine", "sglang", "--concurrency", "1", "--input-len", "2048",
                  "--output-len", "64", "--format", "json").json()
    assert floor["prefill"][0]["ttft_floor_s"] == pytest.approx(one["ttft_s"]["mean"], rel=0.02)


def test_a_knee_below_the_asked_batches_is_named_plainly(run_cli):
    # The knee (JSON knee_batch) lies below the batches asked for: the table names it, where it
    # lies, and never says "none" beside it.
    args = ("speed", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "256,1024",
            "--context", "128")
    knee = run_cli(*args, "--format", "json").json()["knee_batch"]["128"]
    assert knee is not None and knee < 256
    line = next(ln for ln in run_cli(*args).stdout.splitlines() if ln.startswith("knee"))
    assert f"context 128: batch {knee}, below the batches asked for (256-1024)" in line, line
    assert "none" not in line
