"""The worker counts a closed loop implies when a P/D layout gives only the workers' layouts
(capplan.plan.pd.implied_workers; docs/disaggregation.md, "Worker counts")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capplan.api import disaggregated, pd_latency
from capplan.catalog.loader import load_catalog
from capplan.errors import InputError
from capplan.models.queueing import LengthStats
from capplan.plan.aiconfigurator import disagg_worker
from capplan.plan.pd import (
    RIDGE_STEP,
    WORKER_HEADROOM,
    PdModel,
    implied_workers,
    make_layout,
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


def test_ridge_batch_is_where_the_step_reaches_ridge_step(one):
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


def test_a_loop_below_its_peak_runs_on_the_peaks_workers(one):
    b = min(ridge_batch(one.decode, 2250.0, slots(one)), slots(one))
    peak = int(3.5 * b)
    want = implied_workers(one.prefill, one.decode, INP, OUT, peak)
    for c in (1, peak // 3, peak):
        assert implied_workers(one.prefill, one.decode, INP, OUT, c,
                               peak_concurrency=peak) == want
    assert implied_workers(one.prefill, one.decode, INP, OUT, 1)[1] == 1  # sized for C = 1
    with pytest.raises(InputError, match="peak-concurrency"):
        implied_workers(one.prefill, one.decode, INP, OUT, peak, peak_concurrency=peak - 1)


ROW_229 = {"backend": "trtllm", "model_path": "deepseek-ai/DeepSeek-V3", "system": "gb200",
           "precision": "fp4", "isl": "8192", "osl": "1024",
           **{f"prefill_{k}": v for k, v in (("tp_size", "4"), ("pp_size", "1"),
                                             ("attention_dp_size", "1"), ("moe_ep_size", "4"),
                                             ("batch_size", ""))},
           **{f"decode_{k}": v for k, v in (("tp_size", "8"), ("pp_size", "1"),
                                            ("attention_dp_size", "1"), ("moe_ep_size", "8"),
                                            ("batch_size", ""))}}
"""AIConfigurator's configuration 229 (../shared/validation/silicon_sample.csv, rows
dsr1_gb200_trtllm_fp4_disagg_8192x1024_c*_cfg229): DeepSeek fp4 on GB200, prefill workers TP 4
EP 4, decode workers TP 8 EP 8, 8,192 / 1,024 tokens, measured at C = 3 to 102 on the same
1 prefill and 3 decode workers; as the rows without counts give it (no batch sizes)."""


def test_a_measured_deployments_counts_from_its_peak():
    # the measured deployment ran 1 prefill and 3 decode workers at every C of its sweep, the
    # largest 102 (34 sequences a decode worker). By the rule: the worker's ridge batch (its
    # step 2.4 x the one-sequence step) lies between 34 and 50 sequences, so 102 clients need
    # ceil(102 / ridge) = 3 workers (2 would hold 51 each, past the ridge); their cycle rate
    # 102 / (1,024 x TPOT) is carried by one prefill worker with 20% spare
    cat = load_catalog()
    pre, dec = disagg_worker(cat, ROW_229, "prefill"), disagg_worker(cat, ROW_229, "decode")
    inp, out = LengthStats.fixed(8192), LengthStats.fixed(1024)
    ridge = ridge_batch(dec, 8192 + 512, PdModel(make_layout(pre, 1, dec, 1), inp,
                                                  out).decode_slots())
    assert 34 <= ridge < 51
    for c in (3, 24, 102):
        assert implied_workers(pre, dec, inp, out, c, peak_concurrency=102) == (1, 3)
    # sized for its own C instead, the smallest loop of the sweep gets one decode worker
    assert implied_workers(pre, dec, inp, out, 3) == (1, 1)


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
    # sized for a peak: the peak's counts, answered at C
    peak = 2 * c
    data = run_cli(*args, "--concurrency", str(c), "--peak-concurrency", str(peak),
                   "--format", "json").json()
    want = implied_workers(one.prefill, one.decode, INP, OUT, peak)
    assert (data["implied_workers"]["prefill"], data["implied_workers"]["decode"]) == want
    assert data["implied_workers"]["peak_concurrency"] == peak
    assert_one_line_error(run_cli(*args, "--concurrency", str(c), "--peak-concurrency",
                                  str(c - 1)), "--peak-concurrency")
    assert_one_line_error(run_cli(*args, "--prefill-workers", "1", "--decode-workers", "1",
                                  "--concurrency", "4", "--peak-concurrency", "8"),
                          "--peak-concurrency")


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
    res = pd_latency("deepseek-r1", "h200", prefill={"tp": 8},
                     decode={"tp": 8, "max_num_seqs": 64}, weight_dtype="fp8",
                     max_model_len=4096, concurrency=c, peak_concurrency=2 * c,
                     input_len=2000, output_len=500, check=False)
    want = implied_workers(one.prefill, one.decode, INP, OUT, 2 * c)
    assert (res.data["implied_workers"]["prefill"], res.data["implied_workers"]["decode"]) \
        == want
    with pytest.raises(InputError, match="peak_concurrency"):
        pd_latency("deepseek-r1", "h200", prefill_workers=1, decode_workers=1,
                   prefill={"tp": 8}, decode={"tp": 8}, weight_dtype="fp8",
                   max_model_len=4096, concurrency=4, peak_concurrency=8, check=False)
