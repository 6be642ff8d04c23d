"""XLSX export (XlsxWriter, the `xlsx` extra): sheets "recommendations", "inputs", "curve",
"pools" (a plan comparing a shared pool with a pool per lane) and "pareto", units in every
header row, numbers stored as numbers, and a native line chart of output throughput against
p99 TTFT on "curve"."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from capplan.errors import InputError
from capplan.export.atomic import Staged, bytes_file
from capplan.export.csv_export import (
    clean_number,
    disaggregated_table,
    lane_table,
    model_plans,
    pareto_table,
    pool_table,
    recommendation_table,
)
from capplan.export.json_export import jsonable
from capplan.export.layout import fixed_layout_sections
from capplan.plan.alternatives import PLAN_NOTES
from capplan.units import s_to_ms

CURVE_HEADERS = ("curve", "arrival rate (req/s)", "output throughput (tokens/s)",
                 "TTFT p99 (ms)", "TBT p99 (ms)")
INPUT_HEADERS = ("input", "value")


def _xlsxwriter() -> Any:
    try:
        import xlsxwriter
    except ImportError as e:
        raise InputError("XlsxWriter is not installed, run `pip install capplan[xlsx]`") from e
    return xlsxwriter


def _ms(x: Any) -> Any:
    x = clean_number(x)
    return s_to_ms(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _scalar(v: Any) -> Any:
    """A cell value: numbers and text as they are, None for inf/nan, JSON for lists and dicts."""
    v = clean_number(v)
    if v is None or isinstance(v, str | int | float | bool):
        return v
    return json.dumps(jsonable(v))


def _num_format(fmt: str) -> str | None:
    """A tabulate float format ('.0f', '.2f') as an Excel number format ('0', '0.00')."""
    if fmt.endswith("f") and fmt[1:-1].isdigit():
        places = int(fmt[1:-1])
        return "#,##0" + ("." + "0" * places if places else "")
    return None


def _shown(v: Any, fmt: str) -> str:
    if isinstance(v, float) and _num_format(fmt):
        return format(v, "," + fmt)
    return str(v)


def _write_table(ws: Any, headers: Any, rows: list[list[Any]], bold: Any,
                 fmts: Any = None, wb: Any = None, first_row: int = 0) -> None:
    """Header row (bold, frozen when at the top), then rows; columns as wide as their header
    and their formatted values (capped at 60); number formats from tabulate-style fmts."""
    headers = list(headers)
    fmts = list(fmts) if fmts is not None else ["g"] * len(headers)
    ws.write_row(first_row, 0, headers, bold)
    if first_row == 0:
        ws.freeze_panes(1, 0)
    cell_fmts = [wb.add_format({"num_format": nf}) if wb is not None and (nf := _num_format(f))
                 else None for f in fmts]
    for r, row in enumerate(rows, start=first_row + 1):
        for c, v in enumerate(row):
            if v is not None:  # an empty cell stays blank (inf, missing)
                ws.write(r, c, v, cell_fmts[c]) if cell_fmts[c] is not None else ws.write(r, c, v)
    for c, h in enumerate(headers):
        width = max([len(str(h))] + [len(_shown(row[c], fmts[c])) for row in rows
                                     if c < len(row) and row[c] is not None])
        ws.set_column(c, c, min(max(width, 6) + 2, 60))


def _inputs_rows(plan: dict[str, Any]) -> list[list[Any]]:
    inputs = plan.get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        keys = ("model", "objective", "headroom", "target_rate_per_s")
        inputs = {k: plan[k] for k in keys if k in plan}
    from capplan.export.layout import headline

    # what the plan recommends first (the aggregated fleet, the disaggregated layout, a pool
    # per lane), as every export says it
    rows = [["recommended", headline(plan).removeprefix("recommended: ")]]
    verdict = (plan.get("disaggregated") or {}).get("verdict")
    if verdict and not disaggregated_table(plan)[1]:  # else its sheet's column says it
        rows.append(["disaggregated prefill/decode", str(verdict)])
    rows += [[str(k), _scalar(v)] for k, v in inputs.items()]
    if "target_rate_per_s" in plan and "target_rate_per_s" not in inputs:
        rows.append(["target rate (req/s)", clean_number(plan["target_rate_per_s"])])
    recs = [r for r in plan.get("recommendations") or [] if isinstance(r, dict)]
    if recs and recs[0].get("calibration"):
        rows.append(["calibration used", str(recs[0]["calibration"])])
    # what the plan assumed or left out, and its warnings, as the other reports print them
    rows += [[key.replace("_", " "), str(plan[key]["note"])] for key in PLAN_NOTES
             if isinstance(plan.get(key), dict) and plan[key].get("note")]
    rows += [["warning", str(w)] for w in plan.get("warnings") or []]
    return rows


def _inputs_sheet(wb: Any, plan: dict[str, Any], bold: Any) -> None:
    ws = wb.add_worksheet("inputs")
    inputs = _inputs_rows(plan)
    lane_cols, lanes = lane_table(plan)  # the workload the plan sized for, lane by lane
    headers, fmts = [c.header for c in lane_cols], [c.fmt for c in lane_cols]
    _write_table(ws, INPUT_HEADERS, inputs, bold)
    if lanes:  # below the settings, after a blank row; widths fit both tables
        _write_table(ws, headers, lanes, bold, fmts, wb, first_row=len(inputs) + 2)
        for c, h in enumerate(headers):
            col = [r[c] for r in inputs if c < len(r)] if c < 2 else []
            width = max([len(h)] + [len(_shown(r[c], fmts[c])) for r in lanes
                                    if r[c] is not None] + [len(str(v)) for v in col])
            ws.set_column(c, c, min(max(width, 6) + 2, 60))


def _curve_rows(plan: dict[str, Any]) -> list[tuple[str, list[list[Any]]]]:
    """(label, rows) per curve; a plan of several models has each model's, named by model."""
    subs = model_plans(plan)
    return [group for m in subs
            for group in _one_plan_curves(m, f"{m.get('model')}: " if len(subs) > 1 else "")]


