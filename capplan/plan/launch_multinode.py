"""Launch lines of a Deployment (one replica, every engine) and of a fixed prefill/decode layout
(every worker, then the router or proxy in front): one command per host, built by
capplan/plan/launch.py's builders (one per engine, their flag sources there) with
`node_commands` for a worker over hosts (the GPU catalog's `host_gpus`), each engine's memory
fraction from the planned memory, and the DeepEP words the step model costs
(`deepep_launch`). Its workers are placed on hosts, GPUs and ports as `recommend`'s pools are
(capplan.plan.placement.place). P/D front ends: SGLang `python -m sglang_router.launch_router
--pd-disaggregation --prefill URL --decode URL`; TensorRT-LLM `trtllm-serve disaggregated -c
disagg.yaml` in front of context and generation servers; vLLM's router.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from capplan.models.engine import engine_profile
from capplan.models.layout import nodes_spanned
from capplan.plan.deployment import Deployment
from capplan.plan.launch import (
    BUILDERS,
    LaunchOptions,
    deepep_launch,
    launch_line,
    node_commands,
    pd_front_port,
)
from capplan.plan.placement import (
    LOCALHOST,
    Placement,
    PoolShape,
    hosts_line,
    needs_hosts_line,
    on_hosts,
    pinned,
    place,
    router_urls,
    sglang_router,
    vllm_router,
)
from capplan.sim.pd import check_router


def deployment_options(dep: Deployment, role: str | None = None,
                       port: int | None = None) -> LaunchOptions:
    """A deployment's launch options: its settings, each engine's memory fraction from its
    planned memory (capplan.plan.flags.memory_fractions), the hosts it spans (the GPU
    catalog's `host_gpus`), the DeepEP words its step model costs; unpinned (`placed_text`
    pins a placed replica's GPUs)."""
    from capplan.plan.flags import memory_fractions

    s, m = dep.settings, dep.model
    host = dep.gpu.host_gpus
    words, option_lines = dep.profile.option_launch()  # its profile options, as options_from
    return LaunchOptions(
        model_id=dep.served_id or m.hf_id, tp=s.tp, pp=s.pp, attention_dp=s.attention_dp,
        expert_parallel=s.expert_parallel, max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        memory_fraction=memory_fractions(dep.memory), max_model_len=dep.memory.max_model_len,
        weight_dtype=s.weight_dtype,
        checkpoint_format=m.quantization.format if m.quantization else m.torch_dtype,
        kv_dtype=s.kv_dtype, port=port, role=role, host_overlap=dep.profile.host_overlap,
        nodes=nodes_spanned(dep.gpus_per_replica, host), gpus_per_node=host,
        deepep=deepep_launch(s, dep.gpu), extra={dep.profile.name: words} if words else {},
        llm_api_options=option_lines)


def pd_placements(engine: str, pools: Sequence[tuple[str, Deployment, int]]) -> list[Placement]:
    """Where a P/D layout's replicas run, pools given as (role, deployment, replicas) in
    launch order (capplan.plan.placement.place: their hosts, GPUs, HTTP and KV handshake
    ports)."""
    return place(engine, [PoolShape(role, n, dep.gpus_per_replica, dep.gpu.host_gpus,
                                    dep.gpu.key) for role, dep, n in pools])


def placed_text(dep: Deployment, role: str, at: Placement, engine: str | None = None) -> str:
    """The launch text of a P/D pool's replica placed `at`: its engine line pinned to its GPUs
    on its port, its KV handshake port (advertised at its host when the layout has several
    and the replica runs on one), one line per host ("node k: ...", the layout's host names),
    files after `#`."""
    eng = engine or dep.settings.profile.name
    o = pinned(deployment_options(dep, role), at)
    if at.kv_port is not None:
        host = at.host if at.host != LOCALHOST and o.nodes == 1 else None
        o = replace(o, kv_handshake=(host, at.kv_port))
    line = launch_line(eng, o)
    return "\n".join(with_files(on_hosts(node_commands(line, o), at), line))


def worker_lines(dep: Deployment, engine: str, port: int | None) -> list[str]:
    """One replica's commands, "node k: ..." per host (capplan.plan.launch.node_commands),
    unplaced: NODEk_IP is its k-th host's address."""
    o = deployment_options(dep, None, port)
    line = launch_line(engine, o)
    lines = node_commands(line, o)
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
    """Launch lines of a fixed P/D layout (capplan.plan.pd.PdLayout): every worker's commands
    placed as `recommend`'s pools are (`pd_placements`: hosts, GPUs pinned with
    CUDA_VISIBLE_DEVICES, prefill workers on 8100 + i and decode on 8200 + j of their host),
    then the router/proxy in front (on `pd_front_port`), then which worker runs where
    ("hosts", where the lines do not say it)."""
    eng = engine or layout.decode.profile.name
    names = dict(zip(("prefill", "decode"), engine_profile(eng).pd.role_names, strict=True))
    deps = {"prefill": layout.prefill, "decode": layout.decode}
    where = pd_placements(eng, [("prefill", layout.prefill, layout.prefill_workers),
                                ("decode", layout.decode, layout.decode_workers)])
    out: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for at in where:
        i = counts[at.role] = counts.get(at.role, -1) + 1
        out[f"{names[at.role]} worker {i}"] = placed_text(deps[at.role], at.role, at,
                                                          eng).split("\n")
    routers = (check_router(getattr(layout, "prefill_router", "round-robin")),
               check_router(getattr(layout, "decode_router", "round-robin")))
    urls = {role: [(x.host, x.port) for x in where if x.role == role] for role in deps}
    out["router"] = [front_line(eng, urls["prefill"], urls["decode"], routers,
                                bootstrap=[x.kv_port for x in where if x.role == "prefill"])]
    if needs_hosts_line(where):
        out["hosts"] = [hosts_line(where)]
    return out


TRTLLM_DISAGG_FILE = "disagg_config.yaml"
"""The file `trtllm-serve disaggregated -c` reads (its content on the line, as a comment)."""


def _missing_routers(eng: str, prefill: str, decode: str) -> str:
    """A note for a router the front end does not have ("" when it has both)."""
    names = engine_profile(eng).pd.router_policies
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
    names = engine_profile(engine).pd.router_policies
    front = PdFront(prefill, decode, (names.get(pol[0], "round_robin"),
                                      names.get(pol[1], "round_robin")),
                    pd_front_port(engine) if port is None else port, routers is not None,
                    bootstrap or [None] * len(prefill))
    line = FRONT_END_LINES[engine_profile(engine).pd.front_end](front)
    return line + (_missing_routers(engine, *pol) if routers is not None else "")


def _policy_words(f: PdFront) -> str:
    return f" --prefill-policy {f.policies[0]} --decode-policy {f.policies[1]}"


def _sglang_pd_router(f: PdFront) -> str:
    """SGLang's router (placement.sglang_router): one --prefill URL (and its bootstrap port)
    and one --decode URL per worker."""
    prefill = " ".join(f"--prefill http://{h}:{q}" + ("" if b is None else f" {b}")
                       for (h, q), b in zip(f.prefill, f.bootstrap, strict=True))
    return sglang_router(f"--pd-disaggregation {prefill} {router_urls(f.decode, '--decode')}",
                         f.port, _policy_words(f) if f.asked else "")


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


def _vllm_pd_router(f: PdFront) -> str:
    """vLLM's router (placement.vllm_router, `--vllm-pd-disaggregation`: prefill with
    max_tokens=1 and the NIXL kv_transfer_params, then decode on a decoder; one --prefill and
    one --decode URL per worker, round-robin by default rather than its cache_aware)."""
    return vllm_router(f"--vllm-pd-disaggregation {router_urls(f.prefill, '--prefill')} "
                       f"{router_urls(f.decode, '--decode')}", f.port,
                       _policy_words(f) if f.asked else " --policy round_robin")


FRONT_END_LINES: dict[str, Callable[[PdFront], str]] = {
    "sglang-router": _sglang_pd_router, "trtllm-disaggregated": _trtllm_disaggregated,
    "vllm-router": _vllm_pd_router}
"""The line of each P/D front end (PdServing.front_end)."""
