"""Compile the simulator's loops into numba's on-disk cache ahead of the first simulation.

numba compiles a `cache=True` function on its first call with a given argument-type signature
and keeps the machine code beside the installed source; every later process loads it (~1 s).
The first replay after installing would otherwise pay the compile (~1-2 min of CPU on a slow
core). `python -m capplan.sim.precompile` runs one small simulation of each family of the
loops' signatures, so a container image or an install script can pay it at build time:
open and closed loops, each engine's scheduling policy, prefix caching, the fleet loop with
each router, and a fixed disaggregated layout. A signature not listed here is compiled on its
first use, as without this step (slower once, never wrong).
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Iterable

_BASE = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--input-len", "200",
         "--output-len", "20", "--format", "json")
_OPEN = ("--rate", "5", "--requests", "40")
_CLOSED = ("--concurrency", "4", "--requests", "40")

RUNS: tuple[tuple[str, ...], ...] = (
    _BASE + _OPEN,
    _BASE + _CLOSED,
    _BASE + ("--engine", "sglang") + _OPEN,
    _BASE + ("--engine", "trtllm") + _OPEN,
    _BASE + _OPEN + ("--shared-prefix", "64"),
    _BASE + _CLOSED + ("--shared-prefix", "64"),
    _BASE + _OPEN + ("--replicas", "2", "--router", "round-robin"),
    _BASE + _OPEN + ("--replicas", "2"),
    _BASE + _OPEN + ("--replicas", "2", "--router", "prefix-affinity", "--shared-prefix", "64"),
    _BASE + _CLOSED + ("--replicas", "2"),
    ("simulate", "--model", "deepseek-r1", "--gpu", "h200", "--prefill-workers", "1",
     "--prefill-tp", "8", "--decode-workers", "1", "--decode-tp", "8", "--rate", "1",
     "--requests", "8", "--input-len", "200", "--output-len", "20", "--format", "json"),
)


def precompile(runs: Iterable[tuple[str, ...]] = RUNS) -> int:
    """Run each `capplan` command line of `runs` in this process, output discarded; returns how
    many completed. A run that fails is skipped (the command reports it when a user runs it).
    Without numba there is nothing to compile: returns 0 at once."""
    from capplan.sim import compiled_available

    if not compiled_available():
        return 0
    from capplan.cli import cli

    done = 0
    for args in runs:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with contextlib.suppress(Exception, SystemExit):
                cli.main(list(args), prog_name="capplan", standalone_mode=False)
                done += 1
    return done


def main() -> None:
    start = time.perf_counter()
    done = precompile()
    print(f"capplan: simulator loops compiled and cached ({done} runs, "
          f"{time.perf_counter() - start:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
