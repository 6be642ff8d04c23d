"""Launch lines for replicas that span nodes and for fixed prefill/decode layouts: one command
per node, complete (model, layout, context length, memory fraction, ports).

A recommendation's lines are capplan/plan/launch.py's (`node_commands` for a replica over
hosts); the lines here are built from a Deployment with the engine profile's flag names, with
the same host counts (the GPU catalog's `host_gpus`) and placeholders. Sources of the
multi-node flags:
- vLLM data parallel across nodes (docs "Data Parallel Deployment", v0.10): `vllm serve M
  --data-parallel-size D --data-parallel-size-local L --data-parallel-address HEAD
  --data-parallel-rpc-port P`, the other nodes `--headless --data-parallel-start-rank k`;
  TP wider than a node runs on a Ray cluster (`--distributed-executor-backend ray`);
  expert parallelism `--enable-expert-parallel`;
- SGLang (python/sglang/srt/server_args.py, v0.5): `--nnodes N --node-rank r
  --dist-init-addr HEAD:PORT` on every node, `--enable-dp-attention --dp D`, `--ep-size E`;
  P/D `--disaggregation-mode prefill|decode`
  and `python -m sglang_router.launch_router --pd-disaggregation --prefill URL --decode URL`;
- TensorRT-LLM (docs "trtllm-serve", 1.x): `mpirun -H node0:8,node1:8 -np W
  trtllm-llmapi-launch trtllm-serve M --backend pytorch --tp_size W --ep_size E`;
  disaggregated `trtllm-serve disaggregated -c disagg.yaml` in front of context and
  generation servers.
Every engine's line runs the DeepEP mode its step model costs (`deepep_words`: the engine
profile's `deepep_flags`), so no engine falls back to its default all-gather backend.
"""

from __future__ import annotations

from typing import Any

from capplan.models.engine import launch_limit
from capplan.models.layout import engine_world, nodes_spanned
from capplan.plan.deployment import Deployment
from capplan.plan.launch import DIST_PORT, DP_RPC_PORT, HEAD, deepep_launch, split_env
from capplan.sim.pd import check_router

SERVE_PORT = 8000


def _common(dep: Deployment) -> dict[str, str]:
    s, f = dep.settings, dep.profile.flag_names
    seqs = launch_limit(dep.profile, s.max_num_seqs, s.attention_dp)
    budget = launch_limit(dep.profile, s.max_num_batched_tokens, s.attention_dp)
    out = {"max_model_len": f"{f['max_model_len']} {dep.memory.max_model_len}",
           "memory_fraction": f"{f['memory_fraction']} {s.gpu_memory_utilization:g}",
           "max_num_seqs": f"{f['max_num_seqs']} {seqs}",
           "max_num_batched_tokens": f"{f['max_num_batched_tokens']} {budget}"}
    if s.kv_dtype == "fp8" and "kv_fp8" in f:
        out["kv"] = f["kv_fp8"]
    return out


def deepep_words(dep: Deployment, engine: str) -> tuple[list[str], str]:
    """(NAME=VALUE environment words, flags) of `engine`'s line that run the DeepEP mode its
    step model costs for the replica (capplan.plan.launch.deepep_launch); nothing when it
    runs no DeepEP."""
    env, flags = split_env(deepep_launch(dep.settings, dep.gpu).get(engine, ""))
    return [f"{k}={v}" for k, v in env], "".join(f" {w}" for w in flags)


