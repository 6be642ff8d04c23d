"""The day plan in every export: the schedule table (per window: offered rate, the rate it is
sized for, replicas, GPUs, predicted p99s, scale-up start, replay attainment) and a chart of
replicas and offered rate over the day. Exporters call these when the plan dict has a
`schedule` (a day plan); nothing is recomputed."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from capplan.export.atomic import Staged

HEADERS = ("start (h)", "end (h)", "offered (req/s)", "IDC", "replicas", "GPUs",
           "TTFT p99 (ms)", "TBT p99 (ms)", "scale-up begins (h)",
           "replay planned attainment (%)", "replay reactive attainment (%)",
           "inter-arrival SCV", "sized for (req/s)")
BINDING = "bound by"
"""The column naming what sets a window's replicas (JSON `binding`)."""
FMTS = (".2f", ".2f", ".3f", ".2f", "g", "g", ".0f", ".1f", ".2f", ".1f", ".1f", ".2f", ".3f")

TOTALS = (
    ("peak_replicas", "peak replicas", 1.0, "g"),
    ("peak_gpus", "peak GPUs", 1.0, "g"),
    ("separate_fleets_peak_gpus", "peak GPUs, each fleet at its own peak", 1.0, "g"),
    ("gpu_hours", "GPU-hours, autoscaled", 1.0, ".1f"),
    ("fixed_fleet_gpu_hours", "GPU-hours, fixed at the peak", 1.0, ".1f"),
    ("separate_fleets_gpu_hours", "GPU-hours, fixed fleets each at its own peak", 1.0, ".1f"),
    ("cost_per_day", "cost per day, autoscaled ($)", 1.0, ".2f"),
    ("fixed_fleet_cost_per_day", "cost per day, fixed at the peak ($)", 1.0, ".2f"),
    ("separate_fleets_cost_per_day", "cost per day, fixed fleets each at its own peak ($)", 1.0,
     ".2f"),
    ("cost_per_million_output_tokens", "cost per million output tokens, autoscaled ($)", 1.0,
     ".4g"),
    ("fixed_fleet_cost_per_million_output_tokens",
     "cost per million output tokens, fixed at the peak ($)", 1.0, ".4g"),
    ("saving_gpu_hours", "saving (GPU-hours)", 1.0, ".1f"),
    ("saving_per_day", "saving per day ($)", 1.0, ".2f"),
    ("saving_frac", "saving (%)", 100.0, ".1f"),
)
"""The day's totals: (JSON key, label with its unit, factor to that unit, display format).
GPU-hours are over the schedule's span, costs per 24 h (plan/day.py); a fraction is shown as
a percentage, as the table output prints it."""
POOL_TOTALS = (
    ("peak_gpus", "peak GPUs", "g"),
    ("separate_fleets_peak_gpus", "peak GPUs, each fleet at its own peak", "g"),
    ("gpu_hours", "GPU-hours, autoscaled", ".1f"),
    ("fixed_pool_gpu_hours", "GPU-hours, fixed at the peak", ".1f"),
    ("separate_fleets_gpu_hours", "GPU-hours, fixed fleets each at its own peak", ".1f"),
    ("fixed_pool_cost_per_day", "cost per day, fixed at the peak ($)", ".2f"),
    ("separate_fleets_cost_per_day", "cost per day, fixed fleets each at its own peak ($)", ".2f"),
)
"""A GPU type's pool in a plan of several models (`gpu_pools`): key, label, format."""


def zone(plan: dict[str, Any]) -> str:
    """The zone of the schedule's clock times: the plan's `timezone`, UTC when it has none."""
    return plan.get("timezone") or "UTC"


def clock_times(plan: dict[str, Any]) -> str:
    """"clock times in Europe/Berlin", as every day-plan output names its zone once."""
    return f"clock times in {zone(plan)}"


def _num(x: Any) -> float | None:
    if x is None or isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return None if math.isnan(x) or math.isinf(x) else float(x)


def _ms(x: Any) -> float | None:
    v = _num(x)
    return None if v is None else v * 1e3


def _h(x: Any) -> float | None:
    v = _num(x)
    return None if v is None else v / 3600.0


def _att(w: dict[str, Any], which: str) -> float | None:
    """A replayed window's SLO attainment in % (the table output's percentage)."""
    v = _num(((w.get("replay") or {}).get(which) or {}).get("attainment"))
    return None if v is None else 100.0 * v


def has_day(plan: dict[str, Any]) -> bool:
    return isinstance(plan.get("schedule"), list) and bool(plan["schedule"])


def _models(plan: dict[str, Any]) -> list[str]:
    """The models (or a model's lanes, each on its pool) of a shared pool's schedule (GPUs
    per model or lane columns), else none."""
    first = plan["schedule"][0]
    return list(first.get("gpus_by_model") or first.get("gpus_by_lane") or {})


