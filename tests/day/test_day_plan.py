"""Day plans end to end: recommend --trace / --rate-curve, plan files with day lanes and with
several models, and the schedule in every export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from capplan.catalog.loader import load_catalog
from capplan.plan.day_run import run_day_plan
from capplan.plan.schema import PlanFile

SEARCH = ["--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4", "--max-num-seqs", "128",
          "--max-num-batched-tokens", "2048", "--verify-top", "0", "--no-disagg",
          "--allow-near-floor"]
SLO = ["--ttft-p99", "1.0", "--tbt-p99", "0.05"]
CONTRACT = ("schedule", "peak_replicas", "gpu_hours", "fixed_fleet_gpu_hours", "cost_per_day",
            "fixed_fleet_cost_per_day")


def _curve_plan(**over) -> dict:
    lane = {"name": "chat", "input_len": "lognormal:mean=1000,p99=6000",
            "output_len": "lognormal:mean=250,p99=1000",
            "rate_curve": [{"at": "04:00", "rate_per_s": 0.6}, {"at": "15:00", "rate_per_s": 3}],
            "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": 0.05}}
    return {"model": "llama-3.1-70b",
            "candidates": {"gpus": ["h100-sxm"], "tp": [4]},
            "engine": {"max_num_seqs": [128], "max_num_batched_tokens": [2048]},
            "workloads": [lane], "verify": {"top": 0}, "day": {"replay": "none"}, **over}


def test_recommend_trace_gives_a_verified_day(run_cli, day_trace: Path):
    res = run_cli("recommend", *SEARCH, *SLO, "--trace", str(day_trace), "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    for k in CONTRACT:
        assert k in d
    sched = d["schedule"]
    assert len(sched) >= 24
    for w in sched:
        assert {"start_s", "end_s", "offered_rps", "replicas", "ttft_p99_s", "tbt_p99_s"} <= set(w)
    reps = [w["replicas"] for w in sched]
    assert d["peak_replicas"] == max(reps) >= 2 and min(reps) == 1
    assert d["gpu_hours"] < d["fixed_fleet_gpu_hours"]
    # GPU-hours by hand: 4 GPUs per replica, 15-minute windows
    assert d["gpu_hours"] == pytest.approx(sum(reps) * 4 * 0.25)
    assert d["fixed_fleet_gpu_hours"] == pytest.approx(max(reps) * 4 * 24)
    price = d["day"]["price_per_gpu_hour"]
    assert d["cost_per_day"] == pytest.approx(d["gpu_hours"] * price)
    # every scale-up starts one replica start-up ahead of its window
    lag = d["day"]["startup"]["replica_start_s"]
    ups = [w for w in sched if w["scale_up_begin_s"] is not None]
    assert ups and all(w["start_s"] - w["scale_up_begin_s"] == pytest.approx(lag)
                       and w["scale_up_lead_s"] == pytest.approx(lag) for w in ups)
    # the peak window replayed over the schedule's replicas meets the SLOs within 10%
    peak = max(sched, key=lambda w: w["offered_rps"])
    rp = peak["replay"]["planned"]
    assert rp["unfinished"] == 0 and rp["meets_slo"], rp
    assert rp["ttft_p99_s"] <= 1.1 * 1.0 and rp["tbt_p99_s"] <= 1.1 * 0.05
    assert "reactive" in peak["replay"]


def test_recommend_needs_one_load(run_cli, day_trace: Path):
    res = run_cli("recommend", *SEARCH, "--rate", "2", "--trace", str(day_trace))
    assert res.exit_code == 2 and "exactly one of --rate, --trace or --rate-curve" in res.stderr
    res = run_cli("recommend", *SEARCH, "--rate-curve", str(day_trace))
    assert res.exit_code == 2 and "at,rate_per_s" in res.stderr
    res = run_cli("recommend", *SEARCH, "--trace", str(day_trace), "--window", "10s")
    assert res.exit_code == 2 and "--window" in res.stderr


def test_rate_curve_plan_and_exports(run_cli, tmp_path: Path):
    plan = tmp_path / "day.yaml"
    plan.write_text(yaml.safe_dump(_curve_plan(export=["out.md", "out.csv", "out.xlsx",
                                                       "out.json", "out.html"])))
    (tmp_path / "charts").mkdir()
    table = run_cli("plan", str(plan), "--plot", str(tmp_path / "charts"))
    assert table.exit_code == 0, table.stderr
    assert "day plan (replicas per window)" in table.stdout
    assert "autoscaling saves" in table.stdout
    d = json.loads((tmp_path / "out.json").read_text())
    assert len(d["schedule"]) == 96 and d["gpu_hours"] < d["fixed_fleet_gpu_hours"]
    md = (tmp_path / "out.md").read_text()
    assert "## Day plan" in md and "xychart-beta" in md
    # the chart's x-axis: each window's start as HH:MM (0.25 h is 00:15, not "0.2")
    axis = next(ln for ln in md.splitlines() if "x-axis" in ln)
    labels = re.findall(r'"([^"]*)"', axis)
    assert labels == [f"{m // 60:02d}:{m % 60:02d}" for m in range(0, 24 * 60, 15)]
    sched_csv = (tmp_path / "out.schedule.csv").read_text().splitlines()
    assert sched_csv[0].startswith("start (h in UTC)") and len(sched_csv) >= 97
    from openpyxl import load_workbook

    wb = load_workbook(tmp_path / "out.xlsx")
    assert "schedule" in wb.sheetnames and wb["schedule"].max_row >= 97
    assert (tmp_path / "charts" / "day_schedule.png").stat().st_size > 1000
    page = (tmp_path / "out.html").read_text()
    day = page[page.index("Day plan: replicas per window"):]
    assert "<svg" in day and day.count("<tr>") >= 97


def test_two_models_share_a_pool():
    """A night-peaking and an afternoon-peaking model on one GPU type: the pool's peak is below
    the sum of their own peaks (one's off-peak GPUs serve the other's peak)."""
    base = _curve_plan()
    lane = base.pop("workloads")[0]
    base.pop("model")
    night = {**lane, "rate_curve": [{"at": "03:00", "rate_per_s": 3},
                                    {"at": "15:00", "rate_per_s": 0.3}]}
    day = {**lane, "rate_curve": [{"at": "03:00", "rate_per_s": 0.3},
                                  {"at": "15:00", "rate_per_s": 3}]}
    base["models"] = [{"model": "llama-3.1-70b", "workloads": [day]},
                      {"model": "qwen2.5-72b", "workloads": [night]}]
    d = run_day_plan(load_catalog(), PlanFile.model_validate(base)).to_dict()
    pool = d["gpu_pools"][0]
    assert pool["gpu"] == "h100-sxm" and len(pool["models"]) == 2
    assert d["peak_gpus"] < d["separate_fleets_peak_gpus"]
    assert pool["saving_gpus"] == d["separate_fleets_peak_gpus"] - d["peak_gpus"]
    g = np.array([[w["gpus"] for w in m["schedule"]] for m in d["models"]])
    assert d["peak_gpus"] == g.sum(axis=0).max()
    assert d["separate_fleets_peak_gpus"] == g.max(axis=1).sum()


@pytest.mark.parametrize("bad, msg", [
    ({"rate_per_s": 2}, "give one of rate_per_s, trace or rate_curve"),
    ({"rate_curve": [{"at": "nine", "rate_per_s": 1}]}, "time of day"),
    # a point's own error, not the `str` branch of `str | list` ("should be a valid string")
    ({"rate_curve": [{"at": "01:00", "rate_per_s": -1}, {"at": "03:00", "rate_per_s": 2}]},
     "workloads.0.rate_curve.0.rate_per_s: Input should be greater than or equal to 0"),
    ({"rate_curve": [{"time": "01:00", "rate_per_s": 1}, {"at": "05:00", "rate": 2}]},
     "unknown key 'workloads.0.rate_curve.0.time' (the keys here: at, rate_per_s)"),
    ({"rate_curve": [{"at": [1], "rate_per_s": 1}]},
     "workloads.0.rate_curve.0.at: [1] is not a time of day: write it as HH:MM"),
    ({"rate_curve": 5}, "workloads.0.rate_curve: Input should be a valid string or a valid list"),
])
def test_bad_day_lanes(run_cli, tmp_path: Path, bad, msg):
    doc = _curve_plan()
    doc["workloads"][0].update(bad)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(doc))
    res = run_cli("plan", str(p))
    assert res.exit_code == 2 and msg in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_unquoted_times_of_day_in_a_plan_file(run_cli, tmp_path: Path):
    """`at: 15:00` unquoted is a time of day (YAML 1.1 would read the base-60 integer 900)."""
    text = yaml.safe_dump(_curve_plan(day={"replay": "none", "window_s": 3600}))
    text = text.replace("at: 04:00", "at: 3:00").replace("at: '15:00'", "at: 15:00")
    assert "at: 3:00" in text and "at: 15:00" in text  # both unquoted in the file
    (tmp_path / "p.yaml").write_text(text)
    res = run_cli("plan", str(tmp_path / "p.yaml"), "--format", "json")
    assert res.exit_code == 0, res.stderr
    sched = json.loads(res.stdout)["schedule"]
    # 0.6 req/s at 03:00 rising to 3 at 15:00 (0.2 req/s per hour): the window 14:00-15:00
    # averages (2.8 + 3) / 2 = 2.9 req/s; from 15:00 the curve falls back to 0.6 at 03:00
    # (wrapping, 0.2 req/s per hour), so 02:00-03:00 falls from 0.8 to 0.6: 0.7
    assert sched[14]["offered_rps"] == pytest.approx(2.9)
    assert sched[2]["offered_rps"] == pytest.approx(0.7)


def test_a_number_at_is_refused_in_a_plan_file(run_cli, tmp_path: Path):
    """`at: 900` unquoted is a YAML integer: refused with the HH:MM form named (it was read as
    900 s after midnight, 00:15), and the schema gives `at` as a string."""
    text = yaml.safe_dump(_curve_plan()).replace("at: 04:00", "at: 900")
    assert "at: 900" in text
    (tmp_path / "p.yaml").write_text(text)
    res = run_cli("plan", str(tmp_path / "p.yaml"))
    assert res.exit_code == 2 and res.stdout == ""
    err = res.stderr.strip()
    assert "\n" not in err and err.startswith("Error: ")
    assert "workloads.0.rate_curve.0.at: 900 is not a time of day: write it as HH:MM" in err
    schema = json.loads(run_cli("schema").stdout)
    assert schema["$defs"]["CurvePoint"]["properties"]["at"]["type"] == "string"


def test_binding_by_hand():
    """What sets each window's replicas: 0, 5, 20 and 40 req/s at 10 req/s per replica and
    20% headroom need 0, ceil(0.6) = 1, ceil(2.4) = 3 and ceil(4.8) = 5 replicas; a floor of 2
    holds the first two (2, 2, 3, 5): min_replicas, min_replicas, capacity, capacity. A floor
    of 1: the idle window is held by it, the 5-req/s window needs its one replica (capacity)."""
    from capplan.plan.day import replicas_for, windows_for
    from capplan.plan.day_mix import Sizing
    from capplan.plan.rate_curve import WindowSeries
    from capplan.plan.startup import StartupLag

    rate = np.array([0.0, 5.0, 20.0, 40.0])
    ones = np.ones(4)
    total = WindowSeries(np.arange(4) * 900.0, np.arange(1, 5) * 900.0, rate, ones, ones,
                         rate * 100, "t")
    size = Sizing(np.full(4, 10.0), lambda r: (0 * r, 0 * r))
    lag = StartupLag(weights_bytes=1e9, load_from="nvme", load_bytes_per_s=1e9,
                     engine_startup_s=60)
    need = replicas_for(rate, 10.0, 0.2, 0)
    assert list(need) == [0, 1, 3, 5]
    for floor, reps, want in ((2, [2, 2, 3, 5], ["min_replicas"] * 2 + ["capacity"] * 2),
                              (1, [1, 1, 3, 5], ["min_replicas"] + ["capacity"] * 3)):
        got = windows_for(total, replicas_for(rate, 10.0, 0.2, floor), 1, lag, size,
                          (floor, need))
        assert [w.replicas for w in got] == reps
        assert [w.to_dict()["binding"] for w in got] == want


def test_binding_in_json_table_and_schedule_csv(run_cli, tmp_path: Path):
    """A curve idle from 18:00 to 06:00 (0 req/s) under min_replicas 2: the idle windows are
    held by the floor; any window above the floor is bound by capacity; the table's `bound by`
    column and the .schedule.csv's say what the JSON `schedule` entries do."""
    lane = {"rate_curve": [{"at": "00:00", "rate_per_s": 0}, {"at": "06:00", "rate_per_s": 0},
                           {"at": "12:00", "rate_per_s": 12}, {"at": "18:00", "rate_per_s": 0}]}
    doc = _curve_plan(day={"replay": "none", "window_s": 3600, "min_replicas": 2})
    doc["workloads"][0].update(lane)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    res = run_cli("plan", str(tmp_path / "p.yaml"), "--format", "json", "--export",
                  str(tmp_path / "p.csv"))
    assert res.exit_code == 0, res.stderr
    sched = json.loads(res.stdout)["schedule"]
    bound = [w["binding"] for w in sched]
    assert all(b == "min_replicas" for w, b in zip(sched, bound, strict=True)
               if w["sizing_rps"] == 0)
    assert all(b == "capacity" for w, b in zip(sched, bound, strict=True) if w["replicas"] > 2)
    assert "capacity" in bound and all(w["replicas"] >= 2 for w in sched)
    rows = (tmp_path / "p.schedule.csv").read_text().split("\n\n")[0].splitlines()
    col = rows[0].split(",").index("bound by")
    assert [r.split(",")[col] for r in rows[1:]] == bound
    table = run_cli("plan", str(tmp_path / "p.yaml")).stdout
    shown = [ln.split()[-1] for ln in table.splitlines() if re.match(r"\d\d:00 ", ln)]
    assert shown == bound


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "day"


