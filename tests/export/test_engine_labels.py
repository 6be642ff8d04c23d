"""One display name per engine in every human-facing output (EngineProfile.display_name):
the terminal's launch lines and disaggregated block, the Markdown, HTML, CSV and XLSX reports
and the llm-d refusal all say "TensorRT-LLM" (one said "TRT-LLM", the terminal's P/D block
"trtllm"), while JSON keys and engine ids stay `vllm`, `sglang`, `trtllm`."""

from __future__ import annotations

import csv
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from capplan.models.engine import ENGINES, VERSIONS, engine_display_name

LABELS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def test_every_profile_of_an_engine_has_its_display_name() -> None:
    assert {e: engine_display_name(e) for e in ENGINES} == LABELS
    for engine, profiles in VERSIONS.items():
        assert {p.display_name for p in profiles} == {LABELS[engine]}
    # any spec the CLI takes; a name capplan does not know comes back as given
    assert engine_display_name("trtllm@1.0+no-overlap") == "TensorRT-LLM"
    assert engine_display_name("tensorrt-llm") == "TensorRT-LLM"
    assert engine_display_name("llama.cpp") == "llama.cpp"


class _Commands(HTMLParser):
    """The label of every command block (`<div class="cmd"><b>LABEL</b><pre>...`)."""

    def __init__(self) -> None:
        super().__init__()
        self.labels: list[str] = []
        self._in_cmd = self._in_b = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "div" and ("class", "cmd") in attrs:
            self._in_cmd = True
        elif tag == "b" and self._in_cmd:
            self._in_b = True
            self.labels.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "b":
            self._in_b = False
        elif tag == "div":
            self._in_cmd = False

    def handle_data(self, data: str) -> None:
        if self._in_b:
            self.labels[-1] += data


@pytest.fixture(scope="module")
def trtllm_plan(tmp_path_factory) -> dict[str, Any]:
    """A TensorRT-LLM plan with its disaggregated layout sized: the terminal text and every
    report, written by the CLI and read back."""
    from click.testing import CliRunner

    from capplan.cli import cli

    d = tmp_path_factory.mktemp("labels")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAPPLAN_HOME", str(d))
        res = CliRunner().invoke(cli, [
            "recommend", "--model", "llama-3.1-8b", "--engine", "trtllm", "--rate", "20",
            "--input-len", "1000", "--output-len", "200", "--ttft-p99", "1", "--gpu",
            "h100-sxm", "--verify-top", "0",
            *(w for ext in ("json", "md", "html", "csv", "xlsx")
              for w in ("--export", str(d / f"plan.{ext}")))])
    assert res.exit_code == 0, res.output
    return {"text": res.stdout, "dir": d,
            "json": json.loads((d / "plan.json").read_text())}


def test_the_json_keeps_the_engine_ids(trtllm_plan) -> None:
    plan = trtllm_plan["json"]
    best = plan["recommendations"][0]
    assert best["engine"] == "trtllm" and set(ENGINES) <= set(best["engine_flags"])
    assert {"trtllm_prefill", "trtllm_decode", "trtllm_router"} <= set(
        plan["disaggregated"]["launch"])


def test_the_terminal_names_each_engine_as_the_reports_do(trtllm_plan) -> None:
    lines = trtllm_plan["text"].splitlines()
    assert "TRT-LLM" not in trtllm_plan["text"]
    assert any(ln.startswith("TensorRT-LLM: trtllm-serve ") for ln in lines)
    assert "sized for: TensorRT-LLM; the vLLM and SGLang lines carry" in trtllm_plan["text"]
    # the disaggregated block's lines, titled by the same name (they were "trtllm prefill")
    for role in ("prefill", "decode", "router"):
        assert any(ln.startswith(f"TensorRT-LLM {role}: ") for ln in lines), role
    # the launch lines' labels one column wide, every engine's command starting under it
    starts = {ln.split(":", 1)[0]: len(ln) - len(ln.split(":", 1)[1].lstrip())
              for ln in lines if ln.split(":", 1)[0] in LABELS.values()}
    assert set(starts) == set(LABELS.values()) and len(set(starts.values())) == 1


def test_every_report_names_each_engine_alike(trtllm_plan) -> None:
    d: Path = trtllm_plan["dir"]
    md = (d / "plan.md").read_text()
    assert "TRT-LLM" not in md
    assert "TensorRT-LLM:\n" in md and "TensorRT-LLM prefill (1 replica):" in md

    page = _Commands()
    page.feed((d / "plan.html").read_text())
    assert {"vLLM", "SGLang", "TensorRT-LLM", "TensorRT-LLM prefill (1 replica)",
            "TensorRT-LLM decode (1 replica)", "TensorRT-LLM router"} <= set(page.labels)
    assert not [x for x in page.labels if "TRT-LLM" in x or x.startswith("trtllm")]

    with (d / "plan.csv").open(newline="") as f:
        header = next(csv.reader(f))
    assert [h for h in header if h.endswith(" command")] == [
        f"{LABELS[e]} command" for e in ENGINES]

    openpyxl = pytest.importorskip("openpyxl")
    ws = openpyxl.load_workbook(d / "plan.xlsx", read_only=True)["recommendations"]
    row = next(ws.iter_rows(min_row=1, max_row=1, values_only=True))
    assert [h for h in row if isinstance(h, str) and h.endswith(" command")] == [
        f"{LABELS[e]} command" for e in ENGINES]


def test_the_llmd_refusal_names_the_engine_by_its_display_name(run_cli, tmp_path) -> None:
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--engine", "trtllm", "--rate", "1",
                  "--gpu", "h100-sxm", "--export", str(tmp_path / "plan.llm-d.yaml"))
    assert res.exit_code == 2
    assert "sized for TensorRT-LLM:" in res.stderr and "TRT-LLM" not in res.stderr


def test_the_verify_steps_have_one_name_in_every_output(trtllm_plan) -> None:
    # the terminal's `dataset:` and `verify:` lines, the reports' titles of the same commands
    # (they were "workload" in the HTML, "Benchmark workload" and "Benchmark" in Markdown)
    plan, d = trtllm_plan["json"], trtllm_plan["dir"]
    flags, pd = plan["recommendations"][0]["engine_flags"], plan["disaggregated"]
    # (the terminal's steps read the JSON it exported, the JSON's say PLAN.json)
    lines = trtllm_plan["text"].replace(str(d / "plan.json"), "PLAN.json").splitlines()
    for key, label in (("bench_dataset", "dataset"), ("bench", "verify")):
        # the aggregated fleet's step, then the layout's
        assert [ln for ln in lines if ln.startswith(f"{label}:")] == [
            f"{label}:".ljust(9) + flags[key], f"{label}:".ljust(9) + pd[key]]
    md = (d / "plan.md").read_text()
    assert "dataset:\n\n```bash\ncapplan verify " in md and "verify:\n\n```bash\naiperf " in md
    assert "Benchmark" not in md
    page = _Commands()
    page.feed((d / "plan.html").read_text())
    assert {"dataset", "verify", "measure", "P/D dataset", "P/D verify", "P/D measure"} <= set(
        page.labels)
    assert not [x for x in page.labels if "workload" in x]
