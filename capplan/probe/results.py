"""Serving-benchmark levels: summaries, ingestion of saved results, and the latency-law fit.

Every reader maps a tool's metrics onto vLLM's definitions (docs/probe.md has the table):
TTFT; TBT = vLLM's ITL, the gap between consecutive tokens over all gaps of all requests;
TPOT = vLLM's per-request (E2E - TTFT) / (output tokens - 1); E2E.

- `vllm bench serve --save-result` JSON (vllm/benchmarks/serve.py): mean/median/std/pNN of
  ttft, tpot, itl, e2el in ms; the per-request lists (ttfts, itls, input_lens, output_lens)
  only with --save-detailed, and then every statistic is recomputed from them.
- GuideLLM reports ({"benchmarks": [...]}): inter_token_latency_ms is the per-request mean
  (E2E - TTFT) / (N - 1), i.e. vLLM's TPOT; time_per_output_token_ms divides by N instead.
- LLMPerf summaries (results_*): inter_token_latency_s is E2E / N per request (the first
  token's wait included; token_benchmark_ray.py), converted to TPOT through E2E and TTFT.
- AIPerf profile_export_aiperf.json ({"records": {...}}) and genai-perf
  profile_export_genai_perf.json: inter_token_latency = (E2E - TTFT) / (N - 1) per request
  (vLLM's TPOT); inter_chunk_latency is every gap (vLLM's ITL when a chunk holds one token).
- SGLang bench_serving JSONL (python/sglang/bench_serving.py): the vLLM keys, with
  e2e_latency_ms for e2el.

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
    """mean, p50 (median) and every pNN the file holds for `metric` (vLLM/SGLang *_ms keys)."""
    def g(key: str) -> float | None:
        v = d.get(key)
        return None if v is None else float(v) * MS
    out = {"mean": g(f"mean_{metric}_ms"), "p50": g(f"median_{metric}_ms"),
           "p90": g(f"p90_{metric}_ms"), "p99": g(f"p99_{metric}_ms")}
    for key in d:  # --metric-percentiles 50,90,95,99 writes p50_ttft_ms ... p99_ttft_ms
        if key.startswith("p") and key.endswith(f"_{metric}_ms"):
            q = key[1:-len(f"_{metric}_ms")]
            if q.replace(".", "", 1).isdigit():
                out[f"p{q}"] = g(key)
    return out


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
              "errors": errors,
              "note": "no per-request lists: percentiles are the file's own pNN keys; rerun "
                      "vllm bench serve with --save-detailed to recompute them"}
    if d.get("request_goodput") is not None:  # only when the run had --goodput SLOs
        lv["request_goodput_per_s"] = float(d["request_goodput"])
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
            # inter_token_latency: per-request (E2E - TTFT) / (N - 1), vLLM's TPOT. Its mean
            # equals the mean gap (vLLM's ITL mean) when outputs have equal lengths; the
            # gap percentiles are not in the report.
            "tbt_s": _mean_only(_gl_stats(m.get("inter_token_latency_ms"), MS)),
            "tpot_s": _gl_stats(m.get("inter_token_latency_ms"), MS),
            # time_per_output_token: (E2E - TTFT) / N, kept under its own name
            "guidellm_time_per_output_token_s": _gl_stats(
                m.get("time_per_output_token_ms"), MS),
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


def _mean_only(st: dict[str, float | None]) -> dict[str, float | None]:
    return {"mean": st.get("mean"), "p50": None, "p90": None, "p99": None}


def _q(d: dict[str, Any], prefix: str, scale: float = 1.0) -> dict[str, float | None]:
    """LLMPerf results_<metric>_quantiles_pNN / _mean keys."""
    def g(key: str) -> float | None:
        v = d.get(key)
        return None if v is None else float(v) * scale
    return {"mean": g(f"{prefix}_mean"), "p50": g(f"{prefix}_quantiles_p50"),
            "p90": g(f"{prefix}_quantiles_p90"), "p95": g(f"{prefix}_quantiles_p95"),
            "p99": g(f"{prefix}_quantiles_p99")}


def from_llmperf(d: dict[str, Any], name: str) -> dict[str, Any]:
    """A level from an LLMPerf *_summary.json (token_benchmark_ray.py).

    LLMPerf's inter_token_latency_s is E2E / N per request, the first token's wait included.
    vLLM's TPOT is (E2E - TTFT) / (N - 1): from the means, (E2E_mean - TTFT_mean) / (N - 1),
    exact when every request has the same N (stddev_output_tokens 0), else an estimate.
    """
    conc = d.get("num_concurrent_requests")
    if conc is None:
        raise InputError(f"{name}: LLMPerf summary without num_concurrent_requests")
    ttft, e2e = _q(d, "results_ttft_s"), _q(d, "results_end_to_end_latency_s")
    n_out = float(d.get("results_number_output_tokens_mean") or 0)
    tpot = None
    if n_out > 1 and ttft["mean"] is not None and e2e["mean"] is not None:
        tpot = (e2e["mean"] - ttft["mean"]) / (n_out - 1)
    tpot_st = {"mean": tpot, "p50": None, "p90": None, "p99": None}
    n_in = float(d.get("results_number_input_tokens_mean") or 0)
    exact = float(d.get("results_number_output_tokens_stddev") or 0) == 0
    return {"concurrency": int(conc), "ttft_s": ttft, "tbt_s": dict(tpot_st),
            "tpot_s": tpot_st, "e2e_s": e2e,
            "llmperf_inter_token_latency_s": _q(d, "results_inter_token_latency_s"),
            "output_tokens_per_s": float(d.get("results_mean_output_throughput_token_per_s",
                                               0.0)),
            "requests_per_s": float(d.get("results_num_completed_requests_per_min", 0)) / 60,
            "completed": int(d.get("results_num_completed_requests", 0)),
            "errors": int(d.get("results_number_errors", 0)),
            "mean_input_tokens": n_in, "mean_context_tokens": n_in + n_out / 2,
            "note": "TPOT = (E2E - TTFT) / (N - 1) from the means"
                    + ("" if exact else " (output lengths vary: an estimate)"),
            "source": f"llmperf ({name})"}


_AIPERF_NAMES = {"ttft": ("ttft", "time_to_first_token"),
                 "tpot": ("inter_token_latency",),
                 "tbt": ("inter_chunk_latency",),
                 "e2e": ("request_latency",)}
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


def _ai_metric(rec: dict[str, Any], names: tuple[str, ...]) -> dict[str, float | None] | None:
    for n in names:
        m = rec.get(n)
        if isinstance(m, dict) and m.get("avg") is not None:
            k = _UNIT_S.get(str(m.get("unit", "ms")), MS)
            out: dict[str, float | None] = {"mean": float(m["avg"]) * k}
            for q in ("p50", "p90", "p95", "p99"):
                out[q] = None if m.get(q) is None else float(m[q]) * k
            return out
    return None


def _ai_value(rec: dict[str, Any], name: str) -> float | None:
    m = rec.get(name)
    return float(m["avg"]) if isinstance(m, dict) and m.get("avg") is not None else None


def from_aiperf(d: dict[str, Any], name: str) -> dict[str, Any]:
    """A level from AIPerf profile_export_aiperf.json or genai-perf
    profile_export_genai_perf.json (metric -> {unit, avg, p50, p90, p99...})."""
    rec = d.get("records") if isinstance(d.get("records"), dict) else d
    cfg = d.get("input_config") or {}
    conc = (cfg.get("loadgen") or {}).get("concurrency") or cfg.get("concurrency")
    if conc is None:
        raise InputError(f"{name}: no loadgen concurrency in input_config (a request-rate "
                         "run is open loop; capplan fits closed-loop levels)")
    ttft = _ai_metric(rec, _AIPERF_NAMES["ttft"])
    tpot = _ai_metric(rec, _AIPERF_NAMES["tpot"])
    if ttft is None or tpot is None:
        raise InputError(f"{name}: needs ttft and inter_token_latency (a streaming run)")
    tbt = _ai_metric(rec, _AIPERF_NAMES["tbt"]) or _mean_only(tpot)
    n_in = _ai_value(rec, "input_sequence_length")
    n_out = _ai_value(rec, "output_sequence_length")
    lv: dict[str, Any] = {
        "concurrency": int(conc), "ttft_s": ttft, "tbt_s": tbt, "tpot_s": tpot,
        "e2e_s": _ai_metric(rec, _AIPERF_NAMES["e2e"]) or _mean_only({}),
        "output_tokens_per_s": _ai_value(rec, "output_token_throughput") or 0.0,
        "requests_per_s": _ai_value(rec, "request_throughput") or 0.0,
        "completed": int(_ai_value(rec, "request_count") or 0),
        "errors": int(_ai_value(rec, "error_request_count") or 0),
        "source": f"{'aiperf' if 'records' in d else 'genai-perf'} ({name})"}
    if n_in is not None and n_out is not None:
        lv["mean_input_tokens"] = n_in
        lv["mean_context_tokens"] = n_in + n_out / 2
    return lv


def from_sglang(d: dict[str, Any], name: str) -> dict[str, Any]:
    """A level from one line of SGLang bench_serving's --output-file JSONL."""
    conc = d.get("max_concurrency")
    if conc is None:
        raise InputError(f"{name}: max_concurrency is null (an open-loop run); capplan fits "
                         "closed-loop levels: rerun bench_serving with --max-concurrency")
    lv = {"concurrency": int(conc), "ttft_s": _ms_stats(d, "ttft"),
          "tbt_s": _ms_stats(d, "itl"), "tpot_s": _ms_stats(d, "tpot"),
          "e2e_s": _ms_stats(d, "e2e_latency"), "completed": int(d.get("completed", 0)),
          "errors": 0, "output_tokens_per_s": float(d.get("output_throughput", 0.0)),
          "requests_per_s": float(d.get("request_throughput", 0.0)),
          "source": f"sglang bench_serving ({name})"}
    done = max(int(d.get("completed", 0)), 1)
    if d.get("total_input_tokens") is not None and d.get("total_output_tokens") is not None:
        n_in = float(d["total_input_tokens"]) / done
        lv["mean_input_tokens"] = n_in
        lv["mean_context_tokens"] = n_in + float(d["total_output_tokens"]) / done / 2
    return lv


