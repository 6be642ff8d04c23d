"""`capplan plan FILE.yaml` and `capplan schema`: errors with file:line, safe YAML, units in
SLOs, exports (XLSX/CSV/MD/JSON) and charts, atomicity on failure, and shared vs separate pools.

Plan files are written to tmp_path; error cases stop before any planning, so they are fast.
"""

from __future__ import annotations

import csv
import io
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from capplan.plan.flags import launch_text, runnable

GOOD = """\
version: 1
model: llama-3.1-8b
candidates:
  gpus: [h100-sxm, l40s]
workloads:
  - name: chat
    rate_per_s: 5
    input_len: 500
    output_len: 200
    slo:
      ttft_p99_s: 800ms
      tbt_p99_s: 60ms
objective: min_cost
"""
# 1-based lines of GOOD, for the error cases below
LINE = {"model": 2, "gpus": 4, "workloads": 5, "rate_per_s": 7, "ttft": 11, "tbt": 12,
        "objective": 13}


def write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


def edit(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


def one_line(res) -> str:  # noqa: ANN001
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr, res.exception)
    assert res.exception is None, res.exception
    assert "Traceback" not in res.stderr
    assert len(res.stderr_lines) == 1, res.stderr
    return res.stderr_lines[0]


# -- errors name the file and the line ------------------------------------------------------

@pytest.mark.parametrize(("text", "line"), [
    pytest.param("version: 1\nmodel: llama-3.1-8b\nobjective: min_cost: x\nworkloads: []\n", 3,
                 id="mapping-in-scalar"),
    pytest.param("version: 1\nmodel: llama-3.1-8b\nworkloads:\n  - rate_per_s: 5\n"
                 "\tinput_len: 3\n", 5, id="tab-indent"),
    pytest.param("version: 1\nmodel: [llama\nworkloads:\n  - rate_per_s: 5\n", None,
                 id="unclosed-flow"),
])
def test_yaml_syntax_error_is_one_line_with_file_and_line(run_cli, tmp_path, text, line) -> None:
    p = write(tmp_path, text)
    msg = one_line(run_cli("plan", str(p), "--no-verify"))
    m = re.search(re.escape(str(p)) + r":(\d+):", msg)
    assert m, msg
    if line is not None:
        assert int(m.group(1)) == line, msg
    assert "syntax" in msg.lower()


@pytest.mark.parametrize(("old", "new", "key", "near", "line"), [
    pytest.param("      ttft_p99_s: 800ms", "      ttft_p99: 1", "ttft_p99", "ttft_p99_s",
                 LINE["ttft"], id="slo-key"),
    pytest.param("objective: min_cost", "objectve: min_cost", "objectve", "objective",
                 LINE["objective"], id="top-level-typo"),
    pytest.param("  gpus: [h100-sxm, l40s]", "  gpu: [h100-sxm, l40s]", "gpu", "gpus",
                 LINE["gpus"], id="candidates-key"),
    pytest.param("    rate_per_s: 5", "    rate: 5", "rate", "rate_per_s", LINE["rate_per_s"],
                 id="lane-key-replacing-a-required-one"),
    pytest.param("workloads:", "workload:", "workload", "workloads", LINE["workloads"],
                 id="workloads-misspelt"),
])
def test_unknown_key_names_the_nearest_valid_key(run_cli, tmp_path, old, new, key, near,
                                                 line) -> None:
    """DESIGN: 'Unknown keys are errors that name the nearest valid key' (with the line)."""
    p = write(tmp_path, edit(old, new))
    msg = one_line(run_cli("plan", str(p), "--no-verify"))
    assert f"{p}:{line}:" in msg, msg
    assert "unknown key" in msg and key in msg, msg
    assert f"did you mean {near!r}" in msg, msg


