"""Every fleet one output prints draws from one placement (review #1), a fleet's verify line
targets its first replica's own host (#2), a replica over hosts that does not fill them says
what each host runs (#3), the P/D launch header says which workers are pinned (#4). The
expected hosts, GPUs and ports are written out by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from capplan.cli._pd import _launch_notes
from capplan.plan.launch import LaunchOptions
from capplan.plan.placement import Output, PoolShape, fleet_address, fleet_text, place

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ("vllm", "sglang", "trtllm")


def _options(tp: int, pp: int = 1, nodes: int = 1, gpus_per_node: int = 8) -> LaunchOptions:
    return LaunchOptions(model_id="m", tp=tp, pp=pp, max_num_seqs=128,
                         max_num_batched_tokens=1024,
                         memory_fraction={e: 0.85 for e in ENGINES}, max_model_len=4096,
                         nodes=nodes, gpus_per_node=gpus_per_node)


def _claims(text: str) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(host, GPU) and (host, port) of every replica line of launch blocks."""
    gpus, ports = [], []
    for m in re.finditer(r"replica \d+ \((\S+)\): CUDA_VISIBLE_DEVICES=([\d,]+) .*?--port (\d+)",
                         text):
        gpus += [(m.group(1), int(g)) for g in m.group(2).split(",")]
        ports.append((m.group(1), int(m.group(3))))
    return gpus, ports


@pytest.mark.parametrize("engine,front", [("vllm", 8000), ("sglang", 30000),
                                          ("trtllm", 8000)])
def test_two_fleets_of_one_output_continue_one_placement(engine, front) -> None:
    # llama 5 x TP 4 then qwen 2 x TP 4 on 8-GPU h100 hosts (two-models.yaml's peaks)
    pools = (PoolShape("replica", 5, 4, 8, "h100-sxm"), PoolShape("replica", 2, 4, 8, "h100-sxm"))
    llama = fleet_text(engine, _options(4), 5, Output(pools, 0))
    qwen = fleet_text(engine, _options(4), 2, Output(pools, 1))
    assert _claims(qwen)[1] == [("HOST2", 8101), ("HOST3", 8100)]
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7" in qwen.split("\n")[0]
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in qwen.split("\n")[1]
    assert f"--port {front}" in llama and f"--port {front + 1}" in qwen
    assert "hosts: HOST2: replica 0 (GPUs 4-7, port 8101); HOST3: replica 1 (GPUs 0-3, port " \
           "8100)" in qwen
    gpus, ports = _claims(llama + "\n" + qwen)
    assert len(gpus) == len(set(gpus)) == 28 and len(ports) == len(set(ports)) == 7
    assert fleet_address(engine, _options(4), 2, Output(pools, 1)) == ("HOST2", 8101)


def test_two_models_plan_prints_one_placement(run_cli) -> None:
    res = run_cli("plan", str(ROOT / "examples/day/two-models.yaml"))
    assert res.exit_code == 0, res.stderr
    for label in ("vLLM:", "SGLang:", "TensorRT-LLM:"):
        text, inside = [], False
        for row in res.stdout.split("\n"):  # the engine's blocks: its label, lines under it
            inside = row.startswith(label) or (inside and row.startswith(" "))
            text += [row] if inside else []
        text = "\n".join(text)
        gpus, ports = _claims(text)
        # 5 x TP 4 (llama) + 2 x TP 4 (qwen), no GPU nor port claimed twice on one host
        assert len(gpus) == len(set(gpus)) == 5 * 4 + 2 * 4
        assert len(ports) == len(set(ports)) == 7
        routers = re.findall(r"router: .*?--port (\d+)", text)
        assert len(routers) == 2 and len(set(routers)) == 2
    assert "--base-url http://HOST0:8100 " in res.stdout  # llama replica 0
    assert "--base-url http://HOST2:8101 " in res.stdout  # qwen replica 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_fleet_over_hosts_is_verified_on_its_first_replicas_host(engine) -> None:
    # 2 x TP 8 on GB200 trays of 4 GPUs: replica 0 on HOST0-HOST1, its server on HOST0
    assert fleet_address(engine, _options(8, nodes=2, gpus_per_node=4), 2) == ("HOST0", 8100)
    assert fleet_address(engine, _options(8), 1) == ("localhost", _options(8).port_for(engine))


