"""The EP all-to-all a replica's step model costs is the one its launch lines run.

DeepSeek-V3 (hidden 7168, 8 experts per token, 58 MoE layers) over two 8-GPU H100 nodes
(50 GB/s network per GPU), 16 attention-DP ranks of one GPU, EP 16. By hand, per token a GPU
sends and per MoE layer: a copy is 7168 x (1 + 4/128) B dispatched (FP8 + scales) plus
7168 x 2 B combined = 21,728 B; DeepEP's low-latency kernels send 8 x 8/16 = 4 copies over the
network, its normal kernels 69/70 of one (models/layout.py, tests/unit/test_multinode.py).
"""

from __future__ import annotations

import shlex

import pytest

from capplan.api import deployment, disaggregated
from capplan.errors import InputError
from capplan.models.layout import DEEPEP_MODES, deepep_mode
from capplan.plan.deployment import build_deployment
from capplan.plan.launch import deepep_launch, launch_line, options_from, split_env
from capplan.plan.launch_multinode import pd_launch, replica_launch

COPY = 7168 * (1 + 4 / 128) + 7168 * 2  # 21,728 B
LOW_COPIES, NORMAL_COPIES = 8 * 8 / 16, 69 / 70


def _wide(engine: str, **kw):
    """16 ranks of one GPU over two H100 nodes, EP 16, in the engine's own notation."""
    tp = 1 if engine.startswith("vllm") else 16
    return deployment("deepseek-v3", "h100", engine=engine, tp=tp, attention_dp=16,
                      expert_parallel=16, max_model_len=32768, engine_notation=True, **kw)


def _per_token(d, copies: float) -> float:
    """58 MoE layers x copies x COPY / effective network bandwidth, over the 16 ranks."""
    net = 50e9 * d.calibration.allreduce_bw_frac
    return 58 * copies * COPY / net / 16


# --- when DeepEP runs --------------------------------------------------------------------

@pytest.mark.parametrize(("tp", "dp", "ep", "domain", "want"), [
    (1, 16, 16, 8, "auto"),      # 16 ranks over two 8-GPU nodes, EP the world
    (1, 8, 8, 8, None),          # one node: the engines' NVLink all-gather + reduce-scatter
    (1, 16, 8, 8, None),         # EP 8 of a 16-GPU world: no engine runs DeepEP so
    (16, 1, 16, 8, None),        # no attention DP: the TP all-reduce carries the MoE output
    (1, 16, 16, None, None),     # no network between the domains
    (2, 32, 64, 72, None),       # 64 GPUs inside one NVL72 rack
])
def test_deepep_mode_by_layout(tp, dp, ep, domain, want):
    assert deepep_mode(tp, dp, ep, "auto", domain) == want


def test_deepep_mode_only_where_the_release_runs_it():
    assert deepep_mode(1, 16, 16, "normal", 8, runs=("normal",)) == "normal"
    assert deepep_mode(1, 16, 16, "auto", 8, runs=("normal", "low_latency")) is None
    with pytest.raises(InputError, match="DeepEP mode 'fast'"):
        deepep_mode(1, 16, 16, "fast", 8)
    assert DEEPEP_MODES == ("auto", "normal", "low_latency")


# --- the mode each engine costs, and the words that run it --------------------------------

@pytest.mark.parametrize(("engine", "mode", "decode_copies", "prefill_copies", "words"), [
    # SGLang --deepep-mode auto: low-latency kernels in decode-only steps, normal with prompts
    ("sglang", "auto", LOW_COPIES, NORMAL_COPIES,
     "--moe-a2a-backend deepep --deepep-mode auto"),
    # vLLM runs one backend per server: low-latency, every step
    ("vllm", "low_latency", LOW_COPIES, LOW_COPIES, "--all2all-backend deepep_low_latency"),
    ("vllm@0.11", "low_latency", LOW_COPIES, LOW_COPIES,
     "VLLM_ALL2ALL_BACKEND=deepep_low_latency"),
    # TensorRT-LLM's WIDEEP MoE: DeepEP's normal kernels, every step
    ("trtllm", "normal", NORMAL_COPIES, NORMAL_COPIES, "TRTLLM_FORCE_ALLTOALL_METHOD=DeepEP"),
])
def test_each_engine_costs_the_mode_its_line_runs(engine, mode, decode_copies, prefill_copies,
                                                   words):
    d = _wide(engine)
    assert d.deepep_mode == mode
    assert d.step.moe_comm_s_per_token == pytest.approx(_per_token(d, decode_copies), rel=1e-12)
    assert d.step.moe_comm_s_per_token_prefill == pytest.approx(
        _per_token(d, prefill_copies), rel=1e-12)
    assert deepep_launch(d.settings, d.gpu)[d.profile.name] == words
    lines = replica_launch(d)[d.profile.name]
    assert lines and all(words in line for line in lines)


