"""`capplan simulate`: discrete-event simulation of an engine under a workload."""

from __future__ import annotations

import sys
from typing import Any

import click
import numpy as np

from capplan.cli._options import (
    NON_NEGATIVE,
    POS_INT,
    POSITIVE,
    catalog_option,
    deployment_from_options,
    engine_options,
    format_option,
    model_gpu_options,
)
from capplan.cli._render import Column, emit, render_rows, to_json
from capplan.cli._tables import dtype_text, resolved_dtypes
from capplan.errors import InputError
from capplan.sim import SCHEDULERS, run_scheduler
from capplan.sim.workload import Lane, Workload, load_trace, parse_length
from capplan.units import MS_S

PROGRESS_MIN_REQUESTS = 5000
"""Runs with at least this many requests show a progress bar on stderr (a few seconds)."""


def _schedulers(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    for s in names:
        if s not in SCHEDULERS:
            raise InputError(f"--scheduler {s!r}: expected {', '.join(SCHEDULERS)} or a comma list")
    if not names:
        raise InputError("--scheduler: expected continuous, static or dynamic")
    return list(dict.fromkeys(names))


def _rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    def lat(key: str, label: str, scale: float, unit: str) -> list[tuple[str, Any]]:
        return [(f"{label} {q} ({unit})", lambda d, q=q: d[key][q] / scale)
                for q in ("mean", "p50", "p90", "p99")]

    spec: list[tuple[str, Any]] = [
        *lat("ttft_s", "TTFT", MS_S, "ms"), *lat("tbt_s", "TBT", MS_S, "ms"),
        *lat("tpot_s", "TPOT", MS_S, "ms"), *lat("e2e_s", "E2E", MS_S, "ms"),
        *lat("queue_s", "queueing", MS_S, "ms"),
        ("output throughput (tok/s)", lambda d: d["output_tokens_per_s"]),
        ("input throughput (tok/s)", lambda d: d["input_tokens_per_s"]),
        ("requests (req/s)", lambda d: d["requests_per_s"]),
        ("goodput (req/s)", lambda d: d["goodput_requests_per_s"]),
        ("mean running batch (seqs)", lambda d: d["mean_running_batch"]),
        ("mean in system (requests)", lambda d: d["mean_in_system"]),
        ("preemptions", lambda d: d["preemptions"]),
        ("KV peak utilization (%)", lambda d: 100 * d["kv_peak_utilization"]),
        ("makespan (s)", lambda d: d["makespan_s"]),
    ]
    return [{"q": label, **{name: f(d) for name, d in results.items()}} for label, f in spec]


def _workload(kw: dict[str, Any], rate: float | None, concurrency: int | None,
              trace: str | None) -> Workload:
    if sum(x is not None for x in (rate, concurrency, trace)) != 1:
        raise InputError("give exactly one of --rate, --concurrency or --trace")
    if trace is not None:
        return Workload((Lane(name="trace"),), trace=load_trace(trace))
    lane = Lane(rate_per_s=rate, arrival="gamma" if kw["burstiness"] != 1.0 else "poisson",
                burstiness=kw["burstiness"], input_len=parse_length(kw["input_len"]),
                output_len=parse_length(kw["output_len"]))
    return Workload((lane,), num_requests=kw["num_requests"], concurrency=concurrency)


@click.command("simulate")
@model_gpu_options
@click.option("--rate", type=POSITIVE, default=None, help="Open-loop arrival rate (req/s).")
@click.option("--concurrency", type=POS_INT, default=None,
              help="Closed loop: C clients, each sends its next request when the last ends.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="CSV/JSONL trace: arrival time, input tokens, output tokens.")
@click.option("--requests", "num_requests", type=POS_INT, default=1000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--input-len", default="512", show_default=True,
              help="Tokens: a number or lognormal:mean=..,p99=.. / uniform:min=..,max=.. / "
                   "empirical:FILE.")
@click.option("--output-len", default="256", show_default=True, help="As --input-len.")
@click.option("--burstiness", type=POSITIVE, default=1.0, show_default=True,
              help="Gamma arrivals of this shape (1 = Poisson; < 1 burstier), as vLLM bench.")
@click.option("--scheduler", "scheduler", default="continuous", show_default=True,
              help="continuous, static, dynamic, or a comma list to compare side by side.")
@click.option("--batch-size", type=POS_INT, default=None,
              help="Static/dynamic batch size (default: --max-num-seqs).")
@click.option("--batch-timeout", type=NON_NEGATIVE, default=0.05, show_default=True,
              help="Dynamic batching: seconds to wait after the first waiting request.")
@click.option("--no-chunked-prefill", is_flag=True, help="Prefill whole prompts only.")
@engine_options
@format_option
@catalog_option
@click.option("--plot", "plot_dir", default=None,
              help="Write PNG/SVG charts (KV-cache use, running and waiting over time).")
def simulate_cmd(model: str, gpu: str, rate: float | None, concurrency: int | None,
                 trace: str | None, seed: int, scheduler: str, batch_size: int | None,
                 batch_timeout: float, no_chunked_prefill: bool, fmt: str,
                 catalog_dir: tuple[str, ...], plot_dir: str | None, **kw: Any) -> None:
    """Simulate an engine step by step under a workload: latency, throughput, KV use."""
    names = _schedulers(scheduler)
    wl = _workload(kw, rate, concurrency, trace)
    for k in ("burstiness", "input_len", "output_len", "num_requests"):
        kw.pop(k)
    dep = deployment_from_options(catalog_dir, model, gpu, kw)
    s, g = dep.settings, dep.gpu
    reqs, clipped = wl.generate(np.random.default_rng(seed)).clip_to_context(
        s.max_model_len or dep.model.max_position_embeddings)
    if clipped:
        click.echo(f"note: {clipped} prompts cut to fit max_model_len "
                   f"{s.max_model_len or dep.model.max_position_embeddings}", err=True)
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        opts = dict(scheduler=name, num_gpu_blocks=dep.memory.num_gpu_blocks,
                    block_size=dep.memory.block_size, max_num_seqs=s.max_num_seqs,
                    max_num_batched_tokens=s.max_num_batched_tokens,
                    enable_chunked_prefill=not no_chunked_prefill, batch_size=batch_size,
                    batch_timeout_s=batch_timeout)
        if len(reqs) >= PROGRESS_MIN_REQUESTS:
            with click.progressbar(length=len(reqs), label=f"simulating ({name})",
                                   file=sys.stderr) as bar:
                state = {"done": 0}

                def tick(done: int, bar: Any = bar, state: dict = state) -> None:
                    bar.update(done - state["done"])
                    state["done"] = done

                results[name] = run_scheduler(dep.step, reqs, wl.lanes, progress=tick,
                                              **opts).to_dict()
        else:
            results[name] = run_scheduler(dep.step, reqs, wl.lanes, **opts).to_dict()
    if plot_dir:
        from capplan.export.plots import plot_sim

        first = results[names[0]]
        ts = first.get("time_series") or {}
        kv = ts.get("kv_utilization", [])
        for path in plot_sim({**first, "model": dep.model.key, "gpu": dep.gpu.key, "tp": s.tp,
                              "timeseries": {**ts, "kv_utilization": kv}}, plot_dir):
            click.echo(f"wrote {path}", err=True)
    from capplan.models.perf import BOUNDS

    first = results[names[0]]
    ctx = float(np.mean(reqs.input_tokens) + np.mean(reqs.output_tokens) / 2)
    bound = BOUNDS[int(dep.step.decode_step(max(first["mean_running_batch"], 1.0), ctx)
                       ["bound_index"])]
    head = {"model": dep.model.key, "gpu": g.key, "tp": s.tp, "pp": s.pp, "bound": bound,
            "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
            "num_gpu_blocks": dep.memory.num_gpu_blocks, "seed": seed,
            "calibration": dep.step.calibration_source, **resolved_dtypes(dep)}
    if fmt == "json":
        body = results[names[0]] if len(names) == 1 else {"schedulers": results}
        emit(to_json({**head, **body}))
        return
    cols = [Column("q", "quantity"), *(Column(n, n, fmt=",.1f") for n in names)]
    emit(render_rows(_rows(results), cols, fmt))
    if fmt == "table":
        click.echo(f"{head['model']} on {head['gpu']} (TP {s.tp}), {len(reqs)} requests, "
                   f"seed {seed}; {dtype_text(resolved_dtypes(dep), s)}; decode steps "
                   f"{bound}-bound at the mean running batch\n"
                   f"calibration: {head['calibration']}", err=True)


def register(cli: click.Group) -> None:
    cli.add_command(simulate_cmd)
