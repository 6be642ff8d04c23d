"""Compile the simulator's loops into numba's on-disk cache once, before the test workers start.

numba compiles a `cache=True` function on its first call in a process and writes the result
beside the source; a process that starts while another is still compiling compiles it again.
Under pytest-xdist every worker (and every `python -m capplan` subprocess a test starts) would
otherwise compile the same loops at the same time on a cold cache (a fresh clone). conftest.py
calls `warm()` in the controlling process; the workers then load the compiled code from the
cache. The runs are the product's own list (`capplan.sim.precompile.RUNS`, which `make test`
also runs while it installs the test extras) plus a hybrid model's state blocks, whose config
lives in the tests' data. A signature the tests reach and this list does not is compiled by the
first worker that needs it (slower, never wrong).
"""

from __future__ import annotations

from pathlib import Path

from capplan.sim.precompile import RUNS as PRODUCT_RUNS
from capplan.sim.precompile import precompile

HYBRID = Path(__file__).resolve().parent / "data" / "configs" / "granite-4.0-h-350m.config.json"
RUNS: tuple[tuple[str, ...], ...] = PRODUCT_RUNS + (
    ("simulate", "--model", str(HYBRID), "--gpu", "h200", "--max-model-len", "4096",
     "--concurrency", "4", "--requests", "8", "--input-len", "200", "--output-len", "20",
     "--format", "json"),
)


def warm() -> None:
    """Run each of RUNS in this process (output discarded); a run that fails is skipped: the
    test that covers it reports the failure."""
    precompile(RUNS)
