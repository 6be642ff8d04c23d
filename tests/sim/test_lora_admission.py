"""LoRA in the replay: each request has an adapter, and admission follows vLLM's max_loras rule
(vllm/v1/core/sched/scheduler.py `Scheduler.schedule`, the waiting loop): the running
requests' adapters are loaded; a waiting request whose adapter is loaded, or for which a slot
is free, is admitted; any other is skipped and stays waiting while later ones are considered.

Hand calculations on a stand-in step model of 10 ms a step, invariants over random workloads
read off the run's own records (which requests ran in which step), and the run with slots for
every adapter against the run without the rule.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import capplan
from capplan.models.lora import adapter_groups, draw_adapters
from capplan.sim import ContinuousEngine, Requests, compiled_available
from tests.sim.conftest import ConstStep, LinearStep, step_by_step

needs_numba = pytest.mark.skipif(not compiled_available(), reason="numba (the fast extra)")
BIG = 1 << 20
"""Token budget, KV blocks: never binding in the hand calculations."""


class LoraStep:
    """A stand-in step model with `max_loras` adapter slots (its step time its inner model's)."""

    window = 2.0**62

    def __init__(self, inner, max_loras: int) -> None:  # noqa: ANN001
        self.inner, self.lora_max_loras = inner, float(max_loras)

    def step(self, **kw):  # noqa: ANN003, ANN201
        return self.inner.step(**kw)


def _run(step, reqs: Requests, seqs: int = 64, blocks: int = BIG, jit: bool = False):  # noqa: ANN001, ANN202
    eng = ContinuousEngine(step, blocks, 16, seqs, BIG)
    eng.jit = jit
    return eng.run(reqs)


def _burst(adapters: list[int], outputs: list[int], prompt: int = 10) -> Requests:
    """Requests all waiting at t = 0, in this order (arrival ties keep the index order)."""
    n = len(adapters)
    return Requests(np.zeros(n), np.full(n, prompt), np.asarray(outputs), np.zeros(n, np.int64),
                    adapter=np.asarray(adapters))


# Each step takes 10 ms; a 10-token prompt is computed in the step that admits it, which gives
# the first token at its end; each further token is one decode step. A request admitted at step
# k with O output tokens: first token at 10 (k + 1) ms, finished at 10 (k + O) ms.
#
# max_loras 1, adapters [0, 1, 0, 1], 3 tokens each: step 0 admits r0 (adapter 0 loads), skips
# r1 (adapter 1, no slot), admits r2 (adapter 0 is loaded), skips r3. r0 and r2 finish at the
# end of step 2 (30 ms); adapter 0 unloads; step 3 admits r1 and r3: first tokens at 40 ms,
# finished at 60 ms.
#
# max_loras 2, adapters [0, 1, 2, 0, 1]: step 0 admits r0 and r1 (two slots), skips r2, admits
# r3 and r4 behind it (no head-of-line blocking); they finish at 30 ms and r2 runs in steps 3-5.
#
# max_loras 1, adapters [0, 1, 0], outputs [2, 2, 5]: r0 and r2 start at step 0; r0 ends at
# 20 ms but r2 holds adapter 0 until it ends at step 4 (50 ms); r1 then runs steps 5-6: first
# token 60 ms, finished 70 ms.
HAND = [
    (1, [0, 1, 0, 1], [3, 3, 3, 3], [10, 40, 10, 40], [30, 60, 30, 60]),
    (2, [0, 1, 2, 0, 1], [3] * 5, [10, 10, 40, 10, 10], [30, 30, 60, 30, 30]),
    (1, [0, 1, 0], [2, 2, 5], [10, 60, 10], [20, 70, 50]),
]


@pytest.mark.parametrize(("slots", "adapters", "outputs", "first_ms", "finish_ms"), HAND)
@pytest.mark.parametrize("stretches", [True, False], ids=["stretches", "step-by-step"])
def test_which_requests_run_together_by_hand(slots, adapters, outputs, first_ms, finish_ms,
                                             stretches):
    reqs = _burst(adapters, outputs)
    if stretches:
        rec = _run(LoraStep(ConstStep(0.01), slots), reqs)
    else:
        with step_by_step():
            rec = _run(LoraStep(ConstStep(0.01), slots), reqs)
    np.testing.assert_allclose(rec.first_token_at_s * 1e3, first_ms, atol=1e-9)
    np.testing.assert_allclose(rec.finished_at_s * 1e3, finish_ms, atol=1e-9)
    # with a slot for every adapter everything starts at once: 10 ms, then 10 ms per token
    free = _run(LoraStep(ConstStep(0.01), max(adapters) + 1), reqs)
    np.testing.assert_allclose(free.first_token_at_s * 1e3, 10.0, atol=1e-9)
    np.testing.assert_allclose(free.finished_at_s * 1e3, 10.0 * np.asarray(outputs), atol=1e-9)


def test_requests_without_an_adapter_always_run():
    # adapter -1 is the base model: it takes no slot and is never skipped (vLLM counts only
    # requests with a LoRA request); r1 (adapter 1) waits for adapter 0's r0 to finish
    rec = _run(LoraStep(ConstStep(0.01), 1), _burst([0, 1, -1], [3, 3, 3]))
    np.testing.assert_allclose(rec.first_token_at_s * 1e3, [10, 40, 10], atol=1e-9)


def _running_sets(rec, adapters: np.ndarray):  # noqa: ANN001, ANN202
    """Per step start t: the adapters of the requests running in that step (admitted at or
    before t, finished after it) and the requests waiting (arrived, not yet admitted), read off
    the run's per-request times (admission stamps a step's start, a finish its end)."""
    adm, fin, arr = rec.admitted_at_s, rec.finished_at_s, rec.arrival_at_s
    for t in rec.step_start_s:
        running = (adm <= t) & (t < fin)
        waiting = (arr <= t) & (t < adm)
        yield set(adapters[running & (adapters >= 0)].tolist()), np.flatnonzero(waiting)


@st.composite
def lora_runs(draw):  # noqa: ANN001, ANN201
    n = draw(st.integers(1, 40))
    num_adapters = draw(st.integers(1, 6))
    slots = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    rate = draw(st.sampled_from([5.0, 50.0, 500.0]))
    reqs = Requests(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 60, n),
                    rng.integers(1, 30, n), np.zeros(n, np.int64),
                    adapter=rng.integers(-1, num_adapters, n))
    return reqs, slots, num_adapters, draw(st.sampled_from(["const", "linear"]))


