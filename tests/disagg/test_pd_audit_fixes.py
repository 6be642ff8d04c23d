"""Fixed P/D layouts as the P/D audit left them: a closed-loop replay never holds more requests
than clients (or withholds what an unsettled one would misstate), the search's pools are
latency's, a trace's load and verdict kept, the unmeetable-SLO refusal's rates, simulate's
launch lines, the analytic answer's contract keys, one meaning of the prefill stage, and the
decode pool's flags in its errors."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from capplan.api import disaggregated, pd_latency
from capplan.errors import InfeasibleError
from capplan.models.queueing import LengthStats
from capplan.plan import disagg, pd_sim
from capplan.plan.launch_multinode import pd_launch
from capplan.plan.pd import PdModel, make_layout, role_pool
from capplan.plan.pd_sim import PdLoad, benchmark_replay, pd_requests, spec_of
from capplan.plan.planner import run_plan
from capplan.plan.search import Traffic
from capplan.plan.slo import SloSet
from capplan.sim.pd import replay_pd

LAYOUT = {"prefill_workers": 1, "decode_workers": 2}
SIM = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prefill-workers", "1",
       "--decode-workers", "2", "--max-model-len", "8192", "--input-len", "512",
       "--output-len", "64")


@pytest.fixture(scope="module")
def layout():
    return disaggregated("llama-3.1-8b", "h100-sxm", max_model_len=8192, **LAYOUT)


def _most_in_flight(sent: np.ndarray, finished: np.ndarray) -> int:
    """By hand: at each sending time, the requests sent by then (ties included) that have not
    finished by then."""
    return max(int(np.sum((sent <= t) & (finished > t))) for t in sent)


def test_a_closed_loop_replay_stops_only_within_its_clients(layout):
    # 8 clients, 96 requests: 12 rounds. A pass short of the fixed point sends requests before
    # the completion their client waits for; the means can hold still on such a pass, so the
    # means-settled stop (5% here, loose) takes only a pass holding at most C
    c = 8
    reqs, _ = pd_requests(layout, PdLoad(concurrency=c, input_len="512", output_len="64",
                                         requests=96))
    run = replay_pd(spec_of(layout), reqs, means_settled=0.05)
    assert run.settled
    assert _most_in_flight(run.sent_at_s, run.finished_at_s) <= c
    assert run.max_in_flight == _most_in_flight(run.sent_at_s, run.finished_at_s)


def test_an_unsettled_benchmark_replay_gives_means_only(layout, monkeypatch):
    # three passes cannot settle 12 rounds: the last pass holds more than C requests, so its
    # quantiles and KV peaks (a heavier load's) are withheld and the answer says why
    c = 8
    monkeypatch.setattr(pd_sim, "BENCH_MAX_PASSES", 3)
    monkeypatch.setattr(pd_sim, "BENCH_PASS_TOKENS", 0)  # no passes past the 3
    res = benchmark_replay(layout, c, "512", "64", 96)
    assert not res["replay_settled"] and res["max_in_flight"] > c
    for key in ("ttft_s", "tbt_s", "tpot_s", "e2e_s"):
        assert res[key]["mean"] > 0 and res[key]["p99"] is None and res[key]["p50"] is None
    assert res["kv_peak_utilization"] is None
    assert all(p["kv_peak_utilization"] is None for p in res["pools"].values())
    assert f"{res['max_in_flight']} requests in flight for {c} clients" in res["replay_note"]


def test_the_benchmark_replay_runs_to_its_fixed_point_where_passes_are_cheap(layout):
    # 50 M decoded tokens in all, the first 12 passes included: passes of 0.5 M tokens (64
    # clients x 1,000 requests of 500 tokens) may run 100, of 10 M tokens only the 12; never
    # past MAX_PASSES
    assert pd_sim.bench_max_passes(0.5e6) == 100
    assert pd_sim.bench_max_passes(1e7) == pd_sim.BENCH_MAX_PASSES == 12
    assert pd_sim.bench_max_passes(1.0) == 400
    # 8 clients, 96 requests of 64 tokens: settled, within its clients
    res = benchmark_replay(layout, 8, "512", "64", 96)
    assert res["replay_settled"] and res["max_in_flight"] <= 8
    assert res["kv_peak_utilization"] > 0 and res["ttft_s"]["p99"] >= res["ttft_s"]["p50"]


def test_the_search_models_a_prefill_pool_as_latency_does():
    # DeepSeek-V3 on one H200 node (SGLang, TP 8), 2,000 / 500 tokens at 10 req/s: the P/D
    # search's prefill replica and latency's prefill worker are one queue model (pd.pool_queue),
    # so their capacity and TTFT p99 at 10 req/s are the same figures
    lay = disaggregated("deepseek-v3", "h200", engine="sglang", max_model_len=8192,
                        prefill_workers=1, decode_workers=1, prefill={"tp": 8},
                        decode={"tp": 8, "attention_dp": 8, "expert_parallel": 8},
                        engine_notation=True)
    inp, out = LengthStats.fixed(2000.0), LengthStats.fixed(500.0)
    model = PdModel(lay, inp, out)
    t = Traffic(10.0, inp, out, 1.0, SloSet.of({}), ("x",))
    pre = role_pool(lay.prefill, "prefill")
    assert pre is lay.prefill or pre.settings == lay.prefill.settings
    (cap,) = disagg._capacities([pre], t, "prefill")
    assert cap == pytest.approx(model.capacity["prefill"], rel=1e-9)
    search = disagg._stacked([pre], t, "prefill").at_rate(np.array([[10.0]]), {"ttft_s"})
    assert float(search["ttft_s"]["p99"][0, 0]) == pytest.approx(
        float(model.qp.at_rate(10.0, {"ttft_s"})["ttft_s"]["p99"]), rel=1e-9)


def test_a_trace_on_a_layout_keeps_its_load_unit_and_saturation(tmp_path, run_cli):
    # 60 requests 5 time units apart: 5 ms apart (200 req/s) saturates both pools of one
    # Llama-3.1-8B prefill and one decode GPU (capacities ~105 and ~121 req/s); 5 s apart
    # (0.2 req/s) is light
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n"
                     + "".join(f"{i * 5},512,128\n" for i in range(60)))
    fast = pd_latency("llama-3.1-8b", "h100-sxm", prefill_workers=1, decode_workers=1,
                      max_model_len=8192, trace=str(trace), time_unit="ms").data
    assert fast["load"].startswith(f"trace {trace}: 60 requests over 0.295 s")
    caps = fast["capacity_by_pool_requests_per_s"]
    assert caps["prefill"] < 200 and caps["decode"] < 200
    assert not fast["stable"] and fast["saturated_pools"] == ["prefill", "decode"]
    assert "the decode pool is saturated: 200 req/s exceeds" in fast["reason"]
    assert fast["analytic_check"]["analytic_saturated_pools"] == ["prefill", "decode"]
    assert "differs by more than" not in fast["answered_by"]
    args = ("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prefill-workers",
            "1", "--decode-workers", "1", "--max-model-len", "8192", "--trace", str(trace),
            "--format", "json")
    slow = run_cli(*args, "--time-unit", "s").json()
    assert "over 295 s" in slow["load"] and slow["stable"]
    assert slow["requests_per_s"] == pytest.approx(60 / 295, rel=0.05)


class _Never:
    """A stand-in replay that misses every rate: nothing is ever confirmed."""

    def __call__(self, job):
        from capplan.plan.result import Verification

        rate = sum(ln.rate_per_s for ln in job.lanes) / job.replicas
        return Verification(ok=False, reason=f"p99 TTFT 2000.0 ms > 105.0 ms at {rate:.4g}",
                            requests=job.requests, rate_per_s=rate,
                            simulated={"ttft_s": {"p99": 2.0}, "tbt_s": {"p99": 0.02}})


def test_the_refusal_never_calls_a_missed_rate_confirmed(catalog):
    from capplan.plan.schema import PlanFile

    plan = PlanFile.model_validate({
        "model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
        "verify": {"top": 1},
        "workloads": [{"name": "x", "rate_per_s": 20.0, "input_len": 1024, "output_len": 256,
                       "slo": {"ttft_p99_s": 0.105}}]})
    with pytest.raises(InfeasibleError) as err:
        run_plan(catalog, plan, _Never())
    text = str(err.value)
    assert "near its latency floor" in text and "confirms" not in text
    m = re.search(r"which no replay confirmed: it missed the SLOs at (\d+) replica\(s\), each "
                  r"at ([\d.]+) req/s with the headroom", text)
    assert m, text
    assert float(m.group(2)) == pytest.approx(20.0 * 1.2 / int(m.group(1)), rel=1e-2)


def test_simulate_on_a_layout_prints_latencys_launch_lines(layout, run_cli):
    sim = run_cli("simulate", *SIM, "--rate", "4", "--requests", "40", "--format", "json")
    lat = run_cli("latency", *SIM, "--rate", "4", "--format", "json")
    assert sim.exit_code == 0 and lat.exit_code == 0, sim.stderr + lat.stderr
    assert sim.json()["launch"] == lat.json()["launch"] == pd_launch(layout)
    table = run_cli("simulate", *SIM, "--rate", "4", "--requests", "40").stdout
    assert "launch (one line per host" in table and table.count("vllm serve") == 3


def test_the_analytic_answer_carries_the_contract_keys(layout):
    # 4 req/s over 2 decode workers: Little's law, 2 req/s per worker x its time in decode
    # (E2E - TTFT, plus the step emitting the first token)
    from capplan.plan.load import load_spec_from_options
    from capplan.plan.pd import pd_latency as analytic

    load = load_spec_from_options(4.0, None, None, "512", "64", 1.0, 8192)
    res = analytic(layout, load)
    assert res["preemptions"] == 0 and 0 < res["kv_peak_utilization"] < 1
    decode_s = res["e2e_s"]["mean"] - res["ttft_s"]["mean"] + res["tpot_s"]
    assert res["mean_running_batch"] == pytest.approx(2.0 * decode_s, rel=0.05)
    assert "Little's law" in res["occupancy_source"]
    api = pd_latency("llama-3.1-8b", "h100-sxm", max_model_len=8192, rate=4.0,
                     input_len=512, output_len=64, **LAYOUT).data
    assert {"mean_running_batch", "preemptions", "kv_peak_utilization"} <= set(api)


def test_the_prefill_stage_means_the_same_in_latency_and_simulate(layout):
    # TTFT = prefill stage + the request overhead (once) + KV transfer + decode admission, in
    # the analytic answer and in the replay alike (the pool rows leave the overhead out)
    from capplan.plan.load import load_spec_from_options
    from capplan.plan.pd import pd_latency as analytic

    res = analytic(layout, load_spec_from_options(4.0, None, None, "512", "64", 1.0, 8192))
    overhead = float(np.asarray(layout.prefill.step.request_overhead_s))
    assert overhead > 0 and res["request_overhead_s"] == overhead
    p, d = res["pools"]["prefill"], res["pools"]["decode"]
    assert res["ttft_s"]["mean"] == pytest.approx(
        p["ttft_s"]["mean"] + overhead + res["kv_transfer_s"]["mean"] + d["admission_s"]["mean"],
        rel=1e-9)
    reqs, _ = pd_requests(layout, PdLoad(rate=4.0, input_len="512", output_len="64",
                                         requests=40))
    sim = pd_sim.simulate_pd(layout, reqs)
    sp, sd = sim["pools"]["prefill"], sim["pools"]["decode"]
    assert sim["request_overhead_s"] == overhead
    assert sim["ttft_s"]["mean"] == pytest.approx(
        sp["ttft_s"]["mean"] + overhead + sim["kv_transfer_s"]["mean"]
        + sd["admission_s"]["mean"], rel=1e-9)
    # the two prefill stages are one quantity: at 2 req/s per GPU, within 25% of each other
    assert math.isclose(p["ttft_s"]["mean"], sp["ttft_s"]["mean"], rel_tol=0.25)


def test_a_decode_pool_layout_error_names_the_decode_flags(run_cli):
    r = run_cli("latency", "--model", "deepseek-r1", "--gpu", "h100-sxm", "--weight-dtype",
                "fp8", "--engine", "sglang", "--max-model-len", "4096", "--prefill-workers",
                "2", "--prefill-tp", "16", "--decode-workers", "1", "--decode-tp", "16",
                "--decode-attention-dp", "3", "--rate", "4")
    assert r.exit_code != 0
    assert "decode pool: --decode-tp 16 --decode-attention-dp 3: SGLang's --tp" in r.stderr


def test_make_layout_is_what_the_search_pairs():
    # plan/disagg's decode and prefill models are pd.pool_queue's: one QueueModel each
    lay = disaggregated("llama-3.1-8b", "h100-sxm", max_model_len=8192, **LAYOUT)
    t = Traffic(4.0, LengthStats.fixed(512.0), LengthStats.fixed(64.0), 1.0, SloSet.of({}),
                ("x",))
    for role, q in (("prefill", disagg.prefill_model(lay.prefill, t)),
                    ("decode", disagg.decode_model(lay.decode, t))):
        model = PdModel(make_layout(lay.prefill, 1, lay.decode, 1), t.inp, t.out)
        assert q.pack_prompts and float(q.capacity_rate()) == pytest.approx(
            model.capacity[role], rel=1e-9)
