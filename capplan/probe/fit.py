"""Fit a Calibration to measured step times: scipy.optimize.least_squares on relative error.

The residual of sample i is `predicted_i / measured_i - 1`, where the prediction is the
step-time model itself (`build_step_model(model, gpu, settings, candidate).decode_step(...)`
or `.prefill_chunk(...)`), so a fitted calibration is exactly what `capplan speed` uses.
Microbenchmarks pin the fractions they measure directly, as weak priors
`sqrt(PRIOR_WEIGHT) * log(param / measured)`: copy bandwidth -> mem_bw_frac, the best bf16
matrix product -> gemm_frac, decode attention KV bandwidth -> attn_bw_frac, causal prefill
attention FLOP/s -> attn_frac. Bounds: fractions in (0, 1], overheads >= 0. A soft-L1 loss
(f_scale 10%) keeps one noisy sample (a shared CPU, a clock change) from dragging the fit.
Reference: scipy.optimize.least_squares (trust-region reflective, Branch et al. 1999).
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from capplan.catalog.host import host_device
from capplan.catalog.schema import GpuSpec, ModelSpec
from capplan.models.calibration import Calibration
from capplan.models.engine import EngineSettings
from capplan.models.perf import build_step_model
from capplan.units import GIGA, MIB_BYTES, TERA

FIT_PARAMS = ("mem_bw_frac", "gemm_frac", "gemm_half_tokens", "attn_frac", "attn_bw_frac",
              "step_overhead_s", "per_seq_overhead_s")
FEW_SAMPLE_PARAMS = ("mem_bw_frac", "gemm_frac", "attn_bw_frac", "step_overhead_s")
"""With fewer than three step samples more than parameters, only the parameters every
step sample has leverage on are fitted; the rest keep the microbenchmark or default values."""
_BOUNDS = {"gemm_half_tokens": (0.0, 1e5), "step_overhead_s": (0.0, 10.0),
           "per_seq_overhead_s": (0.0, 1.0)}
_FRAC_BOUNDS = (1e-4, 1.0)
_SCALE_FLOOR = {"gemm_half_tokens": 1.0, "step_overhead_s": 1e-5, "per_seq_overhead_s": 1e-7}
PRIOR_WEIGHT = 1.0
"""A microbenchmark prior weighs like this many step samples."""


@dataclass(frozen=True)
class FitResult:
    calibration: Calibration
    before: dict[str, float]
    """median_rel_error, worst_rel_error of the starting calibration."""
    after: dict[str, float]
    n_samples: int
    rows: list[dict[str, Any]]
    """Per sample: kind, batch/context or chunk, measured_s, before_s, after_s."""
    priors: dict[str, float]
    fitted: tuple[str, ...] = ()
    """The parameters the least-squares fit set (empty when the microbenchmarks alone or the
    default predicted the samples better and were kept)."""
    warnings: list[str] = field(default_factory=list)
    """Signs of a bad run (a cold start, a busy machine): samples out of order, a fixed overhead
    that dominates the steps while the fit misses them (sample_warnings)."""


OUT_OF_ORDER = 1.25
"""A step with more work (a larger batch, context or chunk) measured this many times faster
than one with less is out of order: noise far past a median's."""
OVERHEAD_SHARE, OVERHEAD_WORST = 0.5, 0.25
"""A fitted fixed overhead over half the fastest step, while the fit still misses a sample by
over 25%, is a cold or busy run absorbed as an overhead, not a kernel-launch cost."""


def _work_key(s: dict[str, Any]) -> tuple[str, float, float]:
    if s["kind"] == "decode_step":
        return "decode", float(s["batch"]), float(s["context_len"])
    return "prefill", float(s["chunk_tokens"]), float(s.get("prefix_tokens", 0))


def _name(s: dict[str, Any]) -> str:
    if s["kind"] == "decode_step":
        return f"decode b{s['batch']} c{s['context_len']}"
    return f"prefill {s['chunk_tokens']}"


