"""`capplan memory`, `capplan gpus`, `capplan models`: the JSON contract and every format."""

from __future__ import annotations

import csv
import io
import json

import pytest

from capplan.catalog.loader import load_catalog

CONTRACT = (
    "weights_bytes_per_gpu", "activation_peak_bytes_per_gpu", "runtime_overhead_bytes_per_gpu",
    "kv_bytes_per_token_per_gpu", "kv_cache_bytes_per_gpu", "num_gpu_blocks", "kv_cache_tokens",
    "max_concurrency", "fits",
)
LLAMA = ("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100-sxm")


def _memory_json(run_cli, *args: str) -> dict:
    res = run_cli("memory", *args, "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert res.stderr == ""
    data = res.json()
    for key in CONTRACT:
        assert key in data, key
    assert isinstance(data["fits"], bool)
    assert isinstance(data["num_gpu_blocks"], int) and isinstance(data["kv_cache_tokens"], int)
    assert data["kv_cache_tokens"] == data["num_gpu_blocks"] * data["block_size"]
    for key in CONTRACT[:-1]:
        assert data[key] >= 0, key
    return data


def test_llama_h100_contract(run_cli):
    d = _memory_json(run_cli, *LLAMA)
    assert (d["model"], d["gpu"], d["tp"]) == ("llama-3.1-8b", "h100-sxm", 1)
    assert d["kv_bytes_per_token_per_gpu"] == 131_072  # 2 * 32 * 8 * 128 * 2 B
    assert d["weights_bytes_per_gpu"] == 8_030_261_248 * 2  # bf16
    assert d["max_model_len"] == 131_072  # the model's max_position_embeddings
    assert d["fits"] is True
    # H100 defaults (vLLM 0.10 on): max_num_batched_tokens 8192, max_num_seqs 1024 -> the
    # Triton top-k/top-p sampler's peak (vLLM 0.17+): (8192 + 2 * 1024) * 4096 * 2 B of hidden
    # states + 1024 sequences x 128256 vocab x (2 + 12) B + the 32 MiB cuBLAS workspace of a
    # Hopper GPU = 83,886,080 + 1,838,678,016 + 33,554,432 (1.82 GiB; vLLM 0.19.0 logs "torch
    # peak memory increase: 1.89GiB" for this model on an H100, llm-d-planner v0.19.0 logs)
    assert d["activation_peak_bytes_per_gpu"] == 1_956_118_528
    # vLLM 0.14-0.16's native sampler (docs/research/vllm_v1_profile_peak.md): 38 B a logit,
    # 83,886,080 + 4,990,697,472 + 33,554,432
    old = _memory_json(run_cli, *LLAMA, "--engine", "vllm@0.14")
    assert old["activation_peak_bytes_per_gpu"] == 5_108_137_984


@pytest.mark.parametrize(("tp", "kv_per_token"), [(2, 65_536), (4, 32_768), (8, 16_384)])
def test_llama_tp(run_cli, tp, kv_per_token):
    one = _memory_json(run_cli, *LLAMA)
    d = _memory_json(run_cli, *LLAMA, "--tp", str(tp))
    assert d["tp"] == tp
    assert d["kv_bytes_per_token_per_gpu"] == kv_per_token  # 2*32*(8/tp)*128*2
    assert d["weights_bytes_per_gpu"] == pytest.approx(one["weights_bytes_per_gpu"] / tp, rel=0.001)
    assert d["kv_cache_tokens"] > one["kv_cache_tokens"]


def test_weight_dtype_fp8(run_cli):
    bf16 = _memory_json(run_cli, *LLAMA)
    d = _memory_json(run_cli, *LLAMA, "--weight-dtype", "fp8")
    assert d["weight_dtype"] == "fp8"
    # 6,979,321,856 linear params at 1 B + 1,050,939,392 tables/norms at 2 B = 9.08e9 B
    assert d["weights_bytes_per_gpu"] == pytest.approx(9_081_200_640, rel=0.001)
    assert d["kv_cache_tokens"] > bf16["kv_cache_tokens"]
    assert d["kv_bytes_per_token_per_gpu"] == 131_072  # KV stays bf16


def test_fp8_suffix_implies_fp8_weights(run_cli):
    d = _memory_json(run_cli, "--model", "meta-llama/Llama-3.1-8B-Instruct-FP8", "--gpu", "h100")
    assert d["weight_dtype"] == "fp8"


def test_kv_dtype_fp8(run_cli):
    bf16 = _memory_json(run_cli, *LLAMA)
    d = _memory_json(run_cli, *LLAMA, "--kv-dtype", "fp8")
    assert d["kv_bytes_per_token_per_gpu"] == 65_536  # half of 131072
    # same KV bytes, half the bytes per token: twice the blocks (give or take the floor)
    assert abs(d["num_gpu_blocks"] - 2 * bf16["num_gpu_blocks"]) <= 1


def test_mla_model(run_cli):
    d = _memory_json(run_cli, "--model", "deepseek-v2-lite", "--gpu", "h100-sxm",
                     "--max-model-len", "32768")
    assert d["kv_bytes_per_token_per_gpu"] == 31_104  # 27 layers * (512 + 64) * 2 B
    d2 = _memory_json(run_cli, "--model", "deepseek-v2-lite", "--gpu", "h100-sxm",
                      "--max-model-len", "32768", "--tp", "2")
    assert d2["kv_bytes_per_token_per_gpu"] == 31_104  # replicated over TP


def test_sliding_window_model(run_cli):
    d = _memory_json(run_cli, "--model", "gemma-2-9b", "--gpu", "h100-sxm")
    assert d["max_model_len"] == 8192
    assert d["kv_bytes_per_token_per_gpu"] == 42 * 2 * 8 * 256 * 2  # 344,064 B
    # vLLM's reservation for one 8192-token sequence with the H100 default of 8192 batched
    # tokens: full layers 512 blocks, window layers cdiv(min(4095 + 8192, 8192), 16) + 1 = 513:
    # 21 * 512 + 21 * 513 = 21525 blocks of 16 tokens * 8192 B
    assert d["kv_bytes_per_max_len_seq"] == 21_525 * 16 * 8192
    # so the paged estimate is no better than contiguous here (21525 vs 42 * 512 = 21504)
    assert d["max_concurrency"] <= d["contiguous_max_concurrency"] + 1


def test_moe_on_two_gpus(run_cli):
    d = _memory_json(run_cli, "--model", "mistralai/Mixtral-8x7B-Instruct-v0.1", "--gpu",
                     "h100-sxm", "--tp", "2", "--max-model-len", "32768")
    assert d["tp"] == 2
    assert d["fits"] is True
    # 46.7e9 params / 2 GPUs * 2 B = ~43.5 GiB per GPU
    assert d["weights_bytes_per_gpu"] / 2**30 == pytest.approx(46.70e9 * 2 / 2 / 2**30, rel=0.01)
    assert d["kv_bytes_per_token_per_gpu"] == 32 * 2 * 4 * 128 * 2  # 65,536 B


def test_does_not_fit_is_exit_0_with_reason(run_cli):
    res = run_cli("memory", "--model", "llama-3.1-70b", "--gpu", "l4", "--format", "json")
    assert res.exit_code == 0
    d = res.json()
    assert d["fits"] is False and d["kv_cache_tokens"] == 0
    assert "weights" in d["reason"]


def test_json_is_strict(run_cli):
    res = run_cli("memory", *LLAMA, "--format", "json")
    json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_table_format(run_cli):
    res = run_cli("memory", *LLAMA)
    assert res.exit_code == 0, res.stderr
    assert "llama-3.1-8b on h100-sxm (1 GPU: TP 1)" in res.stdout
    assert "KV cache (tokens)" in res.stdout
    assert "fits" in res.stdout


def test_markdown_format(run_cli):
    res = run_cli("memory", *LLAMA, "--format", "markdown")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("| quantity")
    assert set(lines[1]) <= set("|-: ")


def test_csv_format(run_cli):
    res = run_cli("memory", *LLAMA, "--format", "csv")
    assert res.exit_code == 0, res.stderr
    rows = list(csv.reader(io.StringIO(res.stdout)))
    # machine-readable: the JSON contract keys with SI values
    assert rows[0] == ["key", "value (SI)"]
    values = dict(rows[1:])
    assert values["weight_dtype"] == "bf16"
    assert float(values["kv_bytes_per_token_per_gpu"]) == 131_072  # 2 * 32 * 8 * 128 * 2 B
    assert int(values["kv_cache_tokens"]) == int(values["num_gpu_blocks"]) * 16


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "markdown"])
@pytest.mark.parametrize("cmd", ["gpus", "models"])
def test_list_commands_every_format(run_cli, cmd, fmt):
    res = run_cli(cmd, "--format", fmt)
    assert res.exit_code == 0, res.stderr
    cat = load_catalog()
    keys = sorted(cat.gpus if cmd == "gpus" else cat.models)
    if fmt == "json":
        assert [row["key"] for row in res.json()] == keys
    elif fmt == "csv":
        rows = list(csv.reader(io.StringIO(res.stdout)))
        assert [r[0] for r in rows[1:]] == keys
    else:
        for key in keys:
            assert key in res.stdout, key


