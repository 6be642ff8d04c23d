"""Windows from traces and rate curves, against hand calculations."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.errors import InputError
from capplan.plan.day import replicas_for
from capplan.plan.rate_curve import (
    DAY_S,
    parse_rate_curve,
    series_from_curve,
    series_from_trace,
    warp_trace,
)
from capplan.plan.startup import startup_lag
from capplan.sim.workload import Requests, load_trace
from tests.day.conftest import AZURE_HEAD


def _reqs(t) -> Requests:
    t = np.asarray(t, float)
    n = len(t)
    return Requests(t, np.full(n, 100), np.full(n, 10), np.zeros(n, np.int64))


def test_triangle_curve_window_means_by_hand():
    # 0 req/s at 00:00 rising to 12 req/s at 12:00 and back to 0 at 24:00 (wrap): the first
    # hour's mean is (0 + 1) / 2 = 0.5 req/s, the hour 11:00-12:00 (11 + 12) / 2 = 11.5
    c = parse_rate_curve([{"at": "00:00", "rate_per_s": 0}, {"at": "12:00", "rate_per_s": 12}])
    s = series_from_curve(c, mean_output_tokens=100, window_s=3600)
    assert len(s) == 24
    assert s.offered_rps[0] == pytest.approx(0.5)
    assert s.offered_rps[11] == pytest.approx(11.5)
    assert s.offered_rps[12] == pytest.approx(11.5)
    # output tokens: 0.5 req/s * 3600 s * 100 tokens
    assert s.output_tokens[0] == pytest.approx(180_000)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1440), st.floats(0, 50)), min_size=1, max_size=8,
                unique_by=lambda p: p[0]),
       st.sampled_from([300.0, 900.0, 3600.0]))
def test_windows_hold_the_curves_requests(points, window_s):
    """Invariant: the windows' requests add up to the curve's integral over the day."""
    pts = [{"at": f"{m // 60:02d}:{m % 60:02d}", "rate_per_s": r} for m, r in points]
    if not any(r > 0 for _, r in points):
        with pytest.raises(InputError):
            parse_rate_curve(pts)
        return
    c = parse_rate_curve(pts)
    s = series_from_curve(c, 1.0, window_s)
    total = float((s.offered_rps * (s.end_s - s.start_s)).sum())
    assert total == pytest.approx(float(c.cumulative(np.array([DAY_S]))[0]), rel=1e-9)
    assert s.offered_rps.max() <= max(r for _, r in points) + 1e-9


def test_curve_closed_at_24_00_by_hand():
    # 1 req/s at 00:00, 3 at 12:00, 2 at 24:00: the day runs from 00:00 to 24:00 without
    # wrapping (a step from 2 back to 1 at midnight). Day integral by the trapezoid rule:
    # (1 + 3) / 2 * 43,200 s + (3 + 2) / 2 * 43,200 s = 86,400 + 108,000 = 194,400 requests.
    c = parse_rate_curve([{"at": "00:00", "rate_per_s": 1}, {"at": "12:00", "rate_per_s": 3},
                          {"at": "24:00", "rate_per_s": 2}])
    assert c.cumulative(np.array([DAY_S]))[0] == pytest.approx(194_400)
    s = series_from_curve(c, mean_output_tokens=1.0, window_s=3600)
    # first hour: 1 -> 1 + 2/12 req/s, mean 13/12; last hour: 2 + 1/12 -> 2, mean 49/24
    assert s.offered_rps[0] == pytest.approx(13 / 12)
    assert s.offered_rps[-1] == pytest.approx(49 / 24)
    # 24:00 alone is 00:00 of a wrapping curve: the same curve as one given at 00:00
    a = parse_rate_curve([{"at": "24:00", "rate_per_s": 4}, {"at": "12:00", "rate_per_s": 1}])
    b = parse_rate_curve([{"at": "00:00", "rate_per_s": 4}, {"at": "12:00", "rate_per_s": 1}])
    grid = np.linspace(0, DAY_S, 97)
    assert np.allclose(a.cumulative(grid), b.cumulative(grid))


def test_curve_through_24_00_plans_in_the_cli_and_api(run_cli, tmp_path):
    import capplan

    curve = tmp_path / "c.csv"
    curve.write_text("at,rate_per_s\n00:00,1\n24:00,2\n")
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1",
                  "--rate-curve", str(curve), "--input-len", "500", "--output-len", "100",
                  "--ttft-p99", "1", "--replay", "none", "--verify-top", "0", "--window", "1h",
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    sched = json.loads(res.stdout)["schedule"]
    # the rate climbs from 1 to 2 over the day: the last hour's mean (2 - 1/48) is the peak
    assert sched[-1]["offered_rps"] == pytest.approx(2 - 1 / 48)
    day = capplan.recommend("llama-3.1-8b", gpus=["h100-sxm"], ttft_p99_s=1.0, verify=False,
                            input_len=500, output_len=100, day={"replay": "none"},
                            rate_curve=[{"at": "00:00", "rate_per_s": 1},
                                        {"at": "24:00", "rate_per_s": 2}])
    assert len(day.windows) == 96


def test_rate_curve_csv(tmp_path):
    p = tmp_path / "curve.csv"
    p.write_text("at,rate_per_s\n00:00,2\n06:00,2\n")
    s = series_from_curve(parse_rate_curve(str(p)), 10.0)
    assert len(s) == 96 and np.allclose(s.offered_rps, 2.0)


def test_a_number_is_no_time_of_day():
    """`at: 900` (an unquoted YAML or JSON number) is refused, not read as 900 s after midnight
    (00:15), as a CSV's 900 is; the text "00:15" is 900 s."""
    with pytest.raises(InputError, match=r"rate_curve\[1\]: at 900 is not a time of day: "
                                         r"write it as HH:MM"):
        parse_rate_curve([{"at": "00:00", "rate_per_s": 1}, {"at": 900, "rate_per_s": 2}])
    assert list(parse_rate_curve([{"at": "00:15", "rate_per_s": 2}]).at_s) == [900.0]


