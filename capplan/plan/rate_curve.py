"""Traffic over a day: per-window offered rate and burstiness, from a trace or a rate curve.

A trace is cut into windows (default 15 minutes); each window's offered rate is its request
count over its length, and its burstiness the index of dispersion of counts (IDC: variance
over mean of the arrivals counted in sub-intervals of the window; 1 for a Poisson process,
above 1 for bursty traffic; Cox & Lewis, "The Statistical Analysis of Series of Events", 1966,
section 4.5) and the squared coefficient of variation (SCV) of its inter-arrival gaps, the
arrival variability the queueing model takes (it does not change when time is stretched,
where the IDC at a fixed counting interval does). A rate curve (`{at: "HH:MM", rate_per_s}`
points, or a CSV with the columns `at` and `rate_per_s`) is linear between its points and wraps
around midnight (a curve with points at both 00:00 and 24:00 runs from one to the other
instead); a window's offered rate is the curve's mean over it, and it is sized for the highest
rate the curve reaches inside it (`window_peaks`: a piecewise-linear curve peaks at one of its
points or at the window's edge). Its requests for the replay follow the curve's shape inside
the window (`curve_arrivals`: a non-homogeneous Poisson process, by thinning).

`warp_trace` turns a short real trace into a day: the trace is repeated end to end and its
time is compressed or stretched so that its rate follows a curve (each request keeps its
lengths and its place in the real arrival sequence; inter-arrival gaps scale by the local
rate: the inverse of the cumulative rate, as for a non-homogeneous Poisson process, Lewis &
Shedler 1979).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from capplan import limits as L
from capplan.errors import InputError
from capplan.sim.stability import gap_scv
from capplan.sim.workload import Requests, replayable_rate
from capplan.units import CLOCK_PATTERN

DAY_S = 86_400.0


def per_day(amount: float, span_s: float) -> float:
    """An amount accrued over a schedule of `span_s` seconds, scaled to 24 h (a day plan's
    costs per day when its trace or curve spans more or less than a day)."""
    return amount * DAY_S / span_s
DEFAULT_WINDOW_S = 900.0
"""15-minute windows: the interval Kubernetes autoscalers and the llm-d / Dynamo planners
decide on is of this order (minutes), and a window holds enough requests for a p99."""
IDC_SUBBINS = 60
"""Sub-intervals per window counted for the index of dispersion (15 s in a 15-min window)."""


@dataclass(frozen=True)
class WindowSeries:
    """Offered traffic per window (arrays of one length, seconds from the start)."""

    start_s: np.ndarray
    end_s: np.ndarray
    offered_rps: np.ndarray
    dispersion: np.ndarray
    """Index of dispersion of counts in the window (1 = Poisson): the burstiness reported."""
    arrival_scv: np.ndarray
    """Squared coefficient of variation of the window's inter-arrival gaps (1 = Poisson): the
    arrival variability the queueing model takes (c_a^2), used to size the window."""
    output_tokens: np.ndarray
    """Output tokens the window's requests ask for (the $ per million output tokens)."""
    source: str
    sizing_rps: np.ndarray | None = None
    """The rate the window is sized for: a rate curve's highest rate inside it (window_peaks);
    a trace window's offered rate. None: the offered rate (`sized`)."""
    lane_rps: np.ndarray | None = None
    """(lanes, windows): each lane's rate at the instant the window's sizing rate is reached
    (the lane mix it is sized with; plan/day.py `combine`). None for one lane."""

    def __len__(self) -> int:
        return len(self.start_s)

    @property
    def span_s(self) -> float:
        return float(self.end_s[-1] - self.start_s[0]) if len(self) else 0.0

    @property
    def sized(self) -> np.ndarray:
        """The rate each window is sized for (sizing_rps, else the offered rate)."""
        return self.offered_rps if self.sizing_rps is None else self.sizing_rps

    @property
    def peak_index(self) -> int:
        """The window sized for the highest rate (the first of equals)."""
        return int(np.argmax(self.sized))

    def mean_scv(self) -> float:
        """Request-weighted mean inter-arrival SCV over the windows (the diurnal trend is not
        counted: each window's gaps are taken about their own mean)."""
        w = self.offered_rps * (self.end_s - self.start_s)
        return float(np.average(self.arrival_scv, weights=w)) if w.sum() > 0 else 1.0


