"""`capplan recommend`, `capplan plan FILE.yaml`, `capplan schema`."""

from __future__ import annotations

import json
import os
import shlex
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import yaml
from click.core import ParameterSource

from capplan import limits
from capplan.catalog.loader import load_catalog
from capplan.cli._day import day_options, day_spec
from capplan.cli._features import (
    pop_plan_features,
    recommend_feature_options,
    refuse_orphan_features,
)
from capplan.cli._options import (
    BURSTINESS,
    ENGINE,
    ENGINE_HELP,
    FRACTION,
    HEADROOM,
    POS_INT,
    RATE,
    SECONDS,
    IntList,
    catalog_option,
    format_option,
)
from capplan.cli._prefix import pop_prefix_spec, prefix_options
from capplan.cli._render import Column, emit, render_rows, to_json
from capplan.errors import InputError
from capplan.export.csv_export import SHOWN_RECOMMENDATIONS, pool_records, shown_note
from capplan.export.layout import (
    AGGREGATED,
    COMPARISON_TITLE,
    DISAGGREGATED,
    SEPARATE,
    headline,
    recommended_layout,
    unverified_text,
)
from capplan.limits import DEFAULT_HEADROOM
from capplan.models.engine import ENGINES, engine_display_name
from capplan.plan.alternatives import PLAN_NOTES
from capplan.plan.bench_cmds import STEP_LABELS, lane_step_lines, step_lines
from capplan.plan.flags import launch_text
from capplan.plan.launch import fleet_words, layout_cell, layout_of, pool_command, sized_for
from capplan.plan.placement import labelled
from capplan.plan.result import PlanResult
from capplan.plan.schema import PlanFile, load_plan, plan_json_schema

ms = lambda x: None if x is None else x * 1e3  # noqa: E731


@contextmanager
def _verifier(enabled: bool, jobs: int | None = None) -> Iterator[Any]:
    """The verification simulator for run_plan: serial, or a ParallelVerifier whose workers
    (forked at once, loading the compiled engine) stop when the command ends."""
    if not enabled:
        yield None
        return
    from capplan.plan.verify import ParallelVerifier, simulate_recommendation

    n = jobs if jobs is not None else (len(os.sched_getaffinity(0))
                                       if hasattr(os, "sched_getaffinity") else os.cpu_count())
    if (n or 1) <= 1:
        yield simulate_recommendation
        return
    # the default leaves a core to the analytic search (ParallelVerifier's spare_core)
    with ParallelVerifier(n or 1, spare_core=jobs is None) as v:
        yield v


JOBS_OPTION = click.option(
    "--jobs", type=click.IntRange(min=1, max=256), default=None,
    help="Processes for the simulator verification (default: one fewer than the cores "
         "available, at least one); the answer is the same as with --jobs 1.")


def _finish(plan: PlanResult, fmt: str, exports: list[Path], plot_dir: str | None) -> None:
    """Exports and charts (all rendered, then written all or none), then the answer. An export
    that refuses the plan (a TensorRT-LLM replica over hosts in Kubernetes manifests) writes
    nothing: the answer is printed as without the exports, then the refusal is the error."""
    from capplan.cli import ARGS_KEY
    from capplan.export import export_files
    from capplan.export.atomic import atomic_write_all
    from capplan.export.html import Run

    result = plan.to_dict()  # the export edge: from here on, the JSON contract's dict
    args = click.get_current_context().meta.get(ARGS_KEY)
    run = Run(None if args is None else shlex.join(["capplan", *args]),
              tuple(str(p) for p in exports))
    try:
        files = [f for path in exports for f in export_files(result, path, run)]
        if plot_dir:
            from capplan.export.plots import plan_chart_files

            files += plan_chart_files(result, plot_dir)
    except InputError:
        _answer(result, fmt, [])  # the plan is still the answer
        raise
    for p in atomic_write_all(files):
        click.echo(f"wrote {p}", err=True)
        if str(p).endswith((".k8s.yaml", ".llm-d.yaml")):  # its header says the same
            from capplan.plan.feature_flags import placeholder_note

            todo = placeholder_note(list(yaml.safe_load_all(Path(p).read_text("utf-8"))))
            if todo:
                click.echo(f"warning: {p}: {todo}", err=True)
    _answer(result, fmt, exports)


def _answer(result: dict[str, Any], fmt: str, exports: list[Path]) -> None:
    """The answer in `fmt`; its verify lines name the JSON export among `exports` (written)."""
    from capplan.export import export_kind

    if fmt == "json":
        emit(to_json(result))
        return
    if fmt in ("csv", "markdown"):  # machine-readable: the table alone
        if "schedule" in result:  # a day plan: recommendations, launch, schedule, totals
            emit(day_sections(result, fmt))
            return
        emit(machine_sections(result, fmt))
        return
    _emit_text(result, fmt, next((p for p in exports if export_kind(p) == ".json"), None))


