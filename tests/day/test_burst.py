"""A window's burstiness in a replica's capacity (plan/burst.py)."""

from __future__ import annotations

import numpy as np
import pytest

from capplan.catalog.loader import load_catalog
from capplan.plan.burst import capacities, capacity_at, levels
from capplan.plan.planner import run_plan, served_traffic
from capplan.plan.schema import PlanFile


@pytest.fixture(scope="module")
def planned():
    plan = PlanFile.model_validate({
        "model": "llama-3.1-70b", "candidates": {"gpus": ["h100-sxm"], "tp": [4]},
        "engine": {"max_num_seqs": [128], "max_num_batched_tokens": [2048]},
        "workloads": [{"rate_per_s": 3, "input_len": "lognormal:mean=1000,p99=6000",
                       "output_len": "lognormal:mean=250,p99=1000",
                       "slo": {"ttft_p99_s": 0.6}}]})
    cat = load_catalog()
    res = run_plan(cat, plan)
    model = cat.resolve_model(plan.model).spec
    return res.best.candidate, served_traffic(plan.workloads, plan, model)  # the planner's


def test_levels_round_up():
    assert list(levels(np.array([0.1, 1.0, 1.01, 3.3, np.nan, 1e3]))) == \
        [0.25, 1.0, 1.25, 3.5, 1.0, 50.0]


def test_poisson_level_is_the_planners_capacity(planned):
    """The grid search at SCV 1 finds the capacity the planner's bisection found, within
    the grid's resolution (1/1024 of the stable capacity) and never above it."""
    cand, t = planned
    c = capacity_at(cand, t, 1.0)
    assert c <= cand.max_rate_per_s * (1 + 2 ** -12)
    assert c >= cand.max_rate_per_s - cand.capacity_per_s / 1024 * 1.01


def test_burstier_windows_carry_less(planned):
    cand, t = planned
    caps = capacities(cand, t, np.array([0.5, 1.0, 2.0, 4.0, 8.0]))
    assert cand.binding_constraint == "TTFT SLO"  # waiting, which burstiness lengthens
    assert (np.diff(caps) < 0).all(), caps
