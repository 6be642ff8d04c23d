"""Charts: PNG and SVG files exist, are real images, and name their units on the axes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from capplan.errors import InputError  # noqa: E402
from capplan.export.plots import plot_plan, plot_sim, plot_speed  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def sample_plan() -> dict[str, Any]:
    lat = {"mean": 0.3, "p50": 0.2, "p90": 0.5, "p99": 0.65}
    tbt = {"mean": 0.03, "p50": 0.028, "p90": 0.045, "p99": 0.057}
    return {
        "model": "llama-3.1-8b",
        "lanes": [{"name": "chat", "rate_per_s": 12.0, "ttft_p99_s": 1.0, "tbt_p99_s": 0.06},
                  {"name": "batch", "rate_per_s": 1.0, "ttft_p99_s": None, "tbt_p99_s": None}],
        "recommendations": [{"rank": 1, "gpu": "h100-sxm", "tp": 1, "replicas": 2,
                             "cost_per_hour": 7.56,
                             "predicted": {"ttft_s": lat, "tbt_s": tbt,
                                           "output_tokens_per_s": 1800.0}}],
        "pareto": [
            {"gpu": "h100-sxm", "tp": 1, "replicas": 2, "cost_per_hour": 7.56,
             "ttft_p99_s": 0.65, "tbt_p99_s": 0.057},
            {"gpu": "h100-sxm", "tp": 1, "replicas": 3, "cost_per_hour": 11.34,
             "ttft_p99_s": 0.3, "tbt_p99_s": 0.04},
            {"gpu": "l40s", "tp": 1, "replicas": 4, "cost_per_hour": 9.07,
             "ttft_p99_s": float("inf"), "tbt_p99_s": 0.05},
        ],
        "curves": [
            {"label": "h100-sxm tp1 seqs256 chunk2048",
             "points": [{"rate_per_s": r, "output_tokens_per_s": 300.0 * r,
                         "ttft_p99_s": 0.1 + 0.08 * r, "tbt_p99_s": 0.02 + 0.006 * r}
                        for r in (1.0, 2.0, 4.0, 6.0)]
             + [{"rate_per_s": 9.0, "output_tokens_per_s": 2300.0,
                 "ttft_p99_s": float("inf"), "tbt_p99_s": None}]},
            {"label": "l40s tp1 seqs256 chunk2048",
             "points": [{"rate_per_s": r, "output_tokens_per_s": 290.0 * r,
                         "ttft_p99_s": 0.2 + 0.15 * r, "tbt_p99_s": 0.03 + 0.01 * r}
                        for r in (1.0, 2.0, 3.0)]},
        ],
    }


def _check_pair(paths: list[Path], stem: str, labels: list[str]) -> None:
    png, svg = (p for p in paths if p.stem == stem)
    assert png.suffix == ".png" and svg.suffix == ".svg"
    assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 1000
    text = svg.read_text(encoding="utf-8")
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for label in labels:
        assert label in text, f"{label!r} not in {svg.name}"


def _no_temp_files(folder: Path) -> None:
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_plot_plan_writes_png_and_svg(tmp_path: Path) -> None:
    out = tmp_path / "charts"
    out.mkdir()
    paths = plot_plan(sample_plan(), out)
    assert [p.name for p in paths] == ["throughput_latency.png", "throughput_latency.svg",
                                       "pareto.png", "pareto.svg", "tokens_per_gpu.png",
                                       "tokens_per_gpu.svg"]
    assert all(p.parent == out for p in paths)
    _check_pair(paths, "throughput_latency",
                ["p99 TTFT (ms)", "p99 TBT (ms)", "output throughput (tokens/s)",
                 "h100-sxm tp1 seqs256 chunk2048", "TTFT SLO 1000 ms (chat)",
                 "TBT SLO 60 ms (chat)", "recommended: h100-sxm tp1 x2"])
    _check_pair(paths, "pareto", ["cost ($/hour)", "p99 TTFT (ms)", "TTFT SLO 1000 ms",
                                  "recommended: h100-sxm tp1 x2", "1: h100-sxm TP1 x3",
                                  "2: h100-sxm TP1 x2"])
    _no_temp_files(out)


def test_plot_plan_with_nothing_to_draw(tmp_path: Path) -> None:
    plan = {"model": "m", "lanes": [], "recommendations": [], "pareto": [], "curves": []}
    paths = plot_plan(plan, tmp_path)
    assert len(paths) == 6 and all(p.stat().st_size > 0 for p in paths)
    assert "no load curves in this result" in (tmp_path / "throughput_latency.svg").read_text()


def test_pareto_chart_draws_the_2d_front_only(tmp_path: Path) -> None:
    """Issue 15: the plan's front is 3-D (cost, TTFT, TBT); a point kept only for its TBT is
    dominated on the plotted axes (B: dearer and slower TTFT than A) and is not on the front."""
    from capplan.export.plots import _front_2d

    plan = sample_plan()
    plan["pareto"] = [
        {"gpu": "gpuA", "tp": 1, "replicas": 2, "weight_dtype": "fp8", "kv_dtype": "fp8",
         "cost_per_hour": 10.0, "ttft_p99_s": 0.30, "tbt_p99_s": 0.05},
        {"gpu": "gpuB", "tp": 2, "replicas": 1, "weight_dtype": "bf16", "kv_dtype": "bf16",
         "cost_per_hour": 12.0, "ttft_p99_s": 0.40, "tbt_p99_s": 0.02},
        {"gpu": "gpuC", "tp": 4, "replicas": 1, "weight_dtype": "bf16", "kv_dtype": "bf16",
         "cost_per_hour": 20.0, "ttft_p99_s": 0.10, "tbt_p99_s": 0.03},
    ]
    front = _front_2d([(p["ttft_p99_s"], p["cost_per_hour"], p) for p in plan["pareto"]])
    assert [f[2]["gpu"] for f in front] == ["gpuC", "gpuA"]  # by TTFT; gpuB is dominated by A
    plot_plan(plan, tmp_path)
    svg = (tmp_path / "pareto.svg").read_text()
    assert "1: gpuC TP4 x1 bf16/bf16" in svg and "2: gpuA TP1 x2 fp8/fp8" in svg
    assert "gpuB" not in svg and "better TBT only (3-D front)" in svg


def test_tokens_per_gpu_chart(tmp_path: Path) -> None:
    plan = sample_plan()
    for c in plan["curves"]:
        c["gpus_per_replica"] = 2
        for p in c["points"]:
            p["tbt_mean_s"] = 0.02
    plot_plan(plan, tmp_path)
    svg = (tmp_path / "tokens_per_gpu.svg").read_text()
    for label in ("output throughput per GPU (tokens/s)", "decode speed per user",
                  "h100-sxm tp1 seqs256 chunk2048", "llama-3.1-8b"):
        assert label in svg, label
    assert "no load curves" not in svg


def test_plot_plan_replaces_old_files_atomically(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    old = tmp_path / "throughput_latency.png"
    old.write_bytes(b"old chart")

    def boom(self: Any, *args: Any, **kwargs: Any) -> None:
        Path(args[0]).write_bytes(b"half a chart")
        raise RuntimeError("disk full")

    monkeypatch.setattr(Figure, "savefig", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        plot_plan(sample_plan(), tmp_path)
    assert old.read_bytes() == b"old chart"
    _no_temp_files(tmp_path)


def test_out_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "a-file"
    f.write_text("x")
    with pytest.raises(InputError, match="is a file"):
        plot_plan(sample_plan(), f)


def test_plot_speed(tmp_path: Path) -> None:
    rows = []
    for ctx in (1024, 8192):
        for b in (1, 2, 4, 8, 16, 32, 64, 128):
            step_s = 0.008 + b * ctx * 2e-9
            rows.append({"batch": b, "context_len": ctx, "step_time_s": step_s,
                         "tokens_per_s_total": b / step_s, "tokens_per_s_per_seq": 1 / step_s,
                         "bound": "memory"})
    # knee keys as ints (from the library) or strings (after a JSON round trip); None: no knee
    paths = plot_speed({"rows": rows, "knee_batch": {1024: 64, "8192": None},
                        "model": "llama-3.1-8b", "gpu": "h100-sxm", "tp": 2}, str(tmp_path))
    assert [p.name for p in paths] == ["speed.png", "speed.svg"]
    _check_pair(paths, "speed", ["batch size (sequences)", "(tokens/s)",
                                 "context 1024 tokens", "knee, context 1024",
                                 "llama-3.1-8b on h100-sxm (TP 2)"])
    assert "knee, context 8192" not in paths[1].read_text()


def test_plot_speed_rejects_other_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="'rows'"):
        plot_speed({"levels": []}, tmp_path)


def test_plot_sim(tmp_path: Path) -> None:
    n = 50
    ts = {"time_s": [0.5 * i for i in range(n)],
          "running": [min(i, 20) for i in range(n)],
          "waiting": [max(0, i - 20) for i in range(n)],
          "kv_utilization": [min(1.0, i / 40) for i in range(n)]}
    paths = plot_sim({"timeseries": ts, "ttft_s": {"p99": 1.0}, "model": "qwen3-30b-a3b",
                      "gpu": "l40s"}, tmp_path)
    assert [p.name for p in paths] == ["sim.png", "sim.svg"]
    _check_pair(paths, "sim", ["time (s)", "KV cache used (%)", "sequences (count)",
                               "running", "waiting", "qwen3-30b-a3b on l40s"])


def test_simulate_plots_every_scheduler(tmp_path: Path, run_cli) -> None:
    # Two schedulers, two charts: each file and title names its scheduler, and each draws its
    # own run (the static scheduler's first step comes after its batch forms, so its series
    # differs from the continuous one's).
    (tmp_path / "charts").mkdir()
    res = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "5",
                  "--requests", "100", "--scheduler", "continuous,static",
                  "--plot", str(tmp_path / "charts"))
    assert res.exit_code == 0, res.stderr
    paths = sorted((tmp_path / "charts").iterdir())
    assert [p.name for p in paths] == ["sim-continuous.png", "sim-continuous.svg",
                                       "sim-static.png", "sim-static.svg"]
    for name in ("continuous", "static"):
        _check_pair(paths, f"sim-{name}", [f"{name} scheduler", "llama-3.1-8b on h100-sxm"])
    charts = tmp_path / "charts"
    svgs = [(charts / f"sim-{n}.svg").read_text(encoding="utf-8")
            for n in ("continuous", "static")]
    assert "static scheduler" not in svgs[0] and "continuous scheduler" not in svgs[1]


def test_plot_sim_needs_timeseries(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="timeseries"):
        plot_sim({"ttft_s": {}}, tmp_path)


def test_missing_matplotlib_says_what_to_install(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(InputError, match=r"pip install capplan\[plot\]"):
        plot_plan(sample_plan(), tmp_path)


def test_pyplot_is_not_imported(tmp_path: Path) -> None:
    """The object API with an Agg canvas: no pyplot, no change to the user's backend."""
    import subprocess

    ts = {"timeseries": {"time_s": [0, 1], "running": [1, 2]}}
    code = ("import sys; from capplan.export.plots import plot_sim; "
            f"plot_sim({ts!r}, {str(tmp_path)!r}); "
            "assert 'matplotlib.pyplot' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
