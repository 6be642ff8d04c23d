"""The scheduler loop (capplan/sim/compiled.py) beyond the equality grid of test_jit_equality:
with numba's JIT off in another process (NUMBA_DISABLE_JIT=1) it gives the compiled results,
capplan works without numba, and the recurrent-state blocks of hybrid models are held per
running sequence."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_jit_equality import (  # tests/sim is on sys.path (pytest's rootdir imports)
    BLOCK_SIZE,
    POLICIES,
    SEQS,
    TOKENS,
    _requests,
    _same,
    windowed,
)

from capplan.sim import ContinuousEngine, Requests, compiled_available

HERE = os.path.dirname(os.path.abspath(__file__))
PRIO = np.array([1, 0])

needs_numba = pytest.mark.skipif(not compiled_available(), reason="numba (the fast extra)")


def _keeping(eng):
    eng.keep_steps = True  # per-step arrays as well as their aggregate
    return eng


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=300)


@needs_numba
def test_jit_disabled_process_gives_the_compiled_results(llama_h100, tmp_path):
    # The same functions run as plain Python (NUMBA_DISABLE_JIT=1, another process): the
    # compiled results on small overloaded runs of each policy, one with a sliding window.
    code = f"""
        import numpy as np
        from capplan.catalog.loader import load_catalog
        from capplan.models.engine import EngineSettings
        from capplan.plan.deployment import resolve_deployment
        from capplan.sim import compiled
        from capplan.sim.engine import CompiledEngine
        from test_jit_equality import BLOCK_SIZE, POLICIES, SEQS, TOKENS, _requests, windowed
        assert not isinstance(compiled.simulate_loop, compiled.numba.core.dispatcher
                              .Dispatcher)  # the JIT is off: a plain function
        dep = resolve_deployment(load_catalog(()), "llama-3.1-8b", "h100-sxm",
                                 EngineSettings(max_num_seqs=256, max_num_batched_tokens=8192))
        out = {{}}
        for name, policy in POLICIES.items():
            step = windowed(dep.step, 256.0) if name == "vllm" else dep.step
            r = CompiledEngine(step, 300, BLOCK_SIZE, SEQS, TOKENS, policy).run(
                _requests(7, 30.0), np.array([1, 0]))
            out[name] = np.concatenate([r.first_token_at_s, r.finished_at_s, [r.preemptions]])
        np.savez({str(tmp_path / "plain.npz")!r}, **out)
    """
    out = _python(code, NUMBA_DISABLE_JIT="1", PYTHONPATH=HERE)
    assert out.returncode == 0, out.stderr[-2000:]
    from capplan.sim.engine import CompiledEngine

    plain = np.load(tmp_path / "plain.npz")
    for name, policy in POLICIES.items():
        step = windowed(llama_h100.step, 256.0) if name == "vllm" else llama_h100.step
        r = CompiledEngine(step, 300, BLOCK_SIZE, SEQS, TOKENS, policy).run(
            _requests(7, 30.0), PRIO)
        got = np.concatenate([r.first_token_at_s, r.finished_at_s, [r.preemptions]])
        np.testing.assert_allclose(got, plain[name], rtol=0, atol=1e-9, err_msg=name)
    assert plain["vllm"][-1] > 0  # the overloaded vLLM run preempts


BLOCKER = """
    import sys

    class NoNumba:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("numba", "llvmlite"):
                raise ImportError(f"{name} blocked by the test")
            return None

    sys.meta_path.insert(0, NoNumba())