@pytest.mark.parametrize("engine,text", [
    ("sglang", "GPUs 0-5 of each"),  # --nnodes 2: 12 / 2 ranks a node
    ("trtllm", "GPUs 0-7 of HOST0, 0-3 of HOST1"),  # mpirun -H HOST0:8,HOST1:8 -np 12
    ("vllm", "GPUs 0-7 of HOST0, 0-3 of HOST1")])  # Ray fills the head first
def test_a_replica_over_hosts_that_does_not_fill_them_says_what_each_runs(engine, text) -> None:
    where = place(engine, [PoolShape("replica", 2, 12, 8)])
    assert [w.gpu_text() for w in where] == [text, text.replace("HOST0", "HOST2")
                                             .replace("HOST1", "HOST3")]
    hosts = fleet_text(engine, _options(4, pp=3, nodes=2), 2).split("hosts: ")[1]
    assert hosts.startswith(f"HOST0-HOST1: replica 0 ({text}, port 8100)")
    assert place(engine, [PoolShape("replica", 1, 16, 8)])[0].gpu_text() == "GPUs 0-7 of each"


def test_the_pd_launch_header_does_not_say_workers_over_hosts_are_pinned() -> None:
    head = _launch_notes({"launch": {"prefill worker 0": ["node 0: x"]}})[0]
    assert "a worker over hosts is not pinned" in head
    assert "each worker pinned" not in head


def test_a_pool_per_lane_is_placed_as_one(run_cli) -> None:
    # shared-70b.yaml: lane interactive 1 x TP 2, lane batch 1 x TP 2 (h100, one host)
    res = run_cli("plan", str(ROOT / "examples/shared-70b.yaml"), "--no-verify")
    assert res.exit_code == 0, res.stderr
    rows = {r.split(":")[0]: r for r in res.stdout.splitlines() if r.startswith("vLLM (")}
    assert "replica 0 (localhost): CUDA_VISIBLE_DEVICES=0,1 " in rows["vLLM (interactive)"]
    assert rows["vLLM (interactive)"].endswith("--port 8100")
    assert "replica 0 (localhost): CUDA_VISIBLE_DEVICES=2,3 " in rows["vLLM (batch)"]
    assert rows["vLLM (batch)"].endswith("--port 8101")


def test_routers_and_kv_handshakes_have_one_source() -> None:
    import capplan.plan.launch as launch
    import capplan.plan.launch_multinode as multinode
    from capplan.models.engine import KvHandshake, engine_profile
    from capplan.plan.placement import replica_front_line, sglang_router, vllm_router

    for name in ("_urls", "_sglang_router", "_vllm_router"):
        assert not hasattr(multinode, name)
    assert not hasattr(launch, "KV_HANDSHAKE")
    # vLLM's NIXL side channel 5600 (a port per rank), SGLang's prefill bootstrap 8998
    assert engine_profile("vllm").pd.kv_handshake == KvHandshake(5600, ("prefill", "decode"),
                                                                 per_rank=True)
    assert engine_profile("sglang").pd.kv_handshake == KvHandshake(8998, ("prefill",),
                                                                   per_rank=False)
    assert engine_profile("trtllm").pd.kv_handshake is None
    assert replica_front_line("sglang", [("HOST0", 8100), ("HOST1", 8100)]) == (
        "python -m sglang_router.launch_router --worker-urls http://HOST0:8100 "
        "http://HOST1:8100 --policy round_robin --host 0.0.0.0 --port 30000")
    assert sglang_router("--x", 1) == "python -m sglang_router.launch_router --x --host 0.0.0.0 " \
                                      "--port 1"
    assert vllm_router("--x", 2, " --y") == ("vllm-router --x --host 0.0.0.0 --port 2 --y  "
                                             "# pip install vllm-router")