def _emit_text(result: dict[str, Any], fmt: str, plan_json: Path | None) -> None:
    """The table output. Its verify commands read the plan's JSON: they name the JSON export
    just written (`capplan verify /tmp/p.json ...`), else the placeholder PLAN.json."""

    from capplan.plan.bench_cmds import reading_plan

    def say(text: str) -> None:
        emit(reading_plan(text, plan_json))

    if "models" in result and "schedule" in result:  # several models on one pool
        from capplan.cli._day import day_lines, render_day, scale_up_line

        for m in result["models"]:  # each model's plan and its day (its schedule in JSON)
            say(render_plan(m, fmt))
            say("\n".join([f"{m['model']} over the day:", *scale_up_line(m), *day_lines(m)]))
            for text in lane_day_texts(m, str(m["model"])):
                say(text)
        say(render_day(result, fmt))
        return
    say(render_plan(result, fmt))
    for text in lane_day_texts(result):
        say(text)
    if result.get("disaggregated"):
        say(render_disagg(result["disaggregated"]))
    if "schedule" in result:
        from capplan.cli._day import render_day

        say(render_day(result, fmt))
    if result.get("fixed_disaggregated"):
        from capplan.cli._pd import pd_table

        say("\nthe plan's fixed disaggregated layout:\n"
            + pd_table(result["fixed_disaggregated"], fmt))


def lane_day_texts(result: dict[str, Any], model: str | None = None) -> list[str]:
    """Each lane's own day on its pool (a plan of a pool per lane, `lane_days`): "lane NAME
    over the day, on its own pool (at its peak FLEET):", its scale-ups and day lines; `model`:
    one model of a plan of several, which the header names (two models may share lane
    names)."""
    from capplan.cli._day import day_lines, scale_up_line
    from capplan.export.layout import fleet_text

    of = "" if model is None else f" of {model}"
    return ["\n".join([f"lane {ln['lane']}{of} over the day, on its own pool (at its peak "
                       f"{fleet_text(ln['recommendations'][0])}):", *scale_up_line(ln),
                       *day_lines(ln)]) for ln in result.get("lane_days") or []]


def day_sections(result: dict[str, Any], fmt: str) -> str:
    """A day plan in CSV or Markdown: which layout is recommended (the sentence every format
    gives, `layout.headline`, each model's for several), the recommendations (each model's, a
    `model` column first for several; a `recommended` column when a plan compares layouts),
    the recommended fleet's launch lines (each lane's pool's when a pool per lane is
    recommended), the disaggregated layout's pools and the pool comparison when there are,
    the schedule and the totals.
    Sections are separated by a blank line, each with its own header row (as `latency
    --format csv` and the `.schedule.csv` export); Markdown titles each with a heading."""
    from capplan.cli._day import schedule_sections
    from capplan.export.csv_export import marked_pools

    plans = result.get("models") or [result]
    several = "models" in result
    first = [Column("model", "model")] * several
    said = [{"model": p["model"], "recommended": headline(p).removeprefix("recommended: ")}
            for p in plans]
    rows = [{**r, "model": p["model"]} for p in plans for r in _marked_rows(p)]
    marked = any(r.get("recommended") for r in rows)
    cols = first + PLAN_COLUMNS + [Column("recommended", "recommended")] * marked
    launch = [{"model": p["model"], "engine": engine_display_name(key) + tag,
               "command": launch_text(flags, key)}
              for p in plans for tag, flags in _deployed_flags(p)
              for key in ENGINES if key in flags]
    lcols = first + [Column("engine", "engine"), Column("command", "launch command")]
    pools = [{**r, "model": p["model"]} for p in plans for r in marked_pools(p)]
    pcols = first + POOL_COLUMNS + [Column("binding_constraint", "binding constraint"),
                                    Column("recommended", "recommended")]
    if fmt == "markdown":  # a command (one line per host) stays whole in a code block
        ltext = "\n\n".join(f"{_headed(r['engine'], r['model'] if several else None)}"
                             f":\n```sh\n{r['command']}\n```" for r in launch)
    else:
        ltext = render_rows(launch, lcols, fmt)
    disagg = "" if several else _disagg_section(result, fmt)
    sections = [("recommendations", render_rows(rows, cols, fmt)), ("launch", ltext),
                *([("disaggregated", disagg)] if disagg else []),
                *([("pools", render_rows(pools, pcols, fmt))] if pools else []),
                *schedule_sections(result, fmt)]
    if fmt == "csv":
        head = render_rows(said, first + [Column("recommended", "recommended")], fmt)
        return "\n\n".join([head, *(text for _, text in sections)])
    head = "\n\n".join("Recommended" + (f" ({s['model']})" if several else "")
                        + f": {s['recommended']}" for s in said)
    return "\n\n".join([head, *(f"## {title}\n\n{text}" for title, text in sections)])


