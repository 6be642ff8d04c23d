"""What plans and commands say about their inputs: the JSON Schema accepts the unit strings the
loader accepts, unknown keys get a sibling's name, `models import` summarises the entry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _durations(node, out):  # noqa: ANN001, ANN202
    if isinstance(node, dict):
        for k, v in node.items():
            if k.endswith("_s") and k != "rate_per_s" and v is not None:
                out.append((k, v))
            _durations(v, out)
    elif isinstance(node, list):
        for v in node:
            _durations(v, out)
    return out


def test_schema_accepts_the_examples_unit_strings(run_cli) -> None:
    res = run_cli("schema")
    assert res.exit_code == 0
    slo = json.loads(res.stdout)["$defs"]["Slo"]["properties"]
    for key in ("ttft_p99_s", "tbt_p99_s", "e2e_p99_s"):
        kinds = {a["type"]: a for a in slo[key]["anyOf"]}
        assert set(kinds) == {"number", "string", "null"}
        pattern = re.compile(kinds["string"]["pattern"])
        for good in ("60ms", "1.5s", " 800 ms", "2e-1s", "250us"):
            assert pattern.match(good), good
        for bad in ("fast", "60 parsecs", "1,5s"):
            assert not pattern.match(bad), bad
    seen = []
    for f in sorted((REPO / "examples").glob("*.yaml")):
        for wl in yaml.safe_load(f.read_text())["workloads"]:
            seen += _durations(wl.get("slo") or {}, [])
    strings = [v for _, v in seen if isinstance(v, str)]
    assert "60ms" in strings  # the demo's own
    assert all(pattern.match(v) for v in strings)


@pytest.mark.parametrize(("text", "bad", "near"), [
    ("workloads:\n  - name: a\n    rate_per_s: 1\n    slo: {tpot_p95_s: 0.05}\n",
     "workloads.0.slo.tpot_p95_s", "tpot_p99_s"),
    ("workloads:\n  - name: a\n    rate_per_s: 1\n    slo: {itl_p99_s: 0.05}\n",
     "workloads.0.slo.itl_p99_s", "tbt_p99_s"),
    ("candidats: {}\nworkloads:\n  - name: a\n    rate_per_s: 1\n", "candidats", "candidates"),
])
def test_unknown_key_names_a_sibling(run_cli, tmp_path, text, bad, near) -> None:
    p = tmp_path / "plan.yaml"
    p.write_text("version: 1\nmodel: llama-3.1-8b\n" + text)
    res = run_cli("plan", str(p))
    assert res.exit_code == 2
    assert f"unknown key {bad!r} (did you mean {near!r}?)" in res.stderr


def test_models_import_prints_a_summary(run_cli) -> None:
    res = run_cli("models", "import", str(REPO / "tests/data/configs/deepseek-v3.config.json"))
    assert res.exit_code == 0, res.stderr
    # MLA: (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes = 70,272 B = 68.6 KiB
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("imported"))
    assert "61 layers" in line and "KV 68.6 KiB per token" in line
    assert "B parameters" in line and "active" in line and "no recurrent state" in line


@pytest.mark.parametrize(("fmt", "tp"), [  # unstable at TP 1 (its own output path), stable at 2
    ("table", "1"), ("csv", "1"), ("table", "2"), ("csv", "2"), ("markdown", "2")])
def test_latency_trace_note_in_every_format(run_cli, fmt, tp) -> None:
    trace = REPO / "tests/data/traces/mooncake_conversation_trace_head200.jsonl"
    res = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", tp,
                  "--trace", str(trace), "--format", fmt)
    assert res.exit_code == 0, res.stderr
    flat = " ".join(res.stdout.split())
    assert "200 requests over 72 s" in flat and "timestamp (ms" in flat


def _rec(run_cli, *extra: str) -> dict:
    res = run_cli("recommend", "--model", "llama-3.1-70b", "--rate", "20", "--input-len", "1000",
                  "--output-len", "300", "--ttft-p99", "1", "--tbt-p99", "0.06", "--gpu",
                  "h100-sxm", "--tp", "2,4,8", "--verify-top", "0", "--no-disagg",
                  "--max-num-seqs", "128,512", "--max-num-batched-tokens", "2048,8192",
                  "--format", "json", *extra)
    assert res.exit_code == 0, res.stderr
    return res.json()


def test_fp8_alternative_beside_a_bf16_plan(run_cli) -> None:
    plan = _rec(run_cli)
    best, alt = plan["recommendations"][0], plan["fp8_alternative"]
    assert best["weight_dtype_resolved"] == "bf16"
    # the alternative is what planning with fp8 allowed gives (the same planner, asked)
    fp8 = _rec(run_cli, "--weight-dtype", "fp8")
    assert "fp8_alternative" not in fp8  # allowed: nothing to suggest
    b8 = fp8["recommendations"][0]
    assert (alt["gpu"], alt["tp"], alt["replicas"]) == (b8["gpu"], b8["tp"], b8["replicas"])
    assert alt["gpus_total"] < best["gpus_total"]
    assert alt["saving_frac"] == pytest.approx(1 - b8["cost_per_hour"] / best["cost_per_hour"])
    assert "check your own evaluation" in alt["note"] and f"{alt['gpus_total']} GPUs" in alt["note"]


def test_prefix_cache_savings_stated(run_cli) -> None:
    args = ("recommend", "--model", "llama-3.1-8b", "--rate", "30", "--input-len", "3000",
            "--output-len", "200", "--ttft-p99", "0.5", "--gpu", "h100-sxm", "--tp", "1",
            "--verify-top", "0", "--no-disagg", "--max-num-seqs", "256",
            "--max-num-batched-tokens", "8192", "--format", "json")
    res = run_cli(*args, "--shared-prefix", "2000")
    assert res.exit_code == 0, res.stderr
    plan = res.json()
    pc = plan["prefix_cache"]
    # every prompt starts with the same 2000 tokens: 2000 of 3000 are cached once warm
    assert pc["cached_tokens_per_request"] == pytest.approx(2000, rel=0.02)
    assert pc["prompt_tokens_per_request"] == pytest.approx(3000, rel=0.02)
    plain = run_cli(*args).json()  # the same traffic planned without the shared prefix
    assert "prefix_cache" not in plain
    assert pc["gpus_total_without_cache"] == plain["recommendations"][0]["gpus_total"]
    assert pc["gpus_total_without_cache"] > plan["recommendations"][0]["gpus_total"]
    assert "2000 of 3000 prompt tokens" in pc["note"]


def test_tpot_objectives_by_hand() -> None:
    from capplan.plan.slo import SloSet

    slos = SloSet(tpot_p99_s=0.05, tpot_mean_s=0.02)
    res = {"tpot_s": {"mean": 0.015, "p99": 0.06}}
    # 1 - value / objective: mean 1 - 15/20 = +25%, p99 1 - 60/50 = -20%
    assert slos.margins(res) == pytest.approx({"tpot_p99": -0.2, "tpot_mean": 0.25})
    assert slos.misses(res) == ["p99 TPOT 60.0 ms > 50.0 ms"]
    assert SloSet.strictest([slos, SloSet(tpot_mean_s=0.01)]).tpot_mean_s == 0.01


def test_tpot_slo_plans_and_the_simulator_measures_it(run_cli, tmp_path) -> None:
    p = tmp_path / "plan.yaml"
    p.write_text("version: 1\nmodel: llama-3.1-8b\ncandidates: {gpus: [h100-sxm], tp: [1]}\n"
                 "workloads:\n  - {name: chat, rate_per_s: 20, input_len: 1000, output_len: 300,"
                 " slo: {ttft_p99_s: 1s, tpot_p99_s: 25ms, tpot_mean_s: 20ms}}\n"
                 "verify: {top: 1, requests: 400}\n")
    res = run_cli("plan", str(p), "--format", "json")
    assert res.exit_code == 0, res.stderr
    best = res.json()["recommendations"][0]
    assert set(best["slo_margins"]) == {"ttft_p99", "tpot_p99", "tpot_mean"}
    assert all(m >= 0 for m in best["slo_margins"].values())
    sim = best["verified"]["simulated"]
    # a request's mean gap never exceeds its largest: TPOT p99 <= TBT p99 (the analytic bound)
    assert sim["tpot_s"]["p99"] <= sim["tbt_s"]["p99"] + 1e-9
    assert best["verified"]["ok"] is (sim["tpot_s"]["p99"] <= 0.025
                                      and sim["tpot_s"]["mean"] <= 0.020
                                      and sim["ttft_s"]["p99"] <= 1.0)
