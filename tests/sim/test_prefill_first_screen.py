"""The screen's TBT tail under SGLang's prefill-first scheduler (issue 24, point 3).

A decoder's gap is a decode step plus the prefill-only steps of every prompt admitted before
the next decode step: the busy period of the prefill server (capplan.models.queueing.busy). The
replay (compiled engine, fixed seed) is the independent figure the screen is held to, within
the 15% the analytic answer promises (capplan.plan.replay.TOLERANCE).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from capplan.api import deployment
from capplan.models.queueing.busy import busy_period_quantiles
from capplan.plan.load import analytic_latency, load_spec_from_options
from capplan.plan.replay import TOLERANCE
from capplan.plan.simulation import run_simulation

REPLAY_REQUESTS = 20_000
"""The replay's p99 gap is the independent figure: over 2,000 requests it rests on a few dozen
gaps and moves by 15% between seeds where it sits on a step of the law (DeepSeek-V3 here: 0.154-
0.187 s over 8 seeds); over 20,000 it is 0.185 s for every seed."""
CELLS = [
    # (model, tp, rate req/s, prompt tokens): DeepSeek-V3 at 5 req/s is the example
    # (the old law's p99 was 38% under the replay), Llama-3.1-70B at 57% of its capacity
    ("deepseek-v3", 8, 5.0, "2000"),
    ("llama-3.1-70b", 4, 5.0, "1000"),
]


@pytest.mark.parametrize(("model", "tp", "rate", "inp"), CELLS)
def test_prefill_first_tbt_p99_within_tolerance_of_the_replay(model, tp, rate, inp):
    dep = deployment(model, "h200", tp=tp, engine="sglang")
    assert dep.profile.scheduler.prefill_first
    spec = load_spec_from_options(rate, None, None, inp, "500", 1.0,
                                  dep.model.context_len(dep.settings.max_model_len))
    screen = analytic_latency(dep, spec)["tbt_s"]["p99"]
    replay = run_simulation(dep, rate=rate, concurrency=None, trace=None, input_len=inp,
                            output_len="500", burstiness=1.0, requests=REPLAY_REQUESTS, seed=0,
                            schedulers=("continuous",), sim_engine="compiled")
    measured = replay["results"]["continuous"]["tbt_s"]["p99"]
    # the p99 gap holds several prefill steps: well above one decode and one prefill step
    assert measured > 0.15
    assert screen == pytest.approx(measured, rel=TOLERANCE), (screen, measured)


def test_busy_period_of_equal_prompts_is_borel():
    """x = S (the busy period one prompt's work opens), every prompt S: the prompts served are
    Borel(rho), P(N = n) = e^(-rho n) (rho n)^(n-1) / n! (Takacs 1962; hand-summed here), and
    B = n S. The quantiles are the atoms where that cdf reaches each level."""
    s, rho = 0.05, 0.6
    lam = rho / s
    n = np.arange(1, 200)
    pmf = np.exp(-rho * n + (n - 1) * np.log(rho * n) - np.array([math.lgamma(k + 1) for k in n]))
    cdf = np.cumsum(pmf)
    levels = (0.5, 0.9, 0.99)
    hand = [n[np.searchsorted(cdf, q)] * s for q in levels]
    got = busy_period_quantiles(np.asarray([s]), np.asarray([lam]), np.asarray([[s]]),
                                np.ones(1), levels)
    np.testing.assert_allclose([float(g[0]) for g in got], hand, rtol=1e-9)


def test_busy_period_lattice_agrees_with_the_atoms():
    """Two prompt lengths a hair apart take the lattice's path: the quantiles it reads must lie
    within one lattice step of the exact atoms of one length (h is under 1/50 of the span)."""
    x, s, lam = np.asarray([0.03]), 0.045, 9.0
    levels = (0.5, 0.9, 0.99)
    exact = busy_period_quantiles(x, np.asarray([lam]), np.asarray([[s]]), np.ones(1), levels)
    near = busy_period_quantiles(x, np.asarray([lam]), np.asarray([[s, s * (1 + 1e-9)]]),
                                 np.asarray([0.5, 0.5]), levels)
    for e, a in zip(exact, near, strict=True):
        assert float(a[0]) == pytest.approx(float(e[0]), abs=0.25 * s), (e, a)


def test_lagged_busy_period_of_equal_prompts_by_hand():
    """Formed a step ahead, the gap is x when no prompt is carried in (chance 1 - p), else B(x)
    plus the carried prompt's S (one prompt here): with x = S, B = n S with n Borel(rho), so
    the gap is (n + 1) S with chance p P(n), S with 1 - p."""
    from capplan.models.queueing.busy import lagged_busy_period_quantiles

    s, rho, p = 0.05, 0.6, 0.3
    lam = rho / s
    n = np.arange(1, 200)
    pmf = np.exp(-rho * n + (n - 1) * np.log(rho * n) - np.array([math.lgamma(k + 1) for k in n]))
    atoms = np.concatenate([[s], (n + 1) * s])
    cdf = np.cumsum(np.concatenate([[1 - p], p * pmf]))
    levels = (0.5, 0.9, 0.99)
    hand = [atoms[np.searchsorted(cdf, q)] for q in levels]
    got = lagged_busy_period_quantiles(np.asarray([s]), np.asarray([lam]), np.asarray([[s]]),
                                       np.ones(1), np.asarray([[1 - p, p]]), levels)
    np.testing.assert_allclose([float(g[0]) for g in got], hand, rtol=1e-9)
    # two lengths a hair apart (the lattice, its step h under s / 3 here: the span adds the
    # carried work) read the same within two lattice steps (linear binning and the ramp)
    near = lagged_busy_period_quantiles(np.asarray([s]), np.asarray([lam]),
                                        np.asarray([[s, s * (1 + 1e-9)]]), np.asarray([0.5, 0.5]),
                                        np.asarray([[1 - p, p]]), levels)
    for e, a in zip(hand, near, strict=True):
        assert float(a[0]) == pytest.approx(e, abs=0.6 * s), (e, a)
