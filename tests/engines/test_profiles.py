"""Engine profiles: each engine's memory rule, defaults and scheduler, with hand calculations,
and the one-line errors for engines and options that do not exist."""

from __future__ import annotations

import pytest

from capplan.errors import InputError
from capplan.models.engine import PROFILES, SGLANG, TRTLLM, VLLM, engine_profile
from capplan.plan.deployment import EngineOptions, resolve_deployment, resolve_settings
from capplan.units import GIB_BYTES

MIB = 2**20


def test_every_profile_cites_its_sources():
    for p in PROFILES.values():
        assert {"memory", "scheduler", "defaults"} <= set(p.sources), p.name
        assert all(len(v) > 20 for v in p.sources.values()), p.name
        assert p.version


@pytest.mark.parametrize("name", ["SGLang", "trt-llm", "TensorRT-LLM", "vllm"])
def test_engine_names_resolve(name):
    assert engine_profile(name).name in PROFILES


def test_unknown_engine_is_one_line_naming_the_valid_ones(run_cli):
    with pytest.raises(InputError, match="expected one of vllm, sglang, trtllm"):
        engine_profile("tgi")
    res = run_cli("memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "tgi")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "vllm" in res.stderr and "sglang" in res.stderr and "trtllm" in res.stderr


def test_block_size_the_engine_lacks_is_refused(catalog):
    gpu = catalog.gpu("h100-sxm")
    with pytest.raises(InputError, match="trtllm accepts 8, 16, 32, 64, 128"):
        resolve_settings(EngineOptions(engine="trtllm", block_size=1), gpu)


def test_sglang_mem_fraction_static_hand_calculation(catalog):
    # SGLang 0.5.9 server_args.py on an H100 (NVML 81559 MiB), TP 1:
    # chunk 8192, cuda_graph_max_bs 256 -> reserved = 512 + 8192*1.5 + 256*2 + 1/8*1024
    # = 13440 MB (> the 10 GiB floor); fraction = (81559 - 13440) / 81559 = 0.835.
    gpu = catalog.gpu("h100-sxm")
    d = SGLANG.defaults(gpu, 1)
    mib = gpu.total_memory_bytes / MIB
    assert d.max_num_batched_tokens == 8192
    assert d.memory_fraction == pytest.approx((mib - 13440) / mib, abs=1e-3)
    assert d.memory_fraction == pytest.approx(0.835, abs=2e-3)  # worked value, same formula
    assert d.block_size == 1
    # TP 8: graph bs 512 -> reserved 512 + 12288 + 1024 + 1024 = 14848 MB -> 0.818
    assert SGLANG.defaults(gpu, 8).memory_fraction == pytest.approx(0.818, abs=2e-3)
    # Blackwell: chunk 16384, page 64 (trtllm_mha backend)
    b200 = SGLANG.defaults(catalog.gpu("b200"), 1)
    assert b200.max_num_batched_tokens == 16384 and b200.block_size == 64


def test_vllm_defaults_by_gpu(catalog):
    assert VLLM.defaults(catalog.gpu("h100-sxm")).max_num_seqs == 1024
    assert VLLM.defaults(catalog.gpu("a100-sxm-80gb")).max_num_seqs == 256
    assert VLLM.defaults(catalog.gpu("l40s")).max_num_batched_tokens == 2048
    assert TRTLLM.defaults(catalog.gpu("h100-sxm")).block_size == 32


def _dep(catalog, engine, **kw):
    return resolve_deployment(catalog, "llama-3.1-8b", "h100-sxm",
                              EngineOptions(engine=engine, max_model_len=8192, **kw))


def test_memory_rules_by_hand(catalog):
    """The same weights, activation and overheads under three accounting rules."""
    v = _dep(catalog, "vllm", gpu_memory_utilization=0.9)
    s = _dep(catalog, "sglang", gpu_memory_utilization=0.85)
    t = _dep(catalog, "trtllm", gpu_memory_utilization=0.9)
    total = v.memory.total_memory_bytes
    w = v.memory.weights_bytes_per_gpu
    # vLLM: 0.9 * total - weights - activation peak - non-torch
    mv = v.memory
    assert mv.kv_cache_bytes_per_gpu == pytest.approx(
        0.9 * total - w - mv.activation_peak_bytes_per_gpu - mv.runtime_overhead_bytes_per_gpu)
    # SGLang: 0.85 of the memory free at start (total - the 0.5 GiB CUDA context) holds
    # weights + KV; activations and graphs live outside
    ms = s.memory
    ctx = 0.5 * GIB_BYTES
    assert ms.context_bytes_per_gpu == ctx  # one GPU: no communicator buffers
    assert ms.kv_cache_bytes_per_gpu == pytest.approx(
        0.85 * (total - ctx) - w - ms.runtime_overhead_bytes_per_gpu)
    # TensorRT-LLM: 0.9 of what is free after the context, weights, activations, runtime and
    # graphs; its profiling run is one 8192-token prompt (max_num_tokens 8192 < max_seq_len),
    # so the activation peak is the forward's: 8192 x (3 x 14336 + 4 x 4096) x 2 B + 32 MiB
    mt = t.memory
    assert mt.activation_peak_bytes_per_gpu == 8192 * (3 * 14336 + 4 * 4096) * 2 + 32 * 2**20
    free = (total - ctx - w - mt.activation_peak_bytes_per_gpu
            - mt.runtime_overhead_bytes_per_gpu - mt.cuda_graph_bytes_per_gpu)
    assert mt.kv_cache_bytes_per_gpu == pytest.approx(0.9 * free)
    # 8B bf16 on 80 GB: weights ~15 GiB, KV tens of GiB under each rule
    assert 14 * GIB_BYTES < w < 16 * GIB_BYTES
    for m in (mv, ms, mt):
        assert 40 * GIB_BYTES < m.kv_cache_bytes_per_gpu < 70 * GIB_BYTES


def test_profiles_flow_into_scheduler_policy(catalog):
    assert _dep(catalog, "sglang").profile.scheduler.prefill_first
    trt = _dep(catalog, "trtllm").profile.scheduler
    assert not trt.chunked_prefill and trt.reserve_output_frac == 1 and not trt.preemption
    assert not _dep(catalog, "vllm").profile.scheduler.prefill_first


def test_latency_cli_takes_engine(run_cli):
    import json

    outs = {}
    for eng in ("vllm", "sglang", "trtllm"):
        res = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine",
                      eng, "--concurrency", "16", "--input-len", "1024", "--output-len", "256",
                      "--format", "json")
        assert res.exit_code == 0, res.stderr
        outs[eng] = json.loads(res.stdout)
        assert outs[eng]["engine_settings"]["engine"] == eng
    # each engine's own per-request overhead shows in its TTFT
    assert outs["sglang"]["ttft_s"]["mean"] > outs["vllm"]["ttft_s"]["mean"]


