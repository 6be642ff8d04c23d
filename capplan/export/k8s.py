"""Kubernetes manifests of a plan (`--export FILE.k8s.yaml`), from the plan dict's launch lines
(never recomputed); the pools they run are also what the llm-d values (capplan/export/llmd.py)
deploy.

Per pool (the recommendation; each lane's pool when the plan asked for a pool per lane; the
prefill and decode pools when the disaggregated layout wins): a Deployment whose replicas are
the pool's replicas and whose container runs the pool's launch line with `nvidia.com/gpu` =
GPUs per replica, probes on the engine's `/health` route (startup: weights take minutes to
load), /dev/shm as a memory-backed emptyDir (NCCL and the engines' shared-memory transport need
more than the container runtime's 64 MiB default), a model cache volume (HF_HOME) and the
Hugging Face token from key HF_TOKEN of an optional Secret `hf-token`, the Secret and key the
llm-d chart reads (TOKEN_SECRET); a Service in front. A replica that needs
more GPUs than one node holds becomes a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1:
spec.replicas groups of spec.leaderWorkerTemplate.size pods, one node each; the multi-node launch
flags are the launch line's; its Service, `{name}-leader`, selects the leaders, and the set
makes its own headless Service `{name}`). TensorRT-LLM's LLM-API options file becomes a
ConfigMap. A winning disaggregated layout runs its pools as StatefulSets
under headless Services (replica i at `{name}-{i}.{name}`; LeaderWorkerSets over hosts, replica
i's leader at the same name) and the engine's router in front, over every replica
(`_front_end`; TensorRT-LLM's disaggregated server with its configuration as a ConfigMap).
The pods of a replica over hosts and of P/D pools, whose traffic crosses hosts, request an RDMA
device and IPC_LOCK (`network_needs`).
Every object of a file has a name of its own (`Names`: two lanes or models that read alike get
`-2`, `-3`...).

Object shapes: the Kubernetes API reference (apps/v1 Deployment and StatefulSet, v1 Service,
v1 ConfigMap) and the LeaderWorkerSet API (sigs.k8s.io/lws api/leaderworkerset/v1).
"""

from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from capplan.errors import InputError
from capplan.export.k8s_day import pool_kind
from capplan.models.engine import engine_profile
from capplan.plan.launch import HEAD, pd_front_port, pool_command
from capplan.plan.placement import one_replica

GPUS_PER_NODE = 8
RDMA_RESOURCE = "rdma/ib"
"""The RDMA device a pod whose traffic crosses hosts requests (one, in limits and requests),
as llm-d's guides do (guides/wide-ep-lws manifests/modelserver/coreweave: `rdma/ib: "1"`;
guides/pd-disaggregation: both pools). DeepEP's kernels between hosts are RDMA through NVSHMEM
(deepseek-ai/DeepEP README: internode and low-latency kernels; vllm tools/ep_kernels/README.md:
IBGDA for multi-node), NIXL moves the KV over UCX's RDMA transports (vLLM docs, NixlConnector
usage: UCX_TLS). The name is your RDMA device plugin's: CAPPLAN_RDMA_RESOURCE (or
`k8s_objects(rdma_resource=...)`) sets it, empty for none."""
IPC_LOCK = "IPC_LOCK"
"""The capability such a pod's container adds: RDMA registers (pins) memory, beyond the
container's memlock limit without it (llm-d guides/wide-ep-lws manifests/modelserver/base
decode.yaml adds it to the vLLM container)."""
TOKEN_SECRET, TOKEN_KEY = "hf-token", "HF_TOKEN"
"""The Secret and key both exports read the Hugging Face token from: llm-d-modelservice's
chart reads key HF_TOKEN of the Secret `modelArtifacts.authSecretName` (templates/_helpers.tpl
hfEnv), so the manifests read the same (`kubectl create secret generic hf-token
--from-literal=HF_TOKEN=...`)."""
HF_HOME = "/root/.cache/huggingface"
CONFIG_DIR = "/etc/capplan"


