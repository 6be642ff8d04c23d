"""The Python API refuses what the CLI refuses, with the same reason (issue 30, defect 4).

Before: `capplan.speed(..., batch=[0])` and `latency(..., burstiness=0)` raised
ZeroDivisionError, `latency(model, None, rate=5)` AttributeError, `speed(..., prefill=[2**63])`
hung, and `max_num_seqs=0`, `num_prompts=-1`, a 200,000-value batch list were accepted.
"""

from __future__ import annotations

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import capplan
from capplan.api_checks import check_kwargs, label
from capplan.cli import _options as O
from capplan.errors import InputError

M, G = "llama-3.1-8b", "h100-sxm"
CLI_TYPES = {"rate": O.RATE, "concurrency": O.CONCURRENCY, "burstiness": O.BURSTINESS,
             "num_prompts": O.POS_INT, "requests": O.REQUESTS, "seed": O.SEED,
             "max_num_seqs": O.POS_INT, "max_num_batched_tokens": O.POS_INT,
             "max_model_len": O.POS_INT, "tp": O.POS_INT, "batch_size": O.POS_INT,
             "gpu_memory_utilization": O.FRACTION}
INTS = {k for k, t in CLI_TYPES.items() if isinstance(t, O.BoundedInt)}


def _cli_reason(key: str, value: object) -> str | None:
    """The CLI ParamType's refusal reason for `value` typed on the command line, or None."""
    try:
        CLI_TYPES[key].convert(str(value), None, None)
    except click.BadParameter as e:
        return e.message
    return None


def _api_reason(key: str, value: object) -> str | None:
    try:
        check_kwargs(**{key: value})
    except InputError as e:
        return str(e).removeprefix(f"{label(key)}: ")
    return None


@settings(max_examples=100, deadline=None)
@given(key=st.sampled_from(sorted(CLI_TYPES)), data=st.data())
def test_api_and_cli_refuse_the_same_values_for_the_same_reason(key: str, data) -> None:  # noqa: ANN001
    if key in INTS:
        value = data.draw(st.one_of(st.integers(-10, 10), st.integers(-2**70, 2**70),
                                    st.sampled_from([2**63 - 1, 2**63, 2**24, 2**24 + 1])))
    else:
        value = data.draw(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                                    st.sampled_from([0.0, 1.0, 1e-6, 1e-7, 1e6, 1.5])))
    assert _api_reason(key, value) == _cli_reason(key, value)


@pytest.mark.parametrize("call, says", [
    (lambda: capplan.speed(M, G, batch=[0]), "batch (--batch): 0 must be >= 1"),
    (lambda: capplan.latency(M, G, rate=5, burstiness=0),
     "burstiness (--burstiness): 0 must be >= 0.001"),
    (lambda: capplan.latency(M, None, rate=5), "gpu (--gpu): expected a catalog name"),
    (lambda: capplan.speed(M, G, prefill=[2**63]),
     "prefill (--prefill): 9.22337e+18 must be >= 1"),
    (lambda: capplan.memory(M, G, max_num_seqs=0),
     "max_num_seqs (--max-num-seqs): 0 must be >= 1"),
    (lambda: capplan.latency(M, G, concurrency=4, num_prompts=-1),
     "num_prompts (--num-prompts): -1 must be"),
    (lambda: capplan.speed(M, G, batch=list(range(1, 200_001))),
     "batch (--batch): 200,000 values exceed"),
    (lambda: capplan.memory(M, G, block_size=7), "block_size (--block-size): 7 is not one of"),
    (lambda: capplan.recommend(M, rate=0), "rate (--rate): 0 must be >= 1e-06"),
    (lambda: capplan.run_plan({"version": 1, "model": M,
                               "workloads": [{"name": "a", "rate_per_s": -1}]}),
     "plan: workloads.0.rate_per_s: -1 must be >= 1e-06"),
])
def test_api_refuses_as_input_error_naming_field_and_reason(call, says: str) -> None:  # noqa: ANN001
    with pytest.raises(InputError) as e:
        call()
    assert str(e.value).startswith(says), str(e.value)


def test_documented_maximum_seed_is_accepted() -> None:
    """Before: 2**63 - 1 went through float(), became 2**63 and was refused."""
    check_kwargs(seed=2**63 - 1)
    assert _cli_reason("seed", 2**63 - 1) is None
    assert _cli_reason("seed", 2**63) is not None
