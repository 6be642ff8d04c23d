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

Fit: TBT = a + b * concurrency by least squares over levels, a description of the data (a
decode step's time grows linearly with the batch while it is memory bound). With --gpu and a
catalog --model, the host costs of a calibration (step_overhead_s, per_seq_overhead_s,
request_overhead_s) are fitted through the engine's own latency model (probe/level_fit.py),
so the calibration reproduces the levels it came from.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from capplan.errors import CapplanError, InputError
from capplan.limits import read_text
from capplan.probe import sources
from capplan.probe.report_formats import (
    from_aiperf,
    from_llmperf,
    from_sglang,
    mean_only,
    ms_stats,
    num,
    open_loop_level,
    whole,
)
from capplan.probe.spec_metrics import pooled_acceptance_length

MS = 1e-3
FORMATS = ("vllm bench serve --save-result, GuideLLM report, LLMPerf summary, AIPerf / "
           "genai-perf export (or AIPerf profile_export.jsonl records), SGLang bench_serving "
           "JSONL")
"""The results files `calibrate --from-results` reads (any mix)."""


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
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def goodput_per_s(per_request_s: dict[str, list[float]], slo_s: dict[str, float],
                  duration_s: float) -> float:
    """Requests per second that met every given SLO, as `vllm bench serve --goodput` counts
    them (vllm/benchmarks/serve.py calculate_metrics): a request is good when each metric
    named in slo_s (ttft, tpot, e2el; seconds) is at most its threshold; good / duration."""
    names = [m for m in GOODPUT_METRICS if m in slo_s]
    if not names or duration_s <= 0:
        return 0.0
    rows = zip(*(per_request_s[m] for m in names), strict=True)
    good = sum(1 for row in rows if all(v <= slo_s[m] for m, v in zip(names, row, strict=True)))
    return good / duration_s


MAX_LATENCY_S = 86_400.0
"""Longest per-request latency a results file may hold (limits.DURATION_S: a day); past it a
mean of 1e308-second gaps overflowed to an internal error."""


def _check_latencies(d: dict[str, Any], name: str) -> None:
    """vLLM's per-request lists (seconds): every TTFT and gap a number in [0, a day]."""
    rows = d.get("itls") or []
    if not isinstance(rows, list) or not isinstance(d.get("ttfts") or [], list):
        raise InputError(f"{name}: ttfts and itls must be lists")
    for key, vals in (("ttfts", d.get("ttfts") or []),
                      ("itls", [g for r in rows for g in (r if isinstance(r, list) else [r])])):
        for x in vals:
            if x is None and key == "ttfts":
                continue  # a failed request
            if isinstance(x, bool) or not isinstance(x, int | float) or not (
                    0 <= x <= MAX_LATENCY_S):
                raise InputError(f"{name}: {key} holds {str(x)[:20]}; a latency is a number of "
                                 f"seconds in [0, {MAX_LATENCY_S:,.0f}]")


PER_REQUEST_LISTS = ("ttfts", "itls", "output_lens", "input_lens")
"""vLLM's --save-detailed lists: one entry per request sent, failed ones included."""


def _check_consistent(d: dict[str, Any], name: str) -> None:
    """A vLLM results file whose counts disagree is refused, naming the mismatch: per-request
    lists of different lengths (40 ttfts beside 5 itls: which request a gap belongs to is
    lost), more requests completed than listed, or none completed (its summary figures then
    describe no request)."""
    lens = {k: len(d[k]) for k in PER_REQUEST_LISTS if isinstance(d.get(k), list) and d[k]}
    if len(set(lens.values())) > 1:
        shown = ", ".join(f"{n} {k}" for k, n in lens.items())
        raise InputError(f"{name}: the per-request lists differ in length ({shown}); "
                         "vllm bench serve --save-detailed writes one entry per request")
    done = d.get("completed")
    if done is not None:
        done = whole(done, "completed", name)
    if done is not None and lens and done > max(lens.values()):
        raise InputError(f"{name}: completed {done} but the per-request lists hold "
                         f"{max(lens.values())} requests")
    if done is not None and done == 0:
        raise InputError(f"{name}: completed 0: no request finished in this run, so its "
                         "latencies describe nothing (see its errors)")


def from_vllm(d: dict[str, Any], name: str, slo_s: dict[str, float] | None = None
              ) -> dict[str, Any]:
    """A level from one `vllm bench serve --save-result` file; with SLOs (seconds) and the
    per-request lists, also the goodput vLLM's --goodput would report. A run without
    --max-concurrency gets its concurrency from Little's law (report_formats.open_loop_level)."""
    conc = d.get("max_concurrency")
    _check_latencies(d, name)
    _check_consistent(d, name)
    ttfts = [x for x in d.get("ttfts") or [] if x]
    itls = [g for row in d.get("itls") or [] for g in row]
    errors = sum(1 for e in d.get("errors") or [] if e)
    if ttfts and itls:  # raw per-request data: recompute every statistic the same way
        out_lens = d.get("output_lens") or []
        ok = [(t, o, it) for t, o, it in zip(d["ttfts"], out_lens, d["itls"], strict=False) if t]
        e2es = [t + sum(it) for t, _o, it in ok]
        tpots = [sum(it) / (o - 1) for _t, o, it in ok if o > 1]
        lv = level_summary(0, ttfts, itls, e2es, tpots,
                           whole(d.get("total_output_tokens", 0), "total_output_tokens", name),
                           whole(d.get("completed", 0), "completed", name),
                           num(d.get("duration", 0), "duration", name), errors)
        if slo_s:  # vLLM counts tpot 0 for one-token outputs
            per = {"ttft": [t for t, _o, _it in ok], "e2el": e2es,
                   "tpot": [sum(it) / (o - 1) if o > 1 else 0.0 for _t, o, it in ok]}
            lv["goodput_per_s"] = goodput_per_s(per, slo_s,
                                                num(d.get("duration", 0), "duration", name))
            lv["goodput_slo_s"] = dict(slo_s)
    else:
        lv = {"ttft_s": ms_stats(d, "ttft", name),
              "tbt_s": ms_stats(d, "itl", name), "tpot_s": ms_stats(d, "tpot", name),
              "e2e_s": ms_stats(d, "e2el", name),
              "completed": whole(d.get("completed", 0), "completed", name),
              "errors": errors or whole(d.get("failed") or 0, "failed", name),
              "note": "no per-request lists: percentiles are the file's own pNN keys; rerun "
                      "vllm bench serve with --save-detailed to recompute them"}
        done = lv["completed"]
        if done and d.get("total_input_tokens") is not None and d.get(
                "total_output_tokens") is not None:  # totals / completed, as vLLM sums them
            lv["mean_input_tokens"] = num(d["total_input_tokens"], "total_input_tokens",
                                          name) / done
            lv["mean_context_tokens"] = (lv["mean_input_tokens"] + num(
                d["total_output_tokens"], "total_output_tokens", name) / done / 2)
    if conc is None:
        ol = open_loop_level(d, lv["e2e_s"]["mean"], name, "rerun with --max-concurrency")
        lv["note"] = "; ".join(n for n in (ol.pop("note"), lv.get("note")) if n)
        lv.update(ol)
    else:
        lv["concurrency"] = whole(conc, "max_concurrency", name)
    if d.get("request_goodput") is not None:  # only when the run had --goodput SLOs
        lv["request_goodput_per_s"] = num(d["request_goodput"], "request_goodput", name)
    lv["output_tokens_per_s"] = num(d.get("output_throughput", lv.get("output_tokens_per_s")),
                                    "output_throughput", name)
    lv["requests_per_s"] = num(d.get("request_throughput", lv.get("requests_per_s")),
                               "request_throughput", name)
    ins, outs = d.get("input_lens") or [], d.get("output_lens") or []
    if ins and outs:
        lv["mean_context_tokens"] = float(np.mean(ins) + np.mean(outs) / 2)
        lv["mean_input_tokens"] = float(np.mean(ins))
    lv["source"] = f"vllm bench serve ({name})"
    return lv


def _gl_stats(m: dict[str, Any], field: str, scale: float, name: str
              ) -> dict[str, float | None]:
    """metrics.FIELD.successful's mean and percentiles, times `scale`."""
    s = (m.get(field) or {}).get("successful") or {}
    pct = s.get("percentiles") or {}

    def g(v: Any) -> float | None:
        return None if v is None else num(v, f"metrics.{field}.successful", name) * scale
    return {"mean": g(s.get("mean")), "p50": g(pct.get("p50", s.get("median"))),
            "p90": g(pct.get("p90")), "p99": g(pct.get("p99"))}


def _gl_concurrency(bm: dict[str, Any], name: str) -> int | None:
    for holder in (bm.get("config"), bm.get("args"), bm):
        strat = (holder or {}).get("strategy") or {}
        if strat.get("streams"):
            return whole(strat["streams"], "strategy.streams", name)
        if strat.get("type_") == "synchronous":
            return 1
    return None


def _gl_lengths(m: dict[str, Any], name: str) -> dict[str, float]:
    """The mean prompt and output token counts of the successful requests (metrics.
    prompt_token_count, output_token_count), as the level fit takes them: empty without."""
    n_in = _gl_stats(m, "prompt_token_count", 1.0, name)["mean"]
    n_out = _gl_stats(m, "output_token_count", 1.0, name)["mean"]
    if n_in is None or n_out is None:
        return {}
    return {"mean_input_tokens": n_in, "mean_context_tokens": n_in + n_out / 2}


def from_guidellm(d: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """One level per concurrent/synchronous benchmark of a GuideLLM report."""
    levels = []
    for bm in d.get("benchmarks") or []:
        conc = _gl_concurrency(bm, name)
        if conc is None:
            continue  # rate-based (poisson, constant, throughput) runs are open loop
        m = bm.get("metrics") or {}
        # request_totals: under metrics in some schemas, on the benchmark itself in others
        # (guidellm's GenerativeBenchmark.request_totals)
        totals = m.get("request_totals") or bm.get("request_totals") or {}
        levels.append({
            "concurrency": conc,
            "ttft_s": _gl_stats(m, "time_to_first_token_ms", MS, name),
            # inter_token_latency: per-request (E2E - TTFT) / (N - 1), vLLM's TPOT. Its mean
            # equals the mean gap (vLLM's ITL mean) when outputs have equal lengths; the
            # gap percentiles are not in the report.
            "tbt_s": mean_only(_gl_stats(m, "inter_token_latency_ms", MS, name)),
            "tpot_s": _gl_stats(m, "inter_token_latency_ms", MS, name),
            # time_per_output_token: (E2E - TTFT) / N, kept under its own name
            "guidellm_time_per_output_token_s": _gl_stats(m, "time_per_output_token_ms", MS, name),
            "e2e_s": _gl_stats(m, "request_latency", 1.0, name),
            "output_tokens_per_s": _gl_stats(m, "output_tokens_per_second", 1.0, name)["mean"],
            "requests_per_s": _gl_stats(m, "requests_per_second", 1.0, name)["mean"],
            "completed": whole(totals.get("successful", 0), "request_totals.successful", name),
            "errors": sum(whole(totals.get(k, 0), f"request_totals.{k}", name)
                          for k in ("errored", "incomplete")),
            "source": f"guidellm ({name})", **_gl_lengths(m, name)})
    if not levels:
        raise InputError(f"{name}: no concurrent or synchronous benchmark in this GuideLLM "
                         "report (rate-based runs are open loop)")
    return levels


def _read_json_or_lines(p: Path) -> list[Any]:
    try:
        text = read_text(p, "results file")
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


def _levels_from(d: Any, p: Path, slo_s: dict[str, float] | None = None
                 ) -> list[dict[str, Any]]:
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
        return [from_vllm(d, p.name, slo_s)]
    raise InputError(f"{p}: not a result file capplan reads ({FORMATS})")


def load_results(paths: list[Path], slo_s: dict[str, float] | None = None
                 ) -> list[dict[str, Any]]:
    """Levels from benchmark result files (any mix of the formats above), by concurrency;
    with SLOs (ttft/tpot/e2el in seconds) the goodput of files that keep per-request data."""
    from capplan.probe.aiperf_records import from_aiperf_records, is_records

    levels: list[dict[str, Any]] = []
    for p in paths:
        docs = _read_json_or_lines(p)
        if is_records(docs):  # AIPerf profile_export.jsonl: one record a request
            got = [from_aiperf_records(docs, p, level_summary)]
        else:
            got = [lv for d in docs for lv in _levels_from(d, p, slo_s)]
        model = next((m for d in docs if (m := _model_of(d))), None)
        for lv in got:
            lv.setdefault("file", str(p))
            if model:
                lv.setdefault("model", model)
        levels += got
    return sorted(levels, key=lambda lv: lv["concurrency"])


def _model_of(d: Any) -> str | None:
    """The served model a results file names (vLLM model_id, LLMPerf model, AIPerf
    input_config.endpoint.model_names), or None."""
    if not isinstance(d, dict):
        return None
    names = ((d.get("input_config") or {}).get("endpoint") or {}).get("model_names") \
        if isinstance(d.get("input_config"), dict) else None
    for m in (d.get("model_id"), d.get("model"), names[0] if isinstance(names, list)
              and names else None):
        if isinstance(m, str) and m.strip():
            return m.strip()
    return None


# ---------------------------------------------------------------------------------------------
def _line(x: np.ndarray, y: np.ndarray) -> dict[str, float] | None:
    if len(x) == 0:
        return None
    if len(set(x.tolist())) < 2:
        return {"intercept_s": float(y.mean()), "per_concurrency_s": 0.0, "n_levels": len(x)}
    b, a = np.polyfit(x, y, 1)
    return {"intercept_s": float(a), "per_concurrency_s": float(b), "n_levels": len(x)}


def fit_levels(levels: list[dict[str, Any]], model: str | None = None, gpu: str | None = None,
               catalog: Any = None, options: Any = None, served_model: str | None = None
               ) -> dict[str, Any]:
    """TBT and TTFT laws over concurrency; with the model and GPU, the host costs that make
    the engine's latency model reproduce the levels (probe/level_fit.py; `options`: the
    deployment's EngineOptions, default vLLM at TP 1; `served_model`: the name the server
    served --model under, which a results file may name instead)."""
    use = [lv for lv in levels if _centre(lv, "tbt_s") is not None]
    # open-loop levels: the mean requests in flight (Little's law), not the rounded count
    c = np.array([lv.get("in_flight_mean", lv["concurrency"]) for lv in use], float)
    tbt = np.array([_centre(lv, "tbt_s") for lv in use], float)
    has_ttft = [_centre(lv, "ttft_s") is not None for lv in use]
    ttft = np.array([_centre(lv, "ttft_s") for lv, ok in zip(use, has_ttft, strict=True)
                     if ok], float)
    fit: dict[str, Any] = {"tbt_law": _line(c, tbt), "ttft_law": _line(c[has_ttft], ttft),
                           "calibration_params": {}}
    if not use:
        done = any(lv.get("completed") for lv in levels)
        fit["note"] = ("requests completed, but no level has a token gap to fit TBT from "
                       "(a one-token output has none: --output-len 2 or more)" if done else
                       "no level completed a request: nothing to fit")
        return fit
    medians = sorted({k for lv in use for k in ("tbt_s", "ttft_s")
                      if (lv.get(k) or {}).get("mean") is None
                      and (lv.get(k) or {}).get("p50") is not None})
    if medians:  # old SGLang bench_serving lines hold medians only
        fit["centre"] = f"median where the file has no mean ({', '.join(medians)})"
    if model and gpu and catalog is not None:
        from capplan.probe.level_fit import fit_deployment, fit_targets, target_of

        dep = fit_deployment(catalog, model, gpu, options)
        got = fit_targets(dep, [target_of(lv, _centre) for lv in use])
        fit["gpu_key"] = dep.gpu.key
        fit["model"] = dep.model.key
        served = _served_models(levels)
        if served:
            fit["served_model"] = served[0]
        fit["warnings"] = [*fit.get("warnings", []),
                           *_model_mismatch(served, dep.model.key, (model, served_model),
                                           catalog)]
        fit["engine"] = dep.profile.label
        fit["host_overlap"] = bool(dep.profile.host_overlap)
        fit["round_trip"] = got["levels"]
        fit["calibration_params"] = got["params"]
        if got["per_seq"] != "fitted":
            fit["per_seq_source"] = sources.profile_default(got["per_seq"])
        fit["note"] = (f"host costs fitted through {dep.profile.label}'s latency model for "
                       f"{dep.model.key} on {dep.gpu.key} (TP {dep.settings.tp}, default "
                       "efficiencies)" + (f"; request overhead from the TTFT at concurrency "
                                          f"{got['ttft_level']}" if got["ttft_level"] else "")
                       + _PER_SEQ_NOTES[got["per_seq"]])
    else:
        fit["note"] = "pass --gpu G and a catalog --model to derive step_overhead_s"
    tau = pooled_acceptance_length(levels)
    if tau is not None:  # the server's own speculative acceptance (probe/spec_metrics.py)
        fit["calibration_params"] = {**fit["calibration_params"], "spec_acceptance_length": tau}
    return fit


def _served_models(levels: list[dict[str, Any]]) -> list[str]:
    """The served models the levels' files name (vLLM model_id, ...), once each."""
    return list(dict.fromkeys(str(lv["model"]) for lv in levels if lv.get("model")))


def _model_mismatch(served: list[str], key: str, given: tuple[str, str | None],
                    catalog: Any) -> list[str]:
    """A warning when a results file names another model than --model (or --served-model,
    the name the server served it under): the fit would put that model's server costs on this
    one (an engine mismatch is warned about likewise)."""
    model, served_name = given
    out = []
    for m in served:
        if m in (model, key, served_name):
            continue
        try:
            if catalog.resolve_model(m).spec.key == key:
                continue
        except CapplanError:  # a served name the catalog does not know
            pass
        out.append(f"the results files measured {m}, and --model {model} is {key}: the host "
                   f"costs are fitted through {key}'s latency model from another model's "
                   f"levels (pass the model the server ran, or --served-model {m} if the "
                   "server served it under that name)")
    return out


_PER_SEQ_NOTES = {
    "fitted": "",
    "one load": "; one load: per_seq_overhead_s is the engine profile's",
    "flat": "; the levels cannot pin per_seq_overhead_s (fitting it changes their RMS error by "
            "under 1%: TBT as flat over concurrency either way): the engine profile's is kept",
}


def _centre(level: dict[str, Any], key: str) -> float | None:
    """The mean of a level's metric, else its median (files that hold only medians)."""
    st = level.get(key) or {}
    return st["mean"] if st.get("mean") is not None else st.get("p50")


def write_levels_calibration(path: Path, levels: list[dict[str, Any]], fit: dict[str, Any]
                             ) -> None:
    """A calibration file holding the derivable overheads (needs --gpu)."""
    from capplan.catalog.calibration import (
        SERVING_METHOD,
        CalibrationFile,
        CalibrationParams,
        write_calibration,
    )

    if fit.get("tbt_law") is None:  # no level has a token gap: nothing was fitted
        raise InputError(f"--out: {fit.get('note') or 'no level to fit'}; nothing written")
    if not fit.get("calibration_params") or not fit.get("gpu_key"):
        raise InputError("--out with --endpoint/--from-results needs --gpu G and a catalog "
                         "--model to derive calibration parameters")
    fit = {**fit, "param_sources": {k: sources.FITTED_LEVELS for k in
                                    fit["calibration_params"]}}
    if fit.get("per_seq_source"):  # kept at the engine profile's (one load, or flat TBT)
        fit["param_sources"]["per_seq_overhead_s"] = fit["per_seq_source"]
    if "spec_acceptance_length" in fit["calibration_params"]:
        fit["param_sources"]["spec_acceptance_length"] = sources.SPEC_COUNTERS
    write_calibration(path, CalibrationFile(
        gpu=fit["gpu_key"], kind="measured",
        measured={"method": SERVING_METHOD, "engine": fit.get("engine"),
                  "host_overlap": fit.get("host_overlap"), "model": fit.get("model"),
                  **({"served_model": fit["served_model"]} if fit.get("served_model") else {})},
        params=CalibrationParams(**fit["calibration_params"]), fit=fit, samples=levels))
