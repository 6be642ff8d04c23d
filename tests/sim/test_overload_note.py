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


def test_a_steady_queue_is_not_overloaded() -> None:
    """Arrivals every second over 0..10 s, each first token 0.5 s later: over the second half
    (5, 10] arrive 6..10 (5) and first tokens come at 5.5..9.5 (5), so the backlog grew by 0.
    Tolerance by hand: m = 1 req/s x 0.5 s = 0.5, taken as 1; the gaps are even (cv2 0, taken
    as 1): 3 sqrt(2 x 1 x 1) + 1 = 5.243."""
    import numpy as np

    from capplan.sim.stability import arrival_window, backlog_grows

    arr = np.arange(11.0)
    win = arrival_window(arr, arr + 0.5, arr + 2.0)
    assert (win["start_s"], win["end_s"], win["arrived"], win["first_tokens"]) == (5, 10, 5, 5)
    assert win["backlog_growth"] == 0
    assert win["tolerance"] == pytest.approx(3 * 2**0.5 + 1)
    assert not backlog_grows(win)


def test_a_queue_served_at_half_the_offered_rate_is_overloaded() -> None:
    """Arrivals every second over 0..200 s, request i's first token at 2i s (served at 0.5
    req/s), finished 1 s later. Second half (100, 200]: 100 arrivals, first tokens of i = 51..100
    (50), completions 2i + 1 in it for i = 50..99 (50): the backlog grew by 50, 0.5 of 1 req/s
    served. The half's TTFTs (i for i = 101..200) exceed the 100 s half, so m = 1 x 100:
    tolerance 3 sqrt(200) + 1 = 43.43 < 50."""
    import numpy as np

    from capplan.sim.stability import arrival_window, backlog_grows

    arr = np.arange(201.0)
    win = arrival_window(arr, 2 * arr, 2 * arr + 1)
    assert (win["arrived"], win["first_tokens"], win["completed"]) == (100, 50, 50)
    assert win["served_requests_per_s"] == pytest.approx(0.5)
    assert win["offered_requests_per_s"] == pytest.approx(1.0)
    assert win["tolerance"] == pytest.approx(3 * 200**0.5 + 1)
    assert backlog_grows(win)


def test_a_bursty_queue_that_never_drains_in_its_window_is_overloaded() -> None:
    """Bursty arrivals (cv2 9 at even gaps, by hand below) whose first tokens wait longer than
    the half window: the Poisson tolerance of the backlog test reaches every arrival of the half
    (no growth can exceed it), so the capped rule decides. Arrivals: bursts of 10 at once every
    10 s over 0..200 s (201 requests: 21 bursts, the last of 1); served one every 2 s from t = 0
    in arrival order: request i's first token at 2i s. Second half (100, 200]: arrivals of the
    bursts at 110..200, 91; first tokens of requests 51..100 (2i in (100, 200]): 50; growth 41.
    Mean TTFT of the half's arrivals (requests 110..200, TTFT 2i - a_i > 100 s) exceeds the
    100 s half: capped; capped tolerance 3 sqrt(91) + 1 = 29.6 < 41, while the Poisson one,
    3 sqrt(2 cv2 91) + 1 with m taken as all 91 arrivals and the bursts' gap cv2 (about 9), is
    above the 91 arrivals."""
    import numpy as np

    from capplan.sim.stability import arrival_window, backlog_grows

    arr = np.repeat(np.arange(0.0, 201.0, 10.0), 10)[:201]
    first = 2.0 * np.arange(201.0)
    win = arrival_window(arr, first, first + 1.0)
    assert (win["arrived"], win["first_tokens"], win["backlog_growth"]) == (91, 50, 41)
    assert win["delay_capped"]
    assert win["tolerance"] > win["arrived"]  # the Poisson rule alone could never flag it
    assert win["capped_tolerance"] == pytest.approx(3 * 91**0.5 + 1)
    assert backlog_grows(win)


def test_a_trace_whose_queue_never_drains_is_unstable(run_cli) -> None:  # noqa: ANN001
    """The head of Mooncake's conversation trace on one H100: 200 requests over 72 s (2.76
    req/s offered) against a replica serving about 1.56 req/s: latency says UNSTABLE."""
    res = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace",
                  "tests/data/traces/mooncake_conversation_trace_head200.jsonl")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("UNSTABLE"), res.stdout[:300]


KV_BOUND = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--input-len", "8000",
            "--output-len", "256", "--max-num-seqs", "256", "--max-num-batched-tokens", "2048")


