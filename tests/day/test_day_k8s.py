"""A day plan's `.k8s.yaml` carries its schedule (capplan/export/k8s_day.py): per model a
CronJob per change of its replicas, running `kubectl scale` at the window's start (a scale-up
one replica start-up ahead), with the ServiceAccount, Role and RoleBinding it runs as; each
Deployment created at its first window's replicas. Every object is read back from the file and
checked with the Kubernetes client's models; the figures it is compared with are written out
here from the plans' printed tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from capplan.export.k8s_day import cron, day_minutes
from tests.export.k8s_models import validate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "day"

# examples/day/two-models.yaml as `capplan plan` prints it: GPUs per hour from 00:00 Berlin time
# (its `timezone: Europe/Berlin`; TP 4, 4 GPUs a replica), the h100-sxm pool's their sum, peak
# 24 at 13:00-16:00 (28 in one fleet per model); each model's replica start-up 80 s (llama) and
# 81 s (qwen)
LLAMA_GPUS = [8, 8, 4, 4, 8, 8, 8, 12, 12, 12, 16, 16, 16, 20, 20, 20, 20, 16, 16, 16, 12, 12,
              12, 8]
QWEN_GPUS = [8] * 10 + [4] * 10 + [8] * 4
POOL_GPUS = [16, 16, 12, 12, 16, 16, 16, 20, 20, 20, 20, 20, 20, 24, 24, 24, 24, 20, 20, 20,
             20, 20, 20, 16]
# the jobs, by hand: a scale-up 80 s (81 s) ahead is the minute before that, rounded down
# (03:58 for 04:00); a scale-down at its window's start; at 10:00 and 20:00 one model adds a
# replica as the other gives one back, and both change at the scale-up's minute (09:58, 19:58).
# The clock times are Berlin's: the curves' hours as written, each job in timeZone Europe/Berlin
# (no hour moves to UTC's)
TWO_JOBS = {"llama-3-1-70b": {"0 2 * * *": 1, "58 3 * * *": 2, "58 6 * * *": 3,
                              "58 9 * * *": 4, "58 12 * * *": 5, "0 17 * * *": 4,
                              "58 19 * * *": 3, "0 23 * * *": 2},
            "qwen2-5-72b": {"58 9 * * *": 1, "58 19 * * *": 2}}


def _minute(expr: str) -> int:
    """The minute of the day a daily cron expression fires ("58 3 * * *" -> 238)."""
    minute, hour, *rest = expr.split()
    assert rest == ["*", "*", "*"], expr
    return int(hour) * 60 + int(minute)


def _by_minute(jobs: dict[str, int]) -> np.ndarray:
    """The replicas a model runs each minute of the day under its jobs (the day a cycle)."""
    at = {_minute(e): n for e, n in jobs.items()}
    last = at[max(at)]
    out = np.zeros(1440, np.int64)
    for m in range(1440):
        last = at.get(m, last)
        out[m] = last
    return out


def _export(run_cli, plan: Path, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    res = run_cli("plan", str(plan), "--export", str(out), "--format", "json")
    assert res.exit_code == 0, res.stderr
    docs = list(yaml.safe_load_all(out.read_text()))
    for d in docs:
        validate(d)  # every object a Kubernetes object, round-tripped through the client
    return json.loads(res.stdout), docs


def _jobs(docs: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """{deployment: {cron expression: replicas}} from the CronJobs' commands."""
    out: dict[str, dict[str, int]] = {}
    for d in docs:
        if d["kind"] != "CronJob":
            continue
        (c,) = d["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        prog, verb, target, reps = c["command"]
        assert (prog, verb) == ("kubectl", "scale") and reps.startswith("--replicas=")
        kind, name = target.split("/")
        assert kind == "deployment"
        assert d["spec"]["schedule"] not in out.get(name, {})
        out.setdefault(name, {})[d["spec"]["schedule"]] = int(reps.split("=")[1])
    return out


def _check_access(docs: list[dict[str, Any]], zone: str) -> None:
    """Each job runs in time zone `zone` as a ServiceAccount bound to a Role that may get and
    patch its own Deployment and its scale subresource, and nothing else; its pods are no
    Deployment's."""
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    selectors = [d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] == "Deployment"]
    for d in docs:
        if d["kind"] != "CronJob":
            continue
        assert d["spec"]["timeZone"] == zone
        pod = d["spec"]["jobTemplate"]["spec"]["template"]
        (c,) = pod["spec"]["containers"]
        image, tag = c["image"].rsplit(":", 1)
        assert image == "registry.k8s.io/kubectl" and tag.startswith("v1.")
        name = c["command"][2].split("/")[1]
        sa = pod["spec"]["serviceAccountName"]
        assert ("ServiceAccount", sa) in by
        binding = next(b for (k, _), b in by.items() if k == "RoleBinding"
                       and b["subjects"] == [{"kind": "ServiceAccount", "name": sa}])
        role = by[("Role", binding["roleRef"]["name"])]
        assert binding["roleRef"]["kind"] == "Role"
        assert role["rules"] == [{"apiGroups": ["apps"],
                                  "resources": ["deployments", "deployments/scale"],
                                  "resourceNames": [name], "verbs": ["get", "patch"]}]
        labels = pod["metadata"]["labels"]
        assert not any(s.items() <= labels.items() for s in selectors)


