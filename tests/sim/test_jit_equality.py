"""The scheduler loop (capplan/sim/compiled.py) compiled and interpreted gives the same run.

There is one implementation of continuous batching; numba compiles it, and the same source runs
as plain Python (`ContinuousEngine.jit = False`, `--sim-engine python`: the module loaded a
second time with the JIT off). Each case runs the same requests both ways and compares every
request's arrival, admission, first-token and finish time (so TTFT and E2E), every TBT gap and
every per-step array to 1e-9 s. The grid: seeds, loads of 10%, 80% and 120% of the
configuration's measured capacity, the three engine policies (vLLM mixed chunked prefill with
preemption, SGLang prefill-first, TensorRT-LLM whole prompts with the output reserved), a
sliding window, two lanes with priorities, closed loops with and without a per-request overhead
and client jitter, hybrid models' per-sequence state blocks and prefix caching. What the loop
must compute is checked elsewhere against hand calculations (test_engine.py, test_policies.py,
tests/prefix/test_sim_cache.py, test_hybrid_state.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from capplan.models.engine import ClientJitter, SchedulerPolicy
from capplan.models.layers import DENSE_LAYOUT, BlockLayout
from capplan.sim import (
    ContinuousEngine,
    Requests,
    compiled_available,
    engine_impl,
    run_scheduler,
)
from capplan.sim.metrics import step_summary
from capplan.sim.workload import Lane

needs_numba = pytest.mark.skipif(not compiled_available(), reason="numba (the fast extra)")

POLICIES = {
    "vllm": SchedulerPolicy(),
    "prefill_first": SchedulerPolicy(prefill_first=True),
    "no_evict": SchedulerPolicy(chunked_prefill=False, reserve_output_frac=1.0,
                                preemption=False),
}
BLOCKS, BLOCK_SIZE, SEQS, TOKENS = 300, 16, 24, 1024
"""A small cache (4,800 tokens) and batch, so the overloaded runs preempt."""
N = 160
TOL_S = 1e-9


def windowed(step, window: float):  # noqa: ANN001, ANN201
    """The deployment's step model with a sliding window on half its attention layers (as
    Gemma 2 alternates them), so the windowed KV reads enter the step time."""
    half = float(step.full_layers) / 2
    return replace(step, window=window, full_layers=half, window_layers=half)


def _requests(seed: int, rate: float | None, concurrency: int | None = None) -> Requests:
    rng = np.random.default_rng(seed)
    inp = rng.integers(16, 700, N)
    out = rng.integers(1, 200, N)
    arr = (np.zeros(N) if rate is None else np.cumsum(rng.exponential(1 / rate, N)))
    return Requests(arr, inp, out, rng.integers(0, 2, N), concurrency)


def _run(jit, step, reqs, policy, overhead_s=0.0, state_blocks=0, jitter=None,
         layout=DENSE_LAYOUT):
    eng = ContinuousEngine(step, BLOCKS, BLOCK_SIZE, SEQS, TOKENS, policy,
                           state_blocks=state_blocks, layout=layout)
    eng.jit = jit  # compiled (numba installed), or the same loop as plain Python
    return eng.run(reqs, np.array([1, 0]), request_overhead_s=overhead_s, client_jitter=jitter)


def _both(*args, **kw):  # noqa: ANN002, ANN003, ANN202
    """The run compiled and interpreted, checked equal; returns the interpreted one."""
    py = _run(False, *args, **kw)
    if compiled_available():
        _same(_run(True, *args, **kw), py)
    return py


def _tbt_samples(st) -> np.ndarray:
    """Every per-step TBT sample of a StepSummary, sorted (its (gap, count) pairs expanded)."""
    return np.sort(np.repeat(st.tbt_gap_s, np.asarray(st.tbt_count, np.int64)))


def _same_steps(st, ref) -> None:
    """A StepSummary built in the loop (the compiled engine's) against the one of the
    reference's per-step arrays: the same TBT samples, integrals, peak and series."""
    want = step_summary(ref)
    assert (st.num_steps, st.kv_blocks_max) == (want.num_steps, want.kv_blocks_max)
    np.testing.assert_allclose(_tbt_samples(st), _tbt_samples(want), rtol=0, atol=TOL_S)
    assert len(st.tbt_gap_s) == len(np.unique(st.tbt_gap_s))  # equal gaps merged
    for key in ("running_s", "in_system_s"):
        assert getattr(st, key) == pytest.approx(getattr(want, key), rel=1e-9, abs=TOL_S), key
    np.testing.assert_allclose(st.series_start_s, want.series_start_s, rtol=0, atol=TOL_S)
    for key in ("series_running", "series_waiting", "series_kv_blocks"):
        np.testing.assert_array_equal(getattr(st, key), getattr(want, key), err_msg=key)


def _same(a, b, sort_gaps: bool = False, arrays: bool = True) -> None:
    """`a` gives `b`'s results: per-request times, extra gaps, the step aggregate when `a` has
    one and, with `arrays`, every per-step array."""
    assert (a.preemptions, a.prefix_hit_tokens) == (b.preemptions, b.prefix_hit_tokens)
    if a.steps is not None:
        _same_steps(a.steps, b)
    keys = ("arrival_at_s", "admitted_at_s", "first_token_at_s", "finished_at_s",
            "extra_gaps_s")
    if arrays:
        keys += ("step_start_s", "step_dur_s", "step_tbt_gap_s")
    else:
        assert not len(a.step_dur_s)  # the compiled engine's default: aggregates only
    for key in keys:
        x, y = getattr(a, key), getattr(b, key)
        assert x.shape == y.shape, key
        if sort_gaps and key == "extra_gaps_s":
            x, y = np.sort(x), np.sort(y)
        np.testing.assert_allclose(x, y, rtol=0, atol=TOL_S, err_msg=key)
    for key in ("step_tbt_count", "step_running", "step_waiting", "step_kv_blocks")[:4 * arrays]:
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)


