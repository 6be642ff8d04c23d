"""`capplan simulate`: discrete-event simulation of an engine under a workload."""

from __future__ import annotations

import math
import sys
from typing import Any

import click

from capplan.cli._features import echo_features, feature_options
from capplan.cli._fleet import fleet_options, pop_fleet_options, render_fleet
from capplan.cli._options import (
    BURSTINESS,
    CONCURRENCY,
    POS_INT,
    RATE,
    REQUESTS,
    SECONDS_OR_0,
    SEED,
    catalog_option,
    deployment_from_options,
    engine_options,
    format_option,
    model_gpu_options,
)
from capplan.cli._pd import pd_options, pd_sim_table, pop_pd
from capplan.cli._prefix import pop_prefix_spec, prefix_options
from capplan.cli._render import Column, emit, render_rows, to_json
from capplan.cli._tables import dtype_text
from capplan.plan.bands import attach_bands
from capplan.plan.images import with_images
from capplan.sim.protocol import PRESETS, BenchmarkRun, preset
from capplan.units import MS_S

PROGRESS_MIN_REQUESTS = 5000
"""Runs with at least this many requests show a progress bar on stderr (a few seconds)."""


def _rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    def lat(key: str, label: str, scale: float, unit: str) -> list[tuple[str, Any]]:
        # A statistic with no samples (TBT when every request has one output token) is NaN:
        # show an empty cell, not "nan".
        return [(f"{label} {q} ({unit})",
                 lambda d, q=q: d[key][q] / scale if math.isfinite(d[key][q]) else None)
                for q in ("mean", "p50", "p90", "p99")]

    # a fleet's batch and backlog are its replicas' together
    fleet = any(len(d.get("per_replica") or ()) > 1 for d in results.values())
    whole = ", all replicas" if fleet else ""
    spec: list[tuple[str, Any]] = [
        *lat("ttft_s", "TTFT", MS_S, "ms"), *lat("tbt_s", "TBT", MS_S, "ms"),
        *lat("tpot_s", "TPOT", MS_S, "ms"), *lat("e2e_s", "E2E", MS_S, "ms"),
        *lat("queue_s", "queueing", MS_S, "ms"),
        ("output throughput (tok/s)", lambda d: d["output_tokens_per_s"]),
        ("input throughput (tok/s)", lambda d: d["input_tokens_per_s"]),
        ("requests (req/s)", lambda d: d["requests_per_s"]),
        ("goodput (req/s)", lambda d: d["goodput_requests_per_s"]),
        (f"mean running batch (seqs{whole})", lambda d: d["mean_running_batch"]),
        (f"mean in system (requests{whole})", lambda d: d["mean_in_system"]),
        ("preemptions", lambda d: d["preemptions"]),
        ("KV peak utilization (%)", lambda d: 100 * d["kv_peak_utilization"]),
        ("makespan (s)", lambda d: d["makespan_s"]),
    ]
    if any("benchmark" in d for d in results.values()):  # the tool's own definitions
        for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL")):
            spec += [(f"{label} {q} as the benchmark reports it (ms)",
                      lambda d, key=key, q=q: d["benchmark"]["metrics"][key][q] / MS_S)
                     for q in ("mean", "p99")]
    if any("prefix_hit_frac" in d for d in results.values()):
        spec.append(("prefix cache hits (% of prompt tokens)",
                     lambda d: 100 * d.get("prefix_hit_frac", 0.0)))
    return [{"q": label, **{name: f(d) for name, d in results.items()}} for label, f in spec]


def _shown(v: Any) -> float:
    """A figure to one decimal (1,315.6 ms); under 0.05, two significant figures (a trace of 3
    requests over 115 s runs at 0.026 req/s, not "0.0")."""
    v = float(v)
    return float(f"{v:.2g}") if 0 < abs(v) < 0.05 else round(v, 1)


def _plot(dep: Any, results: dict[str, Any], names: list[str], plot_dir: str) -> None:
    """One chart per scheduler, each named by it (sim-<name>.png/svg)."""
    from capplan.export.plots import plot_sim

    for name in names:
        res = results[name]
        ts = res.get("time_series") or {}
        kv = ts.get("kv_utilization", [])
        for path in plot_sim({**res, "model": dep.model.key, "gpu": dep.gpu.key,
                              "tp": dep.settings.tp, "timeseries": {**ts, "kv_utilization": kv}},
                             plot_dir, name):
            click.echo(f"wrote {path}", err=True)


