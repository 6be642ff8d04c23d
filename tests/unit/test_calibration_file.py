"""Calibration YAML files (capplan.catalog.calibration): loading, defaults for missing params,
lookup of a measured file for the GPU, and the CLI's answer to bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from capplan.catalog.calibration import (
    CalibrationFile,
    CalibrationParams,
    find_default_calibration,
    load_calibration,
    read_calibration_file,
    write_calibration,
)
from capplan.errors import InputError
from capplan.models.calibration import Calibration, default_calibration

SPEED = ("speed", "--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb", "--context", "1024",
         "--format", "json")

# The loader's contract is "a file's params over the GPU's datasheet defaults": what a file
# leaves out must equal default_calibration(gpu) field for field (the defaults' own values are
# docs/perf.md's business and change when the research does).
PARAMS = ("mem_bw_frac", "gemm_frac", "gemm_frac_low_precision", "gemm_half_tokens",
          "attn_frac", "attn_bw_frac", "step_overhead_s", "per_seq_overhead_s",
          "per_layer_overhead_s", "allreduce_latency_s", "allreduce_bw_frac",
          "request_overhead_s", "expert_bw_frac", "expert_gemm_frac", "per_moe_layer_overhead_s",
          "spec_acceptance_length")

IDEAL_YAML = """\
gpu: a100-sxm-80gb
kind: measured
measured: {device_name: NVIDIA A100-SXM4-80GB, date: '2025-01-01', method: hand-written}
params:
  mem_bw_frac: 1.0
  attn_bw_frac: 1.0
  gemm_frac: 1.0
  gemm_half_tokens: 0
  attn_frac: 1.0
  step_overhead_s: 0
  per_seq_overhead_s: 0
  per_layer_overhead_s: 0
