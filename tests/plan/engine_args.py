"""The argument names each engine and benchmark client accepts, as data (flag -> takes a value),
with where each set was read. The launch-line tests parse every line against these sets: a
flag outside its engine's set, a missing value or a repeated flag fails.

Sources (read, not copied):
- vLLM 0.10-0.11: vllm/engine/arg_utils.py EngineArgs.add_cli_args (parallel, scheduler,
  cache, model, quantization groups) and vllm/entrypoints/openai/cli_args.py (--host, --port);
  docs "Disaggregated Prefilling" (--kv-transfer-config).
- SGLang 0.5: python/sglang/srt/server_args.py ServerArgs.add_cli_args.
- TensorRT-LLM 1.x: tensorrt_llm/commands/serve.py (click options of `trtllm-serve`), docs
  commands/trtllm-serve.rst.
- vllm bench serve 0.10-0.11: vllm/benchmarks/serve.py add_cli_args and
  vllm/benchmarks/datasets.py add_dataset_parser (--custom-output-len, --custom-skip-chat-template).
- SGLang bench_serving 0.5: python/sglang/bench_serving.py argparse block.
- Image benchmarks: vllm bench serve's random-mm dataset (vllm/benchmarks/datasets.py
  add_random_multimodal_dataset_args: --random-mm-base-items-per-request,
  --random-mm-num-mm-items-range-ratio, --random-mm-limit-mm-per-prompt,
  --random-mm-bucket-config; the random dataset's --random-input-len, --random-output-len,
  --random-range-ratio); SGLang bench_serving's image dataset (docs/developer_guide/
  bench_serving.md: --image-count, --image-resolution, --image-format, --image-content,
  --apply-chat-template).
- AIPerf: ai-dynamo/aiperf docs (cli options: --url, --endpoint-type, --streaming,
  --input-file, --custom-dataset-type, --fixed-schedule, --extra-inputs, --goodput).
- GuideLLM: vllm-project/guidellm README (`guidellm benchmark --target --model --data
  --rate-type --rate --max-requests`).
- SGLang's router: sgl-router py_src/sglang_router/router_args.py RouterArgs.add_cli_args
  (--worker-urls nargs "*", --policy, --pd-disaggregation, --prefill URL [BOOTSTRAP_PORT],
  --decode URL, --prefill-policy, --decode-policy, --host, --port).
- vLLM's router: vllm-project/router src/main.rs CliArgs (--worker-urls num_args 0..,
  --policy, --vllm-pd-disaggregation, --prefill URL [PORT] read before clap, --decode,
  --prefill-policy, --decode-policy, --host, --port).
"""

from __future__ import annotations

import shlex

