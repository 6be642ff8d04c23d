"""Markdown export: a report a person reads (human units: ms, $/h, %)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tabulate import tabulate

from capplan.export.atomic import atomic_write_text
from capplan.export.csv_export import (
    SHOWN_RECOMMENDATIONS,
    clean_number,
    disaggregated_table,
    lane_table,
    model_plans,
    pareto_table,
    pool_table,
    recommendation_table,
    recommendations_of,
    shown_note,
    three_sig,
)
from capplan.plan.alternatives import PLAN_NOTES
from capplan.plan.launch import pool_command, sized_for

_ENGINE_TITLES = (("vllm", "vLLM"), ("sglang", "SGLang"), ("trtllm", "TensorRT-LLM"),
                  ("bench_dataset", "Benchmark workload"), ("bench", "Benchmark"))


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, str):
        return v.replace("|", "\\|").replace("\n", " ")
    return v


def _table(headers: list[str], rows: list[list[Any]], floatfmt: tuple[str, ...] | str) -> str:
    return tabulate([[_cell(v) for v in r] for r in rows], headers=headers, tablefmt="github",
                    floatfmt=floatfmt, missingval="")


def _summary(plan: dict[str, Any]) -> list[str]:
    facts = [("model", plan.get("model")), ("objective", plan.get("objective")),
             ("headroom", plan.get("headroom")),
             ("target rate (req/s)", three_sig(clean_number(plan.get("target_rate_per_s")))),
             ("engine", (plan.get("inputs") or {}).get("engine")),
             ("calibration", next((r.get("calibration") for r in plan.get("recommendations") or []
                                   if isinstance(r, dict)), None))]
    return [f"- {k}: {v}" for k, v in facts if v is not None]


def _lanes(plan: dict[str, Any]) -> list[str]:
    return _section("Workload", lane_table(plan))


def _recommendations(plan: dict[str, Any]) -> list[str]:
    cols, rows = recommendation_table(plan, brief=True)
    if not rows:
        return ["## Recommendations", "", "No configuration meets the constraints.", ""]
    table = _table([c.header for c in cols], rows[:SHOWN_RECOMMENDATIONS],
                   tuple(c.fmt for c in cols))
    note = shown_note(plan)
    told = [note[0].upper() + note[1:] + ".", ""] if note else []
    return ["## Recommendations", "", table, "", *told]


def _section(title: str, table: tuple[Any, list[Any]]) -> list[str]:
    """A `## title` section holding a table of (columns, rows); nothing without rows."""
    cols, rows = table
    if not rows:
        return []
    return [f"## {title}", "", _table([c.header for c in cols], rows,
                                       tuple(c.fmt for c in cols)), ""]


def _pools(plan: dict[str, Any]) -> list[str]:
    return _section("Pools: one shared pool against a pool per lane", pool_table(plan))


def _warnings(plan: dict[str, Any]) -> list[str]:
    warnings = [str(w) for w in plan.get("warnings") or []]
    body = [f"- {w}" for w in warnings] if warnings else ["None."]
    return ["## Warnings", "", *body, ""]


def _commands(plan: dict[str, Any]) -> list[str]:
    recs = recommendations_of(plan)
    flags = recs[0].get("engine_flags") if recs else None
    if not isinstance(flags, dict) or not flags:
        return []
    lines = [f"## Engine commands (rank {recs[0].get('rank', 1)}: {recs[0]['gpu']})", ""]
    known = [k for k, _ in _ENGINE_TITLES]
    titled = [(k, t) for k, t in _ENGINE_TITLES if flags.get(k)]
    titled += [(k, k) for k in flags if k not in known and flags.get(k)]
    for key, title in titled:
        lines += [f"{title}:", "", "```bash", str(flags[key]).rstrip(), "```", ""]
    if recs[0].get("engine"):
        lines += [sized_for(recs[0]).replace("sized for: ", "Sized for ", 1) + ".", ""]
    return lines


_DISAGG_BRIEF = ("rank", "gpu", "tp", "gpus_per_replica", "replicas", "gpus_total",
                 "weight_dtype_resolved", "kv_dtype_resolved", "max_num_seqs", "cost_per_hour",
                 "predicted", "pool_ttft_p99_s", "capacity_per_replica_rps",
                 "per_replica_rate_per_s")
"""The disaggregated table's columns in the report (the CSV and XLSX have every one)."""