@pytest.mark.parametrize("points, msg", [
    ([{"at": "25:00", "rate_per_s": 1}], "time of day"),
    ([{"at": "10:00", "rate_per_s": 1}, {"at": "10:00", "rate_per_s": 2}], "same time"),
    ([{"at": "10:00", "rate_per_s": -1}], "rate_per_s"),
    ([{"at": "10:00"}], "rate_per_s"),
    ([{"at": "10:00", "rate_per_s": 1, "rps": 2}], "unknown key"),
    ([], "at least one point"),
])
def test_bad_curves(points, msg):
    with pytest.raises(InputError, match=msg):
        parse_rate_curve(points)


def test_trace_windows_by_hand():
    # 3 arrivals in the first minute, the last at 95 s: the second window ends at the last
    # arrival and is over half a window long (35 s of 60), so it keeps its own count over its
    # own length. A window counts the arrivals after its start up to its end: the one at 0
    # opens the trace's clock, so 60-s windows give 2/60 (10 and 20 s) and 1/35 (95 s); the
    # first request's tokens count in the first window
    s = series_from_trace(_reqs([0.0, 10.0, 20.0, 95.0]), window_s=60)
    assert list(s.offered_rps) == pytest.approx([2 / 60, 1 / 35])
    assert list(s.end_s) == [60.0, 95.0]
    assert list(s.output_tokens) == [30, 10]


def test_a_short_tail_joins_the_window_before():
    # the last arrival 10 s into the second minute (under half a window): one window of 70 s,
    # 4 requests, 3 gaps: 3/70 req/s (as its own window it read 1/10, the day's "peak")
    s = series_from_trace(_reqs([0.0, 10.0, 20.0, 70.0]), window_s=60)
    assert list(s.offered_rps) == pytest.approx([3 / 70])
    assert list(s.end_s) == [70.0]
    assert list(s.output_tokens) == [40]


