"""`capplan models import CONFIG.json` on real Hugging Face config.json files
(tests/data/configs, provenance in SOURCES.md), checked against the hand-curated catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from capplan.catalog.hf_import import import_config
from capplan.catalog.schema import ModelSpec
from capplan.errors import InputError

CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"

# config file -> the catalog entry of the same architecture
CATALOG_KEY = {
    "deepseek-v3": "deepseek-v3",
    "gemma-2-9b-it": "gemma-2-9b",
    "gemma-3-27b-it": "gemma-3-27b",
    "gpt-oss-120b": "gpt-oss-120b",
    "llama-3.1-8b-instruct": "llama-3.1-8b",
    "llama-3.3-70b-instruct": "llama-3.3-70b",
    "mixtral-8x7b": "mixtral-8x7b",
    "qwen2.5-7b-instruct": "qwen2.5-7b",
    "qwen3-32b": "qwen3-32b",
    # Qwen3-Coder-30B-A3B shares Qwen3-30B-A3B's MoE architecture; only the (unused, every layer
    # is MoE) dense intermediate_size and max_position_embeddings differ.
    "qwen3-coder-30b-a3b-instruct": "qwen3-30b-a3b",
}
ALL_CONFIG_FILES = sorted(CONFIGS.glob("*.config.json"))
CONFIG_FILES = [p for p in ALL_CONFIG_FILES if p.name.removesuffix(".config.json") in CATALOG_KEY]
ARCH_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
               "vocab_size", "tie_word_embeddings", "mlp_gated", "torch_dtype", "quantization",
               "moe", "mla", "sliding_window", "num_sliding_layers")


def _stem(p: Path) -> str:
    return p.name.removesuffix(".config.json")


def test_every_config_has_a_catalog_twin():
    assert set(CATALOG_KEY) <= {_stem(p) for p in ALL_CONFIG_FILES}


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[_stem(p) for p in CONFIG_FILES])
def test_import_matches_catalog(catalog, path):
    spec = import_config(path)
    want = catalog.models[CATALOG_KEY[_stem(path)]]
    for f in ARCH_FIELDS:
        got, exp = getattr(spec, f), getattr(want, f)
        if f == "quantization" and got is not None and exp is not None:
            got, exp = got.model_copy(update={"exclude": []}), exp  # names kept only on import
        assert got == exp, f"{path.name}: {f}"
    if want.moe is None or want.moe.num_dense_layers:
        assert spec.intermediate_size == want.intermediate_size
    assert spec.params_total == pytest.approx(want.params_total, rel=0.02)
    # params_active is not compared: model cards differ on counting the input embedding
    # (gpt-oss-120b's 5.1B leaves out its 0.58B embedding; capplan counts it).
    assert spec.params_active <= spec.params_total
    assert (spec.params_active < spec.params_total) == (spec.moe is not None)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[_stem(p) for p in CONFIG_FILES])
def test_import_cli_writes_loadable_yaml(run_cli, tmp_path, path):
    res = run_cli("models", "import", str(path))
    assert res.exit_code == 0, res.stderr
    data = yaml.safe_load(res.stdout)
    spec = ModelSpec.model_validate(data)  # round-trips through the catalog schema
    assert spec.num_layers == import_config(path).num_layers

    out = tmp_path / "models" / f"{spec.key}.yaml"
    out.parent.mkdir()
    res = run_cli("models", "import", str(path), "--out", str(out), "--name", spec.key)
    assert res.exit_code == 0, res.stderr
    assert ModelSpec.model_validate(yaml.safe_load(out.read_text())) == spec


def test_imported_yaml_usable_as_catalog_dir(run_cli, tmp_path):
    src = CONFIGS / "qwen2.5-7b-instruct.config.json"
    (tmp_path / "models").mkdir()
    out = tmp_path / "models" / "my-qwen.yaml"
    res = run_cli("models", "import", str(src), "--name", "my-qwen", "--out", str(out))
    assert res.exit_code == 0, res.stderr
    res = run_cli("memory", "--model", "my-qwen", "--gpu", "h100-sxm", "--max-model-len", "8192",
                  "--catalog-dir", str(tmp_path), "--format", "json")
    assert res.exit_code == 0, res.stderr
    # Qwen2.5-7B: 28 layers * 2 * 4 kv heads * 128 * 2 B = 57344 B/token
    assert res.json()["kv_bytes_per_token_per_gpu"] == 57_344


def test_llama_import_exact_fields():
    spec = import_config(CONFIGS / "llama-3.1-8b-instruct.config.json")
    # Straight from the JSON: 32 layers, 4096 hidden, 14336 MLP, 32/8 heads, 128256 vocab
    assert (spec.num_layers, spec.hidden_size, spec.intermediate_size) == (32, 4096, 14336)
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (32, 8, 128)
    assert spec.vocab_size == 128_256
    assert spec.max_position_embeddings == 131_072
    assert spec.params_total == 8_030_261_248  # see tests/unit/test_memory.py for the sum


def test_gemma3_sparse_text_config_uses_transformers_defaults():
    # gemma-3-27b-it's text_config omits vocab_size and tie_word_embeddings; Gemma3TextConfig
    # defaults are vocab_size=262208 and tied embeddings. 62 layers, 1 global per 6 -> 52 sliding.
    spec = import_config(CONFIGS / "gemma-3-27b-it.config.json")
    assert spec.vocab_size == 262_208
    assert spec.tie_word_embeddings is True
    assert (spec.sliding_window, spec.num_sliding_layers) == (1024, 62 - 62 // 6)
    # SigLIP encoder: 27 * (4 * 1152^2 + 2 * 1152 * 4304) + 1152 * 5376 projector = 417,263,616
    # (Gemma 3 report Table 1: 417M vision parameters)
    assert spec.vision_params == pytest.approx(417e6, rel=0.01)


# ---------------------------------------------------------------------------------------------
# Bad files: exit 2, one line, naming the file
# ---------------------------------------------------------------------------------------------


def _assert_one_line_error(res, path: Path, *fragments: str) -> None:
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert res.stdout == ""
    lines = res.stderr_lines
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("Error: ")
    assert str(path) in lines[0]
    assert "Traceback" not in res.stderr
    for frag in fragments:
        assert frag in lines[0]


def test_malformed_json(run_cli, tmp_path):
    bad = tmp_path / "broken.config.json"
    bad.write_text('{\n  "hidden_size": 4096,\n  "num_hidden_layers": 32,,\n}\n')
    res = run_cli("models", "import", str(bad))
    _assert_one_line_error(res, bad, "malformed JSON")
    assert f"{bad}:3:" in res.stderr  # the line of the stray comma


def test_malformed_json_subprocess(run_module, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    _assert_one_line_error(run_module("models", "import", str(bad)), bad, "malformed JSON")


def test_json_not_an_object(run_cli, tmp_path):
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2, 3]")
    _assert_one_line_error(run_cli("models", "import", str(bad)), bad, "JSON object")


@pytest.mark.parametrize("field", ["num_hidden_layers", "hidden_size", "num_attention_heads",
                                   "vocab_size", "intermediate_size"])
def test_missing_field(run_cli, tmp_path, field):
    cfg = json.loads((CONFIGS / "llama-3.1-8b-instruct.config.json").read_text())
    del cfg[field]
    bad = tmp_path / f"no-{field}.json"
    bad.write_text(json.dumps(cfg))
    _assert_one_line_error(run_cli("models", "import", str(bad)), bad, field)


@pytest.mark.parametrize("value", [None, "many", -4, 0])
def test_bad_field_value(run_cli, tmp_path, value):
    cfg = json.loads((CONFIGS / "llama-3.1-8b-instruct.config.json").read_text())
    cfg["num_hidden_layers"] = value
    bad = tmp_path / "bad-layers.json"
    bad.write_text(json.dumps(cfg))
    _assert_one_line_error(run_cli("models", "import", str(bad)), bad)


def test_unsupported_quantization(run_cli, tmp_path):
    cfg = json.loads((CONFIGS / "llama-3.1-8b-instruct.config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes"}
    bad = tmp_path / "bnb.json"
    bad.write_text(json.dumps(cfg))
    _assert_one_line_error(run_cli("models", "import", str(bad)), bad, "bitsandbytes")


def test_missing_file(run_cli, tmp_path):
    missing = tmp_path / "nope.json"
    _assert_one_line_error(run_cli("models", "import", str(missing)), missing, "cannot read")


def test_import_config_raises_input_error(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(InputError, match=r"x\.json: config lacks required field"):
        import_config(bad)
