"""`capplan latency`: analytic latency under load (TTFT, TBT, E2E percentiles) in milliseconds."""

from __future__ import annotations

import click

from capplan.cli._options import (
    BURSTINESS,
    CONCURRENCY,
    POS_INT,
    RATE,
    catalog_option,
    deployment_from_options,
    engine_options,
    format_option,
    model_gpu_options,
)
from capplan.cli._prefix import pop_prefix_spec, prefix_options
from capplan.cli._render import emit, to_json
from capplan.cli._tables import latency_table
from capplan.plan.load import analytic_latency, load_spec_from_options


@click.command("latency")
@model_gpu_options
@click.option("--rate", type=RATE, default=None, help="Open-loop arrival rate (requests/s).")
@click.option("--concurrency", type=CONCURRENCY, default=None,
              help="Closed loop: C clients, each sending its next request when the last ends.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Trace (CSV/JSONL): its mean rate and its length distributions are used.")
@click.option("--time-unit", type=click.Choice(["auto", "s", "ms", "us"]), default="auto",
              show_default=True, help="Unit of the trace's numeric arrival times.")
@click.option("--input-len", default="512", show_default=True,
              help="Prompt tokens: a number or a distribution (lognormal:mean=800,p99=4000).")
@click.option("--output-len", default="256", show_default=True,
              help="Output tokens: a number or a distribution.")
@click.option("--burstiness", type=BURSTINESS, default=1.0, show_default=True,
              help="Gamma arrivals shape (1 = Poisson), as vllm bench serve.")
@click.option("--num-prompts", type=POS_INT, default=None,
              help="Closed loop: requests the benchmark sends and averages over, start-up wave "
                   "included (default 1000, as vllm bench serve).")
@click.option("--warmup-prompts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Closed loop: warm-up requests sent first and not measured (>= concurrency "
                   "leaves only the steady state).")
@prefix_options
@engine_options
@format_option
@catalog_option
def latency_cmd(model: str, gpu: str, rate: float | None, concurrency: int | None,
                trace: str | None, input_len: str, output_len: str, burstiness: float,
                num_prompts: int | None, warmup_prompts: int, fmt: str,
                catalog_dir: tuple[str, ...], time_unit: str = "auto", **kw) -> None:
    """Analytic TTFT / TBT / E2E percentiles and throughput under load (milliseconds)."""
    prefix = pop_prefix_spec(kw)
    dep = deployment_from_options(catalog_dir, model, gpu, kw)
    load = load_spec_from_options(rate, concurrency, trace, input_len, output_len, burstiness,
                                  dep.model.context_len(dep.settings.max_model_len),
                                  num_prompts, warmup_prompts, time_unit=time_unit,
                                  prefix=prefix,
                                  cache=(dep.memory.block_size, dep.memory.kv_cache_tokens))
    res = analytic_latency(dep, load)
    if fmt == "json":
        emit(to_json(res))
        return
    emit(latency_table(res, fmt))


def register(cli: click.Group) -> None:
    cli.add_command(latency_cmd)
