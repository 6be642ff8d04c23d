"""Speed of the step-time model: 10^6 (configuration, batch, context) points in one call.

Run: .venv/bin/python benchmarks/bench_perf.py   (target: under 1 s; result in README.md)
"""

from __future__ import annotations

import time

import numpy as np

from capplan.catalog.loader import load_catalog
from capplan.models.engine import EngineSettings
from capplan.models.perf import build_step_model
from capplan.plan.search import stack_step_models


def main() -> None:
    cat = load_catalog()
    models = ["llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "mixtral-8x7b", "gemma-2-9b"]
    gpus = ["a100-sxm-80gb", "h100-sxm", "h200", "l40s", "b200"]
    steps = []
    for m in models:
        for g in gpus:
            for tp in (1, 2, 4, 8):
                try:
                    steps.append(build_step_model(cat.model(m), cat.gpu(g), EngineSettings(tp=tp)))
                except Exception:  # noqa: BLE001 - TP not valid for this model
                    continue
    sm = stack_step_models(steps)  # constants shaped (n_cfg, 1)
    n_cfg = len(steps)
    n_side = int(np.ceil(np.sqrt(1e6 / n_cfg)))
    batch = np.linspace(1, 1024, n_side).round()
    ctx = np.geomspace(128, 131072, n_side)
    b = np.repeat(batch, ctx.size)[None, :]
    c = np.tile(ctx, batch.size)[None, :]
    points = n_cfg * b.size
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        r = sm.decode_step(b, c)
        best = min(best, time.perf_counter() - t0)
    assert r["step_s"].shape == (n_cfg, b.size)
    print(f"step-time grid: {points:,} points ({n_cfg} configurations x {b.size} batch/context) "
          f"in {best:.3f} s ({points / best / 1e6:.1f} M points/s)")
    t0 = time.perf_counter()
    sm.decode_step(b, c, detail=False)
    print(f"same, step time only (no bound labels): {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    main()