@dataclass(frozen=True)
class Pool:
    """One pool of identical replicas as the plan launches it."""

    name: str
    engine: str
    argv: list[str]
    replicas: int
    gpus_per_replica: int
    port: int
    files: dict[str, str] = field(default_factory=dict)
    gpu: str = ""
    nodes: int = 0
    """Hosts one replica spans as its launch lines give them ("node k: ..." lines); 0: the
    line gives none (a plan written before they did): its GPUs over GPUS_PER_NODE."""
    worker_argv: list[str] | None = None
    """The command of the replica's other hosts (LeaderWorkerSet workers)."""
    role: str = ""
    """A disaggregated pool's role (prefill, decode); "" for a pool that serves whole requests."""
    network: str = ""
    """The traffic of its pods that crosses hosts, as the plan costs it ("" when none): a
    replica over hosts (NCCL, DeepEP's all-to-all) or a P/D pool (NIXL's KV transfer)."""
    env: dict[str, str] = field(default_factory=dict)
    """Its containers' environment (`line_env`)."""
    text: str = ""
    """Its launch text as the plan gives it (one line, or "node k: ..." lines)."""
    image: str = ""
    """The engine's container image: its profile's (EngineProfile.image), the planned
    profile's for the planned engine, so that every flag of the line is in the image."""
    addressed: bool = False
    """Each replica needs its own address (a P/D pool behind SGLang's router, which names every
    prefill worker, its bootstrap host): a StatefulSet under a headless Service, replica i at
    `{name}-{i}.{name}` (Kubernetes DNS for StatefulSet pods)."""

    @property
    def hosts(self) -> int:
        """Hosts one replica spans: the launch lines' (`nodes`), else its GPUs over
        GPUS_PER_NODE."""
        return self.nodes or math.ceil(self.gpus_per_replica / GPUS_PER_NODE)


def _line_files(line: str) -> dict[str, str]:
    """The files a launch line reads, from its comments `# NAME.yaml: {YAML in flow style}`
    (capplan.plan.launch_multinode.with_files), as block YAML."""
    out = {}
    for part in line.split("  # ")[1:]:
        m = re.match(r"^([\w.-]+\.ya?ml): (\{.*\})\s*$", part.strip())
        if m:
            out[m.group(1)] = yaml.safe_dump(yaml.safe_load(m.group(2)), sort_keys=False)
    return out


_ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")
NOT_CARRIED = ("CUDA_VISIBLE_DEVICES", "VLLM_NIXL_SIDE_CHANNEL_HOST")
"""Environment words of a launch line a pod does not take: the device plugin assigns its GPUs,
and a P/D pod advertises its own address (`_kv_env`)."""


