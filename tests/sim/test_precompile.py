"""`capplan.sim.precompile`: each of its command lines is a valid run (a renamed option would
otherwise leave a family of the loops uncompiled without a word), and the loops it compiles are
the ones a later `simulate` loads."""

from __future__ import annotations

import pytest

from capplan.sim import compiled_available
from capplan.sim.precompile import RUNS, precompile

pytestmark = pytest.mark.skipif(not compiled_available(), reason="numba is not installed")


def test_every_run_completes() -> None:
    assert precompile(RUNS) == len(RUNS)


def test_a_failing_run_is_skipped_not_raised() -> None:
    bad = ("simulate", "--model", "no-such-model", "--gpu", "h100-sxm", "--rate", "1")
    assert precompile((bad, RUNS[0])) == 1
