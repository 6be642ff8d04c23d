"""`recommend`'s disaggregated launch lines: where every replica runs, and a front end that
lists every one of them (a router that names only the first decode replica leaves the others
idle and the pool short of the rate it was sized for)."""

from __future__ import annotations

import shlex

import pytest

from capplan.catalog.loader import load_catalog
from capplan.models.disagg import INTER_NODE
from capplan.models.engine import EngineSettings
from capplan.plan.deployment import resolve_deployment
from capplan.plan.disagg import DisaggPlan, PoolPlan, launch_lines, placements, replica_lines


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(())


def _plan(catalog, model: str, gpu: str, engine: str, tps: tuple[int, int],
          replicas: tuple[int, int]) -> DisaggPlan:
    pools = []
    for role, tp, n in (("prefill", tps[0], replicas[0]), ("decode", tps[1], replicas[1])):
        dep = resolve_deployment(catalog, model, gpu, EngineSettings(engine=engine, tp=tp))
        pools.append(PoolPlan(role, dep, n, 1.0, 0.1, 0.01))
    return DisaggPlan(pools[0], pools[1], INTER_NODE, 0.001, 0.001, 0.2, 0.02)


def _words(line: str, flag: str) -> list[str]:
    w = shlex.split(line)
    i = w.index(flag) + 1
    out = []
    while i < len(w) and not w[i].startswith("--"):
        out.append(w[i])
        i += 1
    return out


def test_one_host_packs_the_pools_side_by_side(catalog) -> None:
    # 4 prefill + 4 decode replicas of one H100 each: the 8 GPUs of one host. Prefill on GPUs
    # 0-3 at ports 8100-8103, decode on GPUs 4-7 at 8200-8203 (the decode pool's first GPU
    # after the whole prefill pool, not after its first replica).
    p = _plan(catalog, "llama-3.1-8b", "h100-sxm", "vllm", (1, 1), (4, 4))
    got = [(x.role, x.host, x.first_gpu, x.port) for x in placements(p)]
    assert got == ([("prefill", "localhost", g, 8100 + g) for g in range(4)]
                   + [("decode", "localhost", 4 + g, 8200 + g) for g in range(4)])
    lines = launch_lines(p)
    assert "CUDA_VISIBLE_DEVICES=4 " in lines["vllm_decode"]
    # vLLM's P/D front end from PyPI (vllm-router; toy_proxy_server.py is only in a source
    # checkout): one --prefill / --decode URL per worker, round-robin as the replay assumed
    words = shlex.split(lines["vllm_proxy"], comments=True)
    assert words[:2] == ["vllm-router", "--vllm-pd-disaggregation"]
    urls = [(w, words[i + 1]) for i, w in enumerate(words) if w in ("--prefill", "--decode")]
    assert urls == ([("--prefill", f"http://localhost:{8100 + g}") for g in range(4)]
                    + [("--decode", f"http://localhost:{8200 + g}") for g in range(4)])
    assert words[-4:] == ["--prefill-policy", "round_robin", "--decode-policy", "round_robin"]
    assert lines["vllm_proxy"].endswith("  # pip install vllm-router")
    # eight vLLM servers on one host: each NIXL side channel on its own port (5600 up, the
    # default first), at the default host (localhost), every one in the hosts line
    assert [x.kv_port for x in placements(p)] == list(range(5600, 5608))
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT=5600 " in lines["vllm_prefill"]
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT=5604 " in lines["vllm_decode"]
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in lines["vllm_prefill"]
    assert lines["vllm_hosts"].split("; ")[4] == (
        "localhost: decode 0 (GPU 4, port 8200, KV handshake port 5604)")


