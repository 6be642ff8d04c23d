"""`capplan verify`: the plan's workload as dataset files, and run against the test suite's
local OpenAI-compatible server (tests/probe/test_endpoint.py), predicted beside measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.probe.test_endpoint import A_S, B_S, C_S, D_S, _url, server  # noqa: F401

# The server's law at level 1 (its fixed level): TTFT = A + B, every gap C + D; a request of
# 6 output tokens ends after TTFT + 5 gaps. The "plan" below predicts exactly that, so the
# measured/predicted ratios are 1 up to the client's and the machine's own delays.
TTFT_S, GAP_S = A_S + B_S, C_S + D_S
E2E_S = TTFT_S + 5 * GAP_S


def _plan(rate: float = 20.0, inp: str = "32", out: str = "6") -> dict:
    pred = {"ttft_s": dict.fromkeys(("mean", "p50", "p90", "p99"), TTFT_S),
            "tbt_s": dict.fromkeys(("mean", "p50", "p90", "p99"), GAP_S),
            "e2e_s": dict.fromkeys(("mean", "p50", "p90", "p99"), E2E_S),
            "output_tokens_per_s": rate * 6, "requests_per_s": rate}
    return {"model": "llama-3.1-8b", "hf_id": "m",
            "lanes": [{"name": "chat", "rate_per_s": 2 * rate, "input_len": inp,
                       "output_len": out, "ttft_p99_s": 1.0}],
            "recommendations": [{"gpu": "h100-sxm", "tp": 1, "replicas": 2,
                                 "per_replica_rate_per_s": rate, "max_model_len": 4096,
                                 "predicted": pred}]}


@pytest.fixture
def plan_json(tmp_path: Path) -> Path:
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(_plan()))
    return p


def test_verify_prints_predicted_beside_measured(server, plan_json, run_cli,  # noqa: F811
                                                 tmp_path) -> None:
    cal = tmp_path / "cal.yaml"
    res = run_cli("verify", str(plan_json), "--endpoint", _url(server), "--requests", "3")
    assert res.exit_code == 0, res.stderr
    assert "predicted" in res.stdout and "measured" in res.stdout
    assert "3 of 3 requests completed, 0 errors" in res.stdout
    res = run_cli("verify", str(plan_json), "--endpoint", _url(server), "--requests", "12",
                  "--out", str(cal), "--format", "json")
    d = res.json()
    rows = {r["metric"]: r for r in d["comparison"]}
    # sleeps on a loaded machine only add time: measured >= the law, and not by much
    for metric, law in (("ttft p50", TTFT_S), ("tbt p50", GAP_S), ("e2e p50", E2E_S)):
        assert rows[metric]["predicted"] == pytest.approx(law)
        assert law * 0.99 <= rows[metric]["measured"] <= law + 0.15, metric
    assert d["measured"]["output_tokens_per_s"] > 0
    written = yaml.safe_load(cal.read_text())
    assert written["gpu"] == "h100-sxm" and written["params"]


def test_refused_endpoint_is_one_line_exit_2(plan_json, run_cli) -> None:
    res = run_cli("verify", str(plan_json), "--endpoint", "http://127.0.0.1:9")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1


def test_needs_an_endpoint_or_a_dataset(plan_json, run_cli) -> None:
    res = run_cli("verify", str(plan_json))
    assert res.exit_code == 2 and "--endpoint" in res.stderr


@pytest.mark.parametrize("path", ["", "  "])
def test_empty_dataset_path_is_one_line_and_writes_nothing(plan_json, run_cli, tmp_path,
                                                           monkeypatch, path) -> None:
    monkeypatch.chdir(tmp_path)  # the old fallback wrote capplan-workload.jsonl here
    before = sorted(tmp_path.iterdir())
    res = run_cli("verify", str(plan_json), "--write-dataset", path)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "--write-dataset '': expected a file path" in res.stderr
    assert sorted(tmp_path.iterdir()) == before
    import capplan
    from capplan.errors import InputError

    with pytest.raises(InputError, match="expected a file path"):
        capplan.verify(str(plan_json), write_dataset=path)


@pytest.mark.parametrize("client", ["vllm", "sglang", "aiperf", "guidellm", "capplan"])
def test_dataset_holds_the_planned_lengths(tmp_path, run_cli, client) -> None:
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(_plan(rate=4, inp="700", out="uniform:min=10,max=50")))
    ds = tmp_path / f"ds.{client}"
    res = run_cli("verify", str(p), "--client", client, "--write-dataset", str(ds),
                  "--requests", "40")
    assert res.exit_code == 0, res.stderr
    text = ds.read_text()
    if client == "sglang":
        convs = [c["conversations"] for c in json.loads(text)]
        ins = [len(c[0]["value"].split()) + 1 for c in convs]
        outs = [len(c[1]["value"].split()) for c in convs]
    else:
        rows = [json.loads(line) for line in text.splitlines()]
        key_in = {"aiperf": "input_length", "guidellm": "prompt_tokens_count",
                  "capplan": "input_tokens"}.get(client)
        ins = [r[key_in] if key_in else len(r["prompt"].split()) + 1 for r in rows]
        if "prompt" in rows[0]:  # no two prompts share a first 16-token block (prefix cache)
            assert len({tuple(r["prompt"].split()[:15]) for r in rows}) == len(rows)
        outs = [r[{"vllm": "output_tokens", "aiperf": "output_length",
                   "guidellm": "output_tokens_count", "capplan": "output_tokens"}[client]]
                for r in rows]
        if client == "aiperf":  # Poisson arrivals at 4 req/s per replica, in ms
            ts = [r["timestamp"] for r in rows]
            assert ts == sorted(ts) and 40 / 4 * 1e3 / 3 < ts[-1] < 40 / 4 * 1e3 * 3
    assert len(ins) == 40 and set(ins) == {700}
    assert all(10 <= o <= 50 for o in outs) and len(set(outs)) > 5


def _pd_plan() -> dict:
    """The plan above with a disaggregated layout beside it (its TTFT and TBT p99 the law)."""
    d = _plan()
    d["disaggregated"] = {"prefill": {"replicas": 1}, "decode": {"replicas": 1},
                          "ttft_p99_s": TTFT_S, "tbt_p99_s": GAP_S, "winner": "disaggregated"}
    return d


def test_a_disaggregated_layout_is_verified_with_the_whole_workload(
        server, tmp_path, run_cli) -> None:  # noqa: F811
    # The front end of P/D pools takes every request the plan carries (2 x 20 req/s here),
    # not one aggregated replica's share: the dataset holds the whole rate, and the server is
    # compared with the layout's own predictions (TTFT and TBT p99)
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(_pd_plan()))
    ds = {}
    for layout in ("aggregated", "disaggregated"):
        out = tmp_path / f"{layout}.jsonl"
        res = run_cli("verify", str(p), "--layout", layout, "--client", "aiperf",
                      "--write-dataset", str(out), "--requests", "400")
        assert res.exit_code == 0, res.stderr
        ds[layout] = [json.loads(line)["timestamp"] for line in out.read_text().splitlines()]
    # 400 Poisson arrivals: 20 s at one replica's 20 req/s, 10 s at the whole 40 req/s
    assert ds["aggregated"][-1] / 1e3 == pytest.approx(20, rel=0.2)
    assert ds["disaggregated"][-1] / 1e3 == pytest.approx(10, rel=0.2)
    res = run_cli("verify", str(p), "--layout", "disaggregated", "--endpoint", _url(server),
                  "--requests", "6", "--format", "json")
    d = res.json()
    assert d["layout"] == "disaggregated" and d["per_replica_rate_per_s"] == 40
    rows = {r["metric"]: r for r in d["comparison"]}
    assert rows["ttft p99"]["predicted"] == pytest.approx(TTFT_S)
    assert rows["ttft p50"]["predicted"] is None  # the layout predicts p99s only
    assert rows["ttft p99"]["measured"] >= TTFT_S * 0.99


def test_a_plan_without_a_disaggregated_layout_says_so(plan_json, run_cli, tmp_path) -> None:
    out = tmp_path / "x.jsonl"
    res = run_cli("verify", str(plan_json), "--layout", "disaggregated", "--write-dataset",
                  str(out))
    assert res.exit_code == 2 and "no disaggregated layout" in res.stderr
    assert res.stderr.count("\n") == 1 and not out.exists()


def test_a_plan_files_own_layout_is_the_one_verified(server, tmp_path, run_cli) -> None:  # noqa: F811
    # a plan file that names its P/D layout (`disaggregated_layout`) is verified against that
    # layout's every prediction, before any layout `recommend --disagg` sized beside it
    plan = _pd_plan()
    law = _plan()["recommendations"][0]["predicted"]
    plan["fixed_disaggregated"] = {"pools": {"prefill": {}, "decode": {}}, **law}
    plan["disaggregated"]["ttft_p99_s"] = 99.0  # not the one compared
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan))
    d = run_cli("verify", str(p), "--layout", "disaggregated", "--endpoint", _url(server),
                "--requests", "6", "--format", "json").json()
    rows = {r["metric"]: r for r in d["comparison"]}
    assert rows["ttft p99"]["predicted"] == pytest.approx(TTFT_S)
    assert rows["tbt p50"]["predicted"] == pytest.approx(GAP_S)
    assert rows["e2e p50"]["predicted"] == pytest.approx(E2E_S)


class _Req:
    """A planned request (capplan.plan.workload_file.PlannedRequest's fields the replay reads)."""

    def __init__(self, arrival_s: float) -> None:
        self.arrival_s, self.prompt, self.output_tokens = arrival_s, "hello " * 31, 6
        self.input_tokens = 32


def test_open_loop_is_fitted_at_the_rate_sent_not_diluted_by_the_drain(server) -> None:  # noqa: F811
    """Audit defects 6/7: the fit's open-loop rate was completed / (first send -> last token).
    By hand: 4 arrivals 0.05 s apart are 3 intervals over 0.15 s = 20 req/s sent. Each request
    lasts >= E2E = 85 + 5 x 11 = 140 ms, so the whole run is >= 0.29 s and completed / duration
    <= 4 / 0.29 = 13.8 req/s (before: that was the fitted rate and the compared throughput)."""
    from capplan.probe.level_fit import target_of
    from capplan.probe.replay import replay
    from capplan.probe.results import _centre

    lv = replay(_url(server), "m", [_Req(0.05 * i) for i in range(4)], timeout_s=30)
    assert lv["completed"] == 4
    assert lv["arrival_rate_per_s"] == pytest.approx(20.0, rel=1e-9)
    assert lv["requests_per_s"] < 14.0  # the whole run's, the drain included
    assert target_of(lv, _centre).rate_per_s == pytest.approx(20.0, rel=1e-9)
    assert lv["send_span_s"] == pytest.approx(0.15, rel=1e-9) and lv["sent"] == 4
    # Little's law at the rate sent: L = 20 req/s x mean E2E (>= 0.14 s, + machine delays)
    assert lv["in_flight_mean"] == pytest.approx(20.0 * lv["e2e_s"]["mean"], rel=1e-9)


@pytest.mark.parametrize("mode", ["ok", "serial"])
def test_verify_throughput_is_the_servers_own_over_the_run(server, mode) -> None:  # noqa: F811
    """Measured throughput is completed / (first send -> last completion); predicted is what
    the plan predicts for the same run: n / (send span + its mean E2E). By hand: 10 requests
    0.02 s apart span 0.18 s; the plan's mean E2E is 0.14 s, so predicted = 10 / 0.32 =
    31.25 req/s and 60 / 0.32 = 187.5 tok/s (6 tokens each). A server that keeps up ends at
    >= 0.18 + 0.14 s: ~1. One that serves one request at a time ends at >= 10 x 0.14 = 1.4 s:
    <= 10 / 1.4 / 31.25 = 0.229 (before: both read completed/sent x the rate sent = 1.0)."""
    from capplan.plan.verify_endpoint import VerifyResult
    from capplan.probe.replay import replay

    server.mode = mode
    reqs = [_Req(0.02 * i) for i in range(10)]
    lv = replay(_url(server), "m", reqs, timeout_s=30)
    assert lv["completed"] == 10
    rows = {r["metric"]: r for r in VerifyResult(_plan(), reqs, lv).rows()}
    assert rows["requests_per_s"]["predicted"] == pytest.approx(10 / 0.32, rel=1e-9)
    assert rows["output_tokens_per_s"]["predicted"] == pytest.approx(60 / 0.32, rel=1e-9)
    for key in ("requests_per_s", "output_tokens_per_s"):
        ratio = rows[key]["measured_over_predicted"]
        if mode == "ok":  # sleeps on a loaded machine only add time
            assert 0.6 <= ratio <= 1.0 + 1e-9, (key, ratio)
        else:
            assert ratio <= 10 / 1.4 / 31.25 + 1e-9, (key, ratio)


def test_verify_one_request_has_no_throughput_ratio(server, plan_json, run_cli) -> None:  # noqa: F811
    """One request has no send span: the throughput rows are n/a and the note says why
    (before: the whole run's 1 / E2E against the plan's rate, a 0.03 'ratio')."""
    res = run_cli("verify", str(plan_json), "--endpoint", _url(server), "--requests", "1",
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    rows = {r["metric"]: r for r in res.json()["comparison"]}
    for key in ("requests_per_s", "output_tokens_per_s"):
        assert rows[key]["measured_over_predicted"] is None
        assert rows[key]["predicted"] is None
    assert "throughput n/a" in res.stderr and "no send span" in res.stderr