"""
SIM_ARGS = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "30",
            "--requests", "300", "--max-num-seqs", "64", "--format", "json"]


def test_without_numba_auto_runs_pure_and_compiled_exits_2():
    code = BLOCKER + f"""
    import json
    from capplan.sim import compiled_available, engine_impl
    assert not compiled_available()
    assert engine_impl("continuous", num_requests=10**6) == "python"
    from capplan.cli import main
    sys.argv = ["capplan"] + {SIM_ARGS!r} + sys.argv[1:]
    main()
    """
    auto = _python(code)
    assert auto.returncode == 0, auto.stderr[-2000:]
    assert '"engine_impl": "python"' in auto.stdout
    bad = subprocess.run([sys.executable, "-c", textwrap.dedent(code), "--sim-engine",
                          "compiled"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0, bad.stderr  # one line, no traceback
    assert "pip install numba" in bad.stderr


def _without_and_with_state(args: tuple, reqs, state_blocks: int):  # noqa: ANN001, ANN202
    """The same run on the compiled engine without and with `state_blocks` per sequence."""
    from capplan.sim.engine import CompiledEngine

    return (_keeping(CompiledEngine(*args)).run(reqs, PRIO),
            _keeping(CompiledEngine(*args, state_blocks=state_blocks)).run(reqs, PRIO))


@needs_numba
def test_state_blocks_are_held_per_running_sequence(llama_h100):
    # With blocks to spare the schedule does not depend on them, so a hybrid model's k state
    # blocks per running sequence show up exactly as k x running in the blocks in use.
    reqs = _requests(8, 30.0)
    args = (llama_h100.step, 10_000, BLOCK_SIZE, SEQS, TOKENS, POLICIES["vllm"])
    base, hybrid = _without_and_with_state(args, reqs, 3)
    np.testing.assert_array_equal(hybrid.first_token_at_s, base.first_token_at_s)
    np.testing.assert_array_equal(hybrid.finished_at_s, base.finished_at_s)
    np.testing.assert_array_equal(hybrid.step_kv_blocks,
                                  base.step_kv_blocks + 3 * base.step_running)
    ref = ContinuousEngine(*args).run(reqs, PRIO)
    _same(base, ref, sort_gaps=True)


@needs_numba
def test_state_blocks_cost_capacity(llama_h100):
    # In a tight cache the state blocks change the schedule, and every step holds them.
    reqs = _requests(9, 60.0)
    args = (llama_h100.step, 300, BLOCK_SIZE, SEQS, TOKENS, POLICIES["vllm"])
    base, hybrid = _without_and_with_state(args, reqs, 4)
    assert hybrid.preemptions > 0
    assert not np.array_equal(hybrid.finished_at_s, base.finished_at_s)
    assert (hybrid.step_kv_blocks >= 4 * hybrid.step_running).all()
    assert hybrid.step_kv_blocks.max() <= 300


@needs_numba
def test_compiled_closed_loop_one_client_waits_for_each_answer(llama_h100):
    # one client: request i + 1 reaches the engine `overhead` x e_(i+1) after request i
    # finished (e the seed's Exp(1) draws in sending order; exactly `overhead` with
    # fixed_overhead), and the engine is never busy with two at once
    from capplan.models.engine import NO_JITTER, ClientJitter
    from capplan.sim.engine import CompiledEngine

    eng = CompiledEngine(llama_h100.step, 300, BLOCK_SIZE, SEQS, TOKENS)
    reqs = _requests(3, None, concurrency=1)
    e = np.random.default_rng(NO_JITTER.seed).standard_exponential(len(reqs))
    r = eng.run(reqs, PRIO, request_overhead_s=0.01)
    np.testing.assert_allclose(r.arrival_at_s[1:], r.finished_at_s[:-1] + 0.01 * e[1:], rtol=0,
                               atol=1e-12)
    assert r.arrival_at_s[0] == 0.0 and (r.admitted_at_s == r.arrival_at_s).all()
    r = eng.run(reqs, PRIO, request_overhead_s=0.01,
                client_jitter=ClientJitter(fixed_overhead=True))
    np.testing.assert_allclose(r.arrival_at_s[1:], r.finished_at_s[:-1] + 0.01, rtol=0,
                               atol=1e-12)
    assert r.arrival_at_s[0] == 0.0 and (r.admitted_at_s == r.arrival_at_s).all()


def test_windowed_helper_is_a_step_model(llama_h100):
    w = windowed(llama_h100.step, 128.0)
    assert hasattr(w, "constants") and w.window == 128.0


@needs_numba
@pytest.mark.parametrize(("model", "settings"), [
    ("gpt-oss-20b", {}),  # MoE, sliding-window layers of 128 tokens
    ("llama-3.1-70b", {"tp": 2, "pp": 2}),  # all-reduces and pipeline stages
])
def test_catalog_models_match_reference(model, settings):
    from capplan.api import deployment
    from capplan.sim.engine import CompiledEngine

    dep = deployment(model, "h100-sxm", **settings)
    rng = np.random.default_rng(1)
    n = 200
    reqs = Requests(np.cumsum(rng.exponential(1 / 20, n)), rng.integers(100, 3000, n),
                    rng.integers(1, 600, n), np.zeros(n, np.int64))
    args = (dep.step, 2000, dep.memory.block_size, 64, 2048, dep.settings.profile.scheduler)
    ref = ContinuousEngine(*args).run(reqs)
    assert ref.preemptions > 0
    _same(_keeping(CompiledEngine(*args)).run(reqs), ref, sort_gaps=True)


@needs_numba
@pytest.mark.parametrize("policy", ["vllm", "prefill_first"])
def test_default_run_keeps_aggregates_only(llama_h100, policy):
    # The default run keeps no per-step arrays: per-request times, extra gaps and the step
    # aggregate equal the run that keeps them (and, through _same, the reference's), and the
    # CLI's summary is the same from either representation.
    from capplan.sim.engine import CompiledEngine
    from capplan.sim.metrics import summarize
    from capplan.sim.workload import Lane

    reqs = _requests(11, 40.0)
    args = (llama_h100.step, 300, BLOCK_SIZE, SEQS, TOKENS, POLICIES[policy])
    agg = CompiledEngine(*args).run(reqs, PRIO)
    full = _keeping(CompiledEngine(*args)).run(reqs, PRIO)
    ref = ContinuousEngine(*args).run(reqs, PRIO)
    _same(agg, ref, sort_gaps=True, arrays=False)
    assert agg.steps.num_steps == len(full.step_dur_s) > 1000
    lanes = (Lane("a", 1.0, ttft_slo_s=0.5), Lane("b", 1.0, tpot_slo_s=0.02))
    ref_full = dataclasses.replace(ref, steps=None)
    got, want = summarize(agg, lanes).to_dict(), summarize(ref_full, lanes).to_dict()
    assert got.keys() == want.keys()
    np.testing.assert_allclose(_numbers(got), _numbers(want), rtol=1e-9, atol=1e-12)


def _numbers(d) -> list[float]:
    """The numbers of a nested result dict, in key order."""
    if isinstance(d, dict):
        return [x for k in sorted(d) for x in _numbers(d[k])]
    if isinstance(d, list):
        return [x for v in d for x in _numbers(v)]
    return [float(d)] if isinstance(d, (int, float)) else []


@needs_numba
def test_series_of_long_runs_strides(llama_h100):
    # Beyond `series_cap` steps the loop keeps every 2nd, 4th... step: the series shows the
    # kept step nearest each evenly spaced one, exactly that step's values. Hand check with a
    # cap of 64 on ~2,900 steps: the stride doubles to 64 (2,900 / 64 < 64 samples) and each
    # shown step is within 32 steps of its target.
    from capplan.sim.engine import CompiledEngine
    from capplan.sim.metrics import series_steps

    rng = np.random.default_rng(7)  # 240 requests as _requests draws them
    n = 240
    inp, out = rng.integers(16, 700, n), rng.integers(1, 200, n)
    reqs = Requests(np.cumsum(rng.exponential(1 / 30.0, n)), inp, out, rng.integers(0, 2, n))
    args = (llama_h100.step, 300, BLOCK_SIZE, SEQS, TOKENS, POLICIES["no_evict"])
    eng = _keeping(CompiledEngine(*args))
    eng.series_cap = 64
    rec = eng.run(reqs, PRIO)
    st, n = rec.steps, len(rec.step_start_s)
    assert 2048 < n <= 4096  # so the stride is 64: 64 samples would be 64 * 64 = 4096 steps
    shown = np.searchsorted(rec.step_start_s, st.series_start_s)
    np.testing.assert_array_equal(rec.step_start_s[shown], st.series_start_s)
    assert (shown % 64 == 0).all()
    assert np.abs(shown - series_steps(n)).max() <= 32
    np.testing.assert_array_equal(st.series_running, rec.step_running[shown])
    np.testing.assert_array_equal(st.series_waiting, rec.step_waiting[shown])
    np.testing.assert_array_equal(st.series_kv_blocks, rec.step_kv_blocks[shown])


@pytest.mark.parametrize("kind", ["groups", "hash_ids"])
def test_prefix_key_ids_name_the_block_keys(kind):
    # the compiled loop's dense key ids (built with numpy) against Requests.block_keys: the
    # same number of keys per request, equal keys <-> equal ids
    from capplan.sim.compiled import prefix_cache

    rng = np.random.default_rng(0)
    n = 300
    inp = rng.integers(1, 3000, n)
    r = Requests(np.zeros(n), inp, np.ones(n, np.int64), np.zeros(n, np.int64),
                 prefix_group=rng.integers(-1, 5, n),
                 prefix_tokens=np.minimum(inp, rng.integers(0, 3000, n)))
    if kind == "hash_ids":
        r = dataclasses.replace(r, prefix_group=None, prefix_tokens=None, hash_block_tokens=512,
                                hash_ids=tuple(rng.integers(0, 40, rng.integers(0, 8))
                                               for _ in range(n)))
    koff, kid = prefix_cache(r, BLOCK_SIZE, 10)[:2]
    names: dict = {}
    for i in range(n):
        keys, ids = r.block_keys(i, BLOCK_SIZE), kid[koff[i]:koff[i + 1]].tolist()
        assert len(keys) == len(ids)
        for k, d in zip(keys, ids, strict=True):
            assert names.setdefault(k, d) == d
    assert len(names) > 50 and len(set(names.values())) == len(names)


@needs_numba
def test_loading_the_compiled_loop_leaves_scipy_linalg_unimported():
    """numba's array functions probe scipy's BLAS on import (all of scipy.linalg, ~0.3 s of
    CPU); the loop imports them with the probe's module hidden, then puts it back: scipy.linalg
    imports afterwards as usual."""
    p = _python("""
    import sys
    import capplan.sim.compiled
    import numba.np.arraymath
    assert "scipy.linalg" not in sys.modules, "scipy.linalg imported"
    assert "scipy.linalg.cython_blas" not in sys.modules
    import scipy.linalg.cython_blas
    print("ok")
    """)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "ok"
