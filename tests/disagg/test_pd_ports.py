"""One port convention for every disaggregated launch line: `recommend`'s pools, a fixed
layout's workers (`latency`/`simulate`, a plan's `disaggregated_layout`), their router lines,
the Kubernetes manifests and the verify lines (capplan.plan.launch.DISAGG_PORTS,
pd_front_port; capplan.plan.placement.host_ports). A user comparing two outputs of one
deployment sees the same ports, and the front end points at the ports the workers listen on."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from capplan.catalog.loader import load_catalog
from capplan.models.disagg import INTER_NODE
from capplan.models.engine import EngineSettings, engine_profile
from capplan.plan.deployment import resolve_deployment
from capplan.plan.disagg import DisaggPlan, PoolPlan, launch_lines, placements
from capplan.plan.launch import DIST_PORT, DP_RPC_PORT, RAY_PORT, pd_front_port
from capplan.plan.launch_multinode import pd_launch
from capplan.plan.pd import make_layout
from capplan.plan.placement import host_ports


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(())


def _plan(catalog, engine: str) -> DisaggPlan:
    """2 prefill replicas of TP 1 and 2 decode replicas of TP 2 of Llama 3.1 8B: 6 H100s,
    one host."""
    pools = []
    for role, tp in (("prefill", 1), ("decode", 2)):
        dep = resolve_deployment(catalog, "llama-3.1-8b", "h100-sxm",
                                 EngineSettings(engine=engine, tp=tp))
        pools.append(PoolPlan(role, dep, 2, 1.0, 0.1, 0.01))
    return DisaggPlan(pools[0], pools[1], INTER_NODE, 0.001, 0.001, 0.2, 0.02)


def _port(cmd: str) -> int:
    words = shlex.split(re.sub(r"^(\d+ x: )?(node \d+: )?", "", cmd), comments=True)
    return int(words[words.index("--port") + 1])


def _front(line: str) -> tuple[int, list[int], list[int]]:
    """A router line's own port and the ports of the workers it names (prefill, decode)."""
    if line.startswith("trtllm-serve disaggregated"):
        cfg = yaml.safe_load(line.split(": ", 1)[1])
        return (cfg["port"], *[[int(u.rsplit(":", 1)[1]) for u in cfg[k]["urls"]]
                               for k in ("context_servers", "generation_servers")])
    words = shlex.split(line, comments=True)
    urls = {f: [int(words[i + 1].rsplit(":", 1)[1]) for i, w in enumerate(words) if w == f]
            for f in ("--prefill", "--decode")}
    return int(words[words.index("--port") + 1]), urls["--prefill"], urls["--decode"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_a_fixed_layout_listens_where_recommends_lines_do(catalog, engine) -> None:
    # the same pools as `recommend` sizes them and as a fixed layout (`latency --prefill-workers
    # 2 --decode-workers 2 ...`) gives them: the same worker ports, the same front-end port,
    # and each front end naming the ports its workers listen on
    p = _plan(catalog, engine)
    rec = launch_lines(p)
    rec_front = _front(next(v for k, v in rec.items() if k.endswith(("_router", "_proxy"))))
    where = placements(p)
    rec_ports = {r: [x.port for x in where if x.role == r] for r in ("prefill", "decode")}
    assert rec_front == (pd_front_port(engine), rec_ports["prefill"], rec_ports["decode"])
    assert rec_ports == {"prefill": [8100, 8101], "decode": [8200, 8201]}

    lay = make_layout(p.prefill.dep, 2, p.decode.dep, 2, "nvlink")
    fixed = pd_launch(lay)
    names = ("context", "generation") if engine == "trtllm" else ("prefill", "decode")
    fixed_ports = {r: [_port(fixed[f"{n} worker {i}"][0]) for i in range(2)]
                   for r, n in zip(("prefill", "decode"), names, strict=True)}
    assert fixed_ports == rec_ports
    assert _front(fixed["router"][0]) == rec_front


def _sglang_bootstraps(lines: list[str]) -> list[str]:
    return [w[w.index("--disaggregation-bootstrap-port") + 1]
            for w in (shlex.split(re.sub(r"^node \d+: ", "", x)) for x in lines)
            if "--disaggregation-bootstrap-port" in w]


def test_the_routers_bootstrap_ports_are_the_prefill_servers(catalog) -> None:
    # SGLang's router names each prefill server's bootstrap port after its URL: the port that
    # server's line binds, in the fixed layout as in recommend's lines
    p = _plan(catalog, "sglang")
    fixed = pd_launch(make_layout(p.prefill.dep, 2, p.decode.dep, 2, "nvlink"))
    words = shlex.split(fixed["router"][0])
    named = [words[i + 2] for i, w in enumerate(words) if w == "--prefill"]
    assert named == [b for i in range(2) for b in _sglang_bootstraps(fixed[f"prefill worker {i}"])]
    assert named == ["8998", "8999"]


def test_a_plan_files_fixed_layout_is_verified_at_its_routers_port() -> None:
    # the verify line of a plan's `disaggregated_layout` sends to the port its router line
    # listens on (SGLang's router: 30000, as recommend's P/D verify line)
    from capplan.api import run_plan

    doc = {"version": 1, "model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"]},
           "engine": {"name": "sglang", "max_model_len": 4096},
           "workloads": [{"name": "chat", "rate_per_s": 4, "input_len": 1000,
                          "output_len": 200, "slo": {"ttft_p99_s": 1.0}}],
           "disaggregated_layout": {"prefill": {"workers": 2, "tp": 1},
                                    "decode": {"workers": 1, "tp": 2}}}
    fixed = run_plan(doc, verify=False).to_dict()["fixed_disaggregated"]
    front, pre, dec = _front(fixed["launch"]["router"][0])
    assert (front, pre, dec) == (30000, [8100, 8101], [8200])
    words = shlex.split(fixed["bench"])
    assert words[words.index("--base-url") + 1] == f"http://localhost:{front}"


