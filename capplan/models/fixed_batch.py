"""A fixed batch run once, as offline latency benchmarks measure it.

`vllm bench latency` (vllm/benchmarks/latency.py) sends one batch of `batch` prompts of `isl`
tokens and generates `osl` tokens for each; TensorRT-LLM's first-token latency is that run with
one output token; a decode throughput figure is the tokens one decode step of `batch` sequences
yields per second. No queue, no arrivals: the step model alone (models/perf.py), which is what
such published figures score (benchmarks/validate_perf.py, docs/validation.md section 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def decode_tok_per_s(step: Any, batch: int, context: int) -> float:
    """Output tokens per second of one decode step of `batch` sequences at `context` tokens."""
    return float(batch / step.decode_step(batch, context)["step_s"])


def first_token_s(step: Any, prompt: int, chunk: int) -> float:
    """Time to the first token of one prompt alone: its prefill in chunks of `chunk` tokens."""
    return float(step.prefill_time(prompt, chunk))


def mean_tpot_s(step: Any, batch: int, isl: int, osl: int) -> float:
    """Mean time per output token after the first: decode steps of `batch` sequences at
    contexts isl + 1 .. isl + osl - 1."""
    ctx = isl + np.arange(1, osl)
    return float(step.decode_step(batch, ctx)["step_s"].mean())


def batch_e2e_s(step: Any, batch: int, isl: int, osl: int) -> float:
    """End-to-end time of the batch: every prompt prefilled in one step (causal attention
    pairs isl (isl + 1) / 2 each), then osl - 1 decode steps at the growing context."""
    ctx = isl + np.arange(1, osl)
    dec = step.decode_step(batch, ctx)["step_s"]
    pre = step.step(prefill_tokens=batch * isl, prefill_pairs=batch * isl * (isl + 1) / 2,
                    num_prefill_seqs=batch)["step_s"]
    return float(pre + dec.sum())