VLLM_SERVE = {
    "--tensor-parallel-size": True, "--pipeline-parallel-size": True,
    "--data-parallel-size": True, "--enable-expert-parallel": False,
    "--max-num-seqs": True, "--max-num-batched-tokens": True,
    "--gpu-memory-utilization": True, "--max-model-len": True, "--block-size": True,
    "--kv-cache-dtype": True, "--quantization": True, "--scheduling-policy": True,
    "--kv-transfer-config": True, "--host": True, "--port": True,
    "--served-model-name": True, "--enable-prefix-caching": False, "--trust-remote-code": False,
    "--speculative-config": True, "--enable-lora": False, "--max-loras": True,
    "--max-lora-rank": True, "--lora-modules": True, "--limit-mm-per-prompt": True,
    # multi-node: docs "Data Parallel Deployment" and "Distributed Inference and Serving"
    "--data-parallel-size-local": True, "--data-parallel-start-rank": True,
    "--data-parallel-address": True, "--data-parallel-rpc-port": True, "--headless": False,
    "--distributed-executor-backend": True,
    # 0.11+: SchedulerConfig.async_scheduling as a boolean option (--no- form from 0.14 on,
    # where it is the default; vLLM's own docs and launch examples)
    "--async-scheduling": False, "--no-async-scheduling": False,
    # expert all-to-all kernels (ParallelConfig.all2all_backend, vLLM 0.11+; launch examples
    # with deepep_low_latency / deepep_high_throughput)
    "--all2all-backend": True,
}
SGLANG_SERVE = {
    "--model-path": True, "--tp": True, "--tp-size": True, "--pp-size": True, "--dp": True,
    "--dp-size": True, "--enable-dp-attention": False, "--ep-size": True,
    "--max-running-requests": True, "--chunked-prefill-size": True,
    "--mem-fraction-static": True, "--context-length": True, "--kv-cache-dtype": True,
    "--quantization": True, "--page-size": True, "--host": True, "--port": True,
    "--enable-priority-scheduling": False, "--schedule-low-priority-values-first": False,
    "--disaggregation-mode": True, "--disaggregation-transfer-backend": True,
    "--disaggregation-bootstrap-port": True,
    "--served-model-name": True, "--trust-remote-code": False, "--speculative-algorithm": True,
    "--lora-paths": True, "--max-loras-per-batch": True, "--nnodes": True, "--node-rank": True,
    "--dist-init-addr": True, "--speculative-draft-model-path": True,
    "--speculative-num-steps": True, "--speculative-eagle-topk": True,
    "--speculative-num-draft-tokens": True, "--enable-lora": False, "--max-lora-rank": True,
    "--enable-mixed-chunk": False, "--disable-overlap-schedule": False,
    # DeepEP (server_args.py, 0.5: --moe-a2a-backend deepep, --deepep-mode
    # normal|low_latency|auto)
    "--moe-a2a-backend": True, "--deepep-mode": True,
    # LoRA without --lora-paths needs it beside --max-lora-rank (server_args.py assert;
    # choices: utils/common.py SUPPORTED_LORA_TARGET_MODULES or LORA_TARGET_ALL_MODULES "all")
    "--lora-target-modules": True,
}
TRTLLM_SERVE = {
    "--backend": True, "--tp_size": True, "--pp_size": True, "--ep_size": True,
    "--max_batch_size": True, "--max_num_tokens": True, "--max_seq_len": True,
    "--kv_cache_free_gpu_memory_fraction": True, "--extra_llm_api_options": True,
    "--host": True, "--port": True, "--trust_remote_code": False, "--tokenizer": True,
}
VLLM_BENCH = {
    "--backend": True, "--base-url": True, "--endpoint": True, "--model": True,
    "--dataset-name": True, "--dataset-path": True, "--custom-output-len": True,
    "--custom-skip-chat-template": False, "--ignore-eos": False, "--request-rate": True,
    "--burstiness": True, "--num-prompts": True, "--percentile-metrics": True,
    "--metric-percentiles": True, "--goodput": "many", "--max-concurrency": True,
    "--random-input-len": True, "--random-output-len": True, "--random-range-ratio": True,
    "--random-mm-base-items-per-request": True, "--random-mm-num-mm-items-range-ratio": True,
    "--random-mm-limit-mm-per-prompt": True, "--random-mm-bucket-config": True,
}
SGLANG_BENCH = {
    "--backend": True, "--base-url": True, "--model": True, "--dataset-name": True,
    "--dataset-path": True, "--num-prompts": True, "--request-rate": True,
    "--disable-ignore-eos": False, "--max-concurrency": True,
    "--random-input-len": True, "--random-output-len": True, "--random-range-ratio": True,
    "--image-count": True, "--image-resolution": True, "--image-format": True,
    "--image-content": True, "--apply-chat-template": False,
}
AIPERF = {
    "--model": True, "--url": True, "--endpoint-type": True, "--streaming": False,
    "--input-file": True, "--custom-dataset-type": True, "--fixed-schedule": False,
    "--extra-inputs": True, "--goodput": True, "--request-rate": True,
}
GUIDELLM = {
    "--target": True, "--model": True, "--data": True, "--rate-type": True, "--rate": True,
    "--max-requests": True,
}
SGLANG_ROUTER = {
    "--worker-urls": "many", "--policy": True, "--pd-disaggregation": False,
    "--prefill": "many", "--decode": True, "--prefill-policy": True, "--decode-policy": True,
    "--host": True, "--port": True,
}
VLLM_ROUTER = {
    "--worker-urls": "many", "--policy": True, "--vllm-pd-disaggregation": False,
    "--prefill": "many", "--decode": True, "--prefill-policy": True, "--decode-policy": True,
    "--host": True, "--port": True,
}
PROGRAMS = {  # command prefix -> (known flags, positional words after the prefix)
    ("vllm", "serve"): (VLLM_SERVE, 1),
    ("python", "-m", "sglang.launch_server"): (SGLANG_SERVE, 0),
    ("trtllm-serve",): (TRTLLM_SERVE, 1),
    ("vllm", "bench", "serve"): (VLLM_BENCH, 0),
    ("python", "-m", "sglang.bench_serving"): (SGLANG_BENCH, 0),
    ("aiperf", "profile"): (AIPERF, 0),
    ("guidellm", "benchmark"): (GUIDELLM, 0),
    ("capplan", "verify"): ({"--endpoint": True}, 1),
    ("python", "-m", "sglang_router.launch_router"): (SGLANG_ROUTER, 0),
    ("vllm-router",): (VLLM_ROUTER, 0),
}


def parse_line(cmd: str) -> tuple[tuple[str, ...], list[str], dict[str, str | None],
                                   dict[str, str]]:
    """(program, positional words, {flag: value}, environment) of a command line, every flag
    checked against its program's known set."""
    words = shlex.split(cmd, comments=True)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    prog = next((p for p in PROGRAMS if tuple(words[:len(p)]) == p), None)
    assert prog is not None, f"unknown program in {cmd!r}"
    known, npos = PROGRAMS[prog]
    rest = words[len(prog):]
    pos, rest = rest[:npos], rest[npos:]
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(rest):
        w = rest[i]
        assert w in known, f"{w} is not an argument of {' '.join(prog)}: {cmd}"
        assert w not in flags, f"{w} given twice in {cmd}"
        if known[w] == "many":
            j = i + 1
            while j < len(rest) and not rest[j].startswith("--"):
                j += 1
            flags[w], i = " ".join(rest[i + 1:j]), j
        elif known[w]:
            assert i + 1 < len(rest), f"{w} needs a value: {cmd}"
            flags[w], i = rest[i + 1], i + 2
        else:
            flags[w], i = None, i + 1
    return prog, pos, flags, env
