"""Launch blocks of several replicas run as printed (capplan.plan.placement): every replica on a
host, pinned to GPUs of its own there with CUDA_VISIBLE_DEVICES and on a port of its own, a
front end naming exactly the replicas' addresses, and one name scheme for hosts in one output.

What the engines need, from their sources: a server sees the GPUs CUDA_VISIBLE_DEVICES leaves it
and numbers them from 0, so servers on one host each need their own set (TensorRT-LLM's
examples/disaggregated/README.md starts each context and generation server with its own
CUDA_VISIBLE_DEVICES, SGLang's router README each worker); without it every server of a host
starts on GPU 0. Routers take the workers as URLs: SGLang's `--worker-urls URL...` (sgl-router
router_args.py), vLLM's `vllm-router --worker-urls URL...` (vllm-project/router src/main.rs),
and listen on `--port`."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from capplan.api import disaggregated
from capplan.models.engine import engine_profile
from capplan.plan.disagg import DisaggPlan, PoolPlan, launch_lines, placements, replica_lines
from capplan.plan.launch import REPLICA_PORT, LaunchOptions, default_port, pool_command
from capplan.plan.launch_multinode import pd_launch
from capplan.plan.placement import fleet_text, one_replica
from tests.plan.engine_args import parse_line

ENGINES = ("vllm", "sglang", "trtllm")
_HOSTS = re.compile(r"(\S+): (prefill|decode|replica) (\d+) \((GPUs? [^,]+), port (\d+)")
ROUTER = {"sglang-router": ("python", "-m", "sglang_router.launch_router"),
          "vllm-router": ("vllm-router",)}
TP_FLAG = {"vllm": "--tensor-parallel-size", "sglang": "--tp", "trtllm": "--tp_size"}


def _command(line: str) -> str:
    """A line's command without its "replica i (HOSTS): " / "node k: " heads."""
    return re.sub(r"^(replica \d+ \(\S+\): )?(node \d+: )?", "", line)


def _gpus(cmd: str) -> set[int]:
    env = parse_line(_command(cmd))[3]
    return {int(g) for g in env["CUDA_VISIBLE_DEVICES"].split(",")}


def _hosts(line: str) -> dict[tuple[str, int], tuple[str, set[int], int]]:
    """(role, i) -> (host, GPUs, port) of a hosts line."""
    out = {}
    for host, role, i, gpus, port in _HOSTS.findall(line):
        nums = [int(x) for x in re.findall(r"\d+", gpus)]
        out[(role, int(i))] = (host, set(range(nums[0], nums[-1] + 1)), int(port))
    return out


def _router_urls(line: str) -> dict[str, list[str]]:
    words = shlex.split(line, comments=True)
    return {f: [words[i + 1] for i, w in enumerate(words) if w == f]
            for f in ("--prefill", "--decode")}


LAYOUTS = {  # the audit's fixed layouts of Llama 3.1 70B on H100s (prefill tp, decode tp)
    "vllm": (2, 4), "trtllm": (2, 4), "sglang": (4, 4)}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_fixed_layouts_workers_are_pinned_to_gpus_of_their_own(engine) -> None:
    # `latency ... --prefill-workers 2 --prefill-tp 2 --decode-workers 1 --decode-tp 4` (8 GPUs,
    # KV over NVLink: one host) and SGLang's TP 4 + TP 4 (12 GPUs, two hosts): every worker
    # pinned to as many GPUs as its TP, none shared on a host, each at the host and port the
    # hosts line and the router name
    ptp, dtp = LAYOUTS[engine]
    lay = disaggregated("llama-3.1-70b", "h100", prefill_workers=2, decode_workers=1,
                        prefill={"tp": ptp}, decode={"tp": dtp}, engine=engine,
                        max_model_len=8192)
    lines = pd_launch(lay)
    names = ("context", "generation") if engine == "trtllm" else ("prefill", "decode")
    where = _hosts(lines["hosts"][0])
    assert set(where) == {("prefill", 0), ("prefill", 1), ("decode", 0)}
    used: dict[str, set[int]] = {}
    for (role, i), (host, gpus, port) in where.items():
        (cmd,) = lines[f"{names[role == 'decode']} worker {i}"]  # one host: one command
        _, _, flags, _ = parse_line(_command(cmd))
        assert _gpus(cmd) == gpus and len(gpus) == int(flags[TP_FLAG[engine]])
        assert gpus <= set(range(8)) and not gpus & used.get(host, set())
        used.setdefault(host, set()).update(gpus)
        assert int(flags["--port"]) == port
    one_host = lay.link.in_domain
    assert {h for h, _, _ in where.values()} == ({"localhost"} if one_host
                                                 else {"HOST0", "HOST1"})
    if engine == "trtllm":
        cfg = yaml.safe_load(lines["router"][0].split("# disagg_config.yaml: ", 1)[1])
        named = [f"http://{u}" for k in ("context_servers", "generation_servers")
                 for u in cfg[k]["urls"]]
    else:
        named = [u for urls in _router_urls(lines["router"][0]).values() for u in urls]
    assert named == [f"http://{h}:{p}" for h, _, p in where.values()]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_fixed_layout_is_placed_as_recommends_pools_are(engine) -> None:
    # one placement for both: the same pools printed by `latency` and by `recommend` give the
    # same worker commands (GPUs, ports, KV handshake ports, hosts) and the same front end
    lay = disaggregated("llama-3.1-8b", "h100", prefill_workers=3, decode_workers=2,
                        prefill={"tp": 2}, decode={"tp": 2}, engine=engine, max_model_len=4096)
    plan = DisaggPlan(PoolPlan("prefill", lay.prefill, 3, 1.0, 0.1, 0.01),
                      PoolPlan("decode", lay.decode, 2, 1.0, 0.1, 0.01), lay.link,
                      0.001, 0.001, 0.2, 0.02)
    rec, each, fixed = launch_lines(plan), replica_lines(plan), pd_launch(lay)
    names = ("context", "generation") if engine == "trtllm" else ("prefill", "decode")
    for role, name in zip(("prefill", "decode"), names, strict=True):
        texts = [r["command"] for r in each[f"{engine}_{role}"]]
        assert texts[0] == pool_command(rec[f"{engine}_{role}"])
        assert texts == ["\n".join(fixed[f"{name} worker {i}"]) for i in range(len(texts))]
    front = next(v for k, v in rec.items() if k.endswith(("_router", "_proxy")))
    assert fixed["router"] == [front]
    assert fixed["hosts"] == [rec[f"{engine}_hosts"]]
    assert [x.first_gpu for x in placements(plan)] == [0, 2, 4, 6, 0]  # 10 GPUs: two hosts


