"""A YAML file that names a key twice is refused with FILE:LINE (PyYAML keeps the last one
silently): plan files, calibration files and catalog folders all read through
capplan.catalog.loader.read_yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from capplan.catalog.loader import read_yaml
from capplan.errors import InputError
from tests.cli._asserts import assert_one_line_error

PLAN = """model: llama-3.1-8b
model: llama-3.1-70b
workloads:
  - name: chat
    rate_per_s: 1
"""


def test_plan_file_with_two_model_keys(run_cli, tmp_path: Path):
    p = tmp_path / "plan.yaml"
    p.write_text(PLAN)
    assert_one_line_error(run_cli("plan", str(p), "--no-verify"),
                          f"{p}:2: duplicate key 'model'")


def test_nested_duplicate_names_its_line(tmp_path: Path):
    p = tmp_path / "plan.yaml"
    p.write_text("model: llama-3.1-8b\nworkloads:\n  - name: a\n    slo:\n"
                 "      ttft_p99_s: 1\n      ttft_p99_s: 2\n")
    with pytest.raises(InputError, match=r"plan\.yaml:6: duplicate key 'ttft_p99_s'$"):
        read_yaml(p)


def test_calibration_and_catalog_folders_are_checked(run_cli, tmp_path: Path):
    cal = tmp_path / "cal.yaml"
    cal.write_text("gpu: h100-sxm\ngpu: a100\n")
    res = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "1",
                  "--calibration", str(cal))
    assert_one_line_error(res, f"{cal}:2: duplicate key 'gpu'")
    (tmp_path / "cat" / "gpus").mkdir(parents=True)
    gpu = tmp_path / "cat" / "gpus" / "mine.yaml"
    gpu.write_text("key: mine\nname: Mine\nkey: other\n")
    res = run_cli("memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                  "--catalog-dir", str(tmp_path / "cat"))
    assert_one_line_error(res, f"{gpu}:3: duplicate key 'key'")


def test_merge_keys_and_distinct_keys_still_load(tmp_path: Path):
    p = tmp_path / "ok.yaml"
    p.write_text("base: &b {a: 1, b: 2}\nmine:\n  <<: *b\n  b: 3\n")
    assert read_yaml(p)["mine"] == {"a": 1, "b": 3}
