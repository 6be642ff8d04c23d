"""Fleet replay speed: a day of ~1M requests over a schedule of replicas (issue 25 item 7).

The day: 96 windows of 15 min; the offered rate follows a diurnal curve (trough 3 req/s at
04:00, peak 20 req/s at 16:00, mean ~11.5 req/s: ~1M requests), Poisson within a window;
512 prompt / 256 output tokens; llama-3.1-8b on h100-sxm (vLLM defaults, ~26.7 req/s
saturated). The schedule gives each window ceil(rate / (0.7 x 26.7)) replicas, the router is
least-outstanding, a joining replica serves 120 s after its window starts. Printed: wall and
CPU time of `replay_schedule` (the compiled loop's machine code loaded first), peak RSS, steps
of all replicas, requests replayed per second, and the attainment of TTFT <= 1 s, TPOT <= 50 ms
over the day. Goal: well under 30 s on 2 cores and under 1 GiB.

With `--system-prompts K` each prompt starts with one of K shared 256-token system prompts
(prefix caching on, each replica its own cache): prints the share of prompt tokens found cached.

Run: `.venv/bin/python benchmarks/bench_fleet.py [--requests-scale F] [--router R]
[--system-prompts K]`.
"""

from __future__ import annotations

import argparse
import math
import resource
import time

import numpy as np

MODEL, GPU, INP, OUT = "llama-3.1-8b", "h100-sxm", 512, 256
CAPACITY_PER_S = 26.7
"""Completions per second of one replica saturated (benchmarks/bench_speed.py)."""
WINDOW_S = 900.0
TROUGH_PER_S, PEAK_PER_S = 3.0, 20.0
SHARED_TOKENS = 256
"""Length of a shared system prompt (`--system-prompts`): half of each prompt."""


def day_rates(scale: float = 1.0) -> np.ndarray:
    """Offered rate per 15-min window: a cosine from the trough at 04:00 to the peak at 16:00."""
    hours = (np.arange(96) + 0.5) * WINDOW_S / 3600
    mid, amp = (PEAK_PER_S + TROUGH_PER_S) / 2, (PEAK_PER_S - TROUGH_PER_S) / 2
    return scale * (mid - amp * np.cos(2 * np.pi * (hours - 4.0) / 24))


def day_requests(rates: np.ndarray, seed: int = 0, system_prompts: int = 0):  # noqa: ANN201
    """The day's requests; with `system_prompts` K, each prompt starts with one of K shared
    prompts of SHARED_TOKENS (drawn uniformly), which prefix caching finds."""
    from capplan.sim.workload import Requests

    rng = np.random.default_rng(seed)
    counts = rng.poisson(rates * WINDOW_S)
    arr = np.concatenate([np.sort(rng.uniform(i * WINDOW_S, (i + 1) * WINDOW_S, c))
                          for i, c in enumerate(counts)])
    n = len(arr)
    if not system_prompts:
        return Requests(arr, np.full(n, INP), np.full(n, OUT), np.zeros(n, np.int64))
    return Requests(arr, np.full(n, INP), np.full(n, OUT), np.zeros(n, np.int64),
                    prefix_group=rng.integers(0, system_prompts, n),
                    prefix_tokens=np.full(n, SHARED_TOKENS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests-scale", type=float, default=1.0,
                    help="Scale the day's rates (0.1: ~100k requests).")
    ap.add_argument("--router", default="least-outstanding")
    ap.add_argument("--system-prompts", type=int, default=0,
                    help="Prompts start with one of this many shared 256-token system prompts "
                         "(prefix caching on; 0: none).")
    a = ap.parse_args()

    from capplan.api import deployment
    from capplan.sim.fleet import FleetReplaySpec, replay_schedule

    dep = deployment(MODEL, GPU)
    rates = day_rates(a.requests_scale)
    reqs = day_requests(rates, system_prompts=a.system_prompts)
    reps = [max(1, math.ceil(r / (0.7 * CAPACITY_PER_S))) for r in rates]
    windows = [(i * WINDOW_S, (i + 1) * WINDOW_S, n) for i, n in enumerate(reps)]
    spec = FleetReplaySpec(requests=reqs, engine_config=dep, windows=windows, router=a.router,
                           startup_lag_s=120.0, slo_ttft_s=1.0, slo_tbt_s=0.05)
    warm = FleetReplaySpec(requests=day_requests(rates[:1] * 0.01,
                                                 system_prompts=a.system_prompts),
                           engine_config=dep,
                           windows=windows[:1], router=a.router)
    replay_schedule(warm)  # load the compiled loop's cached machine code (or compile it)
    t0, c0 = time.perf_counter(), time.process_time()
    res = replay_schedule(spec)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"fleet day: {len(reqs):,} requests, {len(windows)} windows, peak {max(reps)} "
          f"replicas, router {a.router}, lag 120 s")
    print(f"  replay {wall:.1f} s wall ({cpu:.1f} s CPU), {rss:.0f} MiB peak RSS, "
          f"{len(reqs) / wall:,.0f} requests/s; completed {res.completed:,}, unfinished "
          f"{res.unfinished}; attainment (TTFT <= 1 s, TPOT <= 50 ms) {res.attainment:.3f}; "
          f"worst window {min(w.attainment for w in res.windows):.3f}")
    if a.system_prompts:
        hit = res.record.prefix_hit_tokens / float(np.sum(reqs.input_tokens))
        print(f"  {a.system_prompts} system prompts of {SHARED_TOKENS} tokens: prompt tokens "
              f"found in a replica's prefix cache {hit:.3f}")


if __name__ == "__main__":
    main()