def _marked_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's recommendation rows, each marked "recommended" (yes/no) when the plan
    compares layouts (`layout_marks`, as the CSV export's): rank 1 is the aggregated one."""
    from capplan.export.csv_export import layout_marks

    marks = layout_marks(result)
    return [{**r, "recommended": (marks.get("aggregated") if r.get("rank") == 1 else "no")
             if marks else None} for r in _plan_rows(result)]


def _deployed_flags(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(engine label suffix, engine_flags) of the fleets the plan recommends: each lane's pool
    (" (lane NAME)") when it recommends a pool per lane, else rank 1's ("")."""
    if recommended_layout(result) == SEPARATE:
        return [(f" (lane {ln['lane']})", ln["engine_flags"])
                for ln in result["pools"]["separate"]["lanes"]]
    return [("", result["recommendations"][0]["engine_flags"])]


def machine_sections(result: dict[str, Any], fmt: str) -> str:
    """A plan in CSV or Markdown: which layout is recommended (the sentence every format
    gives, `layout.headline`), the recommendations (a `recommended` column when the plan
    compares layouts, as the CSV export's), the pool comparison when there is one. Sections
    are separated by a blank line, each with its own header row (CSV) or heading (Markdown)."""
    from capplan.export.csv_export import layout_marks, marked_pools

    marks = layout_marks(result)
    rows = _marked_rows(result)
    cols = PLAN_COLUMNS + ([Column("recommended", "recommended")] if marks else [])
    said = headline(result).removeprefix("recommended: ")
    pools = marked_pools(result)
    pcols = POOL_COLUMNS + [Column("binding_constraint", "binding constraint"),
                            Column("recommended", "recommended")]
    disagg = _disagg_section(result, fmt)
    if fmt == "csv":
        parts = [render_rows([{"recommended": said}], [Column("recommended", "recommended")],
                             fmt), render_rows(rows, cols, fmt)]
        return "\n\n".join(parts + [disagg] * bool(disagg)
                           + ([render_rows(pools, pcols, fmt)] if pools else []))
    parts = [f"Recommended: {said}", "## recommendations", render_rows(rows, cols, fmt)]
    if disagg:
        parts += ["## disaggregated", disagg]
    if pools:
        parts += ["## pools", render_rows(pools, pcols, fmt)]
    return "\n\n".join(parts)


def _headed(engine: str, model: str | None) -> str:
    """A Markdown launch block's heading: the engine (its lane in parentheses) and, in a plan of
    several models, the model, in one parenthesis ("vLLM (llama-3.1-70b, lane chat)")."""
    if model is None:
        return engine
    name, paren, rest = engine.partition(" (")
    return f"{name} ({model}, {rest}" if paren else f"{engine} ({model})"


def _disagg_section(result: dict[str, Any], fmt: str) -> str:
    """The disaggregated layout's pools as the .csv export gives them (`disaggregated_table`:
    every column in CSV, the reports' in Markdown, with the `recommended` mark); "" without
    the layout."""
    from capplan.export.csv_export import DISAGG_BRIEF, disaggregated_table

    cols, table = disaggregated_table(result)
    keep = [i for i, c in enumerate(cols)
            if fmt == "csv" or c.path[0] in (*DISAGG_BRIEF, "recommended")]
    if not table:
        return ""
    return render_rows([{str(i): row[i] for i in keep} for row in table],
                       [Column(str(i), cols[i].header) for i in keep], fmt)


def render_disagg(d: dict[str, Any]) -> str:
    """The disaggregated layout beside the aggregated table: both pools, ratio, transfer,
    verdict, launch lines."""
    lines = ["", "disaggregated prefill/decode:"]
    for role in ("prefill", "decode"):
        p = d.get(role)
        if p:
            layout = p.get("layout") or f"TP {p['tp']}"  # plans written before layouts
            load = p.get("per_replica_rate_per_s")
            carried = "" if load is None else f", carrying {load:.3g}"
            lines.append(f"  {role:<8} {p['replicas']} x {p['gpu']} ({layout}), "
                         f"{p['gpus_total']} GPUs, each replica up to "
                         f"{p['rate_per_replica_per_s']:.3g} req/s{carried}, TTFT p99 share "
                         f"{p['ttft_p99_s'] * 1e3:.0f} ms")
    if d.get("prefill"):
        lines.append(f"  ratio {d['ratio']} (prefill:decode); KV transfer "
                     f"{d['kv_transfer_s']['mean'] * 1e3:.2f} ms mean, "
                     f"{d['kv_transfer_s']['p99'] * 1e3:.2f} ms p99 over {d['kv_link']}")
        lines.append(f"  TTFT p99 {d['ttft_p99_s'] * 1e3:.0f} ms (prefill + transfer + decode "
                     f"admission), TBT p99 {d['tbt_p99_s'] * 1e3:.1f} ms")
    lines += textwrap.wrap(d["verdict"], 118, initial_indent="  ", subsequent_indent="  ")
    each = d.get("launch_replicas") or {}
    for key, line in (d.get("launch") or {}).items():  # launch lines stay whole, as above
        engine, _, role = key.partition("_")
        label = engine_display_name(engine)
        # a pool of several replicas: each replica's own line (its GPUs, ports, hosts)
        texts = ([(f"{label} {role} {i} ({r['hosts']}): ", r["command"])
                  for i, r in enumerate(each[key])] if key in each
                 else [(f"{label} {role}: ", pool_command(line))])
        lines += [labelled(head, text) for head, text in texts]  # a line per host
    if d.get("bench"):  # the whole workload through the front end
        lines += step_lines(d)
    return "\n".join(lines)


PLAN_COLUMNS = [
    Column("rank", "#"), Column("gpu", "GPU"), Column("tp", "TP"),
    Column("replicas", "replicas"), Column("gpus_total", "GPUs"),
    Column("weight_dtype_resolved", "weights"), Column("kv_dtype_resolved", "KV"),
    Column("max_num_seqs", "max\nseqs"), Column("max_num_batched_tokens", "chunk\n(tok)"),
    Column("ttft_p99", "TTFT p99\n(ms)", ms, ".0f"), Column("tbt_p99", "TBT p99\n(ms)", ms,
                                                               ".1f"),
    Column("capacity_per_replica_rps", "req/s per\nreplica", None, ".3g"),
    Column("cost_per_hour", "cost\n($/h)", None, ".2f"),
    Column("binding_constraint", "binding", lambda b: _SHORT_BINDING.get(b, b)),
]
_SHORT_BINDING = {"concurrency cap (max_num_seqs)": "max_num_seqs cap"}
"""Table abbreviations (the full names stay in JSON, CSV and the lines under the table)."""


def _plan_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**r, "ttft_p99": r["predicted"]["ttft_s"]["p99"],
             "tbt_p99": r["predicted"]["tbt_s"]["p99"], "layout_cell": layout_cell(r)}
            for r in result["recommendations"]]


