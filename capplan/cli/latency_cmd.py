"""`capplan latency`: latency under load (TTFT, TBT, E2E percentiles) in milliseconds, answered
by the simulator's replay or, for an open-loop rate where they agree, the analytic queue
(capplan.plan.replay)."""

from __future__ import annotations

from typing import Any

import click

from capplan import limits
from capplan.cli._features import echo_features, feature_options
from capplan.cli._options import (
    BURSTINESS,
    CONCURRENCY,
    POS_INT,
    RATE,
    SEED,
    BoundedInt,
    FiniteFloat,
    catalog_option,
    deployment_from_options,
    engine_options,
    format_option,
    model_gpu_options,
)
from capplan.cli._pd import pd_options, pd_sim_table, pd_table, pop_pd
from capplan.cli._prefix import pop_prefix_spec, prefix_options
from capplan.cli._render import emit, to_json
from capplan.cli._tables import latency_table, sweep_table
from capplan.plan.bands import attach_bands
from capplan.plan.images import with_images
from capplan.plan.load import load_spec_from_options
from capplan.plan.replay import WINDOW_S, ReplayLoad, answer
from capplan.sim.protocol import PRESETS


def replay_options(f: Any) -> Any:
    """--benchmark, --seed, --window: how the replay runs (a separate group)."""
    f = click.option("--window", "window_s", type=FiniteFloat(bound=limits.WINDOW_S),
                     default=WINDOW_S, show_default=True,
                     help="Trace: seconds per window over which the rate is checked for "
                          "variation (a varying trace names its peak window).")(f)
    f = click.option("--seed", type=SEED, default=0, show_default=True,
                     help="Seed of the replayed workload.")(f)
    return click.option("--benchmark", type=click.Choice(sorted(PRESETS)), default=None,
                        help="Replay a benchmark tool's protocol: its warm-ups, measured "
                             "requests, random lengths and metric definitions (the JSON "
                             "`benchmark` key; docs/queueing.md).")(f)


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
              help="Trace (CSV/JSONL): replayed as it arrives; a rate that varies across "
                   "windows is named (peak window).")
@click.option("--time-unit", type=click.Choice(["auto", "s", "ms", "us"]), default="auto",
              show_default=True, help="Unit of the trace's numeric arrival times (auto: the "
                                      "unit the column's name states, else by schema and size).")
@click.option("--input-len", default="512", show_default=True,
              help="Prompt tokens: a number or a distribution (lognormal:mean=800,p99=4000).")
@click.option("--output-len", default="256", show_default=True,
              help="Output tokens: a number or a distribution.")
@click.option("--burstiness", type=BURSTINESS, default=1.0, show_default=True,
              help="Gamma arrivals shape (1 = Poisson), as vllm bench serve.")
@click.option("--num-prompts", type=POS_INT, default=None,
              help="Closed loop: requests the benchmark sends and averages over, start-up wave "
                   "included (default 1000, as vllm bench serve).")
@click.option("--warmup-prompts", type=BoundedInt(limits.WARMUP_PROMPTS), default=0,
              show_default=True,
              help="Closed loop: warm-up requests sent first in the same loop and not "
                   "measured (>= concurrency leaves the start-up wave out; a --benchmark "
                   "preset's own warm-ups are drained instead, as the tools do).")
