"""`capplan memory`: does the model fit, and how many sequences run at once."""

from __future__ import annotations

import click

from capplan.cli._features import feature_options
from capplan.cli._options import (
    catalog_option,
    deployment_from_options,
    engine_options,
    format_option,
    model_gpu_options,
)
from capplan.cli._render import Column, emit, kv_table, render_rows, to_json
from capplan.models.memory import MemoryReport
from capplan.units import bytes_to_gib


@click.command("memory")
@model_gpu_options
@engine_options
@feature_options
@format_option
@catalog_option
def memory_cmd(model: str, gpu: str, fmt: str, catalog_dir: tuple[str, ...], **kw) -> None:
    """VRAM per GPU: weights, activations, overhead, paged KV cache, max concurrency."""
    dep = deployment_from_options(catalog_dir, model, gpu, kw, require_fit=False,
                                  memory_only=True)
    r, s, g = dep.memory, dep.settings, dep.gpu
    data = dep.memory_json()
    if fmt == "json":
        emit(to_json(data))
        return
    if fmt == "csv":  # machine-readable: the JSON keys and SI values, one per row
        emit(render_rows([{"key": k, "value": v} for k, v in data.items()],
                         [Column("key", "key"), Column("value", "value (SI)")], fmt))
        return
    gib = bytes_to_gib
    acc = dep.profile.memory

    def out(part: str) -> str:
        return ", outside budget" if acc.outside(part) else ""

    pairs = [
        ("model / GPU", f"{dep.model.key} on {g.key} ({dep.layout_text})"),
        ("engine", dep.profile.label),
        ("weight dtype", r.weight_dtype + (" (auto)" if s.weight_dtype == "auto" else "")),
        ("KV dtype", (dep.model.torch_dtype + " (auto)") if s.kv_dtype == "auto"
         else s.kv_dtype),
        ("total memory (GiB)", f"{gib(r.total_memory_bytes):.2f}"),
        (f"{acc.budget_label(s.gpu_memory_utilization)} (GiB)", f"{gib(r.budget_bytes):.2f}"),
        ("weights per GPU (GiB)", f"{gib(r.weights_bytes_per_gpu):.2f}"),
        *feature_rows(r),
        (f"activation peak{out('activation')} (GiB)",
         f"{gib(r.activation_peak_bytes_per_gpu):.2f}"),
        ("runtime overhead (GiB)", f"{gib(r.runtime_overhead_bytes_per_gpu):.2f}"),
        (f"CUDA context, communicators{out('context')} (GiB)",
         f"{gib(r.context_bytes_per_gpu):.2f}"),
        (f"CUDA graphs{out('cuda_graphs')} (GiB)", f"{gib(r.cuda_graph_bytes_per_gpu):.2f}"),
        ("KV cache (GiB)", f"{gib(r.kv_cache_bytes_per_gpu):.2f}"),
        ("KV per token (KiB)", f"{r.kv_bytes_per_token_per_gpu / 1024:.1f}"),
        ("KV blocks", f"{r.num_gpu_blocks} x {r.block_size} tokens"),
        ("KV cache (tokens)", f"{r.kv_cache_tokens:,}" + (
            f" per DP rank, {r.replica_kv_cache_tokens:,} per replica"
            if s.attention_dp > 1 else "")),
        (f"max concurrency at {r.max_model_len:,} tokens (paged)", f"{r.max_concurrency:.2f}x"),
        ("same, contiguous pre-allocation", f"{r.contiguous_max_concurrency:.0f}x"),
        ("fits", "yes" if r.fits else f"NO: {r.reason}"),
    ]
    emit(kv_table(pairs, fmt))


def feature_rows(r: MemoryReport) -> list[tuple[str, str]]:
    """The parts of the weights that speculation and LoRA add, when present."""
    rows = []
    if r.draft_weights_bytes_per_gpu:
        rows.append(("  of which drafter (GiB)",
                     f"{bytes_to_gib(r.draft_weights_bytes_per_gpu):.2f}"))
    if r.lora_bytes_per_gpu:
        rows.append(("  of which LoRA slots (GiB)",
                     f"{bytes_to_gib(r.lora_bytes_per_gpu):.2f}"))
    return rows


def register(cli: click.Group) -> None:
    cli.add_command(memory_cmd)