def sample_warnings(fit_s: list[dict[str, Any]], cal: Calibration, worst_rel_error: float
                    ) -> list[str]:
    """Warnings for a run whose step times cannot all be right: a step with at least as much
    work in every dimension measured OUT_OF_ORDER times faster, and a fitted fixed overhead
    that is most of the fastest step while the fit misses a sample by OVERHEAD_WORST."""
    out = []
    pairs = []
    for a in fit_s:
        for b in fit_s:
            ka, kb = _work_key(a), _work_key(b)
            if a is b or ka[0] != kb[0] or not (kb[1] >= ka[1] and kb[2] >= ka[2]):
                continue
            if b["time_s"] * OUT_OF_ORDER < a["time_s"]:
                pairs.append(f"{_name(b)} {b['time_s'] * 1e3:.1f} ms < {_name(a)} "
                             f"{a['time_s'] * 1e3:.1f} ms")
    if pairs:
        shown = "; ".join(pairs[:3]) + (f"; {len(pairs) - 3} more" if len(pairs) > 3 else "")
        out.append(f"{len(pairs)} steps with more work measured faster than steps with less "
                   f"({shown}): the machine was cold or busy during the run; run calibrate "
                   "again on an idle machine")
    fastest = min((s["time_s"] for s in fit_s), default=0.0)
    overhead = float(cal.step_overhead_s or 0.0)
    if fastest > 0 and overhead > OVERHEAD_SHARE * fastest and worst_rel_error > OVERHEAD_WORST:
        out.append(f"the fit puts a fixed overhead of {overhead * 1e3:.1f} ms into every step "
                   f"({overhead / fastest:.0%} of the fastest, {fastest * 1e3:.1f} ms) and "
                   f"still misses a step by {worst_rel_error:.0%}: a cold start (the first "
                   "run after boot) or a busy machine, not a launch cost; run calibrate again")
    return out