@pytest.fixture(scope="module")
def capacity_per_s(llama_h100) -> dict[str, float]:
    """Requests per second each policy completes with every request waiting at t = 0."""
    out = {}
    for name, policy in POLICIES.items():
        rec = _run(compiled_available(), llama_h100.step, _requests(0, None), policy)
        out[name] = N / float(rec.finished_at_s.max())
    return out


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("load", [0.1, 0.8, 1.2])
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("window", [None, 256])
def test_open_loop_compiled_equals_interpreted(llama_h100, capacity_per_s, policy, load, seed,
                                               window):
    step = llama_h100.step if window is None else windowed(llama_h100.step, window)
    ref = _both(step, _requests(seed, load * capacity_per_s[policy]), POLICIES[policy])
    if load > 1 and POLICIES[policy].preemption and policy == "vllm":
        assert ref.preemptions > 0  # the overloaded vLLM case exercises preemption


WHOLE_AFTER_FIRST = {
    "mixed": SchedulerPolicy(whole_prompts_after_first=True, max_prefill_tokens=1200),
    "prefill_first": SchedulerPolicy(prefill_first=True, whole_prompts_after_first=True,
                                     max_prefill_tokens=1200),
}
"""SGLang's admission (a step's further prompts only whole within a prompt budget of 1,200
tokens, the chunk cap TOKENS), with --enable-mixed-chunk and without."""


@pytest.mark.parametrize("policy", list(WHOLE_AFTER_FIRST))
@pytest.mark.parametrize("rate", [20.0, 200.0, None])
@pytest.mark.parametrize("prefix", [False, True])
def test_whole_prompts_after_first_compiled_equals_interpreted(llama_h100, policy, rate,
                                                               prefix):
    pol = replace(WHOLE_AFTER_FIRST[policy], prefix_caching=prefix)
    reqs = _shared_requests(3, rate) if prefix else _requests(3, rate, 12 if rate is None
                                                              else None)
    ref = _both(llama_h100.step, reqs, pol)
    other = _run(False, llama_h100.step, reqs, replace(pol, whole_prompts_after_first=False))
    if rate == 200.0 and not prefix:  # overloaded: the rule changes which prompts share a step
        assert not np.array_equal(ref.first_token_at_s, other.first_token_at_s)


def test_windowed_model_caps_attention(llama_h100):
    # the grid's windowed model is not inert: a decoder with 1,000 tokens of context reads 256
    # of them in half the layers, so the step is shorter than without the window
    w = windowed(llama_h100.step, 256.0)
    capped = float(w.step(num_decode=1, decode_kv_tokens=1000, decode_kv_tokens_window=256,
                          detail=False)["step_s"])
    full = float(llama_h100.step.step(num_decode=1, decode_kv_tokens=1000, detail=False)["step_s"])
    assert capped < full


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("load", [0.8, 1.2, None])
def test_hybrid_state_blocks_compiled_equals_interpreted(llama_h100, capacity_per_s, policy,
                                                         load):
    # a hybrid's recurrent state: 6 blocks held per running sequence from admission to finish
    # or preemption (sim/engine.py), on a pool that binds; load None: a closed loop of 16
    closed = load is None
    reqs = _requests(7, None, concurrency=16) if closed else _requests(
        7, load * capacity_per_s[policy])
    ref = _both(llama_h100.step, reqs, POLICIES[policy], state_blocks=6)
    assert ref.step_kv_blocks.max() >= 6 * ref.step_running.max()
    if not closed and load > 1 and policy == "vllm":
        assert ref.preemptions > 0  # preemption frees the state blocks too


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("load", [0.8, 3.0, None])
@pytest.mark.parametrize("layout", [BlockLayout(1, 1, 6, 64), BlockLayout(5, 26, 9, 128),
                                    BlockLayout(0, 1, 8, 64)])