@pytest.mark.parametrize("name", ["chat-day", "two-models"])
def test_day_examples_run(run_cli, tmp_path: Path, name: str):
    """The shipped day examples run (replay and simulator check off here, for speed)."""
    doc = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    doc["day"] = {**doc.get("day", {}), "replay": "none"}
    doc["verify"] = {"top": 0}
    for ln in [w for m in doc.get("models", [doc]) for w in m["workloads"]]:
        if isinstance(ln.get("rate_curve"), str):
            ln["rate_curve"] = str(EXAMPLES / ln["rate_curve"])
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc))
    res = run_cli("plan", str(p), "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["gpu_hours"] < d["fixed_fleet_gpu_hours"]
    if name == "two-models":
        assert d["peak_gpus"] < d["separate_fleets_peak_gpus"]


def test_first_recommendation_is_cheapest_over_the_day():
    """The day plan puts first the configuration whose autoscaled day costs least, recomputed
    here from each recommendation's capacity per replica and the schedule's rates."""
    doc = _curve_plan(candidates={"gpus": ["h100-sxm"], "tp": [2, 4, 8]})
    d = run_day_plan(load_catalog(), PlanFile.model_validate(doc)).to_dict()
    rates = np.array([w["sizing_rps"] for w in d["schedule"]])  # each window's highest
    price = d["day"]["price_per_gpu_hour"]

    def day_cost(r: dict) -> float:
        reps = np.maximum(np.ceil(rates * 1.2 / r["capacity_per_replica_rps"] - 1e-9), 1)
        return float(reps.sum()) * 0.25 * r["gpus_total"] / r["replicas"] * price

    costs = [day_cost(r) for r in d["recommendations"]]
    assert len(costs) >= 2
    assert costs[0] == pytest.approx(min(costs))
    assert d["cost_per_day"] == pytest.approx(costs[0])


def test_replay_adds_replicas_where_the_analytic_count_misses(run_cli, monkeypatch):
    """Mooncake's conversation excerpt (long prompts, bursty: gap SCV ~7) on Llama-3.1-8B, H100
    TP 4 (the configuration a full search picks): the analytic count (1 replica) misses the
    TBT SLO in the replay (TBT p99 ~146 ms against 80 ms); the replay adds a replica, replays
    again, and the window then meets the SLOs within 10%. The trace's hash_ids are replayed
    (round-robin routing) and give the plan a prefix hit rate. (The simulated capacity check,
    plan/day_capacity.py, which would size the window first, is off here.)"""
    from capplan.plan import day_capacity

    monkeypatch.setattr(day_capacity, "simulated_capacity",
                        lambda dep, lanes, slos, analytic_rps, window_s:
                        day_capacity.CapacityCheck(analytic_rps))
    trace = Path(__file__).resolve().parents[1] / "data" / "traces" / \
        "mooncake_conversation_trace_head200.jsonl"
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "4",
                  "--max-num-seqs", "64", "--max-num-batched-tokens", "8192",
                  "--trace", str(trace), "--ttft-p99", "5", "--tbt-p99", "0.08",
                  "--verify-top", "0", "--no-disagg", "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    w = d["schedule"][0]
    rp = w["replay"]["planned"]
    assert rp["replicas"] == w["replicas"] >= 2 and rp["meets_slo"], (w, d["day"]["notes"])
    assert any("replica(s) added" in n for n in d["day"]["notes"])
    assert any("round-robin" in n for n in d["day"]["notes"])


MOONCAKE = Path(__file__).resolve().parents[1] / "data" / "traces" / \
    "mooncake_conversation_trace_head200.jsonl"


@pytest.mark.slow
def test_replay_sized_recommendation_and_schedule_agree(run_cli):
    """Mooncake's 200 requests (one window, gap SCV ~7): the analytic screen's count misses in
    simulation, so the replay sizes the recommendation; the schedule's window is sized at the
    same per-replica capacity, and the prefix-cache note compares screen with screen. (TTFT
    p99 2.5 s: the trace's longest prompts alone replay at about 2.1 s whatever the replicas.)"""
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace",
                  str(MOONCAKE), "--ttft-p99", "2.5", "--tbt-p99", "0.1", "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    best = d["recommendations"][0]
    assert best["binding_constraint"].endswith("(replay)")
    (w,) = d["schedule"]
    # the replica rule at the recommendation's capacity: ceil(offered * 1.2 / capacity)
    want = int(np.ceil(w["offered_rps"] * 1.2 / best["capacity_per_replica_rps"] - 1e-9))
    assert w["replicas"] == want == best["replicas"]
    assert w["gpus"] == best["gpus_total"]
    note = d["prefix_cache"]["note"]
    m = re.search(r"instead of (\d+) \(both as the analytic screen plans them: (\d+) x \S+ TP "
                  r"(\d+) with the cache; the simulator's replay then sized this plan at (\d+)",
                  note)
    assert m, note
    assert int(m.group(1)) == int(m.group(2)) * int(m.group(3))
    assert int(m.group(4)) == best["gpus_total"]


def test_promoted_configuration_says_it_was_not_simulated(run_cli, tmp_path: Path):
    """The peak's cheapest (H100 TP 1) is the one `verify.top: 1` simulates; an L40S replica
    follows the night trough more closely and costs least over the day, so it comes first,
    unsimulated: the note says so and labels its cost an estimate."""
    lane = {"name": "curve", "input_len": 1000, "output_len": 300,
            "rate_curve": [{"at": "00:00", "rate_per_s": 1}, {"at": "03:00", "rate_per_s": 8}],
            "slo": {"ttft_p99_s": 2.0, "tbt_p99_s": 0.08}}
    doc = {"model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm", "l40s"], "tp": [1]},
           "workloads": [lane], "verify": {"top": 1}, "day": {"replay": "none"}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    res = run_cli("plan", str(tmp_path / "p.yaml"), "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    first, second = d["recommendations"][:2]
    assert (first["gpu"], second["gpu"]) == ("l40s", "h100-sxm")
    assert first["verified"] is None and second["verified"] is not None
    (note,) = [n for n in d["day"]["notes"] if "costs least over the day" in n]
    assert "estimated at each one's capacity per replica" in note
    assert "it was not simulated (the simulator checked h100-sxm TP 1" in note


def _csv_sections(text: str) -> list[list[list[str]]]:
    """CSV text of sections separated by a blank line, each with its header row."""
    import csv
    import io

    return [list(csv.reader(io.StringIO(part))) for part in text.strip().split("\n\n")]


def test_day_plan_csv_carries_recommendation_launch_schedule_and_totals(run_cli,
                                                                        tmp_path: Path):
    """`--format csv` of a day plan: what it recommends (the sentence the terminal and the
    exports give), recommendations, launch lines, the schedule in the `.schedule.csv`
    export's columns, and the totals; every file written is announced."""
    plan = tmp_path / "day.yaml"
    plan.write_text(yaml.safe_dump(_curve_plan()))
    res = run_cli("plan", str(plan), "--format", "csv", "--export", str(tmp_path / "d.csv"))
    assert res.exit_code == 0, res.stderr
    said, recs, launch, sched, totals = _csv_sections(res.stdout)
    # the peak's fleet: 4 replicas of TP 4 = 16 H100s at $3.78 per GPU-hour (the catalog's)
    assert said == [["recommended"], ["4 x h100-sxm TP 4 (16 GPUs, $60.48/h)"]]
    assert recs[0][:5] == ["#", "GPU", "TP", "replicas", "GPUs"]
    assert recs[1][1:3] == ["h100-sxm", "4"]  # the plan's only candidate
    assert launch[0] == ["engine", "launch command"]
    # the peak's 4 x TP 4 as they run: each replica pinned on its host, the router in front
    assert launch[1][0] == "vLLM" and launch[1][1].startswith(
        "replica 0 (HOST0): CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve ")
    assert "\nrouter: vllm-router --worker-urls http://HOST0:8100 " in launch[1][1]
    # one column spec: stdout's schedule is the export's, row for row
    exported = _csv_sections((tmp_path / "d.schedule.csv").read_text())[0]
    assert sched == exported and sched[0][:2] == ["start (h in UTC)", "end (h in UTC)"]
    assert len(sched) == 1 + 96 and sched[1][:2] == ["0.0", "0.25"]
    # totals by hand from the schedule: replicas x 4 GPUs x 0.25 h per window
    total = dict(totals[1:])
    assert totals[0] == ["quantity", "value"]
    assert float(total["GPU-hours, autoscaled"]) == pytest.approx(
        sum(int(r[4]) for r in sched[1:]) * 4 / 4)
    assert int(total["peak replicas"]) == max(int(r[4]) for r in sched[1:])
    assert f"wrote {tmp_path / 'd.csv'}" in res.stderr
    assert f"wrote {tmp_path / 'd.schedule.csv'}" in res.stderr


def test_day_plan_markdown_has_each_section(run_cli, tmp_path: Path):
    plan = tmp_path / "day.yaml"
    plan.write_text(yaml.safe_dump(_curve_plan()))
    res = run_cli("plan", str(plan), "--format", "markdown")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("Recommended: 4 x h100-sxm TP 4 (16 GPUs, $60.48/h)\n\n")
    heads = [ln for ln in res.stdout.splitlines() if ln.startswith("## ")]
    assert heads == ["## recommendations", "## launch",
                     "## day plan (replicas per window), clock times in UTC", "## totals"]
    assert "| h100-sxm |" in res.stdout
    assert "```sh\nreplica 0 (HOST0): CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve " in res.stdout
    assert "| GPU-hours, autoscaled " in res.stdout
