"""Attention data parallelism and expert parallelism (issue 11): memory, step time, GPU count.

Hand calculations are written out from gpt-oss-120b's config.json (36 layers, hidden 2880,
128 experts of intermediate 2880, 4 per token, gated: 3 matrices; MXFP4 experts at
0.5 B + one 1 B scale per 32 weights) and B200's catalog entry (NVLink5 900 GB/s).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.api import deployment
from capplan.models.engine import EngineSettings
from capplan.models.memory import param_counts, weight_bytes, weight_dtypes
from capplan.models.perf import step_parts
from tests.cli._asserts import assert_one_line_error

LAYERS, HIDDEN, EXPERTS, TOP_K, INTER = 36, 2880, 128, 4, 2880
EXPERT_PARAMS = 3 * HIDDEN * INTER  # gate, up, down of one expert in one layer: 24,883,200
MXFP4_BYTES = 0.5 + 1 / 32


@pytest.fixture(scope="module")
def dp2ep2():
    return deployment("gpt-oss-120b", "b200", attention_dp=2, expert_parallel=2)


@pytest.fixture(scope="module")
def plain():
    return deployment("gpt-oss-120b", "b200")


def test_gpus_per_replica_counts_dp(dp2ep2, plain):
    assert dp2ep2.gpus_per_replica == 2  # tp 1 x pp 1 x attention DP 2
    assert plain.gpus_per_replica == 1
    d = deployment("gpt-oss-120b", "b200", engine="sglang", tp=2, attention_dp=4,
                   expert_parallel=4)
    assert d.gpus_per_replica == 8


def test_expert_weights_split_over_the_world(dp2ep2, plain):
    # Each GPU holds 128 / 2 = 64 experts, unsliced (moe_tp = 1 x 2 / 2 = 1), in all 36 layers.
    assert dp2ep2.step.expert_bytes == pytest.approx(EXPERT_PARAMS * MXFP4_BYTES)  # 13,219,200
    want_expert_bytes = LAYERS * 64 * EXPERT_PARAMS * MXFP4_BYTES  # 30,457,036,800 B
    got = (plain.memory.weights_bytes_per_gpu - dp2ep2.memory.weights_bytes_per_gpu)
    assert got == pytest.approx(want_expert_bytes, rel=1e-12)  # the other half of the experts
    # KV: one pool per DP rank of the same per-GPU size order; the replica holds dp x it.
    assert dp2ep2.memory.replica_kv_cache_tokens == 2 * dp2ep2.memory.kv_cache_tokens
    assert dp2ep2.pool.num_blocks == 2 * dp2ep2.memory.num_gpu_blocks
    assert dp2ep2.limits.max_num_seqs == 2 * dp2ep2.settings.max_num_seqs


def _parts(dep, batch: float, ctx: float) -> tuple:
    # A pure decode step, full attention over ctx (window layers read min(ctx, window)).
    win = min(ctx, dep.step.window)
    x = (batch, batch * ctx, batch * win, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, batch)
    return step_parts(x, dep.step.constants(), True)


def test_dp2_ep2_decode_step_by_hand(dp2ep2, plain):
    s = dp2ep2.step
    batch, ctx = 64.0, 1000.0
    (_, dense_mem, expert_mem, kv_mem, dense_cmp, expert_cmp, _, comm, _, _, _) = _parts(
        dp2ep2, batch, ctx)
    # Experts: the global batch of 64 tokens routes 4 of 128 each; this GPU's 64 experts are
    # each hit with probability 1 - (1 - 4/128)^64.
    touched = 64 * (1 - (1 - TOP_K / EXPERTS) ** 64)  # 55.58 experts per layer
    assert expert_mem == pytest.approx(
        LAYERS * touched * EXPERT_PARAMS * MXFP4_BYTES / s.expert_bytes_per_s, rel=1e-9)
    # Expert FLOPs: 64 tokens x 4 experts x 2 x 24,883,200 x 36 layers, half on each GPU, at
    # the GEMM efficiency of rows = 64 x 4 / (2 x touched) tokens per expert, at the grouped
    # GEMMs' rate: the calibration's expert_gemm_frac of the dense GEMMs' (MXFP4 experts).
    flops = 64 * TOP_K * 2 * EXPERT_PARAMS * LAYERS / 2
    rows = 64 * TOP_K / (2 * touched)
    eff = rows / (rows + s.gemm_half_tokens)
    rate = s.gemm_flops_per_s * dp2ep2.calibration.expert_gemm_frac
    assert s.expert_flops_per_s == pytest.approx(rate, rel=1e-12)
    assert expert_cmp == pytest.approx(flops / (rate * eff), rel=1e-9)
    # All-gather + reduce-scatter of 64 x 2880 x 2 B over 2 GPUs, half crossing the link,
    # twice per MoE layer; TP 1 has no all-reduce of its own.
    link = 900e9 * dp2ep2.calibration.allreduce_bw_frac
    want_comm = (2 * LAYERS * dp2ep2.calibration.allreduce_latency_s
                 + 2 * LAYERS * 0.5 * 64 * HIDDEN * 2 / link)
    assert comm == pytest.approx(want_comm, rel=1e-9)
    # Attention and dense layers run on the rank's 32 tokens: as TP 1 at batch 32.
    (_, dm1, _, kv1, dc1, _, _, _, _, _, _) = _parts(plain, batch / 2, ctx)
    assert dense_mem == pytest.approx(dm1, rel=1e-12)
    assert kv_mem == pytest.approx(kv1, rel=1e-12)
    assert dense_cmp == pytest.approx(dc1, rel=1e-12)


def test_plain_layout_constants_are_neutral(plain):
    s = plain.step
    assert (s.attention_dp, s.expert_parallel, s.moe_comm_s_fixed, s.moe_comm_s_per_token) == (
        1, 1, 0.0, 0.0)


def _layouts():
    return st.sampled_from([(tp, dp, ep) for tp in (1, 2, 4, 8) for dp in (1, 2, 4, 8)
                            for ep in (1, 2, 4, 8, 16, 32, 64) if (tp * dp) % ep == 0])


MOE_MODELS = ("gpt-oss-120b", "gpt-oss-20b", "qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b",
              "qwen3-235b-a22b", "llama-4-scout")


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(MOE_MODELS), layout=_layouts())
def test_dp_ep_never_increase_weight_bytes_per_gpu(catalog, name, layout):
    tp, dp, ep = layout
    model = catalog.resolve_model(name).spec
    assert model.moe is not None
    if model.moe.num_experts % ep:
        return
    dt = weight_dtypes(model)
    base = param_counts(model, tp, 1)
    assert param_counts(model, tp, 1, 1, 1) == base  # equal to TP at dp = ep = 1
    lay = param_counts(model, tp, 1, dp, ep)
    assert weight_bytes(lay, dt) <= weight_bytes(base, dt) * (1 + 1e-12)
    # Expert weights per GPU are the total / (tp x dp) whatever the EP / MoE-TP split.
    assert lay.experts * tp * dp == pytest.approx(base.experts * tp, rel=1e-12)
    assert lay.expert_size * tp * dp / ep == pytest.approx(base.expert_size * tp, rel=1e-12)


def test_engine_settings_world_size():
    s = EngineSettings(tp=2, attention_dp=4, expert_parallel=2)
    assert (s.world_size, s.moe_tp) == (8, 4)
    assert math.prod((s.tp, s.pp, s.attention_dp)) == 8


@pytest.mark.parametrize(("args", "fragment"), [
    (("--model", "llama-3.1-8b", "--gpu", "h100", "--expert-parallel", "2"), "is dense"),
    (("--model", "gpt-oss-120b", "--gpu", "b200", "--expert-parallel", "3",
      "--attention-dp", "3", "--engine", "sglang"), "must divide the 128 experts"),
    (("--model", "gpt-oss-120b", "--gpu", "b200", "--expert-parallel", "4",
      "--attention-dp", "2", "--engine", "sglang"), "must divide the tp x attention-dp = 2"),
    (("--model", "gpt-oss-120b", "--gpu", "b200", "--tp", "2", "--attention-dp", "2",
      "--expert-parallel", "2"), "vllm shards experts over all"),
    (("--model", "gpt-oss-120b", "--gpu", "b200", "--attention-dp", "0"), "--attention-dp"),
])
def test_layout_errors_are_one_line(run_cli, args, fragment):
    assert_one_line_error(run_cli("memory", *args), fragment)
    assert_one_line_error(run_cli("latency", *args, "--rate", "1"), fragment)


def test_memory_cli_reports_the_layout(run_cli):
    res = run_cli("memory", "--model", "gpt-oss-120b", "--gpu", "b200", "--attention-dp", "2",
                  "--expert-parallel", "2", "--format", "json")
    assert res.exit_code == 0, res.stderr
    data = res.json()
    assert (data["attention_dp"], data["expert_parallel"], data["gpus_per_replica"]) == (2, 2, 2)
    assert data["replica_kv_cache_tokens"] == 2 * data["kv_cache_tokens"]


def test_launch_lines_carry_the_layout(catalog):
    from types import SimpleNamespace

    from capplan.plan.flags import engine_flags
    from tests.plan.test_flags import parse_cmd, rec, sglang_flags, vllm_flags

    model = catalog.resolve_model("gpt-oss-120b").spec
    traffic = SimpleNamespace(inp=SimpleNamespace(mean=1000.0), out=SimpleNamespace(mean=300.0))
    lines = engine_flags(model, rec(tp=1, attention_dp=2, expert_parallel=2), traffic)
    v = vllm_flags(lines["vllm"])  # attention group TP 1, two DP engines, EP over both
    assert (v["--tensor-parallel-size"], v["--data-parallel-size"]) == ("1", "2")
    assert "--enable-expert-parallel" in v and v["--enable-expert-parallel"] is None
    s = sglang_flags(lines["sglang"])  # --tp is the world: 1 x 2 GPUs, split by --dp
    assert (s["--tp"], s["--dp"], s["--ep-size"]) == ("2", "2", "2")
    assert "--enable-dp-attention" in s
    t = parse_cmd(lines["trtllm"], 4)  # trtllm-serve MODEL --backend pytorch
    assert (t["--tp_size"], t["--ep_size"]) == ("2", "2")
    # one LLM-API options file (its content beside the line) holds enable_attention_dp
    opts = t["--extra_llm_api_options"]
    assert "enable_attention_dp: true" in lines[f"file:trtllm:{opts}"]
    plain = engine_flags(model, rec(tp=2), traffic)
    assert "--data-parallel-size" not in plain["vllm"] and "--dp" not in plain["sglang"]


PLAN = """version: 1
model: openai/gpt-oss-120b
candidates: {{gpus: [b200], tp: [1]}}
engine: {{{engine}}}
workloads:
  - {{name: chat, rate_per_s: 2, input_len: 1000, output_len: 200,
     slo: {{ttft_p99_s: 2.0, tbt_p99_s: 0.1}}}}