def test_servers_sharing_a_host_listen_for_kv_on_ports_apart(catalog) -> None:
    # SGLang: each prefill server's bootstrap port (default 8998) apart on its host, and the
    # router names each after its URL; vLLM TP 2 servers over two hosts: side channels a TP
    # apart (NixlConnector offsets the port by its ranks), advertised at their host
    p = _plan(catalog, "llama-3.1-8b", "h100-sxm", "sglang", (2, 2), (5, 2))
    where = placements(p)
    assert [(x.host, x.kv_port) for x in where] == [
        ("HOST0", 8998), ("HOST0", 8999), ("HOST0", 9000), ("HOST0", 9001), ("HOST1", 8998),
        ("HOST1", None), ("HOST1", None)]
    lines = launch_lines(p)
    assert _words(lines["sglang_prefill"], "--disaggregation-bootstrap-port") == ["8998"]
    assert "--disaggregation-bootstrap-port" not in lines["sglang_decode"]
    w = shlex.split(lines["sglang_router"])
    assert [w[i + 1:i + 3] for i, x in enumerate(w) if x == "--prefill"] == [
        [f"http://{x.host}:{x.port}", str(x.kv_port)] for x in where[:5]]
    v = _plan(catalog, "llama-3.1-8b", "h100-sxm", "vllm", (2, 2), (5, 2))
    assert [(x.host, x.kv_port) for x in placements(v)] == [
        ("HOST0", 5600), ("HOST0", 5602), ("HOST0", 5604), ("HOST0", 5606), ("HOST1", 5600),
        ("HOST1", 5602), ("HOST1", 5604)]
    lines = launch_lines(v)
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST=HOST0 VLLM_NIXL_SIDE_CHANNEL_PORT=5600 " in lines[
        "vllm_prefill"]
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST=HOST1 VLLM_NIXL_SIDE_CHANNEL_PORT=5602 " in lines[
        "vllm_decode"]


def test_a_replica_per_host_and_a_router_naming_them_all(catalog) -> None:
    # 1 prefill + 2 decode replicas of TP 8 on 8-GPU H200 hosts: three hosts; SGLang's router
    # lists one --prefill and two --decode URLs, on SGLang's default port.
    p = _plan(catalog, "llama-3.1-70b", "h200", "sglang", (8, 8), (1, 2))
    got = [(x.role, x.host, x.first_gpu, x.port) for x in placements(p)]
    assert got == [("prefill", "HOST0", 0, 8100), ("decode", "HOST1", 0, 8200),
                   ("decode", "HOST2", 0, 8200)]
    lines = launch_lines(p)
    router = lines["sglang_router"]
    assert _words(router, "--prefill") == ["http://HOST0:8100", "8998"]  # its bootstrap
    w = shlex.split(router)
    assert [w[i + 1] for i, x in enumerate(w) if x == "--decode"] == [
        "http://HOST1:8200", "http://HOST2:8200"]
    assert _words(router, "--port") == ["30000"]
    assert _words(router, "--decode-policy") == ["round_robin"]
    assert lines["sglang_hosts"].split("; ") == [
        "HOST0: prefill 0 (GPUs 0-7, port 8100, KV handshake port 8998)",
        "HOST1: decode 0 (GPUs 0-7, port 8200)", "HOST2: decode 1 (GPUs 0-7, port 8200)"]


def test_a_replica_wider_than_a_host_takes_whole_hosts(catalog) -> None:
    # A TP 16 prefill replica spans hosts 0-1 (8 GPUs each); the TP 2 decode replicas start on
    # host 2, four to a host: 5 of them on hosts 2, 2, 2, 2, 3.
    p = _plan(catalog, "llama-3.1-70b", "h100-sxm", "sglang", (16, 2), (1, 5))
    got = [(x.role, x.host, x.first_gpu, x.port) for x in placements(p)]
    assert got == [("prefill", "HOST0", 0, 8100)] + [
        ("decode", "HOST2", 2 * k, 8200 + k) for k in range(4)] + [
        ("decode", "HOST3", 0, 8200)]
    assert launch_lines(p)["sglang_hosts"].split("; ")[:2] == [
        "HOST0-HOST1: prefill 0 (GPUs 0-7 of each, port 8100, KV handshake port 8998)",
        "HOST2: decode 0 (GPUs 0-1, port 8200)"]


