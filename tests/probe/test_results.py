"""Ingest a `vllm bench serve --save-result` file and a GuideLLM report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from capplan.cli import cli
from capplan.probe.results import load_results

DATA = Path(__file__).parent.parent / "data"
VLLM = DATA / "vllm_bench_serve_result.json"
GUIDELLM = DATA / "guidellm_report.json"


def test_vllm_result_levels_match_its_own_summary() -> None:
    (lv,) = load_results([VLLM])
    raw = json.loads(VLLM.read_text())
    assert lv["concurrency"] == 8
    assert lv["ttft_s"]["mean"] == pytest.approx(raw["mean_ttft_ms"] / 1e3, rel=1e-9)
    assert lv["tbt_s"]["mean"] == pytest.approx(raw["mean_itl_ms"] / 1e3, rel=1e-9)
    assert lv["tpot_s"]["mean"] == pytest.approx(raw["mean_tpot_ms"] / 1e3, rel=1e-9)
    assert lv["output_tokens_per_s"] == pytest.approx(raw["output_throughput"])


def test_guidellm_concurrent_benchmarks_become_levels() -> None:
    levels = load_results([GUIDELLM])
    assert [lv["concurrency"] for lv in levels] == [1, 4, 16]  # the poisson run is skipped
    assert levels[0]["ttft_s"]["p50"] == pytest.approx(0.038, rel=0.15)


def test_cli_from_results_fits_tbt_law_and_overheads() -> None:
    r = CliRunner().invoke(cli, ["calibrate", "--from-results", str(VLLM), str(GUIDELLM),
                                 "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [lv["concurrency"] for lv in out["levels"]] == [1, 4, 8, 16]
    assert out["fit"]["tbt_law"]["per_concurrency_s"] > 0
    assert out["fit"]["calibration_params"]["step_overhead_s"] >= 0


def test_not_a_result_file_is_one_line_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text('{"a": 1}')
    r = CliRunner().invoke(cli, ["calibrate", "--from-results", str(p)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
