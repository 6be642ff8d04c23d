"""A day plan's totals and replay attainment in every export, read back from the files: in the
units their headers name, as the table output prints them (costs in $ per day, the saving in
%, attainment in %), with the saving in GPU-hours and in $ per day the JSON has; a plan of
several models adds each model's own day."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from capplan.catalog.loader import load_catalog
from capplan.export import export_plan
from capplan.plan.day_run import run_day_plan
from capplan.plan.schema import PlanFile

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "day"
ATTAINMENT = "replay planned attainment (%)"


@pytest.fixture(scope="module")
def day() -> dict[str, Any]:
    """Llama-3.1-70B on H100 TP 4 over a day from 1 to 10 req/s (1-hour windows): 1 to 3
    replicas, the peak window and its neighbours replayed."""
    lane = {"name": "chat", "input_len": 1000, "output_len": 250,
            "rate_curve": [{"at": "04:00", "rate_per_s": 1}, {"at": "15:00", "rate_per_s": 10}],
            "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.1}}
    doc = {"version": 1, "model": "llama-3.1-70b",
           "candidates": {"gpus": ["h100-sxm"], "tp": [4]},
           "engine": {"max_num_seqs": [128], "max_num_batched_tokens": [2048]},
           "workloads": [lane], "verify": {"top": 0},
           "day": {"replay": "peak", "window_s": 3600}}
    d = run_day_plan(load_catalog(), PlanFile.model_validate(doc)).to_dict()
    assert d["saving_frac"] > 0 and d["saving_per_day"] > 0  # something to show
    return d


def _expected(d: dict[str, Any]) -> dict[str, float]:
    """The totals by their headers, in those headers' units, from the JSON."""
    return {"peak replicas": d["peak_replicas"], "GPU-hours, autoscaled": d["gpu_hours"],
            "GPU-hours, fixed at the peak": d["fixed_fleet_gpu_hours"],
            "cost per day, autoscaled ($)": d["cost_per_day"],
            "cost per day, fixed at the peak ($)": d["fixed_fleet_cost_per_day"],
            "saving (GPU-hours)": d["saving_gpu_hours"],
            "saving per day ($)": d["saving_per_day"],
            "saving (%)": 100 * d["saving_frac"],
            "replica start-up (s)": d["day"]["startup"]["replica_start_s"]}


def _attained(d: dict[str, Any]) -> list[float]:
    """The replayed windows' planned attainment in %."""
    return [100 * w["replay"]["planned"]["attainment"] for w in d["schedule"]
            if w.get("replay")]


def _csv_sections(path: Path) -> list[list[list[str]]]:
    return [list(csv.reader(part.splitlines()))
            for part in path.read_text().strip().split("\n\n")]


def test_schedule_csv_gives_units(day, tmp_path: Path):
    export_plan(day, tmp_path / "d.csv")
    sched, totals = _csv_sections(tmp_path / "d.schedule.csv")
    col = sched[0].index(ATTAINMENT)
    assert [float(r[col]) for r in sched[1:] if r[col]] == pytest.approx(_attained(day))
    assert totals[0] == ["quantity", "value"]
    got = {q: float(v) for q, v in totals[1:]}
    assert {q: got.get(q) for q in _expected(day)} == pytest.approx(_expected(day))


def test_xlsx_gives_units(day, tmp_path: Path):
    openpyxl = pytest.importorskip("openpyxl")
    ws = openpyxl.load_workbook(export_plan(day, tmp_path / "d.xlsx"))["schedule"]
    rows = [[c.value for c in r] for r in ws.iter_rows()]
    col = rows[0].index(ATTAINMENT)
    n = len(day["schedule"])
    assert [r[col] for r in rows[1:n + 1] if r[col] is not None] == pytest.approx(
        _attained(day))
    assert rows[n + 2][:2] == ["quantity", "value"]
    got = {r[0]: r[1] for r in rows[n + 3:] if r[0] is not None}
    assert {q: got.get(q) for q in _expected(day)} == pytest.approx(_expected(day))


