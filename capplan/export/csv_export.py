"""CSV export of a plan: one row per recommendation, flattened, human units in the headers.

The column table here (`RECOMMENDATION_COLUMNS`) is shared by the Markdown and XLSX writers, so
every format shows the same columns with the same units. Exporters never recompute: a cell is a
value of the plan, at most converted for display (seconds -> ms, fraction -> %).
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capplan.errors import InputError
from capplan.export.atomic import Staged
from capplan.export.json_export import jsonable
from capplan.models.engine import ENGINES, engine_display_name
from capplan.units import s_to_ms


def clean_number(value: Any) -> Any:
    """None for inf/nan (an empty cell, a JSON null); numpy scalars become Python numbers."""
    return jsonable(value)


def dig(record: dict[str, Any], path: Sequence[str]) -> Any:
    """record[path[0]][path[1]]..., or None where any step is missing or null."""
    cur: Any = record
    for key in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return clean_number(cur)


def three_sig(x: Any) -> str:
    """A figure for a title line: three significant figures (10.270833 -> 10.3), else as is."""
    return f"{x:.3g}" if isinstance(x, int | float) and not isinstance(x, bool) else str(x)


def _ms(x: Any) -> Any:
    return s_to_ms(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _pct(x: Any) -> Any:
    return 100.0 * x if isinstance(x, int | float) and not isinstance(x, bool) else None


def stops_paying_text(spec: Any) -> Any:
    """Where speculation stops paying: its batch, or 'never (up to N)' when it pays at every
    batch checked (JSON keeps `stops_paying_at_batch` null beside
    `stops_paying_checked_up_to_batch`); None without a speculation note."""
    if not isinstance(spec, dict) or not spec:
        return None
    stops = spec.get("stops_paying_at_batch")
    if stops is not None:
        return stops
    top = spec.get("stops_paying_checked_up_to_batch")
    return f"never (up to {top})" if top else "never"


def _yes_no(x: Any) -> Any:
    return None if x is None else ("yes" if x else "no")


@dataclass(frozen=True)
class RecColumn:
    path: tuple[str, ...]
    """Where the value sits in one recommendation dict."""
    header: str
    """Human header with its unit, e.g. 'TTFT p99 (ms)'."""
    to_display: Callable[[Any], Any] | None = None
    fmt: str = "g"
    """tabulate float format for the Markdown table."""
    brief: bool = True
    """Shown in the Markdown table too; the rest (details, engine commands) only in CSV/XLSX."""
    optional: bool = False
    """Left out of a table where no row has a value (a feature the plan does not use)."""


def _c(path: str, header: str, conv: Callable[[Any], Any] | None = None, fmt: str = "g",
       brief: bool = True, optional: bool = False) -> RecColumn:
    return RecColumn(tuple(path.split(".")), header, conv, fmt, brief, optional)


RECOMMENDATION_COLUMNS: tuple[RecColumn, ...] = (
    _c("rank", "rank"),
    _c("recommended", "recommended", None, "g", False, True),
    _c("gpu", "GPU"),
    _c("tp", "TP"),
    _c("attention_dp", "attention DP", None, "g", False),
    _c("expert_parallel", "EP", None, "g", False),
    _c("gpus_per_replica", "GPUs per replica"),  # TP alone misreads attention-DP layouts
    _c("replicas", "replicas"),
    _c("gpus_total", "GPUs"),
    _c("max_num_seqs", "max seqs"),
    _c("max_num_batched_tokens", "max batched tokens"),
    _c("weight_dtype_resolved", "weight dtype"),
    _c("kv_dtype_resolved", "KV dtype"),
    _c("features.speculative", "speculative", None, "g", True, True),
    _c("features.spec_tokens", "draft tokens", None, "g", True, True),
    _c("speculation", "speculation stops paying at batch", stops_paying_text, "g", True, True),
    _c("features.max_loras", "LoRA slots", None, "g", True, True),
    _c("features.max_lora_rank", "LoRA rank", None, "g", False, True),
    _c("features.images_per_request", "images per request", None, "g", True, True),
    _c("cost_per_hour", "cost ($/h)", None, ".2f"),
    _c("predicted.ttft_s.p50", "TTFT p50 (ms)", _ms, ".0f", False),
    _c("predicted.ttft_s.p99", "TTFT p99 (ms)", _ms, ".0f"),
    _c("pool_ttft_p99_s", "pool's share of TTFT p99 (ms)", _ms, ".0f", True, True),
    _c("predicted.tbt_s.p50", "TBT p50 (ms)", _ms, ".1f", False),
    _c("predicted.tbt_s.p99", "TBT p99 (ms)", _ms, ".1f"),
    _c("predicted.e2e_s.p99", "E2E p99 (ms)", _ms, ".0f"),
    _c("predicted.output_tokens_per_s", "output throughput (tokens/s)", None, ".0f"),
    _c("predicted.requests_per_s", "throughput (req/s)", None, ".2f", False),
    _c("predicted.mean_running_batch", "mean running batch (seqs)", None, ".1f", False),
    _c("predicted.preemptions", "preemptions", None, "g", False),
    _c("predicted.kv_peak_utilization", "KV peak (%)", _pct, ".0f"),
    _c("capacity_per_replica_rps", "capacity per replica (req/s)", None, ".2f", False),
    _c("per_replica_rate_per_s", "load per replica (req/s)", None, ".2f"),
    _c("binding_constraint", "binding constraint"),
    _c("pool_note", "note", None, "g", True, True),  # a pool row's (CSV: the pool comparison)
    _c("slo_margins.ttft_p99", "TTFT p99 margin (%)", _pct, ".0f", False),
    _c("slo_margins.tbt_p99", "TBT p99 margin (%)", _pct, ".0f", False),
    _c("verified.ok", "verified by sim", _yes_no),
    _c("verified.simulated.ttft_s.p99", "sim TTFT p99 (ms)", _ms, ".0f", False),
    _c("verified.simulated.tbt_s.p99", "sim TBT p99 (ms)", _ms, ".1f", False),
    _c("why_not_first", "why not first"),
    _c("verdict", "which layout wins", None, "g", False, True),
    *(_c(f"engine_flags.{e}", f"{engine_display_name(e)} command", None, "g", False)
      for e in ENGINES),
    _c("calibration", "calibration"),
)


def _layout_cell(rec: Any) -> Any:
    from capplan.plan.launch import layout_cell

    return layout_cell(rec) if isinstance(rec, dict) and rec.get("tp") is not None else None


REPORT_LAYOUT = RecColumn((), "TP", _layout_cell)
"""The reports' TP column (Markdown, HTML; brief tables): the layout's cell, "1xDP8 EP8" where
the TP column alone reads "1" (plan.launch.layout_cell, as the terminal shows it)."""


def _report_layout(cols: list[RecColumn]) -> list[RecColumn]:
    return [REPORT_LAYOUT if c.path == ("tp",) else c for c in cols]


PARETO_COLUMNS: tuple[RecColumn, ...] = (
    _c("gpu", "GPU"),
    _c("tp", "TP"),
    _c("replicas", "replicas"),
    _c("cost_per_hour", "cost ($/h)", None, ".2f"),
    _c("ttft_p99_s", "TTFT p99 (ms)", _ms, ".0f"),
    _c("tbt_p99_s", "TBT p99 (ms)", _ms, ".1f"),
    _c("weight_dtype", "weight dtype"),
    _c("kv_dtype", "KV dtype"),
)
"""Columns of the Pareto front (plan["pareto"]) in every format that shows it."""


def _rows(records: list[dict[str, Any]], cols: Sequence[RecColumn]) -> list[list[Any]]:
    rows = []
    for rec in records:
        row = []
        for c in cols:
            v = dig(rec, c.path)
            if v is not None and c.to_display is not None:
                v = clean_number(c.to_display(v))
            row.append(v)
        rows.append(row)
    return rows


def pareto_table(plan: dict[str, Any]) -> tuple[list[RecColumn], list[list[Any]]]:
    """(columns, rows) of the Pareto front in display units."""
    points = [p for p in plan.get("pareto") or [] if isinstance(p, dict)]
    return list(PARETO_COLUMNS), _rows(points, PARETO_COLUMNS)


def recommendations_of(plan: Any) -> list[dict[str, Any]]:
    """The plan's recommendations, checked for the shape every exporter relies on."""
    if not isinstance(plan, dict):
        raise InputError(f"a plan result must be a dict, got {type(plan).__name__}")
    if "recommendations" not in plan:
        raise InputError("the plan result has no 'recommendations' key; pass the dict that "
                         "`capplan plan --format json` prints")
    recs = plan["recommendations"]
    if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
        raise InputError("plan['recommendations'] must be a list of dicts")
    for i, r in enumerate(recs):
        if "gpu" not in r:
            raise InputError(f"recommendation {i + 1} has no 'gpu' key")
    return recs


