"""A fleet replay's per-window E2E, TPOT and overload (capplan.sim.fleet_results): the day
plan's replay checks every SLO a lane gives and fails a window whose backlog grows."""

from __future__ import annotations

import numpy as np
import pytest

from capplan.sim import Requests, compiled_available
from capplan.sim.fleet import FleetReplaySpec, replay_schedule

needs_numba = pytest.mark.skipif(not compiled_available(), reason="numba (the fast extra)")


def _reqs(n: int, rate: float, seed: int = 0) -> Requests:
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rate, n))
    return Requests(arr, rng.integers(16, 600, n), rng.integers(1, 120, n),
                    np.zeros(n, np.int64))


def _p99(v: np.ndarray) -> float:
    """Inverted-CDF p99 (numpy's), as the replay's metrics take it."""
    return float(np.percentile(v, 99, method="inverted_cdf"))


@needs_numba
def test_window_e2e_and_tpot_are_its_requests_own(llama_h100):
    """Each window's E2E p99 and TPOT p99 / mean are those of its own arrivals, recomputed here
    from the engine's single-replica run (one replica: the fleet is that engine, exactly)."""
    from capplan.sim.engine import CompiledEngine

    reqs = _reqs(800, 40.0, seed=4)
    s, pool = llama_h100.settings, llama_h100.pool
    single = CompiledEngine(llama_h100.step, pool.num_blocks, pool.block_size, s.max_num_seqs,
                            s.max_num_batched_tokens, s.profile.scheduler).run(reqs)
    cut = 10.0
    res = replay_schedule(FleetReplaySpec(requests=reqs, engine_config=llama_h100,
                                          windows=[(0.0, cut, 1), (cut, 60.0, 1)],
                                          slo_e2e_s=1.0))
    arr = single.arrival_at_s
    e2e = single.finished_at_s - arr
    out = single.output_tokens.astype(float)
    tpot = (single.finished_at_s - single.first_token_at_s) / np.maximum(out - 1, 1)
    for w, m in zip(res.windows, (arr < cut, arr >= cut), strict=True):
        multi = m & (out > 1)
        assert w.e2e_p99_s == pytest.approx(_p99(e2e[m]), abs=1e-9)
        assert w.tpot_p99_s == pytest.approx(_p99(tpot[multi]), abs=1e-9)
        assert w.tpot_mean_s == pytest.approx(float(tpot[multi].mean()), rel=1e-12)
        # attainment with only an E2E SLO: the share of the window's arrivals done within 1 s
        assert w.attainment == pytest.approx(float((e2e[m] <= 1.0).mean()), abs=1e-12)


@needs_numba
@pytest.mark.parametrize(("rate", "overloaded"), [(50.0, False), (300.0, True)])
def test_a_window_whose_backlog_grows_is_overloaded(llama_h100, rate, overloaded):
    """One replica of Llama-3.1-8B on an H100 with these short requests serves about 100-150
    req/s (its replay at 100 req/s keeps TTFT p99 near 0.1 s, at 150 the backlog grows): at
    50 req/s the window is stable, at 300 req/s (2x over) its backlog grows by about half its
    arrivals, far beyond the backlog test's tolerance (capplan.sim.stability)."""
    reqs = _reqs(3000, rate)
    end = float(reqs.arrival_at_s[-1]) + 1e-6
    res = replay_schedule(FleetReplaySpec(requests=reqs, engine_config=llama_h100,
                                          windows=[(0.0, end, 1)]))
    assert res.windows[0].overloaded is overloaded
    assert res.windows[0].unfinished == 0  # every request completes: overload is not loss