def render_plan(result: dict[str, Any], fmt: str) -> str:
    rows = _plan_rows(result)
    cols = PLAN_COLUMNS  # a layout past TP in the TP column ("1xDP16 EP16"): GPUs = its product
    if any(r["layout_cell"] != str(r["tp"]) for r in rows):
        cols = [Column("layout_cell", "TP") if c.key == "tp" else c for c in cols]
    out = [f"{result['model']}: {result['target_rate_per_s']:g} req/s, headroom "
           f"{result['headroom']:.0%}, objective {result['objective']} "
           f"({result['configurations_searched']} configurations searched)", "",
           render_rows(rows[:SHOWN_RECOMMENDATIONS], cols, fmt)]
    if shown_note(result):
        out.append(str(shown_note(result)))
    best = result["recommendations"][0]
    margins = ", ".join(f"{k} {v:+.0%}" for k, v in best["slo_margins"].items())
    ver = best.get("verified")
    at = (ver or {}).get("rate_per_s")
    vtxt = unverified_text(best) if not ver else (
        ("simulator confirms" + (f" it at {at:.3g} req/s per replica" if at else ""))
        if ver.get("ok") else f"simulator: {ver.get('reason')}")
    # the layout the plan recommends, as every export and the Kubernetes manifests say it: a
    # disaggregated layout that wins or a pool per lane first, then the table's rank 1
    layout = recommended_layout(result)
    lead = {AGGREGATED: "recommended", DISAGGREGATED: "rank 1, the best aggregated fleet"
            }.get(layout, "rank 1, one shared pool")
    out += ["", *([headline(result)] * (layout != AGGREGATED)),
            f"{lead}: {fleet_words(best)}; "
            "each replica carries up to "
            f"{best['capacity_per_replica_rps']:.3g} req/s, limited by (binding constraint) "
            f"{best['binding_constraint']}; at the planned "
            f"{best['per_replica_rate_per_s']:.3g} req/s per replica the SLO margins are "
            f"{margins or 'none (no SLOs)'}; {vtxt}"]
    spec = speculation_line(best)
    if spec:
        out.append(spec)
    for r in result["recommendations"][1:4]:
        out.append(textwrap.fill(f"#{r['rank']} {r['gpu']} {layout_of(r)}: {r['why_not_first']}",
                                 120, initial_indent="  ", subsequent_indent="      ",
                                 break_on_hyphens=False))
    out += _pool_lines(result, fmt)
    flags = best["engine_flags"]
    head = []
    if recommended_layout(result) == SEPARATE:  # verified by each lane's pool's steps above
        flags = {k: v for k, v in flags.items() if k not in STEP_LABELS}
        head = [f"{COMPARISON_TITLE}:"]  # an alternative on the lanes' GPUs and ports
    out += ["", *head, *launch_block(flags), sized_for(best),
            f"calibration: {best.get('calibration', '')}"]
    reason = result.get("inputs", {}).get("max_model_len_reason")
    if reason:
        out.append(reason)
    for key in PLAN_NOTES:  # what the plan assumed, what it left out
        if (result.get(key) or {}).get("note"):
            out.append(result[key]["note"])
    for w in result.get("warnings", []):
        out.append(f"warning: {w}")
    # prose wraps at 120 columns; the table is built to fit, and launch lines stay whole (to copy)
    # also "vLLM (lane):" lines of separate pools, and the files a line reads ("  ")
    keep = (*(engine_display_name(e) for e in ENGINES), *STEP_LABELS.values(), "  ")
    return "\n".join(line if "\n" in line or line.startswith(keep) else
                     textwrap.fill(line, 120, subsequent_indent="    ", break_on_hyphens=False)
                     for line in out)


