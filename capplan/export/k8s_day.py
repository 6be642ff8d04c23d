"""A day plan's schedule in its Kubernetes manifests (`--export FILE.k8s.yaml`): core objects
that move each model's workload over the day as the plan's windows say, applied as printed (no
CRDs, no autoscaler).

Per scheduled model: a batch/v1 CronJob per change of its replicas over the day, each running
`kubectl scale deployment/NAME --replicas=N` at its minute in the plan's time zone (its
`timezone`, the plan file's `day.timezone`; UTC by default) as spec.timeZone, and the
ServiceAccount, Role (get and patch on that workload and its scale subresource only) and
RoleBinding the jobs run as. The workload itself starts at the schedule's first window's
replicas.

What is scheduled: a model's aggregated fleet, the one whose replicas the schedule counts per
window, and a plan deploying a pool per lane (`pools: separate`): each lane's pool by its own
schedule (the plan's `lane_days`, plan/lane_day.py), the lanes on one GPU type as a pool. A day
plan sizes no disaggregated prefill/decode layout (a plan dict carrying one has none for it
either, nor a per-lane plan dict without `lane_days`): such pools keep the peak plan's replicas
all day, and the manifest's header names them (`fixed_note`).

When (`day_minutes`): a window that adds replicas is scaled up one replica start-up ahead of its
start (the plan's `day.startup.replica_start_s`), rounded down to the minute; a window that
removes replicas is scaled down at its start (rounded up to the minute), or earlier in a shared
pool (next). Models on one GPU
type share a pool (as the plan's `gpu_pools`): every change of the pool into a window happens
together, at the earliest scale-up begin into it, so a model's scale-down there frees its GPUs
for another model's new replica, and the pool moves from one window's planned GPUs to the
next's in one step, never holding more than the larger of the two.

Object shapes: the Kubernetes API reference (batch/v1 CronJob, v1 ServiceAccount,
rbac.authorization.k8s.io/v1 Role and RoleBinding); `kubectl scale` reads the workload and
patches its scale subresource (kubectl's scale command, without preconditions).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

DAY_MIN = 1440
DEFAULT_TIME_ZONE = "UTC"
"""The CronJobs' spec.timeZone when the plan names no zone (a plan written before `timezone`)."""
KUBECTL_IMAGE = "registry.k8s.io/kubectl:v1.33.0"
"""The scale jobs' image: the Kubernetes project's own kubectl image (registry.k8s.io/kubectl,
published for every release since v1.28; entrypoint /bin/kubectl), small and public, pinned so a
job does not change under you. Not bitnami/kubectl: Bitnami withdrew its version tags from
Docker Hub in 2025 (bitnami/containers issue 83267). kubectl works within one minor version of
its cluster: change the tag to yours."""
SCALABLE = {"Deployment": ("apps", "deployments"),
            "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "leaderworkersets")}
"""Workloads the schedule scales: (API group, resource), both with a scale subresource."""


@dataclass(frozen=True)
class Target:
    """One model's workload as the schedule scales it."""

    name: str
    kind: str
    gpu: str
    gpus_per_replica: int
    replicas: list[int]
    """Its replicas per window of the plan's schedule."""
    lead_s: float
    """The plan's replica start-up: how far ahead of its window a scale-up begins."""


def day_targets(sub: dict[str, Any], pools: list[Any]) -> list[Target]:
    """The workloads a model's day schedule scales: its aggregated pool (the fleet the schedule
    counts), or each lane's pool of a per-lane layout by that lane's own schedule (`lane_days`,
    in the order of the pools, which `plan_pools` makes from the lanes); none for a plan
    without a schedule, or a layout no schedule counts (a disaggregated one, a per-lane one
    without the lanes' schedules: its pools keep the peak's replicas)."""
    from capplan.export.layout import AGGREGATED, SEPARATE, recommended_layout

    sched = sub.get("schedule")
    if not (isinstance(sched, list) and sched) or any(p.role or p.addressed for p in pools):
        return []
    layout = recommended_layout(sub)
    if layout == AGGREGATED and len(pools) == 1:
        return [_target(pools[0], sub)]
    days = sub.get("lane_days")
    lanes = ((sub.get("pools") or {}).get("separate") or {}).get("lanes") or []
    if layout != SEPARATE or not isinstance(days, list) or len(days) != len(pools) or [
            d.get("lane") for d in days] != [ln.get("lane") for ln in lanes]:
        return []
    return [_target(p, d) for p, d in zip(pools, days, strict=True)]


def pool_kind(p: Any) -> str:
    """The kind of a pool's workload (a `k8s.Pool`): a LeaderWorkerSet for a replica over hosts,
    else a StatefulSet when each replica needs its own address, else a Deployment."""
    if p.hosts > 1:
        return "LeaderWorkerSet"
    return "StatefulSet" if p.addressed else "Deployment"


def _target(p: Any, day: dict[str, Any]) -> Target:
    """Pool p scaled by the day plan `day`'s schedule, a scale-up its replica start-up ahead."""
    lead = ((day.get("day") or {}).get("startup") or {}).get("replica_start_s") or 0.0
    return Target(p.name, pool_kind(p), p.gpu, p.gpus_per_replica,
                  [int(w["replicas"]) for w in day["schedule"]], float(lead))


def time_zone(plan: dict[str, Any]) -> str:
    """The IANA zone of the plan's clock times (its `timezone`), the CronJobs' spec.timeZone."""
    return str(plan.get("timezone") or DEFAULT_TIME_ZONE)


@dataclass(frozen=True)
class Fixed:
    """A model's workloads a day plan does not schedule: they stay at the peak plan's size."""

    model: str
    layout: str
    """The layout they deploy (layout.DISAGGREGATED or SEPARATE)."""
    objects: list[tuple[str, str, int]]
    """(kind, name, replicas) of each."""
    peak: str = ""
    """The window the peak plan sized them for and its lanes' rates ("14:00-15:00 UTC: chat 40
    req/s, rag 1 req/s"; "" when the plan does not say)."""


def fixed_workloads(sub: dict[str, Any], kinds: list[tuple[str, str, int]]) -> Fixed | None:
    """The workloads (kind, name, replicas: `kinds`, of the model's pools) of a day plan's
    model that no schedule moves: a disaggregated or per-lane layout (`day_targets` none while
    the plan has a schedule); None for a model that is scheduled or has no schedule."""
    from capplan.export.layout import AGGREGATED, recommended_layout

    sched = sub.get("schedule")
    layout = recommended_layout(sub)
    if not (isinstance(sched, list) and sched) or layout == AGGREGATED or not kinds:
        return None
    return Fixed(str(sub.get("model") or "model"), layout, kinds, _peak_text(sub))


def _peak_text(sub: dict[str, Any]) -> str:
    """"14:00-15:00 UTC: chat 40 req/s, rag 1 req/s": a day plan's peak window (`day.peak`)
    in its zone."""
    peak = (sub.get("day") or {}).get("peak") or {}
    if not isinstance(peak.get("start_s"), int | float) or not isinstance(
            peak.get("end_s"), int | float):
        return ""
    span = "-".join(hhmm(int(peak[k] // 60) % DAY_MIN) for k in ("start_s", "end_s"))
    lanes = ", ".join(f"{ln.get('name')} {ln.get('rate_per_s'):.3g} req/s"
                      for ln in peak.get("lanes") or []
                      if isinstance(ln.get("rate_per_s"), int | float))
    span += f" {time_zone(sub)}"
    return f"{span}: {lanes}" if lanes else span


def fixed_note(fixed: list[Fixed]) -> str:
    """The header lines naming each unscheduled workload and why (`Fixed`)."""
    from capplan.export.layout import DISAGGREGATED

    out = []
    for f in fixed:
        why = (f"{f.model}'s day plan counts replicas per window for an aggregated fleet "
               "only, with no per-window prefill or decode count, so traffic above that "
               "window's is not covered" if f.layout == DISAGGREGATED else
               f"{f.model}'s day plan counts replicas per window for one shared pool only, "
               "with no per-window count per lane (the plan dict has no `lane_days`, which "
               "`capplan plan` gives a model that deploys a pool per lane), so a lane busier at "
               "another hour than that window is not covered (`pools: shared` or `both` "
               "deploys the shared pool, which the schedule moves)")
        objs = ", ".join(f"{k}/{n} ({r} replica{'' if r == 1 else 's'})"
                         for k, n, r in f.objects)
        at = f" ({f.peak})" if f.peak else ""
        out.append(comment(
            f"not scheduled: {objs} stay all day at the size the peak plan gives them, for "
            f"its peak window{at}: {why}; their GPUs are not in the schedule's counts or its "
            "over-peak note"))
    return "".join(out)


def at_first_window(pools: list[Any], targets: list[Target]) -> list[Any]:
    """The pools as the manifests create them: a scheduled one at its first window's replicas
    (deterministic, whatever the hour the file is applied; the CronJobs move it from there)."""
    first = {t.name: t.replicas[0] for t in targets}
    return [replace(p, replicas=first[p.name]) if p.name in first else p for p in pools]


def _edges(plan: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(start_s, end_s) of the windows every model's replicas are indexed by: the plan's own
    schedule (a plan of several models: the pool's windows)."""
    sched = plan["schedule"]
    start = np.array([float(w["start_s"]) for w in sched])
    end = np.array([float(w["end_s"]) for w in sched])
    return start - start[0], end - start[0]


def _transitions(reps: np.ndarray, leads: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The minute each window's replicas take over for every model of one pool (`reps`: models
    x windows; the first window follows the last, a daily cycle): one start-up ahead of the
    window, rounded down, when a model adds replicas there (the longest of their start-ups),
    else at its start, rounded up."""
    prev = np.roll(reps, 1, axis=1)
    up = reps > prev
    lead = np.where(up, leads[:, None], -np.inf).max(axis=0)
    ahead = np.floor((start - np.where(np.isfinite(lead), lead, 0.0)) / 60.0 + 1e-9)
    return np.where(up.any(axis=0), ahead, np.ceil(start / 60.0 - 1e-9)).astype(np.int64)


def day_minutes(reps: np.ndarray, leads: np.ndarray, start: np.ndarray,
                end: np.ndarray) -> np.ndarray:
    """The replicas each model of one pool runs in each minute of the day (models x 1440).

    Window k holds from its transition to the next's (`_transitions`; the last until the first
    of the next cycle, past a schedule shorter than a day). A schedule over several days is
    folded onto one, each minute taking the most replicas any day needs then; so do windows
    too short for a start-up (a window's hold is at least its minute)."""
    b = _transitions(reps, leads, start)
    from capplan.plan.day import cycle_s

    cycle = round(cycle_s(float(end[-1])) / 60.0)
    nxt = np.append(b[1:], b[0] + cycle)
    out = np.zeros((reps.shape[0], DAY_MIN), np.int64)
    for k in range(len(b)):
        minutes = np.arange(b[k], max(int(nxt[k]), b[k] + 1)) % DAY_MIN
        for i in range(reps.shape[0]):
            np.maximum.at(out[i], minutes, reps[i, k])
    return out


def changes(minutes: np.ndarray) -> list[tuple[int, int]]:
    """(minute of the day, replicas) where a model's replicas change, the day a cycle."""
    at = np.flatnonzero(minutes != np.roll(minutes, 1))
    return [(int(m), int(minutes[m])) for m in at]


def hhmm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


def cron(minute: int) -> str:
    """The daily cron expression of a minute of the day: 07:30 -> "30 7 * * *"."""
    return f"{minute % 60} {minute // 60} * * *"


def _labels(t: Target) -> dict[str, str]:
    """The scale jobs' labels: their own name, so no workload's or Service's selector (which
    select the model's name) takes their pods."""
    return {"app.kubernetes.io/name": f"{t.name}-scaler", "app.kubernetes.io/part-of": "capplan"}


def _access(t: Target) -> list[dict[str, Any]]:
    """The ServiceAccount the scale jobs run as, its Role (get and patch on this workload and
    its scale subresource, nothing else) and their RoleBinding (the subject's namespace left
    out: the binding's own)."""
    group, resource = SCALABLE[t.kind]
    meta = {"name": f"{t.name}-scaler", "labels": _labels(t)}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [group], "resources": [resource, f"{resource}/scale"],
                    "resourceNames": [t.name], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": meta["name"]},
         "subjects": [{"kind": "ServiceAccount", "name": meta["name"]}]}]


def _cron_job(t: Target, minute: int, replicas: int, until_s: int, zone: str
              ) -> dict[str, Any]:
    """The CronJob setting `replicas` at `minute` every day; a run missed (the controller
    down) or failing starts or retries only until the model's next change is due (`until_s`
    later), so an older scale never lands after a newer one."""
    labels = _labels(t)
    pod = {"metadata": {"labels": labels}, "spec": {
        "serviceAccountName": labels["app.kubernetes.io/name"], "restartPolicy": "OnFailure",
        "containers": [{"name": "kubectl", "image": KUBECTL_IMAGE, "command": [
            "kubectl", "scale", f"{SCALABLE[t.kind][1][:-1]}/{t.name}",
            f"--replicas={replicas}"]}]}}
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": f"{t.name}-at-{hhmm(minute).replace(':', '')}",
                         "labels": labels,
                         "annotations": {"capplan/replicas": str(replicas),
                                         "capplan/gpus": str(replicas * t.gpus_per_replica)}},
            "spec": {"schedule": cron(minute), "timeZone": zone,
                     "concurrencyPolicy": "Forbid", "startingDeadlineSeconds": until_s,
                     "successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 1,
                     "jobTemplate": {"spec": {"backoffLimit": 3,
                                              "activeDeadlineSeconds": until_s,
                                              "template": pod}}}}


def scheduled_minutes(plan: dict[str, Any], targets: list[Target]) -> dict[str, np.ndarray]:
    """Each target's replicas per minute of the day (`day_minutes`), its pool the targets on
    its GPU type."""
    start, end = _edges(plan)
    out: dict[str, np.ndarray] = {}
    for gpu in sorted({t.gpu for t in targets}):
        pool = [t for t in targets if t.gpu == gpu]
        reps = np.zeros((len(pool), len(start)), np.int64)
        for i, t in enumerate(pool):  # a shorter day counts 0 after its end, as the plan does
            reps[i, :len(t.replicas)] = t.replicas[:len(start)]
        mins = day_minutes(reps, np.array([t.lead_s for t in pool]), start, end)
        out.update({t.name: mins[i] for i, t in enumerate(pool)})
    return out


def schedule_objects(plan: dict[str, Any], targets: list[Target]) -> list[dict[str, Any]]:
    """The scale jobs of every scheduled model and what they run as (none for a model whose
    replicas never change)."""
    objs: list[dict[str, Any]] = []
    if not targets:
        return objs
    minutes = scheduled_minutes(plan, targets)
    for t in targets:
        moves = changes(minutes[t.name])
        if not moves:
            continue
        objs += _access(t)
        for j, (m, n) in enumerate(moves):
            gap = (moves[(j + 1) % len(moves)][0] - m) % DAY_MIN or DAY_MIN
            objs.append(_cron_job(t, m, n, gap * 60, time_zone(plan)))
    return objs


def schedule_head(plan: dict[str, Any], targets: list[Target],
                  fixed: list[Fixed] | None = None) -> str:
    """The manifest's comment lines on the schedule: what moves each workload, when, from what
    it starts, where a shared pool's scheduled GPUs would go over the plan's peak, and which
    workloads stay at their peak size (`fixed`)."""
    rest = fixed_note(fixed or [])
    if not targets:
        return rest
    leads = ", ".join(f"{t.name} {t.lead_s:.0f} s" for t in targets)
    pool = ("; workloads on one GPU type (models, or a model's lanes) change together, so "
            "their pool never holds more than the plan's GPUs of the two windows it moves "
            "between" if len(targets) > 1 else "")
    head = "".join(comment(line) for line in (
        f"day schedule: CronJobs run `kubectl scale` at each window's start in timeZone "
        f"{time_zone(plan)} (the zone of the plan's clock times: day.timezone or "
        f"--timezone, UTC by default), a scale-up one replica start-up ahead ({leads}), "
        f"rounded down to the minute{pool}",
        "each workload is created (and re-applied) at its first window's replicas; applied "
        "later in the day, `kubectl create job --from=cronjob/NAME-at-HHMM NAME-now` with the "
        "last job due sets the current ones",
        f"the jobs run {KUBECTL_IMAGE}: the Kubernetes project's own kubectl image, small and "
        "public, pinned (bitnami/kubectl's version tags were withdrawn from Docker Hub in "
        "2025); keep it within one minor version of your cluster"))
    return head + "".join(_over_peak(plan, targets)) + rest


def comment(text: str) -> str:
    """`text` as YAML comment lines of at most 100 characters."""
    return "".join(f"{line}\n" for line in textwrap.wrap(
        text, 100, initial_indent="# ", subsequent_indent="#   ", break_long_words=False,
        break_on_hyphens=False))


def _over_peak(plan: dict[str, Any], targets: list[Target]) -> list[str]:
    """A line per GPU pool whose scheduled GPUs go over the plan's peak for it: a schedule over
    several days folded onto one, or windows shorter than a replica start-up."""
    minutes = scheduled_minutes(plan, targets)
    peaks = {p.get("gpu"): p.get("peak_gpus") for p in plan.get("gpu_pools") or []}
    if not peaks:
        peaks = {t.gpu: max(t.replicas) * t.gpus_per_replica for t in targets}
    out = []
    for gpu, peak in peaks.items():
        held = sum((minutes[t.name] * t.gpus_per_replica for t in targets if t.gpu == gpu),
                   np.zeros(DAY_MIN, np.int64))
        if isinstance(peak, int) and int(held.max()) > peak:
            out.append(comment(f"note: the schedule holds up to {int(held.max())} {gpu} "
                               f"GPUs, over the plan's peak of {peak} (a day folded onto its "
                               "clock times, or windows shorter than a replica start-up)"))
    return out
