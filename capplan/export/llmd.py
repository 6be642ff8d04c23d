"""llm-d Helm values of a plan (`--export FILE.llm-d.yaml`): values for the llm-d-modelservice
chart (llm-d-incubation/llm-d-modelservice charts/llm-d-modelservice, v0.4.12: values.yaml,
values.schema.json, templates/_helpers.tpl) deploying the pools capplan.export.k8s.plan_pools
reads from the plan's vLLM lines (never recomputed).

The chart runs vLLM: `modelCommand: vllmServe` runs `vllm serve MODEL --port P
[--tensor-parallel-size T] [--data-parallel-size D --data-parallel-size-local L]
--served-model-name NAME ARGS` (T, D, L from the role's `parallelism`), and its routing sidecar
hands a P/D request from a decode pod to a prefill pod over vLLM's NixlConnector (`routing.proxy
.connector: nixlv2`). It deploys one decode pool and, with P/D, one prefill pool. So a plan sized
for SGLang or TensorRT-LLM, a plan of a pool per lane and a plan of several models are refused
(one line, naming the `.k8s.yaml` export, which runs them); every other plan is deployed as it
was sized:

- decode: the recommendation's pool, or the disaggregated layout's decode pool when it wins;
  prefill: that layout's prefill pool (else none);
- per role: replicas, `parallelism` (tensor, data, dataLocal, workers: the chart makes a replica
  a LeaderWorkerSet group of `workers` pods when `multinode` is true and gives each pod
  dataLocal x tensor GPUs) and the pod's GPUs, given explicitly (the chart keeps a given
  nvidia.com/gpu, as a layout with pipeline stages needs);
- a replica over hosts runs a shell in every pod of its group (`modelCommand: custom`): host 0's
  line on the leader (LWS_WORKER_INDEX 0), a worker's line on the others, as llm-d's wide-EP
  guide runs vLLM (guides/wide-ep-lws, manifests/modelserver/base/decode.yaml);
- the model volume (`modelArtifacts.size`, the emptyDir the pods download into) holds the
  checkpoint (the plan's `checkpoint_bytes`) with VOLUME_HEADROOM;
- pods whose traffic crosses hosts request RDMA and IPC_LOCK, as the manifests' do
  (capplan.export.k8s.network_needs).
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

import yaml

from capplan.errors import InputError
from capplan.export.k8s import (
    TOKEN_LINE,
    TOKEN_SECRET,
    Pool,
    Site,
    YamlDumper,
    network_needs,
    node_shell,
    plan_pools,
    split_env_words,
)
from capplan.models.engine import engine_profile
from capplan.units import GIB_BYTES

SERVICE_PORT, PROXY_PORT = 8000, 8200
"""routing.servicePort and routing.proxy.targetPort (the chart's defaults): a decode pod's
vLLM listens on the proxy's target port behind the routing sidecar, a prefill pod's on the
service port (templates/_helpers.tpl vllmPort). The chart sets a pod's port itself, so these
replace the launch lines' (capplan.plan.launch.DISAGG_PORTS, prefill 8100): each pod has its
own address, and the sidecar and the inference pool in front reach vLLM on the chart's."""
VLLM_PORTS = {"decode": PROXY_PORT, "prefill": SERVICE_PORT}
VOLUME_HEADROOM = 1.25
"""The model volume over the checkpoint's counted weights: the tensors the count leaves out
(DeepSeek-V3's multi-token-prediction layer and fp8 scales: ~690 GB on Hugging Face against
673 GB counted), the tokenizer and config files, and a file part-downloaded beside them."""
CHART_PARALLEL = ("--tensor-parallel-size", "--data-parallel-size", "--data-parallel-size-local")
"""The words vllmServe adds itself from `parallelism` (templates/_helpers.tpl
vllmServeModelCommand), so a role's args leave them out."""


def _volumes() -> list[dict[str, Any]]:
    """A role's volumes: the chart's own metrics volume (values.yaml: metrics-volume at
    /.config; a role's `volumes` replace the chart's list), and /dev/shm as in the manifests
    (NCCL and the engines' shared memory need more than the container runtime's 64 MiB)."""
    return [{"name": "metrics-volume", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]


def llmd_values(plan: dict[str, Any], site: Site | None = None) -> dict[str, Any]:
    """llm-d-modelservice values deploying the plan (module docstring); InputError (one line)
    for a plan the chart cannot run."""
    site = site or Site()
    pools = _chart_pools(plan)
    pd = pools[0].role == "prefill"
    decode, prefill = (pools[1], pools[0]) if pd else (pools[0], None)
    hf = plan.get("hf_id") or plan["model"]
    routing: dict[str, Any] = {"servicePort": SERVICE_PORT, "proxy": {"targetPort": PROXY_PORT}}
    if pd:
        routing["proxy"]["connector"] = "nixlv2"  # the sidecar's NIXL protocol (values.yaml)
    return {
        "modelArtifacts": {"name": hf, "uri": f"hf://{hf}", "authSecretName": TOKEN_SECRET,
                           "size": model_volume(plan)},
        "multinode": any(p.hosts > 1 for p in pools),
        "routing": routing,
        "decode": _role(decode, "decode", hf, site),
        "prefill": (_role(prefill, "prefill", hf, site) if prefill
                    else {"create": False, "replicas": 0}),
    }


def _chart_pools(plan: dict[str, Any]) -> list[Pool]:
    """The plan's vLLM pools, refused (one line, naming the alternative) when the chart cannot
    run them: several models, another engine than vLLM, a pool per lane."""
    from capplan.export.csv_export import model_plans

    one_llmd_model([str(m.get("model")) for m in model_plans(plan)])
    best = plan["recommendations"][0]
    engine = best.get("engine") or (plan.get("inputs") or {}).get("engine") or "vllm"
    vllm_only(engine, best.get("engine_profile") or engine)
    pools = plan_pools(plan, "vllm")
    if len(pools) > 1 and not pools[0].role:
        lanes = ", ".join(ln["lane"] for ln in plan["pools"]["separate"]["lanes"])
        raise InputError(f"an llm-d values file deploys one pool (decode, and prefill when the "
                         f"disaggregated layout wins); this plan has a pool per lane ({lanes}):"
                         f" {ALT} plan with pools: shared for llm-d values")
    return pools


ALT = "export .k8s.yaml, which runs it, or"
"""The alternative every refusal of the chart names."""


def one_llmd_model(models: list[str]) -> None:
    """An llm-d values file serves one model: InputError for a plan of several (checked before
    the plan runs; capplan.export.llmd refuses it again from the plan)."""
    if len(models) > 1:
        raise InputError(f"an llm-d values file serves one model; this plan has {len(models)} "
                         f"({', '.join(models)}): plan each model on its own for its llm-d "
                         "values, or export .k8s.yaml for all of them")


def vllm_only(engine: str, spec: str | None = None) -> None:
    """InputError (one line) for a plan sized for another engine than vLLM: the chart runs
    vLLM alone (EngineProfile.llm_d_chart; checked before the plan runs, from its engine, and
    again from the plan)."""
    from capplan.plan.launch import engine_label

    try:
        if engine_profile(engine).llm_d_chart:
            return
    except InputError:  # an engine capplan does not know: refused below, as another engine
        pass
    label = engine_label(engine, spec)
    raise InputError(
        f"llm-d-modelservice runs vLLM only (its vllmServe command and its routing sidecar's "
        f"NIXL connector); this plan was sized for {label}: {ALT} plan with --engine vllm for "
        "llm-d values")


def model_volume(plan: dict[str, Any]) -> str:
    """`modelArtifacts.size`: the checkpoint's bytes with VOLUME_HEADROOM, in whole GiB."""
    size = plan.get("checkpoint_bytes")
    if not size:
        raise InputError("this plan has no checkpoint_bytes (the checkpoint's size, which sizes "
                         "llm-d's model volume): plan it again with this capplan")
    return f"{math.ceil(size * VOLUME_HEADROOM / GIB_BYTES)}Gi"


def _role(p: Pool, role: str, served: str, site: Site) -> dict[str, Any]:
    """One role's values: replicas, parallelism, and a container running the pool's line."""
    gpus = math.ceil(p.gpus_per_replica / p.hosts)
    net = network_needs(p, site)
    resources = {k: {"nvidia.com/gpu": str(gpus), **net.get("resources", {})}
                 for k in ("limits", "requests")}
    env = [{"name": k, "value": v} for k, v in p.env.items()]
    if p.role:  # NixlConnector's side channel at the pod's own address (the chart's examples)
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    container: dict[str, Any] = {
        "name": "vllm", "image": p.image, **_command(p, role, served), "env": env,
        "resources": resources, "mountModelVolume": True,
        "volumeMounts": [{"name": "metrics-volume", "mountPath": "/.config"},
                         {"name": "dshm", "mountPath": "/dev/shm"}]}
    out: dict[str, Any] = {"create": True, "replicas": p.replicas,
                           "parallelism": _parallelism(p), "containers": [container],
                           "volumes": _volumes()}
    if net:
        container["extraConfig"] = {"securityContext": net["securityContext"]}
        out["annotations"] = {"capplan/network": p.network}
    return out


def _serve_words(p: Pool) -> list[str]:
    """The words of host 0's `vllm serve` (its environment words off)."""
    first = re.sub(r"^(\d+ x: )?(node 0: )?", "", p.text.split("\n")[0])
    serve = [c for c in split_env_words(first)[1].split(" && ") if c.startswith("vllm serve ")]
    return shlex.split(serve[-1])


def _flag(words: list[str], name: str) -> int | None:
    return int(words[words.index(name) + 1]) if name in words else None


def _parallelism(p: Pool) -> dict[str, int]:
    """The role's `parallelism`, from its line: tensor (--tensor-parallel-size), data
    (--data-parallel-size), dataLocal (--data-parallel-size-local, the whole DP on one host),
    workers (the hosts a replica spans: the chart's LeaderWorkerSet group size)."""
    w = _serve_words(p)
    dp = _flag(w, "--data-parallel-size") or 1
    return {"tensor": _flag(w, "--tensor-parallel-size") or 1, "data": dp,
            "dataLocal": _flag(w, "--data-parallel-size-local") or max(1, dp // p.hosts),
            "workers": p.hosts}


def _command(p: Pool, role: str, served: str) -> dict[str, Any]:
    """The container's command: vllmServe with the line's other words (one host), or a
    shell running host 0's or a worker's line by the pod's LWS_WORKER_INDEX (over hosts)."""
    if p.hosts == 1:
        words, out, i = _serve_words(p)[3:], [], 0
        while i < len(words):
            if words[i] in ("--host", "--port", *CHART_PARALLEL):
                i += 2
                continue
            out.append(words[i])
            i += 1
        return {"modelCommand": "vllmServe", "args": out}
    lines = re.sub(r"^\d+ x: ", "", p.text).split("\n")
    if len(lines) < 2:
        raise InputError(f"a replica of {p.gpus_per_replica} GPUs spans {p.hosts} hosts, but "
                         "this plan's launch line gives no command per host (a plan made "
                         "before capplan wrote them): plan it again for llm-d values")
    lead, work = (split_env_words(ln.split(": ", 1)[1])[1] for ln in lines[:2])
    cmds = []
    for cmd in node_shell(lead, work):
        cmd = re.sub(rf"--port {p.port}\b", f"--port {VLLM_PORTS[role]}", cmd)
        if "vllm serve " in cmd.split(" && ")[-1]:
            cmd += f" --served-model-name {shlex.quote(served)}"
        cmds.append(cmd)
    script = (f'if [ "${{LWS_WORKER_INDEX:-0}}" -eq 0 ]; then\n  {cmds[0]}\nelse\n'
              f"  {cmds[1]}\nfi")
    return {"modelCommand": "custom", "command": ["/bin/sh", "-c"], "args": [script]}


def llmd_text(plan: dict[str, Any]) -> str:
    """The `.llm-d.yaml` export: `llmd_values` under a title line and the token's Secret."""
    from capplan.plan.feature_flags import placeholder_note

    values = llmd_values(plan, Site.from_env())
    todo = placeholder_note(values)  # a draft head to name before the file can run
    head = ("# capplan: llm-d-modelservice values (" + (f"{todo}, then " if todo else "")
            + f"helm install ... -f this file)\n{TOKEN_LINE}")
    return head + yaml.dump(values, Dumper=YamlDumper, sort_keys=False)
