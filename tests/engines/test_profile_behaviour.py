"""The engine behaviour the profile states as data, field by field, in every profile of every
release (capplan.models.engine.VERSIONS): each value checked against what the engine does with
it (launch notation, multi-host launch, the P/D front end and its routing, the llm-d chart, the
memory flag's meaning). Sources in each profile's `sources` and docs/engines.md."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from capplan.errors import InputError
from capplan.export.k8s import Pool, _bootstrap_port, _kv_env
from capplan.export.llmd import vllm_only
from capplan.models.engine import (
    PROFILES,
    VERSIONS,
    EngineProfile,
    KvHandshake,
    MemoryAccounting,
    PdServing,
)
from capplan.models.layout import engine_world, tp_from_engine_notation
from capplan.plan.launch import (
    NODE_COMMANDS,
    LaunchOptions,
    default_port,
    launch_line,
    node_commands,
)
from capplan.plan.launch_multinode import FRONT_END_LINES, front_line
from capplan.plan.placement import REPLICA_FRONT_LINES, replica_front_line
from capplan.sim.pd import DECODE_ROUTED_AT

ALL = [p for versions in VERSIONS.values() for p in versions]
IDS = [p.spec for p in ALL]


def _opts(**kw: object) -> LaunchOptions:
    base: dict[str, object] = {
        "model_id": "org/model", "tp": 1, "max_num_seqs": 64, "max_num_batched_tokens": 4096,
        "memory_fraction": {"vllm": 0.9, "sglang": 0.85, "trtllm": 0.9},
        "max_model_len": 8192}
    return LaunchOptions(**{**base, **kw})


def _words(engine: str, **kw: object) -> str:
    return " ".join(launch_line(engine, _opts(**kw)).argv)


# --- tp_flag_is_world: the launch notation of TP and attention DP --------------------------

TP_IS_WORLD = {"vllm": False, "sglang": True, "trtllm": True}


@pytest.mark.parametrize("prof", ALL, ids=IDS)
def test_tp_flag_is_world_per_profile(prof: EngineProfile) -> None:
    assert prof.tp_flag_is_world is TP_IS_WORLD[prof.name]
    assert "layouts" in prof.sources


def test_sglang_tp8_dp8_is_8_gpus() -> None:
    # --tp 8 --enable-dp-attention --dp 8: 8 GPUs, 8 attention ranks of one GPU
    assert tp_from_engine_notation("sglang", 8, 8) == 1
    assert engine_world("sglang", 1, 8) == {"tp": 8, "dp": 8, "gpus": 8}
    assert "--tp 8 --enable-dp-attention --dp 8" in _words("sglang", tp=1, attention_dp=8)


def test_vllm_tp8_dp2_is_16_gpus() -> None:
    # --tensor-parallel-size 8 --data-parallel-size 2: two engines of 8 GPUs
    assert tp_from_engine_notation("vllm", 8, 2) == 8
    assert engine_world("vllm", 8, 2) == {"tp": 8, "dp": 2, "gpus": 16}
    assert ("--tensor-parallel-size 8 --data-parallel-size 2"
            in _words("vllm", tp=8, attention_dp=2))


def test_trtllm_tp8_with_attention_dp_is_8_gpus_of_attention_tp1() -> None:
    assert tp_from_engine_notation("trtllm", 8, 8) == 1
    assert engine_world("trtllm", 1, 8) == {"tp": 8, "dp": 8, "gpus": 8}
    line = launch_line("trtllm", _opts(tp=1, attention_dp=8))
    assert "--tp_size 8" in " ".join(line.argv)
    # attention DP is a line of its LLM-API options file, not a command-line flag
    assert PROFILES["trtllm"].flag_names["attention_dp"] in line.files["llm_api_options.yaml"]
    assert "attention_dp.yaml" not in " ".join(line.argv)
    with pytest.raises(InputError, match="enable_attention_dp"):
        tp_from_engine_notation("trtllm", 8, 2)


# --- multinode_launch: a replica over hosts ------------------------------------------------

MULTINODE = {"vllm": "dp-or-ray", "sglang": "node-rank", "trtllm": "mpirun"}
# SGLang's own router and vLLM's; TensorRT-LLM has none over aggregated servers (its
# disaggregated server fronts context and generation servers), so it takes vLLM's
REPLICA_ROUTER = {"vllm": "vllm-router", "sglang": "sglang-router", "trtllm": "vllm-router"}
LAUNCH_FIELDS = {  # field -> (its value per engine, the builders it names, its source key)
    "multinode_launch": (MULTINODE, NODE_COMMANDS, "multinode"),
    "replica_router": (REPLICA_ROUTER, REPLICA_FRONT_LINES, "replica_router")}


@pytest.mark.parametrize("field", list(LAUNCH_FIELDS))
@pytest.mark.parametrize("prof", ALL, ids=IDS)
def test_launch_fields_per_profile(prof: EngineProfile, field: str) -> None:
    want, builders, source = LAUNCH_FIELDS[field]
    assert getattr(prof, field) == want[prof.name]
    assert getattr(prof, field) in builders and source in prof.sources


@pytest.mark.parametrize(("engine", "want"), [
    ("sglang", ["--nnodes 2 --node-rank 0 --dist-init-addr", "--nnodes 2 --node-rank 1"]),
    ("trtllm", ["any node: mpirun -H NODE0_IP:8,NODE1_IP:8 -np 16 trtllm-llmapi-launch"]),
    ("vllm", ["ray start --head", "ray start --address NODE0_IP"]),
])
def test_a_replica_over_two_hosts_launches_as_its_engine_does(engine: str,
                                                              want: list[str]) -> None:
    o = _opts(tp=16, nodes=2)
    cmds = node_commands(launch_line(engine, o), o)
    assert len(cmds) == len(want)
    assert all(w in c for w, c in zip(want, cmds, strict=True)), cmds


def test_vllm_data_parallel_ranks_over_hosts() -> None:
    o = _opts(tp=8, attention_dp=2, nodes=2)
    cmds = node_commands(launch_line("vllm", o), o)
    assert "--data-parallel-size-local 1" in cmds[0]
    assert "--data-parallel-start-rank 1 --headless" in cmds[1]


# --- replica_router: the front end of an aggregated fleet of several replicas --------------

@pytest.mark.parametrize(("engine", "command"), [
    ("vllm", "vllm-router --worker-urls http://HOST0:8100 http://HOST1:8100 "),
    ("sglang", "python -m sglang_router.launch_router --worker-urls http://HOST0:8100 "
               "http://HOST1:8100 "),
    ("trtllm", "vllm-router --worker-urls http://HOST0:8100 http://HOST1:8100 "),
])
def test_replica_front_end_is_the_profiles(engine: str, command: str) -> None:
    line = replica_front_line(engine, [("HOST0", 8100), ("HOST1", 8100)])
    assert line.startswith(command)
    assert line.split("  #")[0].endswith(f"--port {default_port(engine)}")


# --- pd: the P/D front end, its decode routing, the KV handshake ---------------------------

PD = {"vllm": PdServing("vllm-router", decode_routed_at="prefill_done",
                        kv_host_env="VLLM_NIXL_SIDE_CHANNEL_HOST",
                        kv_handshake=KvHandshake(5600, ("prefill", "decode"), per_rank=True),
                        front_key="proxy", router_image="vllm/vllm-router:v0.1.17"),
      "sglang": PdServing("sglang-router", decode_routed_at="arrival",
                          router_takes_bootstrap_port=True,
                          kv_handshake=KvHandshake(8998, ("prefill",), per_rank=False)),
      "trtllm": PdServing("trtllm-disaggregated", decode_routed_at="prefill_done",
                          role_names=("context", "generation"),
                          router_policies={"round-robin": "round_robin",
                                           "least-outstanding": "load_balancing"})}


@pytest.mark.parametrize("prof", ALL, ids=IDS)
def test_pd_serving_per_profile(prof: EngineProfile) -> None:
    assert prof.pd == PD[prof.name]
    assert prof.pd.front_end in FRONT_END_LINES
    assert prof.pd.decode_routed_at in DECODE_ROUTED_AT
    assert "pd" in prof.sources


@pytest.mark.parametrize(("engine", "command"), [
    ("vllm", "vllm-router --vllm-pd-disaggregation"),
    ("sglang", "python -m sglang_router.launch_router --pd-disaggregation"),
    ("trtllm", "trtllm-serve disaggregated -c disagg_config.yaml"),
])
def test_front_end_is_the_profiles(engine: str, command: str) -> None:
    line = front_line(engine, [("P0", 8100)], [("D0", 8200)], bootstrap=[8998])
    assert line.startswith(command)
    # only SGLang's router names a prefill worker's bootstrap port after its URL
    named = "--prefill http://P0:8100 8998" in line
    assert named is PROFILES[engine].pd.router_takes_bootstrap_port


@pytest.mark.parametrize("engine", list(PROFILES))
def test_kubernetes_export_follows_the_pd_fields(engine: str) -> None:
    pre = Pool("p", engine, ["serve"], 1, 8, 8100, role="prefill")
    assert (_bootstrap_port(pre) is not None) is PD[engine].router_takes_bootstrap_port
    env = _kv_env(pre)
    assert [e["name"] for e in env] == [n for n in [PD[engine].kv_host_env] if n]
    assert _kv_env(Pool("a", engine, ["serve"], 1, 8, 8000)) == []  # aggregated: none


def test_vllm_advertises_its_side_channel_in_the_profiles_variable() -> None:
    line = launch_line("vllm", _opts(role="decode", kv_handshake=("DECODE0", 5600)))
    assert dict(line.env)[PROFILES["vllm"].pd.kv_host_env] == "DECODE0"


@pytest.mark.parametrize("engine", list(PROFILES))
def test_the_pd_replay_routes_decode_when_the_profile_says(engine: str) -> None:
    from capplan.plan.pd_sim import spec_of

    prof = PROFILES[engine]
    pool = SimpleNamespace(profile=prof, step=SimpleNamespace(request_overhead_s=0.05))
    layout = SimpleNamespace(prefill=pool, prefill_workers=1, decode=pool, decode_workers=1,
                             link=None, prefill_router="round-robin",
                             decode_router="round-robin")
    assert spec_of(layout).decode_routed_at == PD[engine].decode_routed_at


# --- llm_d_chart: what llm-d-modelservice runs ---------------------------------------------

@pytest.mark.parametrize("prof", ALL, ids=IDS)
def test_llm_d_chart_per_profile(prof: EngineProfile) -> None:
    assert prof.llm_d_chart is (prof.name == "vllm")
    if prof.llm_d_chart:
        assert "vllmServe" in prof.sources["llm_d"]


@pytest.mark.parametrize("engine", list(PROFILES))
def test_the_llm_d_export_runs_the_chart_engines_only(engine: str) -> None:
    if PROFILES[engine].llm_d_chart:
        vllm_only(engine)
        return
    with pytest.raises(InputError, match="llm-d-modelservice runs vLLM only"):
        vllm_only(engine)


def test_the_llm_d_export_refuses_an_engine_it_does_not_know() -> None:
    with pytest.raises(InputError, match="runs vLLM only .*sized for tgi"):
        vllm_only("tgi")


# --- memory: the fraction a launch flag means ----------------------------------------------

GIB = 2.0**30


@pytest.mark.parametrize("acc", [p.memory for p in ALL] + [
    MemoryAccounting("total", cudagraphs_in_budget=True)], ids=[*IDS, "total+graphs"])
def test_fraction_for_inverts_the_memory_rule(acc: MemoryAccounting) -> None:
    total, weights, act = 80 * GIB, 16 * GIB, 3 * GIB
    overheads = (1.5 * GIB, 0.7 * GIB, 0.6 * GIB)  # non-torch, CUDA graphs, context
    for kv in (1 * GIB, 20 * GIB, 50 * GIB):
        frac = acc.fraction_for(total, kv, weights, act, overheads)
        got = acc.kv_budget(total, frac, weights, act, overheads).kv_cache_bytes
        assert got == pytest.approx(kv, rel=1e-12)


def test_each_engines_fraction_is_its_flags_meaning() -> None:
    # vLLM's share of total, SGLang's static share of what the context leaves, TensorRT-LLM's
    # share of the memory free after load (docs/engines.md, the memory fraction row)
    total, w, act, kv = 80 * GIB, 16 * GIB, 3 * GIB, 40 * GIB
    ntorch, graphs, ctx = 1.5 * GIB, 0.7 * GIB, 0.6 * GIB
    got = {n: p.memory.fraction_for(total, kv, w, act, (ntorch, graphs, ctx))
           for n, p in PROFILES.items()}
    assert got == pytest.approx({
        "vllm": (w + act + ntorch + kv) / total,
        "sglang": (w + ntorch + kv) / (total - ctx),
        "trtllm": kv / (total - ctx - w - act - ntorch - graphs)})