fit: {median_rel_error: 0.03, worst_rel_error: 0.09, n_samples: 120}
samples: []
"""


def _write(tmp_path: Path, text: str, name: str = "cal.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def a100(catalog):
    return catalog.gpus["a100-sxm-80gb"]


def test_param_names_cover_the_file_schema():
    # every Calibration field can be set from a file, and nothing else
    assert set(Calibration.param_names()) == set(CalibrationParams.model_fields)
    assert set(Calibration.param_names()) == set(PARAMS)


def test_valid_file_overrides_defaults(tmp_path, a100):
    p = _write(tmp_path, IDEAL_YAML)
    cal = load_calibration(p, a100)
    assert cal.mem_bw_frac == 1.0 and cal.attn_bw_frac == 1.0 and cal.gemm_frac == 1.0
    assert cal.gemm_half_tokens == 0.0 and cal.attn_frac == 1.0
    assert cal.step_overhead_s == 0.0 and cal.per_seq_overhead_s == 0.0
    assert cal.per_layer_overhead_s == 0.0
    # not in the file: defaults
    d = default_calibration(a100)
    for name in ("gemm_frac_low_precision", "allreduce_latency_s", "allreduce_bw_frac"):
        assert getattr(cal, name) == getattr(d, name), name
    # and the file did change something (the defaults are not already ideal)
    # (host costs default to the engine profile's, so the file's 0 replaces a positive value)
    assert d.mem_bw_frac < 1.0 and d.step_overhead_s is None
    assert cal.source == f"measured ({p})"


def test_missing_params_keep_defaults(tmp_path, a100):
    p = _write(tmp_path, "gpu: a100-sxm-80gb\nparams:\n  mem_bw_frac: 0.5\n")
    cal = load_calibration(p, a100)
    d = default_calibration(a100)
    assert cal.mem_bw_frac == 0.5 != d.mem_bw_frac
    for name in PARAMS[1:]:
        assert getattr(cal, name) == getattr(d, name), name


def test_empty_params_is_the_default(tmp_path, a100):
    cal = load_calibration(_write(tmp_path, "gpu: a100-sxm-80gb\nkind: default\nparams: {}\n"),
                           a100)
    d = default_calibration(a100)
    for name in PARAMS:
        assert getattr(cal, name) == getattr(d, name), name
    assert cal.source.startswith("default (")


def test_write_read_round_trip(tmp_path, a100):
    cf = CalibrationFile(gpu="a100-sxm-80gb", params=CalibrationParams(mem_bw_frac=0.8,
                                                                        step_overhead_s=2e-3),
                         fit={"n_samples": 3}, notes="round trip")
    p = tmp_path / "out" / "rt.yaml"
    p.parent.mkdir()
    write_calibration(p, cf)
    back = read_calibration_file(p)
    assert back == cf
    cal = load_calibration(p, a100)
    assert cal.mem_bw_frac == 0.8 and cal.step_overhead_s == 2e-3
    assert cal.gemm_frac == default_calibration(a100).gemm_frac


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("gpu: a100-sxm-80gb\nparams:\n  bogus: 1\n", "unknown key 'params.bogus'"),
        ("gpu: a100-sxm-80gb\nparams:\n  per_seq_overhead_s: -1e-6\n", "params.per_seq_overhead_s"),
        ("gpu: a100-sxm-80gb\nparams:\n  attn_bw_frac: 1.01\n", "params.attn_bw_frac"),
        ("gpu: a100-sxm-80gb\nparams:\n  allreduce_bw_frac: 0\n", "params.allreduce_bw_frac"),
        ("gpu: a100-sxm-80gb\nparams:\n  gemm_half_tokens: -.inf\n", "not a finite number"),
        ("gpu: a100-sxm-80gb\nkind: guessed\nparams: {}\n", "kind"),
        ("params: {mem_bw_frac: 0.9}\n", "gpu"),
        ("gpu: a100-sxm-80gb\n", "params"),
        ("gpu: [a100\n", "YAML"),
        ("42\n", "a calibration file is a YAML mapping"),
    ],
)
def test_bad_files_raise_input_error_naming_file(tmp_path, a100, text, fragment):
    p = _write(tmp_path, text)
    with pytest.raises(InputError) as e:
        load_calibration(p, a100)
    assert str(p) in str(e.value) and fragment in str(e.value), str(e.value)
    assert "\n" not in str(e.value).strip()


# ---------------------------------------------------------------------------------------------
# Through the CLI
# ---------------------------------------------------------------------------------------------


def test_cli_uses_file_hand_computed_step(run_cli, tmp_path):
    p = _write(tmp_path, IDEAL_YAML)
    res = run_cli(*SPEED, "--batch", "1,8", "--calibration", str(p))
    assert res.exit_code == 0, res.stderr
    rows = {r["batch"]: r for r in res.json()["rows"]}
    # Ideal bandwidth and no overheads: the step is bytes / 2.039e12 B/s.
    #   weights (bf16, embedding not streamed): 15,009,849,344 B
    #   KV per sequence: 1024 tokens * 131,072 B = 134,217,728 B
    # batch 1: 15,144,067,072 B -> 7.427203e-3 s. Compute roofs (312 TFLOP/s): linear
    # 4.81e-5 s, attention 1.72e-6 s; through the p=4 smooth max they add < 1e-8 relative.
    assert rows[1]["step_time_s"] == pytest.approx(15_144_067_072 / 2.039e12, rel=1e-6)
    # batch 8: 15,009,849,344 + 8 * 134,217,728 = 16,083,591,168 B -> 7.88798e-3 s; the
    # 8-token GEMM (3.85e-4 s, ratio 0.049) adds (0.049^4)/4 ~ 1.4e-6 relative: 1e-5 tolerance
    assert rows[8]["step_time_s"] == pytest.approx(16_083_591_168 / 2.039e12, rel=1e-5)
    assert rows[8]["tokens_per_s_total"] == pytest.approx(8 * 2.039e12 / 16_083_591_168,
                                                          rel=1e-5)


def test_cli_overhead_override_adds_exactly(run_cli, tmp_path):
    # Only step_overhead_s changes: a measured value replaces the profile's whole fixed step
    # cost (vLLM: 0 + 32 layers x 40 us = 1.28 ms -> 12 ms), so every step is 10.72 ms longer.
    from capplan.models.engine import VLLM

    assert VLLM.step_overhead_s + 32 * VLLM.layer_step_overhead_s == pytest.approx(1.28e-3)
    p = _write(tmp_path, "gpu: a100-sxm-80gb\nparams:\n  step_overhead_s: 0.012\n")
    base = run_cli(*SPEED, "--batch", "1,32")
    slow = run_cli(*SPEED, "--batch", "1,32", "--calibration", str(p))
    assert base.exit_code == 0 and slow.exit_code == 0, (base.stderr, slow.stderr)
    for b, s in zip(base.json()["rows"], slow.json()["rows"], strict=True):
        assert s["step_time_s"] - b["step_time_s"] == pytest.approx(0.01072, rel=1e-9)


def test_measured_file_in_catalog_dir_is_found(run_cli, tmp_path, a100):
    cal_dir = tmp_path / "cat" / "calibrations"
    cal_dir.mkdir(parents=True)
    (cal_dir / "a100.yaml").write_text(IDEAL_YAML)
    # a file for another GPU, and a non-measured one, are ignored
    (cal_dir / "0-h100.yaml").write_text("gpu: h100-sxm\nparams: {mem_bw_frac: 0.1}\n")
    cal = find_default_calibration(a100, [cal_dir])
    assert cal.mem_bw_frac == 1.0 and cal.source == "measured (a100.yaml)"
    res = run_cli(*SPEED, "--batch", "1", "--catalog-dir", str(tmp_path / "cat"))
    assert res.exit_code == 0, res.stderr
    d = res.json()
    assert d["calibration"] == "measured (a100.yaml)"
    assert d["rows"][0]["step_time_s"] == pytest.approx(15_144_067_072 / 2.039e12, rel=1e-6)


def test_default_kind_file_is_not_picked_up(tmp_path, a100):
    cal_dir = tmp_path / "calibrations"
    cal_dir.mkdir()
    (cal_dir / "a.yaml").write_text("gpu: a100-sxm-80gb\nkind: default\nparams: {mem_bw_frac: 1}\n")
    cal = find_default_calibration(a100, [cal_dir, tmp_path / "missing"])
    assert cal == default_calibration(a100) and cal.mem_bw_frac != 1


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  frobnicate: 0.5\n", "unknown key",
                     id="unknown-key"),
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  step_overhead_s: -1\n",
                     "params.step_overhead_s", id="negative"),
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  mem_bw_frac: 1.2\n", "params.mem_bw_frac",
                     id="fraction-above-1"),
        pytest.param("gpu: a100-sxm-80gb\nparams:\n  mem_bw_frac: [0.5\n", "YAML",
                     id="malformed-yaml"),
    ],
)
def test_cli_bad_file_exit_2_one_line(run_cli, tmp_path, text, fragment):
    p = _write(tmp_path, text)
    res = run_cli(*SPEED, "--calibration", str(p))
    assert res.exit_code == 2 and res.exception is None
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and fragment in lines[0], lines
    assert str(p) in lines[0] and res.stdout == ""


def test_file_for_another_gpu_is_refused(tmp_path, a100, run_cli):
    # a calibration measured on another device is refused with one line naming both
    p = _write(tmp_path, "gpu: h100-sxm\nparams: {mem_bw_frac: 0.9}\n")
    with pytest.raises(InputError, match="measured on h100-sxm, not a100-sxm-80gb"):
        load_calibration(p, a100)
    res = run_cli(*SPEED, "--calibration", str(p))
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1
    assert "h100-sxm" in res.stderr and "a100-sxm-80gb" in res.stderr
    same = load_calibration(_write(tmp_path, "gpu: a100-sxm-80gb\nparams: {}\n", "b.yaml"), a100)
    assert str(tmp_path) in same.source


def test_request_overhead_adds_to_ttft_only(tmp_path, a100):
    """A measured per-request overhead (tokenisation, HTTP) shifts every TTFT and E2E quantile
    by exactly its value and leaves TBT alone."""
    from capplan.catalog.loader import load_catalog
    from capplan.models.engine import EngineSettings
    from capplan.models.perf import build_step_model
    from capplan.models.queueing import LengthStats, Limits, QueueModel, summarize

    model = load_catalog().model("llama-3.1-8b")
    base = load_calibration(_write(tmp_path, IDEAL_YAML), a100)
    runs = []
    for extra in (0.0, 0.05):
        sm = build_step_model(model, a100, EngineSettings(), base.with_(request_overhead_s=extra))
        q = QueueModel(sm, LengthStats.fixed(512), LengthStats.fixed(128),
                       Limits(256, 2048, 400_000))
        runs.append(summarize(q.at_rate(2.0)))
    for key in ("mean", "p50", "p99"):
        assert runs[1]["ttft_s"][key] - runs[0]["ttft_s"][key] == pytest.approx(0.05)
        assert runs[1]["e2e_s"][key] - runs[0]["e2e_s"][key] == pytest.approx(0.05)
        assert runs[1]["tbt_s"][key] == pytest.approx(runs[0]["tbt_s"][key])