@settings(max_examples=60, deadline=None)
@given(lora_runs())
def test_invariants_of_the_rule(run):
    reqs, slots, num_adapters, kind = run
    inner = ConstStep(0.01) if kind == "const" else LinearStep()
    rec = _run(LoraStep(inner, slots), reqs, seqs=BIG >> 4)
    a = np.asarray(reqs.adapter)
    assert rec.preemptions == 0
    assert np.all(rec.finished_at_s > 0) and np.all(np.isfinite(rec.finished_at_s))
    for loaded, waiting in _running_sets(rec, a):
        assert len(loaded) <= slots  # never more distinct adapters in a step than slots
        # nothing else binds (budget, sequences, blocks), so a request waits only when its
        # adapter is not loaded and every slot is taken
        for i in waiting:
            assert a[i] >= 0 and a[i] not in loaded and len(loaded) == slots
    if slots >= num_adapters:  # the rule never binds: the run without it, exactly
        free = _run(inner, reqs, seqs=BIG >> 4)
        for key in ("admitted_at_s", "first_token_at_s", "finished_at_s"):
            np.testing.assert_array_equal(getattr(rec, key), getattr(free, key))


@needs_numba
def test_slots_for_every_adapter_equal_more_slots_on_the_step_model(llama_h100):
    # the real step model prices the running set's distinct adapters, min(distinct, max_loras):
    # with 8 adapters, 8 slots and 16 slots give the same run to the bit (the same KV pool)
    reqs = Requests(np.cumsum(np.random.default_rng(0).exponential(1 / 30, 600)),
                    np.full(600, 500), np.full(600, 300), np.zeros(600, np.int64))
    runs = []
    for slots in (8, 16):
        dep = capplan.deployment("llama-3.1-8b", "h100-sxm", max_loras=slots, lora_adapters=8)
        eng = ContinuousEngine(dep.step, llama_h100.pool.num_blocks, 16, 256, 8192)
        runs.append(eng.run(reqs))
    for key in ("admitted_at_s", "first_token_at_s", "finished_at_s", "step_dur_s"):
        np.testing.assert_array_equal(getattr(runs[0], key), getattr(runs[1], key))


