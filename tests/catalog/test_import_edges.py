"""`models import` at its edges: what a config.json says and what the import makes of it
(MiniMax attn_type_list, the architectures a planner can size, the Hugging Face id, the entry's
name and where it is written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capplan.catalog.hf_import import import_config
from capplan.models.memory import kv_bytes_per_token
from tests.cli._asserts import assert_one_line_error
from tests.conftest import CONFIGS_DIR as CONFIGS

MINIMAX_M27 = [CONFIGS / "minimax-m2.7.config.json",
               CONFIGS / "nvidia-minimax-m2.7-nvfp4.config.json"]


# ---- MiniMax attn_type_list: 0 lightning (linear) attention, 1 softmax attention --------------
# (vLLM minimax_text_01.py: attention_type 0 -> MiniMaxText01LinearAttention, 1 ->
# MiniMaxText01Attention.) MiniMax-M2.7 lists 62 ones: every layer is softmax attention.


@pytest.mark.parametrize("path", MINIMAX_M27, ids=lambda p: p.name)
def test_minimax_m27_all_softmax_layers_import_as_minimax_m25(catalog, path):
    spec = import_config(path)
    twin = catalog.models["minimax-m2.5"]  # same MiniMaxM2ForCausalLM architecture
    for f in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
              "vocab_size", "moe", "mla", "sliding_window", "num_sliding_layers"):
        assert getattr(spec, f) == getattr(twin, f), f
    assert spec.layer_types is None  # plain full attention, no recurrent state
    # KV per token: 62 layers x 2 (K, V) x 8 KV heads x 128 head dim x 2 bytes = 253,952
    assert kv_bytes_per_token(spec, 1, 2) == 62 * 2 * 8 * 128 * 2 == 253_952
    # 230B total on the model card (transformers docs/model_doc/minimax_m2.md)
    assert spec.params_total == pytest.approx(230e9, rel=0.02)


def _minimax(tmp_path: Path, types) -> Path:
    cfg = json.loads(MINIMAX_M27[0].read_text())
    cfg["attn_type_list"] = types
    path = tmp_path / "minimax.json"
    path.write_text(json.dumps(cfg))
    return path


def test_a_lightning_layer_is_refused(run_cli, tmp_path):
    # MiniMax-Text-01's pattern: softmax attention after every seven lightning layers
    types = [1 if i % 8 == 7 else 0 for i in range(62)]
    path = _minimax(tmp_path, types)
    res = run_cli("models", "import", str(path))
    assert_one_line_error(res, "attn_type_list: 55 of 62 layers are MiniMax lightning")
    assert str(path) in res.stderr


@pytest.mark.parametrize(("types", "fragment"), [
    ([1] * 61, "one entry per layer (62)"), ([1] * 61 + [2], "attn_type_list[61]: '2'"),
    ([1] * 61 + [True], "attn_type_list[61]: 'True'"), ("all", "one entry per layer")])
def test_a_malformed_attn_type_list_is_refused(run_cli, tmp_path, types, fragment):
    assert_one_line_error(run_cli("models", "import", str(_minimax(tmp_path, types))), fragment)


# ---- only causal language models --------------------------------------------------------------


def _llama(tmp_path: Path, **changes) -> Path:
    cfg = json.loads((CONFIGS / "llama-3.1-8b-instruct.config.json").read_text())
    cfg.update(changes)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("arch", ["BertModel", "LlamaForSequenceClassification",
                                  "RobertaForMaskedLM"])
def test_an_architecture_that_does_not_generate_is_refused(run_cli, tmp_path, arch):
    res = run_cli("models", "import", str(_llama(tmp_path, architectures=[arch])))
    assert_one_line_error(res, f"architectures: {arch} is not a causal language model")


def test_an_encoder_decoder_is_refused(run_cli, tmp_path):
    path = _llama(tmp_path, architectures=["T5ForConditionalGeneration"],
                  is_encoder_decoder=True)
    assert_one_line_error(run_cli("models", "import", str(path)), "is an encoder-decoder model")


def test_generative_heads_import(tmp_path):
    for arch in ("LlamaForCausalLM", "Gemma3ForConditionalGeneration", "GPT2LMHeadModel"):
        assert import_config(_llama(tmp_path, architectures=[arch])).architecture == arch


# ---- the Hugging Face id, and quantization said elsewhere --------------------------------------


def test_a_local_path_is_not_taken_as_the_hugging_face_id(run_cli, tmp_path):
    # nvidia/Llama-3.1-70B-Instruct-FP8's config.json records where it was saved from:
    # "_name_or_path": "/opt/zhiyu_hf_ckpts/Llama-3.1-70B-Instruct/"
    src = CONFIGS / "nvidia-llama-3.1-70b-instruct-fp8.config.json"
    assert json.loads(src.read_text())["_name_or_path"].startswith("/opt/")
    spec = import_config(src)
    assert spec.hf_id == spec.key == "llama-3.1-70b-instruct"
    res = run_cli("models", "import", str(src))
    assert res.exit_code == 0, res.stderr
    assert "names no Hugging Face id" in res.stderr and "/opt/" not in res.stdout
    res = run_cli("models", "import", str(src), "--hf-id", "nvidia/Llama-3.1-70B-Instruct-FP8")
    assert "hf_id: nvidia/Llama-3.1-70B-Instruct-FP8" in res.stdout
    assert "names no Hugging Face id" not in res.stderr
    # an ORG/NAME id is kept (mistral-nemo's dump records mistralai/Mistral-Nemo-Base-2407)
    assert import_config(CONFIGS / "mistral-nemo-base-2407.config.json").hf_id == \
        "mistralai/Mistral-Nemo-Base-2407"


def test_a_quantized_checkpoint_without_its_quant_config_gets_a_note(run_cli, tmp_path):
    src = CONFIGS / "nvidia-llama-3.1-70b-instruct-fp8.config.json"
    # beside its hf_quant_config.json (ModelOpt FP8) the weights are fp8 and nothing is said
    res = run_cli("models", "import", str(src), "--format", "json")
    assert json.loads(res.stdout)["quantization"]["format"] == "fp8"
    assert "quantization_config" not in res.stderr
    # alone, the FP8 checkpoint's config reads as bf16: said on stderr
    alone = tmp_path / "nvidia-llama-3.1-70b-instruct-fp8.config.json"
    alone.write_text(src.read_text())
    res = run_cli("models", "import", str(alone), "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["quantization"] is None
    assert "names a quantized checkpoint but has no quantization_config" in res.stderr
    assert "weights recorded as bf16" in res.stderr


# ---- the entry's name and where it goes --------------------------------------------------------


@pytest.mark.parametrize("name", ["../evil", "a/b", "My-Model", ".hidden", ""])
def test_a_name_that_is_not_a_simple_key_is_refused(run_cli, tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli("models", "import", str(CONFIGS / "qwen3-32b.config.json"), "--name", name,
                  "--out", str(out / "x.yaml"))
    assert_one_line_error(res, "a catalog key is lower-case letters, digits")
    assert list(out.iterdir()) == []


def test_a_missing_out_folder_is_refused_before_success_is_said(run_cli, tmp_path):
    out = tmp_path / "missing" / "q.yaml"
    res = run_cli("models", "import", str(CONFIGS / "qwen3-32b.config.json"), "--name", "q",
                  "--out", str(out))
    assert_one_line_error(res, f"--out {out}: folder {out.parent} does not exist")
    assert "imported" not in res.stderr


def test_a_layout_list_in_place_of_num_hidden_layers_is_named(run_cli, tmp_path):
    # Nemotron-3 Ultra / 3.5 configs list layers_block_type ('mamba', 'moe', 'attention')
    # instead of num_hidden_layers + hybrid_override_pattern
    cfg = json.loads((CONFIGS / "nemotron-3-nano-30b-a3b.config.json").read_text())
    n = cfg.pop("num_hidden_layers")
    del cfg["hybrid_override_pattern"]
    cfg["layers_block_type"] = ["mamba", "moe", "attention", "moe"] * (n // 4)
    path = tmp_path / "ultra.json"
    path.write_text(json.dumps(cfg))
    res = run_cli("models", "import", str(path))
    assert_one_line_error(res, "layers_block_type: the layer layout layers_block_type")
    assert "lacks" not in res.stderr
