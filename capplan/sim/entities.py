"""Passive results of one simulated run, in SI units, consumed by `capplan.sim.metrics`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RunRecord:
    """What a scheduler produced: per-request timestamps and per-step samples.

    TBT gaps are stored compactly (every gap stays exact): `step_dur_s[i]` is a gap for each of
    the `step_tbt_count[i]` sequences that got a token in step i after one in step i-1; longer
    gaps (after a preemption and recompute) are listed one by one in `extra_gaps_s`.
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
    extra_gaps_s: np.ndarray
    step_running: np.ndarray
    step_waiting: np.ndarray
    step_kv_blocks: np.ndarray
    num_gpu_blocks: int
    preemptions: int
    scheduler: str
    bound_counts: dict[str, int] | None = None
