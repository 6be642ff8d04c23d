"""Prefix sharing through the doors: latency, simulate, recommend, plan files, traces."""

from __future__ import annotations

import json

import pytest

LAT = ("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "100",
       "--input-len", "200", "--output-len", "16", "--format", "json")
SIM = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "100",
       "--input-len", "200", "--output-len", "16", "--requests", "300", "--format", "json")


def _one_line_error(res, fragment: str) -> None:
    assert res.exit_code == 2, (res.stdout, res.stderr, res.exception)
    assert res.exception is None and "Traceback" not in res.stderr
    assert len(res.stderr.splitlines()) == 1 and fragment in res.stderr, res.stderr


def test_latency_reports_the_cached_tokens_and_a_shorter_ttft(run_cli):
    base = run_cli(*LAT).json()
    cached = run_cli(*LAT, "--shared-prefix", "128").json()
    assert base["cached_tokens_per_request"] is None  # no prefix sharing: null (one key set)
    assert cached["cached_tokens_per_request"] == 128  # 8 full blocks of 16
    assert cached["ttft_s"]["mean"] < base["ttft_s"]["mean"]
    half = run_cli(*LAT, "--shared-prefix", "128", "--shared-fraction", "0.5").json()
    assert half["cached_tokens_per_request"] == pytest.approx(64, rel=0.03)


def test_simulate_counts_the_hits(run_cli):
    d = run_cli(*SIM, "--shared-prefix", "128").json()
    # every request but the first finds the 128 tokens cached: 128/200 of prompt tokens
    assert d["prefix_hit_tokens"] == 128 * 299
    assert d["prefix_hit_frac"] == pytest.approx(128 * 299 / (200 * 300))


def test_multi_turn_sessions_reuse_their_history(run_cli):
    d = run_cli(*SIM, "--turns", "3", "--think-time", "1").json()
    # Turn k's prompt is 216 (k - 1) + 200 tokens; turn k - 1 left its prompt and answer but
    # the last token in KV: 216 (k - 1) - 1 tokens, 13 full blocks (208) for k = 2 and 26
    # (416) for k = 3, while no other request evicts them (300 requests fit the cache).
    per_session = 208 + 416
    assert d["prefix_hit_tokens"] == per_session * 100


@pytest.mark.parametrize("args,fragment", [
    (("--shared-prefix", "-5"), "--shared-prefix"),
    (("--shared-prefix", "64", "--shared-fraction", "1.5"), "--shared-fraction"),
    (("--shared-fraction", "0.5"), "--shared-fraction needs --shared-prefix"),
    (("--prefix-hit-rate", "nan"), "--prefix-hit-rate"),
    (("--turns", "0"), "--turns"),
    (("--turns", "2", "--prefix-hit-rate", "0.3"), "one of"),
])
def test_bad_prefix_options_are_one_line_errors(run_cli, args, fragment):
    _one_line_error(run_cli(*LAT, *args), fragment)


def test_closed_loop_latency_replays_a_prefix(run_cli):
    d = run_cli(*SIM[:5], "--concurrency", "8", *SIM[7:], "--shared-prefix", "128").json()
    # the simulator takes it: the 8 first requests are admitted together in the first step;
    # vLLM registers a block when the chunk filling it is scheduled (allocate_slots ->
    # cache_blocks), so the 2nd to 8th already hit the 1st's prefix: 299 hits of 128 tokens
    assert d["prefix_hit_tokens"] == 128 * 299
    # latency answers a closed loop by the same replay, the prefix included
    args = [a for a in LAT if a not in ("--rate", "100")]
    lat = run_cli(*args, "--concurrency", "8", "--num-prompts", "300",
                  "--shared-prefix", "128").json()
    assert lat["answered_by"] == "replay"
    assert lat["prefix_hit_tokens"] == 128 * 299
    assert lat["ttft_s"] == d["ttft_s"] and lat["tbt_s"] == d["tbt_s"]


def test_plan_file_lane_prefix(run_cli, tmp_path):
    plan = tmp_path / "p.yaml"
    body = ("model: llama-3.1-8b\ncandidates: {gpus: [h100-sxm], tp: [1]}\n"
            "verify: {top: 1}\nworkloads:\n  - name: chat\n    rate_per_s: 300\n"
            "    input_len: 200\n    output_len: 16\n    slo: {ttft_p99_s: 500ms}\n")
    plan.write_text(body)
    base = run_cli("plan", str(plan), "--format", "json").json()
    plan.write_text(body + "    prefix: {shared_tokens: 128, share: 1.0}\n")
    cached = run_cli("plan", str(plan), "--format", "json").json()
    gpus = [d["recommendations"][0]["gpus_total"] for d in (base, cached)]
    assert gpus == [2, 1]  # 72 prompt tokens computed instead of 200: one H100 carries it
    plan.write_text(body + "    prefix: {shared_tokens: 128, turns: 2}\n")
    _one_line_error(run_cli("plan", str(plan)), "one of shared_tokens, turns or hit_rate")


def test_mooncake_hash_ids_give_the_hits(run_cli, tmp_path):
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
            {"timestamp": 500, "input_length": 1050, "output_length": 5,
             "hash_ids": [1, 2, 9]}]
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    d = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace",
                str(trace), "--format", "json").json()
    # the second request shares ids 1 and 2: 1024 tokens, 64 full blocks of 16
    assert d["prefix_hit_tokens"] == 1024
    lat = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace",
                  str(trace), "--format", "json").json()
    assert lat["cached_tokens_per_request"] == 512


def test_multi_turn_analytic_hits_match_the_simulator(run_cli):
    # 4 turns of 300-token messages and 100-token answers: prompts 300, 700, 1100, 1500; the
    # history cached before turn k is 400 (k - 1) - 1 tokens, in blocks: 0, 384, 784, 1184,
    # mean 588 per request (think time 10 s: far below how long a freed block survives)
    base = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "20", "--input-len",
            "300", "--output-len", "100", "--turns", "4", "--think-time", "10",
            "--format", "json")
    lat = run_cli("latency", *base).json()
    assert lat["cached_tokens_per_request"] == 588
    sim = run_cli("simulate", *base, "--requests", "400").json()
    assert sim["prefix_hit_tokens"] / 400 == 588


def test_prefix_runs_go_to_the_compiled_engine(run_cli):
    """`auto` runs prefix caching in the compiled loop (numba installed; else the loop
    interpreted), with what the interpreted loop gives."""
    import json

    from capplan.sim import compiled_available

    args = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "40",
            "--requests", "300", "--input-len", "200", "--output-len", "16",
            "--shared-prefix", "128", "--shared-fraction", "1", "--format", "json")
    auto = json.loads(run_cli(*args).stdout)
    ref = json.loads(run_cli(*args, "--sim-engine", "python").stdout)
    assert auto["engine_impl"] == ("compiled" if compiled_available() else "python")
    for key in ("ttft_s", "e2e_s"):
        for q, v in ref[key].items():
            assert auto[key][q] == pytest.approx(v, abs=1e-9), (key, q)
    assert auto["prefix_hit_frac"] == ref["prefix_hit_frac"] > 0.5