def test_a_kv_bound_replica_that_falls_behind_is_overloaded(run_cli) -> None:  # noqa: ANN001
    """Before: 4 req/s of 8,000-token prompts served 3.54 req/s, the running batch pinned at 55
    by the KV cache and the waiting queue growing 6 -> 183 through the run, never over a tenth
    of the 2,000 requests: `overloaded: false`. The backlog test reads the growth itself."""
    r = run_cli("simulate", *KV_BOUND, "--rate", "4", "--requests", "2000", "--format", "json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    win = out["arrival_window"]
    assert out["overloaded"] is True and win["backlog_growth"] > win["tolerance"]
    assert win["served_requests_per_s"] < win["offered_requests_per_s"]
    assert "note: overloaded: served " in r.stderr


def test_latency_reports_the_kv_bound_replay_unstable(run_cli) -> None:  # noqa: ANN001
    """Before: `latency` screened 4 req/s stable (analytic capacity 4.17) and printed TTFT
    p50/p99 of 24.8 / 53.5 s from a replay whose queue grew through the run."""
    r = run_cli("latency", *KV_BOUND, "--rate", "4", "--format", "json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert out["stable"] is False and out["ttft_s"] is None and out["requests_per_s"] is None
    assert out["answered_by"] == "replay"
    assert out["capacity_requests_per_s"] < out["offered_requests_per_s"]
    table = run_cli("latency", *KV_BOUND, "--rate", "4")
    assert table.stdout.startswith("UNSTABLE: the replay's queue grows at ")


def test_a_stable_kv_bound_rate_stays_stable(run_cli) -> None:  # noqa: ANN001
    """3 req/s of the same load (75% of the 4 that fell behind): the replay keeps up (served
    2.95 of 2.96 req/s over the run), so `latency` answers with figures."""
    r = run_cli("latency", *KV_BOUND, "--rate", "3", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["stable"] is True and r.json()["ttft_s"] is not None


FLEET = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "80",
         "--requests", "1500", "--input-len", "1024", "--output-len", "128", "--shared-prefix",
         "512", "--replicas", "2", "--format", "json")


def test_a_fleet_flags_the_replica_its_router_overloads(run_cli) -> None:  # noqa: ANN001
    """Before: a fleet result kept no time series, so it was never overloaded; prefix-affinity
    sent every request of the one shared prefix to replica 0 (served ~50 of 80 req/s) and the
    run said nothing. Now each replica has its own backlog test and the routing is named."""
    r = run_cli(*FLEET, "--router", "prefix-affinity")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert out["overloaded"] is True
    assert [(p["requests"], p["overloaded"]) for p in out["per_replica"]] == [(1500, True),
                                                                              (0, False)]
    assert "note: replica 0 overloaded: served " in r.stderr
    # 1500 of 1500 requests on replica 0: 100%, an even share of two replicas 50%
    assert ("note: uneven routing: the prefix-affinity router sent 100% of the requests to "
            "replica 0 (an even share is 50%)") in r.stderr


def test_the_same_load_split_evenly_is_stable(run_cli) -> None:  # noqa: ANN001
    """Round-robin gives each replica 750 requests, 40 req/s: within what one serves."""
    r = run_cli(*FLEET, "--router", "round-robin")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert out["overloaded"] is False
    assert [p["overloaded"] for p in out["per_replica"]] == [False, False]
    assert "overloaded" not in r.stderr and "uneven" not in r.stderr


def test_a_bursty_stable_run_near_capacity_is_not_flagged(run_cli) -> None:  # noqa: ANN001
    """Gamma arrivals at burstiness 0.25 (cv2 4) at 23 req/s, 92% of the analytic capacity
    (24.9): every TTFT under 0.6 s, yet at the end of the arrivals a burst had 18 requests
    waiting more than at the half, over the Poisson-count tolerance of 16.9. Near capacity and
    under bursts the number waiting wanders for many TTFTs; the tolerance takes its measured
    spread about the trend (a growing backlog's ramp stays the signal: rate 27 still flags)."""
    args = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--burstiness",
            "0.25", "--seed", "2", "--input-len", "lognormal:mean=1024,p99=4000",
            "--output-len", "lognormal:mean=256,p99=1000", "--requests", "4000",
            "--format", "json")
    d = run_cli(*args, "--rate", "23").json()
    assert d["ttft_s"]["p99"] < 1.0 and d["arrival_window"]["backlog_growth"] > 16.9
    assert not d["overloaded"]
    assert run_cli(*args, "--rate", "27").json()["overloaded"]
