"""Bad input exits 2 with exactly one 'Error: ...' line on stderr and no traceback."""

from __future__ import annotations

import json

import pytest
import yaml
from _asserts import assert_one_line_error

MEM = ("memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm")

# (arguments, a fragment the one error line must contain)
BAD_INPUTS = [
    pytest.param(("memory", "--model", "llama-9-8b", "--gpu", "h100"),
                 "unknown model 'llama-9-8b'; nearest: ", id="unknown-model"),
    pytest.param(("memory", "--model", "llama-3.1-8b", "--gpu", "h1000"),
                 "unknown GPU 'h1000'; nearest: ", id="unknown-gpu"),
    pytest.param((*MEM, "--gpu-memory-utilization", "0"), "--gpu-memory-utilization", id="util-0"),
    pytest.param((*MEM, "--gpu-memory-utilization", "1.5"), "--gpu-memory-utilization",
                 id="util-1.5"),
    pytest.param((*MEM, "--gpu-memory-utilization", "nan"), "finite", id="util-nan"),
    pytest.param((*MEM, "--gpu-memory-utilization", "inf"), "finite", id="util-inf"),
    pytest.param((*MEM, "--gpu-memory-utilization", "-1"), "--gpu-memory-utilization",
                 id="util-negative"),
    pytest.param((*MEM, "--gpu-memory-utilization", "abc"), "'abc' is not a number",
                 id="util-abc"),
    pytest.param((*MEM, "--tp", "0"), "--tp", id="tp-0"),
    pytest.param((*MEM, "--tp", "-2"), "--tp", id="tp-negative"),
    pytest.param((*MEM, "--tp", "two"), "--tp", id="tp-word"),
    pytest.param((*MEM, "--tp", "3"), "--tp 3: must divide the 32 attention heads", id="tp-3"),
    pytest.param((*MEM, "--pp", "64"), "--pp 64", id="pp-too-many"),
    pytest.param((*MEM, "--max-model-len", "-5"), "--max-model-len", id="max-model-len-neg"),
    pytest.param((*MEM, "--max-model-len", "0"), "--max-model-len", id="max-model-len-0"),
    pytest.param((*MEM, "--block-size", "0"), "--block-size", id="block-size-0"),
    pytest.param((*MEM, "--max-num-seqs", "0"), "--max-num-seqs", id="max-num-seqs-0"),
    # vLLM SchedulerConfig._verify_args: max_num_batched_tokens >= max_num_seqs; memory and
    # speed refuse it as latency and simulate do (one check, capplan.models.engine)
    pytest.param((*MEM, "--max-num-batched-tokens", "100", "--max-num-seqs", "256"),
                 "--max-num-batched-tokens 100 must be >= --max-num-seqs 256",
                 id="memory-budget-below-seqs"),
    pytest.param((*MEM, "--max-num-batched-tokens", "1"),
                 "--max-num-batched-tokens 1 must be >= --max-num-seqs 1024",
                 id="memory-budget-below-default-seqs"),
    pytest.param(("speed", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--batch", "1",
                  "--max-num-batched-tokens", "100", "--max-num-seqs", "256"),
                 "--max-num-batched-tokens 100 must be >= --max-num-seqs 256",
                 id="speed-budget-below-seqs"),
    pytest.param((*MEM, "--images-per-request", "2"),
                 "--images-per-request 2: llama-3.1-8b has no vision encoder",
                 id="memory-images-on-text-model"),
    pytest.param((*MEM, "--weight-dtype", "int3"), "--weight-dtype", id="weight-dtype"),
    pytest.param((*MEM, "--kv-dtype", "int4"), "--kv-dtype", id="kv-dtype"),
    pytest.param((*MEM, "--format", "xml"), "--format", id="format"),
    pytest.param(("memory", "--model", "llama-3.1-8b"), "--gpu", id="missing-gpu"),
    pytest.param(("memory", "--gpu", "h100"), "--model", id="missing-model"),
    pytest.param((*MEM, "--frobnicate"), "--frobnicate", id="unknown-option"),
    pytest.param(("frobnicate",), "frobnicate", id="unknown-command"),
    pytest.param(("gpus", "--catalog-dir", "/nonexistent/capplan"), "not a folder",
                 id="catalog-dir-missing"),
    pytest.param(("recommend", "--model", "llama-3.1-8b", "--rate", "1", "--ttft-p99", "1",
                  "--tbt-p99", "50 parsecs"), "'50 parsecs' is not a duration", id="slo-unit"),
    pytest.param(("recommend", "--model", "llama-3.1-8b", "--rate", "1", "--ttft-p99", "-5ms"),
                 "--ttft-p99", id="slo-negative-ms"),
    pytest.param(("memory", "--model", "", "--gpu", "h100"),
                 "model (--model): the name is empty", id="model-empty"),
    pytest.param(("recommend", "--model", " ", "--rate", "1"),
                 "model (--model): the name is empty", id="recommend-model-empty"),
    pytest.param(("latency", "--model", "llama-3.1-8b", "--gpu", "", "--rate", "1"),
                 "gpu (--gpu): the name is empty", id="gpu-empty"),
]