def model_plans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Each model's own plan dict: a plan of several models (`models:`) holds one per model,
    each with its recommendations and launch lines; any other plan is its only one."""
    subs = plan.get("models")
    if isinstance(subs, list) and subs and all(isinstance(m, dict) for m in subs):
        return subs
    return [plan]


def rates_title(plan: dict[str, Any]) -> str:
    """"MODEL at RATE req/s" for each model a plan sizes (a report's or manifest's title)."""
    return ", ".join(f"{m.get('model')} at {three_sig(m.get('target_rate_per_s'))} req/s"
                     for m in model_plans(plan))


MODEL_COLUMN = _c("model", "model")
"""First column of a plan of several models: its recommendations are one per model, each
ranked within its model."""


def layout_marks(plan: dict[str, Any]) -> dict[str, str]:
    """"yes" / "no" by layout (aggregated, disaggregated, separate) for the "recommended"
    column: which one the plan recommends (`layout.recommended_layout`); {} for a plan that
    compares no layouts (no disaggregated layout, no pool per lane)."""
    from capplan.export.layout import recommended_layout

    if not (isinstance(plan.get("disaggregated"), dict) or isinstance(plan.get("pools"), dict)):
        return {}
    won = recommended_layout(plan)
    return {k: "yes" if k == won else "no" for k in ("aggregated", "disaggregated",
                                                     "separate")}


def disaggregated_records(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The disaggregated layout's pools as rows of the recommendation table: rank names the
    role; capacity and load per replica are the pool's; TTFT and TBT p99 are the layout's, end
    to end (prefill, KV transfer, decode), as a recommendation's are, beside the pool's own
    share of TTFT p99; the replay of the layout is its simulator check; the verdict says which
    layout wins; the command cells are the pool's launch lines as they run: one replica's, or
    each replica's after a `# replica i on HOSTS` line (`launch_replicas`)."""
    from capplan.plan.flags import replica_comment, runnable
    from capplan.plan.launch import pool_command

    d = plan.get("disaggregated")
    if not isinstance(d, dict):
        return []
    launch = d.get("launch") or {}
    each = d.get("launch_replicas") or {}
    replay = d.get("replay") if isinstance(d.get("replay"), dict) else None
    checked = {"verified": {"ok": replay.get("ok"), "simulated": {
        k: replay.get(k) for k in ("ttft_s", "tbt_s")}}} if replay else {}
    out = []
    for role in ("prefill", "decode"):
        p = d.get(role)
        if not isinstance(p, dict):
            continue
        flags = {k.split("_", 1)[0]: ("\n".join(
                     f"{replica_comment(i, r['hosts'])}\n{runnable(r['command'])}"
                     for i, r in enumerate(each[k])) if k in each
                     else runnable(pool_command(str(v))))
                 for k, v in launch.items() if k.endswith(f"_{role}")}
        keys = ("gpu", "tp", "attention_dp", "expert_parallel", "gpus_per_replica", "replicas",
                "gpus_total", "max_num_seqs", "max_num_batched_tokens", "weight_dtype_resolved",
                "kv_dtype_resolved", "cost_per_hour", "per_replica_rate_per_s")
        out.append({"rank": f"disaggregated {role}",
                    "recommended": layout_marks(plan).get("disaggregated"),
                    **{k: p.get(k) for k in keys},
                    "capacity_per_replica_rps": p.get("rate_per_replica_per_s"),
                    "predicted": {"ttft_s": {"p99": d.get("ttft_p99_s")},
                                  "tbt_s": {"p99": d.get("tbt_p99_s")}},
                    "pool_ttft_p99_s": p.get("ttft_p99_s"), **checked,
                    "verdict": d.get("verdict"), "engine_flags": flags})
    return out


