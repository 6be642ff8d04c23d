"""A configuration's answer does not depend on which other configurations share its search:
an MoE model's plain-TP rows and its attention-DP rows, searched together, give what each set
gives searched alone (the mixed step of a plain row costs its chunk as one sequence, a DP
row's as whole prompts per rank: models/queueing/steady.py `_mixed`). The search used to cost
every row as whole prompts once any row had attention DP: up to 21% on p99 TTFT."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from capplan.catalog.loader import load_catalog
from capplan.plan.planner import _groups, search_space, traffic_for
from capplan.plan.schema import PlanFile
from capplan.plan.search import _queue_model


@cache
def _groups_and_traffic():
    cat = load_catalog()
    plan = PlanFile.model_validate({
        "model": "qwen3-30b-a3b", "engine": {"name": "sglang"},
        "candidates": {"gpus": ["h100-sxm"]},
        "workloads": [{"name": "x", "rate_per_s": 10, "input_len": "2000",
                       "output_len": "300", "slo": {"ttft_p99_s": 2.0}}]})
    resolved = cat.resolve_model(plan.model)
    t = traffic_for(list(plan.workloads), resolved.spec.context_len(plan.engine.max_model_len))
    space = search_space(cat, plan, resolved.spec, t, resolved.implied_weight_dtype)
    return _groups(cat, resolved.spec, space), t


def _p99_ttft(groups, t, rate: float) -> np.ndarray:
    q = _queue_model(groups, t)[0]
    return np.asarray(q.at_rate(rate, {"ttft_s"})["ttft_s"]["p99"], float)


@pytest.mark.parametrize("rate", [2.0, 20.0])
def test_plain_and_dp_rows_answer_as_if_searched_alone(rate: float) -> None:
    groups, t = _groups_and_traffic()
    plain = [g for g in groups if g.settings.attention_dp == 1]
    dp = [g for g in groups if g.settings.attention_dp > 1]
    assert plain and dp  # the search space holds both kinds
    both = _p99_ttft(plain + dp, t, rate)
    alone = np.concatenate([_p99_ttft(plain, t, rate), _p99_ttft(dp, t, rate)])
    assert both.shape == alone.shape
    finite = np.isfinite(alone)
    assert finite.any()
    np.testing.assert_array_equal(np.isfinite(both), finite)
    np.testing.assert_allclose(both[finite], alone[finite], rtol=1e-5)
