"""Launch and verify lines parsed with each engine's own argument names (tests/plan/engine_args.py),
every value checked against the plan that printed it. Nothing is started."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.plan.launch import (
    BUILDERS,
    REPLICA_PORT,
    TRTLLM_OPTIONS_FILE,
    TRTLLM_ROLE_FILES,
    LaunchOptions,
    default_port,
    launch_line,
    max_model_len_choice,
)
from tests.plan.engine_args import parse_line

FRAC = {"vllm": 0.9, "sglang": 0.87, "trtllm": 0.81}


def _check(engine: str, o: LaunchOptions) -> None:
    line = launch_line(engine, o)
    prog, pos, f, env = parse_line(line.command)
    port = str(o.port_for(engine))
    if engine == "vllm":
        assert pos == [o.model_id]
        assert f["--tensor-parallel-size"] == str(o.tp)
        assert f["--max-num-seqs"] == str(o.max_num_seqs)
        assert f["--max-num-batched-tokens"] == str(o.max_num_batched_tokens)
        assert float(f["--gpu-memory-utilization"]) == o.memory_fraction["vllm"]
        assert f["--max-model-len"] == str(o.max_model_len)
        assert (f.get("--kv-cache-dtype") == "fp8") is (o.kv_dtype == "fp8")
        assert (f.get("--quantization") == "fp8") is o.fp8_weights_online
        assert ("--kv-transfer-config" in f) is (o.role is not None)
        side = o.kv_handshake if o.role is not None else None  # NIXL's side channel
        assert env.get("VLLM_NIXL_SIDE_CHANNEL_PORT") == (side and str(side[1]))
        assert env.get("VLLM_NIXL_SIDE_CHANNEL_HOST") == (side and side[0])
    elif engine == "sglang":
        assert f["--model-path"] == o.model_id
        assert f["--tp"] == str(o.tp * o.attention_dp)
        # SGLang divides both by --dp under DP attention (server_args._handle_data_parallelism,
        # model_runner max_running_requests // dp_size): the line gives each rank the plan's
        dp = o.attention_dp
        assert int(f["--max-running-requests"]) // dp == o.max_num_seqs
        assert int(f["--chunked-prefill-size"]) // dp == o.max_num_batched_tokens
        assert float(f["--mem-fraction-static"]) == o.memory_fraction["sglang"]
        assert f["--context-length"] == str(o.max_model_len)
        assert ("--kv-cache-dtype" in f) is (o.kv_dtype == "fp8")
        assert (f.get("--quantization") == "fp8") is o.fp8_weights_online
        assert f.get("--disaggregation-mode") == o.role
        boot = o.kv_handshake if o.role == "prefill" else None  # its bootstrap server
        assert f.get("--disaggregation-bootstrap-port") == (boot and str(boot[1]))
    else:
        # an fp8 plan of a bf16 checkpoint serves the FP8 checkpoint: never bf16 weights
        assert pos[0].endswith("-FP8") is o.fp8_weights_online
        assert f["--tp_size"] == str(o.tp * o.attention_dp)
        assert f["--max_batch_size"] == str(o.max_num_seqs)
        assert int(f["--max_num_tokens"]) >= o.max_model_len
        assert float(f["--kv_cache_free_gpu_memory_fraction"]) == o.memory_fraction["trtllm"]
        assert f["--max_seq_len"] == str(o.max_model_len)
        name = TRTLLM_ROLE_FILES.get(o.role or "", TRTLLM_OPTIONS_FILE)
        opts = yaml.safe_load(line.files[name]) if line.files else {}
        assert f.get("--extra_llm_api_options") == (name if opts else None)
        assert (opts.get("kv_cache_config", {}).get("dtype") == "fp8") is (o.kv_dtype == "fp8")
        assert bool(opts.get("enable_attention_dp")) is (o.attention_dp > 1)
        assert bool(opts.get("disable_overlap_scheduler")) is (not o.host_overlap)
        # a context or generation server of the disaggregated server transfers KV
        # (examples/disaggregated/README.md: its buffer at least the longest prompt)
        kv = opts.get("cache_transceiver_config")
        assert (kv is not None) is (o.role is not None)
        assert kv is None or kv["max_tokens_in_buffer"] >= o.max_model_len
    assert f["--host"] == "0.0.0.0" and f["--port"] == port == str(line.port)
    assert env.get("CUDA_VISIBLE_DEVICES", "") == ",".join(map(str, o.gpu_ids))


OPTIONS = st.builds(
    LaunchOptions, model_id=st.just("org/Model-70B-Instruct"), tp=st.sampled_from([1, 2, 4, 8]),
    attention_dp=st.sampled_from([1, 2]), max_num_seqs=st.integers(1, 4096),
    max_num_batched_tokens=st.integers(16, 65536), memory_fraction=st.just(FRAC),
    max_model_len=st.integers(256, 131072),
    weight_dtype=st.sampled_from(["auto", "bf16", "fp8", "int4"]),
    checkpoint_format=st.sampled_from(["bf16", "fp8"]), kv_dtype=st.sampled_from(["auto", "fp8"]),
    port=st.none() | st.integers(1024, 65535), role=st.sampled_from([None, "prefill", "decode"]),
    host_overlap=st.booleans(), gpu_ids=st.sampled_from([(), (0, 1), (4, 5, 6, 7)]),
    kv_handshake=st.none() | st.tuples(st.sampled_from([None, "HOST1"]),
                                       st.integers(5600, 9100)))


@settings(max_examples=60, deadline=None)
@given(o=OPTIONS)
def test_every_engine_line_carries_the_plan(o: LaunchOptions) -> None:
    for engine in ("vllm", "sglang", "trtllm"):
        _check(engine, o)


def test_max_model_len_reason_by_hand() -> None:
    # p99 prompt 3000 + p99 output 1000 = 4000; twice 8000 -> next power of two 8192
    n, why = max_model_len_choice(131072, 3000, 1000, None)
    assert n == 8192 and "p99 prompt 3000" in why and "rejected" in why
    assert max_model_len_choice(131072, 100, 100, None)[0] == 4096  # the floor
    assert max_model_len_choice(8192, 6000, 2000, None)[0] == 8192  # the model's context
    assert max_model_len_choice(131072, 100, 100, 32768) == (
        32768, "max-model-len 32768: engine.max_model_len in the plan")


@pytest.fixture(scope="module")
def recs(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """A fp8-weights, fp8-KV plan of a bf16 checkpoint under each engine (no simulation)."""
    from click.testing import CliRunner

    from capplan.cli import cli

    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAPPLAN_HOME", str(tmp_path_factory.mktemp("home")))
        mp.delenv("CAPPLAN_CATALOG_DIR", raising=False)
        for engine in ("vllm", "sglang", "trtllm"):
            res = CliRunner().invoke(cli, [
                "recommend", "--model", "llama-3.1-70b", "--rate", "8", "--input-len",
                "lognormal:mean=800,p99=1500", "--output-len", "300", "--ttft-p99", "2",
                "--tbt-p99", "0.1", "--gpu", "h100-sxm", "--tp", "4", "--weight-dtype", "fp8",
                "--kv-dtype", "fp8", "--engine", engine, "--verify-top", "0",
                "--max-num-seqs", "64,256", "--max-num-batched-tokens", "2048,8192",
                "--format", "json", *(() if engine == "sglang" else ("--no-disagg",))])
            assert res.exit_code == 0, res.output
            out[engine] = json.loads(res.stdout)
    return out


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_cli_lines_repeat_the_recommendation(recs, engine) -> None:
    plan = recs[engine]
    assert "p99 prompt" in plan["inputs"]["max_model_len_reason"]
    for r in plan["recommendations"]:
        fl = r["engine_flags"]
        for e in ("vllm", "sglang", "trtllm"):
            _prog, pos, f, _env = parse_line(fl[e])
            got = {"vllm": f.get("--max-model-len"), "sglang": f.get("--context-length"),
                   "trtllm": f.get("--max_seq_len")}[e]
            assert int(got) == r["max_model_len"]
        assert parse_line(fl["trtllm"])[1][0].endswith("-FP8")  # not the bf16 weights
        assert "dtype: fp8" in fl[f"file:trtllm:{TRTLLM_OPTIONS_FILE}"]


@pytest.mark.parametrize(("engine", "prog"), [
    ("vllm", ("vllm", "bench", "serve")), ("sglang", ("python", "-m", "sglang.bench_serving")),
    ("trtllm", ("aiperf", "profile"))])
def test_verify_reaches_the_planned_engine_at_the_planned_lengths(recs, engine, prog) -> None:
    best = recs[engine]["recommendations"][0]
    got, _pos, f, _env = parse_line(best["engine_flags"]["bench"])
    assert got == prog
    url = f.get("--base-url") or f.get("--url")
    # one replica at its share of the rate: the plan's one server on the engine's default
    # port, or a fleet's first replica on its own port (the router in front spreads the
    # whole rate over them all)
    fleet = best["engine_flags"].get(f"fleet:{engine}")
    port = (default_port(engine) if fleet is None else
            int(re.search(r"--port (\d+)", fleet.split("\n")[0]).group(1)))
    assert best["replicas"] == 1 or (fleet is not None and port == REPLICA_PORT)
    assert url == f"http://localhost:{port}"
    if engine == "vllm":  # outputs at the planned length: EOS ignored, each line's own length
        assert "--ignore-eos" in f and f["--custom-output-len"] == "-1"
        assert f["--goodput"] == "ttft:2000"  # the TTFT SLO in ms (vLLM has no TBT goodput)
    elif engine == "sglang":  # bench_serving ignores EOS unless --disable-ignore-eos
        assert "--disable-ignore-eos" not in f and f["--dataset-name"] == "sharegpt"
    else:
        assert f["--extra-inputs"] == "ignore_eos:true" and "--fixed-schedule" in f
    rate = f.get("--request-rate")
    if rate is not None:
        assert float(rate) == pytest.approx(best["per_replica_rate_per_s"], rel=1e-3)


def test_disaggregated_lines_are_the_planned_engines_own(recs) -> None:
    d = recs["sglang"].get("disaggregated")
    if not d or not d.get("launch"):
        pytest.skip("no disaggregated layout in this plan")
    assert not any(k.startswith("vllm") for k in d["launch"])  # no vLLM line with SGLang values
    for role in ("prefill", "decode"):
        _prog, _pos, f, env = parse_line(d["launch"][f"sglang_{role}"].split(": ", 1)[1])
        assert f["--disaggregation-mode"] == role
        assert int(f["--max-running-requests"]) == d[role]["max_num_seqs"]
        assert int(f["--context-length"]) == recs["sglang"]["inputs"]["max_model_len"]
        assert 0 < float(f["--mem-fraction-static"]) <= 1 and f["--port"]
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == d[role]["tp"]


def check_engine_lines(r: dict[str, Any]) -> None:
    """Every engine line of a recommendation (the plan's JSON) carries its planned dtype,
    a memory fraction in (0, 1] and its max-model-len; each parses with the engine's names."""
    fl = r["engine_flags"]
    fp8_w = r.get("weight_dtype_resolved", r["weight_dtype"]) == "fp8"
    fp8_kv = r.get("kv_dtype_resolved", r["kv_dtype"]) == "fp8"
    for e, (frac, mml) in {"vllm": ("--gpu-memory-utilization", "--max-model-len"),
                           "sglang": ("--mem-fraction-static", "--context-length"),
                           "trtllm": ("--kv_cache_free_gpu_memory_fraction", "--max_seq_len")
                           }.items():
        _prog, pos, f, _env = parse_line(fl[e])
        assert 0 < float(f[frac]) <= 1 and int(f[mml]) == r["max_model_len"], fl[e]
        if e == "trtllm":
            opts = fl.get(f"file:trtllm:{TRTLLM_OPTIONS_FILE}", "")
            assert ("dtype: fp8" in opts) is fp8_kv, fl[e]
            # fp8 weights: a quantized checkpoint (its own, or the ModelOpt FP8 one)
            assert not fp8_w or "fp8" in pos[0].lower() or "--quantization" not in fl["vllm"]
        else:
            assert ("--kv-cache-dtype" in f) is fp8_kv, fl[e]


def _flags_for(tp: int, dp: int, gpu: str, catalog) -> dict[str, str]:
    from capplan.plan.flags import engine_flags

    r = {"tp": tp, "pp": 1, "attention_dp": dp, "expert_parallel": tp * dp,
         "max_num_seqs": 64, "max_num_batched_tokens": 512, "max_model_len": 8192,
         "weight_dtype": "fp8", "kv_dtype": "auto", "gpu_memory_utilization": 0.9,
         "engine": "sglang", "replicas": 2, "per_replica_rate_per_s": 5.0,
         "deepep": {"trtllm": "TRTLLM_FORCE_ALLTOALL_METHOD=DeepEP"}}
    return engine_flags(catalog.model("deepseek-v3"), r, None,
                        gpus_per_node=catalog.gpu(gpu).host_gpus)


def test_a_replica_over_two_hosts_gets_a_command_per_host(catalog) -> None:
    # DP 16 x EP 16 on 8-GPU H200 hosts: 2 hosts. SGLang runs the same command on both with its
    # rank (server_args --nnodes/--node-rank/--dist-init-addr); vLLM's data-parallel ranks 0-7
    # on host 0 and 8-15 on host 1 (--data-parallel-size-local 8, --data-parallel-start-rank
    # 8, --headless); TensorRT-LLM one MPI launch of 16 ranks, 8 per host.
    f = _flags_for(1, 16, "h200", catalog)
    sg = f["sglang"].split("\n")
    assert len(sg) == 2
    for k, line in enumerate(sg):
        assert line.startswith(f"node {k}: ")
        _, _, w, _ = parse_line(line.split(": ", 1)[1])
        assert (w["--nnodes"], w["--node-rank"], w["--tp"], w["--dp"]) == ("2", str(k), "16",
                                                                           "16")
        assert w["--dist-init-addr"] == "NODE0_IP:5000"
        assert w["--max-running-requests"] == "1024"  # 64 per rank x 16 (SGLang divides)
    v0, v1 = (parse_line(ln.split(": ", 1)[1])[2] for ln in f["vllm"].split("\n"))
    assert v0["--data-parallel-size-local"] == v1["--data-parallel-size-local"] == "8"
    assert "--data-parallel-start-rank" not in v0 and v1["--data-parallel-start-rank"] == "8"
    assert "--headless" in v1 and "--headless" not in v0
    # its environment reaches every MPI rank through -x, not as a word after the launcher
    assert f["trtllm"].startswith("any node: mpirun -x TRTLLM_FORCE_ALLTOALL_METHOD=DeepEP "
                                  "-H NODE0_IP:8,NODE1_IP:8 -np 16 trtllm-llmapi-launch "
                                  "trtllm-serve ")


def test_gb200_hosts_hold_four_gpus_of_the_rack(catalog) -> None:
    # An NVL72 rack is one NVLink domain of 72 GPUs, but a compute tray (one host) holds 4: a
    # TP 8 replica is one NVLink group over 2 hosts, so its engine is launched on both.
    assert catalog.gpu("gb200").interconnect.max_gpus_per_node == 72
    assert catalog.gpu("gb200").host_gpus == 4 and catalog.gpu("h200").host_gpus == 8
    f = _flags_for(8, 1, "gb200", catalog)
    assert len(f["sglang"].split("\n")) == 2
    head, worker = f["vllm"].split("\n")  # TP over hosts: vLLM on a Ray cluster
    assert head.startswith("node 0: ray start --head --port 6379 && vllm serve ")
    assert head.endswith("--distributed-executor-backend ray")
    assert worker == "node 1: ray start --address NODE0_IP:6379 --block"
    assert "\n" not in _flags_for(8, 1, "h200", catalog)["sglang"]  # one host: one line


@pytest.mark.parametrize(("engine", "label", "others"), [
    ("vllm", "vLLM", ("SGLang", "TensorRT-LLM")),
    ("sglang", "SGLang", ("vLLM", "TensorRT-LLM")),
    ("trtllm", "TensorRT-LLM", ("vLLM", "SGLang"))])
def test_the_text_names_the_engine_the_figures_are_for(recs, engine, label, others) -> None:
    # every engine's line is printed; only the planned engine's was sized
    from capplan.plan.launch import sized_for

    line = sized_for(recs[engine]["recommendations"][0])
    assert line.startswith(f"sized for: {label};")
    assert f"the {others[0]} and {others[1]} lines carry the same settings" in line


@pytest.mark.parametrize(("spec", "engine", "want"), [
    ("sglang+mixed-chunk", "sglang", "--enable-mixed-chunk"),
    ("sglang+no-overlap", "sglang", "--disable-overlap-schedule"),
    ("vllm@0.11+overlap", "vllm", "--async-scheduling"),
    ("vllm+no-overlap", "vllm", "--no-async-scheduling"),
])
def test_the_planned_profile_options_are_on_its_line(spec, engine, want) -> None:
    """A plan sized with an engine option launches that engine with it (before: the line ran
    the engine's default, e.g. SGLang's prefill-first steps under a mixed-chunk plan); the
    other engines' lines do not take it."""
    from capplan.plan.launch import options_from

    rec = {"tp": 1, "max_num_seqs": 64, "max_num_batched_tokens": 2048, "max_model_len": 4096,
           "weight_dtype": "bf16", "kv_dtype": "auto", "engine": engine, "engine_profile": spec}
    frac = {"vllm": 0.9, "sglang": 0.88, "trtllm": 0.9}
    o = options_from(rec, "meta-llama/Llama-3.1-8B-Instruct", "bf16", frac)
    for e, build in BUILDERS.items():
        _prog, _pos, flags, _env = parse_line(" ".join(build(o).argv))
        assert (want in flags) == (e == engine), (e, spec)


def test_tensorrt_llm_without_overlap_says_so_in_its_options_file() -> None:
    from capplan.plan.launch import options_from

    rec = {"tp": 1, "max_num_seqs": 64, "max_num_batched_tokens": 4096, "max_model_len": 4096,
           "weight_dtype": "bf16", "kv_dtype": "auto", "engine": "trtllm",
           "engine_profile": "trtllm+no-overlap"}
    line = BUILDERS["trtllm"](options_from(rec, "meta-llama/Llama-3.1-8B-Instruct", "bf16",
                                           {"vllm": 0.9, "sglang": 0.88, "trtllm": 0.9}))
    assert "--extra_llm_api_options" in line.argv
    assert "disable_overlap_scheduler: true" in "".join(line.files.values())


def test_a_layout_past_tp_reads_as_its_gpus() -> None:
    # "40 x h100-sxm TP 1 (640 GPUs)" misread a DP 16 / EP 16 replica as one GPU: the sentence
    # and the table cell name what multiplies to the GPUs
    from capplan.models.layout import describe
    from capplan.plan.launch import layout_cell, layout_of

    wide = {"tp": 1, "pp": 1, "attention_dp": 16, "expert_parallel": 16,
            "layout": describe(1, 1, 16, 16, 8)}
    assert layout_of(wide) == "(16 GPUs over 2 nodes: attention TP 1 x DP 16, EP 16)"
    assert layout_cell(wide) == "1xDP16 EP16"
    plain = {"tp": 4, "pp": 1, "attention_dp": 1, "expert_parallel": 1,
             "layout": describe(4, 1, 1, 1, 8)}
    assert (layout_of(plain), layout_cell(plain)) == ("TP 4", "4")
    assert layout_cell({"tp": 8, "pp": 2, "attention_dp": 1, "expert_parallel": 1}) == "8 PP2"


def test_the_other_lines_say_which_setting_differs() -> None:
    # a vLLM plan of 512 batched tokens and max-model-len 4096: TensorRT-LLM prefills whole
    # prompts, so its --max_num_tokens is max(512, 4096) = 4096, not "the same settings";
    # SGLang chunks prompts and keeps 512
    from capplan.plan.launch import sized_for

    best = {"engine": "vllm", "engine_profile": "vllm@0.19", "max_num_batched_tokens": 512,
            "max_model_len": 4096, "engine_flags": {"vllm": "x", "sglang": "x", "trtllm": "x"}}
    assert sized_for(best) == (
        "sized for: vLLM; the SGLang and TensorRT-LLM lines carry the same settings but "
        "TensorRT-LLM's --max_num_tokens 4096 (whole prompts: at least max-model-len 4096; "
        "the plan's budget is 512), not sized for those engines")
    # a budget of at least max-model-len is launched as planned
    assert "but" not in sized_for({**best, "max_num_batched_tokens": 8192})


def test_max_model_len_reason_says_its_p99s_are_the_samples() -> None:
    # a lognormal with a stated p99 of 3000 samples a p99 of 2972: the figure quoted is the
    # sample's, and the reason says so
    _, why = max_model_len_choice(131072, 2972, 300, None)
    assert "2 x (p99 prompt 2972 + p99 output 300 tokens, the p99s of the planned sample of " \
           "requests)" in why
