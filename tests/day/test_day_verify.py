"""`capplan verify` of a day plan and of a plan of several models: the `dataset:` lines such a
plan prints run as printed and write what its `verify:` line sends, at the peak window its
recommendation is sized for; each model of several gets its own lines and dataset file."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

import capplan
from tests.cli._asserts import assert_one_line_error

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "day"
TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "vidur_splitwise_conv_head200.csv"
QUICK = ["--gpu", "h100-sxm", "--tp", "1", "--max-num-seqs", "128",
         "--max-num-batched-tokens", "2048", "--verify-top", "0", "--no-disagg",
         "--ttft-p99", "1", "--replay", "none"]


def _printed(stdout: str, label: str) -> list[list[str]]:
    """The `dataset:` or `verify:` commands a plan printed, split as a shell splits them."""
    return [shlex.split(ln.split(":", 1)[1]) for ln in stdout.splitlines()
            if ln.startswith(f"{label}:")]


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _run_printed(run_cli, argv: list[str]):
    assert argv[:2] == ["capplan", "verify"], argv
    return run_cli(*argv[1:])


def _chat_day(tmp_path: Path) -> Path:
    """examples/day/chat-day.yaml with its curve beside it, the replay and the simulator
    check off (the sizing at the peak is the same; they take a minute)."""
    doc = yaml.safe_load((EXAMPLES / "chat-day.yaml").read_text())
    doc["day"]["replay"], doc["verify"]["top"] = "none", 0
    shutil.copy(EXAMPLES / "diurnal.csv", tmp_path / "diurnal.csv")
    path = tmp_path / "chat-day.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_day_plans_printed_verify_line_runs_as_printed(run_cli, tmp_path: Path, monkeypatch):
    """plan -> --export -> the printed dataset line, run as printed, exits 0 and writes the
    requests the printed verify line sends: as many as its --num-prompts, at the peak window's
    rate, which the output names."""
    plan = _chat_day(tmp_path)
    exported = tmp_path / "x" / "day.json"
    exported.parent.mkdir()
    res = run_cli("plan", str(plan), "--export", str(exported))
    assert res.exit_code == 0, res.stderr
    (dataset,), (bench,) = _printed(res.stdout, "dataset"), _printed(res.stdout, "verify")
    assert dataset[2] == str(exported)
    monkeypatch.chdir(tmp_path)  # the printed dataset file name is relative: it lands here
    ran = _run_printed(run_cli, dataset)
    assert ran.exit_code == 0, ran.stderr
    d = json.loads(exported.read_text())
    peak, best = d["day"]["peak"], d["recommendations"][0]
    # the plan was sized at its peak window (14:45-15:00: the curve reaches its 40 req/s at
    # 15:00, the window's end; its mean is 39.8)
    assert peak["rate_per_s"] == pytest.approx(d["target_rate_per_s"])
    assert peak["lanes"][0]["rate_per_s"] == pytest.approx(peak["rate_per_s"])
    assert float(_option(bench, "--request-rate")) == pytest.approx(
        best["per_replica_rate_per_s"], rel=1e-3)
    written = tmp_path / _option(dataset, "--write-dataset")
    assert written.name == _option(bench, "--dataset-path")
    rows = [json.loads(ln) for ln in written.read_text().splitlines()]
    assert len(rows) == int(_option(bench, "--num-prompts"))
    assert "the day plan's peak window 14:45-15:00, 40 req/s, one replica's share 20 req/s" \
        in ran.stderr


def test_day_plans_requests_arrive_at_the_peak_rate(tmp_path: Path):
    """capplan's own dataset keeps the arrival times: one replica's share of the peak window's
    rate (20 req/s: the curve's 40 at 15:00 on two replicas), with the lane's lengths (prompts
    of mean 800 tokens)."""
    d = capplan.run_plan(_chat_day(tmp_path), verify=False).to_dict()
    out = tmp_path / "w.jsonl"
    res = capplan.verify(d, write_dataset=str(out), requests=4000)
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    rate = len(rows) / rows[-1]["arrival_s"]
    assert rate == pytest.approx(d["recommendations"][0]["per_replica_rate_per_s"], rel=0.05)
    assert np.mean([r["input_tokens"] for r in rows]) == pytest.approx(800, rel=0.05)
    assert res.to_dict()["day_window"] == {"start_s": 53100.0, "end_s": 54000.0,
                                           "rate_per_s": pytest.approx(40.0, rel=1e-9)}


def test_recommend_rate_curve_verify_line_runs_as_printed(run_cli, tmp_path: Path,
                                                          monkeypatch):
    exported = tmp_path / "day.json"
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--rate-curve",
                  str(EXAMPLES / "diurnal.csv"), "--input-len", "800", "--output-len", "200",
                  "--window", "1h", *QUICK, "--export", str(exported))
    assert res.exit_code == 0, res.stderr
    (dataset,) = _printed(res.stdout, "dataset")
    monkeypatch.chdir(tmp_path)
    ran = _run_printed(run_cli, dataset)
    assert ran.exit_code == 0, ran.stderr
    assert "the day plan's peak window 14:00-15:00" in ran.stderr
    assert (tmp_path / _option(dataset, "--write-dataset")).is_file()


def test_trace_day_plan_verifies_with_the_traces_lengths(run_cli, tmp_path: Path):
    """A trace lane's requests take the trace's own lengths (those its peak plan was sized
    with); a trace no longer where the plan read it is one line naming it."""
    trace = shutil.copy(TRACE, tmp_path / "day.csv")
    exported = tmp_path / "day.json"
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--trace", str(trace),
                  "--window", "60", *QUICK, "--export", str(exported))
    assert res.exit_code == 0, res.stderr
    out = tmp_path / "w.mooncake.jsonl"
    ran = run_cli("verify", str(exported), "--client", "aiperf", "--write-dataset", str(out))
    assert ran.exit_code == 0, ran.stderr
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    lengths = np.loadtxt(TRACE, delimiter=",", skiprows=1, usecols=(1, 2), dtype=int)
    assert {r["input_length"] for r in rows} <= set(lengths[:, 0].tolist())
    assert {r["output_length"] for r in rows} <= set(lengths[:, 1].tolist())
    Path(trace).unlink()
    gone = run_cli("verify", str(exported), "--write-dataset", str(out))
    assert_one_line_error(gone, f"{trace}: no such trace file (lane default of the day plan")


def test_day_plan_yaml_verifies_at_its_peak(run_cli, tmp_path: Path):
    out = tmp_path / "w.jsonl"
    res = run_cli("verify", str(EXAMPLES / "chat-day.yaml"), "--client", "vllm",
                  "--write-dataset", str(out))
    assert res.exit_code == 0, res.stderr
    assert "the day plan's peak window 14:45-15:00" in res.stderr and out.is_file()


def test_day_plan_json_without_its_peak_is_one_line(run_cli, tmp_path: Path):
    d = capplan.run_plan(_chat_day(tmp_path), verify=False).to_dict()
    del d["day"]["peak"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(d))
    res = run_cli("verify", str(old), "--write-dataset", str(tmp_path / "w.jsonl"))
    assert_one_line_error(res, "no peak window (day.peak): export it again")


@pytest.fixture
def two(run_cli, tmp_path: Path):
    """examples/day/two-models.yaml exported as JSON, and what `plan` printed."""
    exported = tmp_path / "two.json"
    res = run_cli("plan", str(EXAMPLES / "two-models.yaml"), "--export", str(exported))
    assert res.exit_code == 0, res.stderr
    return exported, res.stdout


def test_each_models_printed_lines_run_as_printed(two, run_cli, tmp_path: Path, monkeypatch):
    """Each model's dataset line names it (--model) and writes its own file, the one its
    verify line reads, with as many requests as that line sends."""
    exported, stdout = two
    datasets, benches = _printed(stdout, "dataset"), _printed(stdout, "verify")
    assert [_option(a, "--model") for a in datasets] == ["llama-3.1-70b", "qwen2.5-72b"]
    monkeypatch.chdir(tmp_path)
    for dataset, bench in zip(datasets, benches, strict=True):
        assert dataset[2] == str(exported)
        ran = _run_printed(run_cli, dataset)
        assert ran.exit_code == 0, ran.stderr
        written = tmp_path / _option(dataset, "--write-dataset")
        assert written.name == _option(bench, "--dataset-path")
        assert len(written.read_text().splitlines()) == int(_option(bench, "--num-prompts"))
    assert sorted(p.name for p in tmp_path.glob("capplan-workload*")) == [
        "capplan-workload-llama-3.1-70b.jsonl", "capplan-workload-qwen2.5-72b.jsonl"]


def test_several_models_verify_needs_one_named(two, run_cli, tmp_path: Path):
    exported, _ = two
    out = str(tmp_path / "w.jsonl")
    assert_one_line_error(run_cli("verify", str(exported), "--write-dataset", out),
                          "the plan has several models (llama-3.1-70b, qwen2.5-72b): name the "
                          "one to verify with --model NAME")
    assert_one_line_error(run_cli("verify", str(exported), "--model", "llama-3.1-8b",
                                  "--write-dataset", out),
                          "--model llama-3.1-8b: not one of the plan's models")
    # the Hugging Face id names a model too; the requests are that model's, at its peak: the
    # window 02:00-03:00 is sized for the curve's 10 req/s at 03:00 (its mean is 9.625), on
    # two replicas: 5 req/s each
    res = run_cli("verify", str(exported), "--model", "Qwen/Qwen2.5-72B", "--format", "json",
                  "--write-dataset", out)
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["model"] == "Qwen/Qwen2.5-72B" and d["per_replica_rate_per_s"] == pytest.approx(
        5.0)
    assert "the day plan's peak window 02:00-03:00" in res.stderr


def test_html_measure_line_names_each_model(run_cli, tmp_path: Path):
    html = tmp_path / "two.html"
    res = run_cli("plan", str(EXAMPLES / "two-models.yaml"), "--export", str(html))
    assert res.exit_code == 0, res.stderr
    text = html.read_text()
    # each a fleet: its first replica's host and port, the two placed as one (llama's 5 x TP 4
    # on HOST0-HOST2, qwen's first replica on HOST2 GPUs 4-7, the port after llama's there)
    for model, at in (("llama-3.1-70b", "HOST0:8100"), ("qwen2.5-72b", "HOST2:8101")):
        assert f"capplan verify PLAN.json --model {model} --endpoint http://{at}" in text
        assert f"--write-dataset capplan-workload-{model}.jsonl" in text
