"""The named step record and the one chunk-attention formula the step model and simulator share."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from capplan.models.perf import StepModel, chunk_attention
from capplan.sim.entities import STEP_INPUTS, StepRecord, step_array


def test_step_inputs_are_the_step_models_arguments():
    params = [p for p in inspect.signature(StepModel.step).parameters
              if p not in ("self", "detail")]
    assert list(STEP_INPUTS) == params
    assert StepRecord._fields[len(STEP_INPUTS):] == (
        "num_running", "num_waiting", "kv_blocks_used", "tbt_count", "tbt_from_step")


def test_step_array_has_named_columns():
    recs = [StepRecord(*range(15)), StepRecord(*range(1, 16))]
    a = step_array(recs)
    assert a["num_running"].tolist() == [10, 11]
    assert a["prefill_pairs"].dtype == np.float64
    assert len(step_array([])) == 0


@pytest.mark.parametrize(("c", "p", "w", "expected"), [
    # no window: query i of the chunk sees p + i keys, i = 1..c
    (4, 0, 2**62, (1 + 2 + 3 + 4, 1 + 2 + 3 + 4, 0)),
    (3, 5, 2**62, (6 + 7 + 8, 6 + 7 + 8, 5)),
    # window 3, from the start: 1 + 2 + 3 + 3 + 3 keys
    (5, 0, 3, (15, 1 + 2 + 3 + 3 + 3, 0)),
    # window 3 after 10 cached tokens: every query sees 3 keys, 3 cached tokens are read
    (4, 10, 3, (11 + 12 + 13 + 14, 4 * 3, 3)),
])
def test_chunk_attention_by_hand(c, p, w, expected):
    assert chunk_attention(c, p, w) == pytest.approx(expected)
    # arrays give the same numbers, element by element
    got = chunk_attention(np.full(2, float(c)), np.full(2, float(p)), np.full(2, float(w)))
    for g, x in zip(got, expected, strict=True):
        assert np.asarray(g).tolist() == pytest.approx([x, x])