def _one_plan_curves(plan: dict[str, Any], prefix: str) -> list[tuple[str, list[list[Any]]]]:
    out = []
    for i, curve in enumerate(plan.get("curves") or []):
        if not isinstance(curve, dict):
            continue
        label = prefix + str(curve.get("label") or f"curve {i + 1}")
        rows = [[label, clean_number(p.get("rate_per_s")),
                 clean_number(p.get("output_tokens_per_s")),
                 _ms(p.get("ttft_p99_s")), _ms(p.get("tbt_p99_s"))]
                for p in curve.get("points") or [] if isinstance(p, dict)]
        out.append((label, rows))
    return out


def _curve_sheet(wb: Any, plan: dict[str, Any], bold: Any) -> None:
    ws = wb.add_worksheet("curve")
    groups = _curve_rows(plan)
    _write_table(ws, CURVE_HEADERS, [r for _, rows in groups for r in rows], bold,
                 ("g", ".3f", ".0f", ".0f", ".1f"), wb)
    chart = wb.add_chart({"type": "scatter", "subtype": "straight_with_markers"})
    first = 1
    for label, rows in groups:
        if rows:
            last = first + len(rows) - 1
            chart.add_series({"name": label,
                              "categories": ["curve", first, 3, last, 3],
                              "values": ["curve", first, 2, last, 2],
                              "marker": {"type": "circle", "size": 5}})
        first += len(rows)
    if first == 1:
        return  # no points, no chart
    chart.set_title({"name": "Output throughput against p99 TTFT"})
    chart.set_x_axis({"name": CURVE_HEADERS[3], "major_gridlines": {"visible": True}})
    chart.set_y_axis({"name": CURVE_HEADERS[2]})
    chart.set_legend({"position": "bottom"})
    chart.show_blanks_as("gap")
    chart.set_size({"width": 720, "height": 420})
    ws.insert_chart(1, len(CURVE_HEADERS) + 1, chart)


def xlsx_files(plan: dict[str, Any], path: str | Path, run: Any = None) -> list[Staged]:
    """The workbook, built in memory now (a failure writes nothing), to write at `path`."""
    xlsxwriter = _xlsxwriter()
    cols, rec_rows = recommendation_table(plan)
    buf = io.BytesIO()
    wb = xlsxwriter.Workbook(buf, {"in_memory": True, "strings_to_numbers": False,
                                   "strings_to_formulas": False, "strings_to_urls": False})
    try:
        bold = wb.add_format({"bold": True, "bottom": 1})
        _write_table(wb.add_worksheet("recommendations"), [c.header for c in cols],
                     rec_rows, bold, [c.fmt for c in cols], wb)
        _inputs_sheet(wb, plan, bold)
        _curve_sheet(wb, plan, bold)
        disagg_cols, disagg = disaggregated_table(plan)
        if disagg:
            _write_table(wb.add_worksheet("disaggregated"), [c.header for c in disagg_cols],
                         disagg, bold, [c.fmt for c in disagg_cols], wb)
        fixed = fixed_layout_sections(plan, run.export(".json") if run is not None else None)
        if fixed:  # a plan file's fixed disaggregated layout: its parts one under another
            ws, row = wb.add_worksheet("fixed disaggregated"), 0
            for _, headers, rows in fixed:
                _write_table(ws, headers, rows, bold, None, wb, first_row=row)
                row += len(rows) + 2
        pool_cols, pools = pool_table(plan)
        if pools:  # one shared pool against a pool per lane
            _write_table(wb.add_worksheet("pools"), [c.header for c in pool_cols], pools,
                         bold, [c.fmt for c in pool_cols], wb)
        pareto_cols, pareto = pareto_table(plan)
        if pareto:
            _write_table(wb.add_worksheet("pareto"), [c.header for c in pareto_cols], pareto,
                         bold, [c.fmt for c in pareto_cols], wb)
        from capplan.export.day_export import has_day, xlsx_sheet

        if has_day(plan):
            xlsx_sheet(wb, plan, bold, _write_table)
    except BaseException:
        with contextlib.suppress(Exception):  # the buffer is discarded anyway
            wb.close()
        raise
    wb.close()
    return [bytes_file(Path(path), buf.getvalue())]
