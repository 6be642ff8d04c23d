"""Score the step-time model against published measurements (docs/research/published_perf.md).

Run: .venv/bin/python benchmarks/validate_perf.py [--write-docs] [--fit-gpu]
Each row: a published figure (cited in docs/research/published_perf.md by its #), the model's
prediction with the default (datasheet) calibration, and the relative error. Nothing here is
fitted to these numbers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
from docblocks import ROOT, write_block  # benchmarks/ is on sys.path when run as a script

from capplan.catalog.loader import load_catalog
from capplan.models import fixed_batch
from capplan.models.engine import EngineSettings
from capplan.plan.deployment import resolve_deployment


@dataclass
class Point:
    ref: str
    model: str
    gpu: str
    tp: int
    dtype: str
    kind: str  # decode_tok_s | tpot_ms | ttft_ms | e2e_ms
    batch: int
    isl: int
    osl: int
    measured: float
    note: str = ""
    informs_default: bool = False
    """True where the figure also informed a default calibration factor (docs/perf.md)."""


POINTS = [
    Point("brief", "llama-3.1-8b", "a100-sxm-80gb", 1, "bf16", "decode_tok_s", 1, 1024, 0, 95,
          "vLLM; seed reference"),
    Point("brief", "llama-3.1-8b", "a100-sxm-80gb", 1, "bf16", "decode_tok_s", 8, 1024, 0, 620,
          "vLLM; seed reference"),
    Point("brief", "llama-3.1-8b", "a100-sxm-80gb", 1, "bf16", "decode_tok_s", 32, 1024, 0,
          2400, "vLLM; seed reference"),
    Point("#21", "llama-3.1-8b", "h200", 1, "bf16", "e2e_ms", 8, 32, 128, 833.4,
          "vLLM CI benchmark_latency"),
    Point("#22", "llama-3.1-70b", "h200", 4, "bf16", "e2e_ms", 8, 32, 128, 2077.5,
          "vLLM CI (Llama-3-70B; same shapes as 3.1)"),
    Point("#23", "mixtral-8x7b", "h200", 2, "bf16", "e2e_ms", 8, 32, 128, 1917.4,
          "vLLM CI, MoE"),
    Point("#18a", "llama-3.3-70b", "h100-sxm", 2, "fp8", "tpot_ms", 1, 5000, 500, 18.58,
          "NIM 1.8 (TRT-LLM) ITL, c=1"),
    Point("#19", "llama-3.3-70b", "h100-sxm", 2, "fp8", "tpot_ms", 1, 500, 2000, 18.91,
          "NIM 1.8 (TRT-LLM) ITL, c=1"),
    Point("#18b", "llama-3.3-70b", "h100-sxm", 2, "fp8", "ttft_ms", 1, 5000, 1, 406.77,
          "NIM 1.8 (TRT-LLM) TTFT, c=1", informs_default=True),
    Point("#19b", "llama-3.3-70b", "h100-sxm", 2, "fp8", "ttft_ms", 1, 500, 1, 47.77,
          "NIM 1.8 (TRT-LLM) TTFT, c=1"),
    Point("#1", "llama-2-7b", "h100-sxm", 1, "fp8", "ttft_ms", 1, 2048, 1, 36,
          "TRT-LLM v0.5 first-token latency", informs_default=True),
    Point("#3", "llama-2-7b", "a100-sxm-80gb", 1, "fp16", "ttft_ms", 1, 2048, 1, 133,
          "TRT-LLM v0.5", informs_default=True),
    Point("#4", "llama-2-7b", "l40s", 1, "fp8", "ttft_ms", 1, 2048, 1, 73,
          "TRT-LLM v0.5", informs_default=True),
    Point("#5", "llama-2-70b", "h100-sxm", 4, "fp8", "ttft_ms", 1, 2048, 1, 109,
          "TRT-LLM v0.5", informs_default=True),
    Point("#6", "llama-2-70b", "a100-sxm-80gb", 4, "fp16", "ttft_ms", 1, 2048, 1, 377,
          "TRT-LLM v0.5", informs_default=True),
    Point("#31", "qwen3-30b-a3b", "a100-sxm-80gb", 1, "bf16", "tpot_ms", 1, 128, 128, 9.6,
          "vLLM c=1, MoE"),
    Point("#32a", "qwen3-30b-a3b", "a100-sxm-80gb", 1, "bf16", "ttft_ms", 1, 2048, 1, 81.0,
          "vLLM c=1, MoE"),
    Point("#32b", "qwen3-30b-a3b", "a100-sxm-80gb", 1, "bf16", "ttft_ms", 1, 8192, 1, 227.0,
          "vLLM c=1, MoE"),
    Point("#35a", "llama-3.1-70b", "h100-sxm", 4, "fp8", "tpot_ms", 1, 128, 128, 19,
          "vLLM 0.5 (pre async output: CPU-heavy)"),
    Point("#35b", "llama-3.1-70b", "h100-sxm", 4, "fp8", "tpot_ms", 32, 128, 128, 25,
          "vLLM 0.5 (pre async output: CPU-heavy)"),
]


def predict(p: Point) -> float:
    """The model's figure for a published point (capplan.models.fixed_batch), in its unit."""
    cat = load_catalog()
    s = EngineSettings(tp=p.tp, weight_dtype=p.dtype, max_num_batched_tokens=max(8192, p.isl),
                       max_num_seqs=256)
    sm = resolve_deployment(cat, p.model, p.gpu, s).step
    if p.kind == "decode_tok_s":
        return fixed_batch.decode_tok_per_s(sm, p.batch, p.isl)
    if p.kind == "ttft_ms":
        return fixed_batch.first_token_s(sm, p.isl, s.max_num_batched_tokens) * 1e3
    if p.kind == "tpot_ms":
        return fixed_batch.mean_tpot_s(sm, p.batch, p.isl, p.osl) * 1e3
    return fixed_batch.batch_e2e_s(sm, p.batch, p.isl, p.osl) * 1e3


