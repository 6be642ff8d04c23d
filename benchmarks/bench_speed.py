"""Issue 17 speed goals, measured in one run: simulate, recommend, start-up.

- `capplan simulate` of N requests (default 1,000,000) at 10%, 80% and 120% of capacity
  (llama-3.1-8b on h100-sxm, vLLM defaults, 512 prompt / 256 output tokens; capacity ~37.5
  req/s, so 3.75, 30 and 45 req/s), each in its own process: wall time, peak RSS, requests
  simulated per second. Goal: 1M at 80% under 10 s and 500 MiB.
- The fast engine's speed-up over the reference engine at each load, in-process on
  `--ref-requests` requests (default 20,000; the reference is too slow for 1M at overload).
- `capplan recommend` for one lane over the whole catalog with the top 5 verified (goal < 1 s).
- `capplan --help` and `--version` (goal < 0.2 s).

Run: `.venv/bin/python benchmarks/bench_speed.py [--requests N] [--ref-requests N]`.
Wall times depend on the machine and its load: the figures in docs/performance.md say where
they were taken.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent / "capplan"
MODEL, GPU, INP, OUT = "llama-3.1-8b", "h100-sxm", 512, 256
CAPACITY_PER_S = 37.5
"""Completions per second of this deployment saturated (measured: 40 req/s offered gives
~35-37 req/s of completions and a growing queue)."""
LOADS = (0.1, 0.8, 1.2)


MEMORY_CAP_BYTES = 4 << 30
"""Address-space cap of each child (a shared machine): a run needing more fails, as the CLI's
one-line out-of-memory error, rather than pushing the machine into swap."""


def _cap_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


def _child(args: list[str]) -> tuple[float, float, int]:
    """(wall s, peak RSS MiB, exit code) of one command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_cap_memory)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode:
        print(f"  failed ({proc.returncode}): {err.strip()[-300:]}")
    return wall, usage.ru_maxrss / 1024, proc.returncode


def simulate(n: int, loads: tuple[float, ...] = LOADS) -> None:
    print(f"simulate {n:,} requests ({MODEL} on {GPU}, {INP} in / {OUT} out, fast engine)")
    for load in loads:
        rate = load * CAPACITY_PER_S
        wall, rss, rc = _child([str(BIN), "--limit", f"sim_requests={max(n, 500_000)}",
                                "simulate", "--model", MODEL, "--gpu", GPU, "--rate", f"{rate}",
                                "--requests", str(n), "--input-len", str(INP), "--output-len",
                                str(OUT), "--format", "json"])
        if not rc:
            print(f"  {load:>4.0%} load ({rate:5.2f} req/s): {wall:7.1f} s wall, "
                  f"{rss:6.0f} MiB peak RSS, {n / wall:9,.0f} requests simulated/s")


def speedup(n: int) -> None:
    import numpy as np

    from capplan.api import deployment
    from capplan.plan.simulation import workload_from_options
    from capplan.sim import ContinuousEngine, FastEngine

    dep = deployment(MODEL, GPU)
    s = dep.settings
    print(f"fast vs reference engine, {n:,} requests, in-process (same results)")
    for load in LOADS:
        rate = load * CAPACITY_PER_S
        reqs = workload_from_options(rate, None, None, str(INP), str(OUT), 1.0, n,
                                     "auto").generate(np.random.default_rng(0))
        walls = {}
        for cls in (FastEngine, ContinuousEngine):
            eng = cls(dep.step, dep.memory.num_gpu_blocks, dep.memory.block_size,
                      s.max_num_seqs, s.max_num_batched_tokens, s.profile.scheduler)
            t0 = time.perf_counter()
            eng.run(reqs)
            walls[cls.__name__] = time.perf_counter() - t0
        fast, ref = walls["FastEngine"], walls["ContinuousEngine"]
        print(f"  {load:>4.0%} load: fast {fast:6.2f} s, reference {ref:6.2f} s, "
              f"speed-up {ref / fast:4.1f}x")


def recommend(repeats: int = 3) -> None:
    args = [str(BIN), "recommend", "--model", MODEL, "--rate", "30", "--input-len", str(INP),
            "--output-len", str(OUT), "--ttft-p99", "1", "--tbt-p99", "0.06", "--format",
            "json"]
    walls = sorted(_child(args)[0] for _ in range(repeats))
    print(f"recommend, one lane, whole catalog, top 5 verified: median {walls[len(walls) // 2]:.2f}"
          f" s (best {walls[0]:.2f} s of {repeats})")


def startup(repeats: int = 5) -> None:
    for flag in ("--help", "--version"):
        runs = sorted(_child([str(BIN), flag]) for _ in range(repeats))
        wall, rss, _ = runs[len(runs) // 2]
        print(f"capplan {flag}: median {wall:.3f} s, {rss:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--ref-requests", type=int, default=20_000)
    ap.add_argument("--loads", default=",".join(map(str, LOADS)),
                    help="fractions of capacity to simulate, e.g. 0.8,1.2")
    ap.add_argument("--only", choices=["startup", "recommend", "speedup", "simulate"])
    a = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    steps = {"startup": startup, "recommend": recommend,
             "speedup": lambda: speedup(a.ref_requests),
             "simulate": lambda: simulate(a.requests, tuple(map(float, a.loads.split(","))))}
    for name, run in steps.items():
        if a.only in (None, name):
            run()


if __name__ == "__main__":
    main()
