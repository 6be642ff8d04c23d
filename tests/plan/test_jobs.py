"""`--jobs N` (issue 17): verification simulations in parallel give the serial answer."""

from __future__ import annotations

import pytest

from capplan.plan.verify import PARALLEL_MIN_REQUESTS, ParallelVerifier

REC = ("recommend", "--model", "llama-3.1-8b", "--rate", "30", "--gpu", "h100-sxm",
       "--gpu", "a100-sxm-80gb", "--tp", "1", "--ttft-p99", "1", "--tbt-p99", "0.06",
       "--verify-top", "3", "--format", "json")


def test_parallel_recommend_equals_serial(run_cli, monkeypatch):
    calls = []
    real_map = ParallelVerifier.map

    def spy(self, jobs):  # noqa: ANN001, ANN202
        calls.append(sum(j.requests for j in jobs))
        return real_map(self, jobs)

    monkeypatch.setattr(ParallelVerifier, "map", spy)
    serial = run_cli(*REC, "--jobs", "1")
    parallel = run_cli(*REC, "--jobs", "2")
    assert serial.exit_code == parallel.exit_code == 0, parallel.stderr
    # the parallel run really used worker processes (enough requests to verify)
    assert calls and calls[0] >= PARALLEL_MIN_REQUESTS
    a, b = serial.json(), parallel.json()
    assert [r.get("verified") for r in a["recommendations"]] == \
        [r.get("verified") for r in b["recommendations"]]
    assert a == b


@pytest.mark.parametrize("bad", ["0", "x"])
def test_jobs_rejects_bad_values(run_cli, bad):
    res = run_cli(*REC, "--jobs", bad)
    assert res.exit_code == 2 and len(res.stderr_lines) == 1