@pytest.mark.parametrize(("old", "new", "key", "line", "words"), [
    pytest.param("    rate_per_s: 5", "    rate_per_s: fast", "workloads.0.rate_per_s",
                 LINE["rate_per_s"], "number", id="rate-not-a-number"),
    pytest.param("  gpus: [h100-sxm, l40s]", "  gpus: h100-sxm", "candidates.gpus",
                 LINE["gpus"], "list", id="gpus-not-a-list"),
    pytest.param("  gpus: [h100-sxm, l40s]", "  gpus: [h100-sxm]\n  tp: [two]",
                 "candidates.tp.0", 5, "integer", id="tp-not-an-int"),
    pytest.param("objective: min_cost", "objective: cheapest", "objective", LINE["objective"],
                 "min_cost", id="objective-not-a-choice"),
    pytest.param("      tbt_p99_s: 60ms", "      tbt_p99_s: soon", "workloads.0.slo.tbt_p99_s",
                 LINE["tbt"], "soon", id="slo-not-a-duration"),
    pytest.param("      tbt_p99_s: 60ms", "      tbt_p99_s: -1", "workloads.0.slo.tbt_p99_s",
                 LINE["tbt"], "positive", id="slo-negative"),
    pytest.param("    rate_per_s: 5", "    rate_per_s: -3", "workloads.0.rate_per_s",
                 LINE["rate_per_s"], "must be >= 1e-06", id="negative-rate"),
    pytest.param("    rate_per_s: 5", "    rate_per_s: 0", "workloads.0.rate_per_s",
                 LINE["rate_per_s"], "must be >= 1e-06", id="zero-rate"),
    pytest.param("    rate_per_s: 5", "    rate_per_s: .inf", "workloads.0.rate_per_s",
                 LINE["rate_per_s"], "finite", id="infinite-rate"),
])
def test_wrong_values_name_file_line_and_key(run_cli, tmp_path, old, new, key, line,
                                             words) -> None:
    p = write(tmp_path, edit(old, new))
    msg = one_line(run_cli("plan", str(p), "--no-verify"))
    assert f"{p}:{line}: {key}" in msg, msg
    assert words in msg, msg


@pytest.mark.parametrize(("old", "new", "bad", "nearest"), [
    pytest.param("  gpus: [h100-sxm, l40s]", "  gpus: [h100-sxn, l40s]", "h100-sxn",
                 "h100-sxm", id="gpu"),
    pytest.param("model: llama-3.1-8b", "model: llama-3.1-8c", "llama-3.1-8c", "llama-3.1-8b",
                 id="model"),
])
def test_unknown_catalog_names_suggest_nearest(run_cli, tmp_path, old, new, bad,
                                               nearest) -> None:
    p = write(tmp_path, edit(old, new))
    msg = one_line(run_cli("plan", str(p), "--no-verify"))
    assert str(p) in msg and repr(bad) in msg, msg
    assert "nearest" in msg and nearest in msg, msg


def test_not_a_mapping(run_cli, tmp_path) -> None:
    p = write(tmp_path, "- just\n- a list\n")
    assert str(p) in one_line(run_cli("plan", str(p), "--no-verify"))


def test_python_tags_are_rejected_not_executed(run_cli, tmp_path) -> None:
    """yaml.safe_load only: a `!!python/object/apply` tag is an error and never runs."""
    marker = tmp_path / "pwned"
    text = edit("model: llama-3.1-8b",
                f"model: !!python/object/apply:os.system ['touch {marker}']")
    p = write(tmp_path, text)
    msg = one_line(run_cli("plan", str(p), "--no-verify"))
    assert not marker.exists()
    assert f"{p}:{LINE['model']}:" in msg, msg
    assert "python/object" in msg


def test_python_object_tag_rejected_by_load_plan(tmp_path) -> None:
    from capplan.errors import InputError
    from capplan.plan.schema import load_plan

    p = write(tmp_path, edit("model: llama-3.1-8b", "model: !!python/object:builtins.object {}"))
    with pytest.raises(InputError, match="python/object"):
        load_plan(p)


@pytest.mark.parametrize(("text", "seconds"), [
    ("800ms", 0.8), ("60ms", 0.06), ("1.5s", 1.5), ("2", 2.0), ("0.25", 0.25), ('"1.0"', 1.0),
])
def test_slo_durations_parse(tmp_path, text, seconds) -> None:
    from capplan.plan.schema import load_plan

    p = write(tmp_path, edit("      ttft_p99_s: 800ms", f"      ttft_p99_s: {text}"))
    plan = load_plan(p)
    assert plan.workloads[0].slo.ttft_p99_s == pytest.approx(seconds, rel=1e-12)
    assert plan.workloads[0].slo.tbt_p99_s == pytest.approx(0.06, rel=1e-12)


def test_schema_is_json_schema_of_plan_files(run_cli) -> None:
    res = run_cli("schema")
    assert res.exit_code == 0, res.stderr
    schema = json.loads(res.stdout)
    assert schema["type"] == "object"
    assert {"model", "workloads"} <= set(schema["properties"])
    # one model with its lanes, or several models on one pool (docs/day-planning.md)
    assert {"required": ["model", "workloads"]} in schema["oneOf"]
    assert {"required": ["models"]} in schema["oneOf"]
    assert schema.get("additionalProperties") is False  # unknown keys are errors in editors too
    # every $ref resolves inside the document
    defs = schema.get("$defs", {})
    refs = re.findall(r'"\$ref":\s*"([^"]+)"', res.stdout)
    assert refs
    for ref in refs:
        assert ref.startswith("#/$defs/") and ref.removeprefix("#/$defs/") in defs, ref


