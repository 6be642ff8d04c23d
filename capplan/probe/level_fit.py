"""Host costs fitted from serving-benchmark levels through the model that predicts them.

A calibration must reproduce the measurements it was fitted from, so each level's mean TBT and
TTFT are predicted by the analytic model `capplan latency` uses for that protocol
(`capplan.plan.load.analytic_latency`: the closed-loop benchmark model of
models/closed_loop.py for C clients sending N requests; the open-loop queue of
models/queueing at the level's measured rate), on the deployment of the engine profile the
levels were measured under (`--engine`, `--tp`; verify: the plan's), and the parameters
minimise the relative error of those predictions (`scipy.optimize.least_squares`):

- `step_overhead_s` and `per_seq_overhead_s` from every level's TBT. Under host overlap (vLLM
  async scheduling, the SGLang and TensorRT-LLM overlap schedulers) the per-sequence host work
  hides under the GPU's step (`perf.combine_parts`: fixed + max(gpu, host)), so a straight line
  through "TBT minus the GPU step" is not this model's fit: a per-sequence cost fitted that way
  adds to every step and vanishes under the overlap (docs/engines.md, "Host costs");
- `request_overhead_s` from the mean TTFT at the lowest concurrency, where queueing adds
  least: the overhead that makes the model's TTFT there equal the measured one (the same model
  decides how long an arrival waits for a step: docs/engines.md, "Scheduling a step ahead").

The fit is started from several points (the straight line's, and per-sequence costs at which
the host work of each level equals its GPU step), since max(gpu, host) is flat in the
per-sequence cost while the GPU step is the larger. Levels without prompt and output lengths
fall back to the decode step (`StepModel.decode_step` at batch = concurrency, context 1024)
for TBT and give no request overhead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from capplan.catalog.calibration import REQUEST_S, STEP_S
from capplan.errors import InputError

ROUND_TRIP_TOLERANCE = 0.03
"""Relative error within which a fitted calibration reproduces what it was fitted from when
the model can (tests/probe/test_level_fit.py); each fit reports its own (`round_trip`)."""
UNKNOWN_CONTEXT_TOKENS = 1024.0
"""Decode context assumed for a level that does not say its lengths."""
_BAD = 10.0
"""Residual of a prediction the model cannot make (an open loop past its capacity)."""


@dataclass(frozen=True)
class Target:
    """One level as the forward model takes it (SI units)."""

    concurrency: int
    rate_per_s: float | None
    """Open loop: the rate the requests were sent at, else the measured completion rate (None:
    a closed loop of `concurrency` clients)."""
    input_tokens: float | None
    output_tokens: float | None
    num_prompts: int
    tbt_s: float | None
    ttft_s: float | None
    context_tokens: float

    @property
    def full(self) -> bool:
        """Lengths known (and a rate for an open loop): the whole latency model applies."""
        return self.input_tokens is not None and (
            self.rate_per_s is None or self.rate_per_s > 0)


def target_of(level: dict[str, Any], centre: Any) -> Target:
    """A level's figures: TBT and TTFT `centre`d (mean, else median), its lengths, its load."""
    n_in = level.get("mean_input_tokens")
    ctx = level.get("mean_context_tokens")
    n_out = 2 * (float(ctx) - float(n_in)) if n_in is not None and ctx is not None else None
    full = n_in is not None and n_out is not None and n_out >= 1
    open_loop = bool(level.get("open_loop")) or "in_flight_mean" in level
    # an open loop's load is the rate it was sent at (capplan verify: arrival_rate_per_s);
    # completed / duration is diluted by the drain after the last arrival
    sent = level.get("arrival_rate_per_s") or level.get("requests_per_s")
    rate = float(sent or 0.0) if open_loop else None
    return Target(int(level["concurrency"]), rate, float(n_in) if full else None,
                  n_out if full else None,
                  max(int(level.get("completed") or 0) + int(level.get("errors") or 0), 1),
                  centre(level, "tbt_s"), centre(level, "ttft_s"),
                  float(ctx) if ctx is not None else UNKNOWN_CONTEXT_TOKENS)