"""


@pytest.mark.parametrize(("engine", "fragment"), [
    ("attention_dp: 2", "engine.attention_dp 2: recommend and plan choose layouts"),
    ("expert_parallel: 0", "expert_parallel"),
    ("attention_db: 2", "attention_dp"),  # unknown key: names the nearest valid one
])
def test_plan_file_layout_keys(run_cli, tmp_path, engine, fragment):
    p = tmp_path / "plan.yaml"
    p.write_text(PLAN.format(engine=engine))
    assert_one_line_error(run_cli("plan", str(p), "--no-verify"), fragment)


def test_expert_gemm_frac_slows_quantized_experts_only(plain):
    # A calibration's expert_gemm_frac scales the grouped-GEMM rate of quantized experts
    # (gpt-oss-120b's MXFP4): at 0.25 a prefill chunk's expert compute takes 4x as long, the
    # dense part and the weight reads are unchanged. 16-bit experts (Qwen3-30B-A3B in bf16)
    # keep the dense GEMM rate.
    from capplan.catalog.loader import load_catalog
    from capplan.models.perf import build_step_model

    cat = load_catalog()
    gpu = cat.gpu("b200")
    cal = plain.calibration.with_(expert_gemm_frac=0.25)
    slow = build_step_model(plain.model, gpu, plain.settings, cal)
    x = (0.0, 0.0, 0.0, 4096.0, 4096.0 * 4097 / 2, 4096.0 * 4097 / 2, 0.0, 0.0, 1.0, 1.0)
    base = step_parts(x, plain.step.constants(), True)
    quarter = step_parts(x, slow.constants(), True)
    assert quarter[5] == pytest.approx(4 * base[5], rel=1e-12)  # expert_cmp
    assert quarter[4] == base[4] and quarter[2] == base[2]  # dense_cmp, expert_mem
    assert quarter[0] > base[0]
    bf16 = cat.model("qwen3-30b-a3b")
    s16 = EngineSettings(tp=1, weight_dtype="bf16")
    a = build_step_model(bf16, gpu, s16, plain.calibration)
    b = build_step_model(bf16, gpu, s16, cal)
    assert b.expert_flops_per_s == a.expert_flops_per_s == a.gemm_flops_per_s