def test_one_request_past_a_day_is_not_the_peak():
    # 0.1 req/s for a day (every 10 s, 8,640 requests) and one request 0.5 s past 24:00: the
    # 15-minute windows (start, end] stay at 90 / 900 = 0.1 req/s (the first: 10 s to 900 s),
    # the last one (85,500 s, 86,400.5 s]: 89 + 1 requests over 900.5 s
    t = np.concatenate([np.arange(0.0, DAY_S, 10.0), [DAY_S + 0.5]])
    s = series_from_trace(_reqs(t), window_s=900)
    assert len(s) == 96 and s.end_s[-1] == DAY_S + 0.5
    assert s.offered_rps[:-1] == pytest.approx(0.1)
    assert s.offered_rps[-1] == pytest.approx(90 / 900.5)
    assert s.offered_rps.max() < 0.102  # (it read 1 req/s: one request over 1 s)


def test_windows_add_up_to_the_traces_one_rate(tmp_path):
    """One rate for one trace: the note load_trace writes, the trace's rate (n - 1 gaps over
    the span) and the day planner's windows (their counts over their lengths, weighted by
    length) agree. 5 requests at 0, 10, 30, 60 and 80 s: 4 gaps over 80 s = 0.05 req/s;
    60-s windows: (0, 60] holds 10, 30 and 60 s (3/60), the 20-s tail (60, 80] is under half
    a window and joins it: 4 requests over 80 s."""
    from capplan.sim.workload import arrival_rate, replayable_rate

    t = [0.0, 10.0, 30.0, 60.0, 80.0]
    f = tmp_path / "t.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                 + "".join(f"{x},100,10\n" for x in t))
    reqs = load_trace(f)
    assert "5 requests over 80 s (4 gaps), 0.05 req/s" in reqs.note
    assert arrival_rate(5, 80.0) == replayable_rate(reqs.arrival_at_s, "t") == 4 / 80
    s = series_from_trace(reqs, window_s=60)
    assert list(s.offered_rps) == pytest.approx([4 / 80])
    s = series_from_trace(_reqs([0.0, 10.0, 30.0, 60.0, 95.0]), window_s=60)
    # 3 arrivals in (0, 60], 1 in (60, 95]: 4 over 95 s, the trace's 4 gaps over 95 s
    assert list(s.offered_rps) == pytest.approx([3 / 60, 1 / 35])
    assert np.average(s.offered_rps, weights=s.end_s - s.start_s) == pytest.approx(4 / 95)


def test_dispersion_poisson_one_regular_zero():
    rng = np.random.default_rng(1)
    poisson = np.cumsum(rng.exponential(1 / 5.0, 20_000))  # 5 req/s for ~4000 s
    s = series_from_trace(_reqs(poisson), window_s=900)
    assert s.dispersion[:3] == pytest.approx(1.0, abs=0.3)
    regular = series_from_trace(_reqs(np.arange(0, 1800, 0.2)), window_s=900)
    assert regular.dispersion[0] < 0.05


def test_warp_follows_the_curve():
    c = parse_rate_curve([{"at": "04:00", "rate_per_s": 0.1}, {"at": "15:00", "rate_per_s": 1}])
    day = warp_trace(load_trace(AZURE_HEAD), c)
    s = series_from_trace(day, 3600)
    want = series_from_curve(c, 1.0, 3600)
    assert len(s) == 24
    # each hour's count within 10% of the curve's (the real excerpt's bursts remain)
    assert np.allclose(s.offered_rps, want.offered_rps, rtol=0.10)


def test_replicas_rule_by_hand():
    # 10 req/s * 1.2 / 3 req/s per replica = 4 replicas; 0 req/s keeps the minimum
    assert list(replicas_for(np.array([10.0, 0.0, 2.5]), 3.0, 0.2, 1)) == [4, 1, 1]
    assert list(replicas_for(np.array([0.0]), 3.0, 0.2, 0)) == [0]


def test_startup_lag_by_hand():
    # 16.06 GB of bf16 Llama-3.1-8B from NVMe at 6.9 GB/s = 2.33 s, plus 60 s of start-up
    lag = startup_lag(16.06e9, "nvme")
    assert lag.total_s == pytest.approx(16.06 / 6.9 + 60)
    assert startup_lag(16.06e9, "network").load_s == pytest.approx(16.06 / 1.25)
    assert startup_lag(16.06e9, load_gb_per_s=2.0, engine_startup_s=0).total_s == \
        pytest.approx(8.03)
    with pytest.raises(InputError):
        startup_lag(1e9, "tape")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1e4), min_size=1, max_size=50), st.floats(0.01, 1e3),
       st.floats(0, 2), st.integers(0, 3))