def test_multinode_lines_carry_the_backend_on_every_node():
    v = replica_launch(_wide("vllm"))["vllm"]
    assert len(v) == 2
    for line in v:
        words = shlex.split(line.split(": ", 1)[1])
        assert words[words.index("--all2all-backend") + 1] == "deepep_low_latency"
    old = replica_launch(_wide("vllm@0.11"))["vllm"]
    assert all(line.split(": ", 1)[1].startswith(
        "VLLM_ALL2ALL_BACKEND=deepep_low_latency vllm serve ") for line in old)
    assert all("--all2all-backend" not in line for line in old)  # 0.10-0.11.0 lack the flag
    (t,) = replica_launch(_wide("trtllm"))["trtllm"]
    assert t.startswith("any node: mpirun -x TRTLLM_FORCE_ALLTOALL_METHOD=DeepEP -H "
                        "NODE0_IP:8,NODE1_IP:8 -np 16 trtllm-llmapi-launch")
    assert "moe_config: {backend: WIDEEP}" in t
    s = replica_launch(_wide("sglang"))["sglang"]
    assert all("--ep-size 16 --moe-a2a-backend deepep --deepep-mode auto" in x for x in s)


def test_one_node_and_partial_ep_launch_no_deepep():
    one = deployment("deepseek-v3", "h200", engine="sglang", tp=8, attention_dp=8,
                     expert_parallel=8, max_model_len=32768, engine_notation=True)
    assert one.deepep_mode is None and deepep_launch(one.settings, one.gpu) == {}
    lines = replica_launch(one)
    assert not any("deepep" in x.lower() or "ALLTOALL" in x for v in lines.values() for x in v)
    # EP 8 of 16 GPUs: SGLang's DeepEP would set EP to the world (server_args.py
    # _handle_a2a_moe), so the replica runs and is costed with the all-gather + reduce-scatter
    base = _wide("sglang")
    part = build_deployment(base.model, base.gpu, base.settings.with_(expert_parallel=8),
                            base.calibration)
    assert part.deepep_mode is None
    assert part.step.moe_comm_s_per_token == part.step.moe_comm_s_per_token_prefill
    assert "--moe-a2a-backend" not in replica_launch(part)["sglang"][0]


def test_split_env():
    assert split_env("A_B=1 --x y") == ((("A_B", "1"),), ["--x", "y"])
    assert split_env("--flag=value") == ((), ["--flag=value"])


# --- recommend's lines (capplan.plan.launch) -------------------------------------------------

def test_recommend_lines_run_the_costed_mode():
    d = _wide("sglang")
    s = d.settings
    rec = {"tp": s.tp, "pp": 1, "attention_dp": 16, "expert_parallel": 16, "max_num_seqs": 64,
           "max_num_batched_tokens": 8192, "max_model_len": 32768, "weight_dtype": "fp8",
           "kv_dtype": "auto", "deepep": deepep_launch(s, d.gpu)}
    o = options_from(rec, "deepseek-ai/DeepSeek-V3", "fp8",
                     {"vllm": 0.9, "sglang": 0.85, "trtllm": 0.9})
    sg = launch_line("sglang", o).argv
    assert sg[sg.index("--moe-a2a-backend") + 1] == "deepep"
    assert sg[sg.index("--deepep-mode") + 1] == "auto"
    v = launch_line("vllm", o).argv
    assert v[v.index("--all2all-backend") + 1] == "deepep_low_latency"
    t = launch_line("trtllm", o)
    assert ("TRTLLM_FORCE_ALLTOALL_METHOD", "DeepEP") in t.env
    assert t.command.startswith("TRTLLM_FORCE_ALLTOALL_METHOD=DeepEP trtllm-serve ")
    assert "moe_config:\n  backend: WIDEEP\n" in t.files["llm_api_options.yaml"]
    # one node: no backend words
    plain = options_from({**rec, "deepep": {}}, "deepseek-ai/DeepSeek-V3", "fp8",
                         {"vllm": 0.9, "sglang": 0.85, "trtllm": 0.9})
    assert "--all2all-backend" not in launch_line("vllm", plain).argv
    assert "WIDEEP" not in launch_line("trtllm", plain).files.get("llm_api_options.yaml", "")


# --- P/D pools: each role's mode ----------------------------------------------------------

def _pd(engine: str):
    tp = 1 if engine == "vllm" else 16
    pool = {"tp": tp, "attention_dp": 16, "expert_parallel": 16}
    return disaggregated("deepseek-v3", "h100", prefill_workers=1, decode_workers=1,
                         prefill=pool, decode=pool, engine=engine, max_model_len=8192,
                         engine_notation=True)


