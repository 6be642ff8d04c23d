"""Results files read as they mean (issue 30): AIPerf per-request records are read, and files of
different served models are not fitted as one law.

Before: `calibrate --from-results profile_export.jsonl` (one record a request, AIPerf's own
per-request export) was refused as "not a result file"; `--from-results A B` fitted one law
across files of different models.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from capplan.probe.results import load_results

DATA = Path(__file__).resolve().parents[1] / "data" / "results"
RECORDS = DATA / "aiperf_gpt-oss-20b_c100_profile_export.jsonl"
AGGREGATE = DATA / "aiperf_gpt-oss-20b_c100_profile_export_aiperf.json"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """The two files of the run under the names AIPerf gives them."""
    shutil.copy(RECORDS, tmp_path / "profile_export.jsonl")
    shutil.copy(AGGREGATE, tmp_path / "profile_export_aiperf.json")
    return tmp_path


def test_records_give_aiperfs_own_aggregates(run_dir: Path) -> None:
    """The statistics recomputed from the 89 completed records equal the ones AIPerf wrote for
    the same run in profile_export_aiperf.json (an independent computation)."""
    (lv,) = load_results([run_dir / "profile_export.jsonl"])
    agg = json.loads(AGGREGATE.read_text())["records"]
    ms = 1e-3
    assert lv["concurrency"] == 100  # input_config.loadgen.concurrency of the run
    assert lv["completed"] == agg["request_count"]["avg"] == 89
    assert lv["errors"] == agg["error_request_count"]["avg"] == 11
    assert lv["first_error"].startswith("RequestCancellationError: Request was cancelled")
    for mine, theirs in (("ttft_s", "ttft"), ("tbt_s", "inter_chunk_latency"),
                         ("e2e_s", "request_latency"), ("tpot_s", "inter_token_latency")):
        assert lv[mine]["mean"] == pytest.approx(agg[theirs]["avg"] * ms, rel=1e-9), mine
        for q in ("p50", "p90", "p99"):
            assert lv[mine][q] == pytest.approx(agg[theirs][q] * ms, rel=1e-9), (mine, q)
    assert lv["requests_per_s"] == pytest.approx(agg["request_throughput"]["avg"], rel=1e-6)


def test_records_alone_count_the_cancelled_requests_of_the_opening(tmp_path: Path) -> None:
    """Audit defect 16: alone, the records gave concurrency 89 (the completed requests in
    flight at once) where the run's own export says 100. By hand from the file: all 100
    records (89 completed, 11 cancelled) were sent within 20.5 ms of the first (metadata
    timestamp_ns), and the first response ended 7.94 s after it: 100 clients' first requests."""
    shutil.copy(RECORDS, tmp_path / "profile_export.jsonl")
    (lv,) = load_results([tmp_path / "profile_export.jsonl"])
    assert lv["concurrency"] == 100 and "cancelled and failed ones included" in lv["note"]


def test_records_of_a_loop_past_its_opening_take_the_most_in_flight(tmp_path: Path) -> None:
    """Without cancellations before the first response, the most completed requests in flight
    at once: drop the 11 cancelled records, and 89 remain, all in flight together."""
    rows = [ln for ln in RECORDS.read_text().splitlines()
            if json.loads(ln).get("error") is None]
    (tmp_path / "profile_export.jsonl").write_text("\n".join(rows) + "\n")
    (lv,) = load_results([tmp_path / "profile_export.jsonl"])
    assert lv["concurrency"] == 89 and "most requests in flight" in lv["note"]


def test_files_of_different_models_are_refused(run_cli) -> None:  # noqa: ANN001
    r = run_cli("calibrate", "--from-results", str(AGGREGATE),
                str(DATA / "vllm_bench_serve_opt-125m_c2_run0.json"))
    assert r.exit_code == 2 and len(r.stderr_lines) == 1, r.stderr
    assert "results files of different models" in r.stderr
    assert "openai/gpt-oss-20b" in r.stderr and "facebook/opt-125m" in r.stderr


def test_per_request_latencies_out_of_range_are_one_line(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    """Found by the fuzz suite: gaps of 1e308 s overflowed the mean to an internal error."""
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"max_concurrency": 1, "completed": 1, "duration": 1,
                             "ttfts": [1], "itls": [[1e308, 1e308]]}))
    r = run_cli("calibrate", "--from-results", str(p))
    assert r.exit_code == 2 and len(r.stderr_lines) == 1, r.stderr
    assert "itls holds 1e+308; a latency is a number of seconds in [0, 86,400]" in r.stderr
