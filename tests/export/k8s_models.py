"""Kubernetes objects checked with the official client's models (kubernetes.client: every field
typed, required fields enforced), round-tripped so that a misspelled or unknown field fails;
a LeaderWorkerSet (a CRD the client has no model of) against its API's field names."""

from __future__ import annotations

import json
from typing import Any

import pytest

k8s = pytest.importorskip("kubernetes.client", reason="the test extra installs kubernetes")

RBAC = "rbac.authorization.k8s.io/v1"
MODELS = {("apps/v1", "Deployment"): "V1Deployment", ("v1", "Service"): "V1Service",
          ("v1", "ConfigMap"): "V1ConfigMap", ("apps/v1", "StatefulSet"): "V1StatefulSet",
          ("batch/v1", "CronJob"): "V1CronJob", ("v1", "ServiceAccount"): "V1ServiceAccount",
          (RBAC, "Role"): "V1Role", (RBAC, "RoleBinding"): "V1RoleBinding"}
LWS_SPEC = {"replicas", "leaderWorkerTemplate", "startupPolicy", "rolloutStrategy",
            "networkConfig"}
LWS_TEMPLATE = {"size", "leaderTemplate", "workerTemplate", "restartPolicy", "subGroupPolicy"}
"""Fields of LeaderWorkerSetSpec and LeaderWorkerTemplate (sigs.k8s.io/lws
api/leaderworkerset/v1/leaderworkerset_types.go)."""


def as_model(obj: dict[str, Any], model: str) -> Any:
    api = k8s.ApiClient()
    m = api.deserialize(json.dumps(obj), model, "application/json")
    assert api.sanitize_for_serialization(m) == obj, f"{model}: fields lost in the round trip"
    return m


def validate(doc: dict[str, Any]) -> Any:
    key = (doc["apiVersion"], doc["kind"])
    if key == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"):
        spec = doc["spec"]
        assert set(spec) <= LWS_SPEC and set(spec["leaderWorkerTemplate"]) <= LWS_TEMPLATE
        as_model(doc["metadata"], "V1ObjectMeta")
        for t in ("leaderTemplate", "workerTemplate"):
            as_model(spec["leaderWorkerTemplate"][t], "V1PodTemplateSpec")
        return doc
    return as_model(doc, MODELS[key])


def pod_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a Deployment, StatefulSet or LeaderWorkerSet (none of others)."""
    spec = doc.get("spec") or {}
    if "leaderWorkerTemplate" in spec:
        t = spec["leaderWorkerTemplate"]
        return [t["leaderTemplate"], t["workerTemplate"]]
    return [spec["template"]] if "template" in spec else []


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for t in pod_templates(doc) for c in t["spec"]["containers"]]