def _used(cols: Sequence[RecColumn], records: list[dict[str, Any]]) -> list[RecColumn]:
    """The columns to show: every one but an optional column no record fills."""
    return [c for c in cols if not c.optional or any(dig(r, c.path) is not None
                                                      for r in records)]


def recommendation_table(plan: dict[str, Any], *, brief: bool = False,
                         also: Sequence[dict[str, Any]] = ()
                         ) -> tuple[list[RecColumn], list[list[Any]]]:
    """(columns, rows) in display units; None marks an empty cell (missing, null or inf).

    brief=True keeps the columns a person reads first (the Markdown table); `also`: further
    rows the same columns will hold (an optional column one of them fills is kept).
    """
    recs = recommendations_of(plan)
    mark = layout_marks(plan)
    if mark:  # the plan compares layouts: rank 1 is the aggregated one's
        recs = [{**r, "recommended": mark["aggregated"] if i == 0 else "no"}
                for i, r in enumerate(recs)]
    cols = _used([c for c in RECOMMENDATION_COLUMNS if c.brief or not brief], [*recs, *also])
    cols = _report_layout(cols) if brief else cols
    if any("model" in r for r in recs):  # several models: say whose each row is
        cols.insert(0, MODEL_COLUMN)
    return cols, _rows(recs, cols)


