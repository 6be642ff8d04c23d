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

from typing import Any

import yaml

from capplan.models.layout import nodes_spanned
from capplan.plan.deployment import Deployment
from capplan.plan.launch import (
    BUILDERS,
    HEAD,
    LaunchOptions,
    deepep_launch,
    launch_line,
    node_commands,
)
from capplan.sim.pd import check_router

SERVE_PORT = 8000


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
    return LaunchOptions(
        model_id=dep.served_id or m.hf_id, tp=s.tp, pp=s.pp, attention_dp=s.attention_dp,
        expert_parallel=s.expert_parallel, max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        memory_fraction=memory_fractions(dep.memory), max_model_len=dep.memory.max_model_len,
        weight_dtype=s.weight_dtype,
        checkpoint_format=m.quantization.format if m.quantization else m.torch_dtype,
        kv_dtype=s.kv_dtype, port=port, role=role, nodes=nodes, gpus_per_node=host,
        gpu_ids=gpus, deepep=deepep_launch(s, dep.gpu))


def worker_lines(dep: Deployment, engine: str, port: int, role: str | None = None,
                 head: str = HEAD) -> list[str]:
    """One worker's commands, "node k: ..." per host (capplan.plan.launch.node_commands);
    `head`: the placeholder of the worker's first host's address."""
    o = deployment_options(dep, role, port)
    line = launch_line(engine, o)
    lines = [x.replace(HEAD, head) for x in node_commands(line, o)]
    if o.nodes == 1:
        lines = [f"node 0: {lines[0]}"]
    for name, text in line.files.items():  # the file a line reads, on the line it shows
        flow = yaml.safe_dump(yaml.safe_load(text), default_flow_style=True).strip()
        lines[-1] += f"  # {name}: {flow}"
    return lines


def replica_launch(dep: Deployment, port: int = SERVE_PORT) -> dict[str, list[str]]:
    """One command per host for one replica, per engine."""
    return {engine: worker_lines(dep, engine, port) for engine in BUILDERS}


def pd_launch(layout: Any, engine: str | None = None) -> dict[str, list[str]]:
    """Launch lines of a fixed P/D layout (capplan.plan.pd.PdLayout): every worker's commands,
    then the router/proxy in front (ports: prefill workers 30000 + i, decode 31000 + j)."""
    eng = engine or layout.decode.settings.engine
    pre = [30000 + i for i in range(layout.prefill_workers)]
    dec = [31000 + j for j in range(layout.decode_workers)]
    build = {"sglang": _pd_sglang, "trtllm": _pd_trtllm}.get(eng, _pd_vllm)
    out = build(layout.prefill, layout.decode, pre, dec)
    routers = (check_router(getattr(layout, "prefill_router", "round-robin")),
               check_router(getattr(layout, "decode_router", "round-robin")))
    out["router"] = [_with_routers(eng, out["router"][0], *routers)]
    return out


# Each front end's name for the replay's routers (capplan.sim.pd.ROUTERS), None where it has
# none: sglang_router `--prefill-policy/--decode-policy` random|round_robin|cache_aware|
# power_of_two (its default cache_aware); TensorRT-LLM's disaggregated server
# `router.type` round_robin (default)|load_balancing (fewest requests in flight)|
# kv_cache_aware (tensorrt_llm/serve/router.py create_router); vLLM's NIXL proxy cycles
# through its workers (toy_proxy_server.py get_next_client: round-robin only).
_ROUTER_NAMES = {"sglang": {"round-robin": "round_robin", "random": "random"},
                 "trtllm": {"round-robin": "round_robin", "least-outstanding": "load_balancing"},
                 "vllm": {"round-robin": "round_robin"}}


