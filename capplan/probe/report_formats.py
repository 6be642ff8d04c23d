"""Readers for the benchmark reports of LLMPerf, AIPerf / genai-perf and SGLang bench_serving,
each mapped onto vLLM's metric definitions (probe/results.py has the overview; docs/probe.md
the table)."""

from __future__ import annotations

from typing import Any

from capplan.errors import InputError

MS = 1e-3


def num(v: Any, field: str, name: str, *, integer: bool = False) -> float:
    """A number a results file holds: `field` of file `name` named when it is missing, null,
    not a number or (integer) not whole; the one-line error says which and what it is."""
    if v is None:
        raise InputError(f"{name}: {field} is missing or null; expected a number")
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InputError(f"{name}: {field} is {str(v)[:20]!r}, not a number")
    if integer and float(v) != int(v):
        raise InputError(f"{name}: {field} is {v:g}, not a whole number")
    return float(v)


def opt_num(v: Any, field: str, name: str) -> float | None:
    """num, or None when the file leaves the field out or null."""
    return None if v is None else num(v, field, name)


def whole(v: Any, field: str, name: str) -> int:
    return int(num(v, field, name, integer=True))


def mean_only(st: dict[str, float | None]) -> dict[str, float | None]:
    return {"mean": st.get("mean"), "p50": None, "p90": None, "p99": None}


def ms_stats(d: dict[str, Any], metric: str, name: str = "results file"
             ) -> dict[str, float | None]:
    """mean, p50 (median) and every pNN the file holds for `metric` (vLLM/SGLang *_ms keys)."""
    def g(key: str) -> float | None:
        v = opt_num(d.get(key), key, name)
        return None if v is None else v * MS
    out = {"mean": g(f"mean_{metric}_ms"), "p50": g(f"median_{metric}_ms"),
           "p90": g(f"p90_{metric}_ms"), "p99": g(f"p99_{metric}_ms")}
    for key in d:  # --metric-percentiles 50,90,95,99 writes p50_ttft_ms ... p99_ttft_ms
        if key.startswith("p") and key.endswith(f"_{metric}_ms"):
            q = key[1:-len(f"_{metric}_ms")]
            if q.replace(".", "", 1).isdigit():
                out[f"p{q}"] = g(key)
    return out


def open_loop_level(d: dict[str, Any], e2e_mean_s: float | None, name: str, rerun: str
                    ) -> dict[str, Any]:
    """Concurrency of a run without --max-concurrency (an open-loop rate or one burst): the
    mean number of requests in the system by Little's law, L = (completed / duration) x mean
    E2E (Little 1961; holds for any arrival process over a run that starts and ends empty).
    It counts queued requests too, so it exceeds the running batch when the server fell
    behind. Refused when the file lacks completed, duration or mean E2E."""
    done, dur = d.get("completed"), d.get("duration")
    if not done or not dur or not e2e_mean_s:
        raise InputError(f"{name}: max_concurrency is null (an open-loop run) and the file "
                         "lacks completed/duration/mean E2E to estimate the requests in "
                         f"flight: {rerun}")
    thr_per_s = num(done, "completed", name) / num(dur, "duration", name)
    in_flight = thr_per_s * float(e2e_mean_s)
    note = (f"open loop (request_rate {d.get('request_rate')}): concurrency is the mean "
            f"requests in the system by Little's law, {thr_per_s:.4g} req/s x "
            f"{e2e_mean_s:.4g} s E2E = {in_flight:.4g}, queued requests included")
    return {"concurrency": max(1, round(in_flight)), "in_flight_mean": in_flight,
            "open_loop": True, "note": note}


def _q(d: dict[str, Any], prefix: str, name: str, scale: float = 1.0
       ) -> dict[str, float | None]:
    """LLMPerf results_<metric>_quantiles_pNN / _mean keys."""
    def g(key: str) -> float | None:
        v = opt_num(d.get(key), key, name)
        return None if v is None else v * scale
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
    ttft, e2e = _q(d, "results_ttft_s", name), _q(d, "results_end_to_end_latency_s", name)
    n_out = num(d.get("results_number_output_tokens_mean") or 0,
                "results_number_output_tokens_mean", name)
    tpot = None
    if n_out > 1 and ttft["mean"] is not None and e2e["mean"] is not None:
        tpot = (e2e["mean"] - ttft["mean"]) / (n_out - 1)
    tpot_st = {"mean": tpot, "p50": None, "p90": None, "p99": None}
    n_in = num(d.get("results_number_input_tokens_mean") or 0,
               "results_number_input_tokens_mean", name)
    exact = num(d.get("results_number_output_tokens_stddev") or 0,
                "results_number_output_tokens_stddev", name) == 0
    keys = ("results_mean_output_throughput_token_per_s", "results_num_completed_requests_per_min",
            "results_num_completed_requests", "results_number_errors")
    thr, per_min, done, errs = (num(d.get(k, 0), k, name) for k in keys)
    return {"concurrency": whole(conc, "num_concurrent_requests", name), "ttft_s": ttft,
            "tbt_s": dict(tpot_st), "tpot_s": tpot_st, "e2e_s": e2e,
            "llmperf_inter_token_latency_s": _q(d, "results_inter_token_latency_s", name),
            "output_tokens_per_s": thr, "requests_per_s": per_min / 60,
            "completed": whole(done, keys[2], name), "errors": whole(errs, keys[3], name),
            "mean_input_tokens": n_in, "mean_context_tokens": n_in + n_out / 2,
            "note": "TPOT = (E2E - TTFT) / (N - 1) from the means"
                    + ("" if exact else " (output lengths vary: an estimate)"),
            "source": f"llmperf ({name})"}


