"""Engine launch commands for a recommendation: vLLM, SGLang, and the benchmark to verify it.

Flag names: vLLM `vllm serve --help` (0.10-0.11); SGLang `python -m sglang.launch_server
--help` (0.4-0.5): --tp, --max-running-requests, --chunked-prefill-size, --mem-fraction-static,
--context-length, --kv-cache-dtype, --quantization.
"""

from __future__ import annotations

import math
from typing import Any

from capplan.catalog.schema import ModelSpec

_VLLM_QUANT = {"fp8": "fp8"}  # int4/fp4 need a pre-quantized checkpoint (AWQ/GPTQ/NVFP4 repo)


def engine_flags(model: ModelSpec, r: dict[str, Any], traffic: Any) -> dict[str, str]:
    hf = model.hf_id
    wd, kvd = r["weight_dtype"], r["kv_dtype"]
    v = [f"vllm serve {hf}", f"--tensor-parallel-size {r['tp']}"]
    if r.get("pp", 1) > 1:
        v.append(f"--pipeline-parallel-size {r['pp']}")
    v += [f"--max-num-seqs {r['max_num_seqs']}",
          f"--max-num-batched-tokens {r['max_num_batched_tokens']}",
          f"--gpu-memory-utilization {r['gpu_memory_utilization']:g}",
          f"--max-model-len {r['max_model_len']}"]
    own_format = model.quantization.format if model.quantization else model.torch_dtype
    note = ""
    if kvd == "fp8":
        v.append("--kv-cache-dtype fp8")
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
    s = [f"python -m sglang.launch_server --model-path {hf}", f"--tp {r['tp']}",
         f"--max-running-requests {r['max_num_seqs']}",
         f"--chunked-prefill-size {r['max_num_batched_tokens']}",
         f"--mem-fraction-static {r['gpu_memory_utilization']:g}",
         f"--context-length {r['max_model_len']}"]
    if kvd == "fp8":
        s.append("--kv-cache-dtype fp8_e4m3")  # vLLM's fp8 is e4m3 too
    if wd == "fp8" and own_format != "fp8":
        s.append("--quantization fp8")
    if priority:  # SGLang 0.5 ServerArgs: off by default, and higher values first unless told
        s += ["--enable-priority-scheduling", "--schedule-low-priority-values-first"]
    n = max(200, math.ceil(r["per_replica_rate_per_s"] * 300))
    bench = (f"vllm bench serve --model {hf} --dataset-name random "
             f"--random-input-len {round(traffic.inp.mean)} "
             f"--random-output-len {round(traffic.out.mean)} "
             f"--request-rate {r['per_replica_rate_per_s']:.3g} --num-prompts {n} "
             "--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99")
    return {"vllm": " ".join(v) + note, "sglang": " ".join(s), "bench": bench}