def test_replicas_cover_the_load_and_grow_with_it(rates, cap, headroom, floor):
    r = np.asarray(rates)
    reps = replicas_for(r, cap, headroom, floor)
    # enough capacity (to the rule's 1e-9 rounding guard), and any traffic has a replica
    assert (reps * cap >= r * (1 + headroom) - 1e-9 * cap).all()
    assert (reps >= floor).all() and (reps[r > 0] >= 1).all()
    # one replica fewer would not be enough (unless the floor holds it)
    assert ((reps - 1) * cap < r * (1 + headroom) * (1 + 1e-6) + 1e-9)[reps > floor].all()
    order = np.argsort(r)
    assert (np.diff(reps[order]) >= 0).all()  # monotone in the offered rate


def test_api_recommend_day():
    import capplan
    from capplan.plan.day import DayPlan

    res = capplan.recommend("llama-3.1-70b", gpus=["h100-sxm"], ttft_p99_s=1.0, verify=False,
                            input_len=1000, output_len=250,
                            rate_curve=[{"at": "04:00", "rate_per_s": 2},
                                        {"at": "16:00", "rate_per_s": 20}],
                            day={"window_s": 3600, "replay": "none"})
    assert isinstance(res, DayPlan) and len(res.windows) == 24
    assert res.gpu_hours < res.fixed_fleet_gpu_hours
    with pytest.raises(InputError, match="exactly one"):
        capplan.recommend("llama-3.1-70b", rate=1, trace="x.csv")


def test_gap_scv_by_hand_and_under_stretching():
    # gaps 1, 3, 1, 3 s: mean 2, variance 1, SCV 1 / 4
    s = series_from_trace(_reqs([0.0, 1.0, 4.0, 5.0, 8.0]), window_s=60)
    assert s.arrival_scv[0] == pytest.approx(0.25)
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(0.2, 5000))
    a = series_from_trace(_reqs(t), 3600).arrival_scv[0]
    b = series_from_trace(_reqs(4 * t), 4 * 3600).arrival_scv[0]
    assert a == pytest.approx(1.0, abs=0.1) and b == pytest.approx(a)


def test_a_curve_repeats_beside_a_two_day_trace():
    from capplan.plan.day import LaneDay, combine

    t = np.arange(0.0, 2 * DAY_S, 10.0)  # 0.1 req/s for two days
    trace = LaneDay("t", series_from_trace(_reqs(t), 3600), _reqs(t))
    curve = LaneDay("c", series_from_curve(parse_rate_curve([{"at": "00:00",
                                                              "rate_per_s": 2}]), 1.0, 3600))
    total = combine([trace, curve])
    assert len(total) == 48
    assert total.offered_rps[:47] == pytest.approx(2.1)  # the last window ends at 172790 s


def test_recommend_trace_with_one_request_past_the_day(run_cli, tmp_path):
    """A day of 0.2 req/s (every 5 s; 1,000 / 200 tokens) for Llama-3.1-70B on H100 TP 2 (one
    replica carries ~0.32 req/s within TBT 50 ms) and one request 0.5 s past 24 h. That
    request made a window of its own at 1 req/s, the plan's peak: 4 replicas, and a fixed
    fleet 4x the day's. Now it joins the last window: 96 windows, one replica each
    (0.2 x 1.2 / 0.32 = 0.75)."""
    t = np.concatenate([np.arange(0.0, DAY_S, 5.0), [DAY_S + 0.5]])
    path = tmp_path / "day.csv"
    path.write_text("arrival_time_s,input_tokens,output_tokens\n"
                    + "".join(f"{x:.3f},1000,200\n" for x in t))
    res = run_cli("recommend", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "2",
                  "--trace", str(path), "--ttft-p99", "1", "--tbt-p99", "50ms",
                  "--replay", "none", "--verify-top", "0", "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert len(d["schedule"]) == 96
    assert d["schedule"][-1]["end_s"] == pytest.approx(DAY_S + 0.5)
    assert d["peak_replicas"] == 1
    assert d["day"]["peak"]["rate_per_s"] == pytest.approx(0.2, rel=0.01)