def test_sliding_window_blocks_compiled_equals_interpreted(llama_h100, capacity_per_s, policy,
                                                           load, layout):
    # a sliding-window model's pool (gpt-oss's 1:1, Gemma-3's 5:26 and Mistral-7B-v0.1's
    # window-only layer shapes): window layers stop growing at the cap (6, 9 or 8 token blocks,
    # below most prompts), with prefix caching on (shared prefixes, preempted blocks cached);
    # load 3: three times the dense pool's capacity, so the capped pool preempts too; load
    # None: a closed loop of 16
    closed = load is None
    reqs = (_shared_requests(5, None, 16) if closed
            else _shared_requests(5, load * capacity_per_s[policy]))
    pol = replace(POLICIES[policy], prefix_caching=True)
    ref = _both(windowed(llama_h100.step, 16.0 * layout.window_cap), reqs, pol, layout=layout)
    assert ref.num_gpu_blocks == BLOCKS * layout.units
    assert ref.prefix_hit_tokens > 0
    if not closed and load > 1 and policy == "vllm" and layout.full == layout.window == 1:
        # (the 5:26 pool holds 20 sequences of 700 tokens, near max_num_seqs 24, and the
        # window-only one 37 of at most 8 blocks: they need not)
        assert ref.preemptions > 0


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("overhead_s", [0.0, 0.004])
@pytest.mark.parametrize("seed", [3, 4])
def test_closed_loop_compiled_equals_interpreted(llama_h100, policy, overhead_s, seed):
    _both(llama_h100.step, _requests(seed, None, concurrency=12), POLICIES[policy], overhead_s)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize(("overhead_s", "jitter"), [
    (0.0, ClientJitter(request_s=0.003)),
    (0.004, ClientJitter(request_s=0.002, per_token_s=0.0004, seed=11))])
def test_closed_loop_with_client_jitter_compiled_equals_interpreted(llama_h100, policy,
                                                                    overhead_s, jitter):
    # jittered arrivals reach the engine out of sending order, each taking the next index
    reqs = _requests(5, None, concurrency=12)
    ref = _both(llama_h100.step, reqs, POLICIES[policy], overhead_s, jitter=jitter)
    plain = _run(compiled_available(), llama_h100.step, reqs, POLICIES[policy], overhead_s)
    # the jitter changed when requests arrived (one check that the test exercises it)
    assert not np.allclose(ref.arrival_at_s, plain.arrival_at_s)
    assert (ref.admitted_at_s >= ref.arrival_at_s - 1e-12).all()


def test_engine_choice():
    auto = "compiled" if compiled_available() else "python"
    assert engine_impl("continuous", num_requests=10**6) == auto
    assert engine_impl("continuous", num_requests=100, closed_loop=True) == auto
    assert engine_impl("continuous", "auto", prefix_caching=True) == auto
    assert engine_impl("continuous", "python") == "python"
    # the earlier engines' names run the loop interpreted
    assert engine_impl("continuous", "fast") == engine_impl("continuous", "reference") == "python"
    assert engine_impl("static", "compiled") == engine_impl("dynamic") == "reference"
    with pytest.raises(Exception, match="sim-engine"):
        engine_impl("continuous", "turbo")


@needs_numba
def test_compiled_choice():
    assert engine_impl("continuous", "compiled", num_requests=100) == "compiled"
    assert engine_impl("continuous", "compiled", closed_loop=True) == "compiled"
    assert engine_impl("continuous", "compiled", prefix_caching=True) == "compiled"


