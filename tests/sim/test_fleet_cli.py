"""`capplan simulate --replicas / --schedule` and `capplan.simulate(replicas=...)`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from capplan.cli import cli
from capplan.sim import compiled_available

BASE = ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--input-len", "200",
        "--output-len", "40"]
needs_numba = pytest.mark.skipif(not compiled_available(), reason="numba (the fast extra)")


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPPLAN_HOME", str(tmp_path))


def invoke(*args: str):
    return CliRunner().invoke(cli, [*BASE, *args])


@needs_numba
@pytest.mark.parametrize("router", ["round-robin", "least-outstanding", "prefix-affinity"])
def test_replicas_json(router):
    r = invoke("--rate", "60", "--requests", "300", "--replicas", "3", "--router", router,
               "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["replicas"] == 3 and d["router"] == router and d["unfinished"] == 0
    assert sum(p["requests"] for p in d["per_replica"]) == d["num_requests"] == 300
    assert set(d["ttft_s"]) - {"band"} == {"mean", "p50", "p90", "p99"}  # band: error band
    if router == "round-robin":
        assert [p["requests"] for p in d["per_replica"]] == [100, 100, 100]


@needs_numba
def test_schedule_windows_and_table():
    r = invoke("--rate", "50", "--requests", "400", "--schedule", "0:1,3:3,6:2",
               "--startup-lag", "1", "--slo-ttft", "0.5", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    wins = d["windows"]
    assert [w["replicas"] for w in wins] == [1, 3, 2]
    assert sum(w["completed"] + w["unfinished"] for w in wins) == 400
    assert all(0 <= w["attainment"] <= 1 for w in wins)
    assert d["per_replica"][1]["ready_at_s"] == 4.0  # joined at 3 s, serves after the 1 s lag
    t = invoke("--rate", "50", "--requests", "400", "--schedule", "0:1,3:3,6:2")
    assert t.exit_code == 0 and "offered (req/s)" in t.output


def test_closed_loop_splits_clients():
    r = invoke("--concurrency", "6", "--requests", "60", "--replicas", "2", "--format", "json",
               "--sim-engine", "fast")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert [p["clients"] for p in d["per_replica"]] == [3, 3]
    assert [p["requests"] for p in d["per_replica"]] == [30, 30]


@pytest.mark.parametrize("args", [
    ["--replicas", "0"], ["--schedule", "5:1"], ["--schedule", "0:1,0:2"], ["--schedule", "x"],
    ["--router", "random"], ["--startup-lag", "-1"], ["--slo-ttft", "1"],
    ["--replicas", "2", "--plot", "charts"],
    ["--replicas", "2", "--scheduler", "static"]])
def test_bad_fleet_input_exit_2(args):
    r = invoke("--rate", "5", "--requests", "20", *args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output


@needs_numba
def test_api_replicas():
    import capplan

    res = capplan.simulate("llama-3.1-8b", "h100-sxm", rate=60, requests=200, input_len=200,
                           output_len=40, replicas=2, router="least-outstanding").to_dict()
    assert res["replicas"] == 2 and res["num_requests"] == 200


@needs_numba
def test_trace_over_replicas(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text("timestamp,input_tokens,output_tokens\n" +
                 "".join(f"{i * 0.05},{100 + i},{20 + i % 7}\n" for i in range(200)))
    r = CliRunner().invoke(cli, ["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                                 "--trace", str(p), "--replicas", "2", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["num_requests"] == 200 and d["unfinished"] == 0
    assert sum(x["completed"] for x in d["per_replica"]) == 200


def test_per_replica_tails_are_what_the_fleet_pools(run_cli):
    """A fleet's TTFT and E2E p99 pool its replicas' requests, so each lies within the range of
    its replicas' p99s (a p99 over pooled requests is never above the largest replica's): both
    carry the request overhead a client measures (SGLang's 220 ms)."""
    d = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine",
                "sglang", "--rate", "10", "--requests", "1000", "--replicas", "2", "--router",
                "round-robin", "--format", "json").json()
    for key, fleet in (("ttft_p99_s", d["ttft_s"]["p99"]), ("e2e_p99_s", d["e2e_s"]["p99"])):
        reps = [p[key] for p in d["per_replica"]]
        assert min(reps) - 1e-9 <= fleet <= max(reps) + 1e-9, (key, fleet, reps)
        assert min(reps) > 0.22  # the overhead is in every replica's figure


def test_a_fleets_batch_is_labelled_as_its_replicas_together(run_cli):
    res = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "20",
                  "--requests", "400", "--replicas", "2")
    assert res.exit_code == 0, res.stderr
    assert "mean running batch (seqs, all replicas)" in res.stdout
