"""SGLang's prefill admission (SchedulerPolicy.whole_prompts_after_first), traced by hand.

SGLang 0.5.8 `PrefillAdder` (python/sglang/srt/managers/schedule_policy.py): with
--enable-mixed-chunk a step's prompt budget is rem_input = max_prefill_tokens - running_bs and
its chunk cap rem_chunk = chunked_prefill_size - running_bs; the step's first prompt is chunked
at rem_chunk, and a later one is refused (ending the step's admissions) unless its tokens are
fewer than what is left of rem_input. capplan's `max_num_batched_tokens` is the chunk cap and
`SchedulerPolicy.max_prefill_tokens` the prompt budget (one attention rank here).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from capplan.models.engine import SGLANG, TRTLLM, VLLM, SchedulerPolicy
from capplan.sim import ContinuousEngine, Requests, compiled_available
from capplan.sim.compiled import prompt_budget
from capplan.sim.protocol import aiconfigurator_settings

MIXED = SchedulerPolicy(prefill_first=False, whole_prompts_after_first=True)
"""SGLang with --enable-mixed-chunk (the AIConfigurator benchmark's launch)."""
VLLM_LIKE = SchedulerPolicy(prefill_first=False)
DECODERS = 60


class Recorder:
    """A stand-in step model (the plain loop asks it step by step): 10 ms a step, and each
    step's prompt tokens and prompt count recorded."""

    window = 2.0**62

    def __init__(self) -> None:
        self.prefill: list[tuple[int, int]] = []

    def step(self, **kw):  # noqa: ANN003, ANN201
        pt = np.atleast_1d(np.asarray(kw["prefill_tokens"], float))
        ns = np.broadcast_to(np.asarray(kw["num_prefill_seqs"], float), pt.shape)
        self.prefill += [(int(p), int(n)) for p, n in zip(pt, ns, strict=True) if p > 0]
        return {"step_s": np.full(np.shape(kw["num_decode"]), 0.01)}


def _requests(prompt: int, n_new: int) -> Requests:
    """DECODERS one-token prompts with long outputs at t = 0 (one step admits them all), then
    `n_new` prompts of `prompt` tokens together at t = 0.5 s, when the 60 are decoding."""
    n = DECODERS + n_new
    arr = np.r_[np.zeros(DECODERS), np.full(n_new, 0.5)]
    inp = np.r_[np.ones(DECODERS, np.int64), np.full(n_new, prompt)]
    out = np.r_[np.full(DECODERS, 400), np.full(n_new, 4)]
    return Requests(arr, inp, out, np.zeros(n, np.int64))


def _run(policy: SchedulerPolicy, chunk: int, max_prefill: int | None, prompt: int,
         n_new: int) -> tuple[list[tuple[int, int]], object]:
    rec = Recorder()
    if max_prefill is not None:
        policy = replace(policy, max_prefill_tokens=max_prefill)
    eng = ContinuousEngine(rec, 4000, 16, 128, chunk, policy)
    eng.jit = False
    run = eng.run(_requests(prompt, n_new))
    return rec.prefill, run


def test_1024_token_prompts_two_whole_per_step():
    # max_prefill_tokens = ISL + 1500 = 2524, chunked_prefill_size 8192, 60 decodes running:
    # rem_input = 2524 - 60 = 2464, rem_chunk = 8192 - 60 = 8132.
    # step k: A (first): 1024 <= 8132, whole -> rem_input 1440; B: 1024 < 1440, whole ->
    #         rem_input 416; C: 1024 >= 416, refused: admissions end. 2 prompts, 2048 tokens.
    # step k+1: 62 decode (A, B now decode): rem_input 2524 - 62 = 2462; C whole -> 1438;
    #         D 1024 < 1438, whole. 2 prompts, 2048 tokens.
    prefill, run = _run(MIXED, 8192, 2524, 1024, 4)
    assert prefill[1:] == [(2048, 2), (2048, 2)]  # prefill[0]: the 60 one-token prompts
    adm = run.admitted_at_s[DECODERS:]
    assert adm[0] == adm[1] < adm[2] == adm[3]
    # the same 60 + 1024 + 1500 = 2584-token step budget filled as vLLM fills it:
    # 2584 - 60 = 2524 = 1024 + 1024 + 476 of C; then C's 548 + D's 1024
    prefill, _ = _run(VLLM_LIKE, 2584, None, 1024, 4)
    assert prefill[1:] == [(2524, 3), (1572, 2)]


def test_8192_token_prompts_one_per_step():
    # max_prefill_tokens 8192 + 1500 = 9692, chunked_prefill_size 8192, 60 decodes:
    # step k: A first, 8192 > rem_chunk 8132: chunked at 8132 -> rem_chunk 0, admissions end.
    # step k+1: A continues (first): its 60 left; rem_input 9692 - 60 - 60 = 9572,
    #   rem_chunk 8072; B: 8192 < 9572, admitted, chunked at 8072.
    # step k+2: B continues with its 120 (A decodes: 61 decodes, nothing more waits).
    prefill, _ = _run(MIXED, 8192, 9692, 8192, 2)
    assert prefill[1:] == [(8132, 1), (60 + 8072, 2), (120, 1)]
    # vLLM's budget 60 + 8192 + 1500: 9692 = A whole + 1500 of B, then B's 6692
    prefill, _ = _run(VLLM_LIKE, 9752, None, 8192, 2)
    assert prefill[1:] == [(9692, 2), (6692, 1)]


def test_a_refused_prompt_ends_the_step_even_if_a_later_one_fits():
    # rem_input 2464 after the 60 decodes: A 1024 whole (1440 left), B 2000 refused, C 100
    # would fit but admissions ended at B. Next step (61 decoding... A decodes: 61):
    # rem_input 2524 - 61 = 2463: B 2000 whole (463 left), C 100 < 463 whole.
    rec = Recorder()
    n = DECODERS + 3
    r = Requests(np.r_[np.zeros(DECODERS), np.full(3, 0.5)],
                 np.r_[np.ones(DECODERS, np.int64), [1024, 2000, 100]],
                 np.r_[np.full(DECODERS, 400), [4, 4, 4]], np.zeros(n, np.int64))
    eng = ContinuousEngine(rec, 4000, 16, 128, 8192, replace(MIXED, max_prefill_tokens=2524))
    eng.jit = False
    eng.run(r)
    assert rec.prefill[1:] == [(1024, 1), (2100, 2)]


def test_prefill_first_steps_subtract_no_decodes():
    # Without mixed chunk (prefill-first steps) running_bs is not subtracted: rem_input 2524.
    # A 1024 -> 1500 left; B 1024 < 1500 whole -> 476; C refused.
    pol = SchedulerPolicy(prefill_first=True, whole_prompts_after_first=True)
    prefill, _ = _run(pol, 8192, 2524, 1024, 4)
    assert prefill[1:] == [(2048, 2), (2048, 2)]


def test_profiles_and_budgets():
    assert SGLANG.scheduler.whole_prompts_after_first
    assert SGLANG.scheduler.max_prefill_tokens == 16384  # server_args.py default
    assert not VLLM.scheduler.whole_prompts_after_first
    assert not TRTLLM.scheduler.whole_prompts_after_first
    eng = ContinuousEngine(Recorder(), 100, 16, 8, 8192, SGLANG.scheduler)
    assert prompt_budget(eng) == 16384
    eng = ContinuousEngine(Recorder(), 100, 16, 8, 8192,
                           replace(SGLANG.scheduler, max_prefill_tokens=2524))
    assert prompt_budget(eng) == 2524
    assert prompt_budget(ContinuousEngine(Recorder(), 100, 16, 8, 4096)) == 4096


def test_aiconfigurator_settings_per_backend():
    sg = aiconfigurator_settings("sglang", 1024, 128, 60, 60)
    # the chunk left to the engine's tier default, the prompt budget ISL + 1500
    assert sg["options"]["max_num_batched_tokens"] is None
    assert sg["max_prefill_tokens"] == 2524 and sg["mixed_prefill"]
    vl = aiconfigurator_settings("vllm", 1024, 128, 60, 60)
    assert vl["options"]["max_num_batched_tokens"] == 60 + 1024 + 1500
    assert vl["max_prefill_tokens"] is None and not vl["mixed_prefill"]
    tr = aiconfigurator_settings("trtllm", 1024, 128, 60, 60)
    assert tr["options"]["max_num_batched_tokens"] == -(-(60 + 1024 + 1500) // 32) * 32


@pytest.mark.parametrize(("system", "chunk"), [("h200_sxm", 8192), ("b200_sxm", 16384)])
def test_sglang_rows_get_the_tier_chunk(system, chunk):
    # SGLang server_args.py _handle_gpu_memory_settings: 8192 on 80-160 GB, 16384 above
    from capplan.catalog.loader import load_catalog
    from capplan.plan.aiconfigurator import AggRun, agg_deployment

    run = AggRun(backend="sglang", model="llama-3.1-8b", system=system, precision="", tp=1,
                 isl=1024, osl=128, batch_size=60, concurrency=60)
    assert agg_deployment(load_catalog(()), run).settings.max_num_batched_tokens == chunk


BEFORE = {"vllm-0": (3442.0278113090435, 4081.10818650033, 32),
          "vllm-1": (3258.580229800687, 3888.081892026034, 40),
          "vllm-2": (3166.4162258014053, 3778.5089358711634, 34),
          "trtllm-0": (3539.8913843653595, 4157.898670281, 0),
          "trtllm-1": (3353.3245903647135, 3960.852622545707, 0),
          "trtllm-2": (3271.4157914416583, 3863.8472775844507, 0)}
"""Sums of first-token and finish times and the preemptions of vLLM's and TensorRT-LLM's
replays below, recorded before SGLang's admission rule entered the loop."""


@pytest.mark.parametrize("name", ["vllm", "trtllm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vllm_and_trtllm_replays_unchanged(llama_h100, name, seed):
    pol = {"vllm": VLLM, "trtllm": TRTLLM}[name].scheduler
    rng = np.random.default_rng(seed)
    n = 300
    inp, out = rng.integers(16, 3000, n), rng.integers(1, 300, n)
    conc = 40 if seed == 2 else None
    arr = np.zeros(n) if conc else np.cumsum(rng.exponential(1 / 30.0, n))
    eng = ContinuousEngine(llama_h100.step, 3000, 16, 64, 4096, pol)
    eng.jit = compiled_available()
    r = eng.run(Requests(arr, inp, out, np.zeros(n, np.int64), conc), np.array([0]))
    got = (float(np.sum(r.first_token_at_s)), float(np.sum(r.finished_at_s)), r.preemptions)
    want = BEFORE[f"{name}-{seed}"]
    assert got[:2] == pytest.approx(want[:2], rel=1e-12, abs=0)
    assert got[2] == want[2]
