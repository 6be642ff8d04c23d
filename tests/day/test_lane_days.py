"""A day plan deploying a pool per lane (`pools: separate`) whose lanes peak at different hours:
each lane's pool is scheduled from its own rate per window (not at its rate in the window where
the total traffic peaks), the plan's totals add the lanes' pools up, and the Kubernetes day
export scales each lane's Deployment with its own CronJobs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.export.k8s_models import validate

HEADROOM = 0.2
HOUR = 3600.0
# (hour, req/s) points of each lane's curve, linear between them, wrapping at midnight: chat
# peaks at 14:00 (when the total does), rag at 03:00 (1 req/s at 14:00)
CHAT = [(0, 2.0), (14, 40.0), (20, 2.0)]
RAG = [(0, 1.0), (3, 12.0), (6, 1.0)]


def _rate(points: list[tuple[int, float]], hour: float) -> float:
    """The curve at `hour` (linear between points, the last wrapping to the first + 24 h)."""
    pts = [*points, (points[0][0] + 24, points[0][1])]
    if hour < pts[0][0]:
        hour += 24
    for (h0, r0), (h1, r1) in zip(pts, pts[1:], strict=False):
        if h0 <= hour <= h1:
            return r0 + (r1 - r0) * (hour - h0) / (h1 - h0)
    raise AssertionError(hour)


def _replicas(points: list[tuple[int, float]], capacity: float) -> list[int]:
    """Replicas per one-hour window by hand: the highest rate inside window k is at one of its
    edges (a linear curve with points on the hour), ceil(that x (1 + headroom) / capacity)."""
    return [max(1, math.ceil(max(_rate(points, k), _rate(points, k + 1)) * (1 + HEADROOM)
                             / capacity - 1e-9)) for k in range(24)]


def _doc(**top: Any) -> dict[str, Any]:
    """The two lanes' plan file (`top`: extra top-level keys, e.g. pools)."""
    slo = {"ttft_p99_s": 1.0, "tbt_p99_s": "60ms"}
    return {"version": 1, "model": "llama-3.1-8b", **top,
            "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
            "engine": {"max_num_seqs": [128], "max_num_batched_tokens": [2048]},
            "workloads": [
                {"name": "chat", "input_len": 800, "output_len": 250, "slo": slo,
                 "rate_curve": [{"at": f"{h:02d}:00", "rate_per_s": r} for h, r in CHAT]},
                {"name": "rag", "input_len": 6000, "output_len": 200,
                 "slo": {**slo, "ttft_p99_s": 2.0},
                 "rate_curve": [{"at": f"{h:02d}:00", "rate_per_s": r} for h, r in RAG]}],
            "headroom": HEADROOM, "day": {"window_s": 3600, "replay": "none"},
            "verify": {"top": 0}}


def _plan(run_cli, tmp_path: Path) -> tuple[dict[str, Any], str]:
    path = tmp_path / "lanes.yaml"
    path.write_text(yaml.safe_dump(_doc(pools="separate"), sort_keys=False))
    out = tmp_path / "lanes.k8s.yaml"
    res = run_cli("plan", str(path), "--export", str(out), "--format", "json")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout), out.read_text()


@pytest.fixture
def lanes(run_cli, tmp_path: Path) -> tuple[dict[str, Any], str]:
    return _plan(run_cli, tmp_path)


def _by_hand(plan: dict[str, Any]) -> dict[str, list[int]]:
    """Each lane's replicas per window by hand, at the capacity its own day states."""
    days = {d["lane"]: d for d in plan["lane_days"]}
    return {name: _replicas(pts, days[name]["day"]["capacity_per_replica_rps"])
            for name, pts in (("chat", CHAT), ("rag", RAG))}


