"""Resolving what users type (catalog keys, HF ids, checkpoint suffixes, NVML names)."""

from __future__ import annotations

import re

import pytest

from capplan.errors import CatalogError, InputError


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("llama-3.1-8b", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("META-LLAMA/LLAMA-3.1-8B-INSTRUCT", "llama-3.1-8b"),
        ("meta-llama/llama-3.1-8b-instruct", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),  # without -Instruct
        ("Llama-3.1-8B-Instruct", "llama-3.1-8b"),  # without the org
        ("llama 3.1 8b", "llama-3.1-8b"),  # spaces normalise to dashes
        ("  llama_3.1_8b  ", "llama-3.1-8b"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("Qwen/Qwen2.5-7B", "qwen2.5-7b"),
        ("Qwen/Qwen3-32B", "qwen3-32b"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
        ("google/gemma-2-9b", "gemma-2-9b"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("deepseek-ai/DeepSeek-V2-Lite", "deepseek-v2-lite"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
    ],
)
def test_model_names(catalog, name, key):
    r = catalog.resolve_model(name)
    assert r.spec.key == key
    assert r.implied_weight_dtype is None


@pytest.mark.parametrize(
    ("name", "key", "dtype"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b", "fp8"),
        ("Llama-3.1-8B-Instruct-FP8-dynamic", "llama-3.1-8b", "fp8"),
        ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8", "llama-3.1-8b", "fp8"),
        ("Qwen/Qwen3-235B-A22B-FP8", "qwen3-235b-a22b", "fp8"),
        ("qwen3-32b-fp8", "qwen3-32b", "fp8"),
        ("Qwen/Qwen2.5-7B-Instruct-AWQ", "qwen2.5-7b", "int4"),
        ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "qwen2.5-7b", "int4"),
        ("llama-3.1-8b-instruct-w8a8", "llama-3.1-8b", "int8"),
    ],
)
def test_suffix_implies_weight_dtype(catalog, name, key, dtype):
    r = catalog.resolve_model(name)
    assert r.spec.key == key
    assert r.implied_weight_dtype == dtype


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("h100-sxm", "h100-sxm"),
        ("H100", "h100-sxm"),
        ("h100 sxm", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),  # nvidia-smi / NVML name
        ("nvidia h100 80gb hbm3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA H200", "h200"),
        ("AMD Instinct MI300X", "mi300x"),
        ("NVIDIA H100 SXM5 80GB", "h100-sxm"),  # the catalog's display name
    ],
)
def test_gpu_names(catalog, name, key):
    assert catalog.gpu(name).key == key


def _nearest(message: str) -> list[str]:
    m = re.search(r"nearest: (.*) \(see `capplan (?:gpus|models)`\)$", message)
    assert m, message
    return m.group(1).split(", ")


@pytest.mark.parametrize("name", ["h1000", "a100x", "tpu-v5e", "nvidia blackwell"])
def test_unknown_gpu_lists_three_nearest(catalog, name):
    with pytest.raises(CatalogError) as e:
        catalog.gpu(name)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"unknown GPU {name!r}")
    near = _nearest(msg)
    assert len(near) == 3
    for n in near:  # each suggestion is itself a name that resolves
        catalog.gpu(n)


def test_unknown_gpu_suggests_the_close_one(catalog):
    with pytest.raises(CatalogError) as e:
        catalog.gpu("h1000")
    assert "h100-sxm" in _nearest(str(e.value))


@pytest.mark.parametrize("name", ["llama-9-8b", "meta-llama/Llama-3.1-9B", "gpt-5", "qwen9"])
def test_unknown_model_lists_three_nearest(catalog, name):
    with pytest.raises(CatalogError) as e:
        catalog.resolve_model(name)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"unknown model {name!r}")
    near = _nearest(msg)
    assert len(near) == 3
    for n in near:
        assert n in catalog.models


def test_unknown_model_suggests_the_close_one(catalog):
    with pytest.raises(CatalogError) as e:
        catalog.resolve_model("meta-llama/Llama-3.1-9B-Instruct")
    assert "llama-3.1-8b" in _nearest(str(e.value))


def test_catalog_error_is_an_input_error():
    # exit code 2 through the CLI's InputError branch
    assert issubclass(CatalogError, InputError)
    assert CatalogError.exit_code == 2


# ---------------------------------------------------------------------------------------------
# The checkpoint launch lines serve: the exact id the user gave (issue 15 item 1)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-72B-Instruct",
                                  "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8",
                                  "meta-llama/Llama-3.1-8B-Instruct"])
def test_served_id_is_the_id_given(catalog, name):
    r = catalog.resolve_model(name)
    assert r.served_id == name and r.spec.hf_id == name


def test_catalog_key_serves_the_catalog_hf_id(catalog):
    r = catalog.resolve_model("qwen2.5-72b")
    assert r.served_id == "Qwen/Qwen2.5-72B" == r.spec.hf_id


def test_fp8_checkpoint_carries_its_own_format(catalog):
    r = catalog.resolve_model("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8")
    assert r.spec.quantization is not None and r.spec.quantization.format == "fp8"
    assert catalog.resolve_model("meta-llama/Llama-3.1-70B-Instruct").spec.quantization is None


def test_instruct_checkpoint_context_limit(catalog):
    # Qwen2.5-72B-Instruct's config.json allows 32768 tokens, the base 131072
    assert catalog.resolve_model("Qwen/Qwen2.5-72B-Instruct").spec.max_position_embeddings == 32768
    assert catalog.resolve_model("Qwen/Qwen2.5-72B").spec.max_position_embeddings == 131072
    # so does the 7B's (its config.json: 32768; the shared reference's maxtext copy)
    assert catalog.resolve_model("Qwen/Qwen2.5-7B-Instruct").spec.max_position_embeddings == 32768
    assert catalog.resolve_model("Qwen/Qwen2.5-7B").spec.max_position_embeddings == 131072


def test_import_hf_id_option(run_cli, tmp_path):
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "data" / "configs" / "phi-1.config.json"
    res = run_cli("models", "import", str(src), "--name", "phi-1", "--format", "json")
    assert res.exit_code == 0 and "--hf-id" in res.stderr  # no _name_or_path in the config
    res = run_cli("models", "import", str(src), "--name", "phi-1", "--hf-id", "microsoft/phi-1",
                  "--format", "json")
    assert res.exit_code == 0 and res.json()["hf_id"] == "microsoft/phi-1"


def test_recommend_prints_the_instruct_id(run_cli):
    res = run_cli("recommend", "--model", "Qwen/Qwen2.5-72B-Instruct", "--rate", "1",
                  "--input-len", "1000", "--output-len", "200", "--gpu", "h100-sxm",
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    assert "vllm serve Qwen/Qwen2.5-72B-Instruct " in text
    assert "vllm serve Qwen/Qwen2.5-72B " not in text
    lens = [int(x) for x in re.findall(r"--max-model-len (\d+)", text)]
    assert lens and max(lens) <= 32768  # the Instruct checkpoint's limit, not the base's