def test_models_json_fields(run_cli):
    rows = {r["key"]: r for r in run_cli("models", "--format", "json").json()}
    assert rows["deepseek-v3"]["attention"] == "MLA"
    assert rows["llama-3.1-8b"]["attention"] == "GQA 8 KV heads"
    assert rows["mixtral-8x7b"]["moe"] == "8x top-2"
    assert rows["gpt-oss-120b"]["weight_format"] == "mxfp4"
    assert rows["gemma-2-9b"]["sliding_window"] == 4096


def test_gpus_json_si_units(run_cli):
    rows = {r["key"]: r for r in run_cli("gpus", "--format", "json").json()}
    h = rows["h100-sxm"]
    assert h["memory_bytes"] == 81_559 * 2**20
    assert h["memory_bandwidth_bytes_per_s"] == 3.35e12
    assert h["bf16_dense_flops_per_s"] == pytest.approx(989.4e12)


def test_subprocess_memory_json(run_module):
    res = run_module("memory", *LLAMA, "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["kv_bytes_per_token_per_gpu"] == 131_072


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_budget_row_holds_what_its_engine_counts_in_it(run_cli, engine):
    # vLLM's fraction of total memory holds weights, activations, runtime overhead and the KV
    # cache; SGLang's static pools hold weights, overhead and KV (activations and CUDA graphs
    # outside); TensorRT-LLM's fraction is the KV cache's share of free memory. The budget row
    # is the sum of the rows its label names, and the rows left out say so.
    rows = {}
    for line in run_cli("memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine",
                        engine).stdout.splitlines()[2:]:
        key, _, val = line.rpartition("  ")
        rows[key.strip()] = val.strip()
    budget = next(float(v) for k, v in rows.items() if " of " in k and "(GiB)" in k)
    act = next(k for k in rows if k.startswith("activation peak"))
    parts = {"vllm": ["weights per GPU (GiB)", act, "runtime overhead (GiB)", "KV cache (GiB)"],
             "sglang": ["weights per GPU (GiB)", "runtime overhead (GiB)", "KV cache (GiB)"],
             "trtllm": ["KV cache (GiB)"]}[engine]
    assert budget == pytest.approx(sum(float(rows[k]) for k in parts), abs=0.02)
    assert ("outside budget" in act) is (engine == "sglang")
