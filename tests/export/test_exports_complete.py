"""Every export carries what the plan's JSON holds: the pool comparison, each lane's SLOs and
features, the recommendations' chunk, KV dtype and engine features, the same rows (or says
"top N of M"), and the dtypes `auto` resolved to. Figures are read from the plan file or the
plan's JSON, never written here."""

from __future__ import annotations

import copy
import csv
import html
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from capplan.export import export_plan
from capplan.export.csv_export import SHOWN_RECOMMENDATIONS

ROOT = Path(__file__).resolve().parents[2]


def _plan(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from capplan.catalog.loader import load_catalog
    from capplan.plan.planner import run_plan
    from capplan.plan.schema import load_plan

    path = ROOT / "examples" / name
    res = run_plan(load_catalog(), load_plan(path), None).to_dict()
    return yaml.safe_load(path.read_text()), res


@pytest.fixture(scope="module")
def shared() -> tuple[dict[str, Any], dict[str, Any]]:
    return _plan("shared-70b.yaml")


@pytest.fixture(scope="module")
def adapters() -> tuple[dict[str, Any], dict[str, Any]]:
    return _plan("adapters-8b-eagle3.yaml")


def _write(plan: dict[str, Any], tmp_path: Path) -> dict[str, Path]:
    out = {}
    for suffix in ("md", "csv", "html", "xlsx"):
        out[suffix] = export_plan(plan, tmp_path / f"plan.{suffix}")
    return out


def _md_table(text: str, heading: str) -> list[dict[str, str]]:
    """The rows of the Markdown table under `heading`, by header."""
    block = text.split(heading, 1)[1].split("\n\n", 2)[1]
    lines = [ln for ln in block.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return [dict(zip(cells[0], r, strict=True)) for r in cells[2:]]


def _html_text(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", path.read_text()))


def _xlsx_rows(path: Path, sheet: str) -> list[dict[str, Any]]:
    openpyxl = pytest.importorskip("openpyxl")
    rows = list(openpyxl.load_workbook(path)[sheet].iter_rows(values_only=True))
    return [dict(zip(rows[0], r, strict=True)) for r in rows[1:]]


def test_every_format_has_the_per_lane_pools(shared, tmp_path) -> None:
    _, plan = shared
    lanes = plan["pools"]["separate"]["lanes"]
    assert plan["inputs"]["pools"] == "both" and len(lanes) == 2
    out = _write(plan, tmp_path)
    md = _md_table(out["md"].read_text(), "## Pools")
    with out["csv"].open() as f:
        rows = {r["rank"]: r for r in csv.DictReader(f)}
    sheet = {r["pool"]: r for r in _xlsx_rows(out["xlsx"], "pools")}
    page = _html_text(out["html"])
    assert "Pools: one shared pool against a pool per lane" in page
    for ln in lanes:
        want = (ln["gpu"], ln["tp"], ln["max_num_seqs"], ln["max_num_batched_tokens"])
        (m,) = [r for r in md if r["pool"] == f"lane {ln['lane']}"]
        assert (m["GPU"], int(m["TP"]), int(m["max seqs"]), int(m["max batched tokens"])) == want
        c = rows[f"pool: lane {ln['lane']}"]
        assert (c["GPU"], int(c["TP"]), int(c["max seqs"]),
                int(c["max batched tokens"])) == want
        x = sheet[f"lane {ln['lane']}"]
        assert (x["GPU"], x["TP"], x["max seqs"], x["max batched tokens"]) == want
        assert f"lane {ln['lane']} {ln['gpu']} {ln['tp']}" in " ".join(page.split())
    assert md[-1]["note"] == f"cheaper: {plan['pools']['cheaper']}"


def test_markdown_lanes_carry_every_slo(shared, tmp_path) -> None:
    spec, plan = shared
    md = {r["lane"]: r for r in _md_table(_write(plan, tmp_path)["md"].read_text(),
                                          "## Workload")}
    for lane in spec["workloads"]:
        slo = lane.get("slo") or {}
        for key, header in (("ttft_p99_s", "TTFT p99 SLO (ms)"),
                            ("tbt_p99_s", "TBT p99 SLO (ms)"),
                            ("e2e_p99_s", "E2E p99 SLO (ms)")):
            got = md[lane["name"]][header]
            assert (float(got) if got else None) == \
                (slo[key] * 1e3 if key in slo else None), (lane["name"], key)


def test_markdown_recommendations_show_chunk_and_kv_dtype(shared, tmp_path) -> None:
    _, plan = shared
    md = _md_table(_write(plan, tmp_path)["md"].read_text(), "## Recommendations")
    assert len(md) == min(len(plan["recommendations"]), SHOWN_RECOMMENDATIONS)
    for row, rec in zip(md, plan["recommendations"], strict=False):
        assert int(row["max batched tokens"]) == rec["max_num_batched_tokens"]
        assert row["KV dtype"] == rec["kv_dtype_resolved"]


def test_read_tables_show_the_same_rows_and_say_when_truncated(shared, tmp_path,
                                                                 run_cli) -> None:
    _, plan = shared
    n = len(plan["recommendations"])
    assert n > SHOWN_RECOMMENDATIONS  # the case the tester met: 11 recommendations
    out = _write(plan, tmp_path)
    note = f"top {SHOWN_RECOMMENDATIONS} of {n} recommendations"
    md = out["md"].read_text()
    assert len(_md_table(md, "## Recommendations")) == SHOWN_RECOMMENDATIONS
    assert note in md.lower()
    page = out["html"].read_text()
    rec_table = page.split("<h2>Recommendation and runner-ups</h2>")[1].split("</table>")[0]
    assert rec_table.count("<tr>") - 1 == SHOWN_RECOMMENDATIONS and note in page.lower()
    with out["csv"].open() as f:
        ranked = [r for r in csv.DictReader(f) if r["rank"].isdigit()]
    assert len(ranked) == n  # the data formats hold every one
    assert len(_xlsx_rows(out["xlsx"], "recommendations")) == n
    res = run_cli("plan", str(ROOT / "examples" / "shared-70b.yaml"), "--no-verify")
    assert res.exit_code == 0, res.stderr
    assert note in res.stdout  # the terminal table: the same rows and the same note


def test_engine_features_and_lane_adapters_in_every_format(adapters, tmp_path) -> None:
    spec, plan = adapters
    rec = plan["recommendations"][0]
    k, slots = rec["features"]["spec_tokens"], rec["features"]["max_loras"]
    stops = rec["speculation"]["stops_paying_at_batch"]
    out = _write(plan, tmp_path)
    md = out["md"].read_text()
    row = _md_table(md, "## Recommendations")[0]
    assert (int(row["draft tokens"]), int(row["LoRA slots"])) == (k, slots)
    assert int(row["speculation stops paying at batch"]) == stops
    with out["csv"].open() as f:
        first = next(csv.DictReader(f))
    assert (int(first["draft tokens"]), int(first["LoRA slots"])) == (k, slots)
    assert int(first["speculation stops paying at batch"]) == stops
    page = " ".join(_html_text(out["html"]).split())
    assert f"K={k} (stops paying at batch {stops}); LoRA {slots} slots" in page
    (lane,) = spec["workloads"]
    (md_lane,) = _md_table(md, "## Workload")
    assert int(md_lane["LoRA adapters"]) == lane["adapters"]
    assert md_lane["adapter popularity"] == lane["popularity"]
    import openpyxl  # the lane table sits under the inputs, its own header row first

    rows = list(openpyxl.load_workbook(out["xlsx"])["inputs"].iter_rows(values_only=True))
    head = next(r for r in rows if r[0] == "lane")
    x_lane = dict(zip(head, next(r for r in rows if r[0] == lane["name"]), strict=True))
    assert (x_lane["LoRA adapters"], x_lane["adapter popularity"]) == (
        lane["adapters"], lane["popularity"])


def test_xlsx_pareto_shows_the_resolved_dtypes(shared, tmp_path) -> None:
    _, plan = shared
    resolved: dict[tuple[Any, ...], set[tuple[str, str]]] = {}
    for r in plan["recommendations"]:
        resolved.setdefault((r["gpu"], r["tp"], r["replicas"]), set()).add(
            (r["weight_dtype_resolved"], r["kv_dtype_resolved"]))
    pareto = _xlsx_rows(_write(plan, tmp_path)["xlsx"], "pareto")
    assert len(pareto) == len(plan["pareto"]) > 0
    for p in pareto:  # as the recommendations sheet names them: never `auto`
        assert (p["weight dtype"], p["KV dtype"]) in resolved[(p["GPU"], p["TP"],
                                                                p["replicas"])]


def test_speculation_that_never_stops_paying_says_so_in_every_format(adapters, tmp_path) -> None:
    # The plan's speculation note with no batch at which the speed-up falls to 1: JSON keeps
    # null beside the range checked; the read formats print "never (up to N)", not a blank.
    _, plan = adapters
    plan = copy.deepcopy(plan)
    rec = plan["recommendations"][0]
    top = rec["speculation"]["stops_paying_checked_up_to_batch"]
    assert top == max(rec["max_num_seqs"], 1024)  # powers of two up to max(max_num_seqs, 1024)
    rec["speculation"]["stops_paying_at_batch"] = None
    out = _write(plan, tmp_path)
    row = _md_table(out["md"].read_text(), "## Recommendations")[0]
    assert row["speculation stops paying at batch"] == f"never (up to {top})"
    with out["csv"].open() as f:
        assert next(csv.DictReader(f))["speculation stops paying at batch"] == (
            f"never (up to {top})")
    page = " ".join(_html_text(out["html"]).split())
    assert f"(stops paying: never (up to {top}))" in page
    assert _xlsx_rows(out["xlsx"], "recommendations")[0][
        "speculation stops paying at batch"] == f"never (up to {top})"