def step_samples(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decoder-step samples to fit: CUDA-graph decode steps when there are any."""
    dec = [s for s in samples if s.get("kind") == "decode_step"]
    if any(s.get("cuda_graphs") for s in dec):
        dec = [s for s in dec if s.get("cuda_graphs")]
    pre = [s for s in samples if s.get("kind") == "prefill_step"]
    return [s for s in dec + pre if s.get("time_s", 0) > 0]


def predict_s(model: ModelSpec, gpu: GpuSpec, cal: Calibration,
              samples: list[dict[str, Any]], settings: EngineSettings | None = None
              ) -> np.ndarray:
    """Step-model seconds for each decode_step / prefill_step sample."""
    sm = build_step_model(model, gpu, settings or EngineSettings(), cal)
    out = np.zeros(len(samples))
    dec = np.array([s["kind"] == "decode_step" for s in samples], bool)
    if dec.any():
        b = np.array([s["batch"] for s, d in zip(samples, dec, strict=True) if d], float)
        c = np.array([s["context_len"] for s, d in zip(samples, dec, strict=True) if d], float)
        out[dec] = sm.decode_step(b, c)["step_s"]
    if (~dec).any():
        ch = np.array([s["chunk_tokens"] for s, d in zip(samples, dec, strict=True) if not d],
                      float)
        pre = np.array([s.get("prefix_tokens", 0) for s, d in zip(samples, dec, strict=True)
                        if not d], float)
        out[~dec] = sm.prefill_chunk(ch, pre)["step_s"]
    return out


def rel_errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    err = np.abs(pred / meas - 1.0)
    return {"median_rel_error": float(np.median(err)) if err.size else math.nan,
            "worst_rel_error": float(np.max(err)) if err.size else math.nan}


def microbench_priors(samples: list[dict[str, Any]], gpu: GpuSpec) -> dict[str, float]:
    """Fractions of the GPU's peaks reached by the microbenchmarks (capped at 1)."""
    def best(kind: str, key: str, **match: Any) -> float | None:
        vals = [s[key] for s in samples if s.get("kind") == kind
                and all(s.get(k) == v for k, v in match.items())]
        return max(vals) if vals else None

    bw, flops = gpu.hbm_bytes_per_s, gpu.dense_flops_per_s("bf16")
    found = {"mem_bw_frac": (best("copy", "bytes_per_s"), bw),
             "gemm_frac": (best("gemm", "flops_per_s", dtype="bf16"), flops),
             "gemm_frac_low_precision": (best("gemm", "flops_per_s", dtype="fp8"),
                                         gpu.dense_flops_per_s("fp8")),
             "attn_bw_frac": (best("attn_decode", "bytes_per_s", layout="contiguous"), bw),
             "attn_frac": (best("attn_prefill", "flops_per_s"), flops)}
    return {k: float(min(1.0, v / peak)) for k, (v, peak) in found.items() if v}


def _start_value(base: Calibration, name: str) -> float:
    """A parameter's starting value; host costs left to the engine profile start from vLLM's
    (the probe's PyTorch steps are measured without an engine)."""
    from capplan.models.engine import VLLM

    v = getattr(base, name)
    return float(getattr(VLLM, name) if v is None else v)


def _bounds(name: str) -> tuple[float, float]:
    return _BOUNDS.get(name, _FRAC_BOUNDS)


def fit_calibration(model: ModelSpec, gpu: GpuSpec, samples: list[dict[str, Any]],
                    base: Calibration, priors: dict[str, float] | None = None,
                    source: str = "measured (capplan calibrate)") -> FitResult:
    """Least-squares fit of FIT_PARAMS to the decoder-step samples (see module docstring).

    Args:
        model, gpu: what was measured (gpu may be the host-CPU spec of `host_gpu_spec`).
        samples: raw samples; decode_step/prefill_step ones are fitted.
        base: the starting calibration (datasheet default); unfitted fields keep its values.
        priors: measured fractions (from `microbench_priors`) pinning the fit.
    """
    from scipy.optimize import least_squares

    fit_s = step_samples(samples)
    if not fit_s:
        raise ValueError("no decoder-step samples to fit")
    meas = np.array([s["time_s"] for s in fit_s], float)
    all_priors = dict(priors or {})
    names = FIT_PARAMS if len(fit_s) >= len(FIT_PARAMS) + 3 else FEW_SAMPLE_PARAMS
    priors = {k: v for k, v in all_priors.items() if k in FIT_PARAMS}
    start = base.with_(**{k: v for k, v in priors.items() if k not in names})
    x0 = np.array([priors.get(n, _start_value(base, n)) for n in names], float)
    lo = np.array([_bounds(n)[0] for n in names])
    hi = np.array([_bounds(n)[1] for n in names])
    x0 = np.clip(x0, lo + 1e-12, hi)
    scale = np.maximum(np.abs(x0), [_SCALE_FLOOR.get(n, 1e-3) for n in names])
    w = math.sqrt(PRIOR_WEIGHT)

    def cal_of(x: np.ndarray) -> Calibration:
        return start.with_(**dict(zip(names, map(float, x), strict=True)), source=source)

    def resid(x: np.ndarray) -> np.ndarray:
        r = predict_s(model, gpu, cal_of(x), fit_s) / meas - 1.0
        pr = [w * math.log(x[i] / priors[n]) for i, n in enumerate(names) if n in priors]
        return np.concatenate([r, np.array(pr, float)])

    sol = least_squares(resid, x0, bounds=(lo, hi), x_scale=scale, method="trf",
                        loss="soft_l1", f_scale=0.1, max_nfev=400 * len(names))
    cal = cal_of(sol.x)
    # The priors can outvote a handful of noisy step samples; never hand back a calibration
    # that predicts its own samples worse than the microbenchmarks alone, or the default.
    candidates = [cal, start.with_(source=source), base.with_(source=source)]
    errs = [rel_errors(predict_s(model, gpu, c, fit_s), meas)["median_rel_error"]
            for c in candidates]
    chosen = int(np.argmin(errs))
    cal = candidates[chosen]
    if "gemm_frac_low_precision" in all_priors:  # fp8 GEMMs: pinned by the microbenchmark only
        cal = cal.with_(gemm_frac_low_precision=all_priors["gemm_frac_low_precision"])
    before = predict_s(model, gpu, base, fit_s)
    after = predict_s(model, gpu, cal, fit_s)
    rows = [{**_label(s), "measured_s": float(m), "before_s": float(b0), "after_s": float(a)}
            for s, m, b0, a in zip(fit_s, meas, before, after, strict=True)]
    errs_after = rel_errors(after, meas)
    return FitResult(calibration=cal, before=rel_errors(before, meas), after=errs_after,
                     n_samples=len(fit_s), rows=rows, priors=all_priors,
                     fitted=tuple(names) if chosen == 0 else (),
                     warnings=sample_warnings(fit_s, cal, errs_after["worst_rel_error"]))


def _label(s: dict[str, Any]) -> dict[str, Any]:
    if s["kind"] == "decode_step":
        return {"kind": "decode", "batch": s["batch"], "context_len": s["context_len"]}
    return {"kind": "prefill", "batch": 1, "context_len": s["chunk_tokens"]}


# ---------------------------------------------------------------------------------------------
def host_label() -> str:
    """A hostname-free label of this CPU: architecture and logical core count."""
    return f"cpu-{platform.machine().lower() or 'unknown'}-{os.cpu_count() or 1}c"


def host_memory_mib() -> float:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / MIB_BYTES
    except (ValueError, OSError, AttributeError):
        return 1024.0


def host_peaks(samples: list[dict[str, Any]]) -> tuple[float, float]:
    """(bytes/s, FLOP/s) the host CPU reached in the microbenchmarks: its effective peaks."""
    bws = [s["bytes_per_s"] for s in samples if s.get("kind") in ("copy", "attn_decode")]
    bws += [s["k"] * s["n"] * 2 / s["time_s"] for s in samples
            if s.get("kind") == "gemm" and s.get("tokens") == 1]
    flops = [s["flops_per_s"] for s in samples
             if s.get("kind") in ("gemm", "attn_prefill") and s.get("dtype", "bf16") == "bf16"]
    if not bws or not flops:
        raise ValueError("no copy/GEMM samples to estimate the host's peaks from")
    return max(bws), max(flops)


def host_gpu_spec(samples: list[dict[str, Any]]) -> GpuSpec:
    """A GpuSpec for the host CPU, its 'peaks' the best rates measured in this run."""
    bw, flops = host_peaks(samples)
    return host_device(host_label(), f"host CPU ({platform.processor() or platform.machine()})",
                       host_memory_mib(), bw / GIGA, flops / TERA)