def split_env_words(cmd: str) -> tuple[dict[str, str], str]:
    """The NAME=VALUE words that start a shell command, and each command after `&&` (DeepEP's
    VLLM_ALL2ALL_BACKEND, the NIXL side channel's port), and the command without them (a
    container's `env`, not its words: `exec NAME=VALUE cmd` would run a program of that
    name)."""
    env: dict[str, str] = {}
    parts = []
    for part in cmd.split(" && "):
        words = shlex.split(part, comments=True)
        while words and _ENV_WORD.match(words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        parts.append(shlex.join(words))
    return env, " && ".join(parts)


def line_env(text: str) -> dict[str, str]:
    """The environment a pool's containers run with: its launch text's first command's
    NAME=VALUE words, but NOT_CARRIED."""
    first = re.sub(r"^(\d+ x: )?(node 0: )?", "", text.split("\n")[0])
    return {k: v for k, v in split_env_words(first)[0].items() if k not in NOT_CARRIED}


def _argv(line: str) -> tuple[list[str], int]:
    """A launch line's words without environment assignments (`line_env` holds them), and its
    --port / --port value."""
    words = shlex.split(pool_command(line), comments=True)
    while words and _ENV_WORD.match(words[0]):
        words.pop(0)
    port = 8000
    for i, w in enumerate(words[:-1]):
        if w == "--port":
            port = int(words[i + 1])
    return words, port


# LeaderWorkerSet sets these in every pod of a group (sigs.k8s.io/lws, api/leaderworkerset/v1:
# LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX); Kubernetes expands $(VAR) in a
# container's command from its environment.
_LEADER, _INDEX = "$(LWS_LEADER_ADDRESS)", "$(LWS_WORKER_INDEX)"


def _node_argv(text: str) -> tuple[list[str], list[str] | None, int, int]:
    """Leader and worker commands of a launch text (one line, or "node k: ..." lines of a
    replica over hosts, capplan.plan.launch.node_commands), its port and its host count."""
    lines = text.split("\n")
    lines[0] = pool_command(lines[0])  # a P/D pool's replica count
    if lines[0].startswith("any node: "):
        raise InputError("TensorRT-LLM over several hosts runs under MPI (mpirun across "
                         "hosts), which these manifests do not set up: export the SGLang or "
                         "vLLM lines (--engine), or launch its line by hand")
    if len(lines) == 1:
        argv, port = _argv(lines[0])
        return argv, None, port, 0
    lead, work = (split_env_words(ln.split(": ", 1)[1])[1] for ln in lines[:2])
    port = _argv(lead.split("&&")[-1])[1]
    if " --node-rank 1 " in f"{work} ":  # SGLang: each worker's rank is its index
        work = work.replace("--node-rank 1", f"--node-rank {_INDEX}")
        return (_argv(lead.replace(HEAD, _LEADER))[0], _argv(work.replace(HEAD, _LEADER))[0],
                port, len(lines))
    lead_sh, work_sh = node_shell(lead, work)
    leader = ["sh", "-c", lead_sh] if "&&" in lead else _argv(lead.replace(HEAD, _LEADER))[0]
    return leader, ["sh", "-c", work_sh], port, len(lines)


def node_shell(lead: str, work: str) -> tuple[str, str]:
    """A vLLM replica over hosts as shell commands of LeaderWorkerSet pods (host 0's, a
    worker's; environment words already off): a shell computes a worker's first data-parallel
    rank (its index x the local ranks), every pod reaches host 0 at $LWS_LEADER_ADDRESS, and on
    Ray the leader starts the cluster before it serves."""
    work = re.sub(r"--data-parallel-start-rank (\d+)",
                  lambda m: f"--data-parallel-start-rank $((LWS_WORKER_INDEX * {m.group(1)}))",
                  work)
    lead = lead if "&&" in lead else f"exec {lead}"
    work = work if work.startswith("ray ") else f"exec {work}"
    return lead.replace(HEAD, "$LWS_LEADER_ADDRESS"), work.replace(HEAD, "$LWS_LEADER_ADDRESS")


NAME_LEN = 40
"""Longest object name before a `-N` that keeps it apart: every name is a DNS-1123 label
(Services: a DNS-1035 label, a letter first), and the names Kubernetes derives from it stay
label values of at most 63 characters (a StatefulSet's pods carry `controller-revision-hash:
{name}-{10 characters}`; a LeaderWorkerSet's group i is StatefulSet `{name}-{i}`; the leaders'
Service is `{name}-leader`)."""
DERIVED = ("", "-config", "-leader")
"""The names an object name also takes: its ConfigMap and its leaders' Service."""


@dataclass
class Names:
    """The object names of one manifest file: each pool and front end gets its own, also when
    two lanes (`chat_ui`, `Chat.UI`) or two models read alike; `kubectl apply` would keep one
    of two objects of a kind and name."""

    taken: set[str] = field(default_factory=set)

    def take(self, *parts: str) -> str:
        """A free name from `parts`: lower case, other characters than [a-z0-9-] as `-`, a
        letter first, at most NAME_LEN characters, then `-2`, `-3`... while it or one of its
        DERIVED names is taken."""
        base = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-") or "capplan"
        base = (base if base[0].isalpha() else f"m-{base}")[:NAME_LEN].strip("-")
        name, n = base, 1
        while any(name + d in self.taken for d in DERIVED):
            n += 1
            name = f"{base[:NAME_LEN - len(str(n)) - 1].strip('-')}-{n}"
        self.taken.update(name + d for d in DERIVED)
        return name


def engine_image(plan: dict[str, Any], engine: str) -> str:
    """The container image of `engine`'s lines in this plan: the planned profile's for the
    planned engine (`--engine vllm@0.6` runs a 0.6 image), the engine's newest profile's for
    the others, whose lines are built from it (capplan.plan.launch.deepep_launch)."""
    best = plan["recommendations"][0]
    planned = engine_profile(best.get("engine_profile") or best.get("engine") or engine)
    return (planned if planned.name == engine else engine_profile(engine)).image


def _rec_pool(name: str, r: dict[str, Any], engine: str, image: str) -> Pool:
    flags = r["engine_flags"]
    argv, worker, port, nodes = _node_argv(flags[engine])
    files = {k.split(":", 2)[2]: v for k, v in flags.items() if k.startswith(f"file:{engine}:")}
    reps = max(1, int(r["replicas"]))
    pool = Pool(name, engine, argv, reps, int(r["gpus_total"]) // reps, port, files,
                r.get("gpu", ""), nodes, worker, image=image, env=line_env(flags[engine]),
                text=flags[engine])
    if pool.hosts == 1:
        return pool
    layout = f" ({r['layout']})" if r.get("layout") else ""
    return replace(pool, network=f"a replica spans {pool.hosts} hosts{layout}: its NCCL and "
                                 "expert all-to-all (DeepEP) traffic crosses them, planned at "
                                 "the GPU catalog's network rate")


def plan_pools(plan: dict[str, Any], engine: str | None = None,
               names: Names | None = None) -> list[Pool]:
    """The pools a cluster runs for this plan, named apart from `names`' (and added to it)."""
    names = names if names is not None else Names()
    best = plan["recommendations"][0]
    engine = engine or best.get("engine") or plan.get("inputs", {}).get("engine") or "vllm"
    model = (plan.get("model") or "model").split("/")[-1]
    from capplan.export.layout import DISAGGREGATED, SEPARATE, recommended_layout

    image = engine_image(plan, engine)
    d = plan.get("disaggregated") or {}
    link = d.get("kv_link") or "the GPU catalog's network rate"
    layout = recommended_layout(plan)  # as every export says it
    if layout == DISAGGREGATED and d.get("launch", {}).get(f"{engine}_prefill"):
        out = []
        for role in ("prefill", "decode"):
            line = d["launch"][f"{engine}_{role}"]
            # its first replica's hosts (HOSTn) as one replica's placeholders (NODEk_IP)
            text = one_replica(line)
            argv, worker, port, nodes = _node_argv(text)
            reps = max(1, int(d[role]["replicas"]))
            out.append(Pool(names.take(model, role), engine, argv, reps,
                            int(d[role]["gpus_total"]) // reps, port, _line_files(line),
                            d[role]["gpu"], nodes, worker, role=role, image=image,
                            env=line_env(line), text=text,
                            network=f"NIXL's KV transfer between pools, planned at {link}"
                            + (f"; a replica spans {nodes} hosts" if nodes > 1 else ""),
                            addressed=engine_profile(engine).pd.front_end_exported))
        return out
    if layout == SEPARATE:
        lanes = plan["pools"]["separate"]["lanes"]
        return [_rec_pool(names.take(model, ln["lane"]), ln, engine, image) for ln in lanes]
    return [_rec_pool(names.take(model), best, engine, image)]


def _probe(port: int, period_s: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": port}, "periodSeconds": period_s,
            "failureThreshold": failures, "timeoutSeconds": 5}


def _kv_env(p: Pool) -> list[dict[str, Any]]:
    """A P/D pod's KV handshake advertised at the pod's own address, for an engine that
    advertises it in a variable (PdServing.kv_host_env; vLLM's NIXL side channel: the launch
    line's VLLM_NIXL_SIDE_CHANNEL_HOST, a placeholder there; default localhost, which a decode
    pod would look for on itself): the downward API's status.podIP."""
    name = engine_profile(p.engine).pd.kv_host_env if p.role else None
    if not name:
        return []
    return [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


@dataclass(frozen=True)
class Site:
    """What the manifests take from your cluster."""

    model_cache_claim: str | None = None
    """A PersistentVolumeClaim for the model cache (HF_HOME); None: an emptyDir."""
    rdma_resource: str | None = RDMA_RESOURCE
    """The RDMA device pods whose traffic crosses hosts request; None: none."""

    def __post_init__(self) -> None:
        r = self.rdma_resource
        if r is not None and not re.fullmatch(
                r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", r):
            raise InputError(f"RDMA resource {r!r}: expected an extended resource name such "
                             f"as {RDMA_RESOURCE} (DOMAIN/NAME, what `kubectl describe node` "
                             "lists under Allocatable), or empty for none")

    @classmethod
    def from_env(cls) -> Site:
        """The site CAPPLAN_RDMA_RESOURCE names (unset: RDMA_RESOURCE; empty: none)."""
        r = os.environ.get("CAPPLAN_RDMA_RESOURCE", RDMA_RESOURCE).strip()
        try:
            return cls(rdma_resource=r or None)
        except InputError as e:
            raise InputError(f"CAPPLAN_RDMA_RESOURCE: {e}") from None


def network_needs(p: Pool, site: Site) -> dict[str, Any]:
    """What a pod of a pool whose traffic crosses hosts adds to its container: IPC_LOCK, and
    one RDMA device (Site.rdma_resource); nothing for another pool. Host networking
    (hostNetwork: true) is the alternative where the cluster has no RDMA device plugin."""
    if not p.network:
        return {}
    rdma = {site.rdma_resource: "1"} if site.rdma_resource else {}
    return {"securityContext": {"capabilities": {"add": [IPC_LOCK]}}, "resources": rdma}


def _network_note(p: Pool, site: Site) -> str:
    """The workload's `capplan/network` annotation: the traffic that crosses hosts and what
    the pods request for it."""
    asked = (f"one {site.rdma_resource} device" if site.rdma_resource else "no RDMA device")
    return (f"{p.network}. It needs RDMA (InfiniBand or RoCE; over TCP it runs far slower "
            f"than planned): each pod requests {asked} and {IPC_LOCK}; set "
            "CAPPLAN_RDMA_RESOURCE to your RDMA device plugin's resource (empty: none), or "
            "run the pods with hostNetwork: true")


def _pod_spec(p: Pool, gpus: int, site: Site, config: str | None,
              worker: bool = False) -> dict[str, Any]:
    """A pod of the pool; `worker`: a LeaderWorkerSet worker (its host's ranks, no server)."""
    cache_claim = site.model_cache_claim
    words = p.worker_argv if worker and p.worker_argv else p.argv
    argv = [f"{CONFIG_DIR}/{w}" if w in p.files else w for w in words]
    net = network_needs(p, site)
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"},
              {"name": "model-cache", "mountPath": HF_HOME}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        {"name": "model-cache", **({"persistentVolumeClaim": {"claimName": cache_claim}}
                                   if cache_claim else {"emptyDir": {}})}]
    if config:
        mounts.append({"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True})
        volumes.append({"name": "engine-config", "configMap": {"name": config}})
    container = {
        "name": p.engine, "image": p.image, "command": argv,
        "ports": [{"name": "http", "containerPort": p.port, "protocol": "TCP"}],
        "env": [{"name": "HF_HOME", "value": HF_HOME},
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
                    "name": TOKEN_SECRET, "key": TOKEN_KEY, "optional": True}}},
                *({"name": k, "value": v} for k, v in p.env.items()), *_kv_env(p)],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                      "requests": {"nvidia.com/gpu": str(gpus)}},
        **({"securityContext": net["securityContext"]} if net else {}),
        # weights load for minutes: the startup probe allows 30 min before liveness applies
        "startupProbe": _probe(p.port, 10, 180),
        "readinessProbe": _probe(p.port, 10, 3),
        "livenessProbe": _probe(p.port, 30, 5),
        "volumeMounts": mounts,
    }
    for k in ("limits", "requests"):
        container["resources"][k].update(net.get("resources", {}))
    if worker and p.worker_argv:  # a worker host serves no HTTP: the leader's probes stand
        for k in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
            del container[k]
    return {"containers": [container], "volumes": volumes}


