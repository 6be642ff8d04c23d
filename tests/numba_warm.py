"""Compile the simulator's loops into numba's on-disk cache once, before the test workers start.

numba compiles a `cache=True` function on its first call in a process and writes the result
beside the source; a process that starts while another is still compiling compiles it again.
Under pytest-xdist every worker (and every `python -m capplan` subprocess a test starts) would
otherwise compile the same loops at the same time on a cold cache (a fresh clone): ~3 compiles
of the scheduler loop and the fleet loop where one is needed. conftest.py calls `warm()` in the
controlling process; the workers then load the compiled code from the cache.

Each run below reaches one family of the loops' argument types (numba compiles one version per
type signature): open and closed loops, each engine's scheduling policy, a trace, prefix
caching, a hybrid model's state blocks, the fleet loop with each router, and a fixed
disaggregated layout. A signature the tests reach and this list does not is compiled by the
first worker that needs it, as before (slower, never wrong).
"""

from __future__ import annotations

from pathlib import Path

HYBRID = Path(__file__).resolve().parent / "data" / "configs" / "granite-4.0-h-350m.config.json"
BASE = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--input-len", "200",
        "--output-len", "20", "--format", "json")
RUNS: tuple[tuple[str, ...], ...] = (
    BASE + ("--rate", "5", "--requests", "40"),
    BASE + ("--concurrency", "4", "--requests", "40"),
    BASE + ("--engine", "sglang", "--rate", "5", "--requests", "40"),
    BASE + ("--engine", "trtllm", "--rate", "5", "--requests", "40"),
    BASE + ("--rate", "5", "--requests", "40", "--shared-prefix", "64"),
    BASE + ("--concurrency", "4", "--requests", "40", "--shared-prefix", "64"),
    BASE + ("--rate", "5", "--requests", "40", "--replicas", "2", "--router", "round-robin"),
    BASE + ("--rate", "5", "--requests", "40", "--replicas", "2"),
    BASE + ("--rate", "5", "--requests", "40", "--replicas", "2", "--router",
            "prefix-affinity", "--shared-prefix", "64"),
    BASE + ("--concurrency", "4", "--requests", "40", "--replicas", "2"),
    ("simulate", "--model", str(HYBRID), "--gpu", "h200", "--max-model-len", "4096",
     "--concurrency", "4", "--requests", "8", "--input-len", "200", "--output-len", "20",
     "--format", "json"),
    ("simulate", "--model", "deepseek-r1", "--gpu", "h200", "--prefill-workers", "1",
     "--prefill-tp", "8", "--decode-workers", "1", "--decode-tp", "8", "--rate", "1",
     "--requests", "8", "--input-len", "200", "--output-len", "20", "--format", "json"),
)


def warm() -> None:
    """Run each of RUNS in this process (output discarded); a run that fails is skipped: the
    test that covers it reports the failure."""
    import contextlib
    import io

    from capplan.sim import compiled_available

    if not compiled_available():
        return
    from capplan.cli import cli

    for args in RUNS:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with contextlib.suppress(Exception, SystemExit):
                cli.main(list(args), prog_name="capplan", standalone_mode=False)