def test_two_models_pool_follows_the_plans_windows(run_cli, tmp_path: Path):
    plan, docs = _export(run_cli, EXAMPLES / "two-models.yaml", tmp_path / "two.k8s.yaml")
    # the figures above are the plan's
    assert [w["gpus_by_model"]["llama-3.1-70b"] for w in plan["schedule"]] == LLAMA_GPUS
    assert [w["gpus_by_model"]["qwen2.5-72b"] for w in plan["schedule"]] == QWEN_GPUS
    assert [w["gpus"] for w in plan["schedule"]] == POOL_GPUS
    assert (plan["peak_gpus"], plan["separate_fleets_peak_gpus"]) == (24, 28)
    deps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    gpus = {n: int(d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
                   ["nvidia.com/gpu"]) for n, d in deps.items()}
    assert gpus == {"llama-3-1-70b": 4, "qwen2-5-72b": 4}
    # created at the first window's (00:00) replicas, not the peak's 5 and 2
    assert {n: d["spec"]["replicas"] for n, d in deps.items()} == {"llama-3-1-70b": 2,
                                                                   "qwen2-5-72b": 2}
    jobs = _jobs(docs)
    assert jobs == TWO_JOBS
    assert plan["timezone"] == "Europe/Berlin"
    assert all(m["timezone"] == "Europe/Berlin" for m in plan["models"])
    _check_access(docs, "Europe/Berlin")
    held = {n: _by_minute(j) * gpus[n] for n, j in jobs.items()}
    pool = held["llama-3-1-70b"] + held["qwen2-5-72b"]
    assert pool.max() == 24 == plan["gpu_pools"][0]["peak_gpus"]
    for h in range(24):
        hour = slice(60 * h, 60 * h + 60)
        # from each window's start the pool holds the plan's GPUs for it, each model its own
        assert pool[60 * h] == POOL_GPUS[h]
        assert held["llama-3-1-70b"][60 * h] == LLAMA_GPUS[h]
        assert held["qwen2-5-72b"][60 * h] == QWEN_GPUS[h]
        # and never more than the plan's GPUs of that window or the next (a scale-up ahead)
        assert pool[hour].max() <= max(POOL_GPUS[h], POOL_GPUS[(h + 1) % 24])
        # the next window's replicas come at most 3 minutes early (an 80 s start-up, rounded)
        assert (pool[60 * h: 60 * h + 57] == POOL_GPUS[h]).all()