def test_markdown_gives_units(day, tmp_path: Path):
    text = export_plan(day, tmp_path / "d.md").read_text()
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in text.splitlines()
             if ln.startswith("|")]
    got = {r[0]: float(r[1]) for r in cells if len(r) == 2 and r[0] in _expected(day)}
    want = _expected(day)
    # each shown in its format: $ to the cent, % and GPU-hours to a tenth, seconds whole
    assert got == pytest.approx(want, abs=0.5)
    assert got["cost per day, autoscaled ($)"] == round(want["cost per day, autoscaled ($)"], 2)
    assert got["saving (%)"] == round(want["saving (%)"], 1)
    head = next(r for r in cells if ATTAINMENT in r)
    col = head.index(ATTAINMENT)
    shown = [r[col] for r in cells if len(r) == len(head) and r is not head and r[col]
             and not r[col].startswith("-")]
    assert shown == [f"{a:.1f}" for a in _attained(day)]


def test_markdown_totals_keep_their_digits():
    """The totals as the HTML export and the table output show them: $ to the cent, GPU-hours
    and % to a tenth, trailing zeros kept (Markdown printed 75.6 and 52)."""
    from capplan.export.day_export import markdown_section
    from capplan.export.markdown import _table

    plan = {"schedule": [{"start_s": 0.0, "end_s": 3600.0, "offered_rps": 1.0, "replicas": 2,
                          "gpus": 2}],
            "peak_replicas": 2, "gpu_hours": 52.0, "fixed_fleet_gpu_hours": 72.0,
            "cost_per_day": 196.56, "fixed_fleet_cost_per_day": 272.16,
            "saving_gpu_hours": 20.0, "saving_per_day": 75.6, "saving_frac": 20 / 72}
    text = "\n".join(markdown_section(plan, _table))
    cells = dict(tuple(c.strip() for c in ln.strip("|").split("|")) for ln in text.splitlines()
                 if ln.startswith("|") and ln.count("|") == 3)
    assert cells["GPU-hours, autoscaled"] == "52.0"
    assert cells["saving per day ($)"] == "75.60"
    assert cells["cost per day, autoscaled ($)"] == "196.56"
    assert cells["saving (GPU-hours)"] == "20.0"
    assert cells["saving (%)"] == "27.8"  # 20 / 72 = 27.78%
    assert cells["peak replicas"] == "2"


def test_html_gives_units(day, tmp_path: Path):
    text = export_plan(day, tmp_path / "d.html").read_text()
    got = dict(re.findall(r'<tr><td class="l">([^<]*)</td><td class="">([^<]*)</td></tr>', text))
    want = _expected(day)
    assert got["cost per day, autoscaled ($)"] == f"{want['cost per day, autoscaled ($)']:.2f}"
    assert got["saving per day ($)"] == f"{want['saving per day ($)']:.2f}"
    assert got["saving (%)"] == f"{want['saving (%)']:.1f}"
    assert got["saving (GPU-hours)"] == f"{want['saving (GPU-hours)']:.1f}"
    assert f"<th class=\"\">{ATTAINMENT}</th>" in text
    assert "cost_per_day" not in text and "saving_frac" not in text
    from capplan.export.day_export import zone

    # the chart's axis names the zone, as the schedule's headers and the PNG do
    assert f"time of day (h in {zone(day)})" in text and "time of day (h)" not in text


def test_several_models_totals_give_each_models_day(tmp_path: Path):
    doc = yaml.safe_load((EXAMPLES / "two-models.yaml").read_text())
    two = run_day_plan(load_catalog(), PlanFile.model_validate(doc)).to_dict()
    export_plan(two, tmp_path / "t.csv")
    _, totals = _csv_sections(tmp_path / "t.schedule.csv")
    got = {q: float(v) for q, v in totals[1:]}
    for m in two["models"]:
        want = {f"{m['model']}: {q}": v for q, v in _expected(m).items()}
        assert {q: got.get(q) for q in want} == pytest.approx(want)
    assert got["cost per day, fixed fleets each at its own peak ($)"] == pytest.approx(
        two["separate_fleets_cost_per_day"])