def speculation_line(rec: dict[str, Any]) -> str:
    """What a plan with speculative decoding chose and where it stops paying ("" without
    speculation): the draft length, the speed-up at batch 1 and the batch from which decoding
    without it is faster (JSON `speculation`, `features`)."""
    sp, f = rec.get("speculation") or {}, rec.get("features") or {}
    if not f.get("speculative") or not sp:
        return ""
    stop = sp.get("stops_paying_at_batch")
    pays = (f"stops paying from batch {stop}" if stop is not None else
            f"pays at every batch up to {sp.get('stops_paying_checked_up_to_batch')}")
    return (f"speculation: {f['speculative']}, {f.get('spec_tokens')} draft tokens, "
            f"{sp.get('speedup_at_batch_1', float('nan')):.2f}x at batch 1; {pays}")


_LABEL_WIDTH = max(len(engine_display_name(e)) for e in ENGINES) + 2
"""The launch lines' label column: the longest engine name, its colon and a space."""


def launch_block(flags: dict[str, str]) -> list[str]:
    """The launch lines (a fleet of several replicas as it runs on hosts: each replica's, the
    router's, where each runs), the files a line reads (indented), the verify steps."""
    out = []
    for key in ENGINES:
        if key not in flags:
            continue
        label = f"{engine_display_name(key)}:".ljust(_LABEL_WIDTH)
        out += labelled(label, launch_text(flags, key)).split("\n")  # a line per host
        for name, text in flags.items():
            if name.startswith(f"file:{key}:"):
                flow = yaml.safe_dump(yaml.safe_load(text), default_flow_style=True).strip()
                head = f"  {name.split(':', 2)[2]} (the file this line reads): "
                if len(head) + len(flow) > 120:  # speculation and LoRA lengthen it: wrap
                    flow = "\n    " + yaml.safe_dump(yaml.safe_load(text), width=90,
                                                     default_flow_style=True
                                                     ).strip().replace("\n", "\n    ")
                out.append(head.rstrip() + (flow if flow.startswith("\n") else " " + flow))
    # (the dataset step names PLAN.json: this plan, written with --export PLAN.json)
    return out + step_lines(flags)


POOL_COLUMNS = [
    Column("pool", "pool"), Column("gpu", "GPU"), Column("tp", "TP"),
    Column("replicas", "replicas"), Column("gpus_total", "GPUs"),
    Column("max_num_seqs", "max seqs"), Column("max_num_batched_tokens", "chunk (tok)"),
    Column("cost_per_hour", "cost ($/h)", None, ".2f"), Column("note", "note"),
]


def _pool_lines(result: dict[str, Any], fmt: str) -> list[str]:
    """One shared pool against a pool per lane, each lane's pool with its own launch line."""
    pools = result.get("pools")
    if not pools:
        return []
    lanes = pools["separate"]["lanes"]
    rows = pool_records(result)  # the rows every export shows
    title = ("pools (you asked for a pool per lane; the table above is one shared pool, for "
             "comparison):" if result.get("inputs", {}).get("pools") == "separate"
             else "pools:")
    out = ["", title, render_rows(rows, POOL_COLUMNS, fmt)]
    # each lane's lines, every engine's the plan gives (as the HTML and Markdown reports)
    for ln in lanes:
        flags = ln.get("engine_flags") or {}
        out += [labelled(f"{engine_display_name(key)} ({ln['lane']}): ", launch_text(flags, key))
                for key in ENGINES if flags.get(key)]
        if recommended_layout(result) == SEPARATE:  # the recommended pools' own verify steps
            out += lane_step_lines(flags, str(ln["lane"]))
    return out


