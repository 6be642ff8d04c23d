"""StepModel.steps evaluates several steps in one call of the formula: each value must be the
one `step` gives for that step alone (the same elementwise operations), over a search's step
constants (arrays per configuration), with inputs that differ, coincide or are numbers."""

from __future__ import annotations

import numpy as np

from capplan.catalog.loader import load_catalog
from capplan.plan.planner import _groups, search_space, traffic_for
from capplan.plan.schema import PlanFile
from capplan.plan.search import _queue_model


def _search_step():  # noqa: ANN202
    cat = load_catalog()
    plan = PlanFile.model_validate({
        "model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm", "l40s"]},
        "workloads": [{"name": "x", "rate_per_s": 5, "input_len": "1000", "output_len": "200",
                       "slo": {"ttft_p99_s": 1.0}}]})
    model = cat.resolve_model(plan.model).spec
    t = traffic_for(list(plan.workloads), model.context_len(plan.engine.max_model_len))
    qm = _queue_model(_groups(cat, model, search_space(cat, plan, model, t, None)), t)[0]
    return qm.step, np.shape(qm.cap)


def test_steps_equal_each_step_alone() -> None:
    step, shape = _search_step()
    rng = np.random.default_rng(0)
    b = rng.uniform(0.5, 200, shape)
    chunk = rng.uniform(1, 8192, shape)
    calls = [
        {"num_decode": b, "decode_kv_tokens": b * 1100.0},
        step.prefill_chunk_inputs(chunk, 300.0, num_decode=b, decode_kv_tokens=b * 1100.0),
        step.prefill_chunk_inputs(np.full(shape, 512.0), 0.0),
        {"num_decode": 3.0, "decode_kv_tokens": 3000.0},  # numbers
    ]
    got = step.steps(*calls)
    for call, v in zip(calls, got, strict=True):
        alone = step.step(**call, detail=False)["step_s"]
        assert np.array_equal(v, np.broadcast_to(alone, v.shape))
    assert not np.array_equal(got[0], got[1])


def test_steps_of_the_same_numbers() -> None:
    step, _ = _search_step()
    call = {"num_decode": 8.0, "decode_kv_tokens": 8000.0}
    a, b = step.steps(call, call)
    assert np.array_equal(a, step.step(**call, detail=False)["step_s"]) and np.array_equal(a, b)
