"""Disaggregated prefill/decode: KV transfer by hand, the pools' queue models, recommend."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capplan.catalog.loader import load_catalog
from capplan.models.disagg import INTER_NODE, kv_link, kv_transfer_s
from capplan.models.engine import EngineSettings
from capplan.models.queueing import LengthStats, Limits, QueueModel
from capplan.plan.deployment import resolve_deployment
from capplan.plan.disagg import decode_model, prefill_model
from capplan.plan.search import Traffic
from capplan.plan.slo import SloSet

KIB = 1024


@pytest.fixture(scope="module")
def dep():
    return resolve_deployment(load_catalog(()), "llama-3.1-8b", "h100-sxm",
                              EngineSettings(max_num_seqs=256, max_num_batched_tokens=8192))


def traffic(rate, inp, out):
    return Traffic(rate, LengthStats.fixed(inp), LengthStats.fixed(out), 1.0, SloSet(), ("x",))


def test_kv_bytes_and_transfer_by_hand(dep):
    # Llama-3.1-8B, bf16 KV: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 128 KiB
    per_token = dep.memory.kv_bytes_per_token_per_gpu
    assert per_token == 32 * 8 * 128 * 2 * 2 == 128 * KIB
    # 4096 tokens = 512 MiB: over a 50 GB/s NIC 10.737 ms + 10 us latency
    t = float(kv_transfer_s(4096, per_token, INTER_NODE))
    assert t == pytest.approx(4096 * 128 * KIB / 50e9 + 10e-6, rel=1e-12)
    assert t == pytest.approx(0.010747, abs=1e-6)
    # within the node, H100 NVLink 4 at 450 GB/s per direction: 1.193 ms + 10 us
    nv = kv_link(dep.gpu.interconnect.bytes_per_s, same_domain=True)
    assert float(kv_transfer_s(4096, per_token, nv)) == pytest.approx(0.0011930 + 10e-6,
                                                                       abs=1e-6)


def test_the_decode_pool_never_carries_a_prefill_chunk(dep):
    # At the same rate, an aggregated replica's TBT tail holds prefill chunks of 4000-token
    # prompts; the decode pool computes one token per new request, so its p99 gap stays near
    # the pure decode step.
    t = traffic(2.0, 4000, 200)
    agg = QueueModel(dep.step, t.inp, t.out, Limits(256, 8192, dep.memory.kv_cache_tokens))
    a = agg.at_rate(2.0)
    d = decode_model(dep, t).at_rate(2.0)
    assert float(d["tbt_s"]["p99"]) < 0.6 * float(a["tbt_s"]["p99"])
    assert float(d["tbt_s"]["p99"]) == pytest.approx(float(d["decode_step_s"]), rel=0.05)


def test_the_prefill_pool_is_the_prompt_alone(dep):
    # One request alone on a prefill replica: TTFT = its prefill (4000 tokens in 8192-token
    # chunks: one step) + the request overhead + half a (tiny) step of residual.
    t = traffic(1e-6, 4000, 200)
    q = prefill_model(dep, t)
    r = q.at_rate(1e-6)
    one = float(dep.step.prefill_chunk(4000, 0.0, num_decode=0, decode_kv_tokens=0,
                                       detail=False)["step_s"])
    overhead = float(np.asarray(dep.step.request_overhead_s))
    assert float(r["ttft_s"]["mean"]) == pytest.approx(one + overhead, rel=0.05)


def test_recommend_compares_both_layouts_for_long_prompts(run_cli):
    res = run_cli("recommend", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--rate", "10",
                  "--input-len", "8000", "--output-len", "300", "--ttft-p99", "2",
                  "--tbt-p99", "0.05", "--verify-top", "0", "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = res.json()["disaggregated"]
    assert d["winner"] in ("disaggregated", "aggregated")
    p, q = d["prefill"], d["decode"]
    assert d["ratio"] == f"{p['replicas']}:{q['replicas']}"
    # the plan meets the SLOs it was sized for
    assert d["ttft_p99_s"] <= 2.0 and d["tbt_p99_s"] <= 0.05
    # TTFT = prefill share + transfer + decode admission
    assert d["ttft_p99_s"] == pytest.approx(p["ttft_p99_s"] + d["kv_transfer_s"]["p99"]
                                            + q["ttft_p99_s"], rel=1e-9)
    # 8000 tokens x 320 KiB (80 layers x 8 KV heads x 128 x 2 x 2 bytes / TP) per decode GPU
    per_gpu = 80 * 8 * 128 * 2 * 2 / q["tp"]
    assert d["kv_transfer_s"]["mean"] == pytest.approx(
        d["kv_link_latency_s"] + 8000 * per_gpu / d["kv_link_bytes_per_s"], rel=1e-6)
    assert "NixlConnector" in d["launch"]["vllm_decode"]
    # lines for the planned engine only (vLLM here): another engine's line would carry
    # settings planned for this one
    assert not any(k.startswith("sglang") for k in d["launch"])
    text = run_cli("recommend", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--rate",
                   "10", "--input-len", "8000", "--output-len", "300", "--ttft-p99", "2",
                   "--tbt-p99", "0.05", "--verify-top", "0").stdout
    assert "disaggregated prefill/decode:" in text and " wins" in text
    assert math.isfinite(p["rate_per_replica_per_s"])


def test_a_kv_transfer_inside_a_pcie_node_is_named_pcie(run_cli):
    # L40S cards talk over PCIe 4.0 (the catalog: pcie4, 32 GB/s per direction): the KV moves
    # at that rate and is said to, not "over NVLink"; Llama-3.1-8B's 128 KiB per token x 1,000
    # prompt tokens / 32 GB/s = 4.1 ms, + 10 us
    d = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "l40s", "--rate", "5",
                "--input-len", "1000", "--output-len", "200", "--ttft-p99", "2", "--tbt-p99",
                "0.1", "--verify-top", "0", "--format", "json").json()["disaggregated"]
    assert d["kv_link"] == "PCIe 4.0" and d["kv_link_bytes_per_s"] == 32e9
    assert d["kv_transfer_s"]["mean"] == pytest.approx(1000 * 131072 / 32e9 + 10e-6, rel=1e-6)


def test_when_no_aggregated_fleet_meets_the_slos_a_pd_layout_that_does_is_named(run_cli):
    # DeepSeek-R1 on H100 under vLLM: chunked prompts stall every DP rank's decodes, so no
    # aggregated fleet of sensible size holds a TBT p99 of 80 ms; decode workers without
    # prompts do. The refusal names that layout as the fixed-layout flags `latency` takes;
    # fed back, they predict a stable layout within both SLOs
    import re

    load = ("--model", "deepseek-r1", "--rate", "10", "--input-len", "2000", "--output-len",
            "500")
    res = run_cli("recommend", *load, "--gpu", "h100", "--engine", "vllm", "--ttft-p99", "2",
                  "--tbt-p99", "0.08")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    m = re.search(r"`capplan latency` or `simulate` with (.*) predicts and replays it\)",
                  res.stderr)
    assert m, res.stderr
    d = run_cli("latency", *load, *m.group(1).split(), "--format", "json").json()
    assert d["stable"] and d["ttft_s"]["p99"] <= 2 and d["tbt_s"]["p99"] <= 0.08


PRICED = ("recommend", "--model", "llama-3.1-8b", "--rate", "20", "--input-len", "1024",
          "--output-len", "256", "--ttft-p99", "1", "--tbt-p99", "0.05", "--verify-top", "0",
          "--format", "json")


def test_the_pd_pools_are_costed_at_the_users_price(run_cli):
    # --price h100-sxm=10: every pool's GPU-hour costs $10, as the aggregated fleet's does.
    # By hand: the P/D layout's cheapest pools are 1 prefill + 1 decode GPU = 2 x $10 = $20/h
    # against one aggregated GPU at $10/h, so the aggregated fleet wins (at the catalog's
    # $3.78 the pools were costed $7.56/h and the P/D layout "won" at twice the bill).
    d = run_cli(*PRICED, "--gpu", "h100-sxm", "--price", "h100-sxm=10").json()
    g = d["disaggregated"]
    for role in ("prefill", "decode"):
        assert g[role]["cost_per_hour"] == pytest.approx(10.0 * g[role]["gpus_total"])
    assert g["cost_per_hour"] == pytest.approx(10.0 * g["gpus_total"])
    assert d["recommendations"][0]["cost_per_hour"] == pytest.approx(10.0)
    assert g["gpus_total"] >= 2 and g["winner"] == "aggregated"


def test_a_gpu_priced_only_by_the_user_prices_its_pd_pools(run_cli):
    # b200 has no catalog price; --price b200=6 prices both layouts: pools at $6 a GPU-hour
    g = run_cli(*PRICED, "--gpu", "b200", "--price", "b200=6").json()["disaggregated"]
    assert g["cost_per_hour"] == pytest.approx(6.0 * g["gpus_total"])


def test_the_pd_pools_are_sized_with_the_calibration_given(run_cli, tmp_path):
    # A measured 50 ms step overhead: every decode step takes at least 50 ms, so the decode
    # pool's TBT p99 is >= 50 ms, as the aggregated fleet's (the pools took the default
    # calibration, ~10 ms steps, and compared them with a fleet sized on the file).
    cal = tmp_path / "cal.yaml"
    cal.write_text("version: 1\ngpu: h100-sxm\nkind: measured\n"
                   "params: {step_overhead_s: 0.05}\n")
    d = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "2",
                "--input-len", "1024", "--output-len", "256", "--ttft-p99", "2", "--tbt-p99",
                "0.3", "--verify-top", "0", "--calibration", str(cal), "--format",
                "json").json()
    assert d["recommendations"][0]["predicted"]["tbt_s"]["p99"] >= 0.05
    assert d["disaggregated"]["decode"]["tbt_p99_s"] >= 0.05


TPOT_LOAD = ("--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--engine", "trtllm",
             "--input-len", "1000", "--output-len", "200")


def test_no_pd_layout_is_named_for_a_tpot_under_every_decode_step(run_cli, catalog):
    # TPOT p99 2 ms: a request's mean gap is at least one decode step at batch 1, and the
    # fastest decode worker searched (any TP, or DP/EP, on H100 under TensorRT-LLM) takes more
    # than that (`latency --rate 0.001`: 7.4 ms at TP 8); the refusal named a P/D layout
    # "meeting" it (its decode pool sized for TBT alone, TPOT 23.5 ms)
    from capplan.plan.deployment import EngineOptions, resolve_deployment

    steps = []
    for tp, dp, ep in ((1, 1, 1), (2, 1, 1), (4, 1, 1), (8, 1, 1), (1, 8, 8)):
        dep = resolve_deployment(catalog, "qwen3-30b-a3b", "h100-sxm", EngineOptions(
            engine="trtllm", tp=tp, attention_dp=dp, expert_parallel=ep, max_model_len=4096))
        steps.append(float(np.asarray(dep.step.decode_step(1, 1100)["step_s"])))
    assert min(steps) > 0.002
    res = run_cli("recommend", *TPOT_LOAD, "--rate", "5", "--tpot-p99", "0.002")
    assert res.exit_code == 2
    assert "disaggregated layout meets them" not in res.stderr, res.stderr


def test_the_pd_decode_pool_is_sized_for_a_tpot_slo(catalog):
    # TPOT p99 12 ms at 15 req/s: the decode pool sized for TBT alone (1 x TP 1) replayed at
    # TPOT p99 30.9 ms; sized for TPOT, its replay (4,000 requests) meets 12 ms
    from capplan.plan.disagg import replay_disaggregated
    from capplan.plan.planner import _disaggregated_plan
    from capplan.plan.schema import PlanFile

    plan = PlanFile.model_validate({
        "model": "qwen3-30b-a3b", "candidates": {"gpus": ["h100-sxm"]},
        "engine": {"name": "trtllm"},
        "workloads": [{"name": "x", "rate_per_s": 15, "input_len": 1000, "output_len": 200,
                       "slo": {"ttft_p99_s": 0.5, "tpot_p99_s": 0.012}}]})
    lanes = list(plan.workloads)
    d = _disaggregated_plan(catalog, plan, catalog.resolve_model(plan.model), lanes, "h100-sxm")
    assert d is not None
    rep = replay_disaggregated(d, lanes, 4000)
    assert rep["ok"], rep["reason"]


def test_the_nearest_tpot_miss_is_the_replays_closest_and_its_hint_plans(run_cli):
    # TPOT p99 2 ms, no configuration near it: the replay's closest is TP 8 (`latency --rate
    # 0.001` by replay: TP 1 8.44 ms, TP 8 7.40 ms; the screen's analytic floor put TP 1
    # first at 7 ms, and its "loosen it to >= 8 ms" still exited 2). Checked here by the
    # replay of both at 1 req/s; the SLO the refusal gives then plans a fleet.
    import re

    def tpot(tp: str) -> float:
        res = run_cli("simulate", *TPOT_LOAD, "--tp", tp, "--rate", "1", "--requests", "1000",
                      "--max-model-len", "4096", "--format", "json")
        return res.json()["tpot_s"]["p99"]

    assert tpot("8") < tpot("1")
    res = run_cli("recommend", *TPOT_LOAD, "--rate", "5", "--tpot-p99", "0.002")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    m = re.search(r"the closest, h100-sxm TP (\d+) .* loosen it to >= ([\d.]+) ms", res.stderr)
    assert m and m.group(1) == "8", res.stderr
    ok = run_cli("recommend", *TPOT_LOAD, "--rate", "5", "--tpot-p99",
                 f"{float(m.group(2)) / 1e3:.6f}", "--no-disagg", "--format", "json")
    assert ok.exit_code == 0, ok.stderr


def test_the_replay_drops_a_prefill_replica_the_analytic_curve_over_sized(run_cli):
    # Llama-3.1-70B on H200 (SGLang), 8 req/s of 1,500 / 400 tokens, TTFT p99 1.5 s: the
    # analytic prefill curve over-predicts TTFT (1,017 ms for 3 x TP 2 against 556 ms in the
    # replay), so the screen sizes 3 prefill replicas (14 GPUs, $56/h); 2 meet the SLOs at
    # 9.6 req/s (the rate with the 20% headroom) in the replay: 12 GPUs, $48/h. Checked by an
    # independent replay of the recommended pools (another seed, 10,000 requests).
    load = ("--model", "llama-3.1-70b", "--gpu", "h200", "--engine", "sglang",
            "--input-len", "1500", "--output-len", "400")
    g = run_cli("recommend", *load, "--rate", "8", "--ttft-p99", "1.5", "--tbt-p99", "0.05",
                "--format", "json").json()["disaggregated"]
    assert g["winner"] == "disaggregated"
    assert g["prefill"]["replicas"] == 2 and g["replay"]["prefill_replicas_screened"] == 3
    assert g["gpus_total"] == 12 and g["cost_per_hour"] == pytest.approx(12 * 4.0)
    pools = []
    for role in ("prefill", "decode"):
        p = g[role]
        pools += [f"--{role}-workers", str(p["replicas"]), f"--{role}-tp", str(p["tp"]),
                  f"--{role}-max-num-seqs", str(p["max_num_seqs"]),
                  f"--{role}-max-num-batched-tokens", str(p["max_num_batched_tokens"])]
    sim = run_cli("simulate", *load, *pools, "--rate", "9.6", "--requests", "10000", "--seed",
                  "1", "--format", "json").json()
    assert sim["ttft_s"]["p99"] <= 1.5 and sim["tbt_s"]["p99"] <= 0.05, sim["ttft_s"]