def _check_outputs(plan: PlanFile, exports: list[Path], plot_dir: str | None) -> list[Path]:
    """Before the plan runs: every export (each once) and chart can be written where asked
    (`capplan.export.check_exports`; the chart folder exists, as an export's must)."""
    from capplan.export import check_exports
    from capplan.models.engine import engine_profile

    specs = [plan.engine, *(m.engine for m in plan.models or [] if m.engine)]
    out = check_exports(exports, day=plan.is_day, models=[m.model for m in plan.models or []],
                        engines=[engine_profile(e.name).name for e in specs if e is not None])
    if plot_dir:
        from capplan.export.plots import check_charts, plan_chart_stems

        check_charts(plot_dir, plan_chart_stems(plan.is_day))
    return out


@click.command("recommend")
@click.option("--model", required=True, help="Model: catalog key or Hugging Face id.")
@click.option("--rate", type=RATE, default=None,
              help="Total arrival rate (requests/s); or --trace / --rate-curve for a day.")
@click.option("--input-len", default="512", show_default=True,
              help="Prompt tokens: a number or a distribution.")
@click.option("--output-len", default="256", show_default=True,
              help="Output tokens: a number or a distribution.")
@click.option("--ttft-p99", type=SECONDS, default=None,
              help="p99 TTFT SLO (seconds, or with a unit: 800ms).")
@click.option("--tbt-p99", type=SECONDS, default=None,
              help="p99 time-between-tokens SLO (seconds, or with a unit: 50ms).")
@click.option("--e2e-p99", type=SECONDS, default=None,
              help="p99 end-to-end SLO (seconds, or with a unit: 2m).")
@click.option("--gpu", "gpus", multiple=True, help="Candidate GPU (repeat); default: all.")
@click.option("--price", "prices", multiple=True, metavar="GPU=USD",
              help="Your price per GPU-hour, e.g. --price h200=3.5 (repeat).")
@click.option("--tp", "tps", type=IntList(limits.PARALLEL), default=None,
              help="TP sizes, e.g. 1,2,4,8.")
@click.option("--weight-dtype", "weight_dtypes", multiple=True,
              type=click.Choice(["auto", "fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4"]))
@click.option("--kv-dtype", "kv_dtypes", multiple=True,
              type=click.Choice(["auto", "bf16", "fp16", "fp8"]))
@click.option("--max-num-seqs", type=IntList(), default=None, help="Values to search.")
@click.option("--max-num-batched-tokens", type=IntList(), default=None,
              help="Prefill chunk sizes to search.")
@click.option("--max-model-len", type=POS_INT, default=None)
@click.option("--engine", type=ENGINE, default="vllm", show_default=True, help=ENGINE_HELP)
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="Calibration YAML for the GPU it was measured on (others keep theirs).")
@click.option("--gpu-memory-utilization", type=FRACTION, default=None,
              help="The engine's memory fraction (default: the engine's for each GPU).")
@click.option("--burstiness", type=BURSTINESS, default=1.0, show_default=True)
@click.option("--headroom", type=HEADROOM, default=DEFAULT_HEADROOM, show_default=True,
              help="Extra capacity for bursts (0.2 = 20%); auto: enough to cover the engine's "
                   "optimistic predictions, from its error band (docs/validation.md 4b).")
@click.option("--objective", type=click.Choice(["min_cost", "min_gpus",
                                                "max_goodput_per_dollar"]), default="min_cost",
              show_default=True)
@click.option("--verify-top", type=click.IntRange(min=0), default=5, show_default=True,
              help="Simulate the best N to confirm their SLOs (0: skip).")
@click.option("--allow-near-floor", is_flag=True,
              help="Also recommend fleets whose SLOs keep replicas under 10% of capacity.")
@click.option("--export", "exports", multiple=True,
              help="Write .csv/.json/.md/.xlsx/.k8s.yaml/.llm-d.yaml/.html.")
@click.option("--plot", "plot_dir", default=None, help="Write PNG/SVG charts to this folder.")
@JOBS_OPTION
@prefix_options
@click.option("--tpot-p99", type=SECONDS, default=None,
              help="p99 TPOT SLO (s): a request's mean gap, as vllm bench serve reports it.")