def test_the_disaggregated_verify_drives_the_whole_rate_at_the_front_end(run_cli) -> None:
    # one aggregated replica's verify line sends its share (here 2 of 10 req/s); the P/D
    # layout's sends all 10 to the router, whose port is the engine's (SGLang's 30000)
    from tests.plan.engine_args import parse_line

    d = run_cli("recommend", "--model", "deepseek-v3", "--gpu", "h200", "--engine", "sglang",
                "--rate", "10", "--input-len", "2000", "--output-len", "500", "--ttft-p99", "2",
                "--tbt-p99", "0.1", "--verify-top", "0", "--format", "json").json()
    pd = d["disaggregated"]
    _, _, f, _ = parse_line(pd["bench"])
    assert float(f["--request-rate"]) == 10 and f["--base-url"] == "http://localhost:30000"
    assert "--layout disaggregated" in pd["bench_dataset"]
    _, _, agg, _ = parse_line(d["recommendations"][0]["engine_flags"]["bench"])
    assert float(agg["--request-rate"]) == pytest.approx(
        d["recommendations"][0]["per_replica_rate_per_s"], rel=1e-3)


def test_a_vllm_pd_server_over_hosts_advertises_each_hosts_side_channel() -> None:
    # vLLM runs a data-parallel rank's scheduler on the host it sits on, and its NIXL side
    # channel advertises VLLM_NIXL_SIDE_CHANNEL_HOST: each host's line names its own address
    # (the layout's HOST0 and HOST1 for the prefill worker, HOST2 and HOST3 for the decode
    # worker, as the router and the hosts line name them), and each worker's 16 ranks take
    # ports 5600-5615 on its own hosts
    from capplan.api import disaggregated
    from capplan.plan.launch_multinode import pd_launch

    def env(cmd: str) -> dict[str, str]:  # the NAME=VALUE words before the program
        words = shlex.split(cmd.split(": ", 1)[1])
        return dict(w.split("=", 1) for w in words[:words.index("vllm")])

    pool = {"tp": 1, "attention_dp": 16, "expert_parallel": 16}
    lay = disaggregated("deepseek-r1", "h100-sxm", prefill_workers=1, decode_workers=1,
                        prefill=pool, decode=pool, engine="vllm", weight_dtype="fp8",
                        max_model_len=8192)
    lines = pd_launch(lay)
    for name, first in (("prefill worker 0", 0), ("decode worker 0", 2)):
        envs = [env(x) for x in lines[name]]
        assert [e["VLLM_NIXL_SIDE_CHANNEL_HOST"] for e in envs] == [f"HOST{first}",
                                                                   f"HOST{first + 1}"]
        assert {e["VLLM_NIXL_SIDE_CHANNEL_PORT"] for e in envs} == {"5600"}
    assert lines["hosts"] == [
        "HOST0-HOST1: prefill 0 (GPUs 0-7 of each, port 8100, KV handshake port 5600); "
        "HOST2-HOST3: decode 0 (GPUs 0-7 of each, port 8200, KV handshake port 5600)"]


def test_disaggregated_pools_of_a_moe_model_may_run_attention_dp_and_ep(run_cli) -> None:
    # the pools are sized over the aggregated search's layouts (search.moe_layouts): for
    # DeepSeek-V3 on SGLang the decode pool takes attention DP 8 with EP 8 on one host, as
    # SGLang serves DeepSeek's decode, and its line launches that layout
    from tests.plan.engine_args import parse_line

    d = run_cli("recommend", "--model", "deepseek-v3", "--gpu", "h200", "--engine", "sglang",
                "--rate", "10", "--input-len", "2000", "--output-len", "500", "--ttft-p99", "2",
                "--tbt-p99", "0.1", "--verify-top", "0", "--format", "json").json()
    dec = d["disaggregated"]["decode"]
    assert (dec["tp"], dec["attention_dp"], dec["expert_parallel"]) == (1, 8, 8)
    assert dec["gpus_total"] == 8 * dec["replicas"]
    line = d["disaggregated"]["launch"]["sglang_decode"].split(": ", 1)[1]
    _, _, f, _ = parse_line(line)
    assert (f["--tp"], f["--dp"], f["--ep-size"]) == ("8", "8", "8")
    assert "--enable-dp-attention" in f
    dense = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "20",
                    "--input-len", "4000", "--output-len", "300", "--ttft-p99", "1",
                    "--tbt-p99", "0.03", "--verify-top", "0", "--format", "json").json()
    assert all(dense["disaggregated"][r]["attention_dp"] == 1 for r in ("prefill", "decode"))


