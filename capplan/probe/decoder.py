"""A whole decoder step of a model's shapes with random weights, timed per (batch, context).

A Llama-style layer (RMSNorm, fused QKV, SDPA attention with GQA, output projection, RMSNorm,
gated SiLU MLP; Touvron et al. 2023) runs for `num_layers_measured` layers, then the LM head
on the rows that need logits. The layers' time is scaled to the model's depth:

    step_s = layers_s * num_layers / num_layers_measured + lm_head_s

Decode steps read a contiguous per-sequence KV cache (what a fused paged kernel reads; the
gather-based paged variant is timed separately in bench.py) and write one new K/V row per
sequence. Prefill chunks run causal SDPA over the chunk. On CUDA every decode shape is timed
eagerly and replayed as a CUDA graph (torch.cuda.CUDAGraph), as vLLM captures decode batches.
"""

from __future__ import annotations

from typing import Any

from capplan.catalog.schema import ModelSpec
from capplan.errors import InputError
from capplan.probe.bench import Bench


def check_supported(model: ModelSpec) -> None:
    if model.moe is not None or model.mla is not None:
        raise InputError(f"--model {model.key}: the decoder benchmark covers dense GQA models "
                         "only; use a dense model of similar size (e.g. llama-3.1-8b)")


class RandomDecoder:
    """`num_layers` Llama-style layers and an LM head with random bf16 weights."""

    def __init__(self, b: Bench, model: ModelSpec, num_layers: int):
        self.b, self.m, self.n = b, model, num_layers
        h, hd, im = model.hidden_size, model.head_dim, model.intermediate_size
        self.nh, self.nkv, self.hd = model.num_attention_heads, model.num_kv_heads, hd
        qkv = (self.nh + 2 * self.nkv) * hd
        mlp = (2 if model.mlp_gated else 1) * im
        self.layers = [
            {"qkv": b.randn(qkv, h), "o": b.randn(h, self.nh * hd), "gate_up": b.randn(mlp, h),
             "down": b.randn(h, im), "ln1": b.randn(h).abs_().add_(1), "ln2": b.randn(h).abs_()
             .add_(1)} for _ in range(num_layers)]
        self.lm_head = b.randn(model.vocab_size, h)
        self.norm = b.randn(h).abs_().add_(1)

    def _rms(self, x: Any, w: Any) -> Any:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * self.b.torch.rsqrt(var + 1e-5)).to(x.dtype) * w

    def _mlp(self, x: Any, lw: dict[str, Any]) -> Any:
        f = self.b.torch.nn.functional
        gu = f.linear(x, lw["gate_up"])
        if self.m.mlp_gated:
            g, u = gu.chunk(2, dim=-1)
            gu = f.silu(g) * u
        else:
            gu = f.gelu(gu)
        return f.linear(gu, lw["down"])

    def _split(self, qkv: Any, rows: int, length: int) -> tuple[Any, Any, Any]:
        q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        shape = (rows, length)
        return (q.view(*shape, self.nh, self.hd).transpose(1, 2),
                k.view(*shape, self.nkv, self.hd).transpose(1, 2),
                v.view(*shape, self.nkv, self.hd).transpose(1, 2))

    def decode(self, x: Any, caches: list[tuple[Any, Any]], pos: int) -> Any:
        """x [B, h]; caches[i] = (K, V) of [B, kv_heads, ctx + 1, hd]; new token at `pos`."""
        f = self.b.torch.nn.functional
        bsz = x.shape[0]
        for lw, (kc, vc) in zip(self.layers, caches, strict=True):
            q, k, v = self._split(f.linear(self._rms(x, lw["ln1"]), lw["qkv"]), bsz, 1)
            kc[:, :, pos:pos + 1].copy_(k)
            vc[:, :, pos:pos + 1].copy_(v)
            a = f.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            x = x + f.linear(a.transpose(1, 2).reshape(bsz, -1), lw["o"])
            x = x + self._mlp(self._rms(x, lw["ln2"]), lw)
        return x

    def prefill(self, x: Any) -> Any:
        """x [T, h]: one sequence's chunk, causal attention within it."""
        f = self.b.torch.nn.functional
        t = x.shape[0]
        for lw in self.layers:
            q, k, v = self._split(f.linear(self._rms(x, lw["ln1"]), lw["qkv"]), 1, t)
            a = f.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + f.linear(a.transpose(1, 2).reshape(t, -1), lw["o"])
            x = x + self._mlp(self._rms(x, lw["ln2"]), lw)
        return x

    def head(self, x: Any) -> Any:
        return self.b.torch.nn.functional.linear(self._rms(x, self.norm), self.lm_head)

    # -----------------------------------------------------------------------------------------
    def _scale(self, layers_s: float, head_s: float) -> float:
        return layers_s * self.m.num_layers / self.n + head_s

    def time_decode(self, batch: int, context_len: int, graphs: bool) -> dict[str, Any]:
        b = self.b
        x = b.randn(batch, self.m.hidden_size)
        caches = [(b.randn(batch, self.nkv, context_len + 1, self.hd),
                   b.randn(batch, self.nkv, context_len + 1, self.hd)) for _ in range(self.n)]
        layers = lambda: self.decode(x, caches, context_len)  # noqa: E731
        head = lambda: self.head(x)  # noqa: E731
        if graphs:
            layers, head = _graph(b, layers), _graph(b, head)
        layers_s, head_s = b.time_s(layers), b.time_s(head)
        return {"kind": "decode_step", "batch": batch, "context_len": context_len,
                "cuda_graphs": graphs, "layers_measured": self.n, "layers_s": layers_s,
                "lm_head_s": head_s, "time_s": self._scale(layers_s, head_s)}

    def time_prefill(self, chunk_tokens: int) -> dict[str, Any]:
        b = self.b
        x = b.randn(chunk_tokens, self.m.hidden_size)
        layers_s = b.time_s(lambda: self.prefill(x))
        head_s = b.time_s(lambda: self.head(x[-1:]))  # logits for the last token only
        return {"kind": "prefill_step", "chunk_tokens": chunk_tokens, "prefix_tokens": 0,
                "layers_measured": self.n, "layers_s": layers_s, "lm_head_s": head_s,
                "time_s": self._scale(layers_s, head_s)}


def _graph(b: Bench, fn: Any) -> Any:
    """Capture fn into a CUDA graph (warm-up on a side stream first, as torch documents)."""
    torch = b.torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay
