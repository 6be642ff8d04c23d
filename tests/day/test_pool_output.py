"""What a plan of several models prints: each model's day (replay, start-up, scale-ups), and
GPUs per GPU type, never an L40S and an H100 added up."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from capplan.cli._day import hhmm, schedule_rows

CHAT = {"input_len": 500, "output_len": 100, "slo": {"ttft_p99_s": 0.5, "tbt_p99_s": 0.04}}


def _write(tmp_path: Path, doc: dict) -> str:
    p = tmp_path / "pool.yaml"
    p.write_text(yaml.safe_dump({"version": 1, "verify": {"top": 0}, **doc}))
    return str(p)


def test_scale_up_times_round_down():
    # 06:58:39 is 25,119 s after midnight: shown 06:58 (a minute early), not 06:59 (late)
    assert hhmm(6 * 3600 + 58 * 60 + 39, earlier=True) == "06:58"
    assert hhmm(6 * 3600 + 58 * 60 + 39) == "06:59"  # window starts: to the nearest minute


def test_window_without_arrivals_has_no_attainment():
    """A replayed window with no arrivals has no attainment (NaN; JSON null): "-", not
    "nan%"; 997 of 1,000 arrivals within the SLOs is 99.7%; an unreplayed window is empty."""
    nan = float("nan")
    windows = [{"start_s": 0.0, "replay": {"planned": {"attainment": 0.997},
                                           "reactive": {"attainment": nan}}},
               {"start_s": 900.0, "replay": {"planned": {"attainment": None},
                                             "reactive": {"attainment": 1.0}}},
               {"start_s": 1800.0}]
    rows = schedule_rows({"schedule": windows})
    assert [(r["planned_att"], r["reactive_att"]) for r in rows] == [
        ("99.7%", "-"), ("-", "100.0%"), (None, None)]


def test_table_gives_each_models_replay_and_scale_ups(run_cli, tmp_path: Path):
    """A step from 2 to 60 req/s at 12:00 (15-minute windows): the 11:45 window adds replicas;
    the reactive policy (replicas join a start-up late) misses there, and the table says so
    for that model as the JSON does."""
    step = {"name": "chat", **CHAT, "input_len": 1000, "output_len": 200, "rate_curve": [
        {"at": "00:00", "rate_per_s": 2}, {"at": "11:45", "rate_per_s": 2},
        {"at": "12:00", "rate_per_s": 60}, {"at": "12:15", "rate_per_s": 2}]}
    flat = {"name": "chat", **CHAT, "rate_curve": [{"at": "00:00", "rate_per_s": 5}]}
    plan = _write(tmp_path, {"day": {"window_s": 900, "replay": "peak"}, "models": [
        {"model": "qwen3-30b-a3b", "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
         "workloads": [step]},
        {"model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
         "workloads": [flat]}]})
    res = run_cli("plan", plan)
    assert res.exit_code == 0, res.stderr
    out = res.stdout
    qwen = out[out.index("qwen3-30b-a3b over the day:"):out.index("llama-3.1-8b:")]
    assert re.search(r"replayed 3 window\(s\): .*reactive .*SLOs missed", qwen)
    start = float(re.search(r"a replica starts in (\d+) s", qwen).group(1))
    # the 11:45 window's replicas start one replica start-up (about a minute) before it
    m = re.search(r"scale-ups begin at: (\d\d):(\d\d) \(to (\d+) for 11:45\)", qwen)
    assert m and int(m.group(3)) >= 2
    begin_s = int(m.group(1)) * 3600 + int(m.group(2)) * 60
    assert 11 * 3600 + 45 * 60 - start - 60 < begin_s <= 11 * 3600 + 45 * 60 - start
    llama = out[out.index("llama-3.1-8b over the day:"):]
    assert re.search(r"replayed \d window", llama) and "a replica starts in" in llama


def test_gpu_types_are_not_added_up(run_cli, tmp_path: Path):
    lane = {"name": "chat", **CHAT, "rate_curve": [{"at": "03:00", "rate_per_s": 1},
                                                   {"at": "15:00", "rate_per_s": 8}]}
    plan = _write(tmp_path, {"day": {"window_s": 3600, "replay": "none"}, "models": [
        {"model": "llama-3.1-8b", "candidates": {"gpus": ["l40s"], "tp": [1]},
         "workloads": [lane]},
        {"model": "qwen3-8b", "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
         "workloads": [lane]}]})
    res = run_cli("plan", plan, "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert {p["gpu"] for p in d["gpu_pools"]} == {"l40s", "h100-sxm"}
    for key in ("peak_gpus", "gpu_hours", "fixed_fleet_gpu_hours"):
        assert d[key] is None  # per type in gpu_pools
    for k, w in enumerate(d["schedule"]):
        by_model = {m["model"]: m["schedule"][k]["gpus"] for m in d["models"]}
        assert w["gpus"] is None
        assert w["gpus_by_gpu"] == {"l40s": by_model["llama-3.1-8b"],
                                    "h100-sxm": by_model["qwen3-8b"]}
    table = run_cli("plan", plan).stdout
    assert "l40s pool" in table and "h100-sxm pool" in table and "GPUs\npool" not in table


def test_table_gives_every_models_day(run_cli):
    """examples/day/two-models.yaml: under each model's `over the day:` line come its
    scale-ups, peak and cost, and its replica start-up, as its JSON has them."""
    example = str(Path(__file__).resolve().parents[2] / "examples" / "day" / "two-models.yaml")
    res, js = run_cli("plan", example), run_cli("plan", example, "--format", "json")
    assert res.exit_code == 0 and js.exit_code == 0, res.stderr + js.stderr
    out = res.stdout.splitlines()
    for m in json.loads(js.stdout)["models"]:
        start = out.index(f"{m['model']} over the day:") + 1
        block = "\n".join(out[start:start + 5])
        ups = sum(w["scale_up_begin_s"] is not None for w in m["schedule"])
        assert ups and out[start].startswith("scale-ups begin at: ")
        assert out[start].count("(to ") == ups
        assert f"peak {m['peak_replicas']} replicas; autoscaled {m['gpu_hours']:,.1f} GPU-hours " \
               f"(${m['cost_per_day']:,.2f}/day)" in block
        assert (f"a replica starts in {m['day']['startup']['replica_start_s']:.0f} s"
                in block)
    # the launch lines place every model's peak fleet (the sum of their GPUs); the pool line
    # says its schedule never runs more than the shared peak
    pool = json.loads(js.stdout)["gpu_pools"][0]
    gpus = sum(max(w["gpus"] for w in m["schedule"]) for m in json.loads(js.stdout)["models"])
    assert pool["separate_fleets_peak_gpus"] == gpus > pool["peak_gpus"]
    assert (f"the launch lines above start each fleet at its own peak ({gpus} GPUs together); "
            "scaled by its schedule (the Kubernetes export's CronJobs) the pool never runs "
            f"more than {pool['peak_gpus']}") in res.stdout
