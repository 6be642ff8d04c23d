"""Serving-benchmark levels: summaries, ingestion of saved results, and the latency-law fit.

Inputs: `vllm bench serve --save-result` JSON (keys of vllm/benchmarks/serve.py: date, backend,
model_id, max_concurrency, duration, completed, total_output_tokens, request_throughput,
output_throughput, mean/median/std/pXX_{ttft,tpot,itl,e2el}_ms, and the per-request lists
input_lens, output_lens, ttfts, itls, errors) and GuideLLM reports ({"benchmarks": [...]},
each with config.strategy and metrics.{time_to_first_token_ms, inter_token_latency_ms,
request_latency, output_tokens_per_second, requests_per_second, request_totals}, every metric
a status distribution {successful: {mean, median, percentiles: {p50, p90, p99...}}}).

Fit: TBT = a + b * concurrency by least squares over levels (a decode step's time grows
linearly with the batch while it is memory bound). With --gpu and a catalog --model, the
step model without overheads is subtracted first, leaving step_overhead_s + per_seq_overhead_s
* concurrency: a Calibration-compatible pair.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.limits import read_text

MS = 1e-3


def stats(values: list[float]) -> dict[str, float | None]:
    """{mean, p50, p90, p99} of values (numpy linear percentiles, as vLLM's benchmark)."""
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    a = np.asarray(values, float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def level_summary(concurrency: int, ttfts: list[float], itls: list[float], e2es: list[float],
                  tpots: list[float], output_tokens: int, completed: int, duration_s: float,
                  errors: int, **extra: Any) -> dict[str, Any]:
    """One level in the CLI contract's shape (SI units)."""
    dur = duration_s if duration_s > 0 else math.nan
    return {"concurrency": concurrency, "ttft_s": stats(ttfts), "tbt_s": stats(itls),
            "tpot_s": stats(tpots), "e2e_s": stats(e2es),
            "output_tokens_per_s": output_tokens / dur if completed else 0.0,
            "requests_per_s": completed / dur if completed else 0.0,
            "completed": completed, "errors": errors, **extra}


# ---------------------------------------------------------------------------------------------
def _ms_stats(d: dict[str, Any], metric: str) -> dict[str, float | None]:
    def g(key: str) -> float | None:
        v = d.get(key)
        return None if v is None else float(v) * MS
    return {"mean": g(f"mean_{metric}_ms"), "p50": g(f"median_{metric}_ms"),
            "p90": g(f"p90_{metric}_ms"), "p99": g(f"p99_{metric}_ms")}


def from_vllm(d: dict[str, Any], name: str) -> dict[str, Any]:
    """A level from one `vllm bench serve --save-result` file."""
    conc = d.get("max_concurrency")
    if conc is None:
        raise InputError(f"{name}: max_concurrency is null (an open-loop run); capplan fits "
                         "closed-loop levels: rerun with --max-concurrency")
    ttfts = [x for x in d.get("ttfts") or [] if x]
    itls = [g for row in d.get("itls") or [] for g in row]
    errors = sum(1 for e in d.get("errors") or [] if e)
    if ttfts and itls:  # raw per-request data: recompute every statistic the same way
        out_lens = d.get("output_lens") or []
        ok = [(t, o, it) for t, o, it in zip(d["ttfts"], out_lens, d["itls"], strict=False) if t]
        e2es = [t + sum(it) for t, _o, it in ok]
        tpots = [sum(it) / (o - 1) for _t, o, it in ok if o > 1]
        lv = level_summary(int(conc), ttfts, itls, e2es, tpots,
                           int(d.get("total_output_tokens", 0)), int(d.get("completed", 0)),
                           float(d.get("duration", 0)), errors)
    else:
        lv = {"concurrency": int(conc), "ttft_s": _ms_stats(d, "ttft"),
              "tbt_s": _ms_stats(d, "itl"), "tpot_s": _ms_stats(d, "tpot"),
              "e2e_s": _ms_stats(d, "e2el"), "completed": int(d.get("completed", 0)),
              "errors": errors}
    lv["output_tokens_per_s"] = float(d.get("output_throughput", lv.get("output_tokens_per_s")))
    lv["requests_per_s"] = float(d.get("request_throughput", lv.get("requests_per_s")))
    ins, outs = d.get("input_lens") or [], d.get("output_lens") or []
    if ins and outs:
        lv["mean_context_tokens"] = float(np.mean(ins) + np.mean(outs) / 2)
        lv["mean_input_tokens"] = float(np.mean(ins))
    lv["source"] = f"vllm bench serve ({name})"
    return lv


def _gl_stats(metric: dict[str, Any] | None, scale: float) -> dict[str, float | None]:
    s = (metric or {}).get("successful") or {}
    pct = s.get("percentiles") or {}

    def g(v: Any) -> float | None:
        return None if v is None else float(v) * scale
    return {"mean": g(s.get("mean")), "p50": g(pct.get("p50", s.get("median"))),
            "p90": g(pct.get("p90")), "p99": g(pct.get("p99"))}


def _gl_concurrency(bm: dict[str, Any]) -> int | None:
    for holder in (bm.get("config"), bm.get("args"), bm):
        strat = (holder or {}).get("strategy") or {}
        if strat.get("streams"):
            return int(strat["streams"])
        if strat.get("type_") == "synchronous":
            return 1
    return None


def from_guidellm(d: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """One level per concurrent/synchronous benchmark of a GuideLLM report."""
    levels = []
    for bm in d.get("benchmarks") or []:
        conc = _gl_concurrency(bm)
        if conc is None:
            continue  # rate-based (poisson, constant, throughput) runs are open loop
        m = bm.get("metrics") or {}
        totals = m.get("request_totals") or {}
        levels.append({
            "concurrency": conc,
            "ttft_s": _gl_stats(m.get("time_to_first_token_ms"), MS),
            "tbt_s": _gl_stats(m.get("inter_token_latency_ms"), MS),
            "tpot_s": _gl_stats(m.get("time_per_output_token_ms"), MS),
            "e2e_s": _gl_stats(m.get("request_latency"), 1.0),
            "output_tokens_per_s": _gl_stats(m.get("output_tokens_per_second"), 1.0)["mean"],
            "requests_per_s": _gl_stats(m.get("requests_per_second"), 1.0)["mean"],
            "completed": int(totals.get("successful", 0)),
            "errors": int(totals.get("errored", 0)) + int(totals.get("incomplete", 0)),
            "source": f"guidellm ({name})"})
    if not levels:
        raise InputError(f"{name}: no concurrent or synchronous benchmark in this GuideLLM "
                         "report (rate-based runs are open loop)")
    return levels


def load_results(paths: list[Path]) -> list[dict[str, Any]]:
    """Levels from vLLM and GuideLLM result files, sorted by concurrency."""
    levels: list[dict[str, Any]] = []
    for p in paths:
        try:
            d = json.loads(read_text(p, "results file"))
        except OSError as e:
            raise InputError(f"{p}: cannot read ({e.strerror or e})") from e
        except json.JSONDecodeError as e:
            raise InputError(f"{p}:{e.lineno}: not JSON: {e.msg}") from e
        if isinstance(d, dict) and "benchmarks" in d:
            levels += from_guidellm(d, p.name)
        elif isinstance(d, dict) and ("mean_ttft_ms" in d or "ttfts" in d):
            levels.append(from_vllm(d, p.name))
        else:
            raise InputError(f"{p}: neither a `vllm bench serve --save-result` file nor a "
                             "GuideLLM report")
    return sorted(levels, key=lambda lv: lv["concurrency"])


# ---------------------------------------------------------------------------------------------
def _line(x: np.ndarray, y: np.ndarray) -> dict[str, float] | None:
    if len(x) == 0:
        return None
    if len(set(x.tolist())) < 2:
        return {"intercept_s": float(y.mean()), "per_concurrency_s": 0.0, "n_levels": len(x)}
    b, a = np.polyfit(x, y, 1)
    return {"intercept_s": float(a), "per_concurrency_s": float(b), "n_levels": len(x)}


def fit_levels(levels: list[dict[str, Any]], model: str | None = None, gpu: str | None = None,
               catalog: Any = None) -> dict[str, Any]:
    """TBT and TTFT laws over concurrency; overheads when the model and GPU are known."""
    use = [lv for lv in levels if (lv.get("tbt_s") or {}).get("mean") is not None]
    c = np.array([lv["concurrency"] for lv in use], float)
    tbt = np.array([lv["tbt_s"]["mean"] for lv in use], float)
    ttft = np.array([lv["ttft_s"]["mean"] for lv in use], float)
    fit: dict[str, Any] = {"tbt_law": _line(c, tbt), "ttft_law": _line(c, ttft),
                           "calibration_params": {}}
    if not use:
        fit["note"] = "no level completed a request: nothing to fit"
        return fit
    if model and gpu and catalog is not None:
        from capplan.models.calibration import default_calibration
        from capplan.models.engine import EngineSettings
        from capplan.models.perf import build_step_model

        spec, g = catalog.model(model), catalog.gpu(gpu)
        bare = default_calibration(g).with_(step_overhead_s=0.0, per_seq_overhead_s=0.0)
        ctx = np.array([_mean_context(lv) for lv in use], float)
        sm = build_step_model(spec, g, EngineSettings(), bare)
        resid = tbt - sm.decode_step(c, ctx)["step_s"]
        law = _line(c, resid) or {}
        fit["gpu_key"] = g.key
        params = {"step_overhead_s": max(0.0, law.get("intercept_s", 0.0)),
                  "per_seq_overhead_s": max(0.0, law.get("per_concurrency_s", 0.0))}
        # Per-request cost outside the engine steps (tokenisation, HTTP, streaming): TTFT at the
        # lowest concurrency minus the model's prefill of that prompt and half a step of
        # waiting, with the overheads just fitted.
        low = int(np.argmin(c))
        if "mean_input_tokens" in use[low]:
            fitted = bare.with_(**params)
            sm2 = build_step_model(spec, g, EngineSettings(), fitted)
            prompt = float(use[low]["mean_input_tokens"])
            pre = float(sm2.prefill_time(prompt, EngineSettings().max_num_batched_tokens))
            half = 0.5 * float(sm2.decode_step(max(c[low], 1.0), ctx[low])["step_s"])
            params["request_overhead_s"] = max(0.0, float(ttft[low]) - pre - half)
        fit["calibration_params"] = params
        fit["note"] = (f"overheads: measured TBT minus the step model for {spec.key} on {g.key} "
                       "(default efficiencies), fitted as a + b x concurrency")
    else:
        fit["note"] = "pass --gpu G and a catalog --model to derive step_overhead_s"
    return fit


def _mean_context(level: dict[str, Any]) -> float:
    """Mean context during decode: input + half the output (1024 when unknown)."""
    return float(level.get("mean_context_tokens", 1024))


def write_levels_calibration(path: Path, levels: list[dict[str, Any]], fit: dict[str, Any]
                             ) -> None:
    """A calibration file holding the derivable overheads (needs --gpu)."""
    from capplan.catalog.calibration import (
        CalibrationFile,
        CalibrationParams,
        write_calibration,
    )

    if not fit.get("calibration_params") or not fit.get("gpu_key"):
        raise InputError("--out with --endpoint/--from-results needs --gpu G and a catalog "
                         "--model to derive calibration parameters")
    write_calibration(path, CalibrationFile(
        gpu=fit["gpu_key"], kind="measured", measured={"method": "serving benchmark levels"},
        params=CalibrationParams(**fit["calibration_params"]), fit=fit, samples=levels))
