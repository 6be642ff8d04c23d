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


def test_records_alone_count_the_requests_in_flight_at_once(tmp_path: Path) -> None:
    """Alone, the records give the most requests in flight at once. By hand from the file:
    the 89 completed requests were all in flight together (sent within 20.5 ms, the first
    ended 7.94 s later); the 11 cancelled ones carry no end time ("cancelled after 0.000
    seconds"): they end at their send and held no slot, so 89 (the run's export says 100
    clients; with it beside the file, 100 is read)."""
    shutil.copy(RECORDS, tmp_path / "profile_export.jsonl")
    (lv,) = load_results([tmp_path / "profile_export.jsonl"])
    assert lv["concurrency"] == 89 and "most requests in flight" in lv["note"]


def _fast_failures(ends: bool) -> list[str]:
    """4 completed records of the bundled file (all in flight together) and 40 failed ones
    sent 10 ms apart while they are, each ending 1 ms after its send when `ends` (newer
    AIPerf's request_end_ns), else with no end time (older AIPerf: timestamp_ns alone)."""
    rows = [json.loads(ln) for ln in RECORDS.read_text().splitlines()]
    ok = [r for r in rows if r.get("error") is None][:4]
    err = next(r for r in rows if r.get("error") is not None)
    t0 = max(r["metrics"]["min_request_timestamp"]["value"] for r in ok)
    out = [json.dumps(r) for r in ok]
    for k in range(40):
        sent = t0 + 1_000_000 + k * 10_000_000
        meta = {**err["metadata"], "timestamp_ns": sent}
        if ends:
            meta.update(request_start_ns=sent, request_end_ns=sent + 1_000_000)
        out.append(json.dumps({**err, "metadata": meta}))
    return out


@pytest.mark.parametrize("ends", [False, True])
def test_fast_failures_do_not_inflate_the_concurrency(tmp_path: Path, ends: bool) -> None:
    """Review finding 3: 4 clients and 40 requests that failed fast (a client that fails
    sends again) gave concurrency 44, every send before the first response ended counted as a
    client. By hand: the 4 completed overlap throughout; each failure is alone beside them
    for its 1 ms (or no time at all without an end time): 4 + 1 = 5, or 4."""
    (tmp_path / "profile_export.jsonl").write_text("\n".join(_fast_failures(ends)) + "\n")
    (lv,) = load_results([tmp_path / "profile_export.jsonl"])
    assert lv["errors"] == 40 and lv["completed"] == 4
    assert lv["concurrency"] == (5 if ends else 4), lv["note"]


def test_failures_that_hold_their_slot_are_counted(tmp_path: Path) -> None:
    """A failed request is in flight from its send to its own end: 3 failures that each
    last 5 s beside the 4 completed (all 7 overlap) give 7."""
    rows = _fast_failures(True)[:7]
    longer = []
    for ln in rows[4:]:
        r = json.loads(ln)
        r["metadata"]["request_end_ns"] = r["metadata"]["request_start_ns"] + 5 * 10**9
        longer.append(json.dumps(r))
    (tmp_path / "profile_export.jsonl").write_text("\n".join(rows[:4] + longer) + "\n")
    (lv,) = load_results([tmp_path / "profile_export.jsonl"])
    assert lv["concurrency"] == 7, lv["note"]


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
