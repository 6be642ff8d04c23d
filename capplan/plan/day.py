"""A day of traffic: replicas per window, autoscaled vs fixed GPU-hours and cost, scale-up lead.

The steps:
1. Each lane's traffic per window (plan/rate_curve.py): a trace cut into windows, or a daily
   rate curve; lanes add up window by window.
2. The steady-rate planner (planner.run_plan) sizes the peak window: it picks the GPU, TP,
   dtypes and engine settings, and gives each replica's capacity under the SLOs
   (`Candidate.max_rate_per_s`, the highest per-replica rate meeting every SLO analytically).
3. Every window gets replicas = ceil(sizing * (1 + headroom) / capacity), at least
   `min_replicas`: the same rule the planner applies at one rate (search.analytic_search),
   where `sizing` is the highest rate a rate curve reaches inside the window (a trace
   window's offered rate) and the capacity is at the window's own lane mix (plan/day_mix.py)
   and, for a trace, its own inter-arrival SCV (plan/burst.py), scaled to what the simulator
   sustains at the peak when that is less (plan/day_capacity.py). Its TTFT / TBT p99 are the
   analytic model's at the window's per-replica rate. Of the peak plan's configurations, the
   one whose day costs least comes first (plan/day_peak.py); the recommendation is then
   restated as the schedule's peak fleet at that capacity (plan/day_fleet.py).
4. Totals: GPU-hours and cost autoscaled (sum over windows) and for a fixed fleet sized for the
   peak window, $ per million output tokens of both, the saving.
5. Scale-up lead (plan/startup.py): a window that needs more replicas than the one before
   must start them `replica_start_s` ahead. A reactive policy (each window gets the replicas
   the previous window needed, joining after the start-up lag) is compared with the planned
   schedule by replaying the trace over both (plan/day_replay.py); a replayed window that
   misses the SLOs gets replicas until it meets them.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from capplan.catalog.loader import Catalog
from capplan.errors import InputError
from capplan.models.memory import memory_report
from capplan.plan.day_fleet import PeakFleet, peak_fleet
from capplan.plan.day_mix import Sizing, day_sizing
from capplan.plan.day_peak import (
    HOUR_S,
    peak_plan,
    peak_traffic,
    rank_for_day,
    replicas_for,
    scaled_counts,
)
from capplan.plan.rate_curve import (
    DAY_S,
    DEFAULT_WINDOW_S,
    RateCurve,
    WindowSeries,
    curve_arrivals,
    parse_rate_curve,
    per_day,
    series_from_curve,
    series_from_trace,
    window_peaks,
)
from capplan.plan.result import PlanResult
from capplan.plan.schema import PlanFile
from capplan.plan.search import Candidate, cost_per_hour
from capplan.plan.startup import ENGINE_STARTUP_S, StartupLag, startup_lag
from capplan.sim.workload import Requests, load_trace, parse_length

PlanFn = Callable[[Catalog, PlanFile], PlanResult]


@dataclass(frozen=True, kw_only=True)
class DayOptions:
    """How the day is planned (plan-file `day:` and the CLI's --window ... options)."""

    window_s: float = DEFAULT_WINDOW_S
    min_replicas: int = 1
    """Replicas kept in every window (0 lets the fleet go to zero when no request comes)."""
    load_from: str = "nvme"
    load_gb_per_s: float | None = None
    engine_startup_s: float = ENGINE_STARTUP_S
    replay: str = "peak"
    """Which windows the trace replay verifies: none, peak (the peak window and its
    neighbours) or all."""
    timezone: str = "UTC"
    """The IANA time zone of the day's clock times (plan/clock_zone.py): a label, every time
    is seconds after 00:00 in it."""


@dataclass(frozen=True)
class LaneDay:
    """One lane's day: its windows and, for a trace, its requests."""

    name: str
    series: WindowSeries
    requests: Requests | None = None
    trace: str | None = None
    """The trace file read (absolute: `capplan verify` reads its lengths from any folder)."""
    time_unit: str = "auto"
    curve: RateCurve | None = None
    """A rate-curve (or steady) lane's curve: its windows' peaks and its replay follow it."""


def lane_day(lane: Any, window_s: float, base: Path | None = None) -> LaneDay:
    """A plan lane's traffic per window: `trace`, `rate_curve` or a steady `rate_per_s`."""
    if lane.trace is not None:
        path = Path(lane.trace)
        if base is not None and not path.is_absolute():
            path = base / path
        unit = getattr(lane, "time_unit", "auto")
        reqs = load_trace(path, unit)
        return LaneDay(lane.name, series_from_trace(reqs, window_s, str(path)), reqs,
                       trace=str(path.resolve()), time_unit=unit)
    out_mean = parse_length(str(lane.output_len)).mean
    if lane.rate_curve is not None:
        spec = lane.rate_curve if isinstance(lane.rate_curve, str) else [
            p.model_dump() for p in lane.rate_curve]
        curve = parse_rate_curve(spec, base)
    else:
        curve = parse_rate_curve([{"at": "00:00", "rate_per_s": lane.rate_per_s}])
    return LaneDay(lane.name, series_from_curve(curve, out_mean, window_s,
                                                dispersion=1.0 / lane.burstiness), curve=curve)


def combine(days: Sequence[LaneDay]) -> WindowSeries:
    """Lanes added window by window: a rate curve repeats every day (beside a trace of several
    days), a shorter trace counts 0 after its end. Each window is sized for the highest total
    rate inside it (rate_curve.window_peaks over the curves, a trace lane counting its
    window's rate), with each lane's rate at that instant as its mix (`lane_rps`)."""
    longest = max(days, key=lambda d: (len(d.series), d.series.span_s)).series
    n = len(longest)
    rate, out_tok, disp_w, scv_w = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    lane_rps = np.zeros((len(days), n))
    for i, d in enumerate(days):
        s = d.series
        k = n if d.requests is None else len(s)  # np.resize repeats a day's curve cyclically
        rate[:k] += np.resize(s.offered_rps, k)
        out_tok[:k] += np.resize(s.output_tokens, k)
        disp_w[:k] += np.resize(s.dispersion * s.offered_rps, k)
        scv_w[:k] += np.resize(s.arrival_scv * s.offered_rps, k)
        if d.curve is None:  # a trace: its window's rate (a series without its curve: its own)
            lane_rps[i, :k] = np.resize(s.sized, k)
    # the lanes' rate-weighted mean (the planner pools lanes' SCVs the same way: traffic_for)
    disp = np.where(rate > 0, disp_w / np.maximum(rate, 1e-300), 1.0)
    scv = np.where(rate > 0, scv_w / np.maximum(rate, 1e-300), 1.0)
    curved = [i for i, d in enumerate(days) if d.curve is not None]
    sizing = lane_rps.sum(axis=0)
    if curved:
        sizing, _, at_peak = window_peaks([days[i].curve for i in curved], longest.start_s,
                                          longest.end_s, base_rps=sizing)
        lane_rps[curved] = at_peak
    return WindowSeries(longest.start_s, longest.end_s, rate, disp, scv, out_tok,
                        " + ".join(d.series.source for d in days), sizing_rps=sizing,
                        lane_rps=lane_rps)


@dataclass(frozen=True, kw_only=True)
class Window:
    """One window of the schedule."""

    start_s: float
    end_s: float
    offered_rps: float
    sizing_rps: float
    """The rate the window is sized for: the highest a rate curve reaches inside it (its
    offered rate is the mean); a trace window's offered rate."""
    dispersion: float
    arrival_scv: float
    replicas: int
    gpus: int
    ttft_p99_s: float
    tbt_p99_s: float
    scale_up_begin_s: float | None = None
    """When the replicas this window adds must start: start_s - scale_up_lead_s, taken
    modulo the schedule's span (a daily cycle: before 00:00 is the previous evening)."""
    scale_up_lead_s: float | None = None
    """The replica start-up time the scale-up needs ahead of the window."""
    reactive_replicas: int = 0
    """What a reactive policy runs: the replicas the previous window needed (the first
    window's: the last window's, the day being a cycle)."""
    binding: str = "capacity"
    """What sets `replicas`: "capacity" (the sizing rate with the headroom over a replica's
    capacity, replicas the replay added included) or "min_replicas" (the floor: the analytic
    capacity alone would need fewer, or the window has no traffic). capplan has no replica
    cap, so nothing binds from above."""
    replay: dict[str, Any] | None = None
    """The trace replayed over the planned (and reactive) fleet: attainment, p99s."""

    def to_dict(self) -> dict[str, Any]:
        return {"start_s": self.start_s, "end_s": self.end_s, "offered_rps": self.offered_rps,
                "sizing_rps": self.sizing_rps, "dispersion": self.dispersion,
                "arrival_scv": self.arrival_scv,
                "replicas": self.replicas, "gpus": self.gpus,
                "ttft_p99_s": self.ttft_p99_s, "tbt_p99_s": self.tbt_p99_s,
                "scale_up_begin_s": self.scale_up_begin_s,
                "scale_up_lead_s": self.scale_up_lead_s,
                "reactive_replicas": self.reactive_replicas, "binding": self.binding,
                **({"replay": self.replay} if self.replay is not None else {})}


@dataclass(frozen=True, kw_only=True)
class DayPlan:
    """The day's schedule and its totals, beside the peak window's steady-rate plan."""

    plan: PlanResult
    """The steady-rate plan at the peak window's rate (GPU, TP, engine settings, flags)."""
    windows: list[Window]
    gpus_per_replica: int
    price_per_gpu_hour: float | None
    output_tokens: float
    lag: StartupLag
    source: str
    headroom: float
    notes: list[str] = field(default_factory=list)
    peak: dict[str, Any] = field(default_factory=dict)
    """The peak window and each lane's traffic there (day_peak.peak_traffic): what the plan
    was sized for and what `capplan verify` sends."""
    rebuild: Callable[[np.ndarray], list[Window]] | None = field(default=None, repr=False,
                                                                 compare=False)
    """The windows for other replica counts (the replay adds replicas where it misses)."""
    capacity_rps: float | None = None
    """A replica's capacity at the peak window as the schedule sizes it (the analytic one, or
    the rate a replay established: day_capacity's check, the planner's replay, the day
    replay's corrections); the recommendation states the same (day_fleet)."""
    simulated_capacity_rps: float | None = None
    """The same capacity when a replay established it (None: only the analytic model gave
    it, as with `replay: none` and a configuration the planner's replay did not touch)."""
    rescale: Callable[[dict[int, int]], tuple[np.ndarray, float]] | None = field(
        default=None, repr=False, compare=False)
    """Every window's replica count when the replay found windows needing more replicas
    than the analytic count (day_peak.scaled_counts): (counts, capacity factor)."""
    timezone: str = "UTC"
    """The IANA time zone of the windows' clock times (DayOptions.timezone)."""

    @property
    def span_s(self) -> float:
        return self.windows[-1].end_s - self.windows[0].start_s

    @property
    def peak_replicas(self) -> int:
        return max(w.replicas for w in self.windows)

    @property
    def gpu_hours(self) -> float:
        return sum(w.gpus * (w.end_s - w.start_s) for w in self.windows) / HOUR_S

    @property
    def fixed_fleet_gpu_hours(self) -> float:
        return self.peak_replicas * self.gpus_per_replica * self.span_s / HOUR_S

    def cost_per_day_of(self, gpu_hours: float) -> float | None:
        """Cost of `gpu_hours` over the span, scaled to 24 h when the span is not a day."""
        if self.price_per_gpu_hour is None:
            return None
        return per_day(gpu_hours * self.price_per_gpu_hour, self.span_s)

    def _per_mtok(self, gpu_hours: float) -> float | None:
        if self.price_per_gpu_hour is None or self.output_tokens <= 0:
            return None
        return gpu_hours * self.price_per_gpu_hour / (self.output_tokens / 1e6)

    def to_dict(self) -> dict[str, Any]:
        auto, fixed = self.gpu_hours, self.fixed_fleet_gpu_hours
        best = self.plan.best
        return {
            **self.plan.to_dict(),
            "day": {"source": self.source, "window_s": self.windows[0].end_s
                    - self.windows[0].start_s, "span_s": self.span_s,
                    "gpu": best.candidate.gpu.key, "tp": best.candidate.settings.tp,
                    "gpus_per_replica": self.gpus_per_replica,
                    "capacity_per_replica_rps": (best.candidate.max_rate_per_s
                                                 if self.capacity_rps is None
                                                 else self.capacity_rps),
                    "simulated_capacity_per_replica_rps": self.simulated_capacity_rps,
                    "price_per_gpu_hour": self.price_per_gpu_hour,
                    "output_tokens": self.output_tokens, "startup": self.lag.to_dict(),
                    "peak": self.peak, "notes": list(self.notes)},
            "timezone": self.timezone,
            "schedule": [w.to_dict() for w in self.windows],
            "peak_replicas": self.peak_replicas,
            "gpu_hours": auto,
            "fixed_fleet_gpu_hours": fixed,
            "cost_per_day": self.cost_per_day_of(auto),
            "fixed_fleet_cost_per_day": self.cost_per_day_of(fixed),
            "cost_per_million_output_tokens": self._per_mtok(auto),
            "fixed_fleet_cost_per_million_output_tokens": self._per_mtok(fixed),
            "saving_gpu_hours": fixed - auto,
            "saving_per_day": (None if self.price_per_gpu_hour is None else
                               (self.cost_per_day_of(fixed) or 0.0)
                               - (self.cost_per_day_of(auto) or 0.0)),
            "saving_frac": 1.0 - auto / fixed if fixed > 0 else 0.0,
        }


def cycle_s(end_s: float) -> float:
    """The schedule's cycle: a day, or the whole days a longer schedule spans (a schedule
    shorter than a day holds its last window until the next midnight, then starts over)."""
    return DAY_S * max(1, math.ceil(float(end_s) / DAY_S - 1e-9))


def windows_for(total: WindowSeries, reps: np.ndarray, gpr: int, lag: StartupLag,
                size: Sizing, floor: tuple[int, np.ndarray] | None = None) -> list[Window]:
    """The schedule's windows for replica counts `reps` (GPUs, predicted p99s, scale-up lead,
    the reactive policy's counts, what binds each: `floor` is (min_replicas, the counts the
    capacity alone needs); a window held at min_replicas above that need is bound by it)."""
    reps = np.asarray(reps, np.int64)
    low, need = floor if floor is not None else (0, reps)
    held = (reps == low) & ((np.asarray(need) < low) | (total.sized <= 0))
    ttft, tbt = size.predict(total.sized / np.maximum(reps, 1))
    # the day is a cycle: the first window takes over from the last (reps[-1]), a start-up
    # ahead when it adds replicas; reactive: each window runs what the previous one needed
    reactive = np.roll(reps, 1)
    cycle = cycle_s(total.end_s[-1])
    out = []
    for i in range(len(total)):
        up = len(total) > 1 and reps[i] > reactive[i]
        idle = reps[i] == 0
        out.append(Window(
            start_s=float(total.start_s[i]), end_s=float(total.end_s[i]),
            offered_rps=float(total.offered_rps[i]), sizing_rps=float(total.sized[i]),
            dispersion=float(total.dispersion[i]),
            arrival_scv=float(total.arrival_scv[i]),
            replicas=int(reps[i]), gpus=int(reps[i]) * gpr,
            ttft_p99_s=math.nan if idle else float(ttft[i]),
            tbt_p99_s=math.nan if idle else float(tbt[i]),
            # a daily cycle: a start before the schedule's is the previous day's clock time
            scale_up_begin_s=(float(total.start_s[i]) - lag.total_s) % cycle if up else None,
            scale_up_lead_s=lag.total_s if up else None,
            reactive_replicas=int(reactive[i]),
            binding="min_replicas" if held[i] else "capacity"))
    return out


def _schedule(total: WindowSeries, cand: Candidate, opts: DayOptions, headroom: float,
              lag: StartupLag, size: Sizing) -> tuple[list[Window], Callable, Callable]:
    """The windows at the analytic replica counts, the function rebuilding them for other
    counts (the replay's corrections) and the one scaling every window's count to the
    capacity the replay found (day_peak.scaled_counts)."""
    reps = replicas_for(total.sized, size.capacity_rps, headroom, opts.min_replicas)
    gpr = cand.gpus_total // max(cand.replicas, 1)

    need = replicas_for(total.sized, size.capacity_rps, headroom, 0)  # without the floor

    def rebuild(r: np.ndarray) -> list[Window]:
        return windows_for(total, r, gpr, lag, size, (opts.min_replicas, need))

    def rescale(needed: dict[int, int]) -> tuple[np.ndarray, float]:
        return scaled_counts(total.sized, size.capacity_rps, headroom,
                             opts.min_replicas, needed)

    return rebuild(reps), rebuild, rescale


def plan_day(cat: Catalog, plan: PlanFile, opts: DayOptions, run: PlanFn,
             base: Path | None = None) -> DayPlan:
    """The day plan of one model's lanes (see the module docstring). `run(cat, plan)` is the
    steady-rate planner (with or without simulator verification)."""
    days = [lane_day(ln, opts.window_s, base) for ln in plan.workloads]
    total = combine(days)
    if not (total.offered_rps > 0).any():
        raise InputError("no traffic in any window: nothing to plan")
    model = cat.resolve_model(plan.model).spec
    with tempfile.TemporaryDirectory(prefix="capplan-day-") as tmp:
        peak = peak_plan(plan, days, total, Path(tmp))
        planned = run(cat, peak)
        result, rerank = rank_for_day(planned, total, plan.headroom, opts.min_replicas,
                                      day_replayed=opts.replay != "none")
        cand = result.best.candidate
        mem = memory_report(model, cand.gpu, cand.settings)
        gpr = cand.gpus_total // max(cand.replicas, 1)
        lag = startup_lag(mem.weights_bytes_per_gpu * gpr, opts.load_from, opts.load_gb_per_s,
                          opts.engine_startup_s)
        size = day_sizing(cand, peak, model, total, any(d.requests is not None for d in days))
        check, sim_note = None, []
        if opts.replay != "none":  # the one verdict on a replica's capacity: day_capacity
            from capplan.plan.day_capacity import sized_at_simulated

            size, check, sim_note = sized_at_simulated(cat, peak, cand, size,
                                                       total.peak_index, opts.window_s)
        windows, rebuild, rescale = _schedule(total, cand, opts, plan.headroom, lag, size)
        fleet = PeakFleet(model=model, traffic=_served(peak, model), first=planned.best,
                          check=check)
    # the lanes as the user gave them, not the temporary length files
    result = replace(result, lanes=list(plan.workloads))
    price = cost_per_hour(cand.gpu, 1)
    span = float(total.end_s[-1] - total.start_s[0])
    per_day = ([] if abs(span - DAY_S) < 1 else
               [f"the traffic spans {span / 3600:.3g} h: GPU-hours are over that span, costs "
                "per day scale it to 24 h"])
    k = total.peak_index
    read = [f"read {d.requests.note}" for d in days if d.requests is not None and d.requests.note]
    cap = float(size.capacity_rps[k])
    sim_rps = _simulated_rps(cap, cand, check)
    notes = [*read, *per_day, *rerank, f"sized at the peak window ({total.sized[k]:.3g} req/s, "
             f"window {k}); each replica carries {cap:.3g} req/s within the SLOs "
             f"({'simulated' if sim_rps is not None else 'analytic'}), headroom "
             f"{plan.headroom:.0%}", *sim_note,
             *_sizing_note(days, total),
             *([f"each window is sized at its own lane mix (the lanes' rates when its sizing "
                f"rate is reached; {size.mixes} distinct mixes over the day): a lane that peaks "
                "at another hour changes a replica's capacity there"] if size.mixes > 1 else [])]
    dp = DayPlan(plan=result, windows=windows, gpus_per_replica=gpr, price_per_gpu_hour=price,
                 output_tokens=float(total.output_tokens.sum()), lag=lag, source=total.source,
                 headroom=plan.headroom, notes=notes, peak=peak_traffic(days, total),
                 rebuild=rebuild, rescale=rescale, capacity_rps=cap,
                 simulated_capacity_rps=sim_rps, timezone=opts.timezone)
    reqs = _day_requests(days, plan, total)
    if reqs is not None and opts.replay != "none":
        from capplan.plan.day_replay import verify_day

        dp = verify_day(cat, dp, reqs, opts.replay)
    return peak_fleet(dp, fleet)


def _served(peak: PlanFile, model: Any) -> Any:
    """The peak window's traffic as the planner served it (planner.served_traffic)."""
    from capplan.plan.planner import served_traffic

    return served_traffic(peak.workloads, peak, model)


def _simulated_rps(cap: float, cand: Candidate, check: Any) -> float | None:
    """The capacity per replica a replay established at the peak window: the day's capacity
    check's (when it found a rate meeting the SLOs), else the planner's replay's where it
    gave the capacity (it sized the replicas or confirmed a lower rate); None when only the
    analytic model gave it."""
    from capplan.plan.search import replay_found

    if check is not None and check.rate_rps > 0:
        return cap
    if cand.sized_by_replay or replay_found(cand.binding_constraint):
        return cap
    return None


REPLAY_SEED = 25
"""Seed of the requests drawn for rate-curve lanes' replay (fixed: the answer is repeatable)."""


def _curve_requests(d: LaneDay, lane: Any, total: WindowSeries, rng: np.random.Generator
                    ) -> Requests:
    """Requests of a rate-curve lane for the replay over the day's windows: arrivals of a
    non-homogeneous Poisson process following the curve inside each window (gamma-burstiness
    lanes are replayed as Poisson; rate_curve.curve_arrivals), lengths drawn from the lane's."""
    assert d.curve is not None, "a rate-curve lane has its curve"
    peak, _, _ = window_peaks([d.curve], total.start_s, total.end_s)
    t = curve_arrivals(d.curve, total.start_s, total.end_s, peak, rng)
    n = len(t)
    return Requests(t, parse_length(str(lane.input_len)).sample(rng, n),
                    parse_length(str(lane.output_len)).sample(rng, n), np.zeros(n, np.int64))


def _sizing_note(days: Sequence[LaneDay], total: WindowSeries) -> list[str]:
    """How the windows are sized: a rate curve's at its highest rate inside each window (and
    which window that moves most), a trace's at its count over the window's length."""
    if not any(d.curve is not None for d in days):
        return ["each window is sized at its request count over its length, at its own "
                "burstiness (the gaps' SCV)"]
    rise = total.sized / np.maximum(total.offered_rps, 1e-300)
    above = int(np.count_nonzero(rise > 1.1))
    note = ("each window is sized for the highest rate the curve reaches inside it (linear "
            "between its points), not its mean")
    if above:
        j = int(np.argmax(total.sized - total.offered_rps))
        note += (f"; {above} window(s) peak over 10% above their mean (most: window {j}, "
                 f"{total.sized[j]:.3g} req/s against a mean of {total.offered_rps[j]:.3g})")
    return [note]


def _day_requests(days: Sequence[LaneDay], plan: PlanFile, total: WindowSeries
                  ) -> Requests | None:
    """The requests of every lane, merged in arrival order: a trace's own, a rate curve's
    drawn (_curve_requests); None when no lane has a trace or a curve (a steady rate)."""
    if not any(ln.is_day for ln in plan.workloads):
        return None
    rng = np.random.default_rng(REPLAY_SEED)
    traces = [d.requests if d.requests is not None else _curve_requests(d, ln, total, rng)
              for d, ln in zip(days, plan.workloads, strict=True)]
    if len(traces) == 1:
        return traces[0]
    t = np.concatenate([r.arrival_at_s for r in traces])
    order = np.argsort(t, kind="stable")
    return Requests(t[order], np.concatenate([r.input_tokens for r in traces])[order],
                    np.concatenate([r.output_tokens for r in traces])[order],
                    np.zeros(len(t), np.int64))

