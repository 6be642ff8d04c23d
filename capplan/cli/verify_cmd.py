"""`capplan verify PLAN`: run a plan's workload against a running server, predicted vs measured."""

from __future__ import annotations

from typing import Any

import click

from capplan.cli._options import POS_INT, SECONDS, catalog_option, format_option
from capplan.cli._render import Column, emit, render_rows, to_json
from capplan.plan.bench_cmds import CLIENTS


def _human(row: dict[str, Any], key: str) -> Any:
    v = row.get(key)
    if v is None:
        return None
    return v * 1e3 if row["unit"] == "s" else v


def plain(x: float) -> str:
    """4 significant digits, a large value whole (60000 ms, not 6e+04)."""
    s = f"{x:.4g}"
    return f"{x:.0f}" if "e+" in s else s


_COLUMNS = [
    Column("metric", "metric"), Column("unit_h", "unit"),
    Column("predicted_h", "predicted", plain, "text"),
    Column("measured_h", "measured", plain, "text"),
    Column("measured_over_predicted", "measured /\npredicted", None, ".2f"),
]


_LANE_COLUMNS = [Column("lane", "lane"), Column("slo_h", "SLO"),
                 Column("limit_ms", "SLO (ms)", plain, "text"),
                 Column("measured_ms", "measured (ms)", plain, "text"), Column("met_h", "met")]


@click.command("verify")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--endpoint", default=None, help="Base URL of a running OpenAI-compatible server: "
              "send it the plan's workload and compare.")
@click.option("--model", default=None,
              help="A plan of several models: the one to verify (its name in the plan file).")
@click.option("--lane", default=None,
              help="A plan of a pool per lane: verify that lane's own pool with its requests "
              "alone.")
@click.option("--served-model", default=None,
              help="Model name the server serves (default: the plan's Hugging Face id).")
@click.option("--client", type=click.Choice(["capplan", *CLIENTS]), default="capplan",
              show_default=True, help="Dataset format for --write-dataset (the client that "
              "reads it).")
@click.option("--write-dataset", default=None, type=click.Path(dir_okay=False),
              help="Write the workload (one request per line, planned lengths and times).")
@click.option("--requests", type=POS_INT, default=None,
              help="Requests to send (default: five minutes at the per-replica rate, >= 200).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--trace", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Replay this trace's timestamps and lengths (one replica's share).")
@click.option("--timeout", type=SECONDS, default=60.0, show_default=True,
              help="Per-request timeout in seconds.")
@click.option("--out", default=None, type=click.Path(dir_okay=False),
              help="Write a calibration fitted from the measurement (host overheads).")
@click.option("--layout", type=click.Choice(["aggregated", "disaggregated"]),
              default="aggregated", show_default=True,
              help="What the server is: one replica of the best recommendation, or the plan's "
              "disaggregated layout behind its front end (the whole workload).")
