"""Replicas beyond one node (issue 26): each engine's notation mapped to GPUs, the scale-out
network, TP across nodes and DeepEP's expert-parallel all-to-all, by hand.

Numbers written out from the configs (DeepSeek-V3: hidden 7168, 8 of 256 routed experts per
token, 58 MoE layers; Llama-3.1-405B: 126 layers, hidden 16384, 128 heads, 8 KV heads of 128,
intermediate 53248, vocab 128256) and H100 SXM's catalog entry (NVLink 450 GB/s per GPU, 8 per
node; one 400 Gb/s NIC = 50 GB/s per GPU, 10 us).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.api import deployment
from capplan.models.layout import (
    Links,
    describe,
    ep_all_to_all,
    ep_all_to_all_normal,
    p_touched,
    tp_from_engine_notation,
)
from capplan.models.perf import step_parts
from tests.cli._asserts import assert_one_line_error

H100_NVLINK, H100_NET, NET_LAT = 450e9, 50e9, 10e-6


# --- notation -------------------------------------------------------------------------------

@pytest.mark.parametrize(("engine", "tp", "dp", "want_tp"), [
    ("sglang", 8, 8, 1),     # --tp 8 --enable-dp-attention --dp 8: 8 GPUs, attention TP 1
    ("sglang", 16, 4, 4),    # 16 GPUs, 4 ranks of 4
    ("sglang", 1, 8, 1),     # ranks of one GPU: the same 8 GPUs
    ("trtllm", 8, 8, 1),     # tensor_parallel_size 8 + enable_attention_dp
    ("vllm", 2, 4, 2),       # --tensor-parallel-size 2 --data-parallel-size 4: 8 GPUs
    ("sglang", 8, 1, 8),
])
def test_engine_notation_maps_to_gpus_once(engine, tp, dp, want_tp):
    assert tp_from_engine_notation(engine, tp, dp) == want_tp


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_sglang_tp8_dp8_is_8_gpus(run_cli, engine):
    args = ("memory", "--engine", engine, "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8",
            "--attention-dp", "8", "--expert-parallel", "8")
    res = run_cli(*args, "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = res.json()
    assert (d["gpus_per_replica"], d["nodes_per_replica"]) == (8, 1)
    assert d["layout"] == "8 GPUs: attention TP 1 x DP 8, EP 8"
    table = run_cli(*args)
    assert "deepseek-v3 on h200 (8 GPUs: attention TP 1 x DP 8, EP 8)" in table.stdout


def test_footer_never_says_tp1_for_8_gpus(run_cli):
    res = run_cli("memory", "--engine", "sglang", "--model", "gpt-oss-120b", "--gpu", "h100",
                  "--tp", "1", "--attention-dp", "8")
    assert res.exit_code == 0, res.stderr
    assert "(8 GPUs: attention TP 1 x DP 8)" in res.stdout
    assert "(TP 1" not in res.stdout


def test_vllm_dp_multiplies(run_cli):
    res = run_cli("memory", "--model", "gpt-oss-120b", "--gpu", "h100", "--tp", "2",
                  "--attention-dp", "4", "--format", "json")
    assert res.json()["gpus_per_replica"] == 8


@pytest.mark.parametrize(("args", "fragment"), [
    (("--engine", "sglang", "--tp", "6", "--attention-dp", "4"), "multiple of --dp"),
    (("--engine", "trtllm", "--tp", "8", "--attention-dp", "4"), "enable_attention_dp"),
])
def test_notation_errors_are_one_line(run_cli, args, fragment):
    assert_one_line_error(run_cli("memory", "--model", "gpt-oss-120b", "--gpu", "h100", *args),
                          fragment)


def test_no_network_keeps_one_node(run_cli):
    # L40S has no scale-out network in the catalog: a 16-GPU TP group is refused, by name.
    assert_one_line_error(run_cli("memory", "--model", "llama-3.1-70b", "--gpu", "l40s",
                                  "--tp", "16"), "no scale-out")


def test_describe():
    assert describe(16, 1, 1, 1, 8) == "16 GPUs over 2 nodes: TP 16"
    assert describe(1, 1, 1, 1, 8) == "1 GPU: TP 1"
    assert describe(4, 2, 1, 1, 72) == "8 GPUs: TP 4, PP 2"


# --- DeepEP all-to-all, DeepSeek-V3 at EP 16 over two H100 nodes ----------------------------

def _links(frac: float = 1.0, lat: float = 8e-6) -> Links:
    return Links(H100_NVLINK * frac, lat, H100_NET * frac, NET_LAT, 8)


def test_ep16_all_to_all_bytes_and_time_by_hand():
    a = ep_all_to_all(7168, 8, 16, _links())
    # FP8 dispatch: 7168 B + 7168 / 128 fp32 scales = 7392 B per expert copy; BF16 combine.
    assert (a.dispatch_bytes_per_copy, a.combine_bytes_per_copy) == (7392, 14336)
    # 8 of 16 EP ranks are on the other node: half of a token's 8 copies cross the NIC,
    # 7 of 16 go to the other GPUs of its own node.
    assert (a.network_copies, a.nvlink_copies) == (4.0, 8 * 7 / 16)
    # 128 tokens per GPU (DeepEP's decode setting): 128 x 8 x 1/2 x 7392 = 3,784,704 B out,
    # 128 x 8 x 1/2 x 14336 = 7,340,032 B back, at 50 GB/s: 75.69 us + 146.80 us.
    assert 128 * a.network_copies * 7392 == 3_784_704
    assert 128 * a.s_per_token_per_gpu == pytest.approx((3_784_704 + 7_340_032) / 50e9,
                                                        rel=1e-12)
    assert a.latency_s == 2 * NET_LAT


def test_ep16_all_to_all_against_deepep_measurement():
    # deepseek-ai/DeepEP docs/legacy.md, low-latency kernels on H800 + CX7 400 Gb/s, 128 tokens,
    # hidden 7168, top-8, FP8 dispatch / BF16 combine, EP 16: dispatch 118 us + combine 195 us.
    # capplan's default achievable fraction (0.7 of the link) and latencies; 15% tolerance.
    a = ep_all_to_all(7168, 8, 16, _links(frac=0.7))
    predicted = a.latency_s + 128 * a.s_per_token_per_gpu
    assert predicted == pytest.approx(118e-6 + 195e-6, rel=0.15)


def test_imbalance_scales_the_busiest_rank():
    a, b = ep_all_to_all(7168, 8, 16, _links()), ep_all_to_all(7168, 8, 16, _links(),
                                                              imbalance=1.25)
    assert b.s_per_token_per_gpu == pytest.approx(1.25 * a.s_per_token_per_gpu, rel=1e-12)


# DeepEP's normal kernels (prefill): a token crosses the NIC once per other node holding one of
# its experts, then NVLink to each distinct GPU there. DeepSeek-V3's 256 experts lie in 8 groups
# of 32; a token's 8 experts lie in 4 groups drawn of the 8, 2 experts in each.
COPY = 7392 + 14336  # FP8 dispatch with scales + BF16 combine, bytes per copy


def test_ep16_normal_mode_bytes_and_time_by_hand(catalog):
    moe = catalog.model("deepseek-v3").moe
    a = ep_all_to_all_normal(7168, moe, 16, _links())
    # 2 nodes of 4 groups each: the other node is missed only when the 4 groups drawn are
    # its own node's 4: C(4,4) / C(8,4) = 1/70.
    assert a.network_copies == pytest.approx(1 - 1 / 70, rel=1e-12)
    # A GPU holds 16 experts, half a group: touched when its group is drawn (4/8) and one of
    # the group's 2 experts is its own: 1 - C(16,2) / C(32,2) = 1 - 120/496. Forwarded over
    # NVLink to the 14 GPUs not at the token's local index (16 less one per node).
    p_gpu = 4 / 8 * (1 - 120 / 496)
    assert a.nvlink_copies == pytest.approx(14 * p_gpu, rel=1e-12)
    # 128 tokens per GPU: 128 x 69/70 x 21,728 B = 2,741,453 B over the NIC at 50 GB/s,
    # 54.83 us (the low-latency kernels: 11,124,736 B, 222.49 us); NVLink 128 x 5.306 x
    # 21,728 B = 14.76 MB at 450 GB/s, 32.80 us: the NIC sets the time.
    assert 128 * a.network_copies * COPY == pytest.approx(2_741_453, abs=1)
    assert 128 * a.s_per_token_per_gpu == pytest.approx(54.829e-6, rel=1e-4)
    assert 128 * a.nvlink_copies * COPY / 450e9 == pytest.approx(32.80e-6, rel=1e-3)
    assert a.latency_s == 2 * NET_LAT


def test_ep32_normal_mode_bytes_and_time_by_hand(catalog):
    moe = catalog.model("deepseek-v3").moe
    a = ep_all_to_all_normal(7168, moe, 32, _links(frac=0.7))
    # 4 nodes of 2 groups each: a node is missed when the 4 groups drawn all lie in the other
    # 6: C(6,4) / C(8,4) = 15/70; 3 other nodes x 55/70 = 2.357 copies, not 8 x 24/32 = 6.
    assert a.network_copies == pytest.approx(3 * 55 / 70, rel=1e-12)
    # A GPU holds 8 experts, a quarter group: 4/8 x (1 - C(24,2) / C(32,2)) = 0.5 x 220/496;
    # 28 GPUs not at the token's local index.
    assert a.nvlink_copies == pytest.approx(28 * 0.5 * 220 / 496, rel=1e-12)
    # Per token and MoE layer: 2.357 x 21,728 B = 51,216 B at 0.7 x 50 GB/s = 1.4633 us;
    # 58 MoE layers: 84.87 us per prompt token (the low-latency count: 6 x 21,728 B, 216.04 us).
    assert a.network_copies * COPY == pytest.approx(51_216.0, abs=0.01)
    assert 58 * a.s_per_token_per_gpu == pytest.approx(84.87e-6, rel=1e-4)
    low = ep_all_to_all(7168, 8, 32, _links(frac=0.7))
    assert 58 * low.s_per_token_per_gpu == pytest.approx(216.04e-6, rel=1e-4)


def test_normal_mode_without_group_limit_is_plain_uniform(catalog):
    # Kimi-K2: 384 experts, 8 per token, no group limit. EP 16 over 2 nodes: the other node's
    # 192 experts all missed with probability C(192,8) / C(384,8).
    moe = catalog.model("kimi-k2").moe
    assert (moe.n_group, moe.topk_group) == (1, 1)
    miss = 1.0
    for i in range(8):
        miss *= (192 - i) / (384 - i)
    a = ep_all_to_all_normal(7168, moe, 16, _links())
    assert a.network_copies == pytest.approx(1 - miss, rel=1e-12)
    assert p_touched(384, moe) == 1.0  # a unit holding every expert
    # fewer distinct destinations than copies, never more
    assert a.network_copies < ep_all_to_all(7168, 8, 16, _links()).network_copies


def test_step_model_uses_the_all_to_all_across_nodes():
    # SGLang --tp 16 --enable-dp-attention --dp 16 --ep-size 16: 16 ranks of one GPU.
    d = deployment("deepseek-v3", "h100", engine="sglang", tp=16, attention_dp=16,
                   expert_parallel=16, max_model_len=32768, engine_notation=True)
    assert (d.settings.tp, d.gpus_per_replica, d.nodes) == (1, 16, 2)
    cal = d.calibration
    net = 50e9 * cal.allreduce_bw_frac
    # decode-only steps: the low-latency kernels, 4 of 8 copies cross the NIC
    low = 8 * 0.5 * COPY / net  # s per token sent
    assert d.step.moe_comm_s_per_token == pytest.approx(58 * low / 16, rel=1e-12)
    assert d.step.moe_comm_s_fixed == pytest.approx(58 * 2 * NET_LAT, rel=1e-12)
    # steps with prompt tokens: the normal kernels, 69/70 of a copy over the NIC
    normal = 69 / 70 * COPY / net
    assert d.step.moe_comm_s_per_token_prefill == pytest.approx(58 * normal / 16, rel=1e-12)
    assert d.step.moe_comm_s_fixed_prefill == pytest.approx(58 * 2 * NET_LAT, rel=1e-12)
    # the step picks the mode by its prompt tokens (10 tokens per GPU, 160 in all)
    c = d.step.constants()
    decode = (160.0, 160 * 1000.0, 160 * 1000.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 160.0)
    prefill = (0.0, 0.0, 0.0, 160.0, 160 * 80.5, 160 * 80.5, 0.0, 0.0, 1.0, 1.0)
    assert step_parts(decode, c, True)[7] == pytest.approx(58 * (2 * NET_LAT + 160 * low / 16),
                                                           rel=1e-12)
    assert step_parts(prefill, c, True)[7] == pytest.approx(
        58 * (2 * NET_LAT + 160 * normal / 16), rel=1e-12)


# --- a 2-node TP 16 replica: Llama-3.1-405B fp8 on H100 -------------------------------------

@pytest.fixture(scope="module")
def tp16():
    return deployment("llama-3.1-405b", "h100", tp=16, weight_dtype="fp8")


def test_tp16_two_nodes_memory_by_hand(tp16):
    assert (tp16.gpus_per_replica, tp16.nodes) == (16, 2)
    m = tp16.memory
    # Per layer and GPU: q and o 2 x 16384^2 / 16; k and v one replicated KV head each
    # (8 KV heads < 16 GPUs): 2 x 16384 x 128; MLP 3 x 16384 x 53248 / 16.
    layer = 2 * 16384 ** 2 / 16 + 2 * 16384 * 128 + 3 * 16384 * 53248 / 16  # 201,326,592
    fp8 = 126 * layer * 1.0
    bf16 = (2 * 128256 * 16384 / 16 + (2 * 126 + 1) * 16384) * 2.0  # vocab tables, norms
    assert m.weights_bytes_per_gpu == pytest.approx(fp8 + bf16, rel=1e-3)  # + fp8 scales
    # KV: 2 (K, V) x 1 head x 128 x 126 layers x 2 B = 64,512 B per token per GPU.
    assert m.kv_bytes_per_token_per_gpu == 64_512


def test_tp16_two_nodes_step_by_hand(tp16):
    s, cal = tp16.step, tp16.calibration
    nvl, net = H100_NVLINK * cal.allreduce_bw_frac, H100_NET * cal.allreduce_bw_frac
    # Hierarchical all-reduce of 16384 x 2 B per token: reduce-scatter + all-gather over
    # NVLink (2 x 7/8), the 1/8 shard across the two nodes over each GPU's NIC (2 x 1/2).
    per_byte = 2 * 7 / 8 / nvl + 2 * 1 / 2 / (8 * net)
    latency = 2 * cal.allreduce_latency_s + 2 * NET_LAT
    batch = 64
    want = 2 * 126 * (latency + batch * 16384 * 2 * per_byte)  # two per layer
    x = (batch, batch * 2048.0, batch * 2048.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, batch)
    comm = step_parts(x, s.constants(), False)[7]
    assert comm == pytest.approx(want, rel=1e-12)
    # TP 16 over two nodes spends more on all-reduces than TP 8 inside one, at the same batch.
    tp8 = deployment("llama-3.1-405b", "h100", tp=8, weight_dtype="fp8")
    assert comm > step_parts(x, tp8.step.constants(), False)[7]


# --- launch lines, one per node ------------------------------------------------------------

def test_multinode_launch_lines():
    from capplan.plan.launch_multinode import replica_launch

    # SGLang --tp 16 --enable-dp-attention --dp 16 --ep-size 16 over two H100 nodes
    d = deployment("deepseek-v3", "h100", engine="sglang", tp=16, attention_dp=16,
                   expert_parallel=16, max_model_len=32768, engine_notation=True)
    lines = replica_launch(d)
    sg = lines["sglang"]
    assert len(sg) == 2
    for rank, line in enumerate(sg):
        assert f"--nnodes 2 --node-rank {rank} --dist-init-addr NODE0_IP:5000" in line
        assert ("--tp 16 --enable-dp-attention --dp 16 --ep-size 16 --moe-a2a-backend deepep"
                in line)
        assert "--context-length 32768" in line and "--mem-fraction-static" in line
    # SGLang's own port, as a plan's line has it; the other ranks serve no HTTP (their --port
    # is unused)
    assert "--port 30000" in sg[0]
    # vLLM: 16 DP engines of TP 1, 8 per node; node 1 headless from rank 8
    v = lines["vllm"]
    assert "--data-parallel-size 16 " in v[0] and "--data-parallel-size-local 8 " in v[0]
    assert "--headless" in v[1] and "--data-parallel-start-rank 8" in v[1]
    assert all("--enable-expert-parallel" in x for x in v)  # EP 16 = the world of 16
    t = lines["trtllm"]
    # the all-to-all TensorRT-LLM's step model costs (DeepEP normal), exported to every rank
    assert t[0].startswith("any node: mpirun -x TRTLLM_FORCE_ALLTOALL_METHOD=DeepEP "
                           "-H NODE0_IP:8,NODE1_IP:8 -np 16 trtllm-llmapi-launch")


# --- recommend searches attention-DP / EP layouts and two-node worlds -----------------------

def test_moe_layouts_searched(catalog):
    from types import SimpleNamespace

    from capplan.plan.search import moe_layouts

    v3 = catalog.resolve_model("deepseek-v3").spec
    space = SimpleNamespace(engine="sglang", tps=(1, 2, 4, 8))
    # DP over every GPU of each world, EP over all of them; 16 = two H200 nodes (network)
    assert moe_layouts(v3, catalog.gpu("h200"), space) == [
        (1, 2, 2), (1, 4, 4), (1, 8, 8), (1, 16, 16)]
    assert moe_layouts(catalog.resolve_model("llama-3.1-8b").spec, catalog.gpu("h200"),
                       space) == []  # dense: plain TP only


def test_recommend_deepseek_sglang_weighs_dp_ep_layouts():
    import capplan.api as api

    r = api.recommend("deepseek-v3", rate=10, input_len=2000, output_len=500, ttft_p99_s=2,
                      tbt_p99_s=0.2, gpus=["h200"], engine="sglang", verify=False)
    recs = [x.to_dict() for x in r.recommendations]
    # DP x EP layouts are searched and printed with SGLang's notation
    dp16 = [d for d in recs if (d["attention_dp"], d["expert_parallel"]) == (16, 16)]
    assert dp16 and "--tp 16 --enable-dp-attention --dp 16 --ep-size 16" in \
        dp16[0]["engine_flags"]["sglang"]
    # Each prompt runs on one rank of one H200: a 2,000-token prompt step of a DP 16 replica
    # takes 87 ms, so at 10 req/s one replica's prompts hold ~87% of its steps and SGLang's
    # prefill-first steps starve its decoders; TP 8 spreads each prompt over 8 GPUs (59 ms) and
    # wins with fewer GPUs than any DP 16 plan
    best = recs[0]
    assert (best["tp"], best["attention_dp"]) == (8, 1)
    assert best["gpus_total"] < min(d["gpus_total"] for d in dp16)


def test_recommend_nearest_miss_has_numbers():
    # issue 26's acceptance (`recommend --model deepseek-v3 --gpu h200 --engine sglang --rate 10
    # --input-len 2000 --output-len 500 --ttft-p99 2 --tbt-p99 0.1`): a plan, or the nearest
    # miss with its numbers; a short verification keeps the test fast
    from capplan.api import run_plan
    from capplan.errors import InfeasibleError

    doc = {"model": "deepseek-v3", "candidates": {"gpus": ["h200"]},
           "engine": {"name": "sglang"}, "verify": {"top": 2, "requests": 300},
           "workloads": [{"name": "x", "rate_per_s": 10, "input_len": 2000, "output_len": 500,
                          "slo": {"ttft_p99_s": 2, "tbt_p99_s": 0.1}}]}
    try:
        res = run_plan(doc)
    except InfeasibleError as e:
        assert "nearest miss: h200" in str(e) and " ms > 100.0 ms" in str(e)
    else:
        assert res.recommendations[0].verified.ok
        assert all(r.verified is None or r.verified.ok for r in res.recommendations)


def test_nearest_miss_names_the_simulated_numbers(catalog):
    # every candidate dropped in simulation: the error carries the first one's numbers (the
    # verifier is the planner's VerifyFn hook; this one reports what a simulation would)
    from capplan.errors import InfeasibleError
    from capplan.plan.planner import run_plan
    from capplan.plan.result import Verification
    from capplan.plan.schema import PlanFile

    spec = PlanFile.model_validate({
        "model": "deepseek-v3", "candidates": {"gpus": ["h200"]}, "engine": {"name": "sglang"},
        "workloads": [{"name": "x", "rate_per_s": 10, "input_len": 2000, "output_len": 500,
                       "slo": {"ttft_p99_s": 2, "tbt_p99_s": 0.1}}]})

    def miss(job):  # noqa: ARG001
        return Verification(ok=False, reason="p99 TBT 121.3 ms > 100.0 ms", requests=1,
                            simulated={})

    with pytest.raises(InfeasibleError, match=r"nearest miss: h200 .*\(p99 TBT 121.3 ms > "
                                              r"100.0 ms\)"):
        run_plan(catalog, spec, miss)


def _deepseek_plan(tbt_p99_s: float = 0.1):
    from capplan.plan.schema import PlanFile

    return PlanFile.model_validate({
        "model": "deepseek-v3", "candidates": {"gpus": ["h200"]}, "engine": {"name": "sglang"},
        "verify": {"top": 3},
        "workloads": [{"name": "x", "rate_per_s": 10, "input_len": 2000, "output_len": 500,
                       "slo": {"ttft_p99_s": 2, "tbt_p99_s": tbt_p99_s}}]})


def test_replay_sizes_the_replicas_when_every_shortlisted_plan_misses(catalog):
    # A stand-in replay that passes a TP replica at up to 1.5 req/s and no attention-DP one:
    # the planner's analytic counts (5 TP 8 replicas for 10 req/s) miss, and the replay sizes
    # the plans. With the 20% headroom a replica is replayed at 1.2 x its share:
    # 10 x 1.2 / n <= 1.5 -> n >= 8, so 8 replicas.
    from capplan.plan.planner import run_plan
    from capplan.plan.result import Verification

    calls = []

    def replay(job):
        per = 10 / job.replicas if float(job.step.attention_dp) == 1 else 10.0
        calls.append(per)
        return Verification(ok=per <= 1.5 + 1e-9, reason="" if per <= 1.5 + 1e-9 else
                            f"p99 TBT {100 * per / 1.5:.1f} ms > 100.0 ms", requests=1,
                            simulated={"tbt_s": {"p99": 0.1 * per / 1.5}})

    res = run_plan(catalog, _deepseek_plan(), replay)
    assert res.recommendations
    for r in res.recommendations:
        assert r.replicas == 8 and r.verified.ok
        assert r.candidate.binding_constraint == "TBT SLO (replay)"
        assert r.candidate.max_rate_per_s == pytest.approx(1.5)  # 10 / 8 x 1.2
    assert any("sized by the replay at 8 replicas" in w for w in res.warnings)
    assert pytest.approx(10 * 1.2 / 7) in calls  # 7 replicas was replayed, and missed


def test_nearest_miss_is_the_one_closest_to_its_slos(catalog):
    # every replay misses, by an amount that differs between configurations: the error names
    # the smallest overshoot among the analytic counts' replays, not the first in rank order
    from capplan.errors import InfeasibleError
    from capplan.plan.planner import run_plan
    from capplan.plan.result import Verification

    first_round = []

    def replay(job):
        tbt = (0.2 + job.max_num_batched_tokens * 1e-6 + job.max_num_seqs * 1e-5
               + job.num_gpu_blocks * 1e-9)
        if isinstance(job.replicas, int):  # the analytic counts (the scale-out: n / 1.2)
            first_round.append(tbt)
        return Verification(ok=False, reason=f"p99 TBT {tbt * 1e3:.1f} ms > 200.0 ms",
                            requests=1, simulated={"tbt_s": {"p99": tbt}})

    with pytest.raises(InfeasibleError) as e:
        run_plan(catalog, _deepseek_plan(tbt_p99_s=0.2), replay)  # layouts the screen passes
    assert len(set(first_round)) > 1
    assert f"p99 TBT {min(first_round) * 1e3:.1f} ms" in str(e.value)
    assert "also with 4x its replicas" in str(e.value)


@settings(max_examples=40, deadline=None)
@given(engine=st.sampled_from(["vllm", "sglang", "trtllm"]),
       rank_tp=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([1, 2, 4, 8, 16]))
def test_notation_round_trip(engine, rank_tp, dp):
    # capplan's (tp per rank, dp) -> the engine's flags -> back: the same GPUs, once
    from capplan.models.layout import engine_world

    if engine == "trtllm" and dp > 1 and rank_tp != 1:
        return  # TensorRT-LLM's attention DP is attention TP 1
    w = engine_world(engine, rank_tp, dp)
    assert w["gpus"] == rank_tp * dp
    assert tp_from_engine_notation(engine, w["tp"], dp) == rank_tp


def test_a_gb200_worker_of_8_gpus_launches_on_its_two_hosts():
    from capplan.plan.launch_multinode import replica_launch

    # one NVLink domain of 72 GPUs, but 4 GPUs per compute tray (host): a TP 8 worker's engine
    # runs on 2 hosts, while its collectives stay on NVLink (one domain)
    d = deployment("deepseek-v3", "gb200", engine="sglang", tp=8, weight_dtype="fp8")
    sg = replica_launch(d)["sglang"]
    assert [f"--nnodes 2 --node-rank {k}" in line for k, line in enumerate(sg)] == [True, True]
    assert d.nodes == 1  # one NVLink domain: no scale-out network in its step
