"""An overloaded open-loop simulation says so, with served vs offered rates (issue 30).

Before: `simulate` on an overloaded deployment printed TTFT means of thousands of seconds
with no word that the queue grew through the run (`latency` said UNSTABLE)."""

from __future__ import annotations

import pytest

SIM = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--input-len", "500",
       "--output-len", "200", "--requests", "400")


def test_overloaded_run_says_served_of_offered(run_cli) -> None:  # noqa: ANN001
    r = run_cli(*SIM, "--rate", "200", "--format", "json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    # 400 Poisson arrivals at 200 req/s: the offered rate (n - 1) / span is 200 within
    # sampling, a relative sd of 1/sqrt(400) = 5%; 20% is four of them
    assert out["offered_requests_per_s"] == pytest.approx(200, rel=0.2)
    assert out["overloaded"] is True and out["requests_per_s"] < out["offered_requests_per_s"]
    assert "note: overloaded: served " in r.stderr and " req/s offered" in r.stderr


def test_stable_run_says_nothing(run_cli) -> None:  # noqa: ANN001
    r = run_cli(*SIM, "--rate", "5", "--format", "json")
    assert r.exit_code == 0 and r.json()["overloaded"] is False
    assert "overloaded" not in r.stderr


def test_engine_fallback_is_in_the_result(run_cli) -> None:  # noqa: ANN001
    """Before: a --sim-engine the run could not use was replaced, said only on stderr."""
    from capplan.sim import compiled_available

    if not compiled_available():
        pytest.skip("numba (the fast extra)")
    r = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "4",
                "--requests", "20", "--scheduler", "static", "--sim-engine", "compiled",
                "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["engine_note"] == ("--sim-engine compiled asked, reference ran: the static "
                                       "scheduler")


def test_a_thinned_time_series_still_shows_the_backlog() -> None:
    """`simulate --rate 500 --requests 2000 --input-len 2000 --output-len 500` served 8.3 of
    494 req/s and said nothing: its 200-sample time series had samples at 0.001 s (0 waiting)
    and 4.36 s (1,885 waiting) around the last arrival at 4.05 s, and the check read the one
    before. No request arrives after the last arrival, so the first sample after it bounds the
    queue there from below. The samples here are those of that run."""
    import numpy as np

    from capplan.plan.simulation import mark_overload

    arrivals = np.linspace(0.0, 4.05, 2000)
    res = {"requests_per_s": 8.3,
           "time_series": {"time_s": [0.00136, 4.363, 8.49], "waiting": [0, 1885, 1794]}}
    note = mark_overload(res, arrivals)
    assert res["overloaded"] is True
    assert note is not None and note.startswith("overloaded: served 8.3 of 494 req/s offered")