# 'model: "café"' in Latin-1: 0xe9 at offset 11 opens a 3-byte UTF-8 sequence, '"' is no
# continuation byte
LATIN1_YAML = b'model: "caf\xe9"\nworkloads: [{rate_per_s: 1}]\n'
# a 48-byte header, two 9-byte rows, then 0xff (never valid in UTF-8) at offset 66
LATIN1_TRACE = b"arrived_at,num_prefill_tokens,num_decode_tokens\n1,100,10\n2,100,10\n\xff,1,1\n"


@pytest.mark.parametrize(("name", "data", "args", "where"), [
    ("p.yaml", LATIN1_YAML, ("plan", "{}"), "invalid continuation byte at byte 11"),
    ("t.csv", LATIN1_TRACE, ("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                             "--trace", "{}"), "invalid start byte at byte 66"),
    ("c.csv", b"at,rate_per_s\n01:00,1\n\xff,2\n",
     ("recommend", "--model", "llama-3.1-8b", "--rate-curve", "{}"),
     "invalid start byte at byte 22"),
    ("e.csv", b"100\n\xff\n", ("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                "--rate", "1", "--input-len", "empirical:{}"),
     "invalid start byte at byte 4"),
])
def test_non_utf8_file_is_named(run_cli, tmp_path, name, data, args, where):
    f = tmp_path / name
    f.write_bytes(data)
    res = run_cli(*(a.format(f) for a in args))
    assert_one_line_error(res, f"{f}: not UTF-8 text ({where}); save it as UTF-8")




@pytest.mark.parametrize(("args", "fragment"), BAD_INPUTS)
def test_bad_input_exits_2_one_line(run_cli, args, fragment):
    assert_one_line_error(run_cli(*args), fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param((*MEM, "--gpu-memory-utilization", "nan"), "finite", id="util-nan"),
        pytest.param((*MEM, "--tp", "3"), "--tp 3", id="tp-3"),
        pytest.param(("memory", "--model", "nope-model", "--gpu", "h100"), "unknown model",
                     id="unknown-model"),
    ],
)
def test_bad_input_subprocess(run_module, args, fragment):
    """What a shell sees from `python -m capplan`: exit 2, one line, no traceback."""
    assert_one_line_error(run_module(*args), fragment)


def test_unknown_gpu_names_three_nearest(run_cli):
    res = run_cli("memory", "--model", "llama-3.1-8b", "--gpu", "h1000")
    assert_one_line_error(res)
    nearest = res.stderr.split("nearest: ", 1)[1].split(" (see", 1)[0].split(", ")
    assert len(nearest) == 3 and "h100-sxm" in nearest


# ---------------------------------------------------------------------------------------------
# Broken catalog files given with --catalog-dir: exit 2, one line, naming the file
# ---------------------------------------------------------------------------------------------


def test_catalog_dir_yaml_syntax_error(run_cli, tmp_path):
    (tmp_path / "gpus").mkdir()
    bad = tmp_path / "gpus" / "broken.yaml"
    bad.write_text("key: broken\nname: [unclosed\n")
    res = run_cli("gpus", "--catalog-dir", str(tmp_path))
    assert_one_line_error(res, str(bad))
    assert "YAML syntax error" in res.stderr


def test_catalog_dir_unknown_key_suggests(run_cli, tmp_path, catalog):
    (tmp_path / "models").mkdir()
    bad = tmp_path / "models" / "typo.yaml"
    data = catalog.models["llama-3.1-8b"].model_dump(mode="json")
    data["key"] = "typo"
    data["num_layer"] = 32  # a typo of num_layers, next to the real key
    bad.write_text(yaml.safe_dump(data))
    res = run_cli("models", "--catalog-dir", str(tmp_path))
    assert_one_line_error(res, str(bad))
    assert "did you mean 'num_layers'?" in res.stderr


def test_catalog_dir_negative_number(run_cli, tmp_path, catalog):
    (tmp_path / "gpus").mkdir()
    bad = tmp_path / "gpus" / "neg.yaml"
    data = catalog.gpus["h100-sxm"].model_dump(mode="json")
    data["key"] = "neg"
    data["memory_mib"] = -1
    bad.write_text(yaml.safe_dump(data))
    res = run_cli("gpus", "--catalog-dir", str(tmp_path))
    assert_one_line_error(res, "memory_mib")
    assert str(bad) in res.stderr


def test_help_says_what_each_exit_code_means(run_cli):
    # issue 15: UNSTABLE exits 0 on purpose (overload is an answer); --help says so
    res = run_cli("--help")
    assert res.exit_code == 0
    for code in ("0 ", "1 ", "2 ", "130"):
        assert f"  {code}" in res.stdout
    assert "UNSTABLE" in res.stdout


def test_unstable_latency_is_an_answer_with_exit_0(run_cli):
    res = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "l40s", "--rate", "500",
                  "--input-len", "2048", "--output-len", "256", "--format", "json")
    assert res.exit_code == 0, res.stderr
    import json

    d = json.loads(res.stdout)
    assert d["stable"] is False and d["capacity_requests_per_s"] < 500


def test_slo_options_take_plan_file_durations(run_cli):
    """--tbt-p99 50ms is 0.05 s, as `tbt_p99_s: 50ms` in a plan file (units.parse_seconds)."""
    base = ("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--rate",
            "2", "--input-len", "500", "--output-len", "100", "--verify-top", "0", "--no-disagg",
            "--format", "json")
    with_unit = run_cli(*base, "--ttft-p99", "1.5s", "--tbt-p99", "50ms")
    assert with_unit.exit_code == 0, with_unit.stderr
    lane = json.loads(with_unit.stdout)["lanes"][0]
    assert (lane["ttft_p99_s"], lane["tbt_p99_s"]) == (1.5, pytest.approx(0.05))



def test_a_near_floor_refusal_names_the_replicas_gpus(run_cli) -> None:
    # DeepSeek-R1 on H100 runs DP 16 / EP 16: the refusal's "19 replicas (304 GPUs)" read
    # against "h100-sxm TP 1" as if a replica were one GPU
    res = run_cli("recommend", "--model", "deepseek-r1", "--gpu", "h100", "--engine", "vllm",
                  "--rate", "10", "--input-len", "2000", "--output-len", "500", "--ttft-p99",
                  "2", "--tbt-p99", "0.08")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "latency floor of h100-sxm (16 GPUs over 2 nodes: attention TP 1 x DP 16, EP 16)" \
        in res.stderr