def test_run_scheduler_results_identical_either_engine(llama_h100):
    reqs = _requests(6, 20.0)
    lanes = (Lane("a", priority=1), Lane("b", priority=0))
    kw = dict(scheduler="continuous", num_gpu_blocks=BLOCKS, block_size=BLOCK_SIZE,
              max_num_seqs=SEQS, max_num_batched_tokens=TOKENS)
    a = run_scheduler(llama_h100.step, reqs, lanes, sim_engine="auto", **kw).to_dict()
    b = run_scheduler(llama_h100.step, reqs, lanes, sim_engine="python", **kw).to_dict()
    for key in ("ttft_s", "tbt_s", "e2e_s", "tpot_s", "queue_s"):
        for q, v in a[key].items():
            assert v == pytest.approx(b[key][q], abs=TOL_S), (key, q)
    assert a["preemptions"] == b["preemptions"]


SIM = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "30",
       "--requests", "400", "--max-num-seqs", "64")


def test_cli_names_the_engine_and_both_give_the_same_answer(run_cli):
    py = run_cli(*SIM, "--format", "json", "--sim-engine", "python")
    auto = run_cli(*SIM, "--format", "json")
    assert py.exit_code == auto.exit_code == 0
    a, b = auto.json(), py.json()
    assert (a.pop("engine_impl"), b.pop("engine_impl")) == (
        "compiled" if compiled_available() else "python", "python")
    for key in ("ttft_s", "tbt_s", "e2e_s", "tpot_s", "queue_s"):
        for q in ("mean", "p50", "p90", "p99"):
            assert a[key][q] == pytest.approx(b[key][q], abs=TOL_S), (key, q)
    assert a["preemptions"] == b["preemptions"]
    assert "simulator engine: python" in run_cli(*SIM, "--sim-engine", "python").stderr
    # the earlier engines' names are still accepted (the loop as plain Python)
    assert run_cli(*SIM, "--format", "json", "--sim-engine", "fast").json()["engine_impl"] == \
        "python"
    bad = run_cli(*SIM, "--sim-engine", "turbo")
    assert bad.exit_code == 2 and len(bad.stderr_lines) == 1


def _shared_requests(seed: int, rate: float | None, concurrency: int | None = None) -> Requests:
    """`_requests` whose prompts start with one of four shared contents (or none), of random
    length: prefix caching hits, registers and (in the small cache) evicts."""
    r = _requests(seed, rate, concurrency)
    rng = np.random.default_rng(seed + 100)
    shared = np.minimum(r.input_tokens, rng.integers(0, 600, N))
    return replace(r, prefix_group=rng.integers(-1, 4, N), prefix_tokens=shared)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize(("rate", "clients"), [(5.0, None), (200.0, None), (None, 12)])
def test_prefix_caching_compiled_equals_interpreted(llama_h100, policy, rate, clients):
    pol = replace(POLICIES[policy], prefix_caching=True)
    reqs = _shared_requests(1, rate, clients)
    ref = _both(llama_h100.step, reqs, pol, 0.002 if clients else 0.0)
    assert ref.prefix_hit_tokens > 0
    if rate == 200.0 and policy == "vllm":
        assert ref.preemptions > 0  # preempted sequences release shared blocks too


@pytest.fixture(scope="module")
def lora_steps() -> dict[str, object]:
    """Llama-3.1-8B step models with LoRA: 2 slots over 8 uniform adapters, 4 over 16 Zipf."""
    import capplan

    return {pop: capplan.deployment("llama-3.1-8b", "h100-sxm", max_loras=slots,
                                    lora_adapters=n, lora_popularity=pop).step
            for pop, slots, n in (("uniform", 2, 8), ("zipf", 4, 16))}


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("load", [0.1, 0.8, 1.2])
@pytest.mark.parametrize("popularity", ["uniform", "zipf"])
def test_lora_admission_compiled_equals_interpreted(lora_steps, capacity_per_s, policy, load,
                                                    popularity):
    # the engine draws each request's adapter; admission skips requests of further adapters
    # once the slots are taken (compiled._admit_waiting), the step prices the running set's
    reqs = _requests(5, load * capacity_per_s[policy])
    ref = _both(lora_steps[popularity], reqs, POLICIES[policy])
    if load > 1 and policy == "vllm":
        assert ref.preemptions > 0  # preempted requests give their adapter back


@pytest.mark.parametrize("policy", list(POLICIES))
def test_lora_closed_loop_and_base_requests_compiled_equal_interpreted(lora_steps, policy):
    # a closed loop whose requests carry their adapters, a fifth on the base model (-1)
    reqs = _requests(6, None, concurrency=12)
    reqs = replace(reqs, adapter=np.random.default_rng(6).integers(-1, 4, N))
    _both(lora_steps["uniform"], reqs, POLICIES[policy], 0.002)