def test_a_plan_files_fixed_layout_is_pinned() -> None:
    # the audit's plans/pd70.yaml: its disaggregated_layout's workers share one host
    from capplan.api import run_plan

    doc = {"version": 1, "model": "meta-llama/Llama-3.1-70B-Instruct",
           "candidates": {"gpus": ["h100-sxm"], "tp": [4]}, "engine": {"max_model_len": 8192},
           "workloads": [{"name": "chat", "rate_per_s": 4, "input_len": 2000,
                          "output_len": 300, "slo": {"ttft_p99_s": 2.0, "tbt_p99_s": 0.1}}],
           "disaggregated_layout": {"prefill": {"workers": 2, "tp": 2},
                                    "decode": {"workers": 1, "tp": 4}, "kv_link": "auto"}}
    launch = run_plan(doc, verify=False).to_dict()["fixed_disaggregated"]["launch"]
    gpus = [_gpus(launch[k][0]) for k in ("prefill worker 0", "prefill worker 1",
                                          "decode worker 0")]
    assert gpus == [{0, 1}, {2, 3}, {4, 5, 6, 7}]
    assert launch["hosts"][0].startswith("localhost: prefill 0 (GPUs 0-1, port 8100")


def _options(tp: int, nodes: int = 1) -> LaunchOptions:
    return LaunchOptions(model_id="meta-llama/Llama-3.1-8B-Instruct", tp=tp, max_num_seqs=128,
                         max_num_batched_tokens=1024,
                         memory_fraction={e: 0.85 for e in ENGINES}, max_model_len=4096,
                         nodes=nodes, gpus_per_node=8)


def _fleet(engine: str, tp: int, replicas: int, nodes: int = 1) -> tuple[list[str], str, str]:
    """(each replica's text, the router line, the hosts line) of a fleet."""
    rows: list[str] = []
    for row in fleet_text(engine, _options(tp, nodes), replicas).split("\n"):
        if row.startswith(" "):  # a replica's next host, under its first
            rows[-1] += "\n" + row.strip()
        else:
            rows.append(row)
    router = next(r for r in rows if r.startswith("router: "))[len("router: "):]
    hosts = next((r for r in rows if r.startswith("hosts: ")), "")[len("hosts: "):]
    reps = [r for r in rows if not r.startswith(("router: ", "hosts: "))]
    return reps, router, hosts