def test_schema_accepts_the_example_shape() -> None:
    """The JSON Schema and the loader agree on a minimal plan's required keys."""
    from capplan.plan.schema import PlanFile, plan_json_schema

    schema = plan_json_schema()
    minimal = {"model": "llama-3.1-8b", "workloads": [{"rate_per_s": 1}]}
    assert any(set(alt["required"]) <= set(minimal) for alt in schema["oneOf"])
    PlanFile.model_validate(minimal)


# -- a good plan: output, exports, charts -------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Any]:
    """One plan run writing all four exports and the charts (shared by the tests below)."""
    from click.testing import CliRunner

    from capplan.cli import cli

    d = tmp_path_factory.mktemp("exports")
    (d / "home").mkdir()
    (d / "charts").mkdir()
    plan = write(d, GOOD)
    outs = {s: d / f"out.{s}" for s in ("xlsx", "csv", "md", "json")}
    args = ["plan", str(plan), "--no-verify", "--format", "json", "--plot", str(d / "charts")]
    for p in outs.values():
        args += ["--export", str(p)]
    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:
        runner = CliRunner()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAPPLAN_HOME", str(d / "home"))
        mp.delenv("CAPPLAN_CATALOG_DIR", raising=False)
        res = runner.invoke(cli, args, prog_name="capplan")
    assert res.exit_code == 0, (res.stderr, res.exception)
    return {"dir": d, "outs": outs, "result": json.loads(res.stdout), "stderr": res.stderr}


def test_plan_json_carries_parsed_slos(exported) -> None:
    lane = exported["result"]["lanes"][0]
    assert lane["ttft_p99_s"] == pytest.approx(0.8)
    assert lane["tbt_p99_s"] == pytest.approx(0.06)
    for r in exported["result"]["recommendations"]:
        assert r["predicted"]["ttft_s"]["p99"] <= 0.8
        assert r["predicted"]["tbt_s"]["p99"] <= 0.06


def test_all_four_exports_written(exported) -> None:
    for suffix, p in exported["outs"].items():
        assert p.is_file() and p.stat().st_size > 0, suffix
        assert f"wrote {p}" in exported["stderr"]


def test_xlsx_export_has_the_three_sheets(exported) -> None:
    openpyxl = pytest.importorskip("openpyxl")
    wb = openpyxl.load_workbook(exported["outs"]["xlsx"], read_only=True)
    assert {"recommendations", "inputs", "curve"} <= set(wb.sheetnames), wb.sheetnames
    recs = list(wb["recommendations"].iter_rows(values_only=True))
    n = len(exported["result"]["recommendations"])
    assert len(recs) == 1 + n  # header + one row per recommendation
    assert any(isinstance(v, int | float) for v in recs[1])  # numbers stored as numbers
    assert len(list(wb["curve"].iter_rows(values_only=True))) > 1
    inputs = {row[0]: row[1] for row in wb["inputs"].iter_rows(min_row=2, values_only=True)}
    assert "model" in inputs
    wb.close()


def test_json_export_matches_stdout(exported) -> None:
    written = json.loads(exported["outs"]["json"].read_text(encoding="utf-8"))
    got = [(r["gpu"], r["tp"], r["replicas"]) for r in written["recommendations"]]
    want = [(r["gpu"], r["tp"], r["replicas"]) for r in exported["result"]["recommendations"]]
    assert got == want


def test_csv_and_markdown_exports_list_every_recommendation(exported) -> None:
    text = exported["outs"]["csv"].read_text(encoding="utf-8")
    rows = list(csv.DictReader(io.StringIO(text)))
    recs = exported["result"]["recommendations"]
    assert [(r["GPU"], int(r["TP"]), int(r["replicas"])) for r in rows] == [
        (r["gpu"], r["tp"], r["replicas"]) for r in recs]
    assert float(rows[0]["cost ($/h)"]) == pytest.approx(recs[0]["cost_per_hour"])
    md = exported["outs"]["md"].read_text(encoding="utf-8")
    assert "|" in md and all(r["gpu"] in md for r in recs)


def test_plot_writes_png_and_svg_with_units(exported) -> None:
    charts = exported["dir"] / "charts"
    pngs, svgs = sorted(charts.glob("*.png")), sorted(charts.glob("*.svg"))
    assert pngs and svgs
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p
    for p in svgs:
        text = p.read_text(encoding="utf-8")
        assert "<svg" in text, p
        assert any(u in text for u in ("(ms)", "tokens/s", "$/hour")), p
    assert {p.stem for p in pngs} == {p.stem for p in svgs}


