"""--catalog-dir adds entries; it does not replace or shadow shipped ones without saying so.

Before: a custom model keyed `llama-3.1-8b` (Qwen3-8B's architecture) silently replaced the
shipped Llama; a custom GPU keyed `h100-sxm` replaced the shipped H100 (whose NVML name was then
unknown); a custom GPU declaring the alias `h100` was silently shadowed by the shipped one; and
a folder without gpus/, models/ or calibrations/ (the gpus/ folder itself, by mistake) loaded
nothing and the next command said "unknown GPU"."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.cli._asserts import assert_one_line_error


def _write(root: Path, sub: str, name: str, data: dict) -> Path:
    (root / sub).mkdir(parents=True, exist_ok=True)
    path = root / sub / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _gpu(catalog, **changes) -> dict:
    data = catalog.gpus["l40s"].model_dump(mode="json")
    data.update(key="my-card", name="My Card", aliases=[], nvml_names=["My Card"])
    data.update(changes)
    return data


def _qwen3_8b_as(catalog, key: str) -> dict:
    data = catalog.models["qwen3-8b"].model_dump(mode="json")
    data.update(key=key, name=key, aliases=[])
    return data


def test_custom_model_with_a_shipped_key_is_refused(run_cli, tmp_path, catalog):
    path = _write(tmp_path, "models", "llama", _qwen3_8b_as(catalog, "llama-3.1-8b"))
    res = run_cli("memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                  "--catalog-dir", str(tmp_path))
    assert_one_line_error(res, f"{path}: the name 'llama-3.1-8b' already names model "
                               "'llama-3.1-8b' (")
    assert "model_catalog" in res.stderr and "llama-3.1-8b.yaml" in res.stderr
    assert "overrides: true" in res.stderr


def test_overrides_true_replaces_the_shipped_model_and_says_so(run_cli, tmp_path, catalog):
    data = {"overrides": True, **_qwen3_8b_as(catalog, "llama-3.1-8b")}
    path = _write(tmp_path, "models", "llama", data)
    res = run_cli("memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                  "--max-model-len", "8192", "--catalog-dir", str(tmp_path), "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert f"note: {path} replaces model 'llama-3.1-8b' (" in res.stderr
    # Qwen3-8B's KV (its config.json: 36 layers, 8 KV heads, head_dim 128), not Llama's 32:
    # 36 x 2 x 8 x 128 x 2 bytes = 147,456 per token
    assert res.json()["kv_bytes_per_token_per_gpu"] == 36 * 2 * 8 * 128 * 2


def test_custom_gpu_with_a_shipped_key_is_refused(run_cli, tmp_path, catalog):
    path = _write(tmp_path, "gpus", "h100", _gpu(catalog, key="h100-sxm"))
    res = run_cli("memory", "--model", "llama-3.1-8b", "--gpu", "NVIDIA H100 80GB HBM3",
                  "--catalog-dir", str(tmp_path))
    assert_one_line_error(res, f"{path}: the name 'h100-sxm' already names GPU 'h100-sxm'")


def test_custom_gpu_declaring_a_shipped_alias_is_refused(run_cli, tmp_path, catalog):
    assert "h100" in catalog.gpus["h100-sxm"].aliases  # the shipped H100 answers to `h100`
    path = _write(tmp_path, "gpus", "mine", _gpu(catalog, aliases=["h100"]))
    res = run_cli("gpus", "--catalog-dir", str(tmp_path))
    assert_one_line_error(res, f"{path}: the name 'h100' already names GPU 'h100-sxm'")


def test_a_new_gpu_and_model_load_without_a_note(run_cli, tmp_path, catalog):
    _write(tmp_path, "gpus", "mine", _gpu(catalog))
    _write(tmp_path, "models", "q", _qwen3_8b_as(catalog, "my-qwen3-8b"))
    res = run_cli("memory", "--model", "my-qwen3-8b", "--gpu", "my-card",
                  "--catalog-dir", str(tmp_path), "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert "note:" not in res.stderr


def test_two_files_with_one_key_are_refused(run_cli, tmp_path, catalog):
    first = _write(tmp_path, "models", "a", _qwen3_8b_as(catalog, "twin"))
    second = _write(tmp_path, "models", "b", _qwen3_8b_as(catalog, "twin"))
    assert_one_line_error(run_cli("models", "--catalog-dir", str(tmp_path)),
                          f"{second}: key 'twin' is also the key of {first}")


def test_overrides_must_be_a_boolean(run_cli, tmp_path, catalog):
    path = _write(tmp_path, "models", "a", {"overrides": "yes please",
                                            **_qwen3_8b_as(catalog, "a")})
    assert_one_line_error(run_cli("models", "--catalog-dir", str(tmp_path)),
                          f"{path}: overrides must be true or false")


def test_a_folder_without_catalog_subfolders_is_refused(run_cli, tmp_path, catalog):
    gpus = _write(tmp_path, "gpus", "mine", _gpu(catalog)).parent
    # the gpus/ folder given by mistake, and an empty folder
    for folder in (gpus, tmp_path / "empty"):
        folder.mkdir(exist_ok=True)
        res = run_cli("memory", "--model", "llama-3.1-8b", "--gpu", "my-card",
                      "--catalog-dir", str(folder))
        assert_one_line_error(res, f"--catalog-dir {folder}: no gpus/, models/ or "
                                   "calibrations/ folder in it")
