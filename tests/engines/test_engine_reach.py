"""What an engine profile refuses to plan: a GPU of another vendor (TensorRT-LLM on AMD), a
speculative method its release cannot launch (vLLM 0.6 with EAGLE-3), a draft tree its launch
line does not give (--spec-topk on vLLM and TensorRT-LLM). One line, exit 2, from the profile's
fields (gpu_vendors, speculative_methods, spec_tree_flag), never from an engine name."""

from __future__ import annotations

import pytest

from capplan.models import speculative
from capplan.models.engine import PROFILES, SPEC_METHODS, VERSIONS, engine_profile
from tests.cli._asserts import assert_one_line_error

LLAMA = ("--model", "llama-3.1-8b")
SEARCH = ("--rate", "5", "--input-len", "500", "--output-len", "100", "--ttft-p99", "1s",
          "--tbt-p99", "50ms", "--no-disagg")


def test_the_profiles_name_every_method_capplan_models():
    assert set(SPEC_METHODS) == set(speculative.METHODS)


def test_every_refusing_field_has_its_source():
    for versions in VERSIONS.values():
        for p in versions:
            if set(p.gpu_vendors) != {"nvidia", "amd"}:
                assert "gpu_vendors" in p.sources, p.label
            if set(p.speculative_methods) != set(SPEC_METHODS):
                assert "speculative" in p.sources, p.label
            assert "spec_tree" in p.sources, p.label


@pytest.mark.parametrize("cmd,extra", [("memory", ()), ("recommend", SEARCH)])
def test_trtllm_on_an_amd_gpu_is_refused(run_cli, cmd, extra):
    # TensorRT-LLM supports NVIDIA Blackwell, Hopper, Ada and Ampere GPUs only
    # (nvidia.github.io/TensorRT-LLM/supported-hardware.html); the MI300X is AMD's.
    res = run_cli(cmd, *LLAMA, "--gpu", "mi300x", "--engine", "trtllm", *extra)
    assert_one_line_error(res, "TensorRT-LLM runs on NVIDIA GPUs only")
    ok = run_cli("memory", *LLAMA, "--gpu", "mi300x", "--engine", "vllm")
    assert ok.exit_code == 0, ok.stderr


def test_vllm_06_with_eagle3_is_refused(run_cli):
    # vLLM 0.6.6 has --speculative-model, not --speculative-config, and no EAGLE-3.
    res = run_cli("recommend", *LLAMA, "--gpu", "h100-sxm", "--engine", "vllm@0.6",
                  "--speculative", "eagle3", *SEARCH)
    assert_one_line_error(res, "--speculative eagle3: vLLM 0.6 cannot run it")
    assert "vllm@0.11 or later" in res.stderr
    assert engine_profile("vllm@0.6").speculative_methods == ()


@pytest.mark.parametrize("engine,name", [("vllm", "vLLM"), ("trtllm", "TensorRT-LLM")])
def test_a_draft_tree_off_sglang_is_refused(run_cli, engine, name):
    res = run_cli("latency", *LLAMA, "--gpu", "h100-sxm", "--rate", "1", "--input-len", "100",
                  "--output-len", "10", "--speculative", "eagle3", "--spec-topk", "4",
                  "--engine", engine)
    assert_one_line_error(res, f"--spec-topk 4: capplan launches {name} with a chain")
    assert PROFILES["sglang"].spec_tree_flag == "--speculative-eagle-topk"


def test_sglang_takes_the_tree(run_cli):
    res = run_cli("memory", *LLAMA, "--gpu", "h100-sxm", "--engine", "sglang",
                  "--speculative", "eagle3", "--spec-topk", "4")
    assert res.exit_code == 0, res.stderr
