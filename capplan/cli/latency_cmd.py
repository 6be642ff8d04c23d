"""`capplan latency`: analytic latency under load (TTFT, TBT, E2E percentiles) in milliseconds."""

from __future__ import annotations

import click

from capplan.catalog.loader import load_catalog
from capplan.cli._options import (
    POS_INT,
    POSITIVE,
    catalog_option,
    engine_options,
    format_option,
    model_gpu_options,
    settings_from,
    warn_foreign_calibration,
)
from capplan.cli._render import emit, to_json
from capplan.cli._tables import latency_table
from capplan.plan.deployment import build_deployment, calibration_for
from capplan.plan.load import analytic_latency, load_spec_from_options


@click.command("latency")
@model_gpu_options
@click.option("--rate", type=POSITIVE, default=None, help="Open-loop arrival rate (requests/s).")
@click.option("--concurrency", type=POS_INT, default=None,
              help="Closed loop: C clients, each sending its next request when the last ends.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Trace (CSV/JSONL): its mean rate and its length distributions are used.")
@click.option("--input-len", default="512", show_default=True,
              help="Prompt tokens: a number or a distribution (lognormal:mean=800,p99=4000).")
@click.option("--output-len", default="256", show_default=True,
              help="Output tokens: a number or a distribution.")
@click.option("--burstiness", type=POSITIVE, default=1.0, show_default=True,
              help="Gamma arrivals shape (1 = Poisson), as vllm bench serve.")
@engine_options
@format_option
@catalog_option
def latency_cmd(model: str, gpu: str, rate: float | None, concurrency: int | None,
                trace: str | None, input_len: str, output_len: str, burstiness: float,
                fmt: str, catalog_dir: tuple[str, ...], **kw) -> None:
    """Analytic TTFT / TBT / E2E percentiles and throughput under load (milliseconds)."""
    cat = load_catalog(catalog_dir)
    resolved = cat.resolve_model(model)
    g = cat.gpu(gpu)
    cal_path = kw.pop("calibration")
    s = settings_from(kw, resolved.implied_weight_dtype, g)
    load = load_spec_from_options(rate, concurrency, trace, input_len, output_len, burstiness,
                                  s.max_model_len or resolved.spec.max_position_embeddings)
    dep = build_deployment(resolved.spec, g, s, calibration_for(cat, g, cal_path))
    warn_foreign_calibration(dep.calibration.source)
    res = analytic_latency(dep, load)
    if fmt == "json":
        emit(to_json(res))
        return
    emit(latency_table(res, fmt))


def register(cli: click.Group) -> None:
    cli.add_command(latency_cmd)
