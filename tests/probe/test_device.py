"""`capplan calibrate --device`: CPU end to end on a tiny shape, CUDA refusal, lazy torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from capplan.catalog.calibration import load_calibration, read_calibration_file
from capplan.catalog.loader import load_catalog
from capplan.cli import cli
from capplan.errors import InputError
from capplan.models.engine import EngineSettings
from capplan.models.perf import build_step_model


def _tiny_model():  # noqa: ANN202
    base = load_catalog().model("llama-3.2-1b")
    return base.model_copy(update={
        "key": "tiny-llama", "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_kv_heads": 2, "head_dim": 64, "vocab_size": 4096,
        "num_layers": 4})


@pytest.mark.torch
def test_cpu_calibration_end_to_end_tiny_shape(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from capplan.catalog.calibration import write_calibration
    from capplan.probe.run import calibration_file, fit_run, run_device

    model = _tiny_model()
    run = run_device(model, "cpu", quick=True, layers=1, force=False, catalog=load_catalog(),
                     progress=False)
    assert {s["kind"] for s in run.samples} >= {"copy", "gemm", "attn_decode", "decode_step",
                                                "prefill_step"}
    gpu, cal, fit = fit_run(run, model)
    assert fit is not None and fit.n_samples >= 4
    path = tmp_path / "cpu.yaml"
    write_calibration(path, calibration_file(run, gpu, cal, fit))
    cf = read_calibration_file(path)
    assert cf.gpu.startswith("cpu-") and cf.kind == "measured"
    assert cf.measured["host_gpu_spec"]["memory_bandwidth_gb_per_s"] > 0
    h100 = load_catalog().gpu("h100-sxm")
    with pytest.raises(InputError, match="measured on cpu-"):  # never applied to another device
        load_calibration(path, h100)
    host = h100.model_copy(update={"key": cf.gpu})  # the device it was measured on
    loaded = load_calibration(path, host)
    assert loaded.mem_bw_frac == pytest.approx(cal.mem_bw_frac)
    sm = build_step_model(load_catalog().model("llama-3.1-8b"), host, EngineSettings(), loaded)
    assert float(sm.decode_step(8, 1024)["step_s"]) > 0


def test_cuda_without_gpu_exits_2_one_line() -> None:
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    r = CliRunner().invoke(cli, ["calibrate", "--device", "cuda"])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1
    assert ("capplan[gpu]" in lines[0]) or ("no CUDA GPU" in lines[0])


def test_help_never_imports_torch() -> None:
    code = ("import sys\nfrom capplan.cli import cli\n"
            "try:\n    cli.main(['--help'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
            "try:\n    cli.main(['calibrate', '--help'], standalone_mode=False)\n"
            "except SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert 'pynvml' not in sys.modules\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


@pytest.mark.gpu
def test_cuda_quick_calibration(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    out = tmp_path / "gpu.yaml"
    r = CliRunner().invoke(cli, ["calibrate", "--device", "cuda", "--quick", "--force",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    cf = read_calibration_file(out)
    assert cf.fit["n_samples"] > 0