def k8s_objects(plan: dict[str, Any], *, engine: str | None = None,
                model_cache_claim: str | None = None,
                rdma_resource: str | None = RDMA_RESOURCE) -> list[dict[str, Any]]:
    """Deployments (or StatefulSets, LeaderWorkerSets), Services and ConfigMaps of the plan's
    pools and front end; a plan of several models runs each model's. Every object's name is
    its own (`Names`). `model_cache_claim`, `rdma_resource`: Site's."""
    return _manifest(plan, engine, Site(model_cache_claim, rdma_resource))[0]


def _manifest(plan: dict[str, Any], engine: str | None, site: Site
              ) -> tuple[list[Any], list[Any], list[Any]]:
    """`k8s_objects`' objects, a day plan's schedule last (capplan/export/k8s_day.py: each
    scheduled workload created at its first window's replicas), the workloads it scales and
    those it leaves at their peak size (k8s_day.Fixed)."""
    from capplan.export.csv_export import model_plans
    from capplan.export.k8s_day import (
        at_first_window,
        day_targets,
        fixed_workloads,
        schedule_objects,
    )

    names = Names()
    objs: list[dict[str, Any]] = []
    targets, fixed = [], []
    for sub in model_plans(plan):
        pools = plan_pools(sub, engine, names)
        mine = day_targets(sub, pools)
        pools = at_first_window(pools, mine)
        for p in pools:
            objs += _pool_objects(p, site)
        objs += _front_end(sub, pools, names)
        targets += mine
        held = fixed_workloads(sub, [(pool_kind(p), p.name, p.replicas) for p in pools])
        fixed += [held] if not mine and held is not None else []
    return objs + schedule_objects(plan, targets), targets, fixed