@click.command("simulate")
@model_gpu_options
@click.option("--rate", type=RATE, default=None, help="Open-loop arrival rate (req/s).")
@click.option("--concurrency", type=CONCURRENCY, default=None,
              help="Closed loop: C clients, each sends its next request when the last ends.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="CSV/JSONL trace: arrival time, input tokens, output tokens (Azure, Vidur, "
                   "BurstGPT, Mooncake columns).")
@click.option("--time-unit", type=click.Choice(["auto", "s", "ms", "us"]), default="auto",
              show_default=True, help="Unit of a trace's numeric arrival times (auto: the unit "
                                      "the column's name states, as arrival_time_s; Mooncake "
                                      "ms; epoch stamps by size; else seconds).")
@click.option("--requests", "--num-prompts", "num_requests", type=REQUESTS, default=1000,
              show_default=True,
              help="Requests to simulate; with --concurrency, the benchmark's --num-prompts "
                   "(all averaged, the start-up wave included, as vllm bench serve does).")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--input-len", default="512", show_default=True,
              help="Tokens: a number or lognormal:mean=..,p99=.. / uniform:min=..,max=.. / "
                   "empirical:FILE.")
@click.option("--output-len", default="256", show_default=True, help="As --input-len.")
@click.option("--burstiness", type=BURSTINESS, default=1.0, show_default=True,
              help="Gamma arrivals of this shape (1 = Poisson; < 1 burstier), as vLLM bench.")
@click.option("--scheduler", "scheduler", default="continuous", show_default=True,
              help="continuous, static, dynamic, or a comma list to compare side by side.")
@click.option("--batch-size", type=POS_INT, default=None,
              help="Static/dynamic batch size (default: --max-num-seqs).")
@click.option("--batch-timeout", type=SECONDS_OR_0, default=0.05, show_default=True,
              help="Dynamic batching: seconds to wait after the first waiting request.")
@click.option("--no-chunked-prefill", is_flag=True, help="Prefill whole prompts only.")
@click.option("--sim-engine",
              type=click.Choice(["auto", "compiled", "python", "fast", "reference"]),
              default="auto", show_default=True,
              help="How the scheduler loop runs, with the same results: compiled (numba) or "
                   "python (the same loop interpreted, for debugging); auto: compiled when "
                   "numba is installed. fast and reference (earlier engines) mean python.")
@prefix_options
@fleet_options
@pd_options
@engine_options
@feature_options
@format_option
@catalog_option
@click.option("--plot", "plot_dir", default=None,
              help="Write PNG/SVG charts (KV-cache use, running and waiting over time), "
                   "one per scheduler: sim-<scheduler>.png/svg.")
@click.option("--benchmark", type=click.Choice(sorted(PRESETS)), default=None,
              help="Replay a benchmark tool's protocol: its warm-ups, measured requests, random "
                   "lengths and metric definitions (JSON `benchmark`; docs/queueing.md).")
