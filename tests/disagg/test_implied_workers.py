"""The worker counts a closed loop implies when a P/D layout gives only the workers' layouts
(capplan.plan.pd.implied_workers; docs/disaggregation.md, "Worker counts")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capplan.api import disaggregated, pd_latency
from capplan.errors import InputError
from capplan.models.queueing import LengthStats
from capplan.plan.pd import (
    RIDGE_STEP,
    WORKER_HEADROOM,
    PdModel,
    implied_workers,
    ridge_batch,
)
from capplan.plan.schema import PlanFile
from tests.cli._asserts import assert_one_line_error

INP, OUT = LengthStats.fixed(2000), LengthStats.fixed(500)


@pytest.fixture(scope="module")
def one():
    # DeepSeek-R1 fp8 on H200: a prefill worker TP 8, a decode worker TP 8, 64 seqs per rank
    return disaggregated("deepseek-r1", "h200", prefill_workers=1, decode_workers=1,
                         prefill={"tp": 8}, decode={"tp": 8, "max_num_seqs": 64},
                         weight_dtype="fp8", max_model_len=4096)


def slots(lay) -> float:
    """A decode worker's slots by hand: its max batch, or the 2,500-token sequences its KV
    cache holds, whichever is smaller."""
    lim = lay.decode.limits
    return min(float(np.asarray(lim.max_num_seqs)),
               float(np.asarray(lim.kv_cache_tokens)) / 2500.0)


def test_headroom_is_the_planners_default():
    assert WORKER_HEADROOM == PlanFile.model_fields["headroom"].default


@pytest.mark.parametrize("clients_per_slot", [0.5, 1.0, 2.5])
def test_decode_workers_hold_the_clients(one, clients_per_slot):
    s = slots(one)
    c = max(1, int(clients_per_slot * s))
    _, d = implied_workers(one.prefill, one.decode, INP, OUT, c, decode_rule="slots")
    assert d == max(1, math.ceil(c / s))  # the fewest whose slots hold C
    assert d * s >= c > (d - 1) * s


def step(one, b: float) -> float:
    return float(np.asarray(one.decode.step.decode_step(b, 2000 + 250, detail=False)["step_s"]))


def test_ridge_batch_is_where_the_step_doubles(one):
    b = ridge_batch(one.decode, 2250.0, slots(one))
    assert 1 <= b <= slots(one)
    assert step(one, b) <= RIDGE_STEP * step(one, 1) < step(one, 1.1 * b + 1)


def test_ridge_rule_holds_the_clients_at_the_ridge_batch(one):
    b = min(ridge_batch(one.decode, 2250.0, slots(one)), slots(one))
    c = int(3.5 * b)
    _, d = implied_workers(one.prefill, one.decode, INP, OUT, c)  # the default rule
    assert d == math.ceil(c / b)
    with pytest.raises(InputError, match="decode rule"):
        implied_workers(one.prefill, one.decode, INP, OUT, c, decode_rule="most")


def test_prefill_workers_carry_the_decode_pools_rate_with_headroom(one):
    c = int(2.5 * slots(one))
    p, d = implied_workers(one.prefill, one.decode, INP, OUT, c)
    # the decode pool's cycle rate by hand: C / (osl x the step at C / d sequences a worker)
    rate = c / (500 * step(one, c / d))
    per_worker = PdModel(one, INP, OUT).capacity["prefill"]
    assert p * per_worker >= rate * (1 + WORKER_HEADROOM) > (p - 1) * per_worker


def test_no_clients_is_refused(one):
    with pytest.raises(InputError, match="concurrency"):
        implied_workers(one.prefill, one.decode, INP, OUT, 0)


def test_cli_latency_implies_the_counts_from_the_clients(run_cli, one):
    args = ("latency", "--model", "deepseek-r1", "--gpu", "h200", "--weight-dtype", "fp8",
            "--prefill-tp", "8", "--decode-tp", "8", "--decode-max-num-seqs", "64",
            "--input-len", "2000", "--output-len", "500", "--max-model-len", "4096")
    c = int(2.5 * slots(one))
    data = run_cli(*args, "--concurrency", str(c), "--format", "json").json()
    want = implied_workers(one.prefill, one.decode, INP, OUT, c)
    assert (data["implied_workers"]["prefill"], data["implied_workers"]["decode"]) == want
    assert f"decode {want[1]} x" in data["layout"]
    # an open loop has no clients to size for; one count alone is not a layout
    assert_one_line_error(run_cli(*args, "--rate", "1"), "--concurrency")
    assert_one_line_error(run_cli(*args, "--prefill-workers", "1", "--concurrency", "4"),
                          "--decode-workers")


def test_api_pd_latency_implies_the_counts(one):
    c = int(2.5 * slots(one))
    res = pd_latency("deepseek-r1", "h200", prefill={"tp": 8},
                     decode={"tp": 8, "max_num_seqs": 64}, weight_dtype="fp8",
                     max_model_len=4096, concurrency=c, input_len=2000, output_len=500,
                     check=False)
    want = implied_workers(one.prefill, one.decode, INP, OUT, c)
    assert (res.data["implied_workers"]["prefill"], res.data["implied_workers"]["decode"]) \
        == want
    with pytest.raises(InputError, match="concurrency"):
        pd_latency("deepseek-r1", "h200", prefill={"tp": 8}, decode={"tp": 8},
                   weight_dtype="fp8", max_model_len=4096, rate=1.0)
