"""Exporters: each format written from a hand-built plan and read back; atomic replacement."""

from __future__ import annotations

import copy
import csv
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from capplan.errors import InputError
from capplan.export import export_plan

LAT = {"mean": 0.2, "p50": 0.15, "p90": 0.4, "p99": 0.65}
TBT = {"mean": 0.03, "p50": 0.028, "p90": 0.045, "p99": 0.057}
E2E = {"mean": 9.5, "p50": 9.0, "p90": 12.0, "p99": 14.0}


def _rec(rank: int, gpu: str, replicas: int, cost: float, **over: Any) -> dict[str, Any]:
    rec = {
        "rank": rank, "gpu": gpu, "tp": 1, "replicas": replicas, "gpus_total": replicas,
        "max_num_seqs": 256, "max_num_batched_tokens": 2048, "weight_dtype": "bf16",
        "kv_dtype": "auto",
        "predicted": {"ttft_s": dict(LAT), "tbt_s": dict(TBT), "e2e_s": dict(E2E),
                      "output_tokens_per_s": 1800.0, "input_tokens_per_s": 4800.0,
                      "requests_per_s": 6.0, "mean_running_batch": 57.0, "preemptions": 0,
                      "kv_peak_utilization": 0.4},
        "capacity_per_replica_rps": 7.5, "per_replica_rate_per_s": 6.0,
        "binding_constraint": "TBT SLO", "slo_margins": {"ttft_p99": 0.35, "tbt_p99": 0.05},
        "cost_per_hour": cost,
        "verified": {"ok": True, "simulated": {"ttft_s": {"mean": 0.2, "p50": 0.1, "p90": 0.4,
                                                          "p99": 0.7},
                                               "tbt_s": dict(TBT), "e2e_s": dict(E2E)}},
        "why_not_first": "",
        "engine_flags": {
            "vllm": f"vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 256 ({gpu})",
            "sglang": "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B",
            "bench": "vllm bench serve --request-rate 6",
        },
    }
    rec.update(over)
    return rec


def sample_plan() -> dict[str, Any]:
    return {
        "model": "llama-3.1-8b", "objective": "min_cost", "headroom": 0.2,
        "target_rate_per_s": 12.0,
        "lanes": [{"name": "chat", "rate_per_s": 12.0, "input_len": "lognormal:mean=800,p99=4000",
                   "output_len": "300", "ttft_p99_s": 1.0, "tbt_p99_s": 0.06, "priority": 0}],
        "inputs": {"model": "llama-3.1-8b", "candidates": ["h100-sxm", "l40s"],
                   "max_num_seqs": 256, "objective": "min_cost", "headroom": 0.2,
                   "gpu_memory_utilization": 0.9},
        "recommendations": [
            _rec(1, "h100-sxm", 2, 7.56),
            _rec(2, "l40s", 4, 9.07, why_not_first="costs 20% more", verified=None,
                 capacity_per_replica_rps=float("inf")),
        ],
        "pareto": [
            {"gpu": "h100-sxm", "tp": 1, "replicas": 2, "cost_per_hour": 7.56,
             "ttft_p99_s": 0.65, "tbt_p99_s": 0.057},
            {"gpu": "h100-sxm", "tp": 1, "replicas": 3, "cost_per_hour": 11.34,
             "ttft_p99_s": 0.3, "tbt_p99_s": 0.04},
        ],
        "curves": [
            {"label": "h100-sxm tp1 seqs256 chunk2048",
             "points": [{"rate_per_s": r, "output_tokens_per_s": 300.0 * r,
                         "ttft_p99_s": 0.1 + 0.08 * r, "tbt_p99_s": 0.02 + 0.006 * r}
                        for r in (1.0, 2.0, 4.0, 6.0)]
             + [{"rate_per_s": 8.0, "output_tokens_per_s": 2200.0, "ttft_p99_s": float("inf"),
                 "tbt_p99_s": None}]},
            {"label": "l40s tp1 seqs256 chunk2048",
             "points": [{"rate_per_s": r, "output_tokens_per_s": 290.0 * r,
                         "ttft_p99_s": 0.2 + 0.15 * r, "tbt_p99_s": 0.03 + 0.01 * r}
                        for r in (1.0, 2.0, 3.0)]},
        ],
        "warnings": ["l40s: KV cache holds only 3 sequences of max_model_len"],
    }


