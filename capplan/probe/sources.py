"""The values of a calibration file's `fit.param_sources`: where each parameter comes from
(docs/probe.md lists them; tests/probe/test_fit.py checks that it does)."""

from __future__ import annotations

FITTED_STEPS = "fitted to the decoder steps"
MICROBENCHMARK = "microbenchmark"
BY_CONSTRUCTION = ("microbenchmark (1 by construction: the host's peaks are this run's best "
                   "rates)")
DEFAULT = "default (not measured)"
FITTED_LEVELS = "fitted to the serving levels"
SPEC_COUNTERS = "the server's spec-decode counters"


def profile_default(why: str) -> str:
    """A serving calibration's per_seq_overhead_s kept at the engine profile's: `why` is
    "one load" or "flat" (a TBT too flat over concurrency to pin it)."""
    return f"default: the engine profile's ({why}: the levels cannot tell it from the fixed cost)"


ALL = (FITTED_STEPS, MICROBENCHMARK, BY_CONSTRUCTION, DEFAULT, FITTED_LEVELS, SPEC_COUNTERS,
       profile_default("one load"), profile_default("flat"))
