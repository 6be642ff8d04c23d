"""Engine launch commands of a recommendation: vLLM, SGLang and the benchmark that checks it.

Flag names as `vllm serve --help` (0.10-0.11) and `python -m sglang.launch_server --help`
(0.4-0.5) spell them. Unit cases build the recommendation dict by hand; the CLI cases check
that the flags printed with each recommendation repeat that recommendation's own fields.
"""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace
from typing import Any

import pytest

from capplan.plan.flags import engine_flags


def parse_cmd(cmd: str, prefix_words: int) -> dict[str, str | None]:
    """'--flag value' pairs of a command line after its first `prefix_words` words."""
    words = shlex.split(cmd, comments=True)
    flags: dict[str, str | None] = {}
    rest = words[prefix_words:]
    i = 0
    while i < len(rest):
        w = rest[i]
        assert w.startswith("--"), (w, cmd)
        assert w not in flags, f"{w} given twice in {cmd}"
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            flags[w], i = rest[i + 1], i + 2
        else:
            flags[w], i = None, i + 1
    return flags


def vllm_flags(cmd: str) -> dict[str, str | None]:
    assert cmd.startswith("vllm serve "), cmd
    return parse_cmd(cmd, 3)  # vllm serve MODEL


def sglang_flags(cmd: str) -> dict[str, str | None]:
    assert cmd.startswith("python -m sglang.launch_server "), cmd
    return parse_cmd(cmd, 3)


def bench_flags(cmd: str) -> dict[str, str | None]:
    assert cmd.startswith("vllm bench serve "), cmd
    return parse_cmd(cmd, 3)


def rec(**kw: Any) -> dict[str, Any]:
    r = {"tp": 2, "pp": 1, "max_num_seqs": 128, "max_num_batched_tokens": 2048,
         "gpu_memory_utilization": 0.92, "max_model_len": 8192, "weight_dtype": "auto",
         "kv_dtype": "auto", "per_replica_rate_per_s": 3.25, "replicas": 4}
    r.update(kw)
    return r


TRAFFIC = SimpleNamespace(inp=SimpleNamespace(mean=1000.4), out=SimpleNamespace(mean=299.6))


@pytest.fixture(scope="module")
def llama(catalog):  # noqa: ANN001, ANN201
    m = catalog.resolve_model("llama-3.1-8b").spec
    assert m.quantization is None and m.torch_dtype == "bf16"  # a bf16 checkpoint
    return m


@pytest.fixture(scope="module")
def fp8_checkpoint(catalog):  # noqa: ANN001, ANN201
    m = catalog.resolve_model("deepseek-v3").spec
    assert m.quantization is not None and m.quantization.format == "fp8"
    return m


# -- vLLM --------------------------------------------------------------------------------------

def test_vllm_command_carries_the_engine_settings(llama) -> None:
    f = engine_flags(llama, rec(), TRAFFIC)
    assert f["vllm"].startswith(f"vllm serve {llama.hf_id} ")
    v = vllm_flags(f["vllm"])
    assert v["--tensor-parallel-size"] == "2"
    assert v["--max-num-seqs"] == "128"
    assert v["--max-num-batched-tokens"] == "2048"
    assert float(v["--gpu-memory-utilization"]) == pytest.approx(0.92)
    assert v["--max-model-len"] == "8192"
    assert "--kv-cache-dtype" not in v and "--quantization" not in v
    assert "--pipeline-parallel-size" not in v


def test_vllm_pipeline_parallel_only_when_used(llama) -> None:
    v = vllm_flags(engine_flags(llama, rec(pp=2), TRAFFIC)["vllm"])
    assert v["--pipeline-parallel-size"] == "2"


@pytest.mark.parametrize(("kv", "flag"), [("fp8", "fp8"), ("auto", None), ("bf16", None)])
def test_vllm_kv_cache_dtype(llama, kv, flag) -> None:
    v = vllm_flags(engine_flags(llama, rec(kv_dtype=kv), TRAFFIC)["vllm"])
    assert v.get("--kv-cache-dtype") == flag


@pytest.mark.parametrize(("wd", "flag"), [("fp8", "fp8"), ("auto", None), ("bf16", None)])
def test_vllm_quantization_on_a_bf16_checkpoint(llama, wd, flag) -> None:
    v = vllm_flags(engine_flags(llama, rec(weight_dtype=wd), TRAFFIC)["vllm"])
    assert v.get("--quantization") == flag