def _pool_objects(p: Pool, site: Site) -> list[dict[str, Any]]:
    """A pool's ConfigMap (the files its line reads), its workload and its Service."""
    objs: list[dict[str, Any]] = []
    labels = {"app.kubernetes.io/name": p.name, "app.kubernetes.io/part-of": "capplan"}
    meta = {"name": p.name, "labels": labels,
            "annotations": {"capplan/gpu": p.gpu, "capplan/gpus-per-replica":
                            str(p.gpus_per_replica), "capplan/engine": p.engine,
                            **({"capplan/network": _network_note(p, site)} if p.network
                               else {})}}
    config = None
    if p.files:
        config = f"{p.name}-config"
        objs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": config, "labels": labels}, "data": dict(p.files)})
    nodes = p.hosts
    gpus = p.gpus_per_replica if nodes == 1 else math.ceil(p.gpus_per_replica / nodes)
    template = {"metadata": {"labels": labels},
                "spec": _pod_spec(p, gpus, site, config)}
    workers = {"metadata": {"labels": labels},
               "spec": _pod_spec(p, gpus, site, config, worker=True)}
    serving = labels if nodes == 1 or not p.worker_argv else {
        **labels, "leaderworkerset.sigs.k8s.io/worker-index": "0"}  # the leader serves
    kind = pool_kind(p)
    if kind == "StatefulSet":  # replica i at {name}-{i}.{name}
        objs.append({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
                     "spec": {"replicas": p.replicas, "serviceName": p.name,
                              "podManagementPolicy": "Parallel",
                              "selector": {"matchLabels": labels}, "template": template}})
    elif kind == "Deployment":
        objs.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                     "spec": {"replicas": p.replicas,
                              "selector": {"matchLabels": labels}, "template": template}})
    else:
        objs.append({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                     "metadata": meta, "spec": {
                         "replicas": p.replicas, "startupPolicy": "LeaderCreated",
                         "leaderWorkerTemplate": {"size": nodes, "restartPolicy":
                                                  "RecreateGroupOnPodRestart",
                                                  "leaderTemplate": template,
                                                  "workerTemplate": workers}}})
    # a LeaderWorkerSet makes its own headless Service, named as it is, under which its
    # pods resolve ({name}-{i}.{name}, LWS_LEADER_ADDRESS); a Service of that name would
    # stop it (sigs.k8s.io/lws CreateHeadlessServiceIfNotExists): the leaders' is apart
    objs.append(_service(p.name if nodes == 1 else f"{p.name}-leader", labels, serving,
                         p.port, headless=nodes == 1 and p.addressed))
    return objs