_AIPERF_NAMES = {"ttft": ("ttft", "time_to_first_token"),
                 "tpot": ("inter_token_latency",),
                 "tbt": ("inter_chunk_latency",),
                 "e2e": ("request_latency",)}
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


def _ai_metric(rec: dict[str, Any], names: tuple[str, ...], file: str
               ) -> dict[str, float | None] | None:
    """A latency metric {unit, avg, pNN} in seconds; a unit other than a time's is refused
    (as the per-record reader does), never read as milliseconds."""
    for n in names:
        m = rec.get(n)
        if isinstance(m, dict) and m.get("avg") is not None:
            unit = str(m.get("unit", "ms"))
            if unit not in _UNIT_S:
                raise InputError(f"{file}: {n}.unit is {unit[:20]!r}; a latency needs a time "
                                 "unit (ns, us, ms, s)")
            k = _UNIT_S[unit]
            out: dict[str, float | None] = {"mean": num(m["avg"], f"{n}.avg", file) * k}
            for q in ("p50", "p90", "p95", "p99"):
                v = opt_num(m.get(q), f"{n}.{q}", file)
                out[q] = None if v is None else v * k
            return out
    return None


def _ai_value(rec: dict[str, Any], name: str, file: str) -> float | None:
    m = rec.get(name)
    if isinstance(m, dict) and m.get("avg") is not None:
        return num(m["avg"], f"{name}.avg", file)
    return None


def _count(x: float | None) -> int | None:
    return None if x is None else int(x)


def from_aiperf(d: dict[str, Any], name: str) -> dict[str, Any]:
    """A level from AIPerf profile_export_aiperf.json or genai-perf
    profile_export_genai_perf.json (metric -> {unit, avg, p50, p90, p99...})."""
    rec = d.get("records") if isinstance(d.get("records"), dict) else d
    cfg = d.get("input_config") or {}
    conc = (cfg.get("loadgen") or {}).get("concurrency") or cfg.get("concurrency")
    if conc is None:
        raise InputError(f"{name}: no loadgen concurrency in input_config (a request-rate "
                         "run is open loop; capplan fits closed-loop levels)")
    ttft = _ai_metric(rec, _AIPERF_NAMES["ttft"], name)
    tpot = _ai_metric(rec, _AIPERF_NAMES["tpot"], name)
    if ttft is None or tpot is None:
        raise InputError(f"{name}: needs ttft and inter_token_latency (a streaming run)")
    tbt = _ai_metric(rec, _AIPERF_NAMES["tbt"], name) or mean_only(tpot)
    n_in = _ai_value(rec, "input_sequence_length", name)
    n_out = _ai_value(rec, "output_sequence_length", name)
    lv: dict[str, Any] = {
        "concurrency": whole(conc, "input_config concurrency", name), "ttft_s": ttft,
        "tbt_s": tbt, "tpot_s": tpot,
        "e2e_s": _ai_metric(rec, _AIPERF_NAMES["e2e"], name) or mean_only({}),
        # a metric the export lacks stays null (docs/probe.md), never 0
        "output_tokens_per_s": _ai_value(rec, "output_token_throughput", name),
        "requests_per_s": _ai_value(rec, "request_throughput", name),
        "completed": _count(_ai_value(rec, "request_count", name)),
        "errors": int(_ai_value(rec, "error_request_count", name) or 0),
        "source": f"{'aiperf' if 'records' in d else 'genai-perf'} ({name})"}
    if n_in is not None and n_out is not None:
        lv["mean_input_tokens"] = n_in
        lv["mean_context_tokens"] = n_in + n_out / 2
    return lv


def from_sglang(d: dict[str, Any], name: str) -> dict[str, Any]:
    """A level from one line of SGLang bench_serving's --output-file JSONL. Older versions
    wrote fewer keys (no mean TTFT/ITL/TPOT, no request_throughput): what is absent stays
    null, except the request rate, which is completed / duration as bench_serving computes
    it."""
    done = whole(d.get("completed", 0), "completed", name)
    lv: dict[str, Any] = {
        "ttft_s": ms_stats(d, "ttft", name), "tbt_s": ms_stats(d, "itl", name),
        "tpot_s": ms_stats(d, "tpot", name), "e2e_s": ms_stats(d, "e2e_latency", name),
        "completed": done, "errors": 0,
        "output_tokens_per_s": num(d.get("output_throughput", 0.0), "output_throughput", name),
        "source": f"sglang bench_serving ({name})"}
    if d.get("request_throughput") is not None:
        lv["requests_per_s"] = num(d["request_throughput"], "request_throughput", name)
    else:
        lv["requests_per_s"] = (done / num(d["duration"], "duration", name)
                                if d.get("duration") else 0.0)
    conc = d.get("max_concurrency")
    if conc is None:
        lv.update(open_loop_level(d, lv["e2e_s"]["mean"], name,
                                  "rerun bench_serving with --max-concurrency"))
    else:
        lv["concurrency"] = whole(conc, "max_concurrency", name)
    if d.get("total_input_tokens") is not None and d.get("total_output_tokens") is not None:
        n_in = num(d["total_input_tokens"], "total_input_tokens", name) / max(done, 1)
        lv["mean_input_tokens"] = n_in
        lv["mean_context_tokens"] = n_in + num(d["total_output_tokens"], "total_output_tokens",
                                               name) / max(done, 1) / 2
    return lv