def _with_routers(eng: str, line: str, prefill: str, decode: str) -> str:
    """The front end's line set to the routers the replay assumed (`_ROUTER_NAMES`), with a
    note for a router the front end does not have."""
    names = _ROUTER_NAMES.get(eng, _ROUTER_NAMES["vllm"])
    missing = [f"{role} {r}" for role, r in (("prefill", prefill), ("decode", decode))
               if r not in names]
    if eng == "sglang":
        line += (f" --prefill-policy {names.get(prefill, 'round_robin')}"
                 f" --decode-policy {names.get(decode, 'round_robin')}")
    elif eng == "trtllm":
        line += (f", context_servers router type {names.get(prefill, 'round_robin')}, "
                 f"generation_servers router type {names.get(decode, 'round_robin')}")
    if missing:
        line += (f"  # this front end has no {' / '.join(missing)} router: "
                 "round-robin is launched; the replay's figures assumed the router asked for")
    return line


def _pd_sglang(p: Deployment, d: Deployment, pre: list[int], dec: list[int]
               ) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for role, dep, ports in (("prefill", p, pre), ("decode", d, dec)):
        for i, port in enumerate(ports):
            out[f"{role} worker {i}"] = worker_lines(dep, "sglang", port, role,
                                                     f"{role.upper()}{i}")
    out["router"] = [front_line("sglang", [(f"PREFILL{i}", q) for i, q in enumerate(pre)],
                                [(f"DECODE{j}", q) for j, q in enumerate(dec)])]
    return out


def _pd_trtllm(p: Deployment, d: Deployment, pre: list[int], dec: list[int]
               ) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for role, dep, ports, name in (("context", p, pre, "PREFILL"),
                                   ("generation", d, dec, "DECODE")):
        for i, port in enumerate(ports):
            out[f"{role} worker {i}"] = worker_lines(dep, "trtllm", port, head=f"{name}{i}")
    out["router"] = [
        f"trtllm-serve disaggregated -c disagg.yaml  # disagg.yaml: port {SERVE_PORT}, "
        f"context_servers urls PREFILL0:{pre[0]}.., generation_servers urls "
        f"DECODE0:{dec[0]}.., cache_transceiver_config on both"]
    return out


def _pd_vllm(p: Deployment, d: Deployment, pre: list[int], dec: list[int]
             ) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for role, dep, ports in (("prefill", p, pre), ("decode", d, dec)):
        for i, port in enumerate(ports):
            out[f"{role} worker {i}"] = worker_lines(dep, "vllm", port, role,
                                                     f"{role.upper()}{i}")
    out["router"] = [front_line("vllm", [(f"PREFILL{i}", q) for i, q in enumerate(pre)],
                                [(f"DECODE{j}", q) for j, q in enumerate(dec)])]
    return out


def front_line(engine: str, prefill: list[tuple[str, int]], decode: list[tuple[str, int]],
               routers: tuple[str, str] | None = None, port: int = SERVE_PORT) -> str:
    """The router or proxy in front of P/D workers, each at (host, port), every one of them
    listed: SGLang's router (one --prefill and one --decode URL per worker); otherwise vLLM's
    NIXL proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py: prefill with
    max_tokens=1, then decode on a decoder; hosts and ports as parallel lists). `routers`
    (prefill, decode): set the front end's policies to those (`_with_routers`)."""
    if engine == "sglang":
        line = ("python -m sglang_router.launch_router --pd-disaggregation "
                + " ".join(f"--prefill http://{h}:{q}" for h, q in prefill) + " "
                + " ".join(f"--decode http://{h}:{q}" for h, q in decode)
                + f" --host 0.0.0.0 --port {port}")
    else:
        line = ("python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --host "
                f"0.0.0.0 --port {port} --prefiller-hosts " + " ".join(h for h, _ in prefill)
                + " --prefiller-ports " + " ".join(str(q) for _, q in prefill)
                + " --decoder-hosts " + " ".join(h for h, _ in decode)
                + " --decoder-ports " + " ".join(str(q) for _, q in decode))
    return line if routers is None else _with_routers(engine, line, *routers)
