"""Launch lines of a Deployment (one replica, every engine) and of a fixed prefill/decode layout
(every worker, then the router or proxy in front): one command per host, built by
capplan/plan/launch.py's builders (one per engine, their flag sources there) with
`node_commands` for a worker over hosts (the GPU catalog's `host_gpus`), each engine's memory
fraction from the planned memory, and the DeepEP words the step model costs
(`deepep_launch`). P/D front ends: SGLang `python -m sglang_router.launch_router
--pd-disaggregation --prefill URL --decode URL`; TensorRT-LLM `trtllm-serve disaggregated -c
disagg.yaml` in front of context and generation servers; vLLM's NIXL proxy.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import yaml

from capplan.errors import InputError
from capplan.models.engine import engine_profile
from capplan.models.layout import nodes_spanned
from capplan.plan.deployment import Deployment
from capplan.plan.launch import (
    BUILDERS,
    DISAGG_PORTS,
    DIST_PORT,
    DP_RPC_PORT,
    HEAD,
    KV_HANDSHAKE,
    RAY_PORT,
    LaunchOptions,
    deepep_launch,
    launch_line,
    node_commands,
    pd_front_port,
)
from capplan.sim.pd import check_router

MAX_PORT = 65535


def deployment_options(dep: Deployment, role: str | None = None, port: int | None = None,
                       first_gpu: int | None = None) -> LaunchOptions:
    """A deployment's launch options: its settings, each engine's memory fraction from its
    planned memory (capplan.plan.flags.memory_fractions), the hosts it spans (the GPU
    catalog's `host_gpus`), the DeepEP words its step model costs; `first_gpu` pins a
    one-host worker's GPUs (CUDA_VISIBLE_DEVICES)."""
    from capplan.plan.flags import memory_fractions

    s, m = dep.settings, dep.model
    host = dep.gpu.host_gpus
    nodes = nodes_spanned(dep.gpus_per_replica, host)
    gpus = (tuple(range(first_gpu, first_gpu + dep.gpus_per_replica))
            if first_gpu is not None and nodes == 1 else ())
    words, option_lines = dep.profile.option_launch()  # its profile options, as options_from
    return LaunchOptions(
        model_id=dep.served_id or m.hf_id, tp=s.tp, pp=s.pp, attention_dp=s.attention_dp,
        expert_parallel=s.expert_parallel, max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        memory_fraction=memory_fractions(dep.memory), max_model_len=dep.memory.max_model_len,
        weight_dtype=s.weight_dtype,
        checkpoint_format=m.quantization.format if m.quantization else m.torch_dtype,
        kv_dtype=s.kv_dtype, port=port, role=role, host_overlap=dep.profile.host_overlap,
        nodes=nodes, gpus_per_node=host, gpu_ids=gpus, deepep=deepep_launch(s, dep.gpu),
        extra={dep.profile.name: words} if words else {}, llm_api_options=option_lines)


def pd_ports(engine: str, workers: list[tuple[str, str, int]]) -> list[tuple[int, int | None]]:
    """Each disaggregated worker's (HTTP port, KV handshake port), the workers given as (role,
    host, ranks) in launch order. HTTP: from its role's DISAGG_PORTS up, the k-th worker of a
    role on a host on the k-th port (8100, 8101, ...). KV handshake (KV_HANDSHAKE; None for a
    role that listens on none, or an engine without one): from the engine's default up, a
    host's workers apart by the ranks of those before it (vLLM's side channel takes one port
    per rank) or by one (SGLang's bootstrap servers). No port is taken twice on a host, nor the
    front end's (`pd_front_port`) or a rendezvous port (DIST_PORT, DP_RPC_PORT, RAY_PORT): a
    port already taken moves a worker to the next free one (only a host of hundreds of
    workers gets there)."""
    spec = KV_HANDSHAKE.get(engine)
    reserved = {pd_front_port(engine), DIST_PORT, DP_RPC_PORT, RAY_PORT}
    used: dict[str, set[int]] = {}
    cursor: dict[tuple[str, str], int] = {}
    out: list[tuple[int, int | None]] = []
    for role, host, ranks in workers:
        taken = used.setdefault(host, set(reserved))
        http = _free_ports(taken, cursor.get((host, role), DISAGG_PORTS[role]), 1)
        cursor[(host, role)] = http + 1
        kv = None
        if spec is not None and role in spec[1]:
            width = ranks if spec[2] else 1
            kv = _free_ports(taken, cursor.get((host, "kv"), spec[0]), width)
            cursor[(host, "kv")] = kv + width
        out.append((http, kv))
    return out


def _free_ports(taken: set[int], start: int, width: int) -> int:
    """The first of `width` consecutive ports from `start` none of which is `taken` (which
    they join)."""
    port = start
    while any(p in taken for p in range(port, port + width)):
        port += 1
    if port + width - 1 > MAX_PORT:
        raise InputError(f"the launch lines need ports past {MAX_PORT} on one host: a layout of "
                         "this many workers does not fit one host's ports; give fewer workers")
    taken.update(range(port, port + width))
    return port


def worker_lines(dep: Deployment, engine: str, port: int | None, role: str | None = None,
                 head: str = HEAD, kv_port: int | None = None) -> list[str]:
    """One worker's commands, "node k: ..." per host (capplan.plan.launch.node_commands);
    `head`: the placeholder of the worker's first host's address; `kv_port`: its KV handshake
    port (`pd_ports`), advertised at `head` when the worker runs on one host."""
    o = deployment_options(dep, role, port)
    if kv_port is not None:
        o = replace(o, kv_handshake=(head if o.nodes == 1 else None, kv_port))
    line = launch_line(engine, o)
    lines = [x.replace(HEAD, head) for x in node_commands(line, o)]
    if head != HEAD:  # NODEk_IP (a host's own address: launch._side_channel_at) as its own
        lines = [re.sub(r"\bNODE(\d+)_IP\b", lambda m: f"{head}_NODE{m.group(1)}", x)
                 for x in lines]
    if o.nodes == 1:
        lines = [f"node 0: {lines[0]}"]
    return with_files(lines, line)


def with_files(lines: list[str], line: Any) -> list[str]:
    """`lines` (a replica's commands) with each file its launch line reads on the last one,
    after `#`: NAME: its YAML in flow style."""
    lines = list(lines)
    for name, text in line.files.items():
        lines[-1] += f"  # {name}: {flow_yaml(yaml.safe_load(text))}"
    return lines


def flow_yaml(obj: Any, sort_keys: bool = True) -> str:
    """`obj` as YAML in flow style on one line (a file's content after a line's `#`, which the
    Kubernetes export reads back: capplan.export.k8s._line_files)."""
    return yaml.safe_dump(obj, default_flow_style=True, sort_keys=sort_keys,
                          width=1 << 20).strip()


def replica_launch(dep: Deployment, port: int | None = None) -> dict[str, list[str]]:
    """One command per host for one replica, per engine (`port` None: each engine's default,
    as a plan's lines have it)."""
    return {engine: worker_lines(dep, engine, port) for engine in BUILDERS}


def pd_launch(layout: Any, engine: str | None = None) -> dict[str, list[str]]:
    """Launch lines of a fixed P/D layout (capplan.plan.pd.PdLayout): every worker's commands,
    then the router/proxy in front, on the ports `recommend`'s lines use (`pd_ports`: prefill
    workers 8100 + i, decode 8200 + j; the front end on `pd_front_port`)."""
    eng = engine or layout.decode.profile.name
    names = {"trtllm": ("context", "generation")}.get(eng, ("prefill", "decode"))
    pools = (("prefill", names[0], layout.prefill, layout.prefill_workers),
             ("decode", names[1], layout.decode, layout.decode_workers))
    # the workers' hosts are placeholders that may name one machine: their ports all apart
    ports = iter(pd_ports(eng, [(role, "any", dep.gpus_per_replica)
                                for role, _, dep, n in pools for _ in range(n)]))
    out: dict[str, list[str]] = {}
    urls: dict[str, list[tuple[str, int]]] = {"prefill": [], "decode": []}
    boot: list[int | None] = []
    for role, name, dep, n in pools:
        for i in range(n):
            port, kv = next(ports)
            boot += [kv] if role == "prefill" else []
            urls[role].append((f"{role.upper()}{i}", port))
            out[f"{name} worker {i}"] = worker_lines(dep, eng, port, role,
                                                     f"{role.upper()}{i}", kv)
    routers = (check_router(getattr(layout, "prefill_router", "round-robin")),
               check_router(getattr(layout, "decode_router", "round-robin")))
    out["router"] = [front_line(eng, urls["prefill"], urls["decode"], routers, bootstrap=boot)]
    return out


# Each front end's name for the replay's routers (capplan.sim.pd.ROUTERS), None where it has
# none: sglang_router `--prefill-policy/--decode-policy` random|round_robin|cache_aware|
# power_of_two (its default cache_aware); TensorRT-LLM's disaggregated server
# `router.type` round_robin (default)|load_balancing (fewest requests in flight)|
# kv_cache_aware (tensorrt_llm/serve/router.py create_router); vLLM's router (vllm-project/
# router, a fork of SGLang's: `--policy`, `--prefill-policy/--decode-policy` random|
# round_robin|cache_aware|power_of_two|consistent_hash, its default cache_aware).
_ROUTER_NAMES = {"sglang": {"round-robin": "round_robin", "random": "random"},
                 "trtllm": {"round-robin": "round_robin", "least-outstanding": "load_balancing"},
                 "vllm": {"round-robin": "round_robin", "random": "random"}}
VLLM_ROUTER_INSTALL = "pip install vllm-router"
"""Where vLLM's P/D front end comes from: the vllm-project/router package on PyPI (the NIXL
proxy of vLLM's tests, toy_proxy_server.py, ships only in a source checkout)."""
TRTLLM_DISAGG_FILE = "disagg_config.yaml"
"""The file `trtllm-serve disaggregated -c` reads (its content on the line, as a comment)."""


def _missing_routers(eng: str, prefill: str, decode: str) -> str:
    """A note for a router the front end does not have ("" when it has both)."""
    names = _ROUTER_NAMES.get(eng, _ROUTER_NAMES["vllm"])
    missing = [f"{role} {r}" for role, r in (("prefill", prefill), ("decode", decode))
               if r not in names]
    return (f"  # this front end has no {' / '.join(missing)} router: round-robin is "
            "launched; the replay's figures assumed the router asked for" if missing else "")


@dataclass(frozen=True)
class PdFront:
    """What a P/D front end's line lists: every worker at (host, port), the routers' policies
    in the front end's own names, where it listens, whether the policies were asked for (else
    the front end's default line), each prefill worker's bootstrap port (None: the default)."""

    prefill: list[tuple[str, int]]
    decode: list[tuple[str, int]]
    policies: tuple[str, str]
    port: int
    asked: bool
    bootstrap: list[int | None]


def front_line(engine: str, prefill: list[tuple[str, int]], decode: list[tuple[str, int]],
               routers: tuple[str, str] | None = None, port: int | None = None,
               bootstrap: list[int | None] | None = None) -> str:
    """The router or proxy in front of P/D workers, each at (host, port), every one of them
    listed: the engine profile's front end (PdServing.front_end, FRONT_END_LINES). `routers`
    (prefill, decode): the front end's policies (round-robin when None); `port`: where it
    listens (None: `pd_front_port`); `bootstrap`: each prefill worker's bootstrap port, which
    SGLang's router takes after its URL (None: the default)."""
    pol = routers or ("round-robin", "round-robin")
    names = _ROUTER_NAMES.get(engine, _ROUTER_NAMES["vllm"])
    front = PdFront(prefill, decode, (names.get(pol[0], "round_robin"),
                                      names.get(pol[1], "round_robin")),
                    pd_front_port(engine) if port is None else port, routers is not None,
                    bootstrap or [None] * len(prefill))
    line = FRONT_END_LINES[engine_profile(engine).pd.front_end](front)
    return line + (_missing_routers(engine, *pol) if routers is not None else "")


def _urls(flag: str, workers: list[tuple[str, int]]) -> str:
    return " ".join(f"{flag} http://{h}:{q}" for h, q in workers)


def _policy_words(f: PdFront) -> str:
    return f" --prefill-policy {f.policies[0]} --decode-policy {f.policies[1]}"


def _sglang_router(f: PdFront) -> str:
    """SGLang's router: one --prefill URL (and its bootstrap port) and one --decode URL per
    worker."""
    line = ("python -m sglang_router.launch_router --pd-disaggregation "
            + " ".join(f"--prefill http://{h}:{q}" + ("" if b is None else f" {b}")
                       for (h, q), b in zip(f.prefill, f.bootstrap, strict=True)) + " "
            + _urls("--decode", f.decode) + f" --host 0.0.0.0 --port {f.port}")
    return line + (_policy_words(f) if f.asked else "")


def _trtllm_disaggregated(f: PdFront) -> str:
    """TensorRT-LLM's disaggregated server (tensorrt_llm/llmapi/disagg_utils.py
    extract_disagg_cfg: hostname, port, context_servers and generation_servers with
    num_instances, urls and router.type; the file's content on the line after `#`)."""
    cfg: dict[str, Any] = {"hostname": "0.0.0.0", "port": f.port, "backend": "pytorch"}
    for key, urls, r in (("context_servers", f.prefill, f.policies[0]),
                         ("generation_servers", f.decode, f.policies[1])):
        cfg[key] = {"num_instances": len(urls), "router": {"type": r},
                    "urls": [f"{h}:{q}" for h, q in urls]}
    return (f"trtllm-serve disaggregated -c {TRTLLM_DISAGG_FILE}  # {TRTLLM_DISAGG_FILE}: "
            f"{flow_yaml(cfg, sort_keys=False)}")


def _vllm_router(f: PdFront) -> str:
    """vLLM's router (`pip install vllm-router`, `--vllm-pd-disaggregation`: prefill with
    max_tokens=1 and the NIXL kv_transfer_params, then decode on a decoder; one --prefill and
    one --decode URL per worker, round-robin by default rather than its cache_aware)."""
    line = ("vllm-router --vllm-pd-disaggregation " + _urls("--prefill", f.prefill) + " "
            + _urls("--decode", f.decode) + f" --host 0.0.0.0 --port {f.port}")
    line += _policy_words(f) if f.asked else " --policy round_robin"
    return line + f"  # {VLLM_ROUTER_INSTALL}"


FRONT_END_LINES: dict[str, Callable[[PdFront], str]] = {
    "sglang-router": _sglang_router, "trtllm-disaggregated": _trtllm_disaggregated,
    "vllm-router": _vllm_router}
"""The line of each P/D front end (PdServing.front_end)."""