def _types(plan: dict[str, Any]) -> list[str]:
    """The GPU types of a shared pool's schedule (GPUs per type's pool columns), else none."""
    return list(plan["schedule"][0].get("gpus_by_gpu") or {})


def _bound(plan: dict[str, Any]) -> bool:
    """A model's schedule names what binds each window (`binding`); a pool's does not (each
    model's own schedule does)."""
    return "binding" in plan["schedule"][0]


def headers(plan: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(headers, formats) of the schedule table, its clock times' columns naming the plan's
    time zone ("start (h in Europe/Berlin)"): a model's adds what binds each window
    (`bound by`: capacity or min_replicas); a pool adds GPUs per model and per GPU type's pool
    (its `GPUs` column is empty over several types)."""
    extra = ([BINDING] if _bound(plan) else []) + [f"GPUs {m}" for m in _models(plan)] \
        + [f"GPUs {t} pool" for t in _types(plan)]
    return [h.replace("(h)", f"(h in {zone(plan)})") for h in HEADERS] + extra, \
        [*FMTS, *("g" for _ in extra)]


def schedule_rows(plan: dict[str, Any]) -> list[list[Any]]:
    """One row per window in display units (None: empty cell)."""
    models, types = _models(plan), _types(plan)
    return [[_h(w.get("start_s")), _h(w.get("end_s")), _num(w.get("offered_rps")),
             _num(w.get("dispersion")), w.get("replicas"), w.get("gpus"),
             _ms(w.get("ttft_p99_s")), _ms(w.get("tbt_p99_s")), _h(w.get("scale_up_begin_s")),
             _att(w, "planned"), _att(w, "reactive"), _num(w.get("arrival_scv")),
             _num(w.get("sizing_rps")), *([w.get("binding")] if _bound(plan) else []),
             *((w.get("gpus_by_model") or w.get("gpus_by_lane") or {}).get(m)
               for m in models),
             *((w.get("gpus_by_gpu") or {}).get(t) for t in types)]
            for w in plan["schedule"]]


def _totals(plan: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, str]]:
    """One plan's TOTALS it has, in display units, each label after `prefix`."""
    out = [(prefix + label, plan[key] if factor == 1 else v * factor, fmt)
           for key, label, factor, fmt in TOTALS if (v := _num(plan.get(key))) is not None]
    start = _num(((plan.get("day") or {}).get("startup") or {}).get("replica_start_s"))
    if start is not None:
        out.append((prefix + "replica start-up (s)", start, ".0f"))
    return out


def summary_rows(plan: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(quantity with its unit, value in that unit, display format) rows of the day's totals;
    a plan of several models adds each GPU type's pool and each model's own day."""
    pools = [(f"{p['gpu']} pool: {label.replace('model', 'lane' if 'lanes' in p else 'model')}",
              p[k], fmt)
             for p in plan.get("gpu_pools") or [] for k, label, fmt in POOL_TOTALS
             if _num(p.get(k)) is not None]
    models = [row for m in plan.get("models") or []
              for row in _totals(m, f"{m.get('model')}: ")]
    models += [row for m in plan.get("lane_days") or []  # a model's pools per lane
               for row in _totals(m, f"lane {m.get('lane')}: ")]
    return _totals(plan) + pools + models


def summary_shown(plan: dict[str, Any]) -> list[list[str]]:
    """summary_rows as text, each value in its own format (a report's totals table)."""
    return [[q, format(v, fmt)] for q, v, fmt in summary_rows(plan)]


def schedule_csv_path(path: Path) -> Path:
    """The CSV export's sibling holding the schedule: plan.csv -> plan.schedule.csv."""
    return path.with_name(path.stem + ".schedule.csv")


def schedule_csv_file(plan: dict[str, Any], path: Path) -> Staged:
    """The schedule as its own CSV beside the export `path` (one row per window, then the
    totals), rendered, to write with the export."""
    out = schedule_csv_path(path)
    heads, rows, totals = headers(plan)[0], schedule_rows(plan), summary_rows(plan)

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(heads)
            for row in rows:
                w.writerow(["" if v is None else v for v in row])
            w.writerow([])
            w.writerow(["quantity", "value"])
            for q, v, _ in totals:  # summary_rows keeps only the values it has
                w.writerow([q, v])

    return out, write


def markdown_section(plan: dict[str, Any], table: Any) -> list[str]:
    """The schedule table, the totals and a Mermaid chart (replicas as bars, offered rate as a
    line) that GitHub and most Markdown viewers draw."""
    rows = schedule_rows(plan)
    heads, fmts = headers(plan)
    out = [f"## Day plan: replicas per window, {clock_times(plan)}", "",
           table(heads, rows, tuple(fmts)), "", table(["quantity", "value"],
                                                       summary_shown(plan), None), ""]
    reps = [r[4] or 0 for r in rows]
    rate = [round(r[2] or 0.0, 3) for r in rows]
    labels = ", ".join(f'"{int(round(r[0] * 60)) // 60:02d}:{int(round(r[0] * 60)) % 60:02d}"'
                       for r in rows)  # HH:MM: 0.25 h is 00:15 (not "0.2")
    top = max(max(reps), max(rate), 1)
    out += ["```mermaid", "xychart-beta",
            '    title "replicas (bars) and offered req/s (line) over the day"',
            f"    x-axis [{labels}]", f'    y-axis "replicas, req/s" 0 --> {top * 1.1:.3g}',
            f"    bar [{', '.join(str(x) for x in reps)}]",
            f"    line [{', '.join(str(x) for x in rate)}]", "```", ""]
    return out


def xlsx_sheet(wb: Any, plan: dict[str, Any], bold: Any, write_table: Any) -> None:
    """A `schedule` sheet (table + totals) with a native chart: replicas (columns) and offered
    rate (line, second axis) against the window's start."""
    ws = wb.add_worksheet("schedule")
    rows = schedule_rows(plan)
    heads, fmts = headers(plan)
    write_table(ws, heads, rows, bold, fmts, wb)
    n = len(rows)
    write_table(ws, ("quantity", "value"), [[q, v] for q, v, _ in summary_rows(plan)], bold,
                ("g", "g"), wb, first_row=n + 2)
    chart = wb.add_chart({"type": "column"})
    chart.add_series({"name": "replicas", "categories": ["schedule", 1, 0, n, 0],
                      "values": ["schedule", 1, 4, n, 4]})
    line = wb.add_chart({"type": "line"})
    line.add_series({"name": "offered (req/s)", "categories": ["schedule", 1, 0, n, 0],
                     "values": ["schedule", 1, 2, n, 2], "y2_axis": True})
    chart.combine(line)
    chart.set_title({"name": "replicas and offered rate over the day"})
    chart.set_x_axis({"name": f"window start (h in {zone(plan)})"})
    chart.set_y_axis({"name": "replicas"})
    line.set_y2_axis({"name": "offered (req/s)"})
    chart.set_size({"width": 900, "height": 360})
    ws.insert_chart(1, len(heads) + 1, chart)


def plot_day(plan: dict[str, Any], out_dir: Path, figure: Any, save: Any) -> list[Any]:
    """`day_schedule.{png,svg}`: replicas (steps) and offered rate (second axis) over the day,
    as `save(fig, out_dir, stem)` gives them (the files to write)."""
    rows = schedule_rows(plan)
    x = [r[0] for r in rows] + [rows[-1][1]]
    reps = [r[4] or 0 for r in rows]
    rate = [r[2] or 0.0 for r in rows]
    fig, axes = figure()
    ax = axes[0][0]
    ax.stairs(reps, x, color="C0", label="replicas", linewidth=2)
    ax.set_xlabel(f"time of day (h in {zone(plan)})")
    ax.set_ylabel("replicas", color="C0")
    ax.set_ylim(0, max(reps + [1]) * 1.15)
    ax2 = ax.twinx()
    ax2.stairs(rate, x, color="C1", label="offered (req/s)")
    ax2.set_ylabel("offered (req/s)", color="C1")
    ax2.set_ylim(0, max(rate + [1e-9]) * 1.15)
    ax.grid(True, alpha=0.3)
    fig.suptitle(f"{plan.get('model') or 'pool'}: replicas and offered rate over the day")
    return save(fig, out_dir, "day_schedule")


def html_section(plan: dict[str, Any], table: Any, line_chart: Any, num: Any) -> str:
    """The HTML report's day section: the schedule table and a chart of replicas and offered
    rate over the day (inline SVG, the page's own chart helper)."""
    heads, fmts = headers(plan)
    rows = [[num(v, f if f != "g" else "g") if v is not None else "" for v, f in zip(r, fmts,
                                                                                    strict=True)]
            for r in schedule_rows(plan)]
    raw = schedule_rows(plan)
    reps = [(r[0], float(r[4] or 0)) for r in raw]
    rate = [(r[0], float(r[2] or 0.0)) for r in raw]
    chart = line_chart("Replicas and offered rate over the day", [("replicas", reps),
                                                                 ("offered (req/s)", rate)],
                       f"time of day (h in {zone(plan)})", "replicas, requests/s")
    totals = table(["quantity", "value"], [[num(q), num(v)] for q, v in summary_shown(plan)])
    import html

    return (f"<h2>Day plan: replicas per window, {html.escape(clock_times(plan))}</h2>"
            + f'<div class="charts">{chart}</div>'
            + totals + table(heads, rows, 1))