@pytest.fixture
def plan() -> dict[str, Any]:
    return sample_plan()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# --- CSV -------------------------------------------------------------------------------------

def test_csv_one_row_per_recommendation_with_units(plan: dict[str, Any], tmp_path: Path) -> None:
    out = export_plan(plan, tmp_path / "plan.csv")
    with out.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    header = list(rows[0])
    for col in ("GPU", "GPUs", "TTFT p99 (ms)", "TBT p99 (ms)", "cost ($/h)",
                "output throughput (tokens/s)", "KV peak (%)", "vLLM command"):
        assert col in header
    first, second = rows
    assert first["GPU"] == "h100-sxm" and first["GPUs"] == "2" and first["rank"] == "1"
    assert float(first["TTFT p99 (ms)"]) == pytest.approx(650.0)
    assert float(first["TBT p99 (ms)"]) == pytest.approx(57.0)
    assert float(first["cost ($/h)"]) == pytest.approx(7.56)
    assert float(first["KV peak (%)"]) == pytest.approx(40.0)
    assert float(first["TBT p99 margin (%)"]) == pytest.approx(5.0)
    assert first["verified by sim"] == "yes"
    assert first["vLLM command"].startswith("vllm serve ")
    # inf and null become empty cells
    assert second["capacity per replica (req/s)"] == ""
    assert second["verified by sim"] == "" and second["sim TTFT p99 (ms)"] == ""
    assert second["why not first"] == "costs 20% more"


# --- JSON ------------------------------------------------------------------------------------

def test_json_round_trip_with_inf_as_null(plan: dict[str, Any], tmp_path: Path) -> None:
    out = export_plan(plan, tmp_path / "plan.json")
    text = out.read_text(encoding="utf-8")
    assert "Infinity" not in text and "NaN" not in text
    back = json.loads(text)
    assert back["recommendations"][1]["capacity_per_replica_rps"] is None
    assert back["curves"][0]["points"][4]["ttft_p99_s"] is None
    expected = copy.deepcopy(plan)
    expected["recommendations"][1]["capacity_per_replica_rps"] = None
    expected["curves"][0]["points"][4]["ttft_p99_s"] = None
    assert back == expected


def test_json_nan_and_numpy_scalars(plan: dict[str, Any], tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    plan["headroom"] = np.float64(0.2)
    plan["target_rate_per_s"] = float("nan")
    plan["recommendations"][0]["replicas"] = np.int64(2)
    back = json.loads(export_plan(plan, tmp_path / "p.json").read_text())
    assert back["headroom"] == 0.2 and back["target_rate_per_s"] is None
    assert back["recommendations"][0]["replicas"] == 2


# --- Markdown --------------------------------------------------------------------------------

def test_markdown_report(plan: dict[str, Any], tmp_path: Path) -> None:
    text = export_plan(plan, tmp_path / "plan.md").read_text(encoding="utf-8")
    assert text.startswith("# Capacity plan: llama-3.1-8b\n")
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.replace(" ", "").startswith("|rank|"))
    assert "TTFT p99 (ms)" in header and "cost ($/h)" in header and "GPUs" in header
    assert "vLLM command" not in header  # commands go in code fences, not the table
    assert "TBT p99 margin (%)" not in header  # details stay in CSV and XLSX
    row1 = next(ln for ln in lines if ln.replace(" ", "").startswith("|1|"))
    assert "h100-sxm" in row1 and "650" in row1 and "7.56" in row1
    assert "## Warnings" in text and "- l40s: KV cache holds only 3" in text
    fence = ("```bash\nvllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 256 (h100-sxm)"
             "\n```")
    assert fence in text
    assert "python -m sglang.launch_server" in text and "vllm bench serve" in text
    assert "(l40s)" not in text  # only the first recommendation's commands
    assert "## Pareto front" in text and "11.34" in text
    assert "TTFT p99 SLO (ms)" in text  # lanes table


