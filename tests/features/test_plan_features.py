"""recommend / plan with speculative decoding and LoRA; the CLI's feature options."""

import json

import pytest
from click.testing import CliRunner

from capplan.cli import cli

BASE = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "4096"]


def _run(args):
    r = CliRunner().invoke(cli, args)
    return r


def test_recommend_searches_the_draft_length():
    r = _run(["recommend", "--model", "llama-3.1-8b", "--rate", "1", "--input-len", "300",
              "--output-len", "300", "--tbt-p99", "0.006", "--gpu", "h100-sxm", "--tp", "1",
              "--speculative", "eagle3", "--spec-tokens", "0,2,3", "--verify-top", "0",
              "--no-disagg", "--format", "json"])
    assert r.exit_code == 0, r.output
    best = json.loads(r.output)["recommendations"][0]
    # 6 ms p99 TBT on one H100: plain decoding of Llama-3.1-8B takes ~8 ms a token, so only a
    # speculative candidate meets it.
    assert best["features"]["spec_tokens"] in (2, 3)
    assert "--speculative-config" in best["engine_flags"]["vllm"]
    assert best["speculation"]["speedup_at_batch_1"] > 1.5


def test_recommend_lora_lane():
    r = _run(["recommend", "--model", "llama-3.1-8b", "--rate", "2", "--input-len", "300",
              "--output-len", "100", "--gpu", "h100-sxm", "--tp", "1", "--adapters", "8",
              "--max-loras", "8", "--max-lora-rank", "64", "--popularity", "zipf",
              "--verify-top", "0", "--no-disagg", "--format", "json"])
    assert r.exit_code == 0, r.output
    best = json.loads(r.output)["recommendations"][0]
    assert best["features"]["max_loras"] == 8
    assert "--enable-lora --max-loras 8 --max-lora-rank 64" in best["engine_flags"]["vllm"]
    # SGLang asserts --lora-target-modules beside --max-lora-rank when no --lora-paths is given
    # (server_args.py): without it the line does not start.
    assert ("--max-loras-per-batch 8 --max-lora-rank 64 --lora-target-modules all"
            in best["engine_flags"]["sglang"])


def test_a_draft_model_is_launched_by_its_hf_id():
    # draft:llama-3.2-1b is a catalog key; each engine loads a path or an HF repo, so every line
    # names the catalog's hf_id, meta-llama/Llama-3.2-1B-Instruct (model_catalog/llama-3.2-1b).
    r = _run(["recommend", "--model", "llama-3.1-8b", "--rate", "5", "--input-len", "1000",
              "--output-len", "200", "--ttft-p99", "1s", "--tbt-p99", "50ms", "--gpu",
              "h100-sxm", "--tp", "1", "--no-disagg", "--speculative", "draft:llama-3.2-1b",
              "--acceptance-length", "2.2", "--spec-tokens", "3", "--verify-top", "0",
              "--format", "json"])
    assert r.exit_code == 0, r.output
    flags = json.loads(r.output)["recommendations"][0]["engine_flags"]
    hf = "meta-llama/Llama-3.2-1B-Instruct"
    assert f'"model": "{hf}"' in flags["vllm"]
    assert f"--speculative-draft-model-path {hf}" in flags["sglang"]
    assert f'speculative_model: "{hf}"' in flags["file:trtllm:llm_api_options.yaml"]
    assert "llama-3.2-1b " not in " ".join(flags.values())


def test_cli_memory_and_bad_input():
    r = _run(["memory", *BASE, "--speculative", "eagle3", "--format", "json"])
    assert r.exit_code == 0, r.output
    r = _run(["memory", *BASE, "--speculative", "medusa"])
    assert r.exit_code == 2
    assert "expected one of eagle3" in r.output
    r = _run(["latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "1",
              "--images-per-request", "1"])
    assert r.exit_code == 2
    assert "no vision encoder" in r.output


def test_recommend_with_images():
    out = {}
    for n in (0, 2):
        r = _run(["recommend", "--model", "qwen2.5-vl-7b", "--rate", "1", "--input-len", "200",
                  "--output-len", "100", "--gpu", "h100-sxm", "--tp", "1", "--max-model-len",
                  "16384", "--images-per-request", str(n), "--verify-top", "0", "--no-disagg",
                  "--format", "json"])
        assert r.exit_code == 0, r.output
        out[n] = json.loads(r.output)["recommendations"][0]
    assert out[2]["predicted"]["ttft_s"]["mean"] > out[0]["predicted"]["ttft_s"]["mean"]
    assert "--limit-mm-per-prompt '{\"image\": 2}'" in out[2]["engine_flags"]["vllm"]


REC = ["recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "5",
       "--input-len", "500", "--output-len", "200", "--ttft-p99", "1", "--no-disagg",
       "--verify-top", "0"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--spec-tokens", "2", "--acceptance-length", "2", "--spec-workload", "code"],
     "--spec-tokens, --acceptance-length, --spec-workload without --speculative METHOD"),
    (["--spec-workload", "chat"], "--spec-workload without --speculative METHOD"),
    (["--max-lora-rank", "64", "--popularity", "zipf"],
     "--max-lora-rank, --popularity without --adapters N (or --max-loras)"),
    (["--adapters", "8", "--max-loras", "0"],
     "--max-loras 0 with --adapters 8: 0 slots runs without LoRA"),
    (["--adapters", "8", "--max-loras", "0,4"], "--max-loras 0,4 with --adapters 8")])
def test_recommend_refuses_feature_options_it_would_ignore(extra, message):
    r = _run([*REC, *extra])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output


def test_the_text_plan_says_where_speculation_stops_paying(run_cli) -> None:
    # the README's promise, in the text output too (it was in JSON only): the draft length the
    # plan chose and the batch from which decoding without a draft is faster, as its JSON says
    args = ("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "5",
            "--input-len", "500", "--output-len", "200", "--ttft-p99", "1", "--tbt-p99",
            "0.05", "--no-disagg", "--speculative", "eagle3", "--verify-top", "0")
    best = run_cli(*args, "--format", "json").json()["recommendations"][0]
    sp, k = best["speculation"], best["features"]["spec_tokens"]
    want = (f"speculation: eagle3, {k} draft tokens, {sp['speedup_at_batch_1']:.2f}x at batch "
            f"1; stops paying from batch {sp['stops_paying_at_batch']}")
    assert sp["speedup_by_batch"][str(sp["stops_paying_at_batch"])] < 1.0
    assert want in run_cli(*args).stdout


def test_a_tbt_slo_under_speculation_warns_what_the_figure_is(run_cli) -> None:
    # TBT under speculation is the mean gap per accepted token (docs/features.md): a plan with
    # a TBT SLO says so with its tau (EAGLE-3 on Llama-3.1-8B: 2.71 accepted per step); the
    # same plan without speculation does not
    args = ("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "5",
            "--input-len", "500", "--output-len", "200", "--ttft-p99", "1", "--tbt-p99",
            "0.05", "--no-disagg", "--verify-top", "0", "--format", "json")
    spec = run_cli(*args, "--speculative", "eagle3").json()["warnings"]
    assert any(w.startswith("speculation: TBT is the mean gap") and "about 2.71 tokens" in w
               for w in spec)
    assert not any(w.startswith("speculation:") for w in run_cli(*args).json()["warnings"])
