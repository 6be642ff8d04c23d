"""Calibration and catalog numbers have bounds (issue 30, defect 6) and YAML floats written as
JSON writers do (`1e3`, `1e-05`) are numbers (defect 9).

Before: `params: {step_overhead_s: 1.0e+308}` gave an internal IndexError,
`request_overhead_s: 1e308` printed TTFT inf with exit 0, a catalog GPU with
`memory_bandwidth_gb_per_s: .inf` was accepted and changed answers, `cuda_total_memory_gib:
.inf` raised an internal error; `step_overhead_s: 1e-03` was read as a string and refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _asserts import assert_one_line_error

REPO = Path(__file__).resolve().parents[2]
LAT = ("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "2",
       "--format", "json")


def _calibration(tmp_path: Path, params: str) -> Path:
    p = tmp_path / "cal.yaml"
    p.write_text(f"gpu: h100-sxm\nkind: measured\nparams: {params}\n")
    return p


@pytest.mark.parametrize("params, says", [
    ("{step_overhead_s: 1.0e+308}", "params.step_overhead_s"),
    ("{request_overhead_s: 1e308}", "params.request_overhead_s"),
    ("{per_seq_overhead_s: .inf}", "params.per_seq_overhead_s"),
])
def test_calibration_numbers_out_of_bounds_are_one_line(run_cli, tmp_path: Path, params: str,  # noqa: ANN001
                                                        says: str) -> None:
    r = run_cli(*LAT, "--calibration", str(_calibration(tmp_path, params)))
    assert_one_line_error(r, says)


def test_json_style_yaml_floats_are_numbers(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    base = run_cli(*LAT, "--calibration", str(_calibration(tmp_path, "{step_overhead_s: 0.001}")))
    sci = run_cli(*LAT, "--calibration", str(_calibration(tmp_path, "{step_overhead_s: 1e-03}")))
    assert base.exit_code == 0 and sci.exit_code == 0, sci.stderr
    assert json.loads(sci.stdout)["ttft_s"] == json.loads(base.stdout)["ttft_s"]


@pytest.mark.parametrize("field, value", [("memory_bandwidth_gb_per_s", ".inf"),
                                          ("cuda_total_memory_gib", ".inf"),
                                          ("memory_bandwidth_gb_per_s", "1.0e+300"),
                                          ("bf16_dense_tflops", ".nan")])
def test_catalog_gpu_numbers_out_of_bounds_are_one_line(run_cli, tmp_path: Path, field: str,  # noqa: ANN001
                                                        value: str) -> None:
    spec = yaml.safe_load((REPO / "gpu_catalog" / "h100-sxm.yaml").read_text())
    spec.update(key="h100-odd", name="H100 odd", aliases=[], nvml_names=[])
    text = yaml.safe_dump(spec) + f"{field}: {value}\n" if field not in spec else \
        yaml.safe_dump({k: v for k, v in spec.items() if k != field}) + f"{field}: {value}\n"
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "h100-odd.yaml").write_text(text)
    r = run_cli("memory", "--model", "llama-3.1-8b", "--gpu", "h100-odd", "--catalog-dir",
                str(tmp_path))
    assert_one_line_error(r, field)