@pytest.mark.parametrize("wd", ["fp8", "auto"])
def test_no_online_quantization_of_an_fp8_checkpoint(fp8_checkpoint, wd) -> None:
    f = engine_flags(fp8_checkpoint, rec(tp=8, weight_dtype=wd), TRAFFIC)
    assert "--quantization" not in vllm_flags(f["vllm"])
    assert "--quantization" not in sglang_flags(f["sglang"])


def test_int4_asks_for_a_prequantized_checkpoint(llama) -> None:
    cmd = engine_flags(llama, rec(weight_dtype="int4"), TRAFFIC)["vllm"]
    assert "--quantization" not in vllm_flags(cmd)
    assert "#" in cmd and "int4" in cmd.split("#", 1)[1]


# -- SGLang ------------------------------------------------------------------------------------

def test_sglang_command_carries_the_engine_settings(llama) -> None:
    f = engine_flags(llama, rec(), TRAFFIC)
    s = sglang_flags(f["sglang"])
    assert s["--model-path"] == llama.hf_id
    assert s["--tp"] == "2"
    assert s["--max-running-requests"] == "128"
    assert s["--chunked-prefill-size"] == "2048"
    assert float(s["--mem-fraction-static"]) == pytest.approx(0.92)
    assert s["--context-length"] == "8192"
    assert "--kv-cache-dtype" not in s and "--quantization" not in s


def test_sglang_fp8_kv_and_weights(llama) -> None:
    s = sglang_flags(engine_flags(llama, rec(kv_dtype="fp8", weight_dtype="fp8"),
                                  TRAFFIC)["sglang"])
    assert s["--kv-cache-dtype"] in ("fp8_e4m3", "fp8_e5m2")
    assert s["--quantization"] == "fp8"


# -- the benchmark -----------------------------------------------------------------------------

@pytest.mark.parametrize("per_replica", [3.25, 0.4, 12.0, 1 / 3])
def test_bench_runs_at_the_per_replica_rate(llama, per_replica) -> None:
    f = engine_flags(llama, rec(per_replica_rate_per_s=per_replica), TRAFFIC)
    b = bench_flags(f["bench"])
    assert b["--model"] == llama.hf_id
    assert float(b["--request-rate"]) == pytest.approx(per_replica, rel=5e-3)
    # the plan's lengths come from the dataset capplan writes (one line per request)
    assert b["--dataset-name"] == "custom" and b["--custom-output-len"] == "-1"
    assert b["--dataset-path"] in f["bench_dataset"] and "--ignore-eos" in b
    assert int(b["--num-prompts"]) >= 200


# -- what the CLI prints -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def fp8_recs(tmp_path_factory) -> dict[str, Any]:
    from click.testing import CliRunner

    from capplan.cli import cli

    home = tmp_path_factory.mktemp("home")
    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:
        runner = CliRunner()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAPPLAN_HOME", str(home))
        mp.delenv("CAPPLAN_CATALOG_DIR", raising=False)
        res = runner.invoke(cli, [
            "recommend", "--model", "llama-3.1-8b", "--rate", "40", "--input-len", "1000",
            "--output-len", "300", "--ttft-p99", "1.0", "--tbt-p99", "0.05", "--gpu", "h100-sxm",
            "--gpu", "l40s", "--weight-dtype", "fp8", "--weight-dtype", "bf16",
            "--kv-dtype", "fp8", "--kv-dtype", "auto", "--verify-top", "0", "--format", "json"],
            prog_name="capplan")
    assert res.exit_code == 0, (res.stderr, res.exception)
    return json.loads(res.stdout)


def test_cli_flags_repeat_each_recommendation(fp8_recs) -> None:
    recs = fp8_recs["recommendations"]
    assert {(r["weight_dtype"], r["kv_dtype"]) for r in recs} >= {("fp8", "fp8"),
                                                                  ("bf16", "auto")}
    for r in recs:
        v = vllm_flags(r["engine_flags"]["vllm"])
        s = sglang_flags(r["engine_flags"]["sglang"])
        assert int(v["--tensor-parallel-size"]) == r["tp"] == int(s["--tp"])
        assert int(v["--max-num-seqs"]) == r["max_num_seqs"] == int(s["--max-running-requests"])
        assert int(v["--max-num-batched-tokens"]) == r["max_num_batched_tokens"] == int(
            s["--chunked-prefill-size"])
        assert int(v["--max-model-len"]) == r["max_model_len"] == int(s["--context-length"])
        assert float(v["--gpu-memory-utilization"]) == pytest.approx(
            r["gpu_memory_utilization"])
        fp8_kv, fp8_w = r["kv_dtype"] == "fp8", r["weight_dtype"] == "fp8"
        assert (v.get("--kv-cache-dtype") == "fp8") is fp8_kv, r["engine_flags"]["vllm"]
        assert ("--kv-cache-dtype" in s) is fp8_kv
        assert (v.get("--quantization") == "fp8") is fp8_w
        assert (s.get("--quantization") == "fp8") is fp8_w
        b = bench_flags(r["engine_flags"]["bench"])
        assert float(b["--request-rate"]) == pytest.approx(40 / r["replicas"], rel=5e-3)


