"""Metrics of a simulated run: latency percentiles, throughput, goodput, batch, KV, Little's law.

Definitions follow `vllm bench serve`: TTFT = first token - arrival; TBT = every gap between
consecutive output tokens of a request; TPOT = (E2E - TTFT) / (output tokens - 1) per request
(requests with one output token have none); queueing delay = first scheduled - arrival.
Percentiles use the inverted-CDF definition (the smallest value with at least q% of the samples
at or below it), which stays exact for the weighted TBT samples.

Warm-up: every request is reported, from the first arrival to the last completion (the measured
window, whose length is the makespan); no warm-up or cool-down is cut, so short runs at high load
include the ramp-up and the drain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from capplan.sim.entities import RunRecord, StepSummary
from capplan.sim.stability import arrival_window
from capplan.sim.workload import Lane

QUANTILES = (50, 90, 99)
LATENCY_KEYS = ("ttft_s", "tbt_s", "e2e_s", "tpot_s", "queue_s")
SERIES_POINTS = 200


def _percentiles(values: np.ndarray, weights: np.ndarray | None, qs: tuple[float, ...]
                 ) -> list[float]:
    """Inverted-CDF percentiles of `values` repeated `weights` times (NaN when empty), one
    sort for all of `qs` (unweighted: a plain sort, the same values as the weighted path with
    unit weights). Zero weights stay in: their cumulative weight equals the entry before
    theirs, so `searchsorted(side="left")` for a positive target never lands on one (no
    filtered copies)."""
    v = np.asarray(values, float)
    if weights is None:
        sv = np.sort(v)
        cw = np.arange(1, len(sv) + 1, dtype=float)
    else:
        order = np.argsort(v, kind="stable")
        sv = v[order]
        cw = np.asarray(weights, float)[order]
        del order
        np.cumsum(cw, out=cw)
    if not len(sv) or cw[-1] <= 0:
        return [float("nan")] * len(qs)
    out = []
    for q in qs:
        # at least the smallest positive float: q = 0 lands on the first weighted entry
        target = max(q / 100.0 * cw[-1] * (1 - 1e-12), 5e-324)
        i = int(np.searchsorted(cw, target, side="left"))
        out.append(float(sv[min(i, len(sv) - 1)]))
    return out


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Inverted-CDF percentile of `values` repeated `weights` times (NaN when empty)."""
    return _percentiles(values, weights, (q,))[0]


