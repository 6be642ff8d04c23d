"""Speed of the planner: an analytic search over >= 5,000 configurations plus simulator
verification of the best five.

Run: .venv/bin/python benchmarks/bench_search.py   (target: under 2 s; result in README.md)
"""

from __future__ import annotations

import time

from capplan.catalog.loader import load_catalog
from capplan.plan.planner import run_plan
from capplan.plan.schema import PlanFile
from capplan.plan.verify import simulate_recommendation


def main() -> None:
    cat = load_catalog()
    plan = PlanFile.model_validate({
        "model": "llama-3.1-8b",
        "candidates": {"tp": [1, 2, 4, 8], "weight_dtypes": ["auto", "fp8"],
                       "kv_dtypes": ["auto"]},
        "engine": {"max_model_len": 8192},
        "workloads": [{"name": "chat", "rate_per_s": 20, "input_len": "lognormal:mean=800,p99=4000",
                       "output_len": "lognormal:mean=250,p99=1000",
                       "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.06}}],
        "verify": {"top": 5, "requests": 600},
    })
    run_plan(cat, plan.model_copy(update={"verify": plan.verify.model_copy(update={"top": 0})}),
             None)  # warm-up (imports, catalog)
    t0 = time.perf_counter()
    res = run_plan(cat, plan, simulate_recommendation).to_dict()
    total = time.perf_counter() - t0
    n = res["configurations_searched"]
    verified = sum(1 for r in res["recommendations"] if r.get("verified"))
    print(f"search: {n:,} configurations, {verified} verified by simulation, in {total:.2f} s")
    best = res["recommendations"][0]
    print(f"best: {best['replicas']} x {best['gpu']} TP {best['tp']} ({best['weight_dtype']}, "
          f"KV {best['kv_dtype']}), binding {best['binding_constraint']}")


if __name__ == "__main__":
    main()