def test_the_sized_layout_wins_only_if_its_replay_meets_the_slos(catalog, run_cli) -> None:
    # the analytic screen sizes the pools; the replay at the plan's rate and headroom has the last
    # word: a layout whose replay misses an SLO does not win, however cheap
    from capplan.plan.disagg import compare

    p = _plan(catalog, "llama-3.1-8b", "h100-sxm", "vllm", (1, 1), (1, 1))
    assert compare(8, 100.0, "TBT SLO", p).startswith("disaggregated wins")
    ok = {"ok": True, "reason": "", "ttft_s": {"p99": 0.5}, "tbt_s": {"p99": 0.02}}
    assert "the replay confirms it (TTFT p99 500 ms, TBT p99 20.0 ms)" in compare(
        8, 100.0, "TBT SLO", p, ok)
    miss = {**ok, "ok": False, "reason": "p99 TTFT 2100.0 ms > 2000.0 ms"}
    verdict = compare(8, 100.0, "TBT SLO", p, miss)
    assert verdict.startswith("aggregated wins") and "p99 TTFT 2100.0 ms" in verdict
    d = run_cli("recommend", "--model", "deepseek-v3", "--gpu", "h200", "--engine", "sglang",
                "--rate", "10", "--input-len", "2000", "--output-len", "500", "--ttft-p99", "2",
                "--tbt-p99", "0.1", "--format", "json").json()["disaggregated"]
    rep = d["replay"]
    assert rep["ok"] and rep["requests"] >= 600 and d["winner"] == "disaggregated"
    assert rep["ttft_s"]["p99"] <= 2 and rep["tbt_s"]["p99"] <= 0.1
    assert "the replay confirms it" in d["verdict"]


def test_each_pool_over_hosts_meets_at_its_own_first_host(catalog) -> None:
    # A TP 16 prefill replica (HOST0-HOST1) and TP 16 decode replicas (HOST2-HOST3,
    # HOST4-HOST5) each meet at their own first host, named as the router and the hosts line
    # name it: one name scheme in the whole output, no placeholder left to work out
    p = _plan(catalog, "llama-3.1-70b", "h100-sxm", "sglang", (16, 16), (1, 2))
    lines, each = launch_lines(p), replica_lines(p)
    firsts = {"prefill": [0], "decode": [2, 4]}
    for role in ("prefill", "decode"):
        texts = ([lines[f"sglang_{role}"]] if role == "prefill"
                 else [r["command"] for r in each[f"sglang_{role}"]])
        for text, first in zip(texts, firsts[role], strict=True):
            hosts = text.split("\n")
            assert len(hosts) == 2
            assert all(_words(h, "--dist-init-addr") == [f"HOST{first}:5000"] for h in hosts)
            assert "NODE" not in text
    words = shlex.split(lines["sglang_router"])
    urls = [words[i + 1] for i, w in enumerate(words) if w in ("--prefill", "--decode")]
    assert urls == ["http://HOST0:8100", "http://HOST2:8200", "http://HOST4:8200"]
    assert "NODE" not in lines["sglang_hosts"]


