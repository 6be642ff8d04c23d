"""Speed of the planner: an analytic search over thousands of configurations plus simulator
verification of the best five, with the time of each stage.

Run: .venv/bin/python benchmarks/bench_search.py [--repeats N]
Target (issue 17): `capplan recommend` for one lane over the whole catalog, top 5 verified,
under 1 s wall, start-up included (benchmarks/bench_speed.py measures that command; this
script splits the in-process part). Figures and the machine: docs/performance.md.
"""

from __future__ import annotations

import sys
import time

from capplan.catalog.loader import Catalog, load_catalog
from capplan.plan.planner import _groups, run_plan, search_space, traffic_for
from capplan.plan.schema import PlanFile
from capplan.plan.search import analytic_search
from capplan.plan.search_bound import planner_search
from capplan.plan.verify import simulate_recommendation

PLAN = {
    "model": "llama-3.1-8b",
    "candidates": {"tp": [1, 2, 4, 8], "weight_dtypes": ["auto", "fp8"], "kv_dtypes": ["auto"]},
    "engine": {"max_model_len": 8192},
    "workloads": [{"name": "chat", "rate_per_s": 20, "input_len": "lognormal:mean=800,p99=4000",
                   "output_len": "lognormal:mean=250,p99=1000",
                   "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.06}}],
    "verify": {"top": 5, "requests": 600},
}


def _stages(cat: Catalog, plan: PlanFile) -> dict[str, float]:
    """Wall and CPU seconds of candidate memory, the full analytic search (every configuration
    bisected), the planner's search (search_bound.planner_search) and the whole plan."""
    resolved = cat.resolve_model(plan.model)
    model = resolved.spec
    t = traffic_for(list(plan.workloads), model.context_len(plan.engine.max_model_len))
    space = search_space(cat, plan, model, t, resolved.implied_weight_dtype)
    out: dict[str, float] = {}
    w0, c0 = time.perf_counter(), time.process_time()
    groups = _groups(cat, model, space)
    w1, c1 = time.perf_counter(), time.process_time()
    found = analytic_search(groups, t, plan.headroom)
    w2, c2 = time.perf_counter(), time.process_time()
    bounded = planner_search(groups, t, plan.headroom, plan.objective)
    wb, cb = time.perf_counter(), time.process_time()
    res = run_plan(cat, plan, simulate_recommendation).to_dict()
    w3, c3 = time.perf_counter(), time.process_time()
    out.update(memory=w1 - w0, memory_cpu=c1 - c0, search=w2 - w1, search_cpu=c2 - c1,
               bounded=wb - w2, bounded_cpu=cb - c2, bisected=len(bounded.candidates),
               plan=w3 - wb, plan_cpu=c3 - cb, configurations=len(found.candidates),
               verified=sum(1 for r in res["recommendations"] if r.get("verified")))
    return out


def main() -> None:
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 3
    cat = load_catalog()
    plan = PlanFile.model_validate(PLAN)
    run_plan(cat, plan.model_copy(update={"verify": plan.verify.model_copy(update={"top": 0})}),
             None)  # warm-up (imports, catalog)
    runs = sorted((_stages(cat, plan) for _ in range(repeats)), key=lambda r: r["plan"])
    r = runs[len(runs) // 2]
    print(f"{r['configurations']:,} configurations, {r['verified']} verified by simulation "
          f"(median of {repeats} by the whole plan's wall time):")
    print(f"  candidate memory  {r['memory']:.2f} s wall ({r['memory_cpu']:.2f} s CPU)")
    print(f"  analytic search   {r['search']:.2f} s wall ({r['search_cpu']:.2f} s CPU), every "
          "configuration bisected")
    print(f"  planner's search  {r['bounded']:.2f} s wall ({r['bounded_cpu']:.2f} s CPU), "
          f"{r['bisected']:,} configurations bisected")
    print(f"  whole plan        {r['plan']:.2f} s wall ({r['plan_cpu']:.2f} s CPU in this "
          "process; verification workers not counted)")


if __name__ == "__main__":
    main()
