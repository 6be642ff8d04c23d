"""The analytic closed loop (capplan/models/closed_loop.py) against the simulator run under the
same benchmark protocol: C clients starting together, N prompts, fixed lengths.

A grid over C, ISL, OSL and N on two deployments; prints the table for docs/queueing.md and the
median error of mean TTFT and mean TPOT. Nothing here is fitted.

Run: .venv/bin/python benchmarks/validate_closed_loop.py [--quick] [--no-jitter]
"""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np

from capplan.catalog.loader import load_catalog
from capplan.models.closed_loop import BenchmarkProtocol, closed_loop_latency
from capplan.models.engine import ClientJitter
from capplan.plan.deployment import EngineOptions, calibration_for, resolve_deployment
from capplan.plan.verify import simulate_closed_loop

DEPLOYMENTS = (("llama-3.1-8b", "h100-sxm", 1), ("llama-3.1-70b", "h100-sxm", 4))
GRID_C = (1, 4, 16, 64, 256)
GRID_ISL = (128, 1024, 4096)
GRID_OSL = (128, 1024)
GRID_ROUNDS = (1, 5, 20)
JITTERS = (ClientJitter(), ClientJitter(request_s=0.002, per_token_s=0.1e-3),
           ClientJitter(request_s=0.02, per_token_s=1e-3))
"""Client jitter: none (synchronised cohorts), small against a decode step, large (cohorts
dispersed; 1024 streamed tokens give a 38 ms spread)."""


def point(dep, c: int, isl: int, osl: int, rounds: int, jitter: ClientJitter
          ) -> tuple[float, float, float, float]:
    s = dep.settings
    n = c * rounds
    a = closed_loop_latency(dep.step, isl, osl, s.max_num_seqs, s.max_num_batched_tokens,
                            dep.memory.kv_cache_tokens, s.block_size,
                            BenchmarkProtocol(c, n, client_jitter=jitter), s.profile.scheduler)
    sim = simulate_closed_loop(dep, c, isl, osl, requests=n, client_jitter=jitter)
    return a["ttft_s"]["mean"], sim["ttft_s"]["mean"], a["tpot_s"], sim["tpot_s"]["mean"]


def grid(quick: bool) -> list[tuple]:
    cs, isls, osls, rounds, jit = GRID_C, GRID_ISL, GRID_OSL, GRID_ROUNDS, JITTERS
    if quick:
        cs, isls, osls, rounds = (4, 64), (1024,), (128,), (1, 20)
    if "--no-jitter" in sys.argv:
        jit = JITTERS[:1]
    return list(itertools.product(cs, isls, osls, rounds, jit))


def main() -> None:
    quick = "--quick" in sys.argv
    cat = load_catalog()
    rows, e_ttft, e_tpot, by_jitter = [], [], [], {}
    t0 = time.perf_counter()
    for model, gpu, tp in DEPLOYMENTS:
        # Engine time only: the per-request overhead is the same additive term in both.
        g = cat.gpu(gpu)
        cal = calibration_for(cat, g, None).with_(request_overhead_s=0.0)
        dep = resolve_deployment(cat, model, gpu, EngineOptions(tp=tp, max_model_len=8192),
                                 cal)
        for c, isl, osl, rounds, jit in grid(quick):
            at, st, ap, sp = point(dep, c, isl, osl, rounds, jit)
            e_ttft.append(at / st - 1)
            e_tpot.append(ap / sp - 1)
            jl = f"{jit.request_s * 1e3:g} ms + {jit.per_token_s * 1e3:g} ms/tok"
            by_jitter.setdefault(jl, []).append((e_ttft[-1], e_tpot[-1]))
            rows.append((model, tp, c, isl, osl, rounds, jl, at * 1e3, st * 1e3, e_ttft[-1],
                         ap * 1e3, sp * 1e3, e_tpot[-1]))
    print("| model | TP | C | ISL | OSL | N/C | jitter | TTFT analytic (ms) | TTFT sim (ms) | err "
          "| TPOT analytic (ms) | TPOT sim (ms) | err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {r[7]:.1f} "
              f"| {r[8]:.1f} | {r[9]:+.0%} | {r[10]:.2f} | {r[11]:.2f} | {r[12]:+.0%} |")
    print("\n| jitter | points | mean TTFT \\|error\\| median / p90 | mean TPOT \\|error\\| "
          "median / p90 |\n|---|---|---|---|")
    for jl, errs in by_jitter.items():
        a = np.abs(np.array(errs))
        print(f"| {jl} | {len(a)} | {np.median(a[:, 0]):.1%} / {np.quantile(a[:, 0], 0.9):.1%} "
              f"| {np.median(a[:, 1]):.1%} / {np.quantile(a[:, 1], 0.9):.1%} |")
    et, ep = np.abs(e_ttft), np.abs(e_tpot)
    print(f"\npoints: {len(rows)}; mean TTFT |error| median {np.median(et):.1%}, "
          f"p90 {np.quantile(et, 0.9):.1%}; mean TPOT |error| median {np.median(ep):.1%}, "
          f"p90 {np.quantile(ep, 0.9):.1%} ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
