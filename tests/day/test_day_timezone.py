"""A day plan's time zone (plan file `day.timezone`, `recommend --timezone`; UTC by default):
validated as an IANA name (a bad one is one line, exit 2), named once in the printed day plan,
carried in the JSON (`timezone`) and set as every CronJob's spec.timeZone; the clock times
themselves do not move (a rate curve's 15:00 is 15:00 in the zone). And what the day export
does with a pool per lane (each lane's pool by its own schedule) and with a P/D layout, which
no schedule counts: it names the objects that stay at their peak size, and schedules none of
them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.export.k8s_models import validate

CURVE = "at,rate_per_s\n03:00,2\n15:00,12\n"
"""A chat day: a trough at 03:00 and a peak at 15:00 (an illustrative shape)."""


def _recommend(run_cli, tmp_path: Path, *extra: str) -> Any:
    curve = tmp_path / "curve.csv"
    curve.write_text(CURVE)
    return run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1",
                   "--rate-curve", str(curve), "--input-len", "800", "--output-len", "250",
                   "--ttft-p99", "1", "--tbt-p99", "60ms", "--window", "1h", "--replay", "none",
                   "--verify-top", "0", *extra)


def _plan_file(tmp_path: Path, day: dict[str, Any], **top: Any) -> Path:
    doc = {"version": 1, "model": "llama-3.1-8b",
           "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
           "engine": {"max_num_seqs": [256], "max_num_batched_tokens": [8192]},
           "workloads": [{"name": "chat", "input_len": 800, "output_len": 250,
                          "rate_curve": [{"at": "03:00", "rate_per_s": 5},
                                         {"at": "15:00", "rate_per_s": 40}],
                          "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": "60ms"}}],
           "day": {"window_s": 3600, "replay": "none", **day}, "verify": {"top": 0}, **top}
    path = tmp_path / "day.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize(("zone", "said"), [
    ("Europe/Berln", "did you mean Europe/Berlin"),
    ("europe/berlin", "did you mean Europe/Berlin"),
    ("Mars/Olympus_Mons", "unknown time zone"),
    ("localtime", "the machine's own zone"),
    (5, "give an IANA time zone name"),
])
def test_a_bad_zone_in_a_plan_file_is_one_line_exit_2(run_cli, tmp_path: Path, zone, said):
    res = run_cli("plan", str(_plan_file(tmp_path, {"timezone": zone})))
    assert res.exit_code == 2, res.stdout
    assert res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert "day.timezone" in line and said in line, line


def test_a_bad_zone_option_is_one_line_exit_2(run_cli, tmp_path: Path):
    res = _recommend(run_cli, tmp_path, "--timezone", "Europe/Berln")
    assert res.exit_code == 2
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("Error: --timezone 'Europe/Berln': unknown time zone"), line


def test_the_zone_is_named_once_and_moves_no_clock_time(run_cli, tmp_path: Path):
    """Asia/Kolkata (UTC+05:30): were any hour converted, the windows would move by half an
    hour; they are the curve's own, as in UTC, and the zone is a label on them."""
    table = _recommend(run_cli, tmp_path, "--timezone", "Asia/Kolkata")
    assert table.exit_code == 0, table.stderr
    assert table.stdout.count("Asia/Kolkata") == 1
    assert "day plan (replicas per window), clock times in Asia/Kolkata:" in table.stdout
    zoned = json.loads(_recommend(run_cli, tmp_path, "--timezone", "Asia/Kolkata",
                                  "--format", "json").stdout)
    utc = json.loads(_recommend(run_cli, tmp_path, "--format", "json").stdout)
    assert (zoned["timezone"], utc["timezone"]) == ("Asia/Kolkata", "UTC")
    assert zoned["schedule"] == utc["schedule"]
    # the curve's peak (15:00) sizes the windows ending and starting there, at 14:00 and 15:00
    peak = max(w["sizing_rps"] for w in zoned["schedule"])
    assert [w["start_s"] / 3600 for w in zoned["schedule"] if w["sizing_rps"] == peak] == [
        14.0, 15.0]
    md = _recommend(run_cli, tmp_path, "--timezone", "Asia/Kolkata", "--format", "markdown")
    assert "## day plan (replicas per window), clock times in Asia/Kolkata" in md.stdout


def test_the_plan_files_zone_is_every_cronjobs(run_cli, tmp_path: Path):
    out = tmp_path / "day.k8s.yaml"
    res = run_cli("plan", str(_plan_file(tmp_path, {"timezone": "America/New_York"})),
                  "--export", str(out), "--format", "json")
    assert res.exit_code == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["timezone"] == "America/New_York"
    docs = list(yaml.safe_load_all(out.read_text()))
    jobs = [d for d in docs if d["kind"] == "CronJob"]
    assert jobs
    for d in docs:
        validate(d)
    assert {d["spec"]["timeZone"] for d in jobs} == {"America/New_York"}
    assert "in timeZone America/New_York" in out.read_text()


