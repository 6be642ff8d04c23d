"""Caps that estimate the work they bound (issue 30, defect 2), and empirical length files
read as they mean (defects of `empirical:FILE`).

Each case failed before: a run of 5,000 requests of 100,000 output tokens was admitted (the
sim_requests cap counted requests only) and ran for minutes; a Mooncake trace of long prompts
with hash_ids took 4 GiB; a 5 MB YAML was parsed whole (~130 bytes of objects a byte);
`--jobs 256` forked 256 workers on 2 cores; `empirical:` read the first column of any CSV.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from _asserts import assert_one_line_error

from capplan.plan.verify import WORKERS_PER_CORE, worker_count

VIDUR = Path(__file__).resolve().parents[1] / "data" / "traces" / "vidur_splitwise_conv_head200.csv"
SIM = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--format", "json")


def test_output_tokens_bound_the_simulation_before_it_starts(run_cli) -> None:  # noqa: ANN001
    t0 = time.process_time()  # CPU time: a loaded machine does not fail it
    r = run_cli(*SIM, "--rate", "50", "--requests", "5000", "--input-len", "500",
                "--output-len", "100000")
    # 5,000 x 100,000 = 500M output tokens > the sim_tokens cap of 100M
    assert_one_line_error(r, "500,000,000 output tokens exceeds the sim_tokens limit")
    assert time.process_time() - t0 < 5


def test_trace_prefix_blocks_are_counted_before_the_run(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    trace = tmp_path / "long.jsonl"
    # 40 prompts of 130,000 tokens, 254 hash_ids of 512 tokens each: all 130,000 tokens shared,
    # 130,000 // 16 = 8,125 blocks of 16 tokens each, 325,000 in all
    rows = [{"timestamp": 1000 * i, "input_length": 130_000, "output_length": 10,
             "hash_ids": list(range(254 * i, 254 * (i + 1)))} for i in range(40)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_cli("--limit", "prefix_blocks=300000", *SIM, "--trace", str(trace))
    assert_one_line_error(r, "325,000 prompt blocks exceeds the prefix_blocks limit")


def test_yaml_is_capped_by_what_its_parser_needs(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    big = tmp_path / "plan.yaml"
    big.write_text("x:\n" + "  - [1, 2, 3, 4, 5, 6, 7, 8]\n" * 200_000)  # 5.8 MB < file_bytes
    t0 = time.process_time()  # CPU time: a loaded machine does not fail it
    r = run_cli("plan", str(big))
    assert_one_line_error(r, "exceeds the yaml_bytes limit")
    assert time.process_time() - t0 < 5  # parsing it took 42 s and 0.76 GB


def test_workers_are_capped_by_the_cores_and_the_tasks() -> None:
    cores = len(os.sched_getaffinity(0))
    assert worker_count(256) == min(256, WORKERS_PER_CORE * cores)
    assert worker_count(256, tasks=3) == min(3, WORKERS_PER_CORE * cores)
    assert worker_count(1) == 1


def test_empirical_multi_column_file_needs_a_column(run_cli) -> None:  # noqa: ANN001
    r = run_cli(*SIM, "--rate", "1", "--requests", "10", "--input-len", "100",
                "--output-len", f"empirical:{VIDUR}")
    assert_one_line_error(r, "has 3 columns ('arrived_at', 'num_prefill_tokens', "
                             "'num_decode_tokens'): name the one to read")


def test_empirical_column_by_name_reads_that_column() -> None:
    from capplan.sim.workload import parse_length

    rows = VIDUR.read_text().splitlines()[1:]
    want = sum(int(r.split(",")[2]) for r in rows) / len(rows)  # num_decode_tokens by hand
    got = parse_length(f"empirical:{VIDUR}:num_decode_tokens").mean
    assert got == pytest.approx(want, rel=1e-12)
    assert parse_length(f"empirical:{VIDUR}:3").mean == pytest.approx(want, rel=1e-12)
    assert parse_length(f"empirical:{VIDUR}:num_prefill_tokens").mean > 3 * want


@pytest.mark.parametrize("text, says", [
    ("1e30\n", "must be >= 1 and <= 16,777,216"),
    ("root:$6$secretsecret:19000:0:99999:7:::\n", "column 1 is not a number"),
])
def test_empirical_bad_values_one_line_without_echo(run_cli, tmp_path: Path, text: str,  # noqa: ANN001
                                                    says: str) -> None:
    f = tmp_path / "lens.csv"
    f.write_text("100\n" + text)
    r = run_cli(*SIM, "--rate", "1", "--requests", "10", "--input-len", "100",
                "--output-len", f"empirical:{f}")
    assert_one_line_error(r, says)
    assert "secret" not in r.stderr