def test_price_override_changes_cost_and_rejects_bad_prices(run_cli):
    args = ("recommend", "--model", "llama-3.1-8b", "--rate", "5", "--input-len", "512",
            "--output-len", "128", "--gpu", "b200", "--tp", "1", "--verify-top", "0")
    res = run_cli(*args, "--price", "b200=5.5", "--format", "json")
    assert res.exit_code == 0, res.stderr
    best = res.json()["recommendations"][0]
    # the catalog has no B200 price; the override makes cost = 5.5 $/GPU-hour x GPUs
    assert best["cost_per_hour"] == pytest.approx(5.5 * best["gpus_total"])
    for bad in ("b200=-1", "b200=abc", "b200=inf"):
        res = run_cli(*args, "--price", bad)
        assert res.exit_code == 2
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("Error:")


# -- the served checkpoint (issue 15 item 1) ----------------------------------------------------

@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-72B-Instruct",
                                  "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8"])
def test_launch_lines_serve_the_id_given(catalog, name) -> None:
    r = catalog.resolve_model(name)
    wd = r.implied_weight_dtype or "bf16"
    f = engine_flags(r.spec, rec(weight_dtype=wd), TRAFFIC)
    assert f["vllm"].startswith(f"vllm serve {name} ")
    assert f["sglang"].startswith(f"python -m sglang.launch_server --model-path {name} ")
    assert f"--model {name} " in f["bench"]
    # an FP8 checkpoint is served as it ships: no on-the-fly --quantization
    assert "--quantization" not in f["vllm"] and "--quantization" not in f["sglang"]


def test_each_engine_line_holds_the_planned_kv_cache(catalog):
    """Each launch line's memory fraction, read back by that engine's own rule, gives the KV
    cache the plan counted on (within the 0.001 rounding up)."""
    from capplan.models.engine import SGLANG, TRTLLM, VLLM
    from capplan.models.memory import memory_report
    from capplan.plan.deployment import EngineOptions, resolve_settings
    from capplan.plan.flags import memory_fractions

    gpu, model = catalog.gpu("h100-sxm"), catalog.model("llama-3.1-8b")
    s = resolve_settings(EngineOptions(max_model_len=8192), gpu)
    mem = memory_report(model, gpu, s)
    frac = memory_fractions(mem)
    total, w, act = (mem.total_memory_bytes, mem.weights_bytes_per_gpu,
                     mem.activation_peak_bytes_per_gpu)
    overheads = (mem.runtime_overhead_bytes_per_gpu, mem.cuda_graph_bytes_per_gpu,
                 mem.context_bytes_per_gpu)
    assert overheads[2] > 0  # the CUDA context, which SGLang's and TRT-LLM's rules count
    for name, prof in (("vllm", VLLM), ("sglang", SGLANG), ("trtllm", TRTLLM)):
        kv = prof.memory.kv_budget(total, frac[name], w, act, overheads).kv_cache_bytes
        assert mem.kv_cache_bytes_per_gpu <= kv <= mem.kv_cache_bytes_per_gpu + 0.002 * total
    # SGLang's static fraction leaves out the activation peak, so it is below vLLM's
    assert frac["sglang"] < frac["vllm"]


def test_printed_verify_command_names_the_json_export(run_cli, tmp_path, monkeypatch):
    """After `recommend --export DIR/p.json` the printed `dataset:` line reads that file (not
    the placeholder PLAN.json) and runs as printed; without a JSON export, PLAN.json stays."""
    base = ("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "2",
            "--verify-top", "0", "--no-disagg")
    plan = tmp_path / "my plan.json"  # a space: the path is quoted for the shell
    res = run_cli(*base, "--export", str(plan))
    assert res.exit_code == 0, res.stderr
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("dataset: ")]
    words = shlex.split(line.removeprefix("dataset: "))
    assert words[:3] == ["capplan", "verify", str(plan)]
    monkeypatch.chdir(tmp_path)
    ran = run_cli(*words[1:])
    assert ran.exit_code == 0, ran.stderr
    assert (tmp_path / words[words.index("--write-dataset") + 1]).stat().st_size > 0
    plain = run_cli(*base)
    assert "dataset: capplan verify PLAN.json --client vllm" in plain.stdout
