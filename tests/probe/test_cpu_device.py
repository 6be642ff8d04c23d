"""A CPU calibration file is usable: its measured host is a device `--gpu` accepts with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

CAL = {
    "version": 1, "gpu": "cpu-x86_64-2c", "kind": "measured",
    "measured": {"method": "microbenchmarks", "host_gpu_spec": {
        "key": "cpu-x86_64-2c", "name": "host CPU (x86_64)", "memory_mib": 24000,
        "memory_bandwidth_gb_per_s": 10.0, "bf16_dense_tflops": 0.5, "source": "test"}},
    "params": {"mem_bw_frac": 0.8, "step_overhead_s": 0.0, "per_seq_overhead_s": 0.0},
}


def _write(tmp_path: Path) -> Path:
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(CAL))
    return path


def test_speed_on_the_measured_host(tmp_path: Path, run_cli) -> None:
    path = _write(tmp_path)
    res = run_cli("speed", "--model", "llama-3.2-1b", "--gpu", "cpu-x86_64-2c",
                  "--calibration", str(path), "--batch", "1", "--context", "128",
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    step = json.loads(res.stdout)["rows"][0]["step_time_s"]
    # Hand calculation: batch 1 decode is memory bound; Llama-3.2-1B holds 1.236e9 parameters
    # (model card: 1.23B), bf16 = 2.47 GB read per step at 10 GB/s x 0.8 = 0.309 s. The KV
    # read of 128 tokens and the activations add under 5%.
    assert 0.309 <= step <= 0.309 * 1.10


def test_the_host_key_needs_its_calibration(tmp_path: Path, run_cli) -> None:
    res = run_cli("speed", "--model", "llama-3.2-1b", "--gpu", "cpu-x86_64-2c",
                  "--batch", "1", "--context", "128")
    assert res.exit_code == 2 and "unknown GPU" in res.stderr


def test_a_host_file_does_not_rename_a_catalog_gpu(tmp_path: Path, run_cli) -> None:
    res = run_cli("speed", "--model", "llama-3.2-1b", "--gpu", "h100-sxm",
                  "--calibration", str(_write(tmp_path)), "--batch", "1", "--context", "128")
    assert res.exit_code == 2 and "measured on cpu-x86_64-2c" in res.stderr


def test_recommend_and_plan_take_the_host_key_with_its_file(tmp_path: Path, run_cli) -> None:
    """Audit defect 1: docs/probe.md says the key is a device every command accepts; recommend
    and plan refused it ("unknown GPU"). Hand calculation as above: one decode step at batch 1
    reads 2.47 GB at 8 GB/s = 0.309 s, so at 0.05 req/s (a request every 20 s, 16 output
    tokens: ~15 x 0.309 = 4.6 s of decode) one replica runs at batch ~1 and the mean TBT is
    0.309 s (+10% for the KV and activations)."""
    path = _write(tmp_path)
    res = run_cli("recommend", "--model", "llama-3.2-1b", "--gpu", "cpu-x86_64-2c",
                  "--calibration", str(path), "--rate", "0.05", "--input-len", "128",
                  "--output-len", "16", "--e2e-p99", "60s", "--format", "json")
    assert res.exit_code == 0, res.stderr
    best = res.json()["recommendations"][0]
    assert best["gpu"] == "cpu-x86_64-2c" and best["replicas"] == 1
    assert 0.309 <= best["predicted"]["tbt_s"]["mean"] <= 0.309 * 1.10
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({
        "version": 1, "model": "llama-3.2-1b", "calibration": str(path),
        "candidates": {"gpus": ["cpu-x86_64-2c"]},
        "workloads": [{"name": "chat", "rate_per_s": 0.05, "input_len": 128, "output_len": 16,
                       "slo": {"e2e_p99_s": 60}}]}))
    res = run_cli("plan", str(plan), "--no-verify", "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["recommendations"][0]["gpu"] == "cpu-x86_64-2c"


H100_CAL = {"version": 1, "gpu": "h100-sxm", "kind": "measured",
            "measured": {"method": "serving benchmark levels", "engine": "vllm"},
            "params": {"step_overhead_s": 0.0035, "per_seq_overhead_s": 6.25e-5}}


@pytest.mark.parametrize("order", [("h100-sxm", "l40s"), ("l40s", "h100-sxm")])
def test_a_calibration_for_one_of_several_candidates(tmp_path: Path, run_cli,
                                                     order: tuple[str, str]) -> None:
    """Audit defect 2: recommend --gpu h100-sxm --gpu l40s --calibration <h100 file> said the
    file's GPU "is not a candidate" (the disaggregated layout, sized on the best's GPU alone,
    checked the file again against that one GPU). The file applies to h100-sxm, l40s keeps
    its own; a file of a GPU outside the candidates is still refused."""
    path = tmp_path / "h100.yaml"
    path.write_text(yaml.safe_dump(H100_CAL))
    args = ["recommend", "--model", "llama-3.1-8b", "--rate", "5", "--ttft-p99", "1s",
            "--tbt-p99", "60ms", "--calibration", str(path), "--format", "json"]
    res = run_cli(*args, "--gpu", order[0], "--gpu", order[1])
    assert res.exit_code == 0, res.stderr
    cals = {r["gpu"]: r["calibration"] for r in res.json()["recommendations"]}
    assert set(cals) == {"h100-sxm", "l40s"}
    assert str(path) in cals["h100-sxm"] and str(path) not in cals["l40s"]
    res = run_cli(*args, "--gpu", "l40s")
    assert res.exit_code == 2 and "not a candidate GPU" in res.stderr