@pytest.mark.parametrize("engine", ENGINES)
def test_an_aggregated_fleet_runs_each_replica_on_its_own_gpus_and_port(engine) -> None:
    # `recommend ... --tp 2` plans 4 x TP 2 (8 GPUs, one host): four servers pinned to GPUs
    # 0-1, 2-3, 4-5, 6-7 on ports 8100-8103, and the engine's router on its default port
    # naming exactly those four, round robin (the even split each replica was sized for)
    reps, router, hosts = _fleet(engine, 2, 4)
    assert len(reps) == 4 and all(r.startswith(f"replica {i} (localhost): ")
                                  for i, r in enumerate(reps))
    assert [_gpus(r) for r in reps] == [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
    ports = [int(parse_line(_command(r))[2]["--port"]) for r in reps]
    assert ports == [REPLICA_PORT + i for i in range(4)]
    prog, _, flags, _ = parse_line(router)
    assert prog == ROUTER[engine_profile(engine).replica_router]
    assert flags["--worker-urls"].split() == [f"http://localhost:{p}" for p in ports]
    assert flags["--policy"] == "round_robin"
    assert int(flags["--port"]) == default_port(engine) and default_port(engine) not in ports
    assert flags["--host"] == "0.0.0.0"  # reachable from the clients' hosts
    assert _hosts(hosts)[("replica", 3)] == ("localhost", {6, 7}, REPLICA_PORT + 3)


def test_replicas_fill_hosts_and_each_host_numbers_its_own_ports() -> None:
    # 3 x TP 4 on 8-GPU hosts: two on HOST0 (GPUs 0-3, 4-7), the third on HOST1 (GPUs 0-3),
    # each host's ports from 8100
    reps, router, hosts = _fleet("sglang", 4, 3)
    assert [r.split(": ", 1)[0] for r in reps] == [
        "replica 0 (HOST0)", "replica 1 (HOST0)", "replica 2 (HOST1)"]
    assert [_gpus(r) for r in reps] == [{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 1, 2, 3}]
    assert parse_line(router)[2]["--worker-urls"].split() == [
        "http://HOST0:8100", "http://HOST0:8101", "http://HOST1:8100"]
    assert hosts.startswith("HOST0: replica 0 (GPUs 0-3, port 8100); ")


@pytest.mark.parametrize("engine", ENGINES)
def test_replicas_over_hosts_meet_at_their_own_first_host(engine) -> None:
    # 2 replicas of 16 GPUs on 8-GPU hosts: HOST0-HOST1 and HOST2-HOST3, every GPU of each
    # (no CUDA_VISIBLE_DEVICES), each replica's ranks meeting at its own first host, named as
    # the router names it; no placeholder left
    reps, router, hosts = _fleet(engine, 16, 2, nodes=2)
    assert [r.split(": ", 1)[0] for r in reps] == ["replica 0 (HOST0-HOST1)",
                                                    "replica 1 (HOST2-HOST3)"]
    for first, text in zip((0, 2), reps, strict=True):
        assert "NODE" not in text and "CUDA_VISIBLE_DEVICES" not in text
        assert f"HOST{first}" in text and f"HOST{first + 1}" in text
        # the Kubernetes export reads one replica's placeholders back
        assert f"HOST{2 - first}" not in text
        assert "NODE0_IP" in one_replica(text) and "HOST" not in one_replica(text)
    assert "http://HOST0:8100 http://HOST2:8100" in router
    assert hosts == ("HOST0-HOST1: replica 0 (GPUs 0-7 of each, port 8100); "
                     "HOST2-HOST3: replica 1 (GPUs 0-7 of each, port 8100)")


def test_a_single_replica_plan_and_its_manifest_are_unchanged(run_cli, tmp_path) -> None:
    # one replica: its one line on the engine's default port, unpinned, no router; several:
    # the fleet beside it, while the Kubernetes manifest keeps one replica's line (the device
    # plugin assigns each pod its GPUs) with the replica count
    one = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "1",
                  "--verify-top", "0", "--no-disagg", "--format", "json").json()
    best = one["recommendations"][0]
    assert best["replicas"] == 1 and not any(k.startswith("fleet:") for k in best["engine_flags"])
    assert "CUDA_VISIBLE_DEVICES" not in best["engine_flags"]["vllm"]
    assert "--base-url http://localhost:8000 " in best["engine_flags"]["bench"]
    k8s = tmp_path / "f.k8s.yaml"
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100", "--rate", "100",
                  "--ttft-p99", "1s", "--tbt-p99", "50ms", "--tp", "2", "--engine", "sglang",
                  "--verify-top", "0", "--no-disagg", "--export", str(k8s))
    assert res.exit_code == 0, res.stderr
    assert "router: python -m sglang_router.launch_router --worker-urls " in res.stdout
    assert "replica 1 (localhost): CUDA_VISIBLE_DEVICES=2,3 python -m sglang" in res.stdout
    docs = [d for d in yaml.safe_load_all(k8s.read_text()) if d]
    (sts,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    (box,) = sts["spec"]["template"]["spec"]["containers"]
    assert sts["spec"]["replicas"] > 1
    args = " ".join(box.get("command", []) + box.get("args", []))
    assert "--port 30000" in args and "CUDA_VISIBLE_DEVICES" not in str(box)