def test_markdown_without_recommendations(plan: dict[str, Any], tmp_path: Path) -> None:
    plan["recommendations"] = []
    plan["warnings"] = []
    text = export_plan(plan, tmp_path / "plan.md").read_text(encoding="utf-8")
    assert "No configuration meets the constraints." in text
    assert "## Warnings\n\nNone." in text
    assert "```" not in text


# --- XLSX ------------------------------------------------------------------------------------

def test_xlsx_sheets_headers_values_and_chart(plan: dict[str, Any], tmp_path: Path) -> None:
    openpyxl = pytest.importorskip("openpyxl")
    out = export_plan(plan, tmp_path / "plan.xlsx")
    wb = openpyxl.load_workbook(out)
    assert wb.sheetnames[:3] == ["recommendations", "inputs", "curve"]
    assert "pareto" in wb.sheetnames

    ws = wb["recommendations"]
    header = [c.value for c in ws[1]]
    col = {h: i for i, h in enumerate(header)}
    assert {"GPU", "GPUs", "TTFT p99 (ms)", "cost ($/h)"} <= set(header)
    r2 = [c.value for c in ws[2]]
    assert r2[col["GPU"]] == "h100-sxm"
    assert r2[col["GPUs"]] == 2 and isinstance(r2[col["GPUs"]], int)
    assert r2[col["TTFT p99 (ms)"]] == pytest.approx(650.0)
    assert isinstance(r2[col["cost ($/h)"]], float)
    r3 = [c.value for c in ws[3]]
    assert r3[col["capacity per replica (req/s)"]] is None  # inf -> empty cell
    assert ws.max_row == 3

    inputs = {r[0]: r[1] for r in wb["inputs"].iter_rows(min_row=2, values_only=True)}
    assert [c.value for c in wb["inputs"][1]][:2] == ["input", "value"]
    assert inputs["headroom"] == pytest.approx(0.2)
    assert json.loads(inputs["candidates"]) == ["h100-sxm", "l40s"]

    ws = wb["curve"]
    header = [c.value for c in ws[1]]
    assert header == ["curve", "arrival rate (req/s)", "output throughput (tokens/s)",
                      "TTFT p99 (ms)", "TBT p99 (ms)"]
    rows = list(ws.iter_rows(min_row=2, values_only=True))
    assert len(rows) == 8
    assert rows[0] == ("h100-sxm tp1 seqs256 chunk2048", 1.0, 300.0, pytest.approx(180.0),
                       pytest.approx(26.0))
    assert rows[4][3] is None and rows[4][4] is None  # inf and null -> empty cells

    pareto = list(wb["pareto"].iter_rows(values_only=True))
    assert pareto[0][3] == "cost ($/h)" and pareto[2][3] == pytest.approx(11.34)

    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        assert "xl/charts/chart1.xml" in names
        chart = z.read("xl/charts/chart1.xml").decode("utf-8")
    assert "<c:scatterChart>" in chart
    assert chart.count("<c:ser>") == 2  # one series per curve label
    assert "curve!$D$2:$D$6" in chart and "curve!$C$2:$C$6" in chart
    assert "TTFT p99 (ms)" in chart and "output throughput (tokens/s)" in chart