def _service(name: str, labels: dict[str, str], selector: dict[str, str], port: int,
             headless: bool = False) -> dict[str, Any]:
    """The ClusterIP Service of a pool or front end on its http port; `headless`: no cluster
    IP, every pod its own DNS name (a StatefulSet's `{name}-{i}.{name}`)."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
            "spec": {"type": "ClusterIP", "selector": selector,
                     **({"clusterIP": "None"} if headless else {}),
                     "ports": [{"name": "http", "port": port, "targetPort": "http",
                                "protocol": "TCP"}]}}


def _bootstrap_port(p: Pool) -> int | None:
    """The KV handshake port a SGLang prefill replica's bootstrap server listens on, which its
    router names after the replica's URL (as the plan's router line does): its line's
    --disaggregation-bootstrap-port, else SGLang's default (PdServing.kv_handshake); None for the
    other engines, whose front ends take none (PdServing.router_takes_bootstrap_port)."""
    pd = engine_profile(p.engine).pd
    if not pd.router_takes_bootstrap_port or pd.kv_handshake is None:
        return None
    words = p.argv
    flag = "--disaggregation-bootstrap-port"
    return int(words[words.index(flag) + 1]) if flag in words else pd.kv_handshake.port


def _front_end(plan: dict[str, Any], pools: list[Pool], names: Names) -> list[dict[str, Any]]:
    """The router in front of addressed P/D pools (PdServing.front_end_exported): a Deployment
    of one pod running the plan's front end over every replica's own address, and its Service
    (the port clients use); nothing when the pools are not addressed. A LeaderWorkerSet's
    replica i is addressed at its leader, `{name}-{i}.{name}` under the set's own headless
    Service, as a StatefulSet's pod is."""
    from capplan.plan.launch_multinode import front_line

    pre = [p for p in pools if p.addressed and p.role == "prefill"]
    dec = [p for p in pools if p.addressed and p.role == "decode"]
    if not (pre and dec):
        return []
    engine = pre[0].engine
    port = pd_front_port(engine)  # where the plan's router line listens
    line = front_line(engine, *[[(f"{p.name}-{i}.{p.name}", p.port) for i in range(p.replicas)]
                                for p in (pre[0], dec[0])], routers=("round-robin", "round-robin"),
                      port=port, bootstrap=[_bootstrap_port(pre[0])] * pre[0].replicas)
    name = names.take((plan.get("model") or "model").split("/")[-1], "router")
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "capplan"}
    probe = {"tcpSocket": {"port": port}, "periodSeconds": 10}
    files = _line_files(line)  # TensorRT-LLM's disagg_config.yaml
    words = [f"{CONFIG_DIR}/{w}" if w in files else w for w in shlex.split(line, comments=True)]
    image = engine_profile(engine).pd.router_image or pre[0].image
    container: dict[str, Any] = {"name": "router", "image": image, "command": words,
                                 "ports": [{"name": "http", "containerPort": port,
                                            "protocol": "TCP"}],
                                 "readinessProbe": probe}
    pod: dict[str, Any] = {"containers": [container]}
    config = []
    if files:
        config = [{"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": f"{name}-config", "labels": labels}, "data": files}]
        container["volumeMounts"] = [{"name": "router-config", "mountPath": CONFIG_DIR,
                                      "readOnly": True}]
        pod["volumes"] = [{"name": "router-config", "configMap": {"name": f"{name}-config"}}]
    return config + [{"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": name, "labels": labels},
             "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                      "template": {"metadata": {"labels": labels}, "spec": pod}}},
            _service(name, labels, labels, port)]


