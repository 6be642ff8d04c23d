"""`--export FILE.k8s.yaml` / `FILE.llm-d.yaml`: validated as Kubernetes objects by the official
client's models (kubernetes.client: every field typed, required fields enforced), round-tripped
so that a misspelled or unknown field fails, and checked against the plan's GPUs and replicas."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.export.k8s_models import validate as _validate
from tests.plan.engine_args import parse_line


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from click.testing import CliRunner

    from capplan.cli import cli

    d = tmp_path_factory.mktemp("k8s")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAPPLAN_HOME", str(d))
        res = CliRunner().invoke(cli, [
            "recommend", "--model", "llama-3.1-70b", "--rate", "30", "--input-len", "1000",
            "--output-len", "200", "--gpu", "h100-sxm", "--engine", "trtllm",
            "--weight-dtype", "fp8", "--kv-dtype", "fp8", "--verify-top", "0", "--no-disagg",
            "--tp", "4",
            "--export", str(d / "p.k8s.yaml"), "--format", "json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    return plan, list(yaml.safe_load_all((d / "p.k8s.yaml").read_text()))


def test_manifests_are_kubernetes_objects_with_the_plans_gpus(exported) -> None:
    plan, docs = exported
    best = plan["recommendations"][0]
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ConfigMap", "Deployment", "Service"], kinds
    cm, dep, svc = (_validate(d) for d in docs)
    assert dep.spec.replicas == best["replicas"]
    pod = dep.spec.template.spec
    c = pod.containers[0]
    gpus = best["gpus_total"] // best["replicas"]
    assert c.resources.limits["nvidia.com/gpu"] == str(gpus)
    # the container runs the plan's TensorRT-LLM line, the options file from the ConfigMap
    line = best["engine_flags"]["trtllm"]
    _prog, pos, f, _env = parse_line(shlex.join(c.command))
    assert pos[0].endswith("-FP8") and int(f["--tp_size"]) == best["tp"]
    opts = f["--extra_llm_api_options"]
    mount = next(m for m in c.volume_mounts if m.name == "engine-config")
    assert opts.startswith(mount.mount_path + "/")
    assert yaml.safe_load(cm.data[opts.rsplit("/", 1)[1]]) == {"kv_cache_config": {"dtype": "fp8"}}
    assert shlex.join(c.command).replace(mount.mount_path + "/", "") == line.split("  #")[0]
    port = int(f["--port"])
    for probe in (c.readiness_probe, c.liveness_probe, c.startup_probe):
        assert probe.http_get.path == "/health" and probe.http_get.port == port
    shm = next(v for v in pod.volumes if v.name == "dshm")
    assert shm.empty_dir.medium == "Memory"
    assert {m.mount_path for m in c.volume_mounts} >= {"/dev/shm", "/root/.cache/huggingface"}
    assert svc.spec.selector == dep.spec.selector.match_labels
    assert svc.spec.ports[0].port == port


def test_llmd_values_carry_the_vllm_line(run_cli, tmp_path: Path) -> None:
    out = tmp_path / "p.llm-d.yaml"
    plan = run_cli("recommend", "--model", "llama-3.1-70b", "--rate", "30", "--input-len",
                   "1000", "--output-len", "200", "--gpu", "h100-sxm", "--weight-dtype", "fp8",
                   "--kv-dtype", "fp8", "--verify-top", "0", "--no-disagg", "--tp", "4",
                   "--export", str(out), "--format", "json").json()
    values = yaml.safe_load(out.read_text())
    best = plan["recommendations"][0]
    dec = values["decode"]
    assert dec["replicas"] == best["replicas"] and values["prefill"]["replicas"] == 0
    c = dec["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == str(best["gpus_total"] //
                                                               best["replicas"])
    # the chart's vllmServe adds --tensor-parallel-size from the role's parallelism
    tp = ["--tensor-parallel-size", str(dec["parallelism"]["tensor"])]
    _prog, _pos, f, _env = parse_line(shlex.join(["vllm", "serve", "M", *tp, *c["args"]]))
    v = parse_line(best["engine_flags"]["vllm"])[2]
    assert f == {k: x for k, x in v.items() if k not in ("--host", "--port")}
    assert values["modelArtifacts"]["uri"] == f"hf://{plan['hf_id']}"


def test_a_replica_over_one_node_is_a_leaderworkerset() -> None:
    from capplan.export.k8s import k8s_objects

    line = ("vllm serve meta-llama/Llama-3.1-405B-Instruct --tensor-parallel-size 8 "
            "--pipeline-parallel-size 2 --max-num-seqs 64 --max-num-batched-tokens 4096 "
            "--gpu-memory-utilization 0.9 --max-model-len 8192 --host 0.0.0.0 --port 8000")
    plan = {"model": "llama-3.1-405b", "recommendations": [{
        "gpu": "h100-sxm", "replicas": 3, "gpus_total": 48, "engine": "vllm",
        "engine_flags": {"vllm": line}}]}
    (lws, svc) = k8s_objects(plan)
    _validate(lws)
    _validate(svc)
    assert lws["kind"] == "LeaderWorkerSet" and lws["spec"]["replicas"] == 3
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 2  # 16 GPUs per replica over 8-GPU nodes
    limit = tmpl["workerTemplate"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limit["nvidia.com/gpu"]) * tmpl["size"] == 16


def test_unknown_export_suffix_is_one_line_exit_2(run_cli, tmp_path: Path) -> None:
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--rate", "1", "--gpu", "h100-sxm",
                  "--verify-top", "0", "--export", str(tmp_path / "x.yaml"))
    assert res.exit_code == 2 and ".k8s.yaml" in res.stderr and res.stderr.count("\n") == 1


def test_the_validation_can_fail(exported) -> None:
    """A misspelled field or a wrong type is caught (the check is not vacuous)."""
    _, docs = exported
    dep = next(d for d in docs if d["kind"] == "Deployment")
    typo = {**dep, "spec": {**dep["spec"], "replica": 2}}
    with pytest.raises((AssertionError, ValueError)):
        _validate(typo)
    bad = json.loads(json.dumps(dep))
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises((AssertionError, ValueError)):
        _validate(bad)


def _multinode_plan(engine: str, line: str) -> dict[str, Any]:
    return {"model": "deepseek-v3", "recommendations": [{
        "gpu": "h200", "replicas": 2, "gpus_total": 32, "engine": engine,
        "engine_flags": {engine: line}}]}


def test_a_replica_over_hosts_runs_each_hosts_command_in_its_pod() -> None:
    from capplan.export.k8s import k8s_objects

    base = ("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 16 "
            "--enable-dp-attention --dp 16 --ep-size 16 --host 0.0.0.0 --port 30000 "
            "--nnodes 2 --node-rank {k} --dist-init-addr NODE0_IP:5000")
    text = "\n".join(f"node {k}: " + base.format(k=k) for k in range(2))
    lws, svc = k8s_objects(_multinode_plan("sglang", text))
    _validate(lws)
    _validate(svc)
    t = lws["spec"]["leaderWorkerTemplate"]
    assert t["size"] == 2
    lead = t["leaderTemplate"]["spec"]["containers"][0]
    work = t["workerTemplate"]["spec"]["containers"][0]
    # LeaderWorkerSet sets LWS_LEADER_ADDRESS and LWS_WORKER_INDEX; Kubernetes expands $(VAR)
    _, _, lw, _ = parse_line(shlex.join(lead["command"]))
    _, _, ww, _ = parse_line(shlex.join(work["command"]))
    assert lw["--node-rank"] == "0" and ww["--node-rank"] == "$(LWS_WORKER_INDEX)"
    assert lw["--dist-init-addr"] == ww["--dist-init-addr"] == "$(LWS_LEADER_ADDRESS):5000"
    assert "readinessProbe" in lead and "readinessProbe" not in work  # workers serve no HTTP
    assert int(lead["resources"]["limits"]["nvidia.com/gpu"]) == 8
    assert svc["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"


def test_vllm_workers_compute_their_first_rank_and_mpi_lines_are_refused() -> None:
    from capplan.errors import InputError
    from capplan.export.k8s import k8s_objects

    serve = ("vllm serve m --tensor-parallel-size 1 --data-parallel-size 16 --port 8000 "
             "--data-parallel-size-local 8 --data-parallel-address NODE0_IP "
             "--data-parallel-rpc-port 13345")
    text = f"node 0: {serve}\nnode 1: {serve} --data-parallel-start-rank 8 --headless"
    lws, _ = k8s_objects(_multinode_plan("vllm", text))
    work = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    assert work["command"][:2] == ["sh", "-c"]
    assert "--data-parallel-start-rank $((LWS_WORKER_INDEX * 8))" in work["command"][2]
    assert "--data-parallel-address $LWS_LEADER_ADDRESS" in work["command"][2]
    with pytest.raises(InputError, match="MPI"):
        k8s_objects(_multinode_plan("trtllm", "any node: mpirun -H NODE0_IP:8,NODE1_IP:8 -np 16 "
                                    "trtllm-llmapi-launch trtllm-serve m --port 8000"))


def test_a_disaggregated_pool_over_hosts_is_read_past_its_replica_count() -> None:
    from capplan.export.k8s import _node_argv

    text = ("2 x: node 0: python -m sglang.launch_server --tp 16 --port 8200 --nnodes 2 "
            "--node-rank 0 --dist-init-addr NODE0_IP:5000\nnode 1: python -m "
            "sglang.launch_server --tp 16 --port 8200 --nnodes 2 --node-rank 1 "
            "--dist-init-addr NODE0_IP:5000")
    leader, worker, port, hosts = _node_argv(text)
    assert (port, hosts) == (8200, 2) and leader[:3] == ["python", "-m", "sglang.launch_server"]
    assert worker[worker.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"


def test_vllm_over_hosts_on_ray_starts_the_cluster_in_every_pod() -> None:
    from capplan.export.k8s import k8s_objects

    serve = ("vllm serve m --tensor-parallel-size 16 --port 8000 "
             "--distributed-executor-backend ray")
    text = (f"node 0: ray start --head --port 6379 && {serve}\n"
            "node 1: ray start --address NODE0_IP:6379 --block")
    lws, svc = k8s_objects(_multinode_plan("vllm", text))
    _validate(lws)
    t = lws["spec"]["leaderWorkerTemplate"]
    lead = t["leaderTemplate"]["spec"]["containers"][0]
    work = t["workerTemplate"]["spec"]["containers"][0]
    assert lead["command"] == ["sh", "-c", f"ray start --head --port 6379 && {serve}"]
    assert work["command"] == ["sh", "-c", "ray start --address $LWS_LEADER_ADDRESS:6379 --block"]
    assert lead["ports"][0]["containerPort"] == 8000 and "ports" not in work


def _pd_export(tmp_path: Path, engine: str, *extra: str, model: str = "deepseek-v3",
               gpu: str = "h200", rate: str = "10", ttft: str = "2"
               ) -> tuple[dict[str, Any], dict[tuple[str, str], dict[str, Any]]]:
    """`recommend` for DeepSeek-V3 on H200 (10 req/s, 2,000/500 tokens; the issue's SLOs; or
    the model, GPU, rate and TTFT p99 given) exported to Kubernetes, its disaggregated layout
    the winner: (the plan's disaggregated block, every object validated by (kind, name))."""
    from click.testing import CliRunner

    from capplan.cli import cli

    out = tmp_path / "pd.k8s.yaml"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAPPLAN_HOME", str(tmp_path))
        res = CliRunner().invoke(cli, [
            "recommend", "--model", model, "--gpu", gpu, "--engine", engine,
            "--rate", rate, "--input-len", "2000", "--output-len", "500", "--ttft-p99", ttft,
            "--tbt-p99", "0.1", *extra, "--export", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)["disaggregated"]
    assert d["winner"] == "disaggregated"
    docs = list(yaml.safe_load_all(out.read_text()))
    for doc in docs:
        _validate(doc)
    return d, {(x["kind"], x["metadata"]["name"]): x for x in docs}


def test_a_disaggregated_sglang_plan_runs_its_router_over_every_replica(tmp_path) -> None:
    # SGLang's router names each prefill worker by its own address (the decode side fetches the
    # KV from it): the pools are StatefulSets under headless Services, replica i at
    # {name}-{i}.{name}, and the router's Deployment lists every one, as the plan's router line
    # does with its hosts
    d, by = _pd_export(tmp_path, "sglang", "--verify-top", "0")
    hosts = {}
    for role in ("prefill", "decode"):
        sts = by[("StatefulSet", f"deepseek-v3-{role}")]
        assert sts["spec"]["replicas"] == d[role]["replicas"]
        assert sts["spec"]["serviceName"] == f"deepseek-v3-{role}"
        assert by[("Service", f"deepseek-v3-{role}")]["spec"]["clusterIP"] == "None"
        port = sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        hosts[role] = [f"http://deepseek-v3-{role}-{i}.deepseek-v3-{role}:{port}"
                       for i in range(d[role]["replicas"])]
    router = by[("Deployment", "deepseek-v3-router")]["spec"]["template"]["spec"]
    words = router["containers"][0]["command"]
    assert words[:3] == ["python", "-m", "sglang_router.launch_router"]
    assert [words[i + 1] for i, w in enumerate(words) if w == "--prefill"] == hosts["prefill"]
    assert [words[i + 1] for i, w in enumerate(words) if w == "--decode"] == hosts["decode"]
    assert "resources" not in router["containers"][0]  # no GPU for the router
    assert by[("Service", "deepseek-v3-router")]["spec"]["ports"][0]["port"] == 30000


def test_a_disaggregated_trtllm_plan_runs_its_disaggregated_server_from_a_configmap(
        tmp_path) -> None:
    # TensorRT-LLM's disaggregated server reads its context and generation servers from a
    # YAML file (tensorrt_llm/llmapi/disagg_utils.py extract_disagg_cfg): the export mounts
    # it from a ConfigMap and lists every replica's own address there; each server reads its
    # KV-transfer options (cache_transceiver_config; the context servers without overlap)
    d, by = _pd_export(tmp_path, "trtllm")
    urls = {}
    for role, name in (("prefill", "ctx"), ("decode", "gen")):
        pod = by[("StatefulSet", f"deepseek-v3-{role}")]["spec"]["template"]["spec"]
        words = pod["containers"][0]["command"]
        path = words[words.index("--extra_llm_api_options") + 1]
        assert path == f"/etc/capplan/{name}_extra-llm-api-config.yaml"
        data = by[("ConfigMap", f"deepseek-v3-{role}-config")]["data"]
        opts = yaml.safe_load(data[path.rsplit("/", 1)[1]])
        assert opts["cache_transceiver_config"]["max_tokens_in_buffer"] >= 2000
        assert bool(opts.get("disable_overlap_scheduler")) is (role == "prefill")
        port = pod["containers"][0]["ports"][0]["containerPort"]
        urls[role] = [f"deepseek-v3-{role}-{i}.deepseek-v3-{role}:{port}"
                      for i in range(d[role]["replicas"])]
    router = by[("Deployment", "deepseek-v3-router")]["spec"]["template"]["spec"]
    words = router["containers"][0]["command"]
    assert words == ["trtllm-serve", "disaggregated", "-c", "/etc/capplan/disagg_config.yaml"]
    assert router["volumes"][0]["configMap"]["name"] == "deepseek-v3-router-config"
    cfg = yaml.safe_load(by[("ConfigMap", "deepseek-v3-router-config")]["data"][
        "disagg_config.yaml"])
    assert cfg["context_servers"]["urls"] == urls["prefill"]
    assert cfg["generation_servers"]["urls"] == urls["decode"]
    assert cfg["context_servers"]["num_instances"] == d["prefill"]["replicas"]
    assert cfg["port"] == by[("Service", "deepseek-v3-router")]["spec"]["ports"][0]["port"]


def test_vllm_pd_pods_advertise_their_own_address_for_the_kv_handshake(run_cli) -> None:
    # vLLM's NixlConnector advertises VLLM_NIXL_SIDE_CHANNEL_HOST (default localhost) to the
    # decode worker that pulls the KV: each P/D pod sets it to its own IP (downward API); a
    # plan whose disaggregated vLLM layout is made the winner exports its two pools so
    from capplan.export.k8s import k8s_objects

    plan = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine",
                   "vllm", "--rate", "60", "--input-len", "4000", "--output-len", "300",
                   "--ttft-p99", "1", "--tbt-p99", "0.03", "--verify-top", "0",
                   "--format", "json").json()
    assert plan["disaggregated"]["launch"]["vllm_prefill"]
    plan["disaggregated"]["winner"] = "disaggregated"
    pods = {}
    for doc in k8s_objects(plan):
        _validate(doc)
        if doc["kind"] in ("Deployment", "StatefulSet"):
            pods[doc["metadata"]["name"]] = doc["spec"]["template"]["spec"]["containers"][0]
    assert set(pods) == {"llama-3-1-8b-prefill", "llama-3-1-8b-decode", "llama-3-1-8b-router"}
    # the front end, vllm-router, runs from its own image (vLLM's carries none) over every
    # replica's own address, on the port the plan's line gives it
    router = pods.pop("llama-3-1-8b-router")
    assert router["image"].startswith("vllm/vllm-router:")
    words = router["command"]
    assert words[:2] == ["vllm-router", "--vllm-pd-disaggregation"]
    d = plan["disaggregated"]
    for role in ("prefill", "decode"):
        port = pods[f"llama-3-1-8b-{role}"]["ports"][0]["containerPort"]
        assert [words[i + 1] for i, w in enumerate(words) if w == f"--{role}"] == [
            f"http://llama-3-1-8b-{role}-{i}.llama-3-1-8b-{role}:{port}"
            for i in range(d[role]["replicas"])]
    for c in pods.values():
        env = {e["name"]: e for e in c["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "status.podIP"}}
        assert "--kv-transfer-config" in c["command"]


def test_a_disaggregated_pool_over_hosts_is_a_leaderworkerset_behind_the_router(
        tmp_path) -> None:
    # DeepSeek-R1 on H100 (8-GPU hosts) under SGLang: both pools run DP 16 / EP 16, two hosts
    # a replica. Each pool is a LeaderWorkerSet whose leader and workers run their own host's
    # command (node rank from LWS_WORKER_INDEX, meeting at LWS_LEADER_ADDRESS), never the two
    # hosts' lines run together; the set's own headless Service keeps the pool's name (its
    # pods resolve under it: sigs.k8s.io/lws CreateHeadlessServiceIfNotExists), the leaders'
    # Service is {name}-leader, and the router lists every replica's leader
    d, by = _pd_export(tmp_path, "sglang", "--allow-near-floor", "--verify-top", "0",
                       model="deepseek-r1", gpu="h100", rate="20", ttft="3")
    leaders = {}
    for role in ("prefill", "decode"):
        name = f"deepseek-r1-{role}"
        assert ("Service", name) not in by
        svc = by[("Service", f"{name}-leader")]["spec"]
        assert svc["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
        lws = by[("LeaderWorkerSet", name)]["spec"]
        assert lws["replicas"] == d[role]["replicas"]
        t = lws["leaderWorkerTemplate"]
        assert t["size"] == 2
        lead = t["leaderTemplate"]["spec"]["containers"][0]
        work = t["workerTemplate"]["spec"]["containers"][0]
        assert lead["command"][:3] == ["python", "-m", "sglang.launch_server"]
        assert lead["command"].count("sglang.launch_server") == 1
        _, _, lw, _ = parse_line(shlex.join(lead["command"]))
        _, _, ww, _ = parse_line(shlex.join(work["command"]))
        assert lw["--node-rank"] == "0" and ww["--node-rank"] == "$(LWS_WORKER_INDEX)"
        assert lw["--dist-init-addr"] == ww["--dist-init-addr"] == "$(LWS_LEADER_ADDRESS):5000"
        assert lw["--deepep-mode"] == ("normal" if role == "prefill" else "low_latency")
        assert int(lead["resources"]["limits"]["nvidia.com/gpu"]) == 8
        leaders[role] = [f"http://{name}-{i}.{name}:{lw['--port']}"
                         for i in range(d[role]["replicas"])]
    words = by[("Deployment", "deepseek-r1-router")]["spec"]["template"]["spec"][
        "containers"][0]["command"]
    assert [words[i + 1] for i, w in enumerate(words) if w == "--prefill"] == leaders["prefill"]
    assert [words[i + 1] for i, w in enumerate(words) if w == "--decode"] == leaders["decode"]
