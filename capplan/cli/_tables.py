"""Shared tables of latency results (ms), used by latency, simulate and plan."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from capplan.cli._render import Column, render_rows
from capplan.units import MS_S


def _ms(x: float) -> float:
    return x / MS_S


def dtype_text(dtypes: dict[str, str], settings: Any) -> str:
    """'weights bf16 (auto), KV fp8' for notes under tables."""
    def one(name: str, key: str) -> str:
        auto = " (auto)" if getattr(settings, key) == "auto" else ""
        return f"{name} {dtypes[key]}{auto}"
    return f"{one('weights', 'weight_dtype')}, {one('KV', 'kv_dtype')}"


def latency_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for metric, label in (("ttft_s", "TTFT"), ("tbt_s", "TBT"), ("e2e_s", "E2E")):
        d = res.get(metric) or {}
        rows.append({"metric": label, **{k: d.get(k) for k in ("mean", "p50", "p90", "p99")},
                     "band": d.get("band")})
    return rows


def _band_ms(b: list[float]) -> str:
    """The error band of a mean (capplan.plan.bands), in milliseconds: "lo-hi"."""
    lo, hi = (_ms(x) for x in b)
    digits = 1 if hi < 100 else 0
    return f"{lo:.{digits}f}-{hi:.{digits}f}"


BAND_COLUMN = Column("band", "measured mean, 80% band (ms)", _band_ms)
"""Where measurements fell for 80% of held-out silicon rows of the engine at this load
(capplan.plan.bands; docs/validation.md section 4b)."""


def _throughput_rows(res: dict[str, Any], fmt: str) -> list[dict[str, Any]]:
    """Quantity | value rows: numbers in CSV (the unit in the label), formatted text otherwise."""
    kv = res["kv_peak_utilization"]
    spec = [("requests (req/s)", res["requests_per_s"], ".3f"),
            ("output tokens (tok/s)", res["output_tokens_per_s"], ".0f"),
            ("input tokens (tok/s)", res["input_tokens_per_s"], ".0f"),
            ("mean running batch (seqs)", res["mean_running_batch"], ".1f"),
            ("KV peak utilization (%)", None if kv is None else 100 * kv, ".0f")]
    rows = [{"q": q, "v": v if fmt == "csv" or v is None else format(v, f)} for q, v, f in spec]
    rows += [{"q": "bound", "v": res.get("bound", "")}]
    layout = (res.get("engine_settings") or {}).get("layout")
    if layout:
        rows += [{"q": "replica", "v": layout}]
    if res.get("weight_dtype"):
        rows += [{"q": "weight dtype", "v": res["weight_dtype"]},
                 {"q": "KV dtype", "v": res.get("kv_dtype", "")}]
    rows += [{"q": "calibration", "v": res.get("calibration", "")}]
    if res.get("load"):  # what the load was: a trace's note (file, columns, time unit) included
        load = str(res["load"])
        rows += [{"q": "load", "v": textwrap.fill(load, 90) if fmt == "table" else load}]
    return rows


def latency_table(res: dict[str, Any], fmt: str) -> str:
    if not res.get("stable", True):
        if fmt in ("csv", "markdown"):
            row = {k: res.get(k) for k in ("stable", "offered_requests_per_s",
                                           "capacity_requests_per_s", "bound", "reason",
                                           "load")}
            return render_rows([row], [Column(k, k) for k in row], fmt)
        return (f"UNSTABLE: {res.get('reason', 'arrivals exceed capacity')}; capacity is about "
                f"{res.get('capacity_requests_per_s', float('nan')):.2f} requests/s per replica"
                + (f"\nload: {textwrap.fill(str(res['load']), 110)}" if res.get("load") else "")
                + "".join(f"\nWARNING: {w}" for w in res.get("warnings", [])))
    cols = [Column("metric", "latency"), Column("mean", "mean (ms)", _ms, ".1f"),
            Column("p50", "p50 (ms)", _ms, ".1f"), Column("p90", "p90 (ms)", _ms, ".1f"),
            Column("p99", "p99 (ms)", _ms, ".1f")]
    lrows = latency_rows(res)
    if any(r["band"] for r in lrows):
        cols.insert(2, BAND_COLUMN)
    text = render_rows(lrows, cols, fmt)
    rows = _throughput_rows(res, fmt)
    if fmt != "table":  # the footer as rows, so that every format carries it
        rows += _answer_rows(res)
    thr = render_rows(rows, [Column("q", "throughput"), Column("v", "value")], fmt)
    foot = answer_footer(res) if fmt == "table" else ""
    return text + "\n\n" + thr + (f"\n\n{foot}" if foot else "")


def _answer_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Which model answered, its notes and warnings (capplan.plan.replay), as quantity rows."""
    rows = [{"q": "answered by", "v": res["answered_by"]}] if res.get("answered_by") else []
    rows += [{"q": "note", "v": n} for n in res.get("notes", [])]
    return rows + [{"q": "warning", "v": w} for w in res.get("warnings", [])]


