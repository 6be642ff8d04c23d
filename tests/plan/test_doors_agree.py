"""One resolver: every door (speed, latency, simulate, recommend, plan.deployment and the Python
API) resolves the same engine settings, and gives the same predictions, for the same inputs."""

from __future__ import annotations

import json

import pytest

import capplan
from capplan.plan.deployment import EngineOptions, resolve_deployment

BASE = ("--model", "llama-3.1-8b", "--max-model-len", "4096")
LOAD = ("--input-len", "1024", "--output-len", "128")


def _json(run_cli, *args):
    res = run_cli(*args, "--format", "json")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-sxm-80gb", "l40s"])
def test_every_door_resolves_the_same_settings(run_cli, catalog, gpu):
    dep = resolve_deployment(catalog, "llama-3.1-8b", gpu, EngineOptions(max_model_len=4096))
    want = (dep.settings.max_num_seqs, dep.settings.max_num_batched_tokens)
    # vLLM's own per-GPU defaults (EngineArgs, docs/engines.md): 1024/8192 on H100, else 256/2048
    assert want == ((1024, 8192) if gpu == "h100-sxm" else (256, 2048))
    speed = _json(run_cli, "speed", *BASE, "--gpu", gpu, "--batch", "1")
    lat = _json(run_cli, "latency", *BASE, "--gpu", gpu, "--rate", "1", *LOAD)
    sim = _json(run_cli, "simulate", *BASE, "--gpu", gpu, "--rate", "1", "--requests", "40",
                *LOAD)
    api = capplan.latency("llama-3.1-8b", gpu, rate=1, input_len=1024, output_len=128,
                          max_model_len=4096)
    for out in (speed, lat, sim, api.to_dict()):
        es = out["engine_settings"]
        assert (es["max_num_seqs"], es["max_num_batched_tokens"]) == want
    assert api.to_dict()["ttft_s"] == lat["ttft_s"]


@pytest.mark.parametrize("gpu", ["h100-sxm", "l40s"])
def test_recommend_predicts_what_latency_predicts(run_cli, gpu):
    rec = _json(run_cli, "recommend", "--model", "llama-3.1-8b", "--gpu", gpu, "--tp", "1",
                "--rate", "3", *LOAD, "--max-num-seqs", "128",
                "--max-num-batched-tokens", "4096", "--max-model-len", "4096",
                "--ttft-p99", "5", "--verify-top", "0")
    best = rec["recommendations"][0]
    assert (best["max_num_seqs"], best["max_num_batched_tokens"]) == (128, 4096)
    lat = _json(run_cli, "latency", *BASE, "--gpu", gpu, "--rate",
                repr(best["per_replica_rate_per_s"]), *LOAD, "--max-num-seqs", "128",
                "--max-num-batched-tokens", "4096")
    for key in ("ttft_s", "tbt_s", "e2e_s"):
        for q in ("mean", "p50", "p99"):
            assert best["predicted"][key][q] == pytest.approx(lat[key][q], rel=1e-9), (key, q)