_WORKER = st.tuples(st.sampled_from(["prefill", "decode"]), st.sampled_from(["h0", "h1"]),
                    st.sampled_from([1, 2, 8, 16, 64]))


@given(st.sampled_from(["vllm", "sglang", "trtllm"]), st.lists(_WORKER, max_size=300))
def test_no_port_is_taken_twice_on_a_host(engine, workers) -> None:
    # every worker's HTTP port and its KV handshake ports (a vLLM server takes one per rank)
    # apart from every other's on its host and from the front end's and rendezvous ports, also
    # past a hundred workers of a role (8100 + 100 is the first decode port) or hundreds of
    # vLLM ranks (5600 + ranks reaches RAY_PORT, 6379)
    got = host_ports(engine, workers)
    spec = engine_profile(engine).pd.kv_handshake
    for host in ("h0", "h1"):
        taken = [pd_front_port(engine), DIST_PORT, DP_RPC_PORT, RAY_PORT]
        for (role, h, ranks), (http, kv) in zip(workers, got, strict=True):
            if h != host:
                continue
            taken.append(http)
            assert (kv is not None) == (spec is not None and role in spec.roles)
            if kv is not None:
                taken += range(kv, kv + (ranks if spec.per_rank else 1))
        assert len(taken) == len(set(taken))


def test_a_hosts_workers_take_the_next_ports() -> None:
    # the convention itself: the k-th worker of a role on a host on 8100 + k / 8200 + k, a
    # vLLM server's side channel past the ranks of those before it on its host, an SGLang
    # prefill server's bootstrap one past the one before; each host starts again
    workers = [("prefill", "a", 2), ("prefill", "a", 2), ("decode", "a", 4), ("prefill", "b", 2)]
    assert host_ports("vllm", workers) == [(8100, 5600), (8101, 5602), (8200, 5604), (8100, 5600)]
    assert host_ports("sglang", workers) == [(8100, 8998), (8101, 8999), (8200, None),
                                           (8100, 8998)]
    assert host_ports("trtllm", workers) == [(8100, None), (8101, None), (8200, None),
                                           (8100, None)]
