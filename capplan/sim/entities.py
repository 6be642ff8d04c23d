"""Passive state of the simulator: the step record and the results of a run (SI units)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class StepRecord(NamedTuple):
    """One engine step: what it computed (the first ten fields are the keyword arguments of
    `StepModel.step`) and the engine's state once the step was scheduled."""

    num_decode: int
    """Sequences decoding one token this step."""
    decode_kv_tokens: int
    """Sum of their contexts (KV tokens read), full-attention layers."""
    decode_kv_tokens_window: int
    """The same, each capped at the sliding window."""
    prefill_tokens: int
    """Prompt tokens computed this step (all chunks)."""
    prefill_pairs: float
    """Causal query-key pairs of those chunks (`models.perf.chunk_attention`)."""
    prefill_pairs_window: float
    """The same, keys limited to the sliding window."""
    prefill_kv_read: int
    """Cached prefix tokens the chunks attend to."""
    prefill_kv_read_window: int
    """The same, capped at the window."""
    num_prefill_seqs: int
    """Sequences with a prefill chunk this step."""
    num_logits: int
    """Tokens sampled: decode tokens plus chunks that complete their prompt."""
    num_running: int
    """Admitted sequences (decoding or prefilling)."""
    num_waiting: int
    """Requests in the waiting queue."""
    kv_blocks_used: int
    """KV blocks allocated or reserved."""
    tbt_count: int
    """Decoders whose previous token came at step `tbt_from_step` (each saw that gap)."""
    tbt_from_step: int
    """The previous decode step (this step - 1 when every step decodes); -1 when none."""


STEP_INPUTS: tuple[str, ...] = StepRecord._fields[:10]
"""The StepRecord fields that `StepModel.step` takes as keyword arguments."""
STEP_DTYPE = np.dtype([(f, np.float64 if f.startswith("prefill_pairs") else np.int64)
                       for f in StepRecord._fields])


def step_array(steps: Sequence[StepRecord]) -> np.ndarray:
    """Step records as a structured array (one named column per field)."""
    return np.array(steps, dtype=STEP_DTYPE) if len(steps) else np.zeros(0, STEP_DTYPE)


@dataclass(frozen=True)
class StepSummary:
    """What the results need of the engine steps, in memory that does not grow with them: the
    per-step TBT samples as (gap, count) with equal gaps merged, the time integrals of the
    running set and the requests in the system, the peak of KV blocks in use and the sampled
    time series. The compiled engine builds it in its loop; `metrics.step_summary` builds the
    same from a RunRecord's per-step arrays."""

    num_steps: int
    tbt_gap_s: np.ndarray
    """Distinct per-step TBT gaps (s)."""
    tbt_count: np.ndarray
    """How many token gaps each one stands for."""
    running_s: float
    """Integral of the running set over time (sequences x s)."""
    in_system_s: float
    """Integral of running plus waiting requests over time (requests x s)."""
    kv_blocks_max: int
    series_start_s: np.ndarray
    """The time series' steps: start (s), running, waiting, KV blocks in use."""
    series_running: np.ndarray
    series_waiting: np.ndarray
    series_kv_blocks: np.ndarray


@dataclass(frozen=True)
class RunRecord:
    """What a scheduler produced: per-request timestamps and per-step samples.

    Per-step arrays (`step_*`) or, from the compiled engine, their aggregate `steps`.
    TBT gaps are stored compactly (every gap stays exact): `step_tbt_gap_s[i]` is the gap of
    each of the `step_tbt_count[i]` sequences that got a token in step i after one in the
    previous decode step (`step_dur_s[i]` when every step decodes); other gaps (after a
    preemption and recompute, or a first decode after a prefill-only step) are listed one by one
    in `extra_gaps_s`.
    """

    arrival_at_s: np.ndarray
    admitted_at_s: np.ndarray
    first_token_at_s: np.ndarray
    finished_at_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    lane: np.ndarray
    step_start_s: np.ndarray
    step_dur_s: np.ndarray
    step_tbt_count: np.ndarray
    step_tbt_gap_s: np.ndarray
    extra_gaps_s: np.ndarray
    step_running: np.ndarray
    step_waiting: np.ndarray
    step_kv_blocks: np.ndarray
    num_gpu_blocks: int
    preemptions: int
    scheduler: str
    bound_counts: dict[str, int] | None = None
    prefix_hit_tokens: int = 0
    """Prompt tokens found in the prefix cache (computed by no step), over all admissions."""
    steps: StepSummary | None = None
    """The steps' aggregates when the engine kept no per-step arrays (the step_* arrays are
    then empty); `metrics.summarize` reads either."""