def test_adapters_are_drawn_from_the_popularity():
    rng = np.random.default_rng(0)
    a = draw_adapters(adapter_groups(32, "uniform"), 64_000, rng)
    assert a.min() == 0 and a.max() == 31
    assert np.bincount(a).min() > 1800  # 2,000 each expected (sd 44)
    z = draw_adapters(adapter_groups(100, "zipf"), 100_000, rng)
    # Zipf groups (models/lora.py): the first group (ranks 1-3) draws 3 x its mean
    # probability, (1 + 1/2 + 1/3) / H_100 = 0.3539
    assert np.mean(z < 3) == pytest.approx(0.3539, abs=0.005)
    assert np.all(draw_adapters(adapter_groups(4, "uniform"), 5, np.random.default_rng(7))
                  == draw_adapters(adapter_groups(4, "uniform"), 5, np.random.default_rng(7)))


@pytest.mark.parametrize("rate", [3.0, 12.0])
def test_decode_stretches_with_lora_match_step_by_step(rate):
    # compiled._bulk_ok with LoRA: a stretch runs while no waiting request may run (no slot,
    # none of a loaded adapter) or the one the step's scan stopped at still does not fit
    from capplan.sim import Lane, Workload, parse_length, simulate

    dep = capplan.deployment("llama-3.1-8b", "h100-sxm", max_loras=2, lora_adapters=8)
    wl = Workload((Lane(rate_per_s=rate, input_len=parse_length("uniform:min=50,max=900"),
                        output_len=parse_length("uniform:min=20,max=200")),), num_requests=300)
    kw = dict(scheduler="continuous", num_gpu_blocks=400, block_size=16, max_num_seqs=48,
              max_num_batched_tokens=2048)
    fast = simulate(dep.step, workload=wl, seed=2, **kw).to_dict()
    with step_by_step():
        slow = simulate(dep.step, workload=wl, seed=2, sim_engine="python", **kw).to_dict()
    for key in ("ttft_s", "e2e_s", "tbt_s"):
        assert fast[key] == pytest.approx(slow[key], rel=1e-9), key
    assert fast["preemptions"] == slow["preemptions"]


@needs_numba
def test_one_replica_fleet_is_the_single_engine_with_lora():
    # the fleet loop keeps each replica's adapter counts (fleet_loop.simulate_fleet)
    from capplan.sim.engine import CompiledEngine
    from capplan.sim.fleet import FleetReplaySpec, replay_schedule

    dep = capplan.deployment("llama-3.1-8b", "h100-sxm", max_loras=2, lora_adapters=8)
    rng = np.random.default_rng(4)
    n = 500
    reqs = Requests(np.cumsum(rng.exponential(1 / 8.0, n)), rng.integers(50, 900, n),
                    rng.integers(20, 300, n), np.zeros(n, np.int64),
                    adapter=rng.integers(0, 8, n))
    s, pool = dep.settings, dep.pool
    single = CompiledEngine(dep.step, pool.num_blocks, pool.block_size, s.max_num_seqs,
                            s.max_num_batched_tokens, s.profile.scheduler).run(reqs)
    res = replay_schedule(FleetReplaySpec(requests=reqs, engine_config=dep,
                                          windows=[(0.0, 1e5, 1)]))
    ttft = np.sort(single.first_token_at_s - single.arrival_at_s)
    assert res.completed == n
    assert res.ttft_s["p99"] == pytest.approx(ttft[int(np.ceil(0.99 * n)) - 1], abs=1e-9)
    assert res.ttft_s["p99"] > 1.0  # the slots bind: requests wait for their adapter
