"""A model's shape is bounded at the edge (capplan/limits.py MODEL_*): `models import` refuses a
config.json field past its bound in one line before any layer is laid out (10**9 layers hung
the import for over ten minutes; 10**6 imported with absurd sizes; a context of 10**12 was
accepted), and a model YAML from --catalog-dir is held to the same bounds."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from capplan import limits as L
from tests.catalog.test_import_edges import _llama as _config
from tests.cli._asserts import assert_one_line_error
from tests.conftest import CONFIGS_DIR as CONFIGS


@pytest.mark.parametrize(("field", "value"), [
    ("num_hidden_layers", 10**6), ("num_hidden_layers", 10**9), ("hidden_size", 2**20),
    ("num_attention_heads", 4096), ("num_key_value_heads", 2048), ("head_dim", 65536),
    ("intermediate_size", 10**7), ("vocab_size", 10**8), ("max_position_embeddings", 10**12),
])
def test_import_refuses_a_config_field_past_its_bound(run_cli, tmp_path, field, value):
    path = _config(tmp_path, **{field: value})
    started = time.monotonic()
    res = run_cli("models", "import", str(path), "--name", "z")
    assert time.monotonic() - started < 10  # refused before any per-layer work
    assert_one_line_error(res, f"config field {field}: {value:,} must be >= 1")
    assert str(path) in res.stderr


def test_import_refuses_too_many_experts(run_cli, tmp_path):
    cfg = json.loads((CONFIGS / "mixtral-8x7b.config.json").read_text())
    cfg["num_local_experts"] = 10**6
    path = tmp_path / "moe.json"
    path.write_text(json.dumps(cfg))
    assert_one_line_error(run_cli("models", "import", str(path)),
                          "config field num_local_experts: 1,000,000 must be")


def test_bounds_hold_the_largest_published_figures(catalog):
    # The reasons' figures, read from the shipped entries (each sourced from its config.json):
    # Llama-3.1-405B 126 layers / 16384 hidden / 53248 MLP / 128 heads, Gemma 3 262,208 tokens,
    # Qwen3-Next 512 experts, Llama 4 Scout 10,485,760 tokens of context.
    m = catalog.models
    assert (m["llama-3.1-405b"].num_layers, m["llama-3.1-405b"].hidden_size) == (126, 16384)
    assert m["llama-3.1-405b"].intermediate_size == 53248
    assert m["gemma-3-27b"].vocab_size == 262_208
    assert m["qwen3-next-80b-a3b"].moe.num_experts == 512
    assert m["llama-4-scout"].max_position_embeddings == 10_485_760
    for spec in m.values():  # and every shipped model lies inside them
        assert spec.num_layers <= L.MODEL_LAYERS.hi
        assert spec.max_position_embeddings <= L.MODEL_CONTEXT.hi


@pytest.mark.parametrize(("field", "value"), [
    ("num_layers", 10**6), ("max_position_embeddings", 10**12), ("vocab_size", 10**9)])
def test_catalog_dir_model_held_to_the_same_bounds(run_cli, tmp_path, catalog, field, value):
    (tmp_path / "models").mkdir()
    bad = tmp_path / "models" / "huge.yaml"
    data = catalog.models["llama-3.1-8b"].model_dump(mode="json")
    data.update(key="huge", aliases=[], hf_id="example/huge", **{field: value})
    bad.write_text(yaml.safe_dump(data))
    res = run_cli("memory", "--model", "huge", "--gpu", "h100-sxm", "--catalog-dir", str(tmp_path))
    assert_one_line_error(res, f"{field}: {value:,} must be >= 1")
    assert str(bad) in res.stderr