UNSAT = edit("      tbt_p99_s: 60ms", "      tbt_p99_s: 1ms")


def test_unsatisfiable_plan_is_one_line_naming_the_slo(run_cli, tmp_path) -> None:
    p = write(tmp_path, UNSAT)
    msg = one_line(run_cli("plan", str(p), "--no-verify", "--format", "json"))
    assert str(p) in msg and "TBT" in msg, msg
    m = re.search(r"p99 TBT (\d+(?:\.\d+)?) ms", msg)
    assert m and float(m.group(1)) > 1, msg


@pytest.mark.parametrize("suffix", ["xlsx", "csv", "md", "json"])
def test_failed_run_leaves_existing_export_untouched(run_cli, tmp_path, suffix) -> None:
    p = write(tmp_path, UNSAT + f"export: [from-plan.{suffix}]\n")
    old = b"an earlier export \x00\x01 that must survive\n"
    flag_out, plan_out = tmp_path / f"out.{suffix}", tmp_path / f"from-plan.{suffix}"
    flag_out.write_bytes(old)
    plan_out.write_bytes(old)
    res = run_cli("plan", str(p), "--no-verify", "--export", str(flag_out))
    one_line(res)
    assert flag_out.read_bytes() == old
    assert plan_out.read_bytes() == old
    assert [x.name for x in tmp_path.iterdir() if x.name.endswith(".tmp")] == []


def test_export_unknown_suffix_is_bad_input(run_cli, tmp_path) -> None:
    p = write(tmp_path, GOOD)
    msg = one_line(run_cli("plan", str(p), "--no-verify", "--export", str(tmp_path / "o.pdf")))
    assert "o.pdf" in msg
    assert not (tmp_path / "o.pdf").exists()


