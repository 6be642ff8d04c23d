"""A prefill step's attention work when the step's prompt tokens are not one sequence's chunk:
packed as whole prompts when the step holds more than a prompt, over attention-DP ranks.

The step formula (models/perf.py) takes the causal query-key pairs of the step's prefill
tokens. One chunk of c tokens after p cached ones has c p + c (c + 1) / 2 pairs
(`chunk_attention`). A step whose c prompt tokens are n = c / L whole prompts of L tokens (each
after `cached` shared-prefix tokens) has n (L cached + L (L + 1) / 2) pairs: attention is
quadratic in each prompt, not in the step. With attention data parallelism each prompt runs on
one of the D ranks (SGLang --enable-dp-attention, vLLM --data-parallel-size, TensorRT-LLM
enable_attention_dp) and the step formula charges the busiest rank (`perf.busiest_share`): a
step holding less than a prompt is one prompt's piece on one rank; n prompts sit on min(n, D)
ranks.

At c <= L the result equals `StepModel.prefill_chunk` (one sequence's chunk after a mean prefix
of cached + (L - c) / 2), so nothing changes where a chunk is part of one prompt.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from capplan.models.perf import StepModel, chunk_attention


def packed_prefill_step(step: StepModel, chunk: Any, prompt_mean: float, cached: float,
                        num_decode: Any, decode_kv_tokens: Any) -> np.ndarray:
    """Seconds of a step with `chunk` prefill tokens (the replica's, all ranks) of prompts of
    mean `prompt_mean` computed tokens after `cached` cached ones, and `num_decode` decoders
    holding `decode_kv_tokens` KV tokens."""
    c_all = np.asarray(chunk, float)
    big_l = max(float(prompt_mean), 1.0)
    w = np.asarray(step.window, float)
    whole = c_all > big_l
    k = np.where(whole, c_all / big_l, 1.0)  # prompts (or one prompt's piece) in the step
    seq_c = np.where(whole, big_l, c_all)  # tokens of each this step
    prefix = cached + np.maximum(big_l - seq_c, 0.0) / 2
    pairs, pairs_w, read_w = chunk_attention(seq_c, prefix, w)
    bd = np.asarray(num_decode, float)
    dkv = np.asarray(decode_kv_tokens, float)
    return step.step(num_decode=bd, decode_kv_tokens=dkv,
                     decode_kv_tokens_window=np.minimum(dkv, bd * w),
                     prefill_tokens=c_all, prefill_pairs=pairs * k,
                     prefill_pairs_window=pairs_w * k, prefill_kv_read=prefix * k,
                     prefill_kv_read_window=read_w * k,
                     num_prefill_seqs=(c_all > 0) * k, num_logits=bd + (c_all > 0) * k,
                     detail=False)["step_s"]
