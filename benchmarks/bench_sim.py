"""Speed of the continuous-batching simulator: 100,000 requests, lognormal lengths.

llama-3.1-8b on h100-sxm (vLLM defaults: max_num_seqs 1024, max_num_batched_tokens 8192),
input lognormal mean 500 / p99 2500, output lognormal mean 250 / p99 1250, Poisson arrivals at a
rate that keeps about 200 sequences running. Run: `.venv/bin/python benchmarks/bench_sim.py`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from capplan.catalog.loader import load_catalog
from capplan.models.engine import EngineSettings
from capplan.plan.deployment import resolve_deployment
from capplan.sim import Lane, Workload, parse_length, run_scheduler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=33.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dep = resolve_deployment(load_catalog(()), "llama-3.1-8b", "h100-sxm",
                             EngineSettings(max_num_seqs=1024, max_num_batched_tokens=8192))
    wl = Workload((Lane(rate_per_s=a.rate,
                        input_len=parse_length("lognormal:mean=500,p99=2500"),
                        output_len=parse_length("lognormal:mean=250,p99=1250")),),
                  num_requests=a.requests)
    reqs = wl.generate(np.random.default_rng(a.seed))
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_scheduler(dep.step, reqs, wl.lanes, scheduler="continuous",
                        num_gpu_blocks=dep.memory.num_gpu_blocks,
                        block_size=dep.memory.block_size, max_num_seqs=1024,
                        max_num_batched_tokens=8192)
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    print(f"simulated {a.requests} requests at {a.rate:g} req/s in {wall_s:.2f} s "
          f"(CPU {cpu_s:.2f} s; {a.requests / wall_s:,.0f} requests/s); mean running batch "
          f"{res.mean_running_batch:.1f}, p99 TTFT {res.ttft_s['p99'] * 1e3:.1f} ms, "
          f"output {res.output_tokens_per_s:,.0f} tok/s, simulated {res.makespan_s:.0f} s")


if __name__ == "__main__":
    main()
