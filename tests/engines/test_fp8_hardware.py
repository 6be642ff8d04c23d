"""FP8 an engine cannot run on a GPU is refused, not planned.

TensorRT-LLM has no FP8 on Ampere (its support matrix lists FP8 from Ada SM89 and Hopper SM90;
Model Optimizer's FP8 needs 'Ada and Later'), neither for weights nor for the KV cache. vLLM and
SGLang run FP8 weights on Ampere as W8A16 Marlin kernels and keep an fp8 KV cache there
(sources in the profiles' `sources["fp8"]`)."""

from __future__ import annotations

import json

import pytest

import capplan
from capplan.errors import InputError
from capplan.models.engine import VERSIONS
from tests.cli._asserts import assert_one_line_error

A100_FP8 = ("--model", "llama-3.1-8b", "--gpu", "a100-sxm-80gb", "--engine", "trtllm")
SEARCH = ("--rate", "4", "--input-len", "1000", "--output-len", "300", "--ttft-p99", "2",
          "--verify-top", "0", "--no-disagg")


def test_every_trtllm_release_needs_fp8_cores_and_cites_it():
    for p in VERSIONS["trtllm"]:
        assert set(p.fp8_needs_fp8_cores) == {"weights", "kv"}, p.version
        assert "Ampere" in p.sources["fp8"]
    for name in ("vllm", "sglang"):
        for p in VERSIONS[name]:
            assert p.fp8_needs_fp8_cores == (), (name, p.version)
            assert "Marlin" in p.sources["fp8"]


@pytest.mark.parametrize("cmd,flags,fragment", [
    ("memory", ("--weight-dtype", "fp8"), "--weight-dtype fp8: trtllm 1.2 runs FP8 only"),
    ("memory", ("--kv-dtype", "fp8"), "--kv-dtype fp8: trtllm 1.2 keeps an fp8 KV cache only"),
    ("speed", ("--weight-dtype", "fp8"), "sm89+"),
    ("latency", ("--weight-dtype", "fp8", "--rate", "1"), "A100"),
])
def test_explicit_fp8_on_ampere_is_one_line(run_cli, cmd, flags, fragment):
    assert_one_line_error(run_cli(cmd, *A100_FP8, *flags), fragment)


def test_the_kv_refusal_advises_on_the_kv_cache_not_the_weights(run_cli):
    res = run_cli("memory", *A100_FP8, "--kv-dtype", "fp8")
    assert_one_line_error(res, "--kv-dtype auto (a 16-bit KV cache)")
    assert "W8A16" not in res.stderr and "weights" not in res.stderr


def test_the_same_flags_run_on_hopper_and_under_vllm_sglang(run_cli):
    ok = run_cli("memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "trtllm",
                 "--weight-dtype", "fp8", "--kv-dtype", "fp8")
    assert ok.exit_code == 0, ok.stderr
    for engine in ("vllm", "sglang"):
        m = capplan.memory("llama-3.1-8b", "a100-sxm-80gb", engine=engine, weight_dtype="fp8",
                           kv_dtype="fp8", max_model_len=4096)
        assert m.fits


def test_api_raises_input_error():
    with pytest.raises(InputError, match="FP8 tensor cores"):
        capplan.memory("llama-3.1-8b", "a100-sxm-80gb", engine="trtllm", kv_dtype="fp8")


def test_recommend_refuses_with_the_reason_when_nothing_else_is_left(run_cli):
    res = run_cli("recommend", *A100_FP8, "--weight-dtype", "fp8", "--kv-dtype", "fp8", *SEARCH)
    assert_one_line_error(res, "no configuration of llama-3.1-8b to search on a100-sxm-80gb")
    assert "FP8 tensor cores" in res.stderr


def test_recommend_skips_ampere_and_plans_the_gpu_that_runs_fp8(run_cli):
    res = run_cli("recommend", *A100_FP8, "--gpu", "h100-sxm", "--weight-dtype", "fp8",
                  "--format", "json", *SEARCH)
    assert res.exit_code == 0, res.stderr
    recs = json.loads(res.stdout)["recommendations"]
    assert recs and {r["gpu"] for r in recs} == {"h100-sxm"}


def test_nearest_miss_names_what_was_not_searched(run_cli):
    res = run_cli("recommend", *A100_FP8, "--gpu", "h100-sxm", "--weight-dtype", "fp8",
                  "--rate", "4", "--input-len", "1000", "--output-len", "300",
                  "--ttft-p99", "0.01", "--verify-top", "0", "--no-disagg")
    assert res.exit_code == 2
    assert "no configuration meets the SLOs" in res.stderr
    assert "not searched: a100-sxm-80gb: --weight-dtype fp8" in res.stderr
