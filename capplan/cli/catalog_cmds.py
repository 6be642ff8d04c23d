"""`capplan gpus`, `capplan models`, `capplan models import`."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from capplan.catalog.loader import load_catalog
from capplan.cli._options import catalog_option, format_option
from capplan.cli._render import Column, emit, render_rows, to_json
from capplan.errors import InputError
from capplan.export.atomic import atomic_write_text
from capplan.units import GB_BYTES, GIB_BYTES, GIGA, MIB_BYTES, TERA


def _wrap_hf_id(hf_id: str) -> str:
    """org/ on one line, the name wrapped at 16 characters (the table fits 120 columns)."""
    org, sep, name = hf_id.partition("/")
    return org + sep + "\n" + textwrap.fill(name, 16) if sep else textwrap.fill(hf_id, 16)


def _wrapper(fmt: str, wrap: Callable[[str], str]) -> Callable[[str], str] | None:
    """A cell's wrapping for a text table only: CSV and Markdown cells stay whole (a wrap may
    split a word, which joining the lines again cannot tell from a space)."""
    return wrap if fmt == "table" else None


@click.command("gpus")
@format_option
@catalog_option
def gpus_list(fmt: str, catalog_dir: tuple[str, ...]) -> None:
    """List the GPU catalog."""
    cat = load_catalog(catalog_dir)
    rows = [
        {
            "key": g.key, "name": g.name, "memory_bytes": g.memory_mib * MIB_BYTES,
            "memory_bandwidth_bytes_per_s": g.hbm_bytes_per_s,
            "bf16_dense_flops_per_s": g.dense_flops_per_s("bf16"),
            "fp8_dense_flops_per_s": g.dense_flops_per_s("fp8") if g.fp8_dense_tflops else None,
            "interconnect": g.interconnect.kind,
            "interconnect_bytes_per_s": g.interconnect.bytes_per_s,
            "price_per_hour_usd": g.price_per_hour_usd,
        }
        for g in sorted(cat.gpus.values(), key=lambda g: g.key)
    ]
    if fmt == "json":
        emit(to_json(rows))
        return
    cols = [
        Column("key", "GPU"),
        Column("name", "name", _wrapper(fmt, lambda n: textwrap.fill(n, 28))),
        Column("memory_bytes", "memory\n(GiB)", lambda b: b / GIB_BYTES, ".1f"),
        Column("memory_bandwidth_bytes_per_s", "bandwidth\n(GB/s)", lambda b: b / GB_BYTES, ".0f"),
        Column("bf16_dense_flops_per_s", "bf16\n(TFLOP/s)", lambda f: f / TERA, ".0f"),
        Column("fp8_dense_flops_per_s", "fp8\n(TFLOP/s)", lambda f: f / TERA, ".0f"),
        Column("interconnect", "interconnect"),
        Column("price_per_hour_usd", "$ per\nGPU-hour", None, ".2f"),
    ]
    emit(render_rows(rows, cols, fmt))


def _attention_label(m: Any) -> str:
    """GQA/MHA/MLA, and for hybrids how many layers of each recurrent kind."""
    base = "MLA" if m.mla else ("MHA" if m.num_kv_heads == m.num_attention_heads
                                else f"GQA {m.num_kv_heads} KV heads")
    if not m.is_hybrid:
        return base
    kinds = m.layer_kinds
    attn = sum(k.endswith("attention") and k != "linear_attention" for k in kinds)
    other = sorted({k for k in kinds if k not in ("none",) and (k == "linear_attention"
                                                               or not k.endswith("attention"))})
    return f"{base} x{attn} + " + " + ".join(f"{k} x{kinds.count(k)}" for k in other)


@click.group("models", invoke_without_command=True)
@format_option
@catalog_option
@click.pass_context
def models_group(ctx: click.Context, fmt: str, catalog_dir: tuple[str, ...]) -> None:
    """List the model catalog (or `models import CONFIG.json`)."""
    if ctx.invoked_subcommand is not None:
        return
    cat = load_catalog(catalog_dir)
    rows = [
        {
            "key": m.key, "hf_id": m.hf_id, "params_total": m.params_total,
            "params_active": m.params_active, "num_layers": m.num_layers,
            "attention": _attention_label(m),
            "moe": f"{m.moe.num_experts}x top-{m.moe.num_experts_per_tok}" if m.moe else "",
            "sliding_window": m.sliding_window, "weight_format": (
                m.quantization.format if m.quantization else m.torch_dtype),
            "max_position_embeddings": m.max_position_embeddings,
        }
        for m in sorted(cat.models.values(), key=lambda m: m.key)
    ]
    if fmt == "json":
        emit(to_json(rows))
        return
    cols = [
        Column("key", "model"), Column("hf_id", "Hugging Face id", _wrapper(fmt, _wrap_hf_id)),
        Column("params_total", "params\n(B)", lambda p: p / GIGA, ".1f"),
        Column("params_active", "active\n(B)", lambda p: p / GIGA, ".1f"),
        Column("num_layers", "layers"),
        Column("attention", "attention", _wrapper(fmt, lambda a: textwrap.fill(a, 10))),
        Column("moe", "experts"), Column("sliding_window", "window\n(tokens)"),
        Column("weight_format", "weights"), Column("max_position_embeddings", "max\nlen"),
    ]
    emit(render_rows(rows, cols, fmt))


@models_group.command("import")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", "key", default=None, help="Catalog key for the new entry.")
@click.option("--hf-id", default=None,
              help="Hugging Face id launch lines serve (default: the config's _name_or_path).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the YAML here (default: stdout).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "markdown"]),
              default="table", show_default=True,
              help="json prints the entry as JSON; the others print the catalog YAML.")
def models_import(config: Path, key: str | None, hf_id: str | None, out: Path | None,
                  fmt: str) -> None:
    """Turn a Hugging Face config.json into a catalog YAML."""
    from capplan.catalog.hf_import import import_config, quantization_note

    if out is not None and not out.parent.is_dir():  # before anything is said to succeed
        raise InputError(f"--out {out}: folder {out.parent} does not exist")
    spec = import_config(config, key)
    if hf_id:
        spec = spec.model_copy(update={"hf_id": hf_id})
    elif "/" not in spec.hf_id:
        click.echo(f"note: {config} names no Hugging Face id (its _name_or_path is missing or "
                   f"a local path); launch lines will serve {spec.hf_id!r}: pass --hf-id "
                   "ORG/NAME", err=True)
    note = quantization_note(config, spec)
    if note:
        click.echo(f"note: {note}", err=True)
    click.echo(import_summary(spec), err=True)
    data = spec.model_dump(mode="json", exclude_none=False)
    text = to_json(data) + "\n" if fmt == "json" else catalog_yaml(data)
    if out is None:
        emit(text.rstrip("\n"))
    else:
        atomic_write_text(out, text)
        click.echo(f"wrote {out}", err=True)


def import_summary(spec: Any) -> str:
    """One line on what was imported: parameters, KV bytes per token, recurrent state."""
    from capplan.models import layers
    from capplan.models.memory import kv_bytes_per_token, kv_dtype_bytes
    from capplan.units import GIGA, KIB_BYTES, MIB_BYTES

    kvb = kv_dtype_bytes(spec)
    kv = kv_bytes_per_token(spec, 1, kvb)
    state = layers.state_bytes_per_seq(spec, 1, kvb, 16)
    active = (f", {spec.params_active / GIGA:.3g}B active"
              if spec.params_active < spec.params_total else "")
    return (f"imported {spec.key}: {spec.params_total / GIGA:.3g}B parameters{active}, "
            f"{spec.num_layers} layers, KV {kv / KIB_BYTES:.1f} KiB per token ({kvb:g}-byte KV, "
            f"TP 1), " + (f"recurrent state {state / MIB_BYTES:.1f} MiB per sequence"
                          if state else "no recurrent state"))


class _CatalogDumper(yaml.SafeDumper):
    """Per-layer lists (layer_types, mlp_types) on one line each, the rest block style."""


def _flow_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = bool(data) and all(isinstance(x, str | int | float) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_CatalogDumper.add_representer(list, _flow_list)


def catalog_yaml(data: dict) -> str:
    return yaml.dump(data, Dumper=_CatalogDumper, sort_keys=False, width=100)


def register(cli: click.Group) -> None:
    cli.add_command(gpus_list)
    cli.add_command(models_group)
