"""What the Kubernetes and llm-d exports deploy, as a cluster would run it: the image of the
release the plan was sized for, object names kubectl keeps apart, the front end's command as the
plan prints it, one token Secret, what cross-host traffic needs, and llm-d values that run the
plan or are refused. Every Kubernetes document is validated by the client's models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.export.k8s_models import containers, validate

ENGINE_REPOS = {"vllm": "vllm/vllm-openai", "sglang": "lmsysorg/sglang",
                "trtllm": "nvcr.io/nvidia/tensorrt-llm/release"}


def _recommend(run_cli, tmp_path: Path, *args: str, model: str = "llama-3.1-8b",
               exports: tuple[str, ...] = ("p.k8s.yaml",)) -> dict[str, Any]:
    res = run_cli("recommend", "--model", model, "--rate", "5", "--input-len", "500",
                  "--output-len", "100", "--gpu", "h100-sxm", "--verify-top", "0", *args,
                  *[w for e in exports for w in ("--export", str(tmp_path / e))],
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    return res.json()


def _docs(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for d in docs:
        validate(d)
    return docs


def _release(image: str) -> tuple[int, ...]:
    from capplan.models.engine import _version_key

    return _version_key(image.rsplit(":", 1)[1]) or ()


# ---------------------------------------------------------------------------------------------
# 1. images of the planned release
# ---------------------------------------------------------------------------------------------


def test_every_profile_names_an_image_of_its_own_releases() -> None:
    """A profile's image is its engine's, at or after its version and before the next
    profile's first release (a profile added by `replace` that kept its parent's image fails
    here)."""
    from capplan.models.engine import VERSIONS, _version_key

    for name, profiles in VERSIONS.items():
        for i, p in enumerate(profiles):
            assert p.image.rsplit(":", 1)[0] == ENGINE_REPOS[name], p.image
            assert p.image_release >= _version_key(p.version), (p.spec, p.image)
            if i + 1 < len(profiles):
                nxt = profiles[i + 1]
                assert p.image_release < _version_key(nxt.since or nxt.version), (
                    p.spec, p.image, nxt.spec)


def test_the_docs_name_every_profiles_image() -> None:
    from capplan.models.engine import VERSIONS

    text = (Path(__file__).resolve().parents[2] / "docs" / "engines.md").read_text()
    for profiles in VERSIONS.values():
        for p in profiles:
            assert f"`{p.image}`" in text, p.image


@pytest.mark.parametrize("spec", ["vllm@0.6", "vllm@0.11", "vllm", "sglang@0.3", "sglang@0.4",
                                  "sglang", "trtllm@1.0", "trtllm"])
def test_every_manifest_runs_an_image_of_the_release_the_plan_was_sized_for(
        run_cli, tmp_path: Path, spec: str) -> None:
    from capplan.models.engine import _version_key, engine_profile

    exports = ("p.k8s.yaml", "p.llm-d.yaml") if spec.startswith("vllm") else ("p.k8s.yaml",)
    plan = _recommend(run_cli, tmp_path, "--engine", spec, "--no-disagg", exports=exports)
    prof = engine_profile(plan["recommendations"][0]["engine_profile"])
    images = [c["image"] for d in _docs(tmp_path / "p.k8s.yaml") for c in containers(d)]
    if spec.startswith("vllm"):
        values = yaml.safe_load((tmp_path / "p.llm-d.yaml").read_text())
        images += [c["image"] for c in values["decode"]["containers"]]
    assert images and set(images) == {prof.image}, images
    assert _release(prof.image) >= _version_key(prof.version)
    if spec == "vllm@0.6":
        assert _release(prof.image)[:2] == (0, 6)


def test_the_other_engines_lines_run_their_newest_image(run_cli, tmp_path: Path) -> None:
    """A plan sized for vLLM 0.6 exported for SGLang runs SGLang's newest image: its line is
    built from SGLang's newest profile."""
    from capplan.export.k8s import k8s_objects
    from capplan.models.engine import PROFILES

    plan = _recommend(run_cli, tmp_path, "--engine", "vllm@0.6", "--no-disagg", exports=())
    images = {c["image"] for d in k8s_objects(plan, engine="sglang") for c in containers(d)}
    assert images == {PROFILES["sglang"].image}


