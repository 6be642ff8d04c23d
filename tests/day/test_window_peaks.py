"""A rate curve's window is sized for the highest rate the curve reaches inside it, and the
replay's arrivals follow the curve's shape inside the window (a non-homogeneous Poisson
process), so a spike or a ramp inside a window is seen by both."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.plan.rate_curve import (
    DAY_S,
    curve_arrivals,
    parse_rate_curve,
    series_from_curve,
    window_peaks,
)

HOUR = 3600.0
# 10 req/s all day, rising to 60 between 11:59 and 12:00, 60 until 12:05, back to 10 at 12:06
SPIKE = [{"at": "00:00", "rate_per_s": 10}, {"at": "11:59", "rate_per_s": 10},
         {"at": "12:00", "rate_per_s": 60}, {"at": "12:05", "rate_per_s": 60},
         {"at": "12:06", "rate_per_s": 10}]



def chat_day_plan(curve: str, headroom: float) -> dict:
    """A plan of one chat lane over the rate curve file `curve` (800 / 250-token lognormal
    requests, TTFT p99 1 s, TBT p99 60 ms) on Llama-3.1-8B, one H100, the peak replayed."""
    return {"version": 1, "model": "meta-llama/Llama-3.1-8B-Instruct",
            "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
            "engine": {"max_num_seqs": [128], "max_num_batched_tokens": [2048]},
            "workloads": [{"name": "chat", "rate_curve": curve,
                           "input_len": "lognormal:mean=800,p99=4000",
                           "output_len": "lognormal:mean=250,p99=1000",
                           "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": "60ms"}}],
            "headroom": headroom, "day": {"window_s": 900, "replay": "peak"},
            "verify": {"top": 0}}

def test_spike_windows_by_hand():
    s = series_from_curve(parse_rate_curve(SPIKE), 1.0, 900)
    k = int(11.75 * 4)  # the window 11:45-12:00
    # 11:45-12:00: 14 min at 10 req/s and the 11:59-12:00 ramp (mean 35):
    # (14 * 60 * 10 + 60 * 35) / 900 = 11.667 req/s; it reaches 60 at its end (12:00)
    assert s.offered_rps[k] == pytest.approx((14 * 60 * 10 + 60 * 35) / 900)
    assert s.sizing_rps[k] == pytest.approx(60.0)
    # 12:00-12:15: 5 min at 60, the 12:05-12:06 ramp (mean 35), 9 min at 10:
    # (300 * 60 + 60 * 35 + 540 * 10) / 900 = 28.33 req/s; it peaks at 60
    assert s.offered_rps[k + 1] == pytest.approx((300 * 60 + 60 * 35 + 540 * 10) / 900)
    assert s.sizing_rps[k + 1] == pytest.approx(60.0)
    # the windows either side never leave 10 req/s
    assert s.sizing_rps[k - 1] == pytest.approx(10.0)
    assert s.sizing_rps[k + 2] == pytest.approx(10.0)


def test_a_closed_curves_last_window_peaks_at_its_24_00_rate():
    # 1 req/s at 00:00, 3 at 24:00 (a step back to 1 at midnight): the last hour, 23:00-24:00,
    # rises from 1 + 2 * 23/24 to 3 and peaks at 3 just before midnight; the first at 1 + 2/24
    c = parse_rate_curve([{"at": "00:00", "rate_per_s": 1}, {"at": "24:00", "rate_per_s": 3}])
    s = series_from_curve(c, 1.0, HOUR)
    assert s.sizing_rps[-1] == pytest.approx(3.0)
    assert s.sizing_rps[0] == pytest.approx(1 + 2 / 24)
    # over two days the midnight step is inside no window (it is an edge): the day-2 first
    # window peaks at its end again, 1 + 2/24
    peak, at, _ = window_peaks([c], np.array([DAY_S - HOUR, DAY_S]),
                               np.array([DAY_S, DAY_S + HOUR]))
    assert peak.tolist() == pytest.approx([3.0, 1 + 2 / 24])
    assert at.tolist() == [DAY_S, DAY_S + HOUR]


def test_two_curves_peak_together_where_their_sum_does():
    # a: 0 at 00:00 -> 12 at 01:00 -> 0 at 02:00 (wraps to 0 at 24:00); b: 6 flat.
    # Window 00:00-02:00: the sum peaks at 01:00, 18 req/s, a = 12 and b = 6 there.
    a = parse_rate_curve([{"at": "00:00", "rate_per_s": 0}, {"at": "01:00", "rate_per_s": 12},
                          {"at": "02:00", "rate_per_s": 0}])
    b = parse_rate_curve([{"at": "00:00", "rate_per_s": 6}])
    peak, at, rates = window_peaks([a, b], np.array([0.0]), np.array([2 * HOUR]),
                                   base_rps=np.array([0.5]))
    assert peak[0] == pytest.approx(18.5) and at[0] == HOUR
    assert rates[:, 0].tolist() == pytest.approx([12.0, 6.0])


_points = st.lists(st.tuples(st.integers(0, 1439), st.floats(0, 50)), min_size=1, max_size=8,
                   unique_by=lambda p: p[0]).filter(lambda ps: any(r >= 1e-3 for _, r in ps))


@settings(max_examples=40, deadline=None)
@given(_points, st.sampled_from([300.0, 900.0, 3600.0, 86_400.0]))
def test_sizing_rate_is_the_windows_highest(points, window_s):
    """Invariants: a window's sizing rate is at least its mean and equals the curve's highest
    rate inside it, found here on a 1-second grid (every point of these curves is on a whole
    minute, so the grid holds each point and each window edge)."""
    c = parse_rate_curve([{"at": f"{m // 60:02d}:{m % 60:02d}", "rate_per_s": r}
                          for m, r in points])
    s = series_from_curve(c, 1.0, window_s)
    assert (s.sizing_rps >= s.offered_rps - 1e-9).all()
    grid = np.arange(0.0, DAY_S + 1)
    r = c.rate_at(grid)
    for i in range(len(s)):
        lo, hi = int(s.start_s[i]), int(s.end_s[i])
        want = r[lo:hi + 1].max() if hi < DAY_S else max(r[lo:hi].max(), float(c.rate_at(
            np.array([DAY_S - 1e-7]))[0]))
        assert s.sizing_rps[i] == pytest.approx(want, abs=1e-6)


@settings(max_examples=25, deadline=None)
@given(_points, st.sampled_from([300.0, 900.0]), st.integers(0, 2**32 - 1))
def test_every_arrival_lies_in_its_window(points, window_s, seed):
    c = parse_rate_curve([{"at": f"{m // 60:02d}:{m % 60:02d}", "rate_per_s": r / 50}
                          for m, r in points])
    s = series_from_curve(c, 1.0, window_s)
    t = curve_arrivals(c, s.start_s, s.end_s, s.sizing_rps, np.random.default_rng(seed))
    assert (np.diff(t) >= 0).all()
    assert t.size == 0 or (t[0] >= 0 and t[-1] < DAY_S)
    # no arrival where the curve is 0 over a whole window
    w = np.clip(np.searchsorted(s.start_s, t, side="right") - 1, 0, len(s) - 1)
    assert (s.sizing_rps[w] > 0).all()


def test_arrivals_follow_the_spike_inside_its_window():
    """The count's expectation is the curve's integral, window by window and inside the
    spike's window: over 11:00-13:00 in 5-minute bins, each bin's count is within 5 standard
    deviations (sqrt of its integral, a Poisson count) of the integral. Drawn at the 15-minute
    windows' peaks (thinning), the 12:00-12:05 bin holds ~60 req/s x 300 s = 18,000
    arrivals, where a constant rate per window would put 28.3 x 300 = 8,500 there."""
    c = parse_rate_curve(SPIKE)
    s = series_from_curve(c, 1.0, 900)
    t = curve_arrivals(c, s.start_s, s.end_s, s.sizing_rps, np.random.default_rng(7))
    edges = np.arange(11 * HOUR, 13 * HOUR + 1, 300.0)
    counts = np.histogram(t, edges)[0]
    want = np.diff(c.cumulative(edges))
    assert np.all(np.abs(counts - want) <= 5 * np.sqrt(want))
    assert want[12] == pytest.approx(18_000)  # 12:00-12:05: 60 req/s x 300 s, by hand
    total = float(c.cumulative(np.array([DAY_S]))[0])
    assert abs(len(t) - total) <= 5 * np.sqrt(total)


def test_spike_plan_sizes_the_spike_and_its_replay_meets(run_cli, tmp_path: Path):
    """The audit's spike (Llama-3.1-8B on H100, TTFT p99 1 s, TBT p99 60 ms, headroom 20%):
    one replica carries c ~22-24 req/s within the SLOs (the day's capacity, simulated), so 60
    req/s needs ceil(60 x 1.2 / c) >= 3 replicas in both windows the spike touches (11:45,
    which it reaches at its end, and 12:00), one elsewhere (10 x 1.2 / c < 1). Sized at their
    means (11.7 and 28.3 req/s) they got 1 and 2, and the 12:00 window replayed on the real
    curve at 19.6% attainment."""
    (tmp_path / "spike.csv").write_text(
        "at,rate_per_s\n" + "".join(f"{p['at']},{p['rate_per_s']}\n" for p in SPIKE))
    plan = chat_day_plan("spike.csv", 0.2)
    (tmp_path / "spike.yaml").write_text(yaml.safe_dump(plan))
    res = run_cli("plan", str(tmp_path / "spike.yaml"), "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    sched = d["schedule"]
    k = 47  # 11:45
    c = d["day"]["capacity_per_replica_rps"]
    spike = int(np.ceil(60 * 1.2 / c - 1e-9))
    assert 20 < c < 24.5 and spike >= 3
    assert [w["replicas"] for w in sched[k - 1:k + 3]] == [1, spike, spike, 1]
    assert sched[k]["sizing_rps"] == pytest.approx(60.0)
    assert {w["replicas"] for i, w in enumerate(sched) if i not in (k, k + 1)} == {1}
    for w in sched[k - 1:k + 2]:
        assert w["replay"]["planned"]["meets_slo"], w["replay"]
    # the replayed 12:00 window holds the curve's integral over it: 28.33 req/s x 900 s
    assert sched[k + 1]["replay"]["planned"]["completed"] == pytest.approx(28.33 * 900, rel=0.03)
    assert any("highest rate the curve reaches inside it" in n for n in d["day"]["notes"])