def test_each_lane_is_sized_at_its_own_peak(lanes):
    """The rag lane's pool has the replicas its 03:00 peak needs (12 req/s), not those of its
    1 req/s at 14:00, the total's peak; the deployed lane pools are each lane's peak fleet."""
    plan, _ = lanes
    hand = _by_hand(plan)
    days = {d["lane"]: d for d in plan["lane_days"]}
    for name, reps in hand.items():
        assert [w["replicas"] for w in days[name]["schedule"]] == reps, name
        assert days[name]["peak_replicas"] == max(reps)
    cap = days["rag"]["day"]["capacity_per_replica_rps"]
    rag_peak = math.ceil(12.0 * (1 + HEADROOM) / cap - 1e-9)
    assert hand["rag"][2] == hand["rag"][3] == rag_peak > math.ceil(1.0 * 1.2 / cap - 1e-9)
    assert int(plan["day"]["peak"]["start_s"] // HOUR) == 13  # the total peaks at 14:00
    deployed = {ln["lane"]: ln["replicas"] for ln in plan["pools"]["separate"]["lanes"]}
    assert deployed == {name: max(reps) for name, reps in hand.items()}


def test_the_plan_totals_are_the_sum_over_lanes(lanes):
    """GPU-hours autoscaled: the sum over lanes and windows of replicas x GPUs x 1 h; fixed:
    each lane's peak fleet all day; peak GPUs: the most any window needs over both pools."""
    plan, _ = lanes
    hand = _by_hand(plan)
    gpr = {d["lane"]: d["day"]["gpus_per_replica"] for d in plan["lane_days"]}
    assert gpr == {"chat": 1, "rag": 1}
    assert plan["gpu_hours"] == pytest.approx(sum(sum(r) for r in hand.values()))
    assert plan["fixed_fleet_gpu_hours"] == pytest.approx(
        24 * sum(max(r) for r in hand.values()))
    per_window = [c + r for c, r in zip(hand["chat"], hand["rag"], strict=True)]
    assert plan["peak_gpus"] == max(per_window)
    assert [w["gpus"] for w in plan["schedule"]] == per_window
    assert [w["gpus_by_lane"] for w in plan["schedule"]] == [
        {"chat": c, "rag": r} for c, r in zip(hand["chat"], hand["rag"], strict=True)]
    price = plan["lane_days"][0]["day"]["price_per_gpu_hour"]
    assert plan["cost_per_day"] == pytest.approx(plan["gpu_hours"] * price)


def test_each_lane_deployment_is_scheduled_by_its_own_cronjobs(lanes):
    """One CronJob per change of each lane's replicas: a window that adds replicas to any lane
    begins one start-up ahead (rounded down to the minute), and the lanes on one GPU type change
    together (so rag's scale-down into 06:00 happens with chat's scale-up); each Deployment is
    created at its 00:00 replicas; no 'not scheduled' header."""
    plan, text = lanes
    hand = _by_hand(plan)
    lead = plan["lane_days"][0]["day"]["startup"]["replica_start_s"]
    assert lead == plan["lane_days"][1]["day"]["startup"]["replica_start_s"]
    expected: dict[str, dict[str, int]] = {}
    for k in range(24):
        up = any(r[k] > r[k - 1] for r in hand.values())
        minute = math.floor((k * HOUR - lead) / 60) % 1440 if up else k * 60
        for name, r in hand.items():
            if r[k] != r[k - 1]:
                at = f"{minute // 60:02d}{minute % 60:02d}"
                expected.setdefault(f"llama-3-1-8b-{name}", {})[at] = r[k]
    docs = list(yaml.safe_load_all(text))
    for d in docs:
        validate(d)
    jobs: dict[str, dict[str, int]] = {}
    for d in docs:
        if d["kind"] == "CronJob":
            name, _, at = d["metadata"]["name"].rpartition("-at-")
            cmd = d["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0][
                "command"]
            assert cmd[2] == f"deployment/{name}"
            assert d["spec"]["schedule"] == f"{int(at[2:])} {int(at[:2])} * * *"
            jobs.setdefault(name, {})[at] = int(cmd[3].removeprefix("--replicas="))
    assert jobs == expected
    assert set(jobs) == {"llama-3-1-8b-chat", "llama-3-1-8b-rag"}
    deps = {d["metadata"]["name"]: d["spec"]["replicas"] for d in docs
            if d["kind"] == "Deployment"}
    assert deps == {f"llama-3-1-8b-{n}": r[0] for n, r in hand.items()}
    assert "not scheduled" not in text


def test_shared_pool_of_several_lanes_is_recommended_as_the_schedules_peak_fleet(run_cli,
                                                                                   tmp_path):
    """Several lanes on the default `pools: both`, the shared pool winning: the recommendation
    is the schedule's peak fleet as for one lane (it kept the planner's 3 replicas while the
    schedule peaked at 4 and the fixed fleet ran 4 GPUs), and the fixed-fleet baseline is that
    fleet over the day: peak replicas x 1 GPU x 24 h."""
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(_doc(), sort_keys=False))
    res = run_cli("plan", str(path), "--format", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rec = out["recommendations"][0]
    assert out.get("pools") is not None  # the pool comparison ran (the case that was skipped)
    assert rec["replicas"] == out["peak_replicas"]
    assert out["fixed_fleet_gpu_hours"] == pytest.approx(out["peak_replicas"] * 1 * 24.0)
    peak = out["schedule"][out["day"]["peak"]["window"]]
    assert rec["per_replica_rate_per_s"] == pytest.approx(peak["sizing_rps"] / rec["replicas"])


def test_csv_and_markdown_say_a_pool_per_lane_is_recommended(run_cli, lanes, tmp_path: Path):
    """`--format csv|markdown` of a day plan that deploys a pool per lane say so first, as the
    terminal does (before, they gave the shared pool's rank 1 and its launch lines alone),
    mark the shared pool's row "no", launch each lane's pool and mark the lanes' pools "yes"."""
    import csv
    import io

    plan, _ = lanes
    n = {ln["lane"]: ln["replicas"] for ln in plan["pools"]["separate"]["lanes"]}
    shared = plan["recommendations"][0]["replicas"]

    def fleet(k: int) -> str:  # k replicas of TP 1 on H100s at $3.78 per GPU-hour
        return f"{k} x h100-sxm TP 1 ({k} GPU{'' if k == 1 else 's'}, ${3.78 * k:.2f}/h)"

    said = (f"a pool per lane, as the plan asks: lane chat: {fleet(n['chat'])}; lane rag: "
            f"{fleet(n['rag'])} ({n['chat'] + n['rag']} GPUs in all, "
            f"${3.78 * (n['chat'] + n['rag']):.2f}/h); rank 1 is one shared pool, for "
            f"comparison: {fleet(shared)}")
    path = tmp_path / "lanes.yaml"  # the `lanes` fixture's plan file
    res = run_cli("plan", str(path), "--format", "csv")
    assert res.exit_code == 0, res.stderr
    head, recs, launch, pools, *_ = [list(csv.reader(io.StringIO(part)))
                                     for part in res.stdout.strip().split("\n\n")]
    assert head == [["recommended"], [said]]
    assert recs[0][-1] == "recommended" and recs[1][-1] == "no"
    assert [row[0] for row in launch[1:]] == [
        f"{e} (lane {ln})" for ln in ("chat", "rag") for e in ("vLLM", "SGLang", "TensorRT-LLM")]
    marks = {row[0]: row[-1] for row in pools[1:]}
    assert (marks["shared (all lanes)"], marks["lane chat"], marks["lane rag"]) == (
        "no", "yes", "yes")
    res = run_cli("plan", str(path), "--format", "markdown")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith(f"Recommended: {said}\n\n## recommendations\n")
