"""The planner's search shares its work without changing its answers (docs/performance.md,
"Where the time of `recommend` goes"):

- `tree_bisect` evaluates several levels of each row's bisection at once and walks down them:
  the probes, and so the brackets, are the one-at-a-time bisection's to the last bit;
- `_exact` hands a worker process the last part of the configurations it finishes (each row's
  figures are its own): the search's candidates are the serial search's, and a part the worker
  has not started is finished in this process instead;
- `EngineSettings.with_` is `dataclasses.replace`;
- a fixed-length lane's length sample draws nothing, so the planner does not import
  numpy.random (~12 ms of start-up)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.catalog.loader import load_catalog
from capplan.models.queueing.steady import tree_bisect
from capplan.plan.planner import _groups, search_space, traffic_for
from capplan.plan.schema import PlanFile
from capplan.plan.search import _queue_model
from capplan.plan.search_bound import SPLIT_MIN_ROWS, WORKER_SHARE, planner_search


def _sequential(ok_at, lo, hi, steps):  # noqa: ANN001, ANN202
    """The plain bisection tree_bisect stands for."""
    lo, hi = np.array(lo, float), np.array(hi, float)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        ok = ok_at(mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return lo, hi


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 2000), steps=st.integers(0, 16), seed=st.integers(0, 2**32 - 1))
def test_tree_bisection_takes_the_bisections_probes(rows, steps, seed):
    """A monotone test per row (ok below a threshold, some thresholds outside the bracket):
    every row's bracket is the sequential bisection's, bit for bit, and each call saw rows
    x (2^d - 1) probes for its d levels."""
    rng = np.random.default_rng(seed)
    lo = rng.uniform(-5, 5, rows)
    hi = lo + rng.uniform(1e-6, 100, rows)
    thr = rng.uniform(lo - 10, hi + 10)
    calls = []

    def ok_at(x: np.ndarray) -> np.ndarray:
        calls.append(x.shape)
        return x <= thr

    got = tree_bisect(ok_at, lo, hi, steps)
    ref = _sequential(lambda x: x <= thr, lo, hi, steps)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    levels = [int(np.log2(s[0] + 1)) for s in calls]
    assert sum(levels) == steps and all(s[1:] == (rows,) for s in calls)


@cache
def _search(rate: float = 30.0):  # noqa: ANN202
    """The whole catalog's configurations for a chat lane (~400 finished exactly)."""
    cat = load_catalog()
    plan = PlanFile.model_validate({
        "model": "llama-3.1-8b", "workloads": [{"name": "x", "rate_per_s": rate, "input_len": "512",
                       "output_len": "256", "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.06}}]})
    resolved = cat.resolve_model(plan.model)
    t = traffic_for(list(plan.workloads), resolved.spec.context_len(plan.engine.max_model_len))
    space = search_space(cat, plan, resolved.spec, t, resolved.implied_weight_dtype)
    return _groups(cat, resolved.spec, space), t


def test_the_models_capacity_by_tree_is_the_sequential_bisections():
    """The queue model's own stability test, over a search's configurations and over one:
    capacity_bracket (tree_bisect: 1 level per call over thousands of rows, 4 over one) gives
    the sequential bisection's brackets exactly."""
    groups, t = _search()
    qm = _queue_model(groups, t)[0]
    with np.errstate(all="ignore"):
        for model in (qm, _one(qm)):
            got = model.capacity_bracket(9)
            zero = np.zeros(np.shape(model.cap))
            hi0 = model.capacity_bracket(0)[1]
            ref = _sequential(model.stable, zero, hi0, 9)
            np.testing.assert_array_equal(got[0], ref[0])
            np.testing.assert_array_equal(got[1], ref[1])


def _one(qm):  # noqa: ANN001, ANN202
    from capplan.plan.search_bound import _subset

    return _subset(qm, (np.array([0]), np.array([3])))


def _figures(found):  # noqa: ANN001, ANN202
    return [(c.index, c.max_rate_per_s, c.capacity_per_s, c.binding_constraint, c.replicas,
             c.ttft_p99_s) for c in found.candidates]


def test_a_worker_finishing_part_of_the_search_gives_the_serial_answer():
    """A real worker process (forked, as ParallelVerifier's) finishes its share of the
    configurations: every candidate's SLO rate, capacity, binding constraint, replicas and p99
    TTFT are the serial search's, and so are the predictions at the planned rate."""
    groups, t = _search()
    serial = planner_search(groups, t)
    handed = []
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        def submit(fn, *args):  # noqa: ANN001, ANN202
            handed.append(args[0].cap.size)
            return pool.submit(fn, *args)

        split = planner_search(groups, t, submit=submit)
    assert handed and handed[0] >= SPLIT_MIN_ROWS * WORKER_SHARE, "no share handed over"
    assert _figures(split) == _figures(serial)
    for m in ("ttft_s", "tbt_s"):
        np.testing.assert_array_equal(split.at_plan[m]["p99"], serial.at_plan[m]["p99"])


def test_no_share_goes_to_a_worker_still_loading_the_compiled_engine():
    """ParallelVerifier.submit hands work only to an idle worker: while its workers load the
    compiled engine (the plan-shaped warm-up), it gives None and the search finishes every
    configuration itself (the serial answer, without waiting for the loading); once they are
    warm, a worker takes its share."""
    from capplan.plan.verify import ParallelVerifier, numba_installed

    if not numba_installed():
        pytest.skip("no worker without numba")
    groups, t = _search()
    serial = planner_search(groups, t)
    from tests.plan.test_jobs import _small_job

    with ParallelVerifier(2, spare_core=True) as v:
        v.prepare(_small_job())
        assert v.submit(int) is None  # loading: not idle
        got = planner_search(groups, t, submit=v.submit)
        for f in v._warming:
            f.result()
        handed = v.submit(int)
        assert handed is not None and handed.result() == 0
    assert _figures(got) == _figures(serial)


def test_settings_with_is_replace():
    groups, _ = _search()
    s = groups[0].settings
    got = s.with_(max_num_seqs=17, max_num_batched_tokens=4096)
    assert got == dataclasses.replace(s, max_num_seqs=17, max_num_batched_tokens=4096)
    assert type(got) is type(s) and s.max_num_seqs != 17  # the original unchanged
    with pytest.raises(TypeError, match="no field 'max_num_seq'"):
        s.with_(max_num_seq=17)


def test_fixed_lengths_import_no_random_generator():
    code = ("import sys; from capplan.plan.lengths import pooled_stats; "
            "s = pooled_stats([(1.0, '512', '256')], 4096); "
            "assert 'numpy.random' not in sys.modules, 'imported'; "
            "pooled_stats([(1.0, 'lognormal:mean=500,p99=2000', '256')], 4096); "
            "assert 'numpy.random' in sys.modules; print(s[0].mean)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "512.0"
