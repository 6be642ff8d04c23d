"""AIPerf per-request records (`profile_export.jsonl`): one JSON object a request, with
`metadata` (credit_phase, timestamps) and `metrics` ({name: {value, unit}}), `error` null or
{code, type, message} (ai-dynamo/aiperf, examples/artifacts/run1).

Per record, as AIPerf defines them (docs/metrics_reference.md in aiperf): `ttft`; the gaps
`inter_chunk_latency` (vLLM's ITL when a chunk holds one token); `request_latency` (E2E);
`inter_token_latency` = (E2E - TTFT) / (N - 1) (vLLM's TPOT); `output_sequence_length` (N,
reasoning tokens included). Every statistic is recomputed from the records; the level's
concurrency is the run's `input_config.loadgen.concurrency` from the profile_export_aiperf.json
beside the file, else the most requests in flight at once (said in the note).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from capplan.errors import InputError

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


def is_records(docs: list[Any]) -> bool:
    """A JSONL of AIPerf per-request records (every line has metadata and metrics)."""
    return bool(docs) and all(isinstance(d, dict) and isinstance(d.get("metrics"), dict)
                              and isinstance(d.get("metadata"), dict) for d in docs)


def _seconds(m: dict[str, Any], name: str, where: str) -> float | list[float] | None:
    v = m.get(name)
    if v is None:
        return None
    if not isinstance(v, dict) or str(v.get("unit")) not in _UNIT_S:
        raise InputError(f"{where}: metric {name} needs a value and a time unit (ns, us, ms, s)")
    k, x = _UNIT_S[str(v["unit"])], v.get("value")
    if isinstance(x, list):
        return [_finite(g, name, where) * k for g in x]
    return _finite(x, name, where) * k


def _finite(x: Any, name: str, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not np.isfinite(x) or x < 0:
        raise InputError(f"{where}: {name} {str(x)[:20]} is not a finite number >= 0")
    return float(x)


def _value(m: dict[str, Any], name: str) -> float | None:
    v = m.get(name)
    x = v.get("value") if isinstance(v, dict) else None
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _sibling_concurrency(p: Path) -> int | None:
    """input_config.loadgen.concurrency of the profile_export_aiperf.json beside p."""
    agg = p.with_name("profile_export_aiperf.json")
    if not agg.is_file():
        return None
    from capplan.limits import read_text

    try:
        cfg = json.loads(read_text(agg, "AIPerf export")).get("input_config") or {}
    except (json.JSONDecodeError, AttributeError):
        return None
    conc = (cfg.get("loadgen") or {}).get("concurrency") if isinstance(cfg, dict) else None
    return conc if isinstance(conc, int) and not isinstance(conc, bool) and conc > 0 else None


def _max_in_flight(spans: list[tuple[float, float]]) -> int:
    """Most intervals [send, end) open at once: at equal stamps an end comes before a start (a
    closed loop's next request is sent as the last one ends; a request that ended as it was
    sent never held a slot)."""
    ev = sorted([(a, 1) for a, _b in spans] + [(b, -1) for _a, b in spans])
    n = best = 0
    for _t, d in ev:
        n += d
        best = max(best, n)
    return best


def _ns(meta: dict[str, Any], *names: str) -> float | None:
    """The first of `names` in a record's metadata that is a number of ns, in seconds."""
    for name in names:
        x = meta.get(name)
        if isinstance(x, int | float) and not isinstance(x, bool):
            return float(x) * 1e-9
    return None


def _failed_spans(recs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The failed records' [send, end]: request_end_ns or cancellation_time_ns of AIPerf's
    metadata; a record without either (older AIPerf: timestamp_ns alone) ends at its send."""
    out = []
    for d in recs:
        if d.get("error") is None:
            continue
        meta = d.get("metadata") or {}
        sent = _ns(meta, "request_start_ns", "timestamp_ns")
        if sent is not None:
            end = _ns(meta, "request_end_ns", "cancellation_time_ns")
            out.append((sent, max(sent, end if end is not None else sent)))
    return out


def _loop_concurrency(recs: list[dict[str, Any]], spans: list[tuple[float, float]]
                      ) -> tuple[int, str]:
    """A closed loop's client count from its records: the most requests in flight at once,
    failed ones included over their own send to end (a request that fails fast frees its
    client, which sends again: counting sends would count it twice)."""
    return max(1, _max_in_flight(spans + _failed_spans(recs))), (
        "the most requests in flight at once (failed ones over their own send to end)")


def from_aiperf_records(docs: list[dict[str, Any]], p: Path,
                        level_summary: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """One level from AIPerf per-request records (the profiling phase; warm-up skipped);
    `level_summary` is probe.results.level_summary (passed in: results imports this module)."""
    recs = [d for d in docs if (d["metadata"].get("credit_phase") or "profiling") == "profiling"]
    ttfts, itls, e2es, tpots, spans = [], [], [], [], []
    out_tokens, errors, first_error = 0, {}, None
    for i, d in enumerate(recs, 1):
        where = f"{p}: record {i}"
        err = d.get("error")
        if err is not None:
            kind = str(err.get("type") or "error") if isinstance(err, dict) else "error"
            errors[kind] = errors.get(kind, 0) + 1
            if first_error is None:
                msg = str(err.get("message") or "") if isinstance(err, dict) else str(err)
                first_error = f"{kind}: {msg}"[:120]
            continue
        m = d["metrics"]
        ttft, e2e = _seconds(m, "ttft", where), _seconds(m, "request_latency", where)
        n = _value(m, "output_sequence_length")
        if ttft is None or e2e is None or n is None:
            raise InputError(f"{where}: a streaming record needs ttft, request_latency and "
                             "output_sequence_length")
        ttfts.append(ttft)
        e2es.append(e2e)
        itls += _seconds(m, "inter_chunk_latency", where) or []
        tpot = _seconds(m, "inter_token_latency", where)
        if tpot is not None:
            tpots.append(tpot)
        out_tokens += int(n)
        t0, t1 = _value(m, "min_request_timestamp"), _value(m, "max_response_timestamp")
        if t0 is not None and t1 is not None:
            spans.append((t0 * 1e-9, t1 * 1e-9))  # AIPerf stamps are ns
        elif (a := _ns(d["metadata"], "request_start_ns")) is not None and (
                b := _ns(d["metadata"], "request_end_ns")) is not None:
            spans.append((a, b))  # newer AIPerf: the request's stamps in its metadata
    if not ttfts:
        raise InputError(f"{p}: no completed request among {len(recs)} AIPerf records")
    duration = (max(b for _a, b in spans) - min(a for a, _b in spans)) if spans else 0.0
    conc, how = _sibling_concurrency(p), "input_config.loadgen.concurrency of the run"
    if conc is None:
        conc, how = _loop_concurrency(recs, spans)
    lv = level_summary(conc, ttfts, itls, e2es, tpots, out_tokens, len(ttfts), duration,
                       sum(errors.values()), error_kinds=errors)
    if first_error:
        lv["first_error"] = first_error
    ins = [x for d in recs if d.get("error") is None
           and (x := _value(d["metrics"], "input_sequence_length")) is not None]
    if ins:
        lv["mean_input_tokens"] = float(np.mean(ins))
        lv["mean_context_tokens"] = float(np.mean(ins)) + out_tokens / len(ttfts) / 2
    lv["note"] = f"AIPerf per-request records: concurrency from {how}"
    lv["source"] = f"aiperf records ({p.name})"
    return lv
