"""Markdown export: a report a person reads (human units: ms, $/h, %)."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

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
from capplan.export.layout import (
    COMPARISON_TITLE,
    DISAGGREGATED,
    FIXED_TITLE,
    HOSTS_TITLE,
    PD_HOSTS,
    SEPARATE,
    disagg_figures,
    disagg_launch,
    fixed_layout_sections,
    headline,
    recommended_layout,
    sentence,
)
from capplan.models.engine import ENGINES, engine_display_name
from capplan.plan.alternatives import PLAN_NOTES
from capplan.plan.bench_cmds import MEASURE, STEP_LABELS, lane_steps
from capplan.plan.flags import fleet_key, launch_text, runnable
from capplan.plan.launch import sized_for

_ENGINE_TITLES = (*((e, engine_display_name(e)) for e in ENGINES), *STEP_LABELS.items())


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, str):
        return v.replace("|", "\\|").replace("\n", " ")
    return v


def _table(headers: list[str], rows: list[list[Any]], floatfmt: tuple[str, ...] | str | None
           ) -> str:
    """A GitHub table; numbers in `floatfmt` (per column). None: the cells are text already
    formatted (e.g. a day's totals, each row in its own format: day_export.summary_shown),
    shown as given (tabulate would read "52.0" as a number and print 52)."""
    return tabulate([[_cell(v) for v in r] for r in rows], headers=headers, tablefmt="github",
                    floatfmt=floatfmt or "g", missingval="", disable_numparse=floatfmt is None)


def _summary(plan: dict[str, Any]) -> list[str]:
    facts = [("model", plan.get("model")), ("objective", plan.get("objective")),
             ("headroom", plan.get("headroom")),
             ("target rate (req/s)", three_sig(clean_number(plan.get("target_rate_per_s")))),
             ("engine", (plan.get("inputs") or {}).get("engine")),
             ("calibration", next((r.get("calibration") for r in plan.get("recommendations") or []
                                   if isinstance(r, dict)), None))]
    head = headline(plan)
    return [f"- **{sentence(head)}.**",
            *(f"- {k}: {v}" for k, v in facts if v is not None)]


def _lanes(plan: dict[str, Any]) -> list[str]:
    return _section("Workload", lane_table(plan))


def _recommendations(plan: dict[str, Any]) -> list[str]:
    cols, rows = recommendation_table(plan, brief=True)
    if not rows:
        return ["## Recommendations", "", "No configuration meets the constraints.", ""]
    table = _table([c.header for c in cols], rows[:SHOWN_RECOMMENDATIONS],
                   tuple(c.fmt for c in cols))
    note = shown_note(plan)
    told = [sentence(note) + ".", ""] if note else []
    return ["## Recommendations", "", table, "", *told]


def _section(title: str, table: tuple[Any, list[Any]]) -> list[str]:
    """A `## title` section holding a table of (columns, rows); nothing without rows."""
    cols, rows = table
    if not rows:
        return []
    return [f"## {title}", "", _table([c.header for c in cols], rows,
                                       tuple(c.fmt for c in cols)), ""]


def _pools(plan: dict[str, Any], model: str | None = None) -> list[str]:
    """One shared pool against a pool per lane; `model`: one model of a plan of several,
    which its lanes' verify and measure lines name (bench_cmds.verify_call)."""
    out = _section("Pools: one shared pool against a pool per lane", pool_table(plan))
    if recommended_layout(plan) != SEPARATE:
        return out
    # the recommended pools' own lines (the launch section gives the shared pool's)
    for ln in ((plan.get("pools") or {}).get("separate") or {}).get("lanes") or []:
        for key, flag in (ln.get("engine_flags") or {}).items():
            if key in ENGINES and flag:
                out += [f"Lane {ln.get('lane')}, {engine_display_name(key)}:", "", "```bash",
                        runnable(launch_text(ln["engine_flags"], key)), "```", ""]
        steps = lane_steps(ln.get("engine_flags") or {}, str(ln.get("lane")), measure=True,
                           model=model)
        verify = [line for key, _, line in steps if key != MEASURE]
        if verify:  # its own verify steps: the lane's requests alone, at its pool's rate
            out += [f"Lane {ln.get('lane')}, verify:", "", "```bash", *verify, "```", ""]
        out += [part for key, _, line in steps if key == MEASURE  # capplan's own client
                for part in (f"Lane {ln.get('lane')}, {MEASURE}:", "", "```bash", line, "```",
                             "")]
    return out


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
    if recommended_layout(plan) == SEPARATE:  # an alternative on the lanes' GPUs and ports
        lines += [f"{sentence(COMPARISON_TITLE)}.", ""]
    known = [k for k, _ in _ENGINE_TITLES]
    titled = [(k, t) for k, t in _ENGINE_TITLES if flags.get(k)
              # a pool per lane recommended: each lane's pool's verify steps (_pools)
              and not (k in STEP_LABELS and recommended_layout(plan) == SEPARATE)]
    titled += [(k, k) for k in flags
               if k not in known and flags.get(k) and not k.startswith(fleet_key(""))]
    for key, title in titled:  # an engine's fleet of several replicas as it runs on hosts
        text = launch_text(flags, key) if key in ENGINES else flags[key]
        lines += [f"{title}:", "", "```bash", runnable(str(text).rstrip()), "```", ""]
    if recs[0].get("engine"):
        lines += [sized_for(recs[0]).replace("sized for: ", "Sized for ", 1) + ".", ""]
    return lines


def _disaggregated(plan: dict[str, Any]) -> list[str]:
    d = plan.get("disaggregated") or {}
    if not d:
        return []
    cols, rows = disaggregated_table(plan, brief=True)
    won = " (recommended)" if recommended_layout(plan) == DISAGGREGATED else ""
    lines = [f"## Disaggregated prefill/decode{won}", "", str(d.get("verdict", "")), ""]
    if rows:
        lines += [_table([c.header for c in cols], rows, tuple(c.fmt for c in cols)), ""]
    if disagg_figures(d):
        lines += [disagg_figures(d), ""]
    for title, text in disagg_launch(d):
        lines += ([f"{title}: {text}", ""] if title.endswith(HOSTS_TITLE) else
                  [f"{title}:", "", "```bash", runnable(text), "```", ""])
    if d.get("bench"):
        lines += ["verify (the whole workload through the front end):", "", "```bash",
                  str(d["bench_dataset"]), str(d["bench"]), "```", ""]
    return lines


def _fixed_layout(plan: dict[str, Any]) -> list[str]:
    """A plan file's fixed disaggregated layout ([] without one), as the terminal prints it."""
    parts = fixed_layout_sections(plan)
    if not parts:
        return []
    lines = [f"## {sentence(FIXED_TITLE)}", ""]
    for title, headers, rows in parts:
        if title.startswith("launch"):
            lines += [f"{sentence(title)}:", "", "```bash",
                      *(f"# {name}: {line}" if name == PD_HOSTS else f"# {name}\n{runnable(line)}"
                        for name, line in rows), "```", ""]
        else:
            lines += [_table(headers, rows, None), ""]
    return lines


def _assumptions(plan: dict[str, Any]) -> list[str]:
    inp = plan.get("inputs") or {}
    items = [inp.get("max_model_len_reason")] + [
        (plan.get(k) or {}).get("note") for k in PLAN_NOTES]
    items = [str(x) for x in items if x]
    return ["## Assumptions", "", *[f"- {x}" for x in items], ""] if items else []


def _pareto(plan: dict[str, Any]) -> list[str]:
    return _section("Pareto front (cost against latency)", pareto_table(plan))


def _model_parts(plan: dict[str, Any], model: str | None = None) -> list[str]:
    """One model's report: its summary, workload, recommendations, launch lines and notes;
    `model`: one model of a plan of several (its lanes' measure lines name it)."""
    parts = [*_summary(plan), ""]
    parts += _lanes(plan) + _recommendations(plan) + _pools(plan, model) + _warnings(plan)
    return (parts + _assumptions(plan) + _commands(plan) + _disaggregated(plan)
            + _fixed_layout(plan) + _pareto(plan))


def plan_to_markdown(plan: dict[str, Any], run: Any = None) -> str:
    """The whole report as Markdown text, ending in a newline; `run` (html.Run): the command
    that made it, whose JSON export its verify lines read (as the HTML report's do)."""
    recommendations_of(plan)  # shape check before anything is rendered
    title = f"# Capacity plan: {plan.get('model', 'unnamed model')}"
    parts = [title, ""]
    subs = model_plans(plan)
    if len(subs) == 1:
        parts += _model_parts(plan)
    else:  # several models: each model's report under its own heading, a level down
        for sub in subs:
            parts += [f"## Model: {sub.get('model')}", ""]
            parts += [f"#{ln}" if ln.startswith("## ") else ln
                      for ln in _model_parts(sub, str(sub.get("model")))]
    from capplan.export.day_export import has_day, markdown_section

    if has_day(plan):
        parts += markdown_section(plan, _table)
    from capplan.plan.bench_cmds import reading_plan

    # the verify lines read the plan's JSON: the one this run wrote
    return reading_plan("\n".join(parts).rstrip("\n") + "\n",
                        run.export(".json") if run is not None else None)