def _separate(run_cli, tmp_path: Path, pools: str) -> tuple[dict[str, Any], str]:
    """A chat lane peaking at 15:00 and a RAG lane of long prompts peaking at 03:00, planned
    with `pools:` as given and exported to Kubernetes."""
    rag = {"name": "rag", "input_len": 6000, "output_len": 200,
           "rate_curve": [{"at": "03:00", "rate_per_s": 4}, {"at": "15:00", "rate_per_s": 1}],
           "slo": {"ttft_p99_s": 2.0}}
    path = _plan_file(tmp_path, {"timezone": "Europe/Berlin"}, pools=pools)
    doc = yaml.safe_load(path.read_text())
    doc["workloads"].append(rag)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / f"{pools}.k8s.yaml"
    res = run_cli("plan", str(path), "--export", str(out), "--format", "json")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout), out.read_text()


def test_per_lane_pools_are_scheduled_each_by_its_own_lane(run_cli, tmp_path: Path):
    """A pool per lane: each lane's Deployment is created at its own schedule's first window
    and moved by its own CronJobs (where its replicas change) in the plan's zone
    (tests/day/test_lane_days.py derives the times); no workload is named as unscheduled. The
    shared pool of the same lanes is the one fleet the schedule counts."""
    plan, text = _separate(run_cli, tmp_path, "separate")
    docs = list(yaml.safe_load_all(text))
    for d in docs:
        validate(d)
    first = {d["lane"]: d["schedule"][0]["replicas"] for d in plan["lane_days"]}
    deps = {d["metadata"]["name"]: d["spec"]["replicas"] for d in docs
            if d["kind"] == "Deployment"}
    assert deps == {f"llama-3-1-8b-{k}": v for k, v in first.items()}
    jobs = [d for d in docs if d["kind"] == "CronJob"]
    scaled = {d["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0][
        "command"][2] for d in jobs}
    moves = {d["lane"] for d in plan["lane_days"]  # a lane whose replicas change
             if len({w["replicas"] for w in d["schedule"]}) > 1}
    assert moves and scaled == {f"deployment/llama-3-1-8b-{k}" for k in moves}
    assert {d["spec"]["timeZone"] for d in jobs} == {"Europe/Berlin"}
    assert "not scheduled" not in text
    plan, text = _separate(run_cli, tmp_path, "shared")
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs].count("CronJob") >= 2
    assert "not scheduled" not in text


def test_a_day_plan_sizes_no_pd_layout_and_one_given_is_named_unscheduled(run_cli, tmp_path):
    """`recommend --rate-curve` sizes the aggregated fleet per window and no disaggregated
    layout (its JSON has none to schedule). A day plan dict carrying a winning P/D layout
    (the steady plan's, for the same traffic) exports its prefill and decode StatefulSets at
    the layout's replicas, names both in the header and writes no scale job."""
    from capplan.export.k8s import k8s_text

    day = json.loads(_recommend(run_cli, tmp_path, "--format", "json").stdout)
    assert not day.get("disaggregated")
    steady = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine",
                     "vllm", "--rate", "60", "--input-len", "4000", "--output-len", "300",
                     "--ttft-p99", "1", "--tbt-p99", "0.03", "--verify-top", "0",
                     "--format", "json").json()
    pd = {**steady["disaggregated"], "winner": "disaggregated"}
    text = k8s_text({**day, "disaggregated": pd})
    docs = list(yaml.safe_load_all(text))
    for d in docs:
        validate(d)
    assert not [d for d in docs if d["kind"] == "CronJob"]
    sets = {d["metadata"]["name"]: d["spec"]["replicas"] for d in docs
            if d["kind"] == "StatefulSet"}
    assert sets == {"llama-3-1-8b-prefill": pd["prefill"]["replicas"],
                    "llama-3-1-8b-decode": pd["decode"]["replicas"]}
    head = " ".join(line.lstrip("#").strip() for line in text.splitlines()
                    if line.startswith("#"))
    p, d = pd["prefill"]["replicas"], pd["decode"]["replicas"]
    assert (f"not scheduled: StatefulSet/llama-3-1-8b-prefill ({p} replicas), "
            f"StatefulSet/llama-3-1-8b-decode ({d} replicas) stay all day") in head
    assert "no per-window prefill or decode count" in head


def test_the_exported_schedules_name_the_zone_of_their_clock_times(run_cli, tmp_path: Path):
    """The schedule's hours in the CSV beside a CSV export and in the XLSX `schedule` sheet are
    clock times in the plan's zone: each such column says which (read back from the files)."""
    import openpyxl

    path = _plan_file(tmp_path, {"timezone": "Asia/Kolkata"})
    res = run_cli("plan", str(path), "--export", str(tmp_path / "d.csv"),
                  "--export", str(tmp_path / "d.xlsx"))
    assert res.exit_code == 0, res.stderr
    head = (tmp_path / "d.schedule.csv").read_text().splitlines()[0].split(",")
    sheet = openpyxl.load_workbook(tmp_path / "d.xlsx")["schedule"]
    assert [c.value for c in sheet[1]][:len(head)] == head
    assert [h for h in head if "(h" in h] == [
        "start (h in Asia/Kolkata)", "end (h in Asia/Kolkata)",
        "scale-up begins (h in Asia/Kolkata)"]
