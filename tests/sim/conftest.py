"""Shared fakes for the simulator tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest


@contextmanager
def step_by_step() -> Iterator[None]:
    """The plain loop (`sim_engine="python"`) with decode stretches off: every step scheduled
    on its own (capplan.sim.compiled._bulk runs no stretch shorter than BULK_MIN_STEPS)."""
    from capplan.sim.compiled import plain_module

    mod = plain_module()
    old = mod.BULK_MIN_STEPS
    mod.BULK_MIN_STEPS = 1 << 40
    try:
        yield
    finally:
        mod.BULK_MIN_STEPS = old


class ConstStep:
    """A StepModel stand-in: every step takes `step_s` seconds."""

    window = 2.0**62

    def __init__(self, step_s: float = 0.01) -> None:
        self.step_s = step_s

    def step(self, **kw):  # noqa: ANN003, ANN201
        return {"step_s": np.full(np.shape(kw["num_decode"]), self.step_s)}


class LinearStep:
    """step_s = 1 ms per token computed + 0.1 ms per decode KV token read."""

    window = 2.0**62

    def step(self, num_decode=0, decode_kv_tokens=0, prefill_tokens=0, **kw):  # noqa: ANN001, ANN003, ANN201
        nd, kv, pt = (np.asarray(x, float) for x in (num_decode, decode_kv_tokens, prefill_tokens))
        return {"step_s": 1e-3 * (nd + pt) + 1e-4 * kv}


@pytest.fixture(scope="session")
def llama_h100():
    from capplan.catalog.loader import load_catalog
    from capplan.models.engine import EngineSettings
    from capplan.plan.deployment import resolve_deployment

    return resolve_deployment(load_catalog(()), "llama-3.1-8b", "h100-sxm",
                              EngineSettings(max_num_seqs=256, max_num_batched_tokens=8192))
