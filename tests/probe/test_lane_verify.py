"""A plan of a pool per lane is verified pool by pool (`capplan verify PLAN.json --lane NAME`,
each lane's own requests at its pool's rate), and a verify line of a mixed load holds a request
to no SLO its lane does not have (vLLM's --goodput applies every threshold to every request)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from tests.probe.test_endpoint import _url, server  # noqa: F401
from tests.probe.test_verify import _plan

LANES = [
    {"name": "Chat_UI", "rate_per_s": 8, "input_len": 800, "output_len": 200,
     "slo": {"ttft_p99_s": 0.5, "tbt_p99_s": "50ms"}},
    {"name": "batch", "rate_per_s": 2, "input_len": 4000, "output_len": 500, "priority": 10,
     "slo": {"tpot_p99_s": 0.1, "e2e_p99_s": 120}},
]


def _lanes_plan(tmp_path: Path, pools: str = "separate") -> Path:
    p = tmp_path / "lanes.yaml"
    p.write_text(yaml.safe_dump({
        "version": 1, "model": "llama-3.1-8b", "verify": {"top": 0},
        "candidates": {"gpus": ["h100-sxm"], "tp": [1]}, "engine": {"max_model_len": 8192},
        "workloads": LANES, "pools": pools}))
    return p


def _goodput(line: str) -> list[str]:
    words = shlex.split(line)
    if "--goodput" not in words:
        return []
    return words[words.index("--goodput") + 1:]


def test_each_lanes_pool_has_its_own_verify_line_and_dataset(run_cli, tmp_path: Path) -> None:
    plan = _lanes_plan(tmp_path)
    out_json = tmp_path / "plan.json"
    res = run_cli("plan", str(plan), "--export", str(out_json), "--export",
                  str(tmp_path / "plan.md"), "--export", str(tmp_path / "plan.html"))
    assert res.exit_code == 0, res.stderr
    d = json.loads(out_json.read_text())
    lanes = d["pools"]["separate"]["lanes"]
    for ln, port, rate, good in zip(lanes, (8100, 8101), ("8", "2"),
                                    (["ttft:500"], ["tpot:100", "e2el:120000"]), strict=True):
        f = ln["engine_flags"]
        assert f"--lane {ln['lane']} " in f["bench_dataset"]
        data = f"capplan-workload-lane-{ln['lane']}.jsonl"
        assert f["bench_dataset"].endswith(data)
        words = shlex.split(f["bench"])
        assert words[words.index("--dataset-path") + 1] == data
        assert words[words.index("--base-url") + 1] == f"http://localhost:{port}"
        assert words[words.index("--request-rate") + 1] == rate
        assert _goodput(f["bench"]) == good  # the lane's own SLOs, TPOT included
        # the terminal prints each lane's steps, not the shared pool's
        assert f"dataset (lane {ln['lane']}): {f['bench_dataset']}".replace(
            "PLAN.json", str(out_json)) in res.stdout
        assert f["bench"] in res.stdout
        assert f["bench_dataset"].replace("PLAN.json", str(out_json)) in (
            tmp_path / "plan.md").read_text()
        assert f"--lane {ln['lane']}" in (tmp_path / "plan.html").read_text()
    shared = d["recommendations"][0]["engine_flags"]["bench"]
    assert shared not in res.stdout
    assert shared not in (tmp_path / "plan.md").read_text()
    # the lane's dataset: its requests alone, at its pool's rate
    ds = tmp_path / "batch.jsonl"
    res = run_cli("verify", str(out_json), "--lane", "batch", "--client", "vllm",
                  "--write-dataset", str(ds))
    assert res.exit_code == 0, res.stderr
    rows = [json.loads(x) for x in ds.read_text().splitlines()]
    assert len(rows) == 600 and {r["output_tokens"] for r in rows} == {500}
    res = run_cli("verify", str(out_json), "--lane", "nope", "--write-dataset", str(ds))
    assert res.exit_code == 2
    assert res.stderr.strip() == ("Error: --lane nope: not one of the plan's lanes "
                                  "(Chat_UI, batch)")


def test_a_shared_pools_goodput_holds_no_request_to_another_lanes_slo(run_cli, tmp_path: Path
                                                                     ) -> None:
    plan = _lanes_plan(tmp_path, pools="shared")
    res = run_cli("plan", str(plan), "--format", "json")
    assert res.exit_code == 0, res.stderr
    f = json.loads(res.stdout)["recommendations"][0]["engine_flags"]
    assert _goodput(f["bench"]) == []  # the lanes share no SLO
    note = f["bench_goodput"]
    assert note.startswith("# the lanes share this load")
    for left in ("lane Chat_UI's TTFT p99 500 ms", "lane batch's TPOT p99 100 ms",
                 "lane batch's E2E p99 120 s"):
        assert left in note
    res = run_cli("plan", str(plan))  # wrapped at 120 columns, each line a comment
    said = " ".join(res.stdout.split()).replace("# ", "")
    assert f"goodput: {note}".replace("# ", "") in said


def test_goodput_keeps_an_slo_every_lane_shares() -> None:
    from capplan.plan.bench_cmds import shared_slos
    from capplan.plan.slo import SloSet

    common, left = shared_slos([("a", SloSet(ttft_p99_s=1.0, e2e_p99_s=30.0)),
                                ("b", SloSet(ttft_p99_s=1.0))])
    assert common["ttft_p99_s"] == 1.0 and common["e2e_p99_s"] is None
    assert left == ["lane a's E2E p99 30 s"]


def test_verify_checks_each_lane_against_its_own_slo(server, tmp_path, run_cli  # noqa: F811
                                                     ) -> None:
    d = _plan()
    d["lanes"] = [{**d["lanes"][0], "name": "a", "rate_per_s": 20, "ttft_p99_s": 60.0},
                  {**d["lanes"][0], "name": "b", "rate_per_s": 20, "ttft_p99_s": None,
                   "e2e_p99_s": 1e-6}]
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(d))
    res = run_cli("verify", str(p), "--endpoint", _url(server), "--requests", "12",
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    checks = {(c["lane"], c["slo"]): c["met"] for c in res.json()["lane_slos"]}
    assert checks == {("a", "ttft_p99_s"): True, ("b", "e2e_p99_s"): False}
    res = run_cli("verify", str(p), "--endpoint", _url(server), "--requests", "12")
    assert "each lane's p99 against its own SLO:" in res.stdout
    # review finding 13: a 60 s SLO printed as 6e+04 ms
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith("a ") and "TTFT" in ln)
    assert "60000" in row.split() and "e+" not in res.stdout, row


def test_verify_without_lane_says_the_plan_recommends_a_pool_per_lane(run_cli,
                                                                      tmp_path: Path) -> None:
    """Review finding 5: `verify PLAN.json --write-dataset all.jsonl` of a `pools: separate`
    plan silently wrote the shared pool's mixed load. One note line says so and names --lane;
    with --lane, or for a plan that does not recommend a pool per lane, there is none."""
    for pools in ("separate", "shared"):
        out_json = tmp_path / f"{pools}.json"
        res = run_cli("plan", str(_lanes_plan(tmp_path, pools)), "--export", str(out_json))
        assert res.exit_code == 0, res.stderr
        res = run_cli("verify", str(out_json), "--write-dataset", str(tmp_path / "all.jsonl"))
        assert res.exit_code == 0, res.stderr
        notes = [ln for ln in res.stderr.splitlines() if "pool per lane" in ln]
        if pools == "separate":
            assert len(notes) == 1 and notes[0].startswith("note: "), res.stderr
            assert "Chat_UI, batch" in notes[0] and "--lane NAME" in notes[0]
        else:
            assert notes == [], res.stderr
    res = run_cli("verify", str(tmp_path / "separate.json"), "--lane", "batch",
                  "--write-dataset", str(tmp_path / "b.jsonl"))
    assert res.exit_code == 0 and "pool per lane" not in res.stderr, res.stderr


def test_the_unchecked_note_names_tbt_and_tpot_mean_slos(run_cli) -> None:
    """Review finding 8: no --goodput checks a TBT p99 (or a TPOT mean), yet the note that
    names every SLO left unchecked left them out (examples/shared-70b.yaml: interactive's
    TBT p99 80 ms). Even one every lane shares is unchecked."""
    from capplan.plan.bench_cmds import shared_slos
    from capplan.plan.slo import SloSet

    common, left = shared_slos([("a", SloSet(ttft_p99_s=1.0, tbt_p99_s=0.05)),
                                ("b", SloSet(ttft_p99_s=1.0, tbt_p99_s=0.05,
                                             tpot_mean_s=0.04))])
    assert common == {"ttft_p99_s": 1.0, "tpot_p99_s": None, "e2e_p99_s": None}
    assert left == ["lane a's TBT p99 50 ms", "lane b's TBT p99 50 ms",
                    "lane b's TPOT mean 40 ms"]
    res = run_cli("plan", str(Path(__file__).parents[2] / "examples" / "shared-70b.yaml"),
                  "--format", "json")
    assert res.exit_code == 0, res.stderr
    note = json.loads(res.stdout)["recommendations"][0]["engine_flags"]["bench_goodput"]
    assert "lane interactive's TBT p99 80 ms" in note, note


def test_one_table_maps_slos_to_every_clients_goodput(monkeypatch) -> None:
    """Review finding 10: the SLO -> --goodput mapping was written three times (the note's
    table and a list in each client's command). One table drives both clients' lines."""
    from capplan.plan import bench_cmds

    slo = {"ttft_p99_s": 0.5, "tpot_p99_s": 0.1, "e2e_p99_s": 30.0}
    args = {"model_id": "m", "base_url": "http://h:1", "rate_per_s": 1.0, "slo": slo}
    assert _goodput(bench_cmds.bench_command("vllm", **args)) == [
        "ttft:500", "tpot:100", "e2el:30000"]
    assert _goodput(bench_cmds.bench_command("aiperf", **args)) == [
        "time_to_first_token:500 inter_token_latency:100 request_latency:30000"]
    monkeypatch.delitem(bench_cmds.GOODPUT_METRICS, "e2e_p99_s")
    assert _goodput(bench_cmds.bench_command("vllm", **args)) == ["ttft:500", "tpot:100"]
    assert _goodput(bench_cmds.bench_command("aiperf", **args)) == [
        "time_to_first_token:500 inter_token_latency:100"]


def test_model_and_lane_steps_are_one_rewrite() -> None:
    """Review finding 10: for_model and for_lane did the same rewrite with the same regex,
    twice. Both are _calling: the verify call and the dataset stem, the name made safe."""
    from capplan.plan import bench_cmds

    flags = {"bench": "vllm bench serve --dataset-path capplan-workload.jsonl",
             "bench_dataset": "capplan verify PLAN.json --write-dataset capplan-workload.jsonl",
             "launch": "vllm serve m"}
    lane = bench_cmds.for_lane(flags, "a b/c")
    model = bench_cmds.for_model({"recommendations": [{"engine_flags": flags}]},
                                 "a b/c")["recommendations"][0]["engine_flags"]
    assert lane == bench_cmds._calling(flags, "capplan verify PLAN.json --lane 'a b/c'",
                                       "capplan-workload-lane-a-b-c")
    assert model == bench_cmds._calling(flags, "capplan verify PLAN.json --model 'a b/c'",
                                        "capplan-workload-a-b-c")
    # written out: the call quoted for a shell, the file name made safe
    assert lane["bench_dataset"] == ("capplan verify PLAN.json --lane 'a b/c' --write-dataset "
                                     "capplan-workload-lane-a-b-c.jsonl")
    assert lane["bench"].endswith("--dataset-path capplan-workload-lane-a-b-c.jsonl")
    assert model["bench_dataset"] == ("capplan verify PLAN.json --model 'a b/c' "
                                      "--write-dataset capplan-workload-a-b-c.jsonl")
    assert model["launch"] == "vllm serve m"
    assert model["bench"].endswith("capplan-workload-a-b-c.jsonl")


def test_a_wrapped_goodput_note_keeps_its_verify_call_on_one_line() -> None:
    """The terminal wraps the goodput note at 120 columns; it broke `capplan verify PLAN.json`
    across two lines (examples/shared-70b.yaml), so the copied call was cut and the CLI's
    PLAN.json substitution missed it. The note now wraps between words outside the call."""
    from capplan.plan.bench_cmds import step_lines

    note = ("# the lanes share this load: the lanes have no SLO in common, so the line has no "
            "--goodput; not checked: lane interactive's TTFT p99 1500 ms, lane interactive's "
            "TBT p99 80 ms, lane batch's E2E p99 300 s; `capplan verify PLAN.json --endpoint "
            "http://localhost:8000` sends the same mix and checks each lane's p99s against its "
            "own SLOs")
    assert step_lines({"bench_goodput": note}) == [
        "goodput: # the lanes share this load: the lanes have no SLO in common, so the line "
        "has no --goodput; not checked: lane\n"
        "         # interactive's TTFT p99 1500 ms, lane interactive's TBT p99 80 ms, lane "
        "batch's E2E p99 300 s;\n"
        "         # `capplan verify PLAN.json --endpoint http://localhost:8000` sends the same "
        "mix and checks each lane's p99s\n"
        "         # against its own SLOs"]


def test_a_lane_pools_goodput_note_names_its_lane_and_runs_as_printed(
        server, run_cli, tmp_path: Path) -> None:  # noqa: F811
    """A lane's own pool: its goodput note said "the lanes share this load" and named
    `capplan verify PLAN.json --endpoint URL`, which verifies the shared pool's mix. It now
    speaks of the lane's requests and names the lane's verify call at its pool's server, which
    checks the lane's TBT p99 (no --goodput has it) against its SLO; the Markdown report gives
    each lane pool's measure line, as the HTML report does."""
    out_json = tmp_path / "plan.json"
    res = run_cli("plan", str(_lanes_plan(tmp_path)), "--export", str(out_json), "--export",
                  str(tmp_path / "plan.md"))
    assert res.exit_code == 0, res.stderr
    chat, batch = json.loads(out_json.read_text())["pools"]["separate"]["lanes"]
    call = "capplan verify PLAN.json --lane Chat_UI --endpoint http://localhost:8100"
    assert chat["engine_flags"]["bench_goodput"] == (
        "# --goodput holds the lane's requests to its SLOs (TTFT p99 500 ms); not checked: "
        f"lane Chat_UI's TBT p99 50 ms; `{call}` sends the lane's requests and checks its p99s "
        "against its SLOs")
    assert "bench_goodput" not in batch["engine_flags"]  # TPOT p99 and E2E p99: --goodput's
    # the terminal prints the call whole, reading the JSON just written
    printed = call.replace("PLAN.json", str(out_json))
    assert any(printed in line for line in res.stdout.splitlines()), res.stdout
    md = (tmp_path / "plan.md").read_text()
    for lane, port in (("Chat_UI", 8100), ("batch", 8101)):
        assert (f"Lane {lane}, measure:\n\n```bash\ncapplan verify {out_json} --lane {lane} "
                f"--endpoint http://localhost:{port}\n```\n") in md
    # run as printed (at the test's server): the lane's own SLOs checked, its TBT p99 too
    words = shlex.split(printed.replace("http://localhost:8100", _url(server)))
    res = run_cli(*words[1:], "--requests", "6", "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert {(c["lane"], c["slo"], c["limit_s"]) for c in res.json()["lane_slos"]} == {
        ("Chat_UI", "ttft_p99_s", 0.5), ("Chat_UI", "tbt_p99_s", 0.05)}


def test_a_models_goodput_note_names_the_model() -> None:
    """In a plan of several models the note's verify call needs --model (the JSON holds every
    model), as the dataset line has it; a lane's pool's call names the model and the lane."""
    from capplan.plan import bench_cmds

    note = "# ...; `capplan verify PLAN.json --endpoint http://HOST0:8100` sends ..."
    lane = bench_cmds.for_lane({"bench_goodput": note}, "chat")
    plan = {"recommendations": [{"engine_flags": {"bench_goodput": note}}],
            "pools": {"separate": {"lanes": [{"lane": "chat", "engine_flags": lane}]}}}
    got = bench_cmds.for_model(plan, "qwen2.5-72b")
    assert got["recommendations"][0]["engine_flags"]["bench_goodput"] == (
        "# ...; `capplan verify PLAN.json --model qwen2.5-72b --endpoint http://HOST0:8100` "
        "sends ...")
    assert got["pools"]["separate"]["lanes"][0]["engine_flags"]["bench_goodput"] == (
        "# ...; `capplan verify PLAN.json --model qwen2.5-72b --lane chat --endpoint "
        "http://HOST0:8100` sends ...")


def test_a_lanes_verify_names_the_lanes_own_peak_window(run_cli, tmp_path: Path) -> None:
    """A day plan of a pool per lane sizes each lane's pool at the lane's own peak (lane_days):
    chat peaks at 15:00 (6 req/s), batch at 03:00 (3 req/s), the two together at 15:00 (6.5 req/s
    against 4 at 03:00). Verify of lane batch stands for the window its pool was sized for,
    02:00-03:00 at 3 req/s (the window ending at its curve's top), not the plan's 14:00-15:00,
    where batch runs at 0.5 req/s."""
    slo = {"ttft_p99_s": 2.0, "tbt_p99_s": "60ms"}
    doc = {"version": 1, "model": "llama-3.1-8b", "pools": "separate", "verify": {"top": 0},
           "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
           "engine": {"max_num_seqs": [128], "max_num_batched_tokens": [2048]},
           "day": {"window_s": 3600, "replay": "none"},
           "workloads": [
               {"name": "chat", "input_len": 800, "output_len": 200, "slo": slo,
                "rate_curve": [{"at": "03:00", "rate_per_s": 1}, {"at": "15:00", "rate_per_s": 6}]},
               {"name": "batch", "input_len": 2000, "output_len": 300, "slo": slo,
                "rate_curve": [{"at": "03:00", "rate_per_s": 3},
                               {"at": "15:00", "rate_per_s": 0.5}]}]}
    path = tmp_path / "day.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "day.plan.json"
    res = run_cli("plan", str(path), "--export", str(out))
    assert res.exit_code == 0, res.stderr
    data = tmp_path / "batch.jsonl"
    res = run_cli("verify", str(out), "--lane", "batch", "--client", "vllm", "--write-dataset",
                  str(data))
    assert res.exit_code == 0, res.stderr
    assert "lane batch's peak window 02:00-03:00, 3 req/s" in res.stderr
    res = run_cli("verify", str(out), "--lane", "chat", "--client", "vllm", "--write-dataset",
                  str(tmp_path / "chat.jsonl"))
    assert "lane chat's peak window 14:00-15:00, 6 req/s" in res.stderr
