"""Analytic queueing model (models/queueing/) against the simulator (sim/), same step model.

Run: .venv/bin/python benchmarks/validate_queueing.py [--requests N]
Prints the markdown table used in docs/queueing.md: for each configuration and load (a fraction
of the analytic stable capacity), TTFT, TBT and E2E at p50/p90/p99 and output throughput from
both, and the median relative errors for loads up to 85%. Latencies are engine-side: the
constant per-request overhead outside engine steps is left out of the analytic TTFT and E2E.
"""

from __future__ import annotations

import sys

import numpy as np

from capplan.catalog.loader import load_catalog
from capplan.models.engine import EngineSettings
from capplan.models.queueing import LengthStats, Limits, QueueModel, summarize
from capplan.plan.deployment import resolve_deployment
from capplan.sim import simulate
from capplan.sim.workload import Lane, Workload, parse_length

CONFIGS = [  # model, gpu, tp, input, output, chunk
    ("llama-3.1-8b", "h100-sxm", 1, "512", "256", 2048),
    ("llama-3.1-8b", "h100-sxm", 1, "lognormal:mean=800,p99=4000", "lognormal:mean=250,p99=1000",
     8192),
    ("llama-3.1-8b", "a100-sxm-80gb", 1, "2000", "200", 512),
    ("llama-3.1-8b", "l40s", 1, "lognormal:mean=1000,p99=4000", "300", 4096),
    ("qwen2.5-14b", "h100-sxm", 1, "lognormal:mean=6000,p99=20000", "200", 16384),
    ("llama-3.1-70b", "h100-sxm", 4, "1000", "300", 2048),
    ("qwen3-30b-a3b", "h100-sxm", 1, "lognormal:mean=1000,p99=5000", "400", 8192),
    ("mixtral-8x7b", "a100-sxm-80gb", 2, "256", "512", 1024),
]
LOADS = (0.2, 0.5, 0.7, 0.85, 0.95)
METRICS = ("ttft", "tbt", "e2e")
PCTS = ("p50", "p90", "p99")


def stats(text: str) -> LengthStats:
    d = parse_length(text)
    return LengthStats.from_samples(d.sample(np.random.default_rng(1), 20000))


def main() -> None:
    n_req = int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 3000
    cat = load_catalog()
    keys = [f"{m}_{q}" for m in METRICS for q in PCTS] + ["thr"]
    rows, errs = [], {k: [] for k in keys}
    for model, gpu, tp, inp, out, chunk in CONFIGS:
        s = EngineSettings(tp=tp, max_num_seqs=256, max_num_batched_tokens=chunk,
                           max_model_len=32768)
        dep = resolve_deployment(cat, model, gpu, s)
        qm = QueueModel(dep.step, stats(inp), stats(out),
                        Limits(256, chunk, dep.memory.kv_cache_tokens))
        cap = float(qm.capacity_rate())
        for load in LOADS:
            rate = load * cap
            a = summarize(qm.at_rate(np.asarray(rate)))
            # engine-side latency on both sides: the simulator runs engine steps only, and the
            # per-request overhead outside them (HTTP, tokenisation) is one constant that
            # capplan adds to both (plan/simulation.add_request_overhead)
            over = float(np.asarray(dep.step.request_overhead_s))
            for key in ("ttft_s", "e2e_s"):
                a[key] = {q: v - over for q, v in a[key].items()}
            lane = Lane(name="x", rate_per_s=rate, input_len=parse_length(inp),
                        output_len=parse_length(out))
            sim = simulate(dep.step, workload=Workload((lane,), num_requests=n_req), seed=3,
                           scheduler="continuous", num_gpu_blocks=dep.memory.num_gpu_blocks,
                           block_size=16, max_num_seqs=256, max_num_batched_tokens=chunk
                           ).to_dict()
            pairs = {f"{m}_{q}": (a[f"{m}_s"][q], sim[f"{m}_s"][q]) for m in METRICS
                     for q in PCTS}
            pairs["thr"] = (a["output_tokens_per_s"], sim["output_tokens_per_s"])
            e = {k: x / y - 1 if y else float("nan") for k, (x, y) in pairs.items()}
            if load <= 0.85:
                for k in errs:
                    errs[k].append(abs(e[k]))
            rows.append((model, gpu, tp, inp, out, chunk, load, pairs, e))
    print("| model | GPU | TP | input | output | chunk | load | " + " | ".join(
        f"{m.upper()} {q} a/s (ms)" for m in METRICS for q in PCTS) + " | out tok/s a/s |")
    print("|---" * (8 + len(METRICS) * len(PCTS)) + "|")
    for model, gpu, tp, inp, out, chunk, load, p, e in rows:
        def ms(k, p=p, e=e):
            return f"{p[k][0] * 1e3:.0f}/{p[k][1] * 1e3:.0f} ({e[k]:+.0%})"
        print(f"| {model} | {gpu} | {tp} | {inp} | {out} | {chunk} | {load:.0%} | "
              + " | ".join(ms(f"{m}_{q}") for m in METRICS for q in PCTS)
              + f" | {p['thr'][0]:.0f}/{p['thr'][1]:.0f} ({e['thr']:+.0%}) |")
    print(f"\nconfigurations x loads: {len(rows)}; median |error| at loads <= 85%: " + ", ".join(
        f"{k} {np.nanmedian(v):.1%}" for k, v in errs.items()))


if __name__ == "__main__":
    main()