def _disaggregated(plan: dict[str, Any]) -> list[str]:
    d = plan.get("disaggregated") or {}
    if not d:
        return []
    cols, rows = disaggregated_table(plan)
    keep = [i for i, c in enumerate(cols) if c.path[0] in _DISAGG_BRIEF]
    lines = ["## Disaggregated prefill/decode", "", str(d.get("verdict", "")), ""]
    if rows:
        lines += [_table([cols[i].header for i in keep], [[r[i] for i in keep] for r in rows],
                         tuple(cols[i].fmt for i in keep)), ""]
    lines += _disagg_figures(d)
    for key, line in (d.get("launch") or {}).items():
        lines += _disagg_launch(key, str(line), d)
    if d.get("bench"):
        lines += ["verify (the whole workload through the front end):", "", "```bash",
                  str(d["bench_dataset"]), str(d["bench"]), "```", ""]
    return lines


def _disagg_figures(d: dict[str, Any]) -> list[str]:
    """The layout's end-to-end figures and KV transfer, as the terminal prints them."""
    if not isinstance(d.get("prefill"), dict):
        return []
    tx = d.get("kv_transfer_s") or {}
    return [f"TTFT p99 {_fmt_ms(d.get('ttft_p99_s'), '.0f')} ms end to end (prefill + KV "
            f"transfer + decode admission), TBT p99 {_fmt_ms(d.get('tbt_p99_s'), '.1f')} ms; "
            f"ratio {d.get('ratio')} (prefill:decode); KV transfer "
            f"{_fmt_ms(tx.get('mean'), '.2f')} ms mean, {_fmt_ms(tx.get('p99'), '.2f')} ms p99 "
            f"over {d.get('kv_link')}.", ""]


def _fmt_ms(x: Any, fmt: str) -> str:
    x = clean_number(x)
    return format(x * 1e3, fmt) if isinstance(x, int | float) else "?"


def _disagg_launch(key: str, line: str, d: dict[str, Any]) -> list[str]:
    """One launch line of the layout under its title: a pool's as its first replica runs it
    (the replica count in the title), the front end's, or where each replica runs."""
    engine, _, role = key.partition("_")
    name = dict(_ENGINE_TITLES).get(engine, engine)
    if role == "hosts":
        return [f"{name}, where each replica runs: {line}", ""]
    pool = d.get(role) if role in ("prefill", "decode") else None
    if isinstance(pool, dict):
        n = pool.get("replicas")
        title = (f"{name} {role} (1 replica):" if n == 1 else
                 f"{name} {role} ({n} replicas; the first's line, the others take the next "
                 "GPUs, port + 1 or the next host):")
        line = pool_command(line)
    else:
        title = f"{name} {role}:"
    return [title, "", "```bash", line, "```", ""]


def _assumptions(plan: dict[str, Any]) -> list[str]:
    inp = plan.get("inputs") or {}
    items = [inp.get("max_model_len_reason")] + [
        (plan.get(k) or {}).get("note") for k in PLAN_NOTES]
    items = [str(x) for x in items if x]
    return ["## Assumptions", "", *[f"- {x}" for x in items], ""] if items else []


def _pareto(plan: dict[str, Any]) -> list[str]:
    return _section("Pareto front (cost against latency)", pareto_table(plan))


def _model_parts(plan: dict[str, Any]) -> list[str]:
    """One model's report: its summary, workload, recommendations, launch lines and notes."""
    parts = [*_summary(plan), ""]
    parts += _lanes(plan) + _recommendations(plan) + _pools(plan) + _warnings(plan)
    return parts + _assumptions(plan) + _commands(plan) + _disaggregated(plan) + _pareto(plan)


def plan_to_markdown(plan: dict[str, Any]) -> str:
    """The whole report as Markdown text, ending in a newline."""
    recommendations_of(plan)  # shape check before anything is rendered
    title = f"# Capacity plan: {plan.get('model', 'unnamed model')}"
    parts = [title, ""]
    subs = model_plans(plan)
    if len(subs) == 1:
        parts += _model_parts(plan)
    else:  # several models: each model's report under its own heading, a level down
        for sub in subs:
            parts += [f"## Model: {sub.get('model')}", ""]
            parts += [f"#{ln}" if ln.startswith("## ") else ln for ln in _model_parts(sub)]
    from capplan.export.day_export import has_day, markdown_section

    if has_day(plan):
        parts += markdown_section(plan, _table)
    return "\n".join(parts).rstrip("\n") + "\n"


def write_markdown(plan: dict[str, Any], path: str | Path) -> Path:
    """Write the Markdown report, atomically."""
    path = Path(path)
    atomic_write_text(path, plan_to_markdown(plan))
    return path
