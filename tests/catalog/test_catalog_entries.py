"""One invariant battery over every shipped catalog YAML (scipy `distcont` style).

Skip lists are named, with a reason; they are empty today.
"""

from __future__ import annotations

from numbers import Number
from pathlib import Path

import pytest
import yaml

from capplan.catalog.loader import load_catalog, load_spec, package_dir
from capplan.catalog.schema import GpuSpec, ModelSpec
from capplan.models.engine import EngineSettings, engine_defaults
from capplan.models.memory import memory_report, param_counts, validate_settings

GPU_FILES = sorted(package_dir("gpu_catalog").glob("*.yaml"))
MODEL_FILES = sorted(package_dir("model_catalog").glob("*.yaml"))

# Model keys whose computed parameter count is allowed to miss params_total by more than 5%.
PARAM_COUNT_SKIP: dict[str, str] = {}

# Count fields that are legitimately zero (no sliding layers, no vision tower, no shared
# experts, no dense layers); every other number must be > 0.
ZERO_OK = {"num_sliding_layers", "vision_params", "num_shared_experts",
           "shared_expert_intermediate_size", "num_dense_layers"}


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def _numbers(data: object, path: str = ""):
    """Yield (dotted.key, value) for every number (not bool) in a nested mapping."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(data, Number) and not isinstance(data, bool):
        yield path, data


def test_catalogs_are_not_empty():
    assert len(GPU_FILES) >= 20
    assert len(MODEL_FILES) >= 50


# ---------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", GPU_FILES, ids=_ids(GPU_FILES))
def test_gpu_entry(path: Path):
    spec = load_spec(path, GpuSpec)
    assert spec.key == path.stem, "the file name is the catalog key"
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))

    for key, value in _numbers(raw):
        assert value > 0, f"{path.name}: {key} = {value} must be positive"

    # Every non-null number has a source entry (nested blocks are sourced by their parent key).
    for key, value in raw.items():
        if key == "source" or value is None:
            continue
        if isinstance(value, dict) and any(True for _ in _numbers(value)):
            assert key in raw["source"], f"{path.name}: {key} has numbers but no source entry"
        elif isinstance(value, Number) and not isinstance(value, bool):
            assert key in raw["source"], f"{path.name}: {key} = {value} has no source entry"
    for key, text in raw["source"].items():
        assert isinstance(text, str) and text.strip(), f"{path.name}: source.{key} is empty"

    # Physical sanity: what CUDA reports is a bit under what NVML reports.
    assert spec.total_memory_bytes < spec.memory_mib * 2**20
    assert spec.total_memory_bytes > 0.9 * spec.memory_mib * 2**20
    for dtype in ("bf16", "fp16", "fp8", "int8", "fp4"):
        assert spec.dense_flops_per_s(dtype) > 0


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", MODEL_FILES, ids=_ids(MODEL_FILES))
def test_model_entry(path: Path):
    spec = load_spec(path, ModelSpec)
    assert spec.key == path.stem, "the file name is the catalog key"
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key, value in _numbers(raw):
        leaf = key.rsplit(".", 1)[-1]
        if leaf in ZERO_OK:
            assert value >= 0, f"{path.name}: {key} = {value}"
        else:
            assert value > 0, f"{path.name}: {key} = {value} must be positive"
    assert spec.params_active <= spec.params_total
    assert spec.source.get("config"), "where the architecture came from"
    if spec.moe is not None:
        assert spec.moe.num_experts_per_tok <= spec.moe.num_experts
        assert spec.params_active < spec.params_total
    if spec.sliding_window is not None:
        assert 0 < spec.num_sliding_layers <= spec.num_layers


@pytest.mark.parametrize("path", MODEL_FILES, ids=_ids(MODEL_FILES))
def test_model_param_count_matches_params_total(path: Path):
    spec = load_spec(path, ModelSpec)
    if spec.key in PARAM_COUNT_SKIP:
        pytest.skip(PARAM_COUNT_SKIP[spec.key])
    computed = param_counts(spec).total
    assert computed == pytest.approx(spec.params_total, rel=0.05), (
        f"{spec.key}: architecture gives {computed / 1e9:.2f}B params, "
        f"params_total says {spec.params_total / 1e9:.2f}B")


def _fits_somewhere(spec: ModelSpec) -> tuple[str, int] | None:
    cat = load_catalog()
    for gpu in sorted(cat.gpus.values(), key=lambda g: -g.total_memory_bytes):
        for tp in (1, 2, 4, 8):
            if tp > gpu.interconnect.max_gpus_per_node:
                continue
            s = EngineSettings(tp=tp)
            try:
                validate_settings(spec, s)
            except ValueError:
                continue
            seqs, tokens = engine_defaults(gpu)
            r = memory_report(spec, gpu, s.with_(max_num_seqs=seqs, max_num_batched_tokens=tokens))
            if r.fits:
                return gpu.key, tp
    return None


@pytest.mark.parametrize("path", MODEL_FILES, ids=_ids(MODEL_FILES))
def test_every_model_fits_somewhere(path: Path):
    """At its full max_position_embeddings on one node of some catalog GPU (TP <= 8)."""
    spec = load_spec(path, ModelSpec)
    assert _fits_somewhere(spec) is not None, f"{spec.key} fits on no catalog GPU at TP <= 8"


# ---------------------------------------------------------------------------------------------
# Names do not collide
# ---------------------------------------------------------------------------------------------


def test_every_gpu_name_resolves_to_its_own_entry(catalog):
    for spec in catalog.gpus.values():
        for name in (spec.key, spec.name, *spec.aliases, *spec.nvml_names):
            assert catalog.gpu(name).key == spec.key, f"{name!r} resolves elsewhere"


def test_every_model_name_resolves_to_its_own_entry(catalog):
    for spec in catalog.models.values():
        for name in (spec.key, spec.hf_id, *spec.aliases):
            assert catalog.model(name).key == spec.key, f"{name!r} resolves elsewhere"


@pytest.mark.parametrize("path", GPU_FILES + MODEL_FILES, ids=_ids(GPU_FILES + MODEL_FILES))
def test_sources_are_public(path: Path):
    # A source a user outside this workspace can open: no local paths.
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key, text in raw["source"].items():
        assert "/work/" not in text, f"{path.name}: source.{key} cites a local path"


def test_h20_and_h200_nvl_memory_is_nvidia_smis_total():
    import capplan

    # nvidia-smi captures (the entries' source.memory_mib): H20 '0MiB / 97871MiB', H200 NVL
    # '741MiB / 143771MiB'.
    cat = load_catalog(())
    assert cat.gpu("h20").memory_mib == 97_871
    assert cat.gpu("h200-nvl").memory_mib == 143_771
    # Llama-3.1-8B on an H20 by hand (the audit's figure), from numbers written out here:
    # - CUDA total: nvidia-smi's 97,871 MiB less capplan's 450 MiB (NVML total - 450 MiB);
    # - budget: 0.9 of it (--gpu-memory-utilization);
    # - weights: 14.96 GiB (8.03e9 bf16 parameters);
    # - activation peak 1.82 GiB and non-torch 0.15 GiB as `capplan memory` prints them;
    # - KV per token: 2 (K, V) x 32 layers x 8 KV heads x 128 head_dim x 2 B = 128 KiB.
    gib = 2.0**30
    total_gib = (97_871 - 450) / 1024  # 95.138
    kv_gib = 0.9 * total_gib - 14.96 - 1.82 - 0.15  # 68.694
    per_token = 2 * 32 * 8 * 128 * 2
    assert per_token == 128 * 1024
    by_hand = kv_gib * gib / per_token  # 562,740 tokens
    rep = capplan.memory("llama-3.1-8b", "h20").deployment.memory
    assert rep.total_memory_bytes / gib == pytest.approx(total_gib, abs=1e-9)
    for got, printed in ((rep.weights_bytes_per_gpu, 14.96),
                         (rep.activation_peak_bytes_per_gpu, 1.82),
                         (rep.runtime_overhead_bytes_per_gpu, 0.15)):
        assert abs(got / gib - printed) <= 0.005  # printed to 0.01 GiB
    assert rep.kv_bytes_per_token_per_gpu == per_token
    # tolerance: the three printed figures rounded to 0.01 GiB (+-0.015 GiB, 123 tokens) and
    # the pool floored to whole 16-token blocks (< 16 tokens): 140 tokens, 0.025%
    assert rep.kv_cache_tokens == pytest.approx(by_hand, abs=140)
