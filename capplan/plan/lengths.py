"""Length statistics of a workload for the analytic model: the one place lengths are sampled.

Each lane's prompt and output lengths are drawn once, from a fresh generator with one fixed
seed (analytic answers must not depend on a user's seed, nor on which other lanes share the
pool), then clipped to max_model_len as vLLM requires. Pooled lanes mix a prefix of each
lane's samples in proportion to its rate.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from capplan.models.queueing import LengthStats

LENGTH_SEED = 12345
"""Seed of every analytic length sample (CLI latency, planner): fixed on purpose."""
LENGTH_SAMPLES = 20_000
"""Samples per lane: quantiles to ~1% at p99 for lognormal lengths."""
_MIN_POOLED = 200


def sample_lengths(input_len: str | int, output_len: str | int,
                   max_model_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """LENGTH_SAMPLES (prompt, output) lengths of one lane, clipped to max_model_len."""
    from capplan.sim.workload import parse_length

    rng = _SeededRng()
    inp = np.asarray(parse_length(str(input_len)).sample(rng, LENGTH_SAMPLES), float)
    out = np.asarray(parse_length(str(output_len)).sample(rng, LENGTH_SAMPLES), float)
    return clipped(inp, out, max_model_len)


class _SeededRng:
    """`np.random.default_rng(LENGTH_SEED)`, made at the first draw: fixed lengths draw
    nothing, and numpy.random costs ~12 ms to import in a process that needs no draw."""

    def __getattr__(self, name: str) -> object:
        if "rng" not in self.__dict__:
            self.__dict__["rng"] = np.random.default_rng(LENGTH_SEED)
        return getattr(self.__dict__["rng"], name)


def clipped(inp: np.ndarray, out: np.ndarray, max_model_len: int | None
            ) -> tuple[np.ndarray, np.ndarray]:
    """Prompts cut so that prompt + output fit max_model_len (None: unchanged)."""
    if not max_model_len:
        return inp, out
    from capplan.sim.workload import clip_lengths

    return clip_lengths(inp, out, max_model_len)


def length_stats(inp: np.ndarray, out: np.ndarray) -> tuple[LengthStats, LengthStats]:
    return LengthStats.from_samples(inp), LengthStats.from_samples(out)


def pooled_stats(lanes: Sequence[tuple[float, str | int, str | int]],
                 max_model_len: int | None = None) -> tuple[LengthStats, LengthStats]:
    """Length statistics of lanes (rate, input_len, output_len) sharing one pool."""
    total = sum(rate for rate, _, _ in lanes)
    ins, outs = [], []
    for rate, input_len, output_len in lanes:
        n = LENGTH_SAMPLES if len(lanes) == 1 else max(_MIN_POOLED,
                                                       int(LENGTH_SAMPLES * rate / total))
        i, o = sample_lengths(input_len, output_len, max_model_len)
        ins.append(i[:n])
        outs.append(o[:n])
    return length_stats(np.concatenate(ins), np.concatenate(outs))
