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

CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"
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
