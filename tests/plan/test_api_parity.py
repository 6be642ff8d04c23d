"""The Python API gives what the CLI gives: `.to_dict()` is the command's `--format json`, and
`capplan.recommend` plans what `capplan recommend` plans (the same plan dict,
capplan.plan.recommend_doc), disaggregated layout included."""

from __future__ import annotations

import json

import pytest

import capplan
from capplan.errors import InputError

REC = ("--model", "llama-3.1-8b", "--rate", "20", "--input-len", "1024", "--output-len", "256",
       "--ttft-p99", "1", "--tbt-p99", "0.05", "--gpu", "h100-sxm", "--gpu", "l40s",
       "--verify-top", "0", "--format", "json")
REC_KW = dict(rate=20, input_len=1024, output_len=256, ttft_p99_s=1, tbt_p99_s=0.05,
              gpus=["h100-sxm", "l40s"], verify=False)


def _cli_json(run_cli, *args):
    res = run_cli(*args)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def _same(a, b):
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_recommend_sizes_the_disaggregated_layout_as_the_cli_does(run_cli):
    cli = _cli_json(run_cli, "recommend", *REC)
    api = capplan.recommend("llama-3.1-8b", **REC_KW).to_dict()
    assert "disaggregated" in cli and "disaggregated" in api
    assert _same(cli["disaggregated"], api["disaggregated"])
    assert _same(cli["recommendations"], api["recommendations"])
    # --no-disagg and disagg=False: neither sizes it
    off = capplan.recommend("llama-3.1-8b", **REC_KW, disagg=False).to_dict()
    assert off.get("disaggregated") is None
    assert _cli_json(run_cli, "recommend", *REC, "--no-disagg").get("disaggregated") is None


def test_recommend_takes_the_search_options_of_the_cli(run_cli):
    args = ("--model", "llama-3.1-8b", "--rate", "5", "--gpu", "h100-sxm", "--tp", "1,2",
            "--kv-dtype", "auto", "--kv-dtype", "fp8", "--max-model-len", "8192",
            "--headroom", "0.3", "--objective", "min_gpus", "--max-num-seqs", "64,128",
            "--verify-top", "0", "--no-disagg", "--format", "json")
    cli = _cli_json(run_cli, "recommend", *args)
    api = capplan.recommend("llama-3.1-8b", rate=5, gpus="h100-sxm", tp=[1, 2],
                            kv_dtype=["auto", "fp8"], max_model_len=8192, headroom=0.3,
                            objective="min_gpus", max_num_seqs=[64, 128], disagg=False,
                            verify=False).to_dict()
    assert _same(cli["recommendations"], api["recommendations"])
    assert {r["tp"] for r in api["recommendations"]} <= {1, 2}
    assert {r["max_num_seqs"] for r in api["recommendations"]} <= {64, 128}
    assert api["headroom"] == 0.3 and api["objective"] == "min_gpus"


def test_one_gpu_name_is_one_gpu():
    plan = capplan.recommend("llama-3.1-8b", rate=2, gpus="h100-sxm", tp=1, verify=False,
                             disagg=False)
    assert {r.candidate.gpu.key for r in plan.recommendations} == {"h100-sxm"}


@pytest.mark.parametrize("call", [
    lambda: capplan.recommend("llama-3.1-8b", rate=5, foo=1),
    lambda: capplan.verify({}, foo=1),
])
def test_unknown_keywords_are_input_errors(call):
    with pytest.raises(InputError, match="unknown keyword.*foo") as e:
        call()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cmd,args,api", [
    ("memory", ("--max-model-len", "8192"),
     lambda: capplan.memory("llama-3.1-8b", "h100-sxm", max_model_len=8192)),
    ("memory", ("--engine", "sglang"),
     lambda: capplan.memory("llama-3.1-8b", "h100-sxm", engine="sglang")),
    ("latency", ("--rate", "10", "--input-len", "800", "--output-len", "300"),
     lambda: capplan.latency("llama-3.1-8b", "h100-sxm", rate=10, input_len=800,
                             output_len=300)),
    ("speed", ("--batch", "1,8", "--context", "2048"),
     lambda: capplan.speed("llama-3.1-8b", "h100-sxm", batch=[1, 8], context=[2048])),
    ("simulate", ("--rate", "5", "--requests", "100", "--input-len", "512", "--output-len",
                  "64"),
     lambda: capplan.simulate("llama-3.1-8b", "h100-sxm", rate=5, requests=100,
                              input_len=512, output_len=64)),
])
def test_to_dict_is_the_commands_json(run_cli, cmd, args, api):
    cli = _cli_json(run_cli, cmd, "--model", "llama-3.1-8b", "--gpu", "h100-sxm", *args,
                    "--format", "json")
    got = api().to_dict()
    assert sorted(got) == sorted(cli)
    assert _same(got, cli)
    if cmd in ("latency", "simulate", "speed"):  # auto resolved, as the CLI reports it
        assert (got["weight_dtype"], got["kv_dtype"]) == ("bf16", "bf16")