def test_chat_day_scales_one_start_up_ahead(run_cli, tmp_path: Path):
    """examples/day/chat-day.yaml with the replay and the simulator check off (a minute
    faster): its printed table runs 1 replica (1 H100) to 07:45, 2 from 08:00 ('start
    scale-up 07:58': a replica starts in 62 s) to 21:15, 1 from 21:30."""
    doc = yaml.safe_load((EXAMPLES / "chat-day.yaml").read_text())
    doc["day"]["replay"], doc["verify"]["top"] = "none", 0
    doc["workloads"][0]["rate_curve"] = str(EXAMPLES / "diurnal.csv")
    path = tmp_path / "chat-day.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan, docs = _export(run_cli, path, tmp_path / "chat.k8s.yaml")
    reps = [w["replicas"] for w in plan["schedule"]]
    assert reps == [1] * 32 + [2] * 54 + [1] * 10
    assert plan["day"]["startup"]["replica_start_s"] == pytest.approx(62.3, abs=0.1)
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 1
    assert _jobs(docs) == {"llama-3-1-8b": {"58 7 * * *": 2, "30 21 * * *": 1}}
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "ServiceAccount", "Role",
                                         "RoleBinding", "CronJob", "CronJob"]
    # a plan that names no zone: UTC, said in the JSON and the manifest
    assert plan["timezone"] == "UTC"
    _check_access(docs, "UTC")
    text = (tmp_path / "chat.k8s.yaml").read_text()
    assert "timeZone UTC" in text and "first window's replicas" in text
    assert "not scheduled" not in text


def test_cron_expressions():
    assert cron(7 * 60 + 30) == "30 7 * * *"
    assert cron(0) == "0 0 * * *"
    assert cron(23 * 60 + 59) == "59 23 * * *"


def _hours(*reps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    start = np.arange(len(reps)) * 3600.0
    return np.array([reps]), start, start + 3600.0


def test_a_schedule_shorter_than_a_day_holds_its_last_window():
    """12 windows of an hour: the last one's replicas hold to midnight; the first window's
    scale-up (from 3 to 4) begins 90 s before 00:00, at 23:58, the previous evening."""
    reps, start, end = _hours(4, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3)
    m = day_minutes(reps, np.array([90.0]), start, end)[0]
    assert m[0] == 4 and m[59] == 4 and m[60] == 2
    assert m[10 * 60 + 57] == 2 and m[10 * 60 + 58] == 3  # 11:00's scale-up at 10:58
    assert m[23 * 60 + 57] == 3 and m[23 * 60 + 58] == 4


def test_two_days_fold_onto_one_at_the_larger_count():
    reps = np.array([[1] * 24 + [1] * 12 + [3] + [1] * 11])
    start = np.arange(48) * 3600.0
    m = day_minutes(reps, np.array([0.0]), start, start + 3600.0)[0]
    assert m[12 * 60] == 3 and m[13 * 60] == 1 and m.max() == 3


def test_a_leaderworkerset_is_scaled_through_its_own_api():
    """A replica over two hosts (a LeaderWorkerSet): its jobs scale `leaderworkerset/NAME`,
    its Role names the set's API group; a 300 s start-up moves 12:00's scale-up to 11:55."""
    from capplan.export.k8s import k8s_objects

    line = ("vllm serve meta-llama/Llama-3.1-405B-Instruct --tensor-parallel-size 8 "
            "--pipeline-parallel-size 2 --max-num-seqs 64 --max-num-batched-tokens 4096 "
            "--gpu-memory-utilization 0.9 --max-model-len 8192 --host 0.0.0.0 --port 8000")
    plan = {"model": "llama-3.1-405b", "recommendations": [{
        "gpu": "h100-sxm", "replicas": 3, "gpus_total": 48, "engine": "vllm",
        "engine_flags": {"vllm": line}}],
        "schedule": [{"start_s": 0.0, "end_s": 43200.0, "replicas": 1},
                     {"start_s": 43200.0, "end_s": 86400.0, "replicas": 3}],
        "day": {"startup": {"replica_start_s": 300.0}}}
    docs = k8s_objects(plan)
    for d in docs:
        validate(d)
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    assert lws["spec"]["replicas"] == 1
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert role["rules"][0]["apiGroups"] == ["leaderworkerset.x-k8s.io"]
    assert role["rules"][0]["resources"] == ["leaderworkersets", "leaderworkersets/scale"]
    cmds = {d["spec"]["schedule"]: d["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            ["containers"][0]["command"][2:] for d in docs if d["kind"] == "CronJob"}
    # a plan dict without `timezone` (written before it): UTC
    assert {d["spec"]["timeZone"] for d in docs if d["kind"] == "CronJob"} == {"UTC"}
    name = lws["metadata"]["name"]
    assert cmds == {"55 11 * * *": [f"leaderworkerset/{name}", "--replicas=3"],
                    "0 0 * * *": [f"leaderworkerset/{name}", "--replicas=1"]}