DISAGG_BRIEF = ("rank", "gpu", "tp", "gpus_per_replica", "replicas", "gpus_total",
                "weight_dtype_resolved", "kv_dtype_resolved", "max_num_seqs", "cost_per_hour",
                "predicted", "pool_ttft_p99_s", "capacity_per_replica_rps",
                "per_replica_rate_per_s")
"""The disaggregated table's columns in the reports (Markdown, HTML); CSV and XLSX have all."""


def disaggregated_table(plan: dict[str, Any], *, brief: bool = False
                        ) -> tuple[list[RecColumn], list[list[Any]]]:
    """(columns, rows) of the disaggregated pools (`disaggregated_records`) in display units:
    the recommendation table's columns, those only recommendations fill left out; brief=True
    keeps the reports' (`DISAGG_BRIEF`)."""
    recs = disaggregated_records(plan)
    cols = [c for c in RECOMMENDATION_COLUMNS if any(dig(r, c.path) is not None for r in recs)
            and (not brief or c.path[0] in DISAGG_BRIEF)]
    cols = _report_layout(cols) if brief else cols
    return cols, _rows(recs, cols)


def fixed_layout_records(plan: dict[str, Any], plan_json: Any = None) -> list[dict[str, Any]]:
    """A plan file's fixed disaggregated layout (JSON `fixed_disaggregated`) as CSV rows, the
    parts every export shows (layout.fixed_layout_sections): one row per line of each part,
    named in the rank column ("fixed disaggregated pools: prefill"), its figures in the note
    column as "header: value; ..." and each launch or verify line there as it runs."""
    from capplan.export.layout import PD_HOSTS, fixed_layout_sections
    from capplan.plan.flags import runnable

    out = []
    for title, headers, rows in fixed_layout_sections(plan, plan_json):
        for first, *rest in rows:
            if title.startswith("launch"):
                note = rest[0] if first == PD_HOSTS else runnable(str(rest[0]))
            elif headers[0] == "what":
                note = rest[0]
            else:
                note = "; ".join(f"{h}: {v}" for h, v in zip(headers[1:], rest, strict=True))
            out.append({"rank": f"fixed disaggregated {title}: {first}", "pool_note": note})
    return out


SHOWN_RECOMMENDATIONS = 10
"""Recommendations the tables people read show (terminal, HTML, Markdown); CSV, XLSX and JSON
hold every one."""


def shown_note(plan: dict[str, Any]) -> str | None:
    """'top 10 of 11 recommendations ...' when a read table leaves some out, else None."""
    n = len(plan.get("recommendations") or [])
    if n <= SHOWN_RECOMMENDATIONS:
        return None
    return (f"top {SHOWN_RECOMMENDATIONS} of {n} recommendations (CSV, XLSX and JSON hold "
            "every one)")


LANE_COLUMNS: tuple[RecColumn, ...] = (
    _c("name", "lane"),
    _c("rate_per_s", "rate (req/s)", None, ".3g"),
    _c("input_len", "input length (tokens)"),
    _c("output_len", "output length (tokens)"),
    _c("ttft_p99_s", "TTFT p99 SLO (ms)", _ms, ".0f"),
    _c("tbt_p99_s", "TBT p99 SLO (ms)", _ms, ".1f"),
    _c("e2e_p99_s", "E2E p99 SLO (ms)", _ms, ".0f"),
    _c("tpot_p99_s", "TPOT p99 SLO (ms)", _ms, ".1f", True, True),
    _c("priority", "priority"),
    _c("arrival", "arrival"),
    _c("burstiness", "burstiness", None, ".2f"),
    _c("adapters", "LoRA adapters", None, "g", True, True),
    _c("popularity", "adapter popularity", None, "g", True, True),
    _c("images_per_request", "images per request", None, "g", True, True),
    _c("image_width", "image width (px)", None, "g", True, True),
    _c("image_height", "image height (px)", None, "g", True, True),
    _c("image_tokens_per_request", "image tokens per request", None, "g", True, True),
)
"""The lanes (plan["lanes"]) in every format: input length is the text, as the plan gave it;
a lane with images has their count, size and tokens beside it."""