@click.option("--tpot-mean", type=SECONDS, default=None, help="Mean TPOT SLO (seconds).")
@recommend_feature_options
@click.option("--disagg/--no-disagg", default=True, show_default=True,
              help="Also size a disaggregated prefill/decode layout and say which wins.")
@format_option
@catalog_option
@day_options
def recommend_cmd(model: str, rate: float | None, input_len: str, output_len: str,
                  ttft_p99: float | None, tbt_p99: float | None, e2e_p99: float | None,
                  gpus: tuple[str, ...], prices: tuple[str, ...], tps: list[int] | None,
                  weight_dtypes: tuple[str, ...],
                  kv_dtypes: tuple[str, ...], max_num_seqs: list[int] | None,
                  max_num_batched_tokens: list[int] | None, max_model_len: int | None,
                  engine: str, calibration: str | None,
                  gpu_memory_utilization: float | None, burstiness: float, headroom: float,
                  objective: str, verify_top: int, allow_near_floor: bool,
                  exports: tuple[str, ...],
                  plot_dir: str | None, jobs: int | None, fmt: str,
                  catalog_dir: tuple[str, ...], disagg: bool = True,
                  **prefix_kw: Any) -> None:
    """GPU type, count and engine settings for a rate and latency SLOs."""
    from capplan.api_checks import check_names
    from capplan.plan.planner import run_plan

    check_names(model=model)
    out_paths = [Path(p) for p in exports]
    price_map: dict[str, float] = {}
    for item in prices:
        name, _, usd = item.partition("=")
        try:
            price_map[name.strip()] = float(usd)
        except ValueError:
            raise InputError(f"--price {item!r}: expected GPU=USD, e.g. h200=3.5") from None
    ctx = click.get_current_context()
    day = day_lane(prefix_kw, rate)
    refuse_orphan_features(ctx, prefix_kw)
    feat_engine, feat_lane = pop_plan_features(prefix_kw)
    lane: dict[str, Any] = {"name": "default", "rate_per_s": rate, "burstiness": burstiness,
                            "arrival": "poisson" if burstiness == 1.0 else "gamma",
                            "slo": {"ttft_p99_s": ttft_p99, "tbt_p99_s": tbt_p99,
                                    "e2e_p99_s": e2e_p99,
                                    "tpot_p99_s": prefix_kw.pop("tpot_p99", None),
                                    "tpot_mean_s": prefix_kw.pop("tpot_mean", None)}}
    for key, value in (("input_len", input_len), ("output_len", output_len)):
        if ctx.get_parameter_source(key) is not ParameterSource.DEFAULT:  # defaults: the plan's
            lane[key] = value
    spec = pop_prefix_spec(prefix_kw)
    if spec is not None:
        lane["prefix"] = ({"shared_tokens": spec.shared_tokens, "share": spec.share_frac}
                          if spec.shared_tokens else {"turns": spec.turns, "think_s": spec.think_s}
                          if spec.turns > 1 else {"hit_rate": spec.hit_rate})
    from capplan.plan.recommend_doc import SearchOptions, recommend_doc

    opts = SearchOptions(
        gpus=gpus, tp=tps, prices=price_map, weight_dtypes=weight_dtypes, kv_dtypes=kv_dtypes,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len, engine=engine, gpu_memory_utilization=gpu_memory_utilization,
        calibration=calibration, objective=objective, headroom=headroom, verify_top=verify_top,
        allow_near_floor=allow_near_floor, engine_features=feat_engine)
    from pydantic import ValidationError

    from capplan.errors import one_line_error
    from capplan.plan.names import as_flags

    try:  # the plan the flags make: its errors named as the flags typed
        plan = PlanFile.model_validate(recommend_doc(
            model, {**lane, **feat_lane, **day["lane"]}, opts, day["day"] if day["lane"] else None))
    except ValidationError as e:
        raise InputError(as_flags(one_line_error(e))) from e
    out_paths = _check_outputs(plan, out_paths, plot_dir)
    try:
        with _verifier(verify_top > 0, jobs) as verify:
            if plan.is_day:
                from capplan.plan.day_run import run_day_plan

                result = run_day_plan(load_catalog(catalog_dir), plan, verify, base=Path.cwd())
            else:
                result = run_plan(load_catalog(catalog_dir), plan, verify, disagg=disagg)
    except InputError as e:  # named as the command line names it (the flags typed)
        raise type(e)(as_flags(str(e))) from e
    _finish(result, fmt, out_paths, plot_dir)