def test_plan_file_export_list_is_relative_to_the_plan(run_cli, tmp_path) -> None:
    sub = tmp_path / "plans"
    sub.mkdir()
    p = write(sub, GOOD + "export: [rel.json]\n")
    res = run_cli("plan", str(p), "--no-verify", "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert json.loads((sub / "rel.json").read_text())["recommendations"]


# -- two lanes, one pool or two ----------------------------------------------------------------

TWO_LANES = """\
version: 1
model: llama-3.1-8b
candidates:
  gpus: [l40s, h100-sxm]
workloads:
  - name: interactive
    rate_per_s: 4
    input_len: 800
    output_len: 200
    priority: 0
    slo: {ttft_p99_s: 1.0, tbt_p99_s: 80ms}
  - name: batch
    rate_per_s: 3
    input_len: 3000
    output_len: 400
    priority: 1
    slo: {e2e_p99_s: 120}
pools: both
"""


def test_two_lanes_compare_shared_and_separate_pools(run_cli, tmp_path) -> None:
    p = write(tmp_path, TWO_LANES)
    res = run_cli("plan", str(p), "--no-verify", "--format", "json")
    assert res.exit_code == 0, res.stderr
    out = res.json()
    assert [ln["name"] for ln in out["lanes"]] == ["interactive", "batch"]
    assert [ln["priority"] for ln in out["lanes"]] == [0, 1]
    pools = out["pools"]
    shared, separate = pools["shared"], pools["separate"]
    best = out["recommendations"][0]
    assert shared["cost_per_hour"] == pytest.approx(best["cost_per_hour"])
    assert shared["gpus_total"] == best["gpus_total"]
    lanes = separate["lanes"]
    assert [ln["lane"] for ln in lanes] == ["interactive", "batch"]
    assert all("error" not in ln for ln in lanes), lanes
    assert separate["cost_per_hour"] == pytest.approx(sum(ln["cost_per_hour"] for ln in lanes))
    assert separate["gpus_total"] == sum(ln["gpus_total"] for ln in lanes)
    want = "separate" if separate["cost_per_hour"] < shared["cost_per_hour"] else "shared"
    assert pools["cheaper"] == want
    assert any("pool" in w and f"{want} is cheaper" in w for w in out["warnings"]), out["warnings"]
    # the shared pool serves the strictest SLOs of both lanes at their summed rate
    assert out["target_rate_per_s"] == pytest.approx(7.0)


def test_one_pool_only_has_no_comparison(run_cli, tmp_path) -> None:
    p = write(tmp_path, TWO_LANES.replace("pools: both", "pools: shared"))
    res = run_cli("plan", str(p), "--no-verify", "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert "pools" not in res.json()


def test_separate_pools_print_each_pool_with_its_launch_line(run_cli, tmp_path) -> None:
    """Issue 15: `pools: separate` printed the shared pool's table only; each lane's pool (GPU,
    TP, replicas, cost) and its own vLLM line now appear in the table output."""
    p = write(tmp_path, TWO_LANES.replace("pools: both", "pools: separate"))
    # one run: the table on stdout, the same plan's JSON exported beside it
    res = run_cli("plan", str(p), "--no-verify", "--export", str(tmp_path / "plan.json"))
    assert res.exit_code == 0, res.stderr
    out = json.loads((tmp_path / "plan.json").read_text())
    text = res.stdout
    assert "you asked for a pool per lane" in text
    for ln in out["pools"]["separate"]["lanes"]:
        row = next(line for line in text.splitlines() if line.startswith(f"lane {ln['lane']}"))
        assert ln["gpu"] in row and f"{ln['cost_per_hour']:.2f}" in row, row
        # the lanes run at once: their fleets placed as one (launch_text: the placed fleet)
        placed = launch_text(ln["engine_flags"], "vllm")
        assert f"vLLM ({ln['lane']}): {placed.splitlines()[0]}" in text
        # a lane alone has no other lane to yield to: no priority scheduling in its pool
        assert "--scheduling-policy" not in ln["engine_flags"]["vllm"]


def test_separate_pools_reports_give_each_lanes_launch_line(run_cli, tmp_path) -> None:
    """The HTML and Markdown reports of a plan recommending a pool per lane give each lane's
    own launch line (what their headline recommends and its manifests deploy), not the shared
    pool's alone."""
    import html as html_lib

    p = write(tmp_path, TWO_LANES.replace("pools: both", "pools: separate"))
    res = run_cli("plan", str(p), "--no-verify", "--export", str(tmp_path / "plan.json"),
                  "--export", str(tmp_path / "plan.html"), "--export", str(tmp_path / "plan.md"),
                  "--export", str(tmp_path / "plan.xlsx"))
    assert res.exit_code == 0, res.stderr
    import openpyxl

    rows = list(openpyxl.load_workbook(tmp_path / "plan.xlsx")["pools"].iter_rows(
        values_only=True))
    col = rows[0].index("recommended")  # the pools' sheet marks the layout recommended
    marks = {r[0]: r[col] for r in rows[1:]}
    assert marks["shared (all lanes)"] == "no"
    assert all(v == "yes" for k, v in marks.items() if str(k).startswith("lane "))
    out = json.loads((tmp_path / "plan.json").read_text())
    page = html_lib.unescape((tmp_path / "plan.html").read_text())
    md = (tmp_path / "plan.md").read_text()
    for ln in out["pools"]["separate"]["lanes"]:
        assert f"lane {ln['lane']}: vLLM" in page
        placed = runnable(launch_text(ln["engine_flags"], "vllm"))  # labels as comments
        assert placed in page and placed in md


def test_shared_pool_with_priorities_launches_priority_scheduling(run_cli, tmp_path) -> None:
    """The simulator serves lower priority values first in a shared pool; the launch lines
    must ask the engines for the same (issue 15: the vLLM line lacked it)."""
    p = write(tmp_path, TWO_LANES.replace("pools: both", "pools: shared"))
    out = run_cli("plan", str(p), "--no-verify", "--format", "json").json()
    for r in out["recommendations"]:
        assert "--scheduling-policy priority" in r["engine_flags"]["vllm"]
        assert "--enable-priority-scheduling --schedule-low-priority-values-first" in (
            r["engine_flags"]["sglang"])
    same = write(tmp_path, TWO_LANES.replace("pools: both", "pools: shared")
                 .replace("priority: 1", "priority: 0"), "same.yaml")
    out = run_cli("plan", str(same), "--no-verify", "--format", "json").json()
    for r in out["recommendations"]:
        assert "--scheduling-policy" not in r["engine_flags"]["vllm"]
        assert "priority" not in r["engine_flags"]["sglang"]


def test_plan_lane_without_lengths_says_what_it_assumed(run_cli, tmp_path) -> None:
    p = write(tmp_path, edit("    output_len: 200\n", ""))
    res = run_cli("plan", str(p), "--no-verify", "--format", "json")
    assert res.exit_code == 0, res.stderr
    said = [w for w in res.json()["warnings"] if "assumed" in w]
    assert said == ["lane chat: no output_len given, so output_len 256 tokens are assumed; give "
                    "your traffic's lengths, they change the answer"], res.json()["warnings"]