def predict(dep: Any, t: Target, step_s: float, seq_s: float, request_s: float | None
            ) -> tuple[float | None, float | None]:
    """(mean TBT, mean TTFT) the model predicts for level `t` with these host costs (None
    request_s: the deployment's own request overhead); TTFT None without lengths."""
    from capplan.models.queueing import LengthStats
    from capplan.plan.load import LoadSpec, analytic_latency

    changes: dict[str, float] = {"step_overhead_s": step_s, "per_seq_overhead_s": seq_s}
    if request_s is not None:
        changes["request_overhead_s"] = request_s
    d = replace(dep, step=replace(dep.step, **changes))
    if not t.full:
        step = d.step.decode_step(max(t.concurrency, 1), t.context_tokens, detail=False)
        return float(np.asarray(step["step_s"])), None
    load = LoadSpec(t.rate_per_s, None if t.rate_per_s else t.concurrency,
                    LengthStats.fixed(t.input_tokens), LengthStats.fixed(t.output_tokens),
                    num_prompts=t.num_prompts)
    res = analytic_latency(d, load)
    return (res["tbt_s"] or {}).get("mean"), (res["ttft_s"] or {}).get("mean")


def _rel(pred: float | None, meas: float) -> float:
    return _BAD if pred is None or not np.isfinite(pred) else pred / meas - 1.0


@dataclass(frozen=True)
class _Problem:
    dep: Any
    targets: list[Target]
    ttft_at: int | None
    """Index of the level whose TTFT fixes the request overhead (None: not fitted)."""
    seq_s: float | None
    """The per-sequence cost when the levels cannot tell it (one load): not fitted."""

    @property
    def names(self) -> list[str]:
        return ["step_overhead_s", *(["per_seq_overhead_s"] if self.seq_s is None else []),
                *(["request_overhead_s"] if self.ttft_at is not None else [])]

    def costs(self, x: np.ndarray) -> tuple[float, float, float | None]:
        """(step, per-sequence, request) costs of the parameter vector x (`names`)."""
        got = dict(zip(self.names, (float(v) for v in x), strict=True))
        seq = got.get("per_seq_overhead_s", self.seq_s)
        return got["step_overhead_s"], float(seq or 0.0), got.get("request_overhead_s")

    def residuals(self, x: np.ndarray) -> np.ndarray:
        out = []
        for i, t in enumerate(self.targets):
            tbt, ttft = predict(self.dep, t, *self.costs(x))
            if t.tbt_s:
                out.append(_rel(tbt, t.tbt_s))
            if i == self.ttft_at and t.ttft_s:
                out.append(_rel(ttft, t.ttft_s))
        return np.asarray(out, float)


def _starts(p: _Problem) -> list[np.ndarray]:
    """Starting points: the straight line through TBT minus the GPU step (exact without host
    overlap) and per-sequence costs at which each level's host work matches its GPU step."""
    ts = [t for t in p.targets if t.tbt_s]
    c = np.array([max(t.concurrency, 1) for t in ts], float)
    ctx = np.array([t.context_tokens for t in ts], float)
    bare = replace(p.dep.step, step_overhead_s=0.0, per_seq_overhead_s=0.0)
    gpu = np.asarray(bare.decode_step(c, ctx, detail=False)["step_s"], float)
    resid = np.array([t.tbt_s for t in ts], float) - gpu
    b0, a0 = np.polyfit(c, resid, 1) if len(set(c.tolist())) > 1 else (0.0, resid.mean())
    seqs = [p.seq_s] if p.seq_s is not None else sorted(
        {max(float(b0), 0.0), 0.0, *(float(g / n * 1.2) for g, n in zip(gpu, c, strict=True))})
    r0: list[float] = []
    if p.ttft_at is not None:
        t = p.targets[p.ttft_at]
        pre = float(bare.prefill_time(t.input_tokens, p.dep.settings.max_num_batched_tokens))
        r0 = [max(float(t.ttft_s) - pre, 0.0)]
    return [np.array([max(float(a0) - (b if p.seq_s is None else 0.0), 0.0),
                      *([b] if p.seq_s is None else []), *r0]) for b in seqs]


_UPPER = {"step_overhead_s": STEP_S, "per_seq_overhead_s": STEP_S,
          "request_overhead_s": REQUEST_S}