@pytest.mark.parametrize(("spec", "model", "word", "since"), [
    ("vllm", "deepseek-v3", "--all2all-backend", (0, 11, 1)),  # vllm-project/vllm pull 26732
    ("vllm+no-overlap", "llama-3.1-8b", "--no-async-scheduling", (0, 14)),  # pull 27614
])
def test_a_flag_runs_only_on_an_image_that_has_it(run_cli, tmp_path: Path, spec: str,
                                                  model: str, word: str,
                                                  since: tuple[int, ...]) -> None:
    plan = _recommend(run_cli, tmp_path, "--engine", spec, "--no-disagg", model=model)
    runs = [c for d in _docs(tmp_path / "p.k8s.yaml") for c in containers(d)
            if word in " ".join(c["command"])]
    assert runs, plan["recommendations"][0]["engine_flags"]["vllm"]
    assert all(_release(c["image"]) >= since for c in runs)


# ---------------------------------------------------------------------------------------------
# 2. object names kubectl keeps apart
# ---------------------------------------------------------------------------------------------

DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def _assert_names_apart(docs: list[dict[str, Any]]) -> None:
    """Every (kind, name) once; names DNS-1123 labels (Services DNS-1035: a letter first) of at
    most 63 characters, with room for what Kubernetes derives from them; each workload's pods
    selected by its own labels."""
    import re

    from capplan.export.k8s import NAME_LEN

    keys = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), keys
    for kind, name in keys:
        assert re.fullmatch(DNS_LABEL, name) and len(name) <= 63, (kind, name)
        assert kind != "Service" or name[0].isalpha(), name
        if kind in ("StatefulSet", "LeaderWorkerSet", "Deployment"):
            assert len(name) <= NAME_LEN + 3, name  # + "-N" apart; -{i}-{hash} still <= 63
    selectors = [tuple(sorted(d["spec"]["selector"]["matchLabels"].items())) for d in docs
                 if d["kind"] in ("Deployment", "StatefulSet")]
    assert len(selectors) == len(set(selectors)), selectors
    for d in docs:
        for v in (d["metadata"].get("labels") or {}).values():
            assert len(v) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", v)


def test_lanes_that_read_alike_get_objects_of_their_own(run_cli, tmp_path: Path) -> None:
    """`chat_ui` and `Chat.UI` (a pool each) both lower-cased to llama-3-1-8b-chat-ui: kubectl
    kept one Deployment and one Service of the two."""
    plan_file = tmp_path / "dup.yaml"
    plan_file.write_text(yaml.safe_dump({
        "version": 1, "model": "meta-llama/Llama-3.1-8B-Instruct",
        "candidates": {"gpus": ["h100-sxm"], "tp": [1, 2]}, "engine": {"max_model_len": 8192},
        "workloads": [
            {"name": "chat_ui", "rate_per_s": 12, "input_len": 800, "output_len": 250,
             "slo": {"ttft_p99_s": 0.5, "tbt_p99_s": "20ms"}},
            {"name": "Chat.UI", "rate_per_s": 20, "input_len": 3000, "output_len": 500,
             "slo": {"e2e_p99_s": 600}}],
        "pools": "separate", "objective": "min_cost"}))
    out = tmp_path / "dup.k8s.yaml"
    res = run_cli("plan", str(plan_file), "--no-verify", "--export", str(out), "--format",
                  "json")
    assert res.exit_code == 0, res.stderr
    lanes = res.json()["pools"]["separate"]["lanes"]
    docs = _docs(out)
    _assert_names_apart(docs)
    deps = [d for d in docs if d["kind"] == "Deployment"]
    assert sorted(d["spec"]["replicas"] for d in deps) == sorted(ln["replicas"] for ln in lanes)
    assert {d["metadata"]["name"] for d in deps} == {"llama-3-1-8b-chat-ui",
                                                     "llama-3-1-8b-chat-ui-2"}
    svcs = {d["metadata"]["name"]: d["spec"]["selector"] for d in docs if d["kind"] == "Service"}
    for d in deps:  # each Service in front of its own pool
        assert svcs[d["metadata"]["name"]] == d["spec"]["selector"]["matchLabels"]


def _lane(name: str, line: str, replicas: int = 1) -> dict[str, Any]:
    return {"lane": name, "gpu": "h100-sxm", "replicas": replicas, "gpus_total": 8 * replicas,
            "engine_flags": {"vllm": line}}