def _read_json_or_lines(p: Path) -> list[Any]:
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from e
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as first:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) < 2:
            raise InputError(f"{p}:{first.lineno}: not JSON: {first.msg}") from first
        out = []
        for i, ln in enumerate(lines, 1):
            try:
                out.append(json.loads(ln))
            except json.JSONDecodeError as e:
                raise InputError(f"{p}:{i}: not JSON: {e.msg}") from e
        return out


def _levels_from(d: Any, p: Path) -> list[dict[str, Any]]:
    if not isinstance(d, dict):
        raise InputError(f"{p}: expected a JSON object")
    if "benchmarks" in d:
        return from_guidellm(d, p.name)
    if "results_ttft_s_mean" in d:
        return [from_llmperf(d, p.name)]
    if "records" in d or ("time_to_first_token" in d and "input_config" in d):
        return [from_aiperf(d, p.name)]
    if "mean_e2e_latency_ms" in d:
        return [from_sglang(d, p.name)]
    if "mean_ttft_ms" in d or "ttfts" in d:
        return [from_vllm(d, p.name)]
    raise InputError(f"{p}: not a result file capplan reads (vllm bench serve, GuideLLM, "
                     "LLMPerf summary, AIPerf/genai-perf export, SGLang bench_serving)")


def load_results(paths: list[Path]) -> list[dict[str, Any]]:
    """Levels from benchmark result files (any mix of the formats above), by concurrency."""
    levels: list[dict[str, Any]] = []
    for p in paths:
        for d in _read_json_or_lines(p):
            levels += _levels_from(d, p)
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
