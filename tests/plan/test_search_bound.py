"""The planner's search bisects only the configurations that can reach its output
(capplan/plan/search_bound.py): the plans it gives are the full search's.

Two checks: the queue model evaluated over a subset of the search's configurations gives each
the values it has when all are evaluated together (every bound in models/queueing/ is the
row's own), and `_plan_pool` with the bounded search gives the recommendations, replicas,
binding constraints, SLO rates and warnings of `_plan_pool` with the full search
(search.analytic_search), over traffic cases with one and with many replicas, near the latency
floor, and for each objective."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np
import pytest

from capplan.catalog.loader import load_catalog
from capplan.plan import planner
from capplan.plan.planner import _best_pool, _groups, _plan_pool, search_space, traffic_for
from capplan.plan.schema import PlanFile
from capplan.plan.search import _queue_model, analytic_search
from capplan.plan.search_bound import _subset

GPUS = ["h100-sxm", "a100-sxm-80gb", "l40s", "h200", "rtx-4090"]
CHAT = {"rate_per_s": 30, "input_len": "512", "output_len": "256",
        "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.06}}
RAG = {"rate_per_s": 4, "input_len": "lognormal:mean=2000,p99=8000",
       "output_len": "lognormal:mean=300,p99=1200", "slo": {"ttft_p99_s": 2.0,
                                                             "e2e_p99_s": 30.0}}
CASES = {
    "chat-8b": ("llama-3.1-8b", CHAT, {}),
    "chat-8b-300": ("llama-3.1-8b", {**CHAT, "rate_per_s": 300}, {}),
    "chat-8b-min-gpus": ("llama-3.1-8b", {**CHAT, "rate_per_s": 100}, {"objective": "min_gpus"}),
    "tight-8b": ("llama-3.1-8b", {**CHAT, "slo": {"ttft_p99_s": 0.12, "tbt_p99_s": 0.02}}, {}),
    "tight-8b-floor": ("llama-3.1-8b", {**CHAT, "slo": {"ttft_p99_s": 0.12,
                                                         "tbt_p99_s": 0.02}},
                       {"allow_near_floor": True}),
    "rag-70b": ("llama-3.1-70b", RAG, {}),
}


def _plan(model: str, lane: dict[str, Any], extra: dict[str, Any]) -> PlanFile:
    return PlanFile.model_validate({"model": model, "candidates": {"gpus": GPUS},
                                    "workloads": [{"name": "x", **lane}], **extra})


def _row(r: Any) -> tuple[Any, ...]:
    return (r.candidate.gpu.key, r.candidate.settings.tp, r.candidate.settings.max_num_seqs,
            r.candidate.settings.max_num_batched_tokens, r.replicas,
            r.candidate.binding_constraint, r.candidate.max_rate_per_s,
            r.candidate.capacity_per_s)


def _rows(result: Any) -> list[tuple[Any, ...]]:
    return [_row(r) for r in result.recommendations]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bounded_search_plans_as_the_full_search(case, monkeypatch):
    model, lane, extra = CASES[case]
    cat = load_catalog()
    plan = _plan(model, lane, extra)
    resolved = cat.resolve_model(plan.model)
    got = _plan_pool(cat, plan, resolved, list(plan.workloads), None)
    best = _best_pool(cat, plan, resolved, list(plan.workloads), None).best
    monkeypatch.setattr(planner, "planner_search",
                        lambda groups, t, headroom, objective, best_only, submit: analytic_search(
                            groups, t, headroom))
    ref = _plan_pool(cat, plan, resolved, list(plan.workloads), None)
    assert _rows(got) == _rows(ref)
    # a caller reading only the best (alternatives, per-lane pools) gets the full search's
    assert _row(best) == _row(ref.best)
    assert got.warnings == ref.warnings
    assert got.configurations_searched == ref.configurations_searched
    for a, b in zip(got.recommendations, ref.recommendations, strict=True):
        for m in ("ttft_s", "tbt_s", "e2e_s"):
            for q in ("mean", "p50", "p90", "p99"):
                x, y = getattr(getattr(a.predicted, m), q), getattr(getattr(b.predicted, m), q)
                assert math.isclose(x, y, rel_tol=1e-5), (m, q, x, y)


@cache
def _model(case: str) -> Any:
    model, lane, extra = CASES[case]
    cat = load_catalog()
    plan = _plan(model, lane, extra)
    resolved = cat.resolve_model(plan.model)
    t = traffic_for(list(plan.workloads), resolved.spec.context_len(plan.engine.max_model_len))
    space = search_space(cat, plan, resolved.spec, t, resolved.implied_weight_dtype)
    return _queue_model(_groups(cat, resolved.spec, space), t), t


@pytest.mark.parametrize("case", ["chat-8b", "rag-70b"])
def test_a_configuration_evaluated_apart_keeps_its_values(case):
    (qm, _, kv), t = _model(case)
    need = {tgt.metric for tgt in t.slos}
    with np.errstate(all="ignore"):
        cap = qm.capacity_rate()
        rows = np.nonzero(kv > 0)
        keep = tuple(r[::7] for r in rows)  # every seventh: other neighbours, other extremes
        sub = _subset(qm, keep)
        for u in (0.3, 0.9, 0.99):
            full = qm.at_rate(u * cap, need)
            part = sub.at_rate((u * cap)[keep][:, None], need)
            assert np.array_equal(np.asarray(full["stable"])[keep],
                                  np.asarray(part["stable"])[:, 0])
            # the fixed point and everything from it is the row's own, exactly
            np.testing.assert_array_equal(np.asarray(full["step_s"])[keep],
                                          np.asarray(part["step_s"])[:, 0])
            for m in need:
                a = np.asarray(full[m]["p99"])[keep]
                b = np.asarray(part[m]["p99"])[:, 0]
                # the grid laws' float32 cdfs round apart by an ulp: ~1e-6 of a p99
                np.testing.assert_allclose(b, a, rtol=1e-5)


@pytest.mark.parametrize("case", ["chat-8b", "rag-70b"])
def test_capacity_bisection_continued_over_some_rows(case):
    """The capacity's bisection, cut after a few halvings over every configuration and
    continued over some of them, gives those the capacity_rate of all at once, exactly."""
    (qm, _, kv), _ = _model(case)
    with np.errstate(all="ignore"):
        cap = qm.capacity_rate()
        lo, hi = qm.capacity_bracket(5)
        keep = tuple(r[::3] for r in np.nonzero(kv > 0))
        got = _subset(qm, keep).capacity_bracket(8, (lo[keep][:, None], hi[keep][:, None]))[0]
    np.testing.assert_array_equal(got[:, 0], cap[keep])
