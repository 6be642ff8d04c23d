"""The continuous-batching engine's option values and checks, shared by the engine
(capplan.sim.engine) and its scheduler loop (capplan.sim.compiled) without importing either."""

from __future__ import annotations

import numpy as np

from capplan.errors import InputError

NO_WINDOW = 2**62
"""Sliding window of a model without one (no query is capped)."""
ENGINE_IMPLS = ("auto", "compiled", "python")
"""`--sim-engine`: auto runs the scheduler loop compiled when numba imports, else as plain
Python; compiled insists on numba; python runs the same loop interpreted (debugging)."""
LEGACY_IMPLS = {"fast": "python", "reference": "python"}
"""Names of the earlier hand-written engines, still accepted: the loop as plain Python."""
INSTALL_HINT = "--sim-engine compiled needs numba: pip install numba"


def check_overhead(request_overhead_s: float) -> None:
    """A per-request overhead must be a finite number >= 0 (one-line error otherwise)."""
    if not (np.isfinite(request_overhead_s) and request_overhead_s >= 0):
        raise InputError(f"request_overhead_s {request_overhead_s}: must be >= 0")