def check_window(window_s: float) -> float:
    """A window length in seconds, checked: at least a minute, at most a day."""
    x = float(L.DURATION_S.check(window_s, "window"))
    if x < 60:
        raise InputError(f"window {x:g} s: use at least 60 s (a p99 needs requests)")
    return x


def _idc(t: np.ndarray, start: float, end: float) -> float:
    """Index of dispersion of the arrivals t in [start, end) over IDC_SUBBINS bins."""
    if len(t) < 2:
        return 1.0
    counts = np.histogram(t, bins=IDC_SUBBINS, range=(start, end))[0]
    mean = counts.mean()
    return float(counts.var() / mean) if mean > 0 else 1.0


def _window_of(t: np.ndarray, window_s: float, n: int) -> np.ndarray:
    """The window (0..n-1) of each arrival time: windows hold (start, end], the last the tail."""
    return np.clip(np.ceil(t / window_s).astype(np.int64) - 1, 0, n - 1)


def trace_window_edges(t: np.ndarray, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The windows over sorted arrivals `t` (the first at 0) and each window's request count:
    (edges (windows + 1,), counts (windows,)). The trace ends at its last arrival, so the last
    window ends there: when that leaves it shorter than half a window, it joins the window
    before (a count over a few seconds is no rate: one request 0.5 s into a window would read
    as 2 req/s and size the day's peak), which then runs up to 1.5 windows; a tail of at least
    half a window keeps its own window, its count over its own length (rated over the nominal
    length it would read low when the trace was merely cut there). A trace shorter than one
    window is one window to its last arrival. A window counts the arrivals after its start up
    to its end, (start, end]: the first arrival, at 0, opens the trace's clock and counts in
    none, so the counts add up to n - 1 over the span, the trace's rate
    (sim.workload.arrival_rate), and evenly spaced arrivals read their rate in every window.
    One rule for the day planner and `latency --trace`'s peak window (plan/replay.py)."""
    n = max(1, math.ceil(float(t[-1]) / window_s - 1e-9))
    if n > 1 and float(t[-1]) - (n - 1) * window_s < window_s / 2:
        n -= 1  # the short tail joins the window before it
    edges = np.arange(n + 1) * window_s
    edges[-1] = max(float(t[-1]), edges[-2] + 1.0)  # a trace under 1 s: rated over 1 s
    idx = _window_of(t[1:], window_s, n)
    return edges, np.bincount(idx, minlength=n)


def series_from_trace(reqs: Requests, window_s: float = DEFAULT_WINDOW_S,
                      source: str = "trace") -> WindowSeries:
    """Windows over a trace's arrivals (trace_window_edges): each window's offered rate is
    its count over its length; its output tokens those of the requests arriving in it (the
    first request's in the first window), its IDC and gap SCV over its arrivals."""
    window_s = check_window(window_s)
    t = np.asarray(reqs.arrival_at_s, float)
    replayable_rate(t, source)
    edges, counts = trace_window_edges(t, window_s)
    n = len(counts)
    idx = _window_of(t, window_s, n)
    out_tok = np.bincount(idx, weights=np.asarray(reqs.output_tokens, float), minlength=n)
    bounds = np.searchsorted(t, edges, side="right")
    bounds[0], bounds[-1] = 0, len(t)  # the first arrival in the first window, the last in the last
    idc = np.array([_idc(t[bounds[i]:bounds[i + 1]], edges[i], edges[i + 1])
                    for i in range(n)])
    scv = np.array([gap_scv(t[bounds[i]:bounds[i + 1]]) for i in range(n)])
    return WindowSeries(edges[:-1], edges[1:], counts / np.diff(edges), idc, scv, out_tok,
                        source)


@dataclass(frozen=True)
class RateCurve:
    """A daily rate curve: points (seconds after midnight, requests/s), linear between them,
    wrapping around midnight."""

    at_s: np.ndarray
    rate_per_s: np.ndarray
    source: str = "rate curve"

    @property
    def closed(self) -> bool:
        """Points at both 00:00 and 24:00: the curve runs from one to the other and does not
        wrap (the two rates may differ: a step at midnight)."""
        return bool(self.at_s[0] == 0.0 and self.at_s[-1] == DAY_S)

    def rate_at(self, t_s: np.ndarray) -> np.ndarray:
        return self._in_day(np.mod(np.asarray(t_s, float), DAY_S))

    def _in_day(self, x: np.ndarray) -> np.ndarray:
        """The rate at x seconds after midnight, 0 <= x <= DAY_S (DAY_S: the day's end, the
        24:00 point of a closed curve)."""
        if self.closed:
            return np.interp(x, self.at_s, self.rate_per_s)
        xp = np.concatenate([self.at_s - DAY_S, self.at_s, self.at_s + DAY_S])
        return np.interp(x, xp, np.tile(self.rate_per_s, 3))

    def limits(self, t_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rate just before, rate just after) each instant t: equal except at midnight of a
        closed curve whose 24:00 and 00:00 rates differ (its one step)."""
        t = np.asarray(t_s, float)
        x = np.mod(t, DAY_S)
        after = self._in_day(x)
        before = self._in_day(np.where((x == 0) & (t > 0), DAY_S, x))
        return before, after

    def cumulative(self, t_s: np.ndarray) -> np.ndarray:
        """Expected requests in [0, t] (the integral of the rate), by the trapezoid rule on a
        1-second grid's worth of knots: exact for a piecewise-linear curve at its knots."""
        t = np.asarray(t_s, float)
        days = np.floor(t / DAY_S)
        knots = np.unique(np.concatenate([[0.0, DAY_S], self.at_s]))
        r = self._in_day(knots)  # the last knot is the day's end (24:00's rate if given)
        cum = np.concatenate([[0.0], np.cumsum(np.diff(knots) * (r[1:] + r[:-1]) / 2)])
        frac = t - days * DAY_S
        k = np.clip(np.searchsorted(knots, frac, side="right") - 1, 0, len(knots) - 2)
        part = cum[k] + (frac - knots[k]) * (r[k] + self._in_day(frac)) / 2
        return days * cum[-1] + part


def clock_text(v: Any, where: str | None = None) -> str:
    """A point's `at` as written: text ('HH:MM' or 'HH:MM:SS'). A number (a plan file's
    unquoted `at: 900`, a JSON 900) is refused, not read as seconds after midnight: a CSV's
    900 is no time of day either, and 900 meant as 09:00 would silently plan 00:15. The plan
    file's schema (plan/schema.py CurvePoint) and parse_rate_curve both check with this
    (`where`: the point's place, None in the schema, whose error names the field)."""
    if not isinstance(v, str):
        head = f"{v!r}" if where is None else f"{where}: at {v!r}"
        raise InputError(f"{head} is not a time of day: write it as HH:MM (e.g. 09:00); a "
                         "number is not read as seconds after midnight")
    return v


def _clock(v: Any, where: str) -> float:
    """'HH:MM' (or 'HH:MM:SS') -> seconds after midnight."""
    if not re.fullmatch(CLOCK_PATTERN, clock_text(v, where)):
        raise InputError(f"{where}: at {v!r} is not a time of day like 14:30 (00:00 to 24:00)")
    parts = clock_text(v, where).strip().split(":")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise InputError(f"{where}: at {v!r} is not a time of day like 14:30") from None
    if not 2 <= len(nums) <= 3 or not 0 <= nums[0] <= 24 or not 0 <= nums[1] < 60:
        raise InputError(f"{where}: at {v!r} is not a time of day like 14:30")
    s = nums[0] * 3600 + nums[1] * 60 + (nums[2] if len(nums) == 3 else 0.0)
    if not 0 <= s <= DAY_S:
        raise InputError(f"{where}: at {v!r} is outside the day (00:00 to 24:00)")
    return s


def _points_from_csv(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The CSV's points and the file line of each."""
    if not path.is_file():
        raise InputError(f"{path}: no such rate-curve file")
    L.check_input_file(path, "rate curve")
    with L.named_decode_errors(path), open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        cols = [c.strip() for c in (reader.fieldnames or [])]
        reader.fieldnames = cols
        if "at" not in cols or "rate_per_s" not in cols:
            raise InputError(f"{path}:1: a rate curve CSV has the columns at,rate_per_s")
        rows = list(enumerate(reader, 2))
        return [{"at": r["at"], "rate_per_s": r["rate_per_s"]} for _, r in rows], \
            [i for i, _ in rows]


def _point(p: Any, where: str) -> tuple[float, float]:
    """(time of day in s, rate) of one `{at, rate_per_s}` point; `where` names it in errors."""
    if not isinstance(p, dict) or "at" not in p or "rate_per_s" not in p:
        raise InputError(f"{where}: each point is {{at: 'HH:MM', rate_per_s: R}}")
    extra = set(p) - {"at", "rate_per_s"}
    if extra:
        raise InputError(f"{where}: unknown key {sorted(extra)[0]!r} (at, rate_per_s)")
    t = _clock(p["at"], where)
    r = L.Bound("rate (requests/s)", 0.0, L.RATE_PER_S.hi, "a rate curve's rate").check(
        p["rate_per_s"], f"{where}: rate_per_s")
    return t, float(r)


def parse_rate_curve(spec: str | Path | Sequence[Any], base: Path | None = None) -> RateCurve:
    """A RateCurve from a list of `{at, rate_per_s}` points or a CSV path (relative to base)."""
    if isinstance(spec, str | Path):
        path = Path(spec)
        if base is not None and not path.is_absolute():
            path = base / path
        (points, lines), label = _points_from_csv(path), str(path)
    else:
        points, label = list(spec), "rate_curve"
        lines = list(range(1, len(points) + 1))
    if not points:
        raise InputError(f"{label}: a rate curve needs at least one point")
    at, rate = [], []
    for i, p in enumerate(points):
        where = f"{label}:{lines[i]}" if isinstance(spec, str | Path) else f"{label}[{i}]"
        t, r = _point(p, where)
        at.append(t)
        rate.append(r)
    a, r = np.asarray(at), np.asarray(rate)
    order = np.argsort(a, kind="stable")
    a, r = a[order], r[order]
    if len(np.unique(a)) != len(a):
        raise InputError(f"{label}: two points at the same time of day")
    if not (r > 0).any():
        raise InputError(f"{label}: every rate is 0: nothing to plan")
    return RateCurve(a, r, label)


def series_from_curve(curve: RateCurve, mean_output_tokens: float,
                      window_s: float = DEFAULT_WINDOW_S, dispersion: float = 1.0
                      ) -> WindowSeries:
    """A day of windows from a rate curve: each window's offered rate is the curve's mean over
    it (the integral by the trapezoid rule: exact for the piecewise-linear curve), its sizing
    rate the highest the curve reaches inside it (window_peaks), its IDC the lane's (1 for
    Poisson arrivals; 1 / burstiness for gamma gaps)."""
    window_s = check_window(window_s)
    n = max(1, math.ceil(DAY_S / window_s - 1e-9))
    edges = np.minimum(np.arange(n + 1) * window_s, DAY_S)
    cum = curve.cumulative(edges)
    length = np.diff(edges)
    rate = np.diff(cum) / length
    peak, _, _ = window_peaks([curve], edges[:-1], edges[1:])
    return WindowSeries(edges[:-1], edges[1:], rate, np.full(n, float(dispersion)),
                        np.full(n, float(dispersion)), rate * length * mean_output_tokens,
                        curve.source, sizing_rps=peak)


def window_peaks(curves: Sequence[RateCurve], start_s: np.ndarray, end_s: np.ndarray,
                 base_rps: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The highest total rate of `curves` (plus `base_rps`, constant over each window) inside
    each of the contiguous windows [start_s, end_s], when it is reached, and each curve's rate
    then: (peak (windows,), at_s (windows,), rates (curves, windows)).

    Each curve is linear between its points (a closed curve steps at midnight), so their sum
    is too and it peaks at a window's edge or at a point of one of the curves: the candidates
    are each window's start (the rate just after it), its end (just before) and every curve
    point and midnight strictly inside it (both sides). E.g. 10 req/s rising to 60 between
    11:59 and 12:00: the window 11:45-12:00 peaks at its end, 60 req/s (its mean is 10.8)."""
    start, end = np.asarray(start_s, float), np.asarray(end_s, float)
    n = len(start)
    pts = np.unique(np.concatenate([[0.0], *(np.mod(c.at_s, DAY_S) for c in curves)]))
    days = np.arange(math.floor(start[0] / DAY_S), math.ceil(end[-1] / DAY_S) + 1)
    knots = (days[:, None] * DAY_S + pts[None, :]).ravel()
    win = np.clip(np.searchsorted(start, knots, side="right") - 1, 0, n - 1)
    inner = (knots > start[win]) & (knots < end[win])
    k, kw = knots[inner], win[inner]
    times = np.concatenate([start, end, k, k])
    idx = np.concatenate([np.arange(n), np.arange(n), kw, kw])
    use_before = np.concatenate([np.zeros(n, bool), np.ones(n, bool),
                                 np.ones(len(k), bool), np.zeros(len(k), bool)])
    rates = np.zeros((len(curves), len(times)))
    for i, c in enumerate(curves):
        before, after = c.limits(times)
        rates[i] = np.where(use_before, before, after)
    total = rates.sum(axis=0) + (0.0 if base_rps is None else np.asarray(base_rps, float)[idx])
    order = np.lexsort((-total, idx))  # by window, the highest first
    first = order[np.searchsorted(idx[order], np.arange(n))]
    return total[first], times[first], rates[:, first]


def curve_arrivals(curve: RateCurve, start_s: np.ndarray, end_s: np.ndarray,
                   peak_rps: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a non-homogeneous Poisson process whose rate follows `curve` over the
    windows [start_s, end_s), sorted: in each window a homogeneous process at its peak rate
    (window_peaks: at least the curve's rate anywhere in it), each arrival kept with
    probability rate(t) / peak (thinning: Lewis & Shedler, "Simulation of nonhomogeneous
    Poisson processes by thinning", Naval Research Logistics Quarterly 26(3), 1979). The
    count in a window is Poisson with mean the curve's integral over it."""
    start, end = np.asarray(start_s, float), np.asarray(end_s, float)
    peak = np.asarray(peak_rps, float)
    length = end - start
    counts = rng.poisson(peak * length)
    t = np.repeat(start, counts) + rng.random(int(counts.sum())) * np.repeat(length, counts)
    keep = rng.random(len(t)) * np.repeat(peak, counts) < curve.rate_at(t)
    return np.sort(t[keep])


def warp_trace(reqs: Requests, curve: RateCurve, days: float = 1.0) -> Requests:
    """A trace repeated end to end and time-warped so that its rate follows `curve` over
    `days` (see the module docstring). The request count is the curve's integral."""
    t = np.asarray(reqs.arrival_at_s, float)
    n_src = len(t)
    if n_src < 2 or float(t[-1]) <= 0:
        raise InputError("warp_trace: the trace needs at least two requests at different times")
    period = float(t[-1]) * n_src / (n_src - 1)  # one mean gap between repeats
    total = float(curve.cumulative(np.asarray([days * DAY_S]))[0])
    n = int(total)
    L.REQUESTS.check(n, "requests of the warped day")
    reps = np.arange(n) // n_src
    pos = np.arange(n) % n_src
    tau = reps * period + t[pos]  # time in the repeated real trace
    src_rate = n_src / period
    target = tau * src_rate  # expected requests before each arrival at the trace's own rate
    grid = np.linspace(0.0, days * DAY_S, int(days * DAY_S / 10) + 1)
    arr = np.interp(target, curve.cumulative(grid), grid)
    return Requests(arr, np.asarray(reqs.input_tokens)[pos], np.asarray(reqs.output_tokens)[pos],
                    np.zeros(n, np.int64),
                    note=f"{n} requests: {reqs.note or 'a trace'} repeated and warped to "
                         f"{curve.source}")