def _vllm(dep: Deployment, port: int, extra: str = "") -> list[str]:
    s = dep.settings
    per_node = dep.gpu.host_gpus
    n = nodes_spanned(dep.gpus_per_replica, per_node)
    c = " ".join(_common(dep).values())
    env, a2a = deepep_words(dep, "vllm")
    ep = (" --enable-expert-parallel" if s.expert_parallel > 1 else "") + a2a
    model = "".join(f"{w} " for w in env) + "vllm serve " + dep.served_id
    pp = f" --pipeline-parallel-size {s.pp}" if s.pp > 1 else ""
    if s.attention_dp > 1 and s.tp * s.pp <= per_node:
        local = max(1, per_node // (s.tp * s.pp))
        head = (f"{model} --tensor-parallel-size {s.tp}{pp} --data-parallel-size "
                f"{s.attention_dp} --data-parallel-size-local {min(local, s.attention_dp)} "
                f"--data-parallel-address {HEAD} --data-parallel-rpc-port {DP_RPC_PORT}{ep} "
                f"{c} --port {port}{extra}")
        lines = [f"node 0: {head}"]
        for k in range(1, n):
            lines.append(f"node {k}: {model} --tensor-parallel-size {s.tp}{pp} "
                         f"--data-parallel-size {s.attention_dp} --data-parallel-size-local "
                         f"{local} --data-parallel-start-rank {k * local} "
                         f"--data-parallel-address {HEAD} --data-parallel-rpc-port "
                         f"{DP_RPC_PORT}{ep} {c} --headless{extra}")
        return lines
    serve = f"{model} --tensor-parallel-size {s.tp}{pp}{ep} {c} --port {port}" + extra
    if n == 1:
        return [f"node 0: {serve}"]
    return ([f"node 0: ray start --head --port 6379 && {serve} "
             "--distributed-executor-backend ray"]
            + [f"node {k}: ray start --address {HEAD}:6379 --block" for k in range(1, n)])


def _sglang(dep: Deployment, port: int, extra: str = "") -> list[str]:
    s = dep.settings
    w = engine_world("sglang", s.tp, s.attention_dp)
    n = nodes_spanned(dep.gpus_per_replica, dep.gpu.host_gpus)
    env, a2a = deepep_words(dep, "sglang")
    parts = [*env, f"python -m sglang.launch_server --model-path {dep.served_id} --tp {w['tp']}"]
    if s.pp > 1:
        parts.append(f"--pp-size {s.pp}")
    if s.attention_dp > 1:
        parts.append(f"--enable-dp-attention --dp {s.attention_dp}")
    if s.expert_parallel > 1:
        parts.append(f"--ep-size {s.expert_parallel}{a2a}")
    parts += list(_common(dep).values()) + ["--trust-remote-code"]
    base = " ".join(parts)
    if n == 1:
        return [f"node 0: {base} --host 0.0.0.0 --port {port}{extra}"]
    return [f"node {k}: {base} --nnodes {n} --node-rank {k} --dist-init-addr {HEAD}:{DIST_PORT}"
            + (f" --host 0.0.0.0 --port {port}" if k == 0 else "") + extra for k in range(n)]


def _trtllm(dep: Deployment, port: int) -> list[str]:
    s = dep.settings
    w = engine_world("trtllm", s.tp, s.attention_dp)
    per_node = dep.gpu.host_gpus
    n = nodes_spanned(dep.gpus_per_replica, per_node)
    c = " ".join(v for k, v in _common(dep).items() if k != "kv")
    ep = f" --ep_size {s.expert_parallel}" if s.expert_parallel > 1 else ""
    pp = f" --pp_size {s.pp}" if s.pp > 1 else ""
    yaml = " --extra_llm_api_options attention_dp.yaml" if s.attention_dp > 1 else ""
    env, _ = deepep_words(dep, "trtllm")
    # DeepEP runs in the WIDEEP MoE backend (fused_moe_wide_ep.py), set in the options file
    note = ("  # attention_dp.yaml: enable_attention_dp: true"
            + (", moe_config: {backend: WIDEEP}" if env else "")) if yaml else ""
    serve = (f"trtllm-serve {dep.served_id} --backend pytorch --tp_size {w['tp']}{pp}{ep} {c}"
             f"{yaml} --host 0.0.0.0 --port {port}")
    if n == 1:
        return ["node 0: " + "".join(f"{e} " for e in env) + serve + note]
    hosts = ",".join(f"node{k}:{min(per_node, dep.gpus_per_replica)}" for k in range(n))
    return ["any node: mpirun " + "".join(f"-x {e} " for e in env)
            + f"-H {hosts} -np {dep.gpus_per_replica} trtllm-llmapi-launch {serve}{note}"]


def replica_launch(dep: Deployment, port: int = SERVE_PORT) -> dict[str, list[str]]:
    """One command per node for one replica, per engine (the deployment's own engine first)."""
    return {"vllm": _vllm(dep, port), "sglang": _sglang(dep, port), "trtllm": _trtllm(dep, port)}


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
        mode = f" --disaggregation-mode {role} --disaggregation-transfer-backend nixl"
        for i, port in enumerate(ports):
            out[f"{role} worker {i}"] = _sglang(dep, port, mode)
    out["router"] = [
        "python -m sglang_router.launch_router --pd-disaggregation "
        + " ".join(f"--prefill http://PREFILL{i}:{q}" for i, q in enumerate(pre)) + " "
        + " ".join(f"--decode http://DECODE{j}:{q}" for j, q in enumerate(dec))
        + f" --host 0.0.0.0 --port {SERVE_PORT}"]
    return out


def _pd_trtllm(p: Deployment, d: Deployment, pre: list[int], dec: list[int]
               ) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for role, dep, ports in (("context", p, pre), ("generation", d, dec)):
        for i, port in enumerate(ports):
            out[f"{role} worker {i}"] = _trtllm(dep, port)
    out["router"] = [
        f"trtllm-serve disaggregated -c disagg.yaml  # disagg.yaml: port {SERVE_PORT}, "
        f"context_servers urls PREFILL0:{pre[0]}.., generation_servers urls "
        f"DECODE0:{dec[0]}.., cache_transceiver_config on both"]
    return out


def _pd_vllm(p: Deployment, d: Deployment, pre: list[int], dec: list[int]
             ) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    kv = " --kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'"
    for role, dep, ports in (("prefill", p, pre), ("decode", d, dec)):
        for i, port in enumerate(ports):
            out[f"{role} worker {i}"] = _vllm(dep, port, kv)
    # vLLM's NIXL proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py):
    # prefill with max_tokens=1, then decode on a decoder
    out["router"] = [
        "python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --host 0.0.0.0 "
        f"--port {SERVE_PORT} --prefiller-hosts "
        + " ".join(f"PREFILL{i}" for i in range(len(pre)))
        + " --prefiller-ports " + " ".join(map(str, pre))
        + " --decoder-hosts " + " ".join(f"DECODE{j}" for j in range(len(dec)))
        + " --decoder-ports " + " ".join(map(str, dec))]
    return out