def test_xlsx_number_formats_widths_and_workload(plan: dict[str, Any], tmp_path: Path) -> None:
    """Issue 15: numbers carry formats (ms whole, $ to cents), every column is at least as wide
    as its header, and the inputs sheet holds the workload (rate, lengths, SLOs)."""
    openpyxl = pytest.importorskip("openpyxl")
    wb = openpyxl.load_workbook(export_plan(plan, tmp_path / "plan.xlsx"))
    ws = wb["recommendations"]
    col = {c.value: c.column_letter for c in ws[1]}
    assert ws[f"{col['TTFT p99 (ms)']}2"].number_format == "#,##0"
    assert ws[f"{col['TBT p99 (ms)']}2"].number_format == "#,##0.0"
    assert ws[f"{col['cost ($/h)']}2"].number_format == "#,##0.00"
    for sheet in ("recommendations", "inputs", "curve", "pareto"):
        ws = wb[sheet]
        widths = {}  # openpyxl files a run of equal widths under its first column
        for dim in ws.column_dimensions.values():
            for i in range(dim.min, dim.max + 1):
                widths[i] = dim.width
        for cell in ws[1]:
            if cell.value is not None:
                assert widths[cell.column] >= len(str(cell.value)), (sheet, cell.value)
    rows = list(wb["inputs"].iter_rows(values_only=True))
    lane_head = next(i for i, r in enumerate(rows) if r[0] == "lane")
    assert rows[lane_head - 1][0] is None  # a blank row between the settings and the lanes
    head, chat = rows[lane_head], rows[lane_head + 1]
    lane = dict(zip(head, chat, strict=True))
    assert lane["lane"] == "chat" and lane["rate (req/s)"] == pytest.approx(12.0)
    assert lane["input length (tokens)"] == "lognormal:mean=800,p99=4000"
    assert lane["output length (tokens)"] == "300"
    assert lane["TTFT p99 SLO (ms)"] == pytest.approx(1000.0)
    assert lane["TBT p99 SLO (ms)"] == pytest.approx(60.0)


def test_xlsx_without_curves_has_no_chart(plan: dict[str, Any], tmp_path: Path) -> None:
    plan["curves"] = []
    plan["pareto"] = []
    out = export_plan(plan, tmp_path / "plan.xlsx")
    with zipfile.ZipFile(out) as z:
        assert not [n for n in z.namelist() if n.startswith("xl/charts/")]
        workbook = z.read("xl/workbook.xml").decode("utf-8")
    assert 'name="curve"' in workbook and 'name="pareto"' not in workbook