def lane_table(plan: dict[str, Any]) -> tuple[list[RecColumn], list[list[Any]]]:
    """(columns, rows) of the plan's lanes in display units; features no lane uses left out."""
    lanes = [ln for ln in plan.get("lanes") or [] if isinstance(ln, dict)]
    cols = _used(LANE_COLUMNS, lanes)
    return cols, _rows(lanes, cols)


POOL_COLUMNS: tuple[RecColumn, ...] = (
    _c("pool", "pool"), _c("gpu", "GPU"), _c("tp", "TP"), _c("replicas", "replicas"),
    _c("gpus_total", "GPUs"), _c("max_num_seqs", "max seqs"),
    _c("max_num_batched_tokens", "max batched tokens"),
    _c("cost_per_hour", "cost ($/h)", None, ".2f"), _c("binding_constraint", "binding constraint"),
    _c("note", "note"),
)
"""The shared pool against a pool per lane (plan["pools"]), as the terminal prints it."""


def pool_records(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """plan["pools"] as rows: the shared pool, each lane's own pool (its configuration, or why
    none), and the per-lane total with which costs less; [] without a pool comparison."""
    pools = plan.get("pools")
    if not isinstance(pools, dict):
        return []
    sep = pools.get("separate") or {}
    best = (plan.get("recommendations") or [{}])[0]  # the shared pool is the table's first
    rows = [{"pool": "shared (all lanes)", **(pools.get("shared") or {}),
             "binding_constraint": best.get("binding_constraint")}]
    rows += [{"pool": f"lane {ln.get('lane')}", **ln, "note": ln.get("error")}
             for ln in sep.get("lanes") or [] if isinstance(ln, dict)]
    rows.append({"pool": "a pool per lane, total", "gpus_total": sep.get("gpus_total"),
                 "cost_per_hour": sep.get("cost_per_hour"),
                 "note": f"cheaper: {pools.get('cheaper')}"})
    return rows


def marked_pools(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The pool comparison's records, each with its "recommended" mark (`layout_marks`: the
    shared pool's is the aggregated layout's, a lane's the pool per lane's)."""
    mark = layout_marks(plan)
    return [{**p, "recommended": mark.get("aggregated") if p["pool"].startswith("shared") else
             mark.get("separate") if p["pool"].startswith("lane ") else None}
            for p in pool_records(plan)]


def pool_table(plan: dict[str, Any]) -> tuple[list[RecColumn], list[list[Any]]]:
    """(columns, rows) of the pool comparison in display units ([] rows without one), with
    the "recommended" column when the plan marks its layouts."""
    recs = marked_pools(plan)
    cols = list(POOL_COLUMNS)
    if any(r.get("recommended") for r in recs):
        cols.append(next(c for c in RECOMMENDATION_COLUMNS if c.path == ("recommended",)))
    return cols, _rows(recs, cols)


def csv_files(plan: dict[str, Any], path: str | Path, run: Any = None) -> list[Staged]:
    """The CSV export rendered: one row per recommendation (header row first), then one per
    pool of the disaggregated layout when the plan has one, then the pool comparison; a day
    plan's schedule beside it (plan.schedule.csv)."""
    path = Path(path)
    # the disaggregated pools (rank says so), then the pool comparison: each pool a row, its
    # name in the rank column
    plan_json = run.export(".json") if run is not None else None
    more = [*disaggregated_records(plan), *fixed_layout_records(plan, plan_json),
            *({**p, "rank": f"pool: {p['pool']}", "pool_note": p.get("note")}
              for p in marked_pools(plan))]
    cols, rows = recommendation_table(plan, also=more)
    rows += _rows(more, cols)

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow([c.header for c in cols])
            for row in rows:
                w.writerow(["" if v is None else v for v in row])

    from capplan.export.day_export import has_day, schedule_csv_file

    return [(path, write), *([schedule_csv_file(plan, path)] if has_day(plan) else [])]
