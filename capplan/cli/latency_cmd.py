"""`capplan latency`: analytic latency under load (TTFT, TBT, E2E percentiles) in milliseconds."""

from __future__ import annotations

from typing import Any

import click

from capplan.cli._features import echo_features, feature_options
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
from capplan.cli._tables import latency_table, resolved_dtypes, sweep_table
from capplan.plan.images import with_images
from capplan.plan.load import analytic_latency, load_spec_from_options


class ListOf(click.ParamType):
    """'5,10,20': a comma list, each value checked as the option alone would check it."""

    name = "list"

    def __init__(self, inner: click.ParamType):
        self.inner = inner

    def convert(self, value: Any, param: Any, ctx: Any) -> list[Any]:
        if isinstance(value, list):
            return value
        parts = [p.strip() for p in str(value).split(",")]
        if not all(parts):
            self.fail(f"{value!r} is not a comma list like 5,10,20", param, ctx)
        return [self.inner.convert(p, param, ctx) for p in parts]


@click.command("latency")
@model_gpu_options
@click.option("--rate", type=ListOf(RATE), default=None,
              help="Open-loop arrival rate (requests/s); a list (5,10,20) sweeps, one row each.")
@click.option("--concurrency", type=ListOf(CONCURRENCY), default=None,
              help="Closed loop: C clients, each sending its next request when the last ends; "
                   "a list (1,8,64) sweeps.")
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
@feature_options
@format_option
@catalog_option
def latency_cmd(model: str, gpu: str, rate: list[float] | None, concurrency: list[int] | None,
                trace: str | None, input_len: str, output_len: str, burstiness: float,
                num_prompts: int | None, warmup_prompts: int, fmt: str,
                catalog_dir: tuple[str, ...], time_unit: str = "auto", **kw) -> None:
    """Analytic TTFT / TBT / E2E percentiles and throughput under load (milliseconds).

    A list of rates or concurrencies prints one row per level (JSON: a list)."""
    prefix = pop_prefix_spec(kw)
    dep = deployment_from_options(catalog_dir, model, gpu, kw)
    dep, input_len = with_images(dep, input_len)
    echo_features(dep, fmt)
    levels: list[Any] = list(rate or concurrency or [None])
    results = []
    for level in levels:
        load = load_spec_from_options(level if rate else None, level if concurrency else None,
                                      trace, input_len, output_len, burstiness,
                                      dep.model.context_len(dep.settings.max_model_len),
                                      num_prompts, warmup_prompts, time_unit=time_unit,
                                      prefix=prefix,
                                      cache=(dep.memory.block_size, dep.memory.kv_cache_tokens))
        results.append({**analytic_latency(dep, load), **resolved_dtypes(dep)})
    if len(results) > 1:
        emit(to_json(results) if fmt == "json" else
             sweep_table(results, "rate" if rate else "concurrency", levels, fmt))
        return
    emit(to_json(results[0]) if fmt == "json" else latency_table(results[0], fmt))


def register(cli: click.Group) -> None:
    cli.add_command(latency_cmd)