"""Bounds of the fitted costs: CalibrationParams' (capplan/catalog/calibration.py)."""
_SCALE = {"step_overhead_s": 1e-3, "per_seq_overhead_s": 1e-4, "request_overhead_s": 1e-2}


FLAT_RMS = 0.01
"""Freeing per_seq_overhead_s must lower the levels' RMS relative error by more than this (in
quadrature: sum of squares by n x 0.01^2) for the levels to pin it; otherwise the residual
surface is flat along it (TBT flat over concurrency, within the model's reach either way) and
the engine profile's value is kept."""


def _solve(p: _Problem) -> Any:
    """The least-squares solution of `p` from its best starting point."""
    from scipy.optimize import least_squares

    hi = np.array([_UPPER[k] for k in p.names])
    best = None
    for x0 in _starts(p):
        sol = least_squares(p.residuals, np.minimum(x0, hi / 2), bounds=(0.0 * hi, hi),
                            x_scale=np.array([_SCALE[k] for k in p.names]), diff_step=1e-4,
                            xtol=1e-10, ftol=1e-10, max_nfev=200)
        if best is None or sol.cost < best.cost:
            best = sol
    assert best is not None, "at least one starting point"
    return best


def fit_targets(dep: Any, targets: list[Target]) -> dict[str, Any]:
    """Host costs that make `dep`'s model reproduce the targets (least squares, relative
    errors), with each level's measured and predicted figures. With one load only (one
    concurrency or rate) the per-sequence cost cannot be told from the fixed one: it keeps the
    engine profile's; so it does when fitting it improves the levels' error by under FLAT_RMS
    (`per_seq`: "fitted", "one load" or "flat")."""
    with_ttft = [i for i, t in enumerate(targets) if t.full and t.ttft_s]
    ttft_at = min(with_ttft, key=lambda i: targets[i].concurrency) if with_ttft else None
    loads = {(t.concurrency, t.rate_per_s) for t in targets if t.tbt_s}
    default_seq = float(dep.profile.per_seq_overhead_s)
    p = _Problem(dep, targets, ttft_at, None if len(loads) > 1 else default_seq)
    best = _solve(p)
    per_seq = "fitted" if p.seq_s is None else "one load"
    if p.seq_s is None:
        kept = _Problem(dep, targets, ttft_at, default_seq)
        alt = _solve(kept)
        # least_squares' cost is half the sum of squares
        if 2 * (alt.cost - best.cost) <= len(best.fun) * FLAT_RMS ** 2:
            p, best, per_seq = kept, alt, "flat"
    step_s, seq_s, request_s = p.costs(best.x)
    params = {"step_overhead_s": step_s, "per_seq_overhead_s": seq_s}
    if request_s is not None:
        params["request_overhead_s"] = request_s
    rows = []
    for t in targets:
        tbt, ttft = predict(dep, t, step_s, seq_s, request_s)
        rows.append({"concurrency": t.concurrency, "open_loop": t.rate_per_s is not None,
                     "forward_model": "latency" if t.full else "decode step",
                     "tbt_measured_s": t.tbt_s, "tbt_predicted_s": tbt,
                     "ttft_measured_s": t.ttft_s, "ttft_predicted_s": ttft})
    return {"params": params, "levels": rows, "per_seq_fitted": per_seq == "fitted",
            "per_seq": per_seq,
            "ttft_level": targets[ttft_at].concurrency if ttft_at is not None else None}


def fit_deployment(cat: Any, model: str, gpu: str, options: Any) -> Any:
    """The deployment the levels ran on, with the datasheet efficiencies and no host costs
    (what `load_calibration` fills around the fitted ones: calibration_from_file)."""
    from capplan.models.calibration import default_calibration
    from capplan.plan.deployment import resolve_deployment

    g = cat.gpu(gpu)
    bare = default_calibration(g).with_(step_overhead_s=0.0, per_seq_overhead_s=0.0)
    dep = resolve_deployment(cat, model, g.key, options, bare)
    if not dep.memory.fits:
        raise InputError(f"{dep.model.key} does not fit on {g.key} with TP {dep.settings.tp} "
                         f"under {dep.profile.label}: {dep.memory.reason}; give the TP the "
                         "server ran (--tp)")
    return dep
