"""The fleet replay's spec and results (`capplan.sim.fleet` re-exports them), and how the
results are computed from per-request times and the replicas' token-gap samples: per window
(requests by arrival window, token gaps by the window their step starts in) and over the
whole replay (docs/fleet.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from capplan.sim.entities import RunRecord, StepSummary
from capplan.sim.metrics import QUANTILES, _percentiles
from capplan.sim.stability import arrival_window, backlog_grows
from capplan.sim.workload import Requests

if TYPE_CHECKING:
    from capplan.plan.deployment import Deployment

NEVER = math.inf


@dataclass(frozen=True)
class FleetReplaySpec:
    """What to replay: requests (open loop, sorted by arrival), one replica's deployment, the
    schedule of replica counts and the router."""

    requests: Requests
    """The workload's requests (`capplan.sim.workload.Requests`: arrival_at_s, input_tokens,
    output_tokens), sorted by arrival."""
    engine_config: Deployment
    """One replica (`capplan.plan.deployment.Deployment`, what `run_simulation` takes)."""
    windows: Sequence[tuple[float, float, int]]
    """(start_s, end_s, replicas), contiguous and in order; arrivals after the last end count
    in the last window (its replica count stays)."""
    router: str = "least-outstanding"
    startup_lag_s: float = 0.0
    """Seconds from a scale-up decision (its window's start) until the new replica serves."""
    slo_ttft_s: float | None = None
    slo_tbt_s: float | None = None
    slo_e2e_s: float | None = None
    """Per-request targets for attainment: TTFT <= slo_ttft_s, TPOT (the request's mean gap
    between tokens) <= slo_tbt_s and E2E <= slo_e2e_s."""
    sim_engine: str = "auto"
    """The single-replica simulator (`capplan.sim.engine_impl`)."""


@dataclass(frozen=True)
class WindowStats:
    """One window of a replay (SI units); requests are counted in their arrival window, tokens
    and TBT gaps in the window where the token came."""

    start_s: float
    end_s: float
    replicas: int
    offered_rps: float
    """Arrivals in the window / its length."""
    served_rps: float
    """Completions in the window / its length."""
    ttft_p99_s: float
    """Over the window's arrivals that completed (NaN when none)."""
    tbt_p99_s: float
    """Over the token gaps ending in the window (NaN when none)."""
    attainment: float | None
    """Fraction of the window's arrivals that completed within the SLOs (None without SLOs;
    unfinished requests miss)."""
    completed: int
    unfinished: int
    e2e_p99_s: float = math.nan
    """Over the window's arrivals that completed (NaN when none)."""
    tpot_p99_s: float = math.nan
    tpot_mean_s: float = math.nan
    """Of the window's completed arrivals with more than one output token, each request's
    mean gap between tokens, (E2E - TTFT) / (output tokens - 1) (NaN when none)."""
    overloaded: bool = False
    """The backlog test (capplan.sim.stability) over the window's own arrivals: the number of
    them waiting for a first token grew beyond a stable queue's spread in the second half of
    the window (the fleet served less than it was offered)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class FleetReplayResult:
    """Per-window and whole-replay metrics, and per replica what it served."""

    windows: list[WindowStats]
    num_requests: int
    completed: int
    unfinished: int
    ttft_s: dict[str, float]
    tbt_s: dict[str, float]
    attainment: float | None
    makespan_s: float
    replica_seconds: float
    """Sum over replicas of the time each was up (from its scale-up decision to the end of its
    drain or of the replay): what the schedule pays for."""
    router: str
    per_replica: list[dict[str, Any]] = field(default_factory=list)
    """Per replica: `requests`, `completed`, `ready_at_s`, `stop_at_s` (None: never drains),
    `ttft_p99_s`, `e2e_p99_s`, `preemptions`, `prefix_hit_tokens` (prompt tokens found in its
    prefix cache), `arrival_window` (its backlog test's counts, capplan.sim.stability)."""
    arrival_window: dict[str, float] = field(default_factory=dict)
    """The fleet's backlog test over all arrivals (capplan.sim.stability.arrival_window)."""
    record: RunRecord | None = field(default=None, repr=False)
    """The completed requests as one run (`capplan.sim.metrics.summarize` gives the fleet's
    latency and throughput keys; its step aggregates are the replicas' summed)."""

    def to_dict(self) -> dict[str, Any]:
        return {"router": self.router, "num_requests": self.num_requests,
                "completed": self.completed, "unfinished": self.unfinished,
                "ttft_s": self.ttft_s, "tbt_s": self.tbt_s, "attainment": self.attainment,
                "makespan_s": self.makespan_s, "replica_seconds": self.replica_seconds,
                "windows": [w.to_dict() for w in self.windows],
                "per_replica": self.per_replica}


# -- metrics ---------------------------------------------------------------------------------
@dataclass
class _Times:
    """Per request (in the spec's order) its times; NaN when unfinished; TBT samples; the
    replicas' step aggregates summed (running and in-system integrals) or maxed (KV blocks)."""

    first_s: np.ndarray
    finish_s: np.ndarray
    tbt_at_s: list[np.ndarray]
    tbt_gap_s: list[np.ndarray]
    tbt_w: list[np.ndarray]
    admitted_s: np.ndarray | None = None
    agg: dict[str, float] = field(default_factory=dict)
    replica: np.ndarray | None = None
    """Per request its replica (-1: never routed)."""


def _p99(v: np.ndarray, w: np.ndarray | None = None) -> float:
    return _percentiles(v, w, (99,))[0]


def _summary(v: np.ndarray, w: np.ndarray | None = None) -> dict[str, float]:
    w1 = np.ones(len(v)) if w is None else w
    tot = float(w1.sum())
    out = {"mean": float(np.dot(v, w1) / tot) if tot > 0 else float("nan")}
    out.update({f"p{q}": x for q, x in zip(QUANTILES, _percentiles(v, w, QUANTILES),
                                           strict=True)})
    return out


def _tpot(spec: FleetReplaySpec, tm: _Times) -> np.ndarray:
    """Per request its TPOT, (finish - first token) / (output tokens - 1); 0 for one token,
    NaN when unfinished."""
    out = np.asarray(spec.requests.output_tokens, float)
    return np.where(out > 1, (tm.finish_s - tm.first_s) / np.maximum(out - 1, 1), 0.0)


def _attained(spec: FleetReplaySpec, arr: np.ndarray, tm: _Times) -> np.ndarray | None:
    if spec.slo_ttft_s is None and spec.slo_tbt_s is None and spec.slo_e2e_s is None:
        return None
    ok = np.isfinite(tm.finish_s)
    if spec.slo_ttft_s is not None:
        ok &= tm.first_s - arr <= spec.slo_ttft_s
    if spec.slo_tbt_s is not None:
        ok &= _tpot(spec, tm) <= spec.slo_tbt_s
    if spec.slo_e2e_s is not None:
        ok &= tm.finish_s - arr <= spec.slo_e2e_s
    return ok


def _by_window(win: np.ndarray, nw: int, values: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(order, bounds): `order` groups indices by window (within a window ascending by
    `values` when given, so each window's percentile sort meets sorted input), window j's
    indices are order[bounds[j]:bounds[j + 1]]; one sort instead of a mask per window."""
    order = np.arange(len(win)) if values is None else np.argsort(values)
    order = order[np.argsort(win[order], kind="stable")]
    return order, np.searchsorted(win[order], np.arange(nw + 1), side="left")


def _window_stats(spec: FleetReplaySpec, w: np.ndarray, tm: _Times) -> list[WindowStats]:
    arr = np.asarray(spec.requests.arrival_at_s, float)
    nw = len(w)
    starts = w[:, 0]
    # arrival window (arrivals beyond the last end count in the last window)
    win = np.clip(np.searchsorted(starts, arr, side="right") - 1, 0, nw - 1)
    done = np.isfinite(tm.finish_s)
    fin_win = np.clip(np.searchsorted(starts, tm.finish_s[done], side="right") - 1, 0, nw - 1)
    served = np.bincount(fin_win, minlength=nw)
    ok = _attained(spec, arr, tm)
    ttft = tm.first_s - arr
    e2e = tm.finish_s - arr
    tpot = _tpot(spec, tm)
    multi = np.asarray(spec.requests.output_tokens) > 1
    tat = np.concatenate(tm.tbt_at_s) if tm.tbt_at_s else np.zeros(0)
    tgap = np.concatenate(tm.tbt_gap_s) if tm.tbt_gap_s else np.zeros(0)
    tw = np.concatenate(tm.tbt_w) if tm.tbt_w else np.zeros(0)
    twin = np.clip(np.searchsorted(starts, tat, side="right") - 1, 0, nw - 1)
    ro, rb = _by_window(win, nw, np.where(done, ttft, np.inf))
    to, tbnd = _by_window(twin, nw, tgap)
    out = []
    for j, (s, e, n) in enumerate(w):
        m = ro[rb[j]:rb[j + 1]]  # the window's arrivals, by TTFT
        md = m[done[m]]
        mt = to[tbnd[j]:tbnd[j + 1]]
        length = float(e - s)
        mp = md[multi[md]]
        out.append(WindowStats(
            start_s=float(s), end_s=float(e), replicas=int(n),
            offered_rps=len(m) / length, served_rps=float(served[j]) / length,
            ttft_p99_s=_p99(ttft[md]), tbt_p99_s=_p99(tgap[mt], tw[mt]),
            attainment=(float(ok[m].mean()) if ok is not None and len(m)
                        else (None if ok is None else float("nan"))),
            completed=len(md), unfinished=len(m) - len(md), e2e_p99_s=_p99(e2e[md]),
            tpot_p99_s=_p99(tpot[mp]),
            tpot_mean_s=float(tpot[mp].mean()) if len(mp) else math.nan,
            overloaded=backlog_grows(arrival_window(arr[m], tm.first_s[m], tm.finish_s[m]))))
    return out


def _result(spec: FleetReplaySpec, w: np.ndarray, tm: _Times, decided: np.ndarray,
            stop: np.ndarray, per: list[dict[str, Any]]) -> FleetReplayResult:
    arr = np.asarray(spec.requests.arrival_at_s, float)
    done = np.isfinite(tm.finish_s)
    end = float(np.nanmax(tm.finish_s)) if done.any() else float(w[-1, 1])
    end = max(end, float(w[-1, 1]))
    up = 0.0
    for r, p in enumerate(per):  # up from the decision until stopped and drained
        last = p.get("last_finish_s", -NEVER)
        off = end if not math.isfinite(stop[r]) else max(stop[r], last)
        up += max(float(off - decided[r]), 0.0)
        if tm.replica is not None:
            m = (tm.replica == r) & done
            p["completed"] = int(m.sum())
            p["ttft_p99_s"] = _p99((tm.first_s - arr)[m])
            p["e2e_p99_s"] = _p99((tm.finish_s - arr)[m])
            mine = tm.replica == r
            p["arrival_window"] = arrival_window(arr[mine], tm.first_s[mine],
                                                 tm.finish_s[mine])
    ok = _attained(spec, arr, tm)
    tgap = np.concatenate(tm.tbt_gap_s) if tm.tbt_gap_s else np.zeros(0)
    tw = np.concatenate(tm.tbt_w) if tm.tbt_w else np.zeros(0)
    return FleetReplayResult(
        record=fleet_record(spec, tm, tgap, tw),
        windows=_window_stats(spec, w, tm), num_requests=len(arr),
        completed=int(done.sum()), unfinished=int((~done).sum()),
        ttft_s=_summary((tm.first_s - arr)[done]), tbt_s=_summary(tgap, tw),
        attainment=None if ok is None else float(ok.mean()) if len(ok) else float("nan"),
        makespan_s=(end - float(arr.min())) if len(arr) else 0.0, replica_seconds=up,
        router=spec.router, per_replica=per,
        arrival_window=arrival_window(arr, tm.first_s, tm.finish_s))


def fleet_record(spec: FleetReplaySpec, tm: _Times, tbt_gap_s: np.ndarray,
                 tbt_w: np.ndarray) -> RunRecord:
    """The completed requests as one RunRecord (arrivals as offered, not as dispatched), the
    step aggregates of all replicas (`summarize` reads `steps`)."""
    reqs = spec.requests
    done = np.isfinite(tm.finish_s)
    pool = spec.engine_config.pool
    z, zi = np.zeros(0), np.zeros(0, np.int64)
    steps = StepSummary(
        num_steps=max(len(tbt_gap_s), 1), tbt_gap_s=np.asarray(tbt_gap_s, float),
        tbt_count=np.asarray(tbt_w, float), running_s=float(tm.agg.get("running_s", 0.0)),
        in_system_s=float(tm.agg.get("in_system_s", 0.0)),
        kv_blocks_max=int(tm.agg.get("kv_blocks_max", 0)), series_start_s=z,
        series_running=zi, series_waiting=zi, series_kv_blocks=zi)
    adm = tm.admitted_s if tm.admitted_s is not None else tm.first_s
    return RunRecord(
        arrival_at_s=np.asarray(reqs.arrival_at_s, float)[done], admitted_at_s=adm[done],
        first_token_at_s=tm.first_s[done], finished_at_s=tm.finish_s[done],
        input_tokens=np.asarray(reqs.input_tokens)[done],
        output_tokens=np.asarray(reqs.output_tokens)[done], lane=np.asarray(reqs.lane)[done],
        step_start_s=z, step_dur_s=z, step_tbt_count=zi, step_tbt_gap_s=z, extra_gaps_s=z,
        step_running=zi, step_waiting=zi, step_kv_blocks=zi,
        num_gpu_blocks=pool.layout.sim_blocks(pool.num_blocks),  # the loop's block unit
        preemptions=int(tm.agg.get("preemptions", 0)), scheduler="continuous", steps=steps,
        prefix_hit_tokens=int(tm.agg.get("prefix_hit_tokens", 0)))