def test_xlsx_missing_xlsxwriter_says_what_to_install(plan: dict[str, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "xlsxwriter", None)  # import now raises ImportError
    with pytest.raises(InputError, match=r"pip install capplan\[xlsx\]"):
        export_plan(plan, tmp_path / "plan.xlsx")
    assert not (tmp_path / "plan.xlsx").exists() and _leftovers(tmp_path) == []


# --- dispatcher and atomic behaviour ---------------------------------------------------------

@pytest.mark.parametrize("name", ["plan.txt", "plan", "plan.xls"])
def test_unknown_suffix_is_input_error(plan: dict[str, Any], tmp_path: Path, name: str) -> None:
    with pytest.raises(InputError, match="use one of .csv, .json, .md, .xlsx"):
        export_plan(plan, tmp_path / name)


def test_suffix_is_case_insensitive(plan: dict[str, Any], tmp_path: Path) -> None:
    assert json.loads(export_plan(plan, tmp_path / "P.JSON").read_text())["model"] == "llama-3.1-8b"


def test_missing_folder_is_input_error(plan: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        export_plan(plan, tmp_path / "nope" / "plan.csv")


@pytest.mark.parametrize("suffix", [".csv", ".json", ".md", ".xlsx"])
def test_bad_plan_leaves_old_file(plan: dict[str, Any], tmp_path: Path, suffix: str) -> None:
    target = tmp_path / f"plan{suffix}"
    target.write_text("old content", encoding="utf-8")
    del plan["recommendations"]
    with pytest.raises(InputError, match="no 'recommendations' key"):
        export_plan(plan, target)
    assert target.read_text(encoding="utf-8") == "old content"
    assert _leftovers(tmp_path) == []


def _boom(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("disk full")


def _half_write(self: Path, text: str, *args: Any, **kwargs: Any) -> None:
    with open(self, "w", encoding="utf-8") as f:
        f.write(text[: len(text) // 2])
    raise RuntimeError("disk full")


@pytest.mark.parametrize(("suffix", "target", "fake"), [
    (".csv", "csv.writer", _boom),
    (".json", "pathlib.Path.write_text", _half_write),
    (".md", "pathlib.Path.write_text", _half_write),
])
def test_failure_while_writing_leaves_old_file(plan: dict[str, Any], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, suffix: str,
                                               target: str, fake: Any) -> None:
    out = tmp_path / f"plan{suffix}"
    out.write_bytes(b"old content")
    monkeypatch.setattr(target, fake)
    with pytest.raises(RuntimeError, match="disk full"):
        export_plan(plan, out)
    assert out.read_bytes() == b"old content"
    assert _leftovers(tmp_path) == []


def test_xlsx_failure_midway_leaves_old_file(plan: dict[str, Any], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import capplan.export.xlsx as xlsx_mod

    target = tmp_path / "plan.xlsx"
    target.write_bytes(b"old workbook")
    # the recommendations and inputs sheets are written, then the curve sheet fails
    monkeypatch.setattr(xlsx_mod, "_curve_sheet", _boom)
    with pytest.raises(RuntimeError, match="disk full"):
        export_plan(plan, target)
    assert target.read_bytes() == b"old workbook"
    assert _leftovers(tmp_path) == []


def test_export_replaces_existing_file(plan: dict[str, Any], tmp_path: Path) -> None:
    target = tmp_path / "plan.csv"
    target.write_text("old content", encoding="utf-8")
    export_plan(plan, target)
    assert target.read_text(encoding="utf-8").startswith("rank,GPU,")
    assert _leftovers(tmp_path) == []


def test_bad_recommendation_shape(plan: dict[str, Any], tmp_path: Path) -> None:
    del plan["recommendations"][1]["gpu"]
    with pytest.raises(InputError, match="recommendation 2 has no 'gpu' key"):
        export_plan(plan, tmp_path / "plan.md")
    with pytest.raises(InputError, match="must be a dict"):
        export_plan([], tmp_path / "plan.json")  # type: ignore[arg-type]
    assert not (tmp_path / "plan.md").exists() and not (tmp_path / "plan.json").exists()
    assert _leftovers(tmp_path) == []


def test_typed_plan_result_exports_as_its_dict(tmp_path: Path) -> None:
    """export_plan takes the planner's PlanResult as well: the file is that of its to_dict()."""
    from capplan.catalog.loader import load_catalog
    from capplan.plan.planner import run_plan
    from capplan.plan.schema import PlanFile

    plan = PlanFile.model_validate({
        "model": "llama-3.1-8b", "candidates": {"gpus": ["l40s"], "tp": [1]},
        "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 2048},
        "workloads": [{"rate_per_s": 2, "input_len": 500, "output_len": 100}],
        "verify": {"top": 0}})
    result = run_plan(load_catalog(), plan)
    for suffix in (".json", ".csv", ".md"):
        typed = export_plan(result, tmp_path / f"typed{suffix}")
        plain = export_plan(result.to_dict(), tmp_path / f"plain{suffix}")
        assert typed.read_bytes() == plain.read_bytes(), suffix


def test_pareto_table_is_the_same_in_markdown_and_xlsx(plan: dict[str, Any],
                                                        tmp_path: Path) -> None:
    """One column spec for the Pareto front: the same headers, dtypes included (rows that
    differ only in dtype must not look duplicated)."""
    import openpyxl

    for p in plan["pareto"]:
        p.update(weight_dtype="fp8", kv_dtype="auto")
    md = export_plan(plan, tmp_path / "p.md").read_text(encoding="utf-8")
    section = md.split("## Pareto front", 1)[1]
    md_header = [h.strip() for h in section.splitlines()[2].strip("|").split("|")]
    wb = openpyxl.load_workbook(export_plan(plan, tmp_path / "p.xlsx"))
    xlsx_header = [c.value for c in wb["pareto"][1]]
    assert md_header == xlsx_header
    assert {"weight dtype", "KV dtype"} <= set(xlsx_header)
    assert list(wb["pareto"].iter_rows(values_only=True))[1][-2:] == ("fp8", "auto")


def test_xlsx_inputs_carry_the_plans_notes_and_warnings(plan: dict[str, Any],
                                                        tmp_path: Path) -> None:
    """The spreadsheet says what the plan assumed or left out, as the text, Markdown and HTML
    reports do (plan/alternatives.py PLAN_NOTES), and its warnings."""
    openpyxl = pytest.importorskip("openpyxl")
    plan = {**plan, "warnings": ["max_num_seqs 256 far exceeds the ~9 sequences"],
            "scheduler_alternative": {"note": "--enable-mixed-chunk (...): 4 GPUs instead of 16"}}
    wb = openpyxl.load_workbook(export_plan(plan, tmp_path / "plan.xlsx"))
    rows = [r[:2] for r in wb["inputs"].iter_rows(min_row=2, values_only=True)]
    assert ("scheduler alternative", "--enable-mixed-chunk (...): 4 GPUs instead of 16") in rows
    assert ("warning", "max_num_seqs 256 far exceeds the ~9 sequences") in rows


def test_markdown_and_html_name_the_engine_the_figures_are_for(plan: dict[str, Any],
                                                               tmp_path: Path) -> None:
    """Every engine's line is printed; only the planned one was sized (plan.launch.sized_for)."""
    rec = {**plan["recommendations"][0], "engine": "sglang", "engine_profile": "sglang"}
    plan = {**plan, "recommendations": [rec, *plan["recommendations"][1:]]}
    assert {"vllm", "sglang"} <= set(rec.get("engine_flags") or {})
    want = "Sized for SGLang; the vLLM line carries the same settings, not sized for that engine."
    md = export_plan(plan, tmp_path / "plan.md").read_text()
    html = export_plan(plan, tmp_path / "plan.html").read_text()
    assert want in md and want in html


def test_html_leaves_out_curve_points_without_a_figure(plan: dict[str, Any],
                                                       tmp_path: Path) -> None:
    """A curve point past capacity has no p99 (null in the JSON, or infinite): the chart skips
    it instead of failing (the sample's fifth point has both)."""
    assert any(q["tbt_p99_s"] is None for c in plan["curves"] for q in c["points"])
    text = export_plan(plan, tmp_path / "plan.html").read_text()
    assert "TBT p99 vs load" in text and "inf" not in text.split("<h2>Latency vs load")[1][:5000]


def test_copied_launch_blocks_run_as_they_are(plan: dict[str, Any], tmp_path: Path) -> None:
    """A fleet's launch block is given to copy (HTML) and as a ```bash block (Markdown) as it
    runs: the terminal's "replica 0 (localhost): " labels become "# replica 0 on localhost"
    comment lines, as the CSV pools' cells have them (before: the labels were in the text,
    `replica: command not found`)."""
    fleet = ("replica 0 (localhost): CUDA_VISIBLE_DEVICES=0 vllm serve m --port 8100\n"
             "replica 1 (HOST1): CUDA_VISIBLE_DEVICES=0 vllm serve m --port 8100\n"
             "router: vllm-router --worker-urls http://localhost:8100 http://HOST1:8100")
    rec = plan["recommendations"][0]
    rec = {**rec, "engine_flags": {**rec["engine_flags"], "fleet:vllm": fleet}}
    plan = {**plan, "recommendations": [rec, *plan["recommendations"][1:]]}
    script = ("# replica 0 on localhost\nCUDA_VISIBLE_DEVICES=0 vllm serve m --port 8100\n"
              "# replica 1 on HOST1\nCUDA_VISIBLE_DEVICES=0 vllm serve m --port 8100\n"
              "# router\nvllm-router --worker-urls http://localhost:8100 http://HOST1:8100")
    md = export_plan(plan, tmp_path / "plan.md").read_text()
    html = export_plan(plan, tmp_path / "plan.html").read_text()
    assert f"```bash\n{script}\n```" in md
    assert f">{script}</pre>" in html
    assert "replica 0 (localhost):" not in md and "replica 0 (localhost):" not in html
