"""Exports of a plan of several models (`models:`): every model's deployment, launch lines,
recommendation rows and curves, each under its model's name."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import yaml

from capplan.catalog.loader import load_catalog
from capplan.export import export_plan
from capplan.plan.day_run import run_day_plan
from capplan.plan.flags import launch_text, runnable
from capplan.plan.schema import PlanFile

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "day" / "two-models.yaml"
HF = {"llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct", "qwen2.5-72b": "Qwen/Qwen2.5-72B"}


@pytest.fixture(scope="module")
def two() -> dict[str, Any]:
    """examples/day/two-models.yaml (replay off there already) as its JSON dict."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    return run_day_plan(load_catalog(), PlanFile.model_validate(doc)).to_dict()


def _best(two: dict[str, Any], model: str) -> dict[str, Any]:
    return next(m for m in two["models"] if m["model"] == model)["recommendations"][0]


def test_k8s_runs_each_model_with_its_replicas(two, tmp_path: Path):
    docs = list(yaml.safe_load_all(export_plan(two, tmp_path / "t.k8s.yaml").read_text()))
    deps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    svcs = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    # one Deployment and one Service per model, named by it (k8s._name: lower-case, [a-z0-9-])
    assert set(deps) == svcs == {"llama-3-1-70b", "qwen2-5-72b"}
    for model, name in (("llama-3.1-70b", "llama-3-1-70b"), ("qwen2.5-72b", "qwen2-5-72b")):
        best = _best(two, model)
        spec = deps[name]["spec"]
        # created at its first window's replicas; its CronJobs move it (tests/day/test_day_k8s)
        first = next(m for m in two["models"] if m["model"] == model)["schedule"][0]
        assert spec["replicas"] == first["replicas"]
        command = spec["template"]["spec"]["containers"][0]["command"]
        assert command[:3] == ["vllm", "serve", HF[model]]
        gpus = spec["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        assert gpus == str(best["gpus_total"] // best["replicas"])


def test_llmd_refuses_several_models(run_cli, tmp_path: Path):
    res = run_cli("plan", str(EXAMPLE), "--no-verify", "--export", str(tmp_path / "t.llm-d.yaml"))
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert "\n" not in err and "llama-3.1-70b, qwen2.5-72b" in err and "one model" in err
    assert not (tmp_path / "t.llm-d.yaml").exists()


@pytest.mark.parametrize("suffix", [".md", ".html"])
def test_reports_carry_each_models_launch_line(two, tmp_path: Path, suffix: str):
    text = export_plan(two, tmp_path / f"t{suffix}").read_text()
    for model in HF:  # each model's fleet as it runs: every replica's line, its router's,
        # the replica labels as shell comments (what a copied block runs)
        placed = launch_text(_best(two, model)["engine_flags"], "vllm")
        lines = runnable(placed).split("\n")
        assert f"Model: {model}" in text and placed.startswith("replica 0 (")
        assert lines[0].startswith("# replica 0 on ")
        for line in lines:
            assert (line if suffix == ".md" else line.replace('"', "&quot;")) in text


def test_csv_names_the_model_of_each_row(two, tmp_path: Path):
    with export_plan(two, tmp_path / "t.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["model"], r["rank"]) for r in rows] == [("llama-3.1-70b", "1"),
                                                       ("qwen2.5-72b", "1")]
    for r in rows:
        assert int(r["replicas"]) == _best(two, r["model"])["replicas"]


def test_xlsx_curve_sheet_has_each_models_curves(two, tmp_path: Path):
    openpyxl = pytest.importorskip("openpyxl")
    wb = openpyxl.load_workbook(export_plan(two, tmp_path / "t.xlsx"))
    labels = {c.value for c in wb["curve"]["A"][1:]}
    want = {f"{m['model']}: {c['label']}" for m in two["models"] for c in m["curves"]}
    assert labels == want and len(want) >= 2
    assert wb["recommendations"]["A1"].value == "model"
