"""The queueing fixed point iterates only the rows still moving, and Erlang C skips the
incomplete gamma function where the Poisson term is 0: both give the answers of the plain
computation (every row evaluated at each iteration, each frozen once it has stopped; the
function evaluated everywhere), written out here, over a search's configurations at rates
from light load to past capacity."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from scipy import special

from capplan.catalog.loader import load_catalog
from capplan.models.queueing import QueueModel
from capplan.models.queueing import steady as st
from capplan.models.queueing.arrivals import _poisson_erlang_c
from capplan.plan.planner import _groups, search_space, traffic_for
from capplan.plan.schema import PlanFile
from capplan.plan.search import _queue_model

LANES = {
    "chat": {"rate_per_s": 30, "input_len": "512", "output_len": "256",
             "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.06}},
    "rag": {"rate_per_s": 4, "input_len": "lognormal:mean=2000,p99=8000",
            "output_len": "lognormal:mean=300,p99=1200", "slo": {"ttft_p99_s": 2.0}},
}


@cache
def _search_model(lane: str) -> QueueModel:
    cat = load_catalog()
    plan = PlanFile.model_validate({"model": "llama-3.1-8b",
                                    "candidates": {"gpus": ["h100-sxm", "l40s"]},
                                    "workloads": [{"name": "x", **LANES[lane]}]})
    resolved = cat.resolve_model(plan.model)
    model = resolved.spec
    t = traffic_for(list(plan.workloads), model.context_len(plan.engine.max_model_len))
    space = search_space(cat, plan, model, t, resolved.implied_weight_dtype)
    return _queue_model(_groups(cat, model, space), t)[0]


def _plain_fixed_point(q: QueueModel, lam: np.ndarray, every_row: bool
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Regula falsi (Anderson-Bjorck weighting, T(_TAU_MAX_S) tried first) over every row,
    each row's bracket frozen once it is within rounding or at an exact root (the rule of
    SteadyState._fixed_point, all rows evaluated at each iteration)."""
    lo = np.zeros(np.broadcast_shapes(np.shape(lam), np.shape(q.cap)))
    g_lo = q._mean_step(lam, lo)["tau"] - lo
    hi = np.full_like(lo, st._TAU_MAX_S)
    first = q._mean_step(lam, hi)["tau"]  # T(_TAU_MAX_S): the first point tried
    g_hi = first - hi
    exists = g_hi <= 0
    side = np.zeros_like(lo)
    for it in range(st._FP_ITERS_MAX):
        done = (hi - lo <= st._FP_ROUNDING_TOL * hi) | (g_hi == 0) | ~(exists | every_row)
        if np.all(done):
            break
        den = g_lo - g_hi
        x = np.where(den > 0, (lo * -g_hi + hi * g_lo) / np.where(den > 0, den, 1.0),
                     0.5 * (lo + hi))
        if it == 0:  # where a fixed point exists
            x = np.where(exists, first, x)
        x = np.clip(x, lo, hi)
        g = q._mean_step(lam, x)["tau"] - x
        pos, neg = (g > 0) & ~done, (g <= 0) & ~done
        # Anderson-Bjorck: the end kept twice scaled by 1 - g / g(the end replaced)
        m_hi, m_lo = 1 - g / np.where(g_lo != 0, g_lo, 1.0), 1 - g / np.where(g_hi != 0, g_hi, 1.0)
        g_hi = np.where(pos & (side > 0), np.where(m_hi > 0, m_hi, 0.5) * g_hi, g_hi)
        g_lo = np.where(neg & (side < 0), np.where(m_lo > 0, m_lo, 0.5) * g_lo, g_lo)
        lo, g_lo = np.where(pos, x, lo), np.where(pos, g, g_lo)
        hi, g_hi = np.where(neg, x, hi), np.where(neg, g, g_hi)
        side = np.where(pos, 1.0, np.where(neg, -1.0, side))
    return hi, exists


@pytest.mark.parametrize("lane", sorted(LANES))
@pytest.mark.parametrize("every_row", [True, False])
def test_fixed_point_iterating_only_moving_rows_matches_every_row(lane, every_row):
    q = _search_model(lane)
    cap = q.capacity_rate()
    for u in (0.05, 0.5, 0.9, 0.99, 1.2):
        lam = np.maximum(cap, 1e-3) * u
        tau, exists, at_tau = q._fixed_point(lam, every_row)
        again = q._mean_step(lam, tau)
        for k, v in again.items():  # the evaluation kept at tau is the one computed again
            np.testing.assert_allclose(at_tau[k], np.broadcast_to(v, tau.shape), rtol=1e-15)
        ref_tau, ref_exists = _plain_fixed_point(q, lam, every_row)
        assert np.array_equal(exists, ref_exists)
        rows = ref_exists | every_row
        # each row stops on its own: iterating only the moving rows changes nothing
        np.testing.assert_array_equal(tau[rows], ref_tau[rows])


@pytest.mark.parametrize("lane", sorted(LANES))
def test_erlang_c_where_the_poisson_term_underflows(lane):
    q = _search_model(lane)
    c = np.maximum(q.cap, 1.0)
    for u in (0.01, 0.3, 0.8, 0.999):
        a = c * u
        # the textbook evaluation: Erlang B from the Poisson pmf and cdf at every point
        cc = np.maximum(np.floor(c), 1.0)
        pmf = np.exp(cc * np.log(a) - a - special.gammaln(cc + 1))
        b = pmf / np.maximum(special.gammaincc(cc + 1, a), 1e-300)
        ref = np.clip(cc * b / np.maximum(cc - a * (1 - b), 1e-12), 0.0, 1.0)
        got = _poisson_erlang_c(c, a)
        # the same to rounding: the textbook c log a - a - log c! loses ~1e-12 to cancellation
        # at c ~ 1000 (capplan's pmf is in Stirling's form, special.poisson_pmf)
        np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-300)
        if u == 0.01:  # both branches: the function skipped and evaluated
            assert np.any(pmf == 0) and np.any(pmf > 0)