TOKEN_LINE = (f"# the Hugging Face token (a gated model; the llm-d chart requires the Secret): "
              f"kubectl create secret generic {TOKEN_SECRET} "
              f"--from-literal={TOKEN_KEY}=<your token>\n")


class YamlDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # noqa: ARG002 - PyYAML's hook
        return True  # labels repeat as text, not as &id001 anchors


def k8s_text(plan: dict[str, Any]) -> str:
    """The `.k8s.yaml` export: every object of `k8s_objects`, under a title line (and a day
    plan's schedule lines)."""
    from capplan.export.csv_export import rates_title
    from capplan.export.k8s_day import schedule_head

    site = Site.from_env()
    objs, targets, fixed = _manifest(plan, None, site)
    from capplan.plan.feature_flags import placeholder_note

    todo = placeholder_note(objs)  # a draft head to name before the file can run
    head = (f"# capplan: {rates_title(plan)}; " + (
        f"{todo}, then kubectl apply -f this file" if todo else "kubectl apply -f this file")
        + f"\n{TOKEN_LINE}")
    head += schedule_head(plan, targets, fixed)
    if any("capplan/network" in o["metadata"].get("annotations", {}) for o in objs):
        head += ("# RDMA: pods whose traffic crosses hosts request "
                 f"{site.rdma_resource or 'no RDMA device'} and {IPC_LOCK} (their "
                 "capplan/network annotation says why; CAPPLAN_RDMA_RESOURCE names yours)\n")
    return head + yaml.dump_all(objs, Dumper=YamlDumper, sort_keys=False)