@pytest.mark.parametrize(("engine", "prefill_words", "decode_words"), [
    ("vllm", "--all2all-backend deepep_high_throughput", "--all2all-backend deepep_low_latency"),
    ("sglang", "--deepep-mode normal", "--deepep-mode low_latency"),
    ("trtllm", "TRTLLM_FORCE_ALLTOALL_METHOD=DeepEP ",
     "TRTLLM_FORCE_ALLTOALL_METHOD=DeepEPLowLatency "),
])
def test_pd_pools_run_their_roles_mode(engine, prefill_words, decode_words):
    lay = _pd(engine)
    assert (lay.prefill.deepep_mode, lay.decode.deepep_mode) == ("normal", "low_latency")
    p, d = lay.prefill.step, lay.decode.step
    assert p.moe_comm_s_per_token_prefill == pytest.approx(
        _per_token(lay.prefill, NORMAL_COPIES), rel=1e-12)
    assert d.moe_comm_s_per_token == pytest.approx(_per_token(lay.decode, LOW_COPIES),
                                                   rel=1e-12)
    lines = pd_launch(lay)
    pre = [x for k, v in lines.items() if k.startswith(("prefill", "context")) for x in v]
    dec = [x for k, v in lines.items() if k.startswith(("decode", "generation")) for x in v]
    assert pre and all(prefill_words in x for x in pre)
    assert dec and all(decode_words in x for x in dec)


def test_sglang_pd_numbers_are_auto_resolved_by_role():
    # auto resolves to normal in a prefill worker's steps and to low-latency in a decode
    # worker's: pinning the role's mode changes no figure SGLang's pools were costed with
    lay = _pd("sglang")
    p = lay.prefill
    auto = build_deployment(p.model, p.gpu, p.settings.with_(deepep_mode=None), p.calibration)
    assert lay.prefill.step.moe_comm_s_per_token_prefill == auto.step.moe_comm_s_per_token_prefill
    assert lay.decode.step.moe_comm_s_per_token == auto.step.moe_comm_s_per_token


def test_pd_cli_prints_the_roles_backends(run_cli):
    res = run_cli("latency", "--model", "deepseek-v3", "--gpu", "h100", "--engine", "vllm",
                  "--max-model-len", "8192", "--prefill-workers", "1", "--prefill-tp", "1",
                  "--prefill-attention-dp", "16", "--prefill-expert-parallel", "16",
                  "--decode-workers", "1", "--decode-tp", "1", "--decode-attention-dp", "16",
                  "--decode-expert-parallel", "16", "--rate", "2", "--input-len", "2000",
                  "--output-len", "500")
    assert res.exit_code == 0, res.stderr
    out = res.stdout
    pre = [x for x in out.splitlines() if "prefill worker 0: node" in x]
    dec = [x for x in out.splitlines() if "decode worker 0: node" in x]
    assert len(pre) == 2 and all("--all2all-backend deepep_high_throughput" in x for x in pre)
    assert len(dec) == 2 and all("--all2all-backend deepep_low_latency" in x for x in dec)


def test_recommend_cli_lines_of_a_two_node_world(run_cli):
    # a 16-GPU world (attention DP 16, EP 16 over two H100 nodes) wins this search; each
    # engine's line runs the mode that engine's step model costs
    res = run_cli("recommend", "--model", "deepseek-v3", "--gpu", "h100", "--engine", "vllm",
                  "--tp", "8", "--rate", "20", "--input-len", "2000", "--output-len", "500",
                  "--ttft-p99", "5", "--tbt-p99", "0.2", "--verify-top", "0", "--no-disagg",
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    best = res.json()["recommendations"][0]
    assert (best["gpus_per_replica"], best["attention_dp"], best["expert_parallel"]) == (
        16, 16, 16)
    f = best["engine_flags"]
    assert "--enable-expert-parallel --all2all-backend deepep_low_latency" in f["vllm"]
    assert "--ep-size 16 --moe-a2a-backend deepep --deepep-mode auto" in f["sglang"]
    assert all(f[e].count("\n") == 1 for e in ("vllm", "sglang"))  # a command per host
    # one MPI launch over both hosts; the variable reaches every rank through mpirun -x
    assert f["trtllm"].startswith("any node: mpirun -x TRTLLM_FORCE_ALLTOALL_METHOD=DeepEP "
                                  "-H NODE0_IP:8,NODE1_IP:8 -np 16 trtllm-llmapi-launch "
                                  "trtllm-serve ")
    assert "moe_config:\n  backend: WIDEEP" in f["file:trtllm:llm_api_options.yaml"]


def test_each_pd_worker_over_hosts_meets_at_its_own_first_host():
    # two decode workers of 16 GPUs over two H100 hosts each (after the prefill worker's
    # HOST0-HOST1): worker j's ranks meet at its own first host, HOST2 or HOST4 (the router's
    # address of it), not at another worker's host
    lay = disaggregated("deepseek-v3", "h100", prefill_workers=1, decode_workers=2,
                        prefill={"tp": 16, "attention_dp": 16, "expert_parallel": 16},
                        decode={"tp": 16, "attention_dp": 16, "expert_parallel": 16},
                        engine="sglang", max_model_len=8192, engine_notation=True)
    lines = pd_launch(lay)
    for j in (0, 1):
        dec = lines[f"decode worker {j}"]
        assert len(dec) == 2 and all(f"--dist-init-addr HOST{2 + 2 * j}:5000" in x
                                     for x in dec)
    assert "--decode http://HOST2:8200 --decode http://HOST4:8200" in lines["router"][0]