def test_simulate_runs_the_engine_policy_unless_told(run_cli):
    # TensorRT-LLM prefills whole prompts (enable_chunked_prefill False): a prompt over its
    # 8192-token budget is refused in one line, as the engine refuses it; vLLM chunks it.
    args = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "1",
            "--requests", "10", "--input-len", "12000", "--output-len", "8")
    trt = run_cli(*args, "--engine", "trtllm")
    assert trt.exit_code == 2 and "chunked prefill is off" in trt.stderr
    assert len(trt.stderr.strip().splitlines()) == 1
    assert run_cli(*args, "--engine", "vllm").exit_code == 0


def test_latency_refuses_a_whole_prompt_over_the_budget(run_cli):
    # the analytic model says what the simulator and TensorRT-LLM say: no chunking, no fit
    res = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "trtllm",
                  "--rate", "2", "--input-len", "16000", "--output-len", "100")
    assert res.exit_code == 2 and "prefills whole prompts" in res.stderr
    ok = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "trtllm",
                 "--rate", "2", "--input-len", "16000", "--output-len", "100",
                 "--max-num-batched-tokens", "16384")
    assert ok.exit_code == 0


def test_request_overhead_adds_a_cost_per_mla_layer(catalog):
    # Hand calculation: DeepSeek-V2-Lite has 27 layers of multi-head latent attention, so its
    # default per-request overhead is the profile's base plus 27 x the per-MLA-layer cost; a
    # GQA model (Llama-3.1-8B) gets the base alone; a calibration's measured overhead replaces
    # the whole sum (it was measured on the user's own model).
    from capplan.models.perf import request_overhead
    from capplan.plan.deployment import calibration_for

    mla = catalog.resolve_model("deepseek-v2-lite").spec
    gqa = catalog.resolve_model("llama-3.1-8b").spec
    assert mla.num_layers == 27 and mla.mla is not None and gqa.mla is None
    for p in PROFILES.values():
        assert request_overhead(gqa, p) == p.request_overhead_s
        assert request_overhead(mla, p) == pytest.approx(
            p.request_overhead_s + 27 * p.mla_layer_request_overhead_s, rel=1e-12)
    assert TRTLLM.mla_layer_request_overhead_s > 0  # fitted: docs/validation.md section 4
    dep = resolve_deployment(catalog, "deepseek-v2-lite", "h100-sxm",
                             EngineOptions(engine="trtllm"))
    assert float(dep.step.request_overhead_s) == pytest.approx(request_overhead(mla, TRTLLM))
    cal = calibration_for(catalog, catalog.gpu("h100-sxm"), None).with_(request_overhead_s=0.03)
    dep = resolve_deployment(catalog, "deepseek-v2-lite", "h100-sxm",
                             EngineOptions(engine="trtllm"), cal)
    assert float(dep.step.request_overhead_s) == 0.03


def test_sglang_dp_attention_divides_its_caps_and_the_line_multiplies_them(catalog):
    # SGLang server_args._handle_data_parallelism: chunked_prefill_size //= dp_size under
    # --enable-dp-attention; model_runner: max_running_requests // dp_size per rank. H200 (141
    # GB) is in the 8192-token tier, so with --dp 8 a rank's default chunk is 8192 // 8 = 1024;
    # vLLM's DP ranks are separate engines with their own caps.
    gpu = catalog.gpu("h200")
    opts = dict(tp=1, attention_dp=8, expert_parallel=8)
    assert resolve_settings(EngineOptions(engine="sglang", **opts), gpu
                            ).max_num_batched_tokens == 1024
    assert resolve_settings(EngineOptions(engine="sglang", tp=8), gpu
                            ).max_num_batched_tokens == 8192
    assert resolve_settings(EngineOptions(engine="vllm", **opts), gpu
                            ).max_num_batched_tokens == 8192
    from capplan.plan.launch import LaunchOptions, launch_line

    o = LaunchOptions(model_id="m", tp=1, attention_dp=8, max_num_seqs=64,
                      max_num_batched_tokens=512, memory_fraction={"sglang": 0.9},
                      max_model_len=8192)
    words = launch_line("sglang", o).argv
    assert words[words.index("--max-running-requests") + 1] == "512"  # 64 per rank x 8
    assert words[words.index("--chunked-prefill-size") + 1] == "4096"  # 512 per rank x 8