def answer_footer(res: dict[str, Any]) -> str:
    """The table's footer: notes (which model answered first), then warnings."""
    lines = [f"note: {n}" for n in res.get("notes", [])]
    return "\n".join(lines + [f"WARNING: {w}" for w in res.get("warnings", [])])


def _sweep_columns(level: str, fmt: str) -> list[Column]:
    """Two-line headers in the table (metric and unit over the first of its three columns), one
    line with the unit in each header for CSV and Markdown."""
    table = fmt == "table"
    head = ("rate\nreq/s" if table else "rate (req/s)") if level == "rate" else "clients"
    cols = [Column("level", head)]
    if not table:  # the table says these in its notes
        cols += [Column("stable", "stable"), Column("answered_by", "answered by")]
    cols += [Column("requests_per_s", "\nreq/s" if table else "req/s", None, ".2f"),
             Column("output_tokens_per_s", "out\ntok/s" if table else "out tok/s", None, ".0f")]
    for key, name in (("ttft_s", "TTFT"), ("tbt_s", "TBT"), ("e2e_s", "E2E")):
        for q in ("p50", "p90", "p99"):
            header = ((f"{name} ms\n" if q == "p50" else "\n") + q) if table else (
                f"{name} {q} (ms)")
            cols.append(Column(f"{key}.{q}", header, _ms, ".1f" if key == "tbt_s" else ".0f"))
    return cols + [Column("mean_running_batch", "\nbatch" if table else "mean batch", None,
                          ".1f")]


def sweep_table(results: Sequence[dict[str, Any]], level: str, levels: Sequence[Any],
                fmt: str) -> str:
    """One row per load level (GuideLLM-style): throughput and TTFT/TBT/E2E percentiles side by
    side. An unstable level has no latencies (its row says so)."""
    rows = []
    for lv, res in zip(levels, results, strict=True):
        row: dict[str, Any] = {"level": lv, "stable": "yes" if res.get("stable") else "no",
                               "answered_by": res.get("answered_by", ""),
                               "requests_per_s": res.get("requests_per_s"),
                               "output_tokens_per_s": res.get("output_tokens_per_s"),
                               "mean_running_batch": res.get("mean_running_batch")}
        for key in ("ttft_s", "tbt_s", "e2e_s"):
            for q, v in (res.get(key) or {}).items():
                if res.get("stable") and v is not None:
                    row[f"{key}.{q}"] = v
        if fmt == "table":  # text, so that "unstable" keeps the numbers' alignment
            row["requests_per_s"] = (f"{res['requests_per_s']:.2f}" if res.get("stable")
                                     else "unstable")
        rows.append(row)
    text = render_rows(rows, _sweep_columns(level, fmt), fmt)
    if fmt == "table":
        first = results[0]
        unstable = [f"{lv:g}" for lv, r in zip(levels, results, strict=True)
                    if not r.get("stable")]
        dt = (f"; weights {first['weight_dtype']}, KV {first.get('kv_dtype')}"
              if first.get("weight_dtype") else "")
        layout = (first.get("engine_settings") or {}).get("layout") or f"TP {first.get('tp')}"
        notes = [f"{first.get('model')} on {first.get('gpu')} ({layout}){dt}; "
                 "latencies in ms", f"calibration: {first.get('calibration')}"]
        if unstable:
            cap = next(r.get("capacity_requests_per_s") for r in results if not r.get("stable"))
            notes.append(f"unstable at {', '.join(unstable)}: the queue grows without bound "
                         f"(capacity about {cap:.2f} req/s per replica)")
        answered = [f"{lv:g}: {r['answered_by']}" for lv, r in zip(levels, results, strict=True)
                    if r.get("answered_by")]
        if answered:
            notes.append("answered by (replay or analytic queue): " + ", ".join(answered))
        text += "\n\n" + "\n".join(notes)
    return text
