"""Microbenchmarks: copy bandwidth, matrix products at a model's layer shapes, attention.

Every timing warms up first, then takes the median of repeats: CUDA events on a GPU
(torch.cuda.Event(enable_timing=True), which time the device stream, not the host), and
time.perf_counter around a synchronised call on the CPU. Data is random (torch.randn), never
zeros: some kernels and memory compressors shortcut zeros (NVIDIA compressible memory).
Torch is imported lazily by `open_bench`; this module imports without it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from capplan.catalog.schema import ModelSpec
from capplan.errors import InputError, ProbeUnavailable
from capplan.units import MIB_BYTES

TORCH_HINT = "PyTorch is not installed: run `pip install capplan[gpu]`"
BLOCK_SIZE = 16
"""KV-cache block size in tokens (vLLM's CUDA default), for the paged-attention benchmark."""


@dataclass
class Bench:
    """A device, a dtype and the timing policy shared by all microbenchmarks."""

    torch: Any
    device: str
    """'cuda' or 'cpu'."""
    dtype: Any
    warmup: int = 2
    repeats: int = 5
    samples: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"

    def sync(self) -> None:
        if self.is_cuda:
            self.torch.cuda.synchronize()

    def randn(self, *shape: int) -> Any:
        """Random normal data scaled to keep products finite in 16-bit."""
        t = self.torch.randn(*shape, device=self.device, dtype=self.dtype)
        return t.mul_(1.0 / math.sqrt(max(shape[-1], 1)))

    def time_s(self, fn: Callable[[], Any]) -> float:
        """Median seconds of fn() after warm-up."""
        for _ in range(self.warmup):
            fn()
        self.sync()
        times: list[float] = []
        if self.is_cuda:
            ev = self.torch.cuda.Event
            for _ in range(self.repeats):
                start, end = ev(enable_timing=True), ev(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)  # elapsed_time is in ms
        else:
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def is_oom(self, e: BaseException) -> bool:
        oom = getattr(self.torch, "OutOfMemoryError", None)
        return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()

    def guarded(self, label: str, fn: Callable[[], dict[str, Any] | None]) -> None:
        """Run one measurement; an out-of-memory at this size is recorded and skipped."""
        try:
            sample = fn()
        except RuntimeError as e:
            if not self.is_oom(e):
                raise
            self.skipped.append(f"{label}: out of memory")
            if self.is_cuda:
                self.torch.cuda.empty_cache()
            return
        if sample is not None:
            self.samples.append(sample)


def import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ProbeUnavailable(TORCH_HINT) from e
    return torch


def open_bench(device: str, quick: bool) -> Bench:
    """A Bench on 'cuda' or 'cpu' in bf16.

    Raises:
        ProbeUnavailable: torch missing, or CUDA asked for and not available.
    """
    torch = import_torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbeUnavailable(
            "no CUDA GPU found by PyTorch (torch.cuda.is_available() is False): run on a "
            "machine with an NVIDIA GPU and a CUDA build of torch, or use --device cpu")
    if device not in ("cuda", "cpu"):
        raise InputError(f"--device {device!r}: use cuda or cpu")
    torch.manual_seed(0)
    return Bench(torch=torch, device=device, dtype=torch.bfloat16,
                 warmup=2 if (device == "cpu" or not quick) else 1,
                 # a shared CPU is noisy: the median of 5 even in a quick run
                 repeats=5 if (device == "cpu" or not quick) else 3)


# ---------------------------------------------------------------------------------------------
def bench_copy(b: Bench, sizes_bytes: list[int]) -> None:
    """Device-to-device copy: reads and writes n bytes, so 2n bytes move per copy."""
    for n in sizes_bytes:
        def one(n: int = n) -> dict[str, Any]:
            src = b.randn(n // 2)  # bf16: 2 bytes per element
            dst = b.torch.empty_like(src)
            t = b.time_s(lambda: dst.copy_(src))
            return {"kind": "copy", "bytes": 2 * n, "time_s": t, "bytes_per_s": 2 * n / t}
        b.guarded(f"copy {n / MIB_BYTES:.0f} MiB", one)


def layer_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) features of each matrix product of one layer plus the LM head, at TP=1."""
    h, hd = model.hidden_size, model.head_dim
    qkv = (model.num_attention_heads + 2 * model.num_kv_heads) * hd
    mlp_out = (2 if model.mlp_gated else 1) * model.intermediate_size
    return {"qkv": (h, qkv), "o": (model.num_attention_heads * hd, h), "gate_up": (h, mlp_out),
            "down": (model.intermediate_size, h), "lm_head": (h, model.vocab_size)}


def _fp8_matmul(b: Bench) -> Callable[[Any, Any], Any] | None:
    """torch._scaled_mm in e4m3 where the GPU supports it (compute capability >= 8.9)."""
    torch = b.torch
    if not b.is_cuda or not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return None
    if torch.cuda.get_device_capability() < (8, 9):
        return None
    one = torch.ones((), device="cuda", dtype=torch.float32)

    def mm(x8: Any, w8t: Any) -> Any:
        return torch._scaled_mm(x8, w8t, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return mm


def bench_gemm(b: Bench, model: ModelSpec, tokens: list[int], fp8: bool = True) -> None:
    """x[T, in] @ W[in, out] for each layer shape and token count (bf16; fp8 where supported)."""
    fp8_mm = _fp8_matmul(b) if fp8 else None
    for name, (k, n) in layer_shapes(model).items():
        try:
            w = b.randn(n, k)
        except RuntimeError as e:
            if not b.is_oom(e):
                raise
            b.skipped.append(f"gemm {name}: weights out of memory")
            continue
        w8 = w.to(b.torch.float8_e4m3fn) if fp8_mm else None
        for t in tokens:
            def one(t: int = t, name: str = name, k: int = k, n: int = n,
                    w: Any = w) -> dict[str, Any]:
                x = b.randn(t, k)
                sec = b.time_s(lambda: b.torch.matmul(x, w.t()))
                return {"kind": "gemm", "name": name, "dtype": "bf16", "tokens": t, "k": k,
                        "n": n, "time_s": sec, "flops_per_s": 2 * t * k * n / sec}
            b.guarded(f"gemm {name} x{t}", one)
            if fp8_mm is not None and t % 16 == 0:
                def one8(t: int = t, name: str = name, k: int = k, n: int = n,
                         w8: Any = w8) -> dict[str, Any]:
                    x8 = b.randn(t, k).to(b.torch.float8_e4m3fn)
                    sec = b.time_s(lambda: fp8_mm(x8, w8.t()))
                    return {"kind": "gemm", "name": name, "dtype": "fp8", "tokens": t, "k": k,
                            "n": n, "time_s": sec, "flops_per_s": 2 * t * k * n / sec}
                b.guarded(f"gemm fp8 {name} x{t}", one8)
        del w, w8


# ---------------------------------------------------------------------------------------------
def paged_kv(b: Bench, batch: int, context_len: int, kv_heads: int, head_dim: int
             ) -> tuple[Any, Any, Any]:
    """K and V caches in blocks of BLOCK_SIZE tokens, and a shuffled block table [batch, n]."""
    nblk = -(-context_len // BLOCK_SIZE)
    total = batch * nblk
    k = b.randn(total, BLOCK_SIZE, kv_heads, head_dim)
    v = b.randn(total, BLOCK_SIZE, kv_heads, head_dim)
    table = b.torch.randperm(total, device=b.device).view(batch, nblk)
    return k, v, table


def paged_decode_attention(b: Bench, q: Any, k_cache: Any, v_cache: Any, table: Any,
                           context_len: int) -> Any:
    """One decode query per sequence over its paged KV: gather the blocks, then SDPA (GQA)."""
    bsz, nblk = table.shape
    k = k_cache[table].view(bsz, nblk * BLOCK_SIZE, *k_cache.shape[2:])[:, :context_len]
    v = v_cache[table].view(bsz, nblk * BLOCK_SIZE, *v_cache.shape[2:])[:, :context_len]
    return b.torch.nn.functional.scaled_dot_product_attention(
        q, k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)


def bench_attention(b: Bench, model: ModelSpec, decode: list[tuple[int, int]],
                    prefill: list[int]) -> None:
    """Decode attention over paged and contiguous KV caches; causal prefill attention (SDPA)."""
    torch = b.torch
    nh, nkv, hd = model.num_attention_heads, model.num_kv_heads, model.head_dim
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kv_bytes_per_token = 2 * nkv * hd * 2  # K and V, bf16
    for batch, ctx in decode:
        def paged(batch: int = batch, ctx: int = ctx) -> dict[str, Any]:
            q = b.randn(batch, nh, 1, hd)
            kc, vc, table = paged_kv(b, batch, ctx, nkv, hd)
            sec = b.time_s(lambda: paged_decode_attention(b, q, kc, vc, table, ctx))
            return {"kind": "attn_decode", "layout": "paged", "batch": batch,
                    "context_len": ctx, "time_s": sec,
                    "bytes_per_s": batch * ctx * kv_bytes_per_token / sec}
        b.guarded(f"attn decode paged b{batch} c{ctx}", paged)

        def contiguous(batch: int = batch, ctx: int = ctx) -> dict[str, Any]:
            q = b.randn(batch, nh, 1, hd)
            k, v = b.randn(batch, nkv, ctx, hd), b.randn(batch, nkv, ctx, hd)
            sec = b.time_s(lambda: sdpa(q, k, v, enable_gqa=True))
            return {"kind": "attn_decode", "layout": "contiguous", "batch": batch,
                    "context_len": ctx, "time_s": sec,
                    "bytes_per_s": batch * ctx * kv_bytes_per_token / sec}
        b.guarded(f"attn decode b{batch} c{ctx}", contiguous)
    for c in prefill:
        def pre(c: int = c) -> dict[str, Any]:
            q = b.randn(1, nh, c, hd)
            k, v = b.randn(1, nkv, c, hd), b.randn(1, nkv, c, hd)
            sec = b.time_s(lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True))
            flops = 4 * nh * hd * c * (c + 1) / 2  # QK^T and PV over causal pairs
            return {"kind": "attn_prefill", "tokens": c, "time_s": sec,
                    "flops_per_s": flops / sec}
        b.guarded(f"attn prefill {c}", pre)
