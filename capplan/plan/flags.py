"""Engine launch commands for a recommendation: vLLM, SGLang, TensorRT-LLM, and the benchmark
to verify it.

Flag names: vLLM `vllm serve --help` (0.10-0.11); SGLang `python -m sglang.launch_server
--help` (0.4-0.5): --tp, --max-running-requests, --chunked-prefill-size, --mem-fraction-static,
--context-length, --kv-cache-dtype, --quantization; TensorRT-LLM `trtllm-serve --help` (1.x):
--backend pytorch, --tp_size, --max_batch_size, --max_num_tokens,
--kv_cache_free_gpu_memory_fraction, --max_seq_len.

Every engine's memory fraction means something else (models/engine.py MemoryAccounting), so
each line's fraction is derived from the planned memory by that engine's own rule: the line
holds the KV cache the plan counted on, whichever engine it launches.
"""

from __future__ import annotations

import math
from typing import Any

from capplan.catalog.schema import ModelSpec
from capplan.models.engine import SGLANG, TRTLLM, VLLM, EngineProfile
from capplan.models.memory import MemoryReport
from capplan.plan.feature_flags import feature_flags

_VLLM_QUANT = {"fp8": "fp8"}  # int4/fp4 need a pre-quantized checkpoint (AWQ/GPTQ/NVFP4 repo)


def memory_fractions(mem: MemoryReport) -> dict[str, float]:
    """Each engine's memory fraction that yields the plan's KV cache (rounded up to 0.001).

    vLLM: (weights + activation peak + non-torch + KV) / total; SGLang --mem-fraction-static:
    (weights + non-torch + KV) / total, activations outside; TensorRT-LLM
    free_gpu_memory_fraction: KV / (memory free after weights, activations, runtime, graphs).
    """
    total = mem.total_memory_bytes
    w, act = mem.weights_bytes_per_gpu, mem.activation_peak_bytes_per_gpu
    ovh, graphs = mem.runtime_overhead_bytes_per_gpu, mem.cuda_graph_bytes_per_gpu
    kv = mem.kv_cache_bytes_per_gpu
    free = max(total - w - act - ovh - graphs, 1.0)

    def up(x: float) -> float:
        return min(math.ceil(x * 1000 - 1e-6) / 1000, 1.0)

    return {"vllm": up((w + act + ovh + kv) / total), "sglang": up((w + ovh + kv) / total),
            "trtllm": up(kv / free)}


def _settings_line(profile: EngineProfile, head: str, r: dict[str, Any],
                   frac: dict[str, float], tokens: int) -> list[str]:
    """The launch line's common settings under the engine's own flag names (its profile)."""
    f = profile.flag_names
    dp, ep = r.get("attention_dp", 1), r.get("expert_parallel", 1)
    # vLLM's --tensor-parallel-size is one attention group's; SGLang's --tp and TensorRT-LLM's
    # --tp_size are the whole tp x dp world, which DP attention then splits (models/engine.py
    # sources["layouts"]).
    tp = r["tp"] if profile.expert_parallel_is_world else r["tp"] * dp
    line = [head, f"{f['tp']} {tp}"]
    if r.get("pp", 1) > 1:
        line.append(f"{f['pp']} {r['pp']}")
    if dp > 1:
        line.append(f["attention_dp"].format(n=dp))
    if ep > 1:  # vLLM's flag takes no size: EP = tp x dp
        line.append(f["expert_parallel"].format(n=ep))
    return line + [f"{f['max_num_seqs']} {r['max_num_seqs']}",
                   f"{f['max_num_batched_tokens']} {tokens}",
                   f"{f['memory_fraction']} {frac[profile.name]:g}",
                   f"{f['max_model_len']} {r['max_model_len']}"]


def engine_flags(model: ModelSpec, r: dict[str, Any], traffic: Any,
                 memory: MemoryReport | None = None) -> dict[str, str]:
    """Launch lines for every engine; `memory` (the planned MemoryReport) sets each engine's
    memory fraction by its own rule, else the planned engine's fraction is printed as is."""
    hf = model.hf_id
    frac = memory_fractions(memory) if memory is not None else {
        e: r["gpu_memory_utilization"] for e in ("vllm", "sglang", "trtllm")}
    wd, kvd = r["weight_dtype"], r["kv_dtype"]
    own_format = model.quantization.format if model.quantization else model.torch_dtype
    v = _settings_line(VLLM, f"vllm serve {hf}", r, frac, r["max_num_batched_tokens"])
    note = ""
    if kvd == "fp8":
        v.append(VLLM.flag_names["kv_fp8"])
    # Lanes of different priorities in one pool: the simulator served lower values first, as
    # vLLM does with --scheduling-policy priority (SchedulerConfig.policy, 0.10-0.11; each
    # request then carries its lane's "priority" field).
    priority = bool(getattr(traffic, "priority_scheduling", False))
    if priority:
        v.append("--scheduling-policy priority")
    if wd in _VLLM_QUANT and own_format != wd:
        v.append(f"--quantization {_VLLM_QUANT[wd]}")
    elif wd in ("int4", "int8", "fp4") and own_format != wd:
        note = f"  # serve a {wd} checkpoint of {hf} (AWQ/GPTQ/W8A8/NVFP4); vLLM reads its format"
    s = _settings_line(SGLANG, f"python -m sglang.launch_server --model-path {hf}", r, frac,
                       r["max_num_batched_tokens"])
    if kvd == "fp8":
        s.append(SGLANG.flag_names["kv_fp8"])  # vLLM's fp8 is e4m3 too
    if wd == "fp8" and own_format != "fp8":
        s.append(SGLANG.flag_names["quant_fp8"])
    if priority:  # SGLang 0.5 ServerArgs: off by default, and higher values first unless told
        s += ["--enable-priority-scheduling", "--schedule-low-priority-values-first"]
    # TensorRT-LLM prefills whole prompts (no chunking by default): max_num_tokens covers one.
    t = _settings_line(TRTLLM, f"trtllm-serve {hf} --backend pytorch", r, frac,
                       max(r["max_num_batched_tokens"], r["max_model_len"]))
    if kvd == "fp8":
        t.append(TRTLLM.flag_names["kv_fp8"])
    n = max(200, math.ceil(r["per_replica_rate_per_s"] * 300))
    # A prefix every request shares: vllm bench's random dataset prepends --random-prefix-len
    # tokens to each --random-input-len prompt (benchmarks/datasets.py RandomDataset).
    common = getattr(getattr(traffic, "prefix", None), "common_prefix_tokens", 0)
    bench = (f"vllm bench serve --model {hf} --dataset-name random "
             + (f"--random-prefix-len {common} " if common else "")
             + f"--random-input-len {round(traffic.inp.mean) - common} "
             f"--random-output-len {round(traffic.out.mean)} "
             f"--request-rate {r['per_replica_rate_per_s']:.3g} --num-prompts {n} "
             "--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99")
    extra = feature_flags(r, hf)
    v, s, t = v + extra["vllm"], s + extra["sglang"], t + extra["trtllm"]
    return {"vllm": " ".join(v) + note, "sglang": " ".join(s), "trtllm": " ".join(t),
            "bench": bench}
