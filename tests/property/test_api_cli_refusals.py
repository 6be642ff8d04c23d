"""Every refusal of the CLI's options, walked through the Python API (issue 30, defect 4).

Each case is a command line the CLI refuses; the same value given to the API function as its
keyword must raise InputError with the same reason (the API's message reads
"KEYWORD (--FLAG): REASON", the CLI's "Invalid value for '--FLAG': REASON"). The CLI's message
is taken from a real run of the command, not from a table written here, so a bound changed on
one side only fails this test.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

import capplan
from capplan.errors import InputError

M, G = "llama-3.1-8b", "h100-sxm"
BIG = 2**63

# (command, flag, the text typed, the API keyword, the value the API gets)
ENGINE = [(flag, text, key, value) for flag, text, key, value in [
    ("--max-num-seqs", "0", "max_num_seqs", 0), ("--max-num-seqs", str(BIG), "max_num_seqs", BIG),
    ("--max-num-batched-tokens", "0", "max_num_batched_tokens", 0),
    ("--max-model-len", "-5", "max_model_len", -5), ("--tp", "0", "tp", 0),
    ("--pp", "0", "pp", 0), ("--gpu-memory-utilization", "0", "gpu_memory_utilization", 0.0),
    ("--gpu-memory-utilization", "1.5", "gpu_memory_utilization", 1.5),
    ("--block-size", "7", "block_size", 7), ("--weight-dtype", "int3", "weight_dtype", "int3"),
    ("--kv-dtype", "int4", "kv_dtype", "int4"),
    # feature options (before: the API took -1 images, rank 0, top-k 0; 10**30 draft tokens
    # hung both)
    ("--spec-tokens", str(10**30), "spec_tokens", 10**30), ("--spec-topk", "0", "spec_topk", 0),
    ("--spec-draft-tokens", "1", "spec_draft_tokens", 1),
    ("--acceptance-length", "0.5", "acceptance_length", 0.5),
    ("--max-loras", "-1", "max_loras", -1), ("--max-lora-rank", "0", "max_lora_rank", 0),
    ("--lora-adapters", "-1", "lora_adapters", -1),
    ("--images-per-request", "-1", "images_per_request", -1),
    ("--images-per-request", "1000000000", "images_per_request", 10**9),
    ("--image-width", "0", "image_width", 0), ("--image-height", "99999", "image_height", 99999),
]]
CASES: list[tuple[str, str, str, str, Any]] = [
    *(("memory", *c) for c in ENGINE),
    ("speed", "--batch", "0", "batch", [0]), ("speed", "--context", "0", "context", [0]),
    ("speed", "--prefill", str(BIG), "prefill", [BIG]),
    ("latency", "--rate", "0", "rate", 0.0), ("latency", "--rate", "-1", "rate", -1.0),
    ("latency", "--rate", "1e9", "rate", 1e9), ("latency", "--burstiness", "0", "burstiness", 0.0),
    ("latency", "--concurrency", "0", "concurrency", 0),
    ("latency", "--num-prompts", "-1", "num_prompts", -1),
    ("latency", "--warmup-prompts", "-1", "warmup_prompts", -1),
    ("latency", "--seed", "-1", "seed", -1), ("latency", "--window", "10", "window_s", 10.0),
    ("simulate", "--requests", "0", "requests", 0), ("simulate", "--seed", "-1", "seed", -1),
    ("simulate", "--seed", str(BIG), "seed", BIG),
    ("simulate", "--batch-size", "0", "batch_size", 0),
    ("simulate", "--batch-timeout", "-1", "batch_timeout_s", -1.0),
    ("simulate", "--replicas", "0", "replicas", 0),
    ("simulate", "--startup-lag", "-1", "startup_lag_s", -1.0),
    ("recommend", "--rate", "0", "rate", 0.0), ("recommend", "--ttft-p99", "0", "ttft_p99_s", 0.0),
    ("recommend", "--tbt-p99", "-1", "tbt_p99_s", -1.0),
]
API = {"memory": capplan.memory, "speed": capplan.speed, "latency": capplan.latency,
       "simulate": capplan.simulate, "recommend": capplan.recommend}


def _norm(reason: str) -> str:
    """click quotes a typed value and its choices ('7' is not one of '1', '8'); the API shows
    the Python value. Compare them unquoted, and without click's trailing full stop."""
    return re.sub(r"'([^']*)'", r"\1", reason).rstrip(".")


@pytest.mark.parametrize("cmd, flag, text, key, value", CASES,
                         ids=[f"{c[0]}{c[1]}={c[2]}" for c in CASES])
def test_the_api_refuses_what_the_cli_refuses_with_its_reason(run_cli, cmd: str, flag: str,  # noqa: ANN001
                                                              text: str, key: str,
                                                              value: Any) -> None:
    head = ["--model", M] if cmd == "recommend" else ["--model", M, "--gpu", G]
    load = ["--rate", "2"] if cmd in ("latency", "simulate", "recommend") and flag not in (
        "--rate", "--concurrency", "--num-prompts") else (
        ["--concurrency", "4"] if flag == "--num-prompts" else [])
    res = run_cli(cmd, *head, *load, flag, text)
    assert res.exit_code == 2 and len(res.stderr_lines) == 1, (res.exit_code, res.stderr)
    said = re.match(r"Error: Invalid value for '?(--[a-z0-9-]+)[^:]*: (.*)$", res.stderr.strip())
    assert said and said.group(1) == flag, res.stderr
    cli_reason = said.group(2)

    args = (M,) if cmd == "recommend" else (M, G)
    kw = {key: value}
    if cmd in ("latency", "simulate", "recommend") and key not in ("rate", "concurrency",
                                                                      "num_prompts"):
        kw["rate"] = 2.0
    if key == "num_prompts":
        kw["concurrency"] = 4
    with pytest.raises(InputError) as e:
        API[cmd](*args, **kw)
    api = str(e.value)
    prefix = f"{key} ({flag}): "
    assert api.startswith(prefix), api
    assert _norm(api.removeprefix(prefix)) == _norm(cli_reason), (api, res.stderr)
