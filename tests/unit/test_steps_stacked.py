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


def test_a_gathered_model_has_a_fresh_models_formula_arguments() -> None:
    """StepModel.gathered derives step_parts' arguments from the whole model's; they must be
    those a model built from the gathered constants computes itself, where the MoE and the
    feature terms are off everywhere, in some rows, or in none of the rows taken."""
    from dataclasses import fields, replace

    step, shape = _search_step()
    n = int(np.prod(shape))
    flat = {f.name: np.broadcast_to(getattr(step, f.name), shape).reshape(-1)
            for f in fields(step) if isinstance(getattr(step, f.name), np.ndarray)
            and getattr(step, f.name).ndim}
    some = np.arange(n) % 3 == 0
    variants = {"off": {}, "moe": {"num_experts": np.where(some, 8.0, 0.0)},
                "spec": {"spec_verify_tokens": np.where(some, 3.0, 1.0)}}
    for name, extra in variants.items():
        whole = replace(step, **{**flat, **extra})
        arrays = {**flat, **extra}
        for rows in (np.flatnonzero(some), np.flatnonzero(~some), np.arange(n)):
            got = whole.gathered({k: v[rows] for k, v in arrays.items()})._parts_args
            fresh = replace(whole, **{k: v[rows] for k, v in arrays.items()})._parts_args
            assert got[1:] == fresh[1:], (name, got[1:], fresh[1:])
            assert all(np.array_equal(a, b) for a, b in zip(got[0], fresh[0], strict=True))
