"""Which device, engine and format a calibration file belongs to.

Before: a file with `gpu: h100` (the catalog's alias of h100-sxm) was refused as "measured on
h100, not h100-sxm"; a serving calibration fitted through vLLM's latency model
(`measured.engine: vllm 0.14`) was applied to `--engine sglang` without a word, though
docs/probe.md says to use it with the same engine; `version: 2` was read as version 1."""

from __future__ import annotations

import pytest

from capplan.catalog.calibration import find_default_calibration, load_calibration
from tests.cli._asserts import assert_one_line_error
from tests.unit.test_calibration_file import _write

SPEED = ("speed", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "1",
         "--format", "json")
SERVING = """\
version: 1
gpu: h100-sxm
kind: measured
measured: {method: serving benchmark levels, engine: vllm 0.14, host_overlap: true}
params: {step_overhead_s: 0.004, per_seq_overhead_s: 0.0001}
"""


@pytest.mark.parametrize("name", ["h100", "H100-SXM", "NVIDIA H100 80GB HBM3"])
def test_a_file_naming_the_gpu_by_an_alias_applies(run_cli, tmp_path, catalog, name):
    gpu = catalog.gpus["h100-sxm"]
    assert name.lower() in {n.lower() for n in (gpu.key, *gpu.aliases, *gpu.nvml_names)}
    p = _write(tmp_path, f"gpu: {name}\nparams: {{step_overhead_s: 0.004}}\n")
    assert load_calibration(p, gpu).step_overhead_s == 0.004
    res = run_cli(*SPEED, "--calibration", str(p))
    assert res.exit_code == 0, res.stderr
    assert res.json()["calibration"] == f"measured ({p})"  # the file, not the default
    cal_dir = tmp_path / "calibrations"
    cal_dir.mkdir()
    (cal_dir / "h.yaml").write_text(p.read_text())
    assert find_default_calibration(gpu, [cal_dir]).step_overhead_s == 0.004


def test_an_alias_of_another_gpu_is_still_refused(run_cli, tmp_path):
    p = _write(tmp_path, "gpu: a100\nparams: {}\n")  # a100-sxm-80gb's alias
    assert_one_line_error(run_cli(*SPEED, "--calibration", str(p)),
                          "measured on a100, not h100-sxm")


def test_a_calibration_alias_is_found_among_plan_candidates(run_cli, tmp_path):
    p = _write(tmp_path, "gpu: h100\nparams: {step_overhead_s: 0.004}\n")
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "1",
                  "--input-len", "512", "--output-len", "128", "--verify-top", "0",
                  "--calibration", str(p), "--format", "json")
    assert res.exit_code == 0, res.stderr
    recs = res.json()["recommendations"]
    assert recs and {r["calibration"] for r in recs} == {f"measured ({p})"}


def test_another_engine_gets_one_warning_line(run_cli, tmp_path):
    p = _write(tmp_path, SERVING)
    res = run_cli(*SPEED, "--calibration", str(p), "--engine", "sglang")
    assert res.exit_code == 0, res.stderr
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1, res.stderr
    assert "fitted through vllm 0.14's latency model, this run uses sglang" in warnings[0]


def test_the_same_engine_gets_no_warning(run_cli, tmp_path):
    p = _write(tmp_path, SERVING)
    res = run_cli(*SPEED, "--calibration", str(p), "--engine", "vllm")
    assert res.exit_code == 0, res.stderr
    assert "fitted through" not in res.stderr


@pytest.mark.parametrize("version", ["2", "0", "true", "'1'"])
def test_an_unknown_version_is_refused(run_cli, tmp_path, version):
    p = _write(tmp_path, SERVING.replace("version: 1", f"version: {version}"))
    assert_one_line_error(run_cli(*SPEED, "--calibration", str(p)),
                          f"{p}: calibration file version")


@pytest.mark.parametrize(("fitted", "engine", "warns"), [
    ("sglang 0.5 +mixed-chunk", "sglang+mixed-chunk", False),  # the profile it was fitted on
    ("sglang 0.5 +mixed-chunk", "sglang", True),  # another scheduler: another latency model
    ("vllm 0.14", "vllm@0.19", False),  # releases differing in memory accounting alone
    ("vllm 0.11", "vllm", True)])  # synchronous host: another latency model
def test_the_warning_reads_the_fitted_profiles_label(run_cli, tmp_path, fitted, engine, warns):
    """`measured.engine` is the label of the profile the fit ran through (probe/results.py),
    options included: a calibration applies without a warning to a profile timing steps alike."""
    p = _write(tmp_path, SERVING.replace("engine: vllm 0.14", f"engine: {fitted}"))
    res = run_cli(*SPEED[:-2], "--engine", engine, "--calibration", str(p), "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert ("fitted through" in res.stderr) == warns, res.stderr