def summary(values: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """{mean, p50, p90, p99} of values (optionally weighted)."""
    v = np.asarray(values, float)
    w = np.ones_like(v) if weights is None else np.asarray(weights, float)
    tot = float(w.sum())
    out = {"mean": float(np.dot(v, w) / tot) if tot > 0 else float("nan")}
    for q, x in zip(QUANTILES, _percentiles(v, weights, QUANTILES), strict=True):
        out[f"p{q}"] = x
    return out


@dataclass(frozen=True)
class SimResult:
    """Metrics of one run (SI units); `to_dict()` gives the CLI's JSON keys."""

    scheduler: str
    ttft_s: dict[str, float]
    tbt_s: dict[str, float]
    e2e_s: dict[str, float]
    tpot_s: dict[str, float]
    queue_s: dict[str, float]
    output_tokens_per_s: float
    input_tokens_per_s: float
    requests_per_s: float
    goodput_requests_per_s: float
    mean_running_batch: float
    preemptions: int
    kv_peak_utilization: float
    mean_in_system: float
    num_requests: int
    makespan_s: float
    lanes: dict[str, dict[str, Any]] = field(default_factory=dict)
    time_series: dict[str, list[float]] = field(default_factory=dict)
    input_tokens_total: int = 0
    prefix_hit_tokens: int = 0
    """Prompt tokens served by the prefix cache (`to_dict` has it when non-zero;
    `capplan.plan.simulation.run_simulation` adds 0 whenever the run used the cache)."""
    arrival_window: dict[str, float] = field(default_factory=dict)
    """The backlog test's counts over the second half of the arrivals
    (`capplan.sim.stability.arrival_window`)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler, "num_requests": self.num_requests,
            "makespan_s": self.makespan_s,
            **{k: getattr(self, k) for k in LATENCY_KEYS},
            "output_tokens_per_s": self.output_tokens_per_s,
            "input_tokens_per_s": self.input_tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "goodput_requests_per_s": self.goodput_requests_per_s,
            "mean_running_batch": self.mean_running_batch,
            "preemptions": self.preemptions,
            "kv_peak_utilization": self.kv_peak_utilization,
            "mean_in_system": self.mean_in_system,
            "lanes": self.lanes,
            "time_series": self.time_series,
            "arrival_window": self.arrival_window,
            **({"prefix_hit_tokens": self.prefix_hit_tokens,
                "prefix_hit_frac": self.prefix_hit_tokens / max(self.input_tokens_total, 1)}
               if self.prefix_hit_tokens else {}),
        }


def _per_request(r: RunRecord) -> dict[str, np.ndarray]:
    ttft = r.first_token_at_s - r.arrival_at_s
    e2e = r.finished_at_s - r.arrival_at_s
    out = r.output_tokens.astype(float)
    multi = out > 1
    tpot = np.where(multi, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    return {"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot,
            # a closed-loop request admitted in the step its predecessor ended can read
            # -1e-15 s from float rounding of the two stamps: a wait is never negative
            "queue_s": np.maximum(r.admitted_at_s - r.arrival_at_s, 0.0)}


def _slo_met(r: RunRecord, lanes: tuple[Lane, ...], per: dict[str, np.ndarray]) -> np.ndarray:
    ok = np.ones(len(r.lane), bool)
    for i, ln in enumerate(lanes):
        m = r.lane == i
        if ln.ttft_slo_s is not None:
            ok[m] &= per["ttft_s"][m] <= ln.ttft_slo_s
        if ln.tpot_slo_s is not None:
            ok[m] &= ~(per["tpot_s"][m] > ln.tpot_slo_s)
    return ok


def series_steps(num_steps: int) -> np.ndarray:
    """The steps the time series shows: SERIES_POINTS evenly spaced over the run (all when
    fewer)."""
    if num_steps <= 0:
        return np.zeros(0, np.int64)
    n = num_steps
    return np.unique(np.linspace(0, n - 1, min(n, SERIES_POINTS)).round().astype(np.int64))


def step_summary(r: RunRecord) -> StepSummary:
    """The aggregate of a RunRecord's per-step arrays (`RunRecord.steps` when the engine built
    it in its loop)."""
    if r.steps is not None:
        return r.steps
    idx = series_steps(len(r.step_start_s))
    dur = r.step_dur_s
    return StepSummary(
        num_steps=len(dur), tbt_gap_s=r.step_tbt_gap_s, tbt_count=r.step_tbt_count,
        running_s=float(np.dot(r.step_running, dur)),
        in_system_s=float(np.dot(r.step_running + r.step_waiting, dur)),
        kv_blocks_max=int(r.step_kv_blocks.max()) if len(dur) else 0,
        series_start_s=r.step_start_s[idx], series_running=r.step_running[idx],
        series_waiting=r.step_waiting[idx], series_kv_blocks=r.step_kv_blocks[idx])


def _series(st: StepSummary, num_gpu_blocks: int) -> dict[str, list[float]]:
    return {"time_s": st.series_start_s.tolist(),
            "running": st.series_running.astype(float).tolist(),
            "waiting": st.series_waiting.astype(float).tolist(),
            "kv_utilization": (st.series_kv_blocks / max(num_gpu_blocks, 1)).tolist()}


def summarize(r: RunRecord, lanes: tuple[Lane, ...]) -> SimResult:
    """SimResult of a run over all requests (no warm-up cut; see the module docstring)."""
    per = _per_request(r)
    n = len(r.arrival_at_s)
    t0 = float(r.arrival_at_s.min()) if n else 0.0
    makespan = float(r.finished_at_s.max()) - t0 if n else 0.0
    span = makespan if makespan > 0 else float("nan")
    ok = _slo_met(r, lanes, per)
    # Time-weighted means over the window: idle time counts as zero.
    st = step_summary(r)
    running = st.running_s / span
    # Little's law over the window: each request is in the system from its arrival to its last
    # token, also while no step runs (a static batch filling), which step sums would leave out
    in_system = float(np.nansum(r.finished_at_s - r.arrival_at_s)) / span
    lane_out: dict[str, dict[str, Any]] = {}
    if len(lanes) > 1:
        for i, ln in enumerate(lanes):
            m = r.lane == i
            if not m.any():
                continue
            lane_out[ln.name] = {
                **{k: summary(v[m][~np.isnan(v[m])]) for k, v in per.items()},
                "num_requests": int(m.sum()),
                "requests_per_s": float(m.sum()) / span,
                "goodput_requests_per_s": float(ok[m].sum()) / span,
                "output_tokens_per_s": float(r.output_tokens[m].sum()) / span,
            }
    tbt_v = np.concatenate([st.tbt_gap_s, r.extra_gaps_s])
    tbt_w = np.concatenate([st.tbt_count, np.ones(len(r.extra_gaps_s))])
    return SimResult(
        scheduler=r.scheduler,
        ttft_s=summary(per["ttft_s"]),
        tbt_s=summary(tbt_v, tbt_w),
        e2e_s=summary(per["e2e_s"]),
        tpot_s=summary(per["tpot_s"][~np.isnan(per["tpot_s"])]),
        queue_s=summary(per["queue_s"]),
        output_tokens_per_s=float(r.output_tokens.sum()) / span,
        input_tokens_per_s=float(r.input_tokens.sum()) / span,
        requests_per_s=n / span,
        goodput_requests_per_s=float(ok.sum()) / span,
        mean_running_batch=running,
        preemptions=int(r.preemptions),
        kv_peak_utilization=st.kv_blocks_max / r.num_gpu_blocks if st.num_steps else 0.0,
        mean_in_system=in_system,
        num_requests=n,
        makespan_s=makespan,
        lanes=lane_out,
        time_series=_series(st, r.num_gpu_blocks),
        input_tokens_total=int(r.input_tokens.sum()),
        prefix_hit_tokens=int(r.prefix_hit_tokens),
        arrival_window=arrival_window(r.arrival_at_s, r.first_token_at_s, r.finished_at_s),
    )