def published_table() -> str:
    """Section 2 of docs/validation.md: every published point, its prediction and the error."""
    rows = []
    for p in POINTS:
        pred = predict(p)
        err = pred / p.measured - 1
        rows.append((p, pred, err))
    errs = np.abs([e for _, _, e in rows])
    out = ["| ref | model | GPU | TP | dtype | metric | batch | in/out | measured | predicted "
           "| error | source |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p, pred, err in rows:
        out.append(f"| {p.ref}{'*' if p.informs_default else ''} | {p.model} | {p.gpu} | {p.tp} "
                   f"| {p.dtype} | {p.kind} | {p.batch} | {p.isl}/{p.osl} | {p.measured:g} "
                   f"| {pred:.4g} | {err:+.1%} | {p.note} |")
    out.append(f"\nrows: {len(rows)}; median |error| {np.median(errs):.1%}; "
               f"p90 {np.quantile(errs, 0.9):.1%}; max {errs.max():.1%}")
    held = np.abs([e for p, _, e in rows if not p.informs_default])
    out.append(f"rows that informed no default ({len(held)}): median |error| "
               f"{np.median(held):.1%}, p90 {np.quantile(held, 0.9):.1%}")
    gpus = {p.gpu for p in POINTS}
    out.append(f"GPU types: {len(gpus)} ({', '.join(sorted(gpus))})")
    return "\n".join(out) + "\n"


TABLES = {"validate_perf:published": published_table}
DOC = ROOT / "docs" / "validation.md"


def main() -> None:
    if "--write-docs" in sys.argv:
        for key, make in TABLES.items():
            write_block(DOC, key, make())
        return
    print(published_table())
    if "--fit-gpu" in sys.argv:
        b = [1, 8, 32]
        ref = np.array([95, 620, 2400])
        cat = load_catalog()
        for g in sorted(cat.gpus):
            try:
                dep = resolve_deployment(cat, "llama-3.1-8b", g, EngineSettings())
            except Exception:  # noqa: BLE001
                continue
            pred = np.array([fixed_batch.decode_tok_per_s(dep.step, x, 1024) for x in b])
            print(g, np.round(pred), f"{np.median(np.abs(pred / ref - 1)):.1%}")


if __name__ == "__main__":
    main()