def day_lane(kw: dict[str, Any], rate: float | None) -> dict[str, Any]:
    """The day options of recommend (popped from kw): the lane's trace / rate curve (replacing
    its rate) and the plan's `day:`; one of --rate, --trace, --rate-curve."""
    trace, curve, unit = kw.pop("trace"), kw.pop("rate_curve"), kw.pop("time_unit")
    spec = day_spec(kw)
    if sum(x is not None for x in (rate, trace, curve)) != 1:
        raise click.UsageError("give exactly one of --rate, --trace or --rate-curve")
    if rate is not None:
        return {"lane": {}, "day": spec}
    return {"lane": {"rate_per_s": None, "trace": trace, "rate_curve": curve,
                     **({"time_unit": unit} if trace else {})}, "day": spec}


PROGRESS_MIN_LANES = 8
"""Plans with this many lanes (a pool each, plus the shared one) show a progress bar."""


@contextmanager
def _plan_progress(n_lanes: int, pools: str) -> Iterator[Any]:
    """A stderr progress bar over the pools a plan searches, or None for small plans."""
    if n_lanes < PROGRESS_MIN_LANES:
        yield None
        return
    total = 1 + (n_lanes if pools in ("separate", "both") else 0)
    with click.progressbar(length=total, label="planning pools", file=sys.stderr) as bar:
        seen = [0]

        def tick(done: int, _total: int) -> None:
            bar.update(done - seen[0])
            seen[0] = done

        yield tick


@click.command("plan")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--export", "exports", multiple=True,
              help="Write .csv/.json/.md/.xlsx/.k8s.yaml/.llm-d.yaml/.html (adds to the plan "
                   "file's export list).")
@click.option("--plot", "plot_dir", default=None, help="Write PNG/SVG charts to this folder.")
@click.option("--no-verify", is_flag=True, help="Skip the simulator check of the best configs.")
@click.option("--out-dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Folder for the plan file's own exports (default: the plan file's folder).")
@JOBS_OPTION
@format_option
@catalog_option
def plan_cmd(plan_file: str, exports: tuple[str, ...], plot_dir: str | None, no_verify: bool,
             out_dir: str | None, jobs: int | None, fmt: str,
             catalog_dir: tuple[str, ...]) -> None:
    """Run a YAML plan file: recommendations, pool comparison, exports."""
    from capplan.plan.planner import run_plan

    plan = load_plan(plan_file)
    base = Path(plan_file).parent
    if plan.calibration and not Path(plan.calibration).is_absolute():
        plan = plan.model_copy(update={"calibration": str(base / plan.calibration)})
    from capplan.plan.names import in_file

    own = [_own_export(plan, plan_file, p, Path(out_dir) if out_dir else None)
           for p in plan.export]  # the file's own exports first: an error names its key and line
    out_paths = _check_outputs(plan, [Path(p) for p in (*own, *exports)], plot_dir)
    try:
        with _plan_progress(len(plan.workloads), plan.pools) as progress, \
                _verifier(not no_verify, jobs) as verify:
            if plan.is_day:
                from capplan.plan.day_run import run_day_plan

                result = run_day_plan(load_catalog(catalog_dir), plan, verify, base=base)
            else:
                result = run_plan(load_catalog(catalog_dir), plan, verify, progress=progress)
    except InputError as e:  # named as the file names it, at its line
        raise type(e)(in_file(plan_file, str(e))) from e
    _finish(result, fmt, out_paths, plot_dir)


def _own_export(plan: PlanFile, plan_file: str, entry: str, out_dir: Path | None) -> str:
    """Where the plan file's export `entry` goes, checked; an error names the entry as the file
    gives it ("FILE:LINE: export 'x.pdf': ..."), not the path it resolves to."""
    from capplan.plan.load import plan_output_path
    from capplan.plan.names import in_file

    path = None
    try:
        path = plan_output_path(entry, Path(plan_file).parent, out_dir)
        _check_outputs(plan, [path], None)
    except InputError as e:
        said = str(e)
        if path is not None:  # the resolved path is the file's entry ("--export PATH: ...")
            for head in (f"--export {path}", str(path)):
                said = said.removeprefix(head) if said.startswith(head) else said
            said = f"--export {entry!r}" + (said if said[:1] in ":; " else f": {said}")
            said = said.replace(str(path), entry).replace(
                str(out_dir or Path(plan_file).parent) + os.sep, "")  # the file's own folder
        raise type(e)(in_file(plan_file, said)) from e
    return str(path)


@click.command("schema")
@click.option("--format", "_fmt", type=click.Choice(["json", "table", "csv", "markdown"]),
              default="json", show_default=True,
              help="A JSON Schema is JSON whatever the format; accepted for uniformity.")
def schema_cmd(_fmt: str) -> None:
    """JSON Schema of plan files (point your editor's YAML extension at it)."""
    emit(json.dumps(plan_json_schema(), indent=2))


def register(cli: click.Group) -> None:
    cli.add_command(recommend_cmd)
    cli.add_command(plan_cmd)
    cli.add_command(schema_cmd)
