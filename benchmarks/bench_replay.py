"""Issue 24 item 7: `capplan latency --concurrency 256` answered by replay, wall time including
start-up (a fresh process each run, as a user types it).

The README's workload at 256 clients: llama-3.1-8b on h100-sxm, 1024 prompt / 1024 output
tokens, 1,000 measured requests (vllm bench serve's default --num-prompts), the engine profile's
defaults; plus the README's 64-client run and the SGLang 70B closed loop. Each runs `--repeat`
times in its own process; the best and the median wall times are printed with the engine that
answered (the JSON's `engine_impl`) and the machine's load average (2 shared cores: the figures
move with it). Goal: under 1 s.

Run: `.venv/bin/python benchmarks/bench_replay.py [--repeat 5]`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

RUNS = {
    "8B H100, 256 clients, 1024/1024": ["--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                        "--concurrency", "256", "--input-len", "1024",
                                        "--output-len", "1024"],
    "8B H100, 64 clients, 640 prompts (README)": ["--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                                  "--concurrency", "64", "--num-prompts", "640",
                                                  "--input-len", "1024", "--output-len", "1024"],
    "70B H200 TP4 SGLang, 32 clients, 2048/512": ["--model", "llama-3.1-70b", "--gpu", "h200",
                                                  "--tp", "4", "--engine", "sglang",
                                                  "--concurrency", "32", "--input-len", "2048",
                                                  "--output-len", "512"],
}
GOAL_S = 1.0


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one(args: list[str]) -> tuple[float, float, dict]:
    """(wall s, CPU s, JSON) of one `capplan latency` process."""
    t0, c0 = time.perf_counter(), _cpu_children()
    out = subprocess.run([sys.executable, "-m", "capplan", "latency", *args, "--format", "json"],
                         capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, _cpu_children() - c0, json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    n = ap.parse_args().repeat
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| run | answered by | engine | best wall (s) | median wall (s) | median CPU (s) | "
          "goal |")
    print("|---|---|---|---|---|---|---|")
    for name, args in RUNS.items():
        walls, cpus, d = [], [], {}
        for _ in range(n):
            w, c, d = one(args)
            walls.append(w)
            cpus.append(c)
        goal = f"< {GOAL_S:g} s" if "256" in name else "-"
        print(f"| {name} | {d['answered_by']} | {d.get('engine_impl')} | {min(walls):.2f} | "
              f"{statistics.median(walls):.2f} | {statistics.median(cpus):.2f} | {goal} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