def test_a_vllm_pd_server_on_ray_advertises_its_head_for_the_kv_handshake(catalog) -> None:
    # TP 16 over two hosts runs on Ray; the engine core, on the head, serves the NIXL side
    # channel (VLLM_NIXL_SIDE_CHANNEL_HOST, default localhost, which a peer on another host
    # would look for on itself): the head's line advertises the head's address
    p = _plan(catalog, "llama-3.1-70b", "h100-sxm", "vllm", (16, 16), (1, 1))
    for role in ("prefill", "decode"):
        head = launch_lines(p)[f"vllm_{role}"].split("\n")[0]
        assert "--distributed-executor-backend ray" in head
        first = {"prefill": 0, "decode": 2}[role]  # its head: its first host in the layout
        assert f"VLLM_NIXL_SIDE_CHANNEL_HOST=HOST{first} " in head


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_each_replica_has_its_own_line_at_its_placement(catalog, engine) -> None:
    # 5 prefill + 2 decode replicas of TP 2 on 8-GPU H100 hosts (the placements above): every
    # replica's own line runs on its GPUs, port and KV handshake port, as the hosts line and
    # the router name them; the first is `launch`'s line (without its "5 x: ")
    from capplan.plan.disagg import replica_lines
    from capplan.plan.launch import pool_command

    p = _plan(catalog, "llama-3.1-8b", "h100-sxm", engine, (2, 2), (5, 2))
    each, where = replica_lines(p), placements(p)
    assert [len(each[f"{engine}_{r}"]) for r in ("prefill", "decode")] == [5, 2]
    lines = launch_lines(p)
    for role in ("prefill", "decode"):
        reps = each[f"{engine}_{role}"]
        assert reps[0]["command"] == pool_command(lines[f"{engine}_{role}"])
        mine = [x for x in where if x.role == role]
        assert [r["hosts"] for r in reps] == [x.host for x in mine]
        for text, at in zip((r["command"] for r in reps), mine, strict=True):
            gpus = ",".join(str(at.first_gpu + g) for g in range(2))
            assert f"CUDA_VISIBLE_DEVICES={gpus} " in text, (role, at, text)
            assert _words(text.split("#")[0], "--port")[:1] == [str(at.port)], (role, at, text)
    if engine == "sglang":  # each prefill server's bootstrap port, as the router lists it
        assert [_words(r["command"], "--disaggregation-bootstrap-port")
                for r in each["sglang_prefill"]] == [
            [str(x.kv_port)] for x in where[:5]]
    one = _plan(catalog, "llama-3.1-8b", "h100-sxm", engine, (2, 2), (1, 1))
    assert replica_lines(one) == {}  # one replica each: `launch` says it all


def test_the_terminal_prints_each_replicas_line_and_no_replica_count(run_cli) -> None:
    """`recommend` prints a pool of several replicas as one line per replica (its own GPUs
    and ports), a pool of one as its line: never "N x: " before a command."""
    res = run_cli("recommend", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--engine",
                  "sglang+mixed-chunk", "--rate", "13", "--input-len", "1000", "--output-len",
                  "300", "--ttft-p99", "1", "--tbt-p99", "0.06")
    assert res.exit_code == 0, res.stderr
    launch = [ln for ln in res.stdout.splitlines() if ln.startswith("SGLang p")
              or ln.startswith("SGLang d")]
    heads = [ln.split(": ", 1)[0] for ln in launch]
    assert heads == ["SGLang prefill 0 (HOST0)", "SGLang prefill 1 (HOST0)", "SGLang decode"], heads
    assert all(ln.split(": ", 1)[1].startswith("CUDA_VISIBLE_DEVICES=") for ln in launch)
    assert "--port 8101" in launch[1] and "CUDA_VISIBLE_DEVICES=4,5,6,7 " in launch[1]


def test_replicas_over_hosts_name_their_own_hosts(catalog) -> None:
    # 1 prefill replica of TP 8 and 2 decode replicas of TP 16 on 8-GPU H100 hosts: the prefill
    # replica on HOST0, the decode replicas on HOST1-HOST2 and HOST3-HOST4 (their lines alike
    # but for the hosts each runs on, which the head of each says)
    from capplan.plan.disagg import replica_lines

    p = _plan(catalog, "llama-3.1-70b", "h100-sxm", "sglang", (8, 16), (1, 2))
    each = replica_lines(p)
    assert "sglang_prefill" not in each  # one replica: `launch` says it all
    assert [r["hosts"] for r in each["sglang_decode"]] == ["HOST1-HOST2", "HOST3-HOST4"]


def test_a_tie_in_gpus_is_called_a_tie(catalog) -> None:
    # the same GPUs and cost on both sides: aggregated is kept as the one pool, not because
    # "prefill chunks cost TBT less than a second pool costs GPUs" (no GPUs are saved either way)
    from capplan.plan.disagg import compare

    p = _plan(catalog, "llama-3.1-8b", "h100-sxm", "vllm", (1, 1), (1, 1))
    verdict = compare(p.gpus, p.cost_per_hour, "TBT SLO", p)
    assert verdict.startswith("aggregated wins") and "a tie (the same GPUs and cost)" in verdict
    assert "cost TBT less" not in verdict
    assert f"TBT p99 at {p.tbt_p99_s * 1e3:.1f} ms" in verdict
    assert "a tie (the same GPUs)" in compare(p.gpus, None, "TBT SLO", p)  # unpriced: GPUs
    assert "cost TBT less" in compare(p.gpus - 1, p.cost_per_hour / 2, "TBT SLO", p)
