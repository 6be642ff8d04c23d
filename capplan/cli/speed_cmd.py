"""`capplan speed`: the decode curve (step time, throughput, per-sequence speed, bound) and
prefill times, side by side."""

from __future__ import annotations

import click

from capplan import limits
from capplan.cli._features import echo_features, feature_options
from capplan.cli._options import (
    IntList,
    catalog_option,
    deployment_from_options,
    engine_options,
    format_option,
    model_gpu_options,
)
from capplan.cli._render import Column, emit, render_rows, to_json
from capplan.cli._tables import dtype_text
from capplan.errors import InputError
from capplan.plan.speed import KNEE_SEARCH_MAX, decode_curve, prefill_rows


@click.command("speed")
@model_gpu_options
@click.option("--batch", type=IntList(limits.BATCH), default="1,8,32,64,128", show_default=True,
              help="Running batch sizes: a list (1,8,32) or a doubling range (1-256).")
@click.option("--context", type=IntList(limits.TOKENS), default="1024", show_default=True,
              help="Context length(s) in tokens of every running sequence.")
@click.option("--prefill", type=IntList(limits.TOKENS), default=None,
              help="Prompt lengths to time alone (TTFT floor), e.g. 512,2048,8192.")
@engine_options
@feature_options
@format_option
@catalog_option
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Write PNG and SVG charts of the curve to this folder (extra: plot).")
def speed_cmd(model: str, gpu: str, batch: list[int], context: list[int],
              prefill: list[int] | None, fmt: str, catalog_dir: tuple[str, ...],
              plot_dir: str | None, **kw) -> None:
    """Decode step time and throughput over batch and context; prefill times."""
    limits.check_cap("speed_rows", len(batch) * len(context) + len(prefill or ()),
                     "--batch x --context")
    if plot_dir:  # before the work, as an export's folder is checked
        from capplan.export.plots import check_charts

        check_charts(plot_dir, ["speed"])
    dep = deployment_from_options(catalog_dir, model, gpu, kw)
    echo_features(dep, fmt)
    s = dep.settings
    context_len = s.max_model_len or dep.model.max_position_embeddings
    limits.check_context(max(context), context_len, "--context")
    if prefill:
        limits.check_context(max(prefill), context_len, "--prefill")
    curve = decode_curve(dep, batch, context)
    if not curve["rows"]:
        raise InputError(f"no batch in {batch} fits: at most {curve['max_batch']} sequences "
                         f"(max_num_seqs {s.max_num_seqs}, KV cache {dep.memory.kv_cache_tokens}"
                         " tokens" + (" with window layers at their window"
                                      if dep.pool.layout.window else "") + ")")
    pre = prefill_rows(dep, prefill) if prefill else []
    if plot_dir:
        from capplan.export.plots import plot_speed

        plot_speed({**curve, "model": dep.model.key, "gpu": dep.gpu.key, "tp": s.tp}, plot_dir)
    if fmt == "json":
        emit(to_json({"model": dep.model.key, "gpu": dep.gpu.key, "tp": s.tp,
                      **dep.resolved_dtypes(),
                      "calibration": dep.calibration.source, "rows": curve["rows"],
                      "knee_batch": curve["knee_batch"],
                      "knee_checked_up_to": curve["knee_checked_up_to"],
                      "excluded": curve["excluded"],
                      "max_batch": curve["max_batch"], "prefill": pre,
                      "engine_settings": dep.settings_summary()}))
        return
    cols = [
        Column("batch", "batch"), Column("context_len", "context (tokens)"),
        Column("step_time_s", "step (ms)", lambda x: x * 1e3, ".2f"),
        Column("tokens_per_s_total", "throughput (tok/s)", None, ".0f"),
        Column("tokens_per_s_per_seq", "per sequence (tok/s)", None, ".1f"),
        Column("bound", "bound"),
    ]
    emit(render_rows(curve["rows"], cols, fmt))
    if fmt == "table":
        knees = ", ".join(_knee_text(batch, c, k, curve) for c, k in curve["knee_batch"].items())
        emit(f"\nknee (doubling the batch adds < 15% throughput): {knees}")
        emit(f"{dep.model.key} on {dep.gpu.key} ({dep.layout_text}); "
             f"{dtype_text(dep.resolved_dtypes(), s)}")
        emit(f"calibration: {dep.calibration.source}")
        if curve["excluded"]:
            # kv_cache_tokens counts every layer at full length; window layers hold less
            win = " with window layers at their window" if dep.pool.layout.window else ""
            emit(f"left out (over max_num_seqs {dep.limits.max_num_seqs} or the KV cache of "
                 f"{dep.memory.replica_kv_cache_tokens:,} tokens{win}): " + ", ".join(
                     f"batch {r['batch']} at {r['context_len']}" for r in curve["excluded"]))
    if pre:
        emit("")
        emit(render_rows(pre, [
            Column("prompt_len", "prompt (tokens)"),
            Column("prefill_s", "prefill (ms)", lambda x: x * 1e3, ".1f"),
            Column("ttft_floor_s", "TTFT floor (ms)", lambda x: x * 1e3, ".1f"),
            Column("prefill_tokens_per_s", "prefill (tok/s)", None, ".0f"),
        ], fmt))


def _knee_text(batch: list[int], ctx: int, knee: int | None, curve: dict) -> str:
    """'context C: batch K'; else which batches the search evaluated: powers of two and the
    given batches, up to the largest that fits at that context (not the largest asked for)."""
    lo, hi = min(batch), max(batch)
    if knee:
        if lo <= knee <= hi:
            return f"context {ctx}: batch {knee}"
        where = "below" if knee < lo else "above"
        return f"context {ctx}: batch {knee}, {where} the batches asked for ({lo}-{hi})"
    top, most = curve["knee_checked_up_to"][ctx], curve["max_batch"][ctx]
    if top is None:
        return f"context {ctx}: none (no batch fits)"
    cap = f" (at most {most} fit)" if top < KNEE_SEARCH_MAX else ""
    return f"context {ctx}: none within batches 1-{top}{cap}"


def register(cli: click.Group) -> None:
    cli.add_command(speed_cmd)