def test_names_stay_apart_valid_and_short_whatever_the_lanes_are_called() -> None:
    from capplan.export.k8s import k8s_objects

    one = "vllm serve m --tensor-parallel-size 8 --port 8000"
    two = ("node 0: vllm serve m --tensor-parallel-size 16 --port 8000 "
           "--distributed-executor-backend ray\nnode 1: ray start --address NODE0_IP:6379 "
           "--block")
    lanes = [_lane("a", two, 2), _lane("a-leader", one), _lane("A", one),
             _lane("x" * 120, one), _lane("x" * 121, one), _lane("9 lives", one),
             _lane("über/∂", one), _lane("", one)]
    plan = {"model": "llama-3.1-8b", "inputs": {"pools": "separate"},
            "recommendations": [{**lanes[0], "engine": "vllm"}],
            "pools": {"separate": {"lanes": lanes}}}
    docs = k8s_objects(plan)
    for d in docs:
        validate(d)
    _assert_names_apart(docs)
    assert len([d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet")]) == len(lanes)
    # a second model whose name reads as the first's runs beside it
    both = {"models": [plan, {**plan, "model": "Llama_3.1_8B"}],
            "recommendations": plan["recommendations"]}
    docs = k8s_objects(both)
    _assert_names_apart(docs)
    assert len([d for d in docs if d["kind"] == "Service"]) == 2 * len(lanes)


# ---------------------------------------------------------------------------------------------
# 4. the front end's command as the plan prints it
# ---------------------------------------------------------------------------------------------


def _front_words(line: str) -> list[str]:
    """A front end's words with each worker's URL as URL (the manifest's hosts are its pods,
    the printed line's placeholders)."""
    import re
    import shlex

    return [re.sub(r"^http://[^ ]+:\d+$", "URL", w) for w in shlex.split(line, comments=True)]


def test_the_sglang_router_in_the_manifest_runs_the_printed_line(run_cli, tmp_path: Path) -> None:
    """The printed router line names each prefill worker's bootstrap port after its URL
    (`--prefill http://HOST0:8100 8998`); the manifest's router had none, so sglang_router
    took none."""
    out = tmp_path / "pd.k8s.yaml"
    res = run_cli("recommend", "--model", "deepseek-v3", "--gpu", "h200", "--engine", "sglang",
                  "--rate", "10", "--input-len", "2000", "--output-len", "500", "--ttft-p99",
                  "2", "--tbt-p99", "0.1", "--verify-top", "0", "--export", str(out),
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = res.json()["disaggregated"]
    assert d["winner"] == "disaggregated"
    printed = d["launch"]["sglang_router"]
    router = next(x for x in _docs(out) if x["kind"] == "Deployment"
                  and x["metadata"]["name"].endswith("-router"))
    words = router["spec"]["template"]["spec"]["containers"][0]["command"]
    assert _front_words(" ".join(words)) == _front_words(printed), (words, printed)
    boot = [words[i + 2] for i, w in enumerate(words) if w == "--prefill"]
    assert boot == ["8998"] * d["prefill"]["replicas"]


# ---------------------------------------------------------------------------------------------
# 5. one token Secret
# ---------------------------------------------------------------------------------------------


def test_both_exports_read_the_token_from_one_secret_and_key(run_cli, tmp_path: Path) -> None:
    """llm-d-modelservice reads key HF_TOKEN of `modelArtifacts.authSecretName`
    (templates/_helpers.tpl hfEnv); the manifests read key `token`, so one Secret served one
    export only. docs/takeaways.md says how to create the one both read."""
    _recommend(run_cli, tmp_path, "--no-disagg", exports=("p.k8s.yaml", "p.llm-d.yaml"))
    refs = {(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for d in _docs(tmp_path / "p.k8s.yaml") for c in containers(d)
            for e in c.get("env", []) if e["name"] == "HF_TOKEN"}
    values = yaml.safe_load((tmp_path / "p.llm-d.yaml").read_text())
    assert refs == {(values["modelArtifacts"]["authSecretName"], "HF_TOKEN")}
    (name, key), = refs
    command = f"kubectl create secret generic {name} --from-literal={key}="
    for f in ("p.k8s.yaml", "p.llm-d.yaml"):
        assert command in (tmp_path / f).read_text().splitlines()[1]
    docs = (Path(__file__).resolve().parents[2] / "docs" / "takeaways.md").read_text()
    assert command in docs


# ---------------------------------------------------------------------------------------------
# the environment a launch line sets
# ---------------------------------------------------------------------------------------------


def test_the_lines_environment_is_the_containers(run_cli, tmp_path: Path) -> None:
    """vLLM 0.11 runs DeepEP from VLLM_ALL2ALL_BACKEND, which its line sets before `vllm
    serve`: the leader's words dropped it, the workers ran `exec VLLM_ALL2ALL_BACKEND=...
    vllm serve` (a program of that name). Every pod now has it in its environment and its
    command starts with the program."""
    plan = _recommend(run_cli, tmp_path, "--engine", "vllm@0.11", "--no-disagg",
                      model="deepseek-v3")
    assert "VLLM_ALL2ALL_BACKEND=" in plan["recommendations"][0]["engine_flags"]["vllm"]
    lws = next(d for d in _docs(tmp_path / "p.k8s.yaml") if d["kind"] == "LeaderWorkerSet")
    for c in containers(lws):
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["VLLM_ALL2ALL_BACKEND"] == "deepep_low_latency", c["command"]
        assert "CUDA_VISIBLE_DEVICES" not in env
        words = " ".join(c["command"])
        assert "=deepep" not in words and "exec VLLM" not in words, words


# ---------------------------------------------------------------------------------------------
# 6. what traffic across hosts needs
# ---------------------------------------------------------------------------------------------


def _pd_plan(run_cli, tmp_path: Path, *extra: str) -> dict[str, Any]:
    """DeepSeek-V3 on H200 under SGLang, 10 req/s of 2,000/500 tokens: the P/D layout wins."""
    res = run_cli("recommend", "--model", "deepseek-v3", "--gpu", "h200", "--engine", "sglang",
                  "--rate", "10", "--input-len", "2000", "--output-len", "500", "--ttft-p99",
                  "2", "--tbt-p99", "0.1", "--verify-top", "0", *extra, "--format", "json")
    assert res.exit_code == 0, res.stderr
    plan = res.json()
    assert plan["disaggregated"]["winner"] == "disaggregated"
    return plan


def _rdma(c: dict[str, Any]) -> dict[str, str]:
    return {k: v for part in ("limits", "requests")
            for k, v in c.get("resources", {}).get(part, {}).items() if k.startswith("rdma/")}


def _ipc_lock(c: dict[str, Any]) -> bool:
    return "IPC_LOCK" in ((c.get("securityContext") or {}).get("capabilities") or {}).get(
        "add", [])


def test_pods_whose_traffic_crosses_hosts_request_rdma_and_say_why(run_cli,
                                                                   tmp_path: Path) -> None:
    """The plan costs NIXL's KV transfer and a replica's all-to-all over hosts at the catalog's
    400 Gb/s per GPU; the pods asked for no RDMA device and could not pin memory for it."""
    from capplan.export.k8s import k8s_objects

    pd = _pd_plan(run_cli, tmp_path)
    multi = _recommend(run_cli, tmp_path, "--no-disagg", model="deepseek-v3")
    small = _recommend(run_cli, tmp_path, "--no-disagg")
    for plan, crossing in ((pd, {"StatefulSet"}), (multi, {"LeaderWorkerSet"}), (small, set())):
        for d in k8s_objects(plan):
            validate(d)
            note = (d["metadata"].get("annotations") or {}).get("capplan/network", "")
            for c in containers(d):
                if d["kind"] in crossing:
                    assert _rdma(c) == {"rdma/ib": "1"} and _ipc_lock(c), c
                    assert c["resources"]["limits"]["rdma/ib"] == "1"
                    assert c["resources"]["requests"]["rdma/ib"] == "1"
                else:
                    assert not _rdma(c) and not _ipc_lock(c), (d["kind"], c)
            assert bool(note) == (d["kind"] in crossing), note
            if d["kind"] == "StatefulSet":
                assert pd["disaggregated"]["kv_link"] in note and "rdma/ib" in note
    # the resource is your cluster's: named, or none
    for name in ("rdma/hca_shared_devices_a", None):
        for d in k8s_objects(pd, rdma_resource=name):
            validate(d)
            for c in containers(d):
                if d["kind"] == "StatefulSet":
                    assert _rdma(c) == ({name: "1"} if name else {}) and _ipc_lock(c)


def test_the_rdma_resource_is_set_from_the_environment(run_cli, tmp_path: Path,
                                                       monkeypatch) -> None:
    from tests.cli._asserts import assert_answer_then_refusal

    monkeypatch.setenv("CAPPLAN_RDMA_RESOURCE", "rdma/hca_shared_devices_a")
    _pd_plan(run_cli, tmp_path, "--export", str(tmp_path / "a.k8s.yaml"))
    monkeypatch.setenv("CAPPLAN_RDMA_RESOURCE", "")
    _pd_plan(run_cli, tmp_path, "--export", str(tmp_path / "b.k8s.yaml"))
    got = {}
    for f in ("a", "b"):
        got[f] = {k for d in _docs(tmp_path / f"{f}.k8s.yaml") for c in containers(d)
                  for k in _rdma(c)}
    assert got == {"a": {"rdma/hca_shared_devices_a"}, "b": set()}
    monkeypatch.setenv("CAPPLAN_RDMA_RESOURCE", "two words")
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--rate", "1", "--gpu", "h100-sxm",
                  "--verify-top", "0", "--export", str(tmp_path / "c.k8s.yaml"))
    assert_answer_then_refusal(res, "CAPPLAN_RDMA_RESOURCE")
    assert not (tmp_path / "c.k8s.yaml").exists()


# ---------------------------------------------------------------------------------------------
# 3. llm-d values that run the plan, or a refusal
# ---------------------------------------------------------------------------------------------

CHART_TOP = {"accelerator", "common", "decode", "enabled", "extraObjects", "fullnameOverride",
             "global", "modelArtifacts", "multinode", "prefill", "requester", "routing",
             "serviceAccountOverride", "tracing"}
CHART_ARTIFACTS = {"authSecretName", "labels", "mountPath", "name", "readOnly", "size", "uri"}
CHART_PARALLELISM = {"data", "dataLocal", "tensor", "workers"}
CHART_ROLE = {"create", "replicas", "parallelism", "containers", "volumes", "annotations"}
CHART_ONLY = ("modelCommand", "mountModelVolume", "extraConfig")
"""llm-d-modelservice's values.schema.json (chart v0.4.12): the top level's properties,
modelArtifacts' and parallelism's (both additionalProperties false), the role keys the
templates read; a container's keys the chart reads itself (templates/_helpers.tpl container:
modelCommand, mountModelVolume, extraConfig merged into the container)."""


def _chart_checked(values: dict[str, Any]) -> dict[str, Any]:
    """The values against the chart's schema, and what each role renders checked with the
    Kubernetes client's models: its containers (the chart's own keys applied) and volumes."""
    from tests.export.k8s_models import as_model

    assert set(values) <= CHART_TOP
    assert set(values["modelArtifacts"]) <= CHART_ARTIFACTS
    assert isinstance(values["modelArtifacts"]["size"], str)
    assert set(values["routing"]) <= {"proxy", "servicePort"}
    for role in ("decode", "prefill"):
        r = values[role]
        assert set(r) <= CHART_ROLE, set(r) - CHART_ROLE
        if not r["create"]:
            continue
        assert set(r["parallelism"]) <= CHART_PARALLELISM
        assert all(isinstance(v, int) and v >= 1 for v in r["parallelism"].values())
        for v in r["volumes"]:
            as_model(v, "V1Volume")
        for c in r["containers"]:
            assert c["modelCommand"] in ("vllmServe", "custom")
            rendered = {k: v for k, v in c.items() if k not in CHART_ONLY}
            rendered.update(c.get("extraConfig", {}))
            if c["modelCommand"] == "vllmServe":
                rendered["command"] = ["vllm", "serve"]
            as_model(rendered, "V1Container")
    return values


def _llmd(run_cli, tmp_path: Path, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    out = tmp_path / "p.llm-d.yaml"
    res = run_cli("recommend", "--verify-top", "0", *args, "--export", str(out), "--format",
                  "json")
    assert res.exit_code == 0, res.stderr
    return res.json(), _chart_checked(yaml.safe_load(out.read_text()))


def test_llmd_refuses_another_engine_than_vllm_before_any_file_is_written(
        run_cli, tmp_path: Path) -> None:
    """A plan sized for SGLang (its P/D layout the winner) got aggregated vLLM replicas
    running lines "not sized for vLLM"."""
    from tests.cli._asserts import assert_one_line_error

    files = [tmp_path / "p.json", tmp_path / "p.k8s.yaml", tmp_path / "p.llm-d.yaml"]
    res = run_cli("recommend", "--model", "deepseek-v3", "--gpu", "h200", "--engine", "sglang",
                  "--rate", "10", "--input-len", "2000", "--output-len", "500", "--ttft-p99",
                  "2", "--tbt-p99", "0.1", "--verify-top", "0",
                  *[w for f in files for w in ("--export", str(f))])
    assert_one_line_error(res, "runs vLLM only")
    assert "SGLang" in res.stderr and ".k8s.yaml" in res.stderr
    assert not any(f.exists() for f in files)


def test_llmd_refuses_a_pool_per_lane(run_cli, tmp_path: Path) -> None:
    """A `pools: separate` plan's llm-d values deployed the shared pool, dropping the lanes'."""
    from tests.cli._asserts import assert_answer_then_refusal

    plan_file = tmp_path / "lanes.yaml"
    plan_file.write_text(yaml.safe_dump({
        "version": 1, "model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"]},
        "workloads": [
            {"name": "chat", "rate_per_s": 12, "input_len": 800, "output_len": 250,
             "slo": {"ttft_p99_s": 0.5}},
            {"name": "batch", "rate_per_s": 20, "input_len": 3000, "output_len": 500,
             "slo": {"e2e_p99_s": 600}}],
        "pools": "separate"}))
    out = tmp_path / "lanes.llm-d.yaml"
    res = run_cli("plan", str(plan_file), "--no-verify", "--export", str(out))
    assert_answer_then_refusal(res, "a pool per lane (chat, batch)")
    assert ".k8s.yaml" in res.stderr and not out.exists()


def test_llmd_runs_a_winning_pd_layout_as_the_charts_prefill_and_decode(run_cli) -> None:
    import shlex

    from capplan.export.llmd import llmd_values
    from tests.plan.engine_args import parse_line

    plan = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine",
                   "vllm", "--rate", "60", "--input-len", "4000", "--output-len", "300",
                   "--ttft-p99", "1", "--tbt-p99", "0.03", "--verify-top", "0",
                   "--format", "json").json()
    plan["disaggregated"]["winner"] = "disaggregated"
    d = plan["disaggregated"]
    values = _chart_checked(llmd_values(plan))
    assert values["routing"]["proxy"]["connector"] == "nixlv2"
    for role in ("prefill", "decode"):
        r, line = values[role], d["launch"][f"vllm_{role}"]
        assert r["create"] and r["replicas"] == d[role]["replicas"]
        c = r["containers"][0]
        gpus = d[role]["gpus_total"] // d[role]["replicas"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
        assert r["parallelism"]["tensor"] * r["parallelism"]["dataLocal"] == gpus
        # the chart's command: vllm serve MODEL --port P --tensor-parallel-size T ... ARGS
        _, _, flags, _ = parse_line(shlex.join(
            ["vllm", "serve", "M", "--tensor-parallel-size", str(r["parallelism"]["tensor"]),
             *c["args"]]))
        _, _, planned, _ = parse_line(line.split(": ", 1)[1])
        assert flags == {k: v for k, v in planned.items() if k not in ("--host", "--port")}
        env = {e["name"]: e for e in c["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"] == {
            "fieldPath": "status.podIP"}
        assert c["resources"]["limits"]["rdma/ib"] == "1"  # NIXL between pods
        assert "IPC_LOCK" in c["extraConfig"]["securityContext"]["capabilities"]["add"]


def test_llmd_runs_a_replica_over_hosts_as_the_charts_leaderworkerset(run_cli,
                                                                      tmp_path: Path) -> None:
    """DeepSeek-V3 on H100 under vLLM: DP 16 / EP 16 over two 8-GPU hosts. The values had no
    parallelism (the chart sizes the LeaderWorkerSet group from it) and asked 16 GPUs a pod."""
    plan, values = _llmd(run_cli, tmp_path, "--model", "deepseek-v3", "--gpu", "h100-sxm",
                         "--rate", "5", "--input-len", "1000", "--output-len", "200",
                         "--no-disagg")
    best = plan["recommendations"][0]
    assert best["gpus_per_replica"] == 16
    r = values["decode"]
    par = r["parallelism"]
    assert values["multinode"] is True and par["workers"] == 2
    assert par == {"tensor": 1, "data": 16, "dataLocal": 8, "workers": 2}
    c = r["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8" == str(par["tensor"] *
                                                                      par["dataLocal"])
    assert c["modelCommand"] == "custom" and c["command"] == ["/bin/sh", "-c"]
    script = c["args"][0]
    assert 'if [ "${LWS_WORKER_INDEX:-0}" -eq 0 ]' in script
    assert "--data-parallel-start-rank $((LWS_WORKER_INDEX * 8)) --headless" in script
    assert "--data-parallel-address $LWS_LEADER_ADDRESS" in script
    assert script.count("--port 8200") == 2  # behind the chart's routing sidecar
    assert script.count(f"--served-model-name {plan['hf_id']}") == 2


@pytest.mark.parametrize(("model", "gpu", "at_least_gb"), [("deepseek-v3", "h200", 690),
                                                           ("llama-3.1-8b", "h100-sxm", 16)])
def test_llmd_model_volume_holds_the_checkpoint(run_cli, tmp_path: Path, model: str, gpu: str,
                                                at_least_gb: float) -> None:
    """The volume was 200Gi for every model: DeepSeek-V3's ~690 GB of weights did not fit."""
    import math

    from capplan.export.llmd import VOLUME_HEADROOM
    from capplan.units import GIB_BYTES

    plan, values = _llmd(run_cli, tmp_path, "--model", model, "--gpu", gpu, "--rate", "2",
                         "--no-disagg")
    size = values["modelArtifacts"]["size"]
    assert size.endswith("Gi")
    assert int(size[:-2]) == math.ceil(plan["checkpoint_bytes"] * VOLUME_HEADROOM / GIB_BYTES)
    assert int(size[:-2]) * GIB_BYTES >= at_least_gb * 1e9


def test_llmd_runs_tp_over_hosts_on_ray_in_the_charts_group() -> None:
    from capplan.export.llmd import llmd_values

    serve = ("vllm serve meta-llama/Llama-3.1-405B-Instruct --tensor-parallel-size 8 "
             "--pipeline-parallel-size 2 --max-num-seqs 64 --host 0.0.0.0 --port 8000 "
             "--distributed-executor-backend ray")
    text = (f"node 0: ray start --head --port 6379 && {serve}\n"
            "node 1: ray start --address NODE0_IP:6379 --block")
    plan = {"model": "llama-3.1-405b", "hf_id": "meta-llama/Llama-3.1-405B-Instruct",
            "checkpoint_bytes": 811_700_000_000, "recommendations": [{
                "gpu": "h100-sxm", "replicas": 3, "gpus_total": 48, "engine": "vllm",
                "engine_flags": {"vllm": text}}]}
    values = _chart_checked(llmd_values(plan))
    r = values["decode"]
    assert values["multinode"] and r["replicas"] == 3
    assert r["parallelism"] == {"tensor": 8, "data": 1, "dataLocal": 1, "workers": 2}
    c = r["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    lead, work = c["args"][0].split("\nelse\n")
    assert "ray start --head --port 6379 && vllm serve" in lead and "--port 8200" in lead
    assert lead.rstrip().endswith("--served-model-name meta-llama/Llama-3.1-405B-Instruct")
    assert work.strip().startswith("ray start --address $LWS_LEADER_ADDRESS:6379 --block")
    # a plan whose line gives no command per host cannot be spread over the group
    from capplan.errors import InputError

    plan["recommendations"][0]["engine_flags"]["vllm"] = serve
    with pytest.raises(InputError, match="no command per host"):
        llmd_values(plan)


def test_a_refused_manifest_writes_no_other_export_either(run_cli, tmp_path: Path) -> None:
    """TensorRT-LLM over hosts is refused in `.k8s.yaml` (MPI); the plan's JSON, written
    before it, was left behind beside the error."""
    from tests.cli._asserts import assert_answer_then_refusal

    files = [tmp_path / "t.json", tmp_path / "t.k8s.yaml"]
    res = run_cli("recommend", "--model", "deepseek-v3", "--gpu", "h100-sxm", "--engine",
                  "trtllm", "--rate", "5", "--input-len", "1000", "--output-len", "200",
                  "--verify-top", "0", "--no-disagg",
                  *[w for f in files for w in ("--export", str(f))])
    assert_answer_then_refusal(res, "MPI")
    assert not any(f.exists() for f in files)