@prefix_options
@engine_options
@pd_options
@feature_options
@format_option
@catalog_option
@replay_options
def latency_cmd(model: str, gpu: str, rate: list[float] | None, concurrency: list[int] | None,
                trace: str | None, input_len: str, output_len: str, burstiness: float,
                num_prompts: int | None, warmup_prompts: int, fmt: str,
                catalog_dir: tuple[str, ...], time_unit: str = "auto",
                benchmark: str | None = None, seed: int = 0, window_s: float = WINDOW_S,
                **kw) -> None:
    """TTFT / TBT / E2E percentiles and throughput under load (milliseconds).

    \b
    Closed loops (--concurrency) and traces are replayed by the simulator; an open-loop
    --rate is answered by the analytic queue where it agrees with a 2,000-request replay
    within 10% (TTFT and TBT, mean and p99), else by the replay. The footer (JSON: answered_by) says
    which. A list of rates or concurrencies prints one row per level (JSON: a list)."""
    prefix = pop_prefix_spec(kw)
    pd = pop_pd(kw, implied=True)
    if pd is not None:
        _pd_latency(model, gpu, pd, rate, concurrency, trace, input_len, output_len,
                    burstiness, fmt, catalog_dir, prefix,
                    {**kw, "num_prompts": num_prompts, "seed": seed, "benchmark": benchmark,
                     "time_unit": time_unit})
        return
    dep = deployment_from_options(catalog_dir, model, gpu, kw)
    dep, input_len = with_images(dep, input_len)
    echo_features(dep, fmt)
    levels: list[Any] = list(rate or concurrency or [None])
    results = []
    for level in levels:
        r, c = (level if rate else None), (level if concurrency else None)
        spec = None
        if r is not None:
            spec = load_spec_from_options(r, None, None, input_len, output_len, burstiness,
                                          dep.model.context_len(dep.settings.max_model_len),
                                          num_prompts, warmup_prompts, time_unit=time_unit,
                                          prefix=prefix, cache=(dep.memory.block_size,
                                                                dep.memory.kv_cache_tokens))
        load = ReplayLoad(rate=r, concurrency=c, trace=trace, input_len=input_len,
                          output_len=output_len, burstiness=burstiness, num_prompts=num_prompts,
                          warmup_prompts=warmup_prompts, time_unit=time_unit, prefix=prefix,
                          benchmark=benchmark, seed=seed, window_s=window_s)
        results.append({**attach_bands(answer(dep, load, spec), dep.profile.name, c),
                        **dep.resolved_dtypes()})
    if len(results) > 1:
        emit(to_json(results) if fmt == "json" else
             sweep_table(results, "rate" if rate else "concurrency", levels, fmt))
        return
    emit(to_json(results[0]) if fmt == "json" else latency_table(results[0], fmt))


def _pd_latency(model: str, gpu: str, pd: dict[str, Any], rate: list[float] | None,
                concurrency: list[int] | None, trace: str | None, input_len: str,
                output_len: str, burstiness: float, fmt: str, catalog_dir: tuple[str, ...],
                prefix: Any, kw: dict[str, Any]) -> None:
    """A fixed prefill/decode layout (capplan.api.pd_latency): per-pool figures."""
    from dataclasses import asdict

    from capplan.api import pd_latency
    from capplan.cli._options import options_from

    if prefix is not None and prefix.active:
        raise click.UsageError("prefix sharing is not modelled for a disaggregated layout")
    if (rate and len(rate) > 1) or (concurrency and len(concurrency) > 1):
        raise click.UsageError("a disaggregated layout takes one --rate or --concurrency")
    if pd["prefill_workers"] is None and not concurrency:
        raise click.UsageError("a disaggregated layout without --prefill-workers and "
                               "--decode-workers needs --concurrency C (the counts are "
                               "implied from it)")
    cal = kw.pop("calibration", None)
    num_prompts, seed = kw.pop("num_prompts", None), kw.pop("seed", 0)
    benchmark, time_unit = kw.pop("benchmark", None), kw.pop("time_unit", "auto")
    res = pd_latency(model, gpu, **pd, rate=rate[0] if rate else None,
                     concurrency=concurrency[0] if concurrency else None, trace=trace,
                     input_len=input_len, output_len=output_len, burstiness=burstiness,
                     num_prompts=num_prompts, seed=seed, benchmark=benchmark,
                     time_unit=time_unit, calibration=cal,
                     catalog_dirs=catalog_dir, engine_notation=True,
                     **asdict(options_from(kw))).data
    if "replay_passes" in res:
        emit(to_json(res) if fmt == "json" else pd_sim_table(res, fmt))
        return
    emit(to_json(res) if fmt == "json" else pd_table(res, fmt))


def register(cli: click.Group) -> None:
    cli.add_command(latency_cmd)