def simulate_cmd(model: str, gpu: str, rate: float | None, concurrency: int | None,
                 trace: str | None, seed: int, scheduler: str, batch_size: int | None,
                 batch_timeout: float, no_chunked_prefill: bool, sim_engine: str, fmt: str,
                 catalog_dir: tuple[str, ...], plot_dir: str | None,
                 benchmark: str | None = None, **kw: Any) -> None:
    """Simulate an engine step by step under a workload: latency, throughput, KV use."""
    from capplan.plan.simulation import parse_schedulers, run_simulation

    names = parse_schedulers(scheduler)
    prefix = pop_prefix_spec(kw)
    pd = pop_pd(kw)
    fleet = pop_fleet_options(kw)
    if pd is not None:
        others = (fleet, plot_dir, benchmark, names != ["continuous"])
        return _simulate_pd(model, gpu, pd, rate, concurrency, trace, seed, sim_engine, fmt,
                            catalog_dir, prefix, others, kw)
    if fleet is not None and plot_dir:
        raise click.UsageError("--plot draws one engine's time series, which a fleet run "
                               "(--replicas, --schedule) does not keep")
    if plot_dir:  # before the run, as an export's folder is checked
        from capplan.export.plots import check_charts

        check_charts(plot_dir, [f"sim-{name}" for name in names])
    load = {k: kw.pop(k) for k in ("burstiness", "input_len", "output_len", "num_requests",
                                   "time_unit")}
    dep = deployment_from_options(catalog_dir, model, gpu, kw)
    dep, load["input_len"] = with_images(dep, load["input_len"])
    echo_features(dep, fmt)
    bars: dict[str, Any] = {}
    bench = (BenchmarkRun.of(preset(benchmark), concurrency, None, None, load["num_requests"])
             if benchmark else None)

    def progress(name: str, done: int, total: int) -> None:
        if total < PROGRESS_MIN_REQUESTS:
            return
        if name not in bars:
            bars[name] = [click.progressbar(length=total, label=f"simulating ({name})",
                                            file=sys.stderr), 0]
            bars[name][0].__enter__()
        bar, last = bars[name]
        bar.update(done - last)
        bars[name][1] = done
        if done >= total:
            bar.__exit__(None, None, None)

    run = run_simulation(dep, rate=rate, concurrency=concurrency, trace=trace,
                         input_len=load["input_len"], output_len=load["output_len"],
                         burstiness=load["burstiness"], requests=load["num_requests"],
                         seed=seed, schedulers=names, batch_size=batch_size,
                         batch_timeout_s=batch_timeout,
                         chunked_prefill=False if no_chunked_prefill else None, progress=progress,
                         time_unit=load["time_unit"], sim_engine=sim_engine, prefix=prefix,
                         fleet=fleet, benchmark=bench)
    for note in run["notes"]:
        click.echo(f"note: {note}", err=True)
    results, head = run["results"], run["head"]
    if plot_dir:
        _plot(dep, results, names, plot_dir)
    head = {**head, **dep.resolved_dtypes()}
    if fmt == "json":
        body = (attach_bands(results[names[0]], dep.profile.name, concurrency)
                if len(names) == 1 else {"schedulers": results})
        emit(to_json({**head, **body}))
        return
    shown = _shown if fmt != "csv" else None  # CSV: the figures as computed
    cols = [Column("q", "quantity"), *(Column(n, n, shown, ",") for n in names)]
    emit(render_rows(_rows(results), cols, fmt))
    if fleet is not None:
        emit(render_fleet(results[names[0]], fmt))
    if fmt == "table" and not math.isfinite(results[names[0]]["tbt_s"]["mean"]):
        click.echo("note: no time between tokens to report: every request has one output "
                   "token", err=True)
    if fmt == "table":
        n = head["num_requests"]
        click.echo(f"{head['model']} on {head['gpu']} ({dep.layout_text}, {dep.profile.label}), "
                   f"{n} request{'s' * (n != 1)}, seed {seed}; "
                   f"{dtype_text(dep.resolved_dtypes(), dep.settings)}; decode steps "
                   f"{head['bound']}-bound at the mean running batch\n"
                   f"calibration: {head['calibration']}", err=True)
        impls = sorted({d.get("engine_impl", "reference") for d in results.values()})
        click.echo(f"simulator engine: {', '.join(impls)}", err=True)


def _simulate_pd(model: str, gpu: str, pd: dict[str, Any], rate: float | None,
                 concurrency: int | None, trace: str | None, seed: int, sim_engine: str,
                 fmt: str, catalog_dir: tuple[str, ...], prefix: Any, others: tuple,
                 kw: dict[str, Any]) -> None:
    """A fixed prefill/decode layout replayed (capplan.plan.pd_sim): per-pool figures."""
    if any(others):
        raise click.UsageError("a disaggregated layout is replayed with continuous batching, "
                               "without --replicas/--schedule, --plot or --benchmark")
    from dataclasses import asdict

    from capplan.api import disaggregated
    from capplan.cli._options import options_from
    from capplan.plan.pd_sim import PdLoad, pd_requests, simulate_pd

    if prefix is not None and prefix.active:
        raise click.UsageError("prefix sharing is not modelled for a disaggregated layout")
    load = {k: kw.pop(k) for k in ("burstiness", "input_len", "output_len", "num_requests",
                                   "time_unit")}
    cal = kw.pop("calibration", None)
    lay = disaggregated(model, gpu, calibration=cal, catalog_dirs=catalog_dir,
                        engine_notation=True, **pd, **asdict(options_from(kw)))
    spec = PdLoad(rate=rate, concurrency=concurrency, trace=trace, input_len=load["input_len"],
                  output_len=load["output_len"], burstiness=load["burstiness"],
                  requests=load["num_requests"], seed=seed, time_unit=load["time_unit"])
    reqs, clipped = pd_requests(lay, spec)
    if clipped:
        click.echo(f"note: {clipped} prompts cut to fit max_model_len", err=True)
    res = simulate_pd(lay, reqs, sim_engine, spec)
    emit(to_json(res) if fmt == "json" else pd_sim_table(res, fmt))


def register(cli: click.Group) -> None:
    cli.add_command(simulate_cmd)
