"""The fp8 alternative searches only the groups whose best could be shown beside the plan
(alternatives._could_show): what a plan shows is what the search over every fp8 group shows."""

from __future__ import annotations

from functools import cache

import pytest

from capplan.catalog.loader import load_catalog
from capplan.plan import planner
from capplan.plan.alternatives import fp8_alternative, shown
from capplan.plan.schema import PlanFile

CASES = {
    # 70B over TP 2-8 on H100: fp8 halves the fleet (shown)
    "70b": ("llama-3.1-70b", 20, 1000, 300, {"ttft_p99_s": 1.0, "tbt_p99_s": 0.06},
            {"gpus": ["h100-sxm"], "tp": [2, 4, 8]}),
    # 8B over the catalog: one GPU already, fp8 cannot be cheaper (not shown)
    "8b": ("llama-3.1-8b", 30, 512, 256, {"ttft_p99_s": 1.0, "tbt_p99_s": 0.06}, {}),
    # 8B at a rate that needs several GPUs: fp8 may be cheaper on another type
    "8b-many": ("llama-3.1-8b", 200, 512, 256, {"ttft_p99_s": 1.0, "tbt_p99_s": 0.06},
                {"gpus": ["h100-sxm", "h200", "l40s", "a100-sxm-80gb"]}),
}


@cache
def _case(name: str, objective: str) -> tuple:
    model, rate, inp, out, slo, cands = CASES[name]
    cat = load_catalog()
    plan = PlanFile.model_validate({
        "model": model, "objective": objective, "verify": {"top": 0},
        "candidates": {"weight_dtypes": ["bf16"], **cands},
        "engine": {"max_num_seqs": [128, 512], "max_num_batched_tokens": [2048, 8192]},
        "workloads": [{"name": "x", "rate_per_s": rate, "input_len": str(inp),
                       "output_len": str(out), "slo": slo}]})
    resolved = cat.resolve_model(plan.model)
    lanes = list(plan.workloads)
    base = planner._plan_pool(cat, plan, resolved, lanes, None)
    return cat, plan, resolved, lanes, base


@pytest.mark.parametrize("objective", ["min_cost", "min_gpus"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_fp8_alternative_bounded_shows_what_the_full_search_shows(name, objective) -> None:
    cat, plan, resolved, lanes, base = _case(name, objective)
    searched: dict[str, int] = {}

    def pool(keep_all: bool):  # noqa: ANN202
        def plan_pool(cat, plan, resolved, lanes, verify, keep=None):  # noqa: ANN001, ANN202
            kept = [0]

            def counting(gpu, s):  # noqa: ANN001, ANN202
                ok = keep_all or keep is None or keep(gpu, s)
                kept[0] += ok
                return ok
            try:
                return planner._best_pool(cat, plan, resolved, lanes, verify, counting)
            finally:
                searched["all" if keep_all else "bounded"] = kept[0]
        return plan_pool

    full = fp8_alternative(pool(True), cat, plan, resolved, lanes, base.recommendations)
    bounded = fp8_alternative(pool(False), cat, plan, resolved, lanes, base.recommendations)
    assert shown(bounded, base.best) == shown(full, base.best)
    if shown(full, base.best):
        assert bounded == full
    assert searched["bounded"] <= searched["all"]


def test_fp8_alternative_bound_drops_groups() -> None:
    """The 8B plan needs one GPU: no fp8 group can be cheaper, none is searched."""
    cat, plan, resolved, lanes, base = _case("8b", "min_cost")
    assert base.best.gpus_total == 1
    seen: list[int] = []

    def plan_pool(cat, plan, resolved, lanes, verify, keep=None):  # noqa: ANN001, ANN202
        def counting(gpu, s):  # noqa: ANN001, ANN202
            seen.append(keep(gpu, s))
            return seen[-1]
        return planner._best_pool(cat, plan, resolved, lanes, verify, counting)

    assert fp8_alternative(plan_pool, cat, plan, resolved, lanes, base.recommendations) is None
    assert seen and not any(seen)