@format_option
@catalog_option
def verify_cmd(plan_file: str, endpoint: str | None, model: str | None, lane: str | None,
               served_model: str | None, client: str, write_dataset: str | None,
               requests: int | None, seed: int, trace: str | None, timeout: float,
               out: str | None, layout: str, fmt: str, catalog_dir: tuple[str, ...]) -> None:
    """Run a plan's workload against a server: predicted vs measured, side by side.

    PLAN_FILE is the JSON of `capplan plan FILE.yaml --export PLAN.json` (or a plan YAML,
    planned again without the simulator check). A day plan is verified at its peak window,
    the rate its recommendation is sized for.

    \b
      capplan verify PLAN.json --endpoint http://localhost:8000
      capplan verify PLAN.json --client vllm --write-dataset capplan-workload.jsonl
      capplan verify PLAN.json --model qwen2.5-72b --endpoint http://localhost:8000
      capplan verify PLAN.json --lane batch --client vllm --write-dataset batch.jsonl
      capplan verify PLAN.json --layout disaggregated --endpoint http://localhost:30000
    """
    from capplan.plan.verify_endpoint import VerifyOptions, verify_plan

    res = verify_plan(plan_file, VerifyOptions(
        endpoint=endpoint, served_model=served_model, client=client,
        write_dataset=write_dataset, requests=requests, seed=seed, trace=trace,
        timeout_s=timeout, calibration_out=out, catalog_dirs=catalog_dir, layout=layout,
        model=model, lane=lane))
    d = res.to_dict()
    for note in res.notes:
        click.echo(f"note: {note}", err=True)
    if res.dataset:
        click.echo(f"wrote {res.dataset} ({len(res.requests)} requests, {client} format"
                   f"{_window(d)})", err=True)
    if res.calibration:
        click.echo(f"wrote {res.calibration}", err=True)
    for w in (res.measured or {}).get("warnings") or ():
        click.echo(f"warning: {w}", err=True)
    if res.measured is not None:
        click.echo(_throughput_note(res.measured), err=True)
    if fmt == "json":
        emit(to_json(d))
        return
    if res.measured is None:
        return
    rows = [{**r, "unit_h": "ms" if r["unit"] == "s" else r["unit"],
             "predicted_h": _human(r, "predicted"), "measured_h": _human(r, "measured")}
            for r in d["comparison"]]
    m = res.measured
    where = ("the disaggregated layout" if d["layout"] == "disaggregated"
             else f"one replica ({d['gpu']} TP {d['tp']})")
    if d.get("lane"):
        where += f" of lane {d['lane']}'s own pool"
    head = (f"{d['model']} on {where} at "
            f"{d['per_replica_rate_per_s']:.3g} req/s{_window(d)}: {m['completed']} of "
            f"{d['requests']} requests completed, {m['errors']} errors")
    if m.get("first_error"):  # the cause, in every format (stderr beside csv's rows)
        head += f" (first: {m['first_error']})"
        if fmt == "csv":
            click.echo(f"{m['errors']} errors; first: {m['first_error']}", err=True)
    sep = "\n\n" if fmt == "markdown" else "\n"
    emit(head + sep + render_rows(rows, _COLUMNS, fmt) if fmt != "csv"
         else render_rows(rows, _COLUMNS, fmt))
    if d.get("lane_slos") and fmt != "csv":  # each lane against its own SLOs
        emit(sep.join(["each lane's p99 against its own SLO:", render_rows(
            [{**c, "slo_h": c["slo"].replace("_p99_s", " p99").upper(),
              "limit_ms": c["limit_s"] * 1e3,
              "measured_ms": None if c["measured_s"] is None else c["measured_s"] * 1e3,
              "met_h": {True: "yes", False: "no", None: "?"}[c["met"]]}
             for c in d["lane_slos"]], _LANE_COLUMNS, fmt)]))


def _throughput_note(m: dict[str, Any]) -> str:
    """How the throughput rows were compared (capplan.plan.verify_endpoint.run_throughput)."""
    if not m.get("send_span_s"):
        return (f"note: throughput n/a: {m.get('sent', 0)} request(s) sent at one instant, no "
                "send span to measure a rate over (send --requests 2 or more); over the whole "
                f"run: {m['requests_per_s']:.4g} req/s, {m['output_tokens_per_s']:.4g} output "
                "tok/s")
    return (f"note: sent at {m['arrival_rate_per_s']:.4g} req/s; the throughput rows are the "
            "completed requests (output tokens) from the first send to the last completion, "
            "against the plan's: all sent over the send span + its mean E2E")


def _window(d: dict[str, Any]) -> str:
    """Which window of a day plan the requests stand for: its peak, or a lane's own (`--lane`;
    empty for a plan at one rate)."""
    w = d.get("day_window")
    if not w:
        return ""
    from capplan.cli._day import hhmm

    share = ("the whole rate" if d["layout"] == "disaggregated"
             else f"one replica's share {d['per_replica_rate_per_s']:.3g} req/s")
    whose = f"lane {d['lane']}'s" if d.get("lane") else "the day plan's"
    return (f"; {whose} peak window {hhmm(w['start_s'])}-{hhmm(w['end_s'])}, "
            f"{w['rate_per_s']:.3g} req/s, {share}")


def register(cli: click.Group) -> None:
    cli.add_command(verify_cmd)
