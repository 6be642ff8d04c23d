"""What a day plan deploying a pool per lane prints for a user to copy: each lane's own day plan
(`lane_days`) verifies that lane's pool (`--lane NAME`, `--model NAME` in a plan of several
models, the lane's own dataset file), every verify line runs as printed, the terminal prints
each lane's day for every model as for one, and the shared pool printed for comparison is
titled as an alternative to the lanes' pools (its lines reuse their GPUs and ports)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.probe.test_endpoint import _url, server  # noqa: F401

SLO = {"ttft_p99_s": 1.0, "tbt_p99_s": "60ms"}
# chat peaks at 15 req/s at 15:00, rag at 4 req/s at 03:00; either fits one H100 replica of
# either model all day (about 25 and 8 req/s per replica: 15 x 1.2 and 4 x 1.2 below them)
LANES = [{"name": "chat", "input_len": 800, "output_len": 250, "slo": SLO,
          "rate_curve": [{"at": "03:00", "rate_per_s": 2}, {"at": "15:00", "rate_per_s": 15}]},
         {"name": "rag", "input_len": 4000, "output_len": 200, "slo": {**SLO, "ttft_p99_s": 2.0},
          "rate_curve": [{"at": "03:00", "rate_per_s": 4}, {"at": "15:00", "rate_per_s": 1}]}]
MODELS = ("llama-3.1-8b", "qwen2.5-7b")
COMMON = {"version": 1, "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
          "engine": {"max_num_seqs": [128], "max_num_batched_tokens": [2048]},
          "pools": "separate", "headroom": 0.2, "verify": {"top": 0},
          "day": {"window_s": 21600, "replay": "none"}}
HEADER = ("for comparison, instead of the lanes' pools: one shared pool (rank 1), whose lines "
          "reuse the lanes' pools' GPUs and ports, then hosts no running pool uses (run one layout "
          "or the other, never both):")


def _write(tmp_path: Path, name: str, several: bool) -> Path:
    doc = ({**COMMON, "models": [{"model": m, "workloads": LANES} for m in MODELS]}
           if several else {**COMMON, "model": MODELS[0], "workloads": LANES})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _run(run_cli, tmp_path: Path, name: str, several: bool) -> tuple[str, dict[str, Any]]:
    """(the terminal's output, the JSON export) of the plan, exported as NAME.json/.md/.html."""
    path = _write(tmp_path, name, several)
    res = run_cli("plan", str(path), *(x for ext in ("json", "md", "html")
                                       for x in ("--export", str(tmp_path / f"{name}.{ext}"))))
    assert res.exit_code == 0, res.stderr
    return res.stdout, json.loads((tmp_path / f"{name}.json").read_text())


@pytest.fixture
def one(run_cli, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    return _run(run_cli, tmp_path, "one", several=False)


@pytest.fixture
def two(run_cli, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    return _run(run_cli, tmp_path, "two", several=True)


def _lane_day_flags(plan: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each lane's own day plan's rank-1 engine flags, by lane."""
    return {d["lane"]: d["recommendations"][0]["engine_flags"] for d in plan["lane_days"]}


def _expect(flags: dict[str, str], call: str, data: str, port: int) -> None:
    """The lane's steps as written out: its dataset line calls `call` and writes `data`, its
    verify line reads `data` and sends to its pool's replica at `port`, its goodput note's
    check calls `call` at that replica."""
    assert flags["bench_dataset"] == f"{call} --client vllm --write-dataset {data}"
    words = shlex.split(flags["bench"])
    assert words[words.index("--dataset-path") + 1] == data
    assert words[words.index("--base-url") + 1] == f"http://localhost:{port}"
    assert f"`{call} --endpoint http://localhost:{port}`" in flags["bench_goodput"]


def test_a_lanes_own_day_verifies_that_lane(one):
    """A plan of one model: each lane's day plan's dataset line names its lane and writes its
    own file (before: `capplan verify PLAN.json --client vllm --write-dataset
    capplan-workload.jsonl`, the whole mixed load into the shared file)."""
    _, plan = one
    days = _lane_day_flags(plan)
    _expect(days["chat"], "capplan verify PLAN.json --lane chat",
            "capplan-workload-lane-chat.jsonl", 8100)
    _expect(days["rag"], "capplan verify PLAN.json --lane rag",
            "capplan-workload-lane-rag.jsonl", 8101)


def test_each_models_lane_days_name_the_model_and_the_lane(two):
    """A plan of several models: each model's lanes' days name the model and the lane and
    write the model's lane's own file (both models have a lane `chat`); the four lanes' pools
    on GPUs 0-3, ports 8100-8103."""
    _, plan = two
    port = iter(range(8100, 8104))
    for m in plan["models"]:
        days = _lane_day_flags(m)
        for lane in ("chat", "rag"):
            _expect(days[lane], f"capplan verify PLAN.json --model {m['model']} --lane {lane}",
                    f"capplan-workload-{m['model']}-lane-{lane}.jsonl", next(port))


def _verify_calls(plan: Any) -> list[str]:
    """Every `capplan verify PLAN.json ...` the plan's JSON prints: dataset lines, and the
    calls its goodput notes name."""
    found: list[str] = []
    if isinstance(plan, dict):
        for v in plan.values():
            found += _verify_calls(v)
    elif isinstance(plan, list):
        for v in plan:
            found += _verify_calls(v)
    elif isinstance(plan, str):
        if plan.startswith("capplan verify "):
            found.append(plan)
        found += re.findall(r"`(capplan verify [^`]*)`", plan)
    return found


@pytest.mark.parametrize("name", ["one", "two"])
def test_every_printed_verify_line_runs_as_printed(name, server, run_cli,  # noqa: F811
                                                   tmp_path: Path, monkeypatch):
    """Each verify call the JSON prints, on the JSON it exported, writes its dataset file or
    measures the test's OpenAI-compatible server (standing in for the replica the call names):
    none exits 2 on its flags (before, a lane's day plan of several models left out --model,
    which verify requires of such a JSON)."""
    _, plan = _run(run_cli, tmp_path, name, several=name == "two")
    monkeypatch.chdir(tmp_path)  # the dataset files are written where the user runs the line
    calls = sorted(set(_verify_calls(plan)))
    for call in calls:
        words = shlex.split(call.replace("PLAN.json", str(tmp_path / f"{name}.json")))[1:]
        if "--endpoint" in words:
            words[words.index("--endpoint") + 1] = _url(server)
            words += ["--requests", "2"]
        res = run_cli(*words)
        assert res.exit_code == 0, (call, res.stderr)
        if "--write-dataset" in words:
            assert (tmp_path / words[words.index("--write-dataset") + 1]).stat().st_size > 0
    # (dataset, goodput check) of the shared pool and of each of 2 lanes, of each model
    assert len(calls) == {"one": 6, "two": 12}[name], calls


def _block(text: str, head: str) -> list[str]:
    """The lines of the block starting at `head`, up to the next lane's day, model's plan
    ("qwen2.5-7b: 16 req/s, ...") or blank line."""
    lines = text.splitlines()
    start = lines.index(head)
    stops = ("lane ", *(f"{m}: " for m in MODELS))
    end = next((i for i in range(start + 1, len(lines))
                if not lines[i] or lines[i].startswith(stops)), len(lines))
    return lines[start:end]


PEAK = "(at its peak 1 x h100-sxm TP 1 (1 GPU, $3.78/h)):"
# one replica of 1 GPU all day: 24 GPU-hours autoscaled and fixed, x $3.78 = $90.72
DAY = ("peak 1 replica; autoscaled 24.0 GPU-hours ($90.72/day) vs a fixed fleet for the peak "
       "24.0 GPU-hours ($90.72/day): autoscaling saves 0%")


def test_every_models_lane_days_are_printed(one, two):
    """Several models: under each model's day, each of its lanes' days, as one model prints
    them, the header naming the model (two models may share lane names)."""
    text1, _ = one
    text2, _ = two
    for lane in ("chat", "rag"):
        assert f"lane {lane} over the day, on its own pool {PEAK}" in text1.splitlines()
        mine = _block(text1, f"lane {lane} over the day, on its own pool {PEAK}")
        assert mine[1] == DAY
        for m in MODELS:
            head = f"lane {lane} of {m} over the day, on its own pool {PEAK}"
            block = _block(text2, head)
            assert block[1] == DAY
            assert len(block) == len(mine)
        # Llama's lane, planned alike in both plans, prints the same lines
        block = _block(text2, f"lane {lane} of llama-3.1-8b over the day, on its own pool {PEAK}")
        assert block[1:] == mine[1:]
    # in order: each model's day, then its lanes' days, then the next model, then the pool's
    order = [text2.index(s) for s in (
        "llama-3.1-8b over the day:", "lane chat of llama-3.1-8b", "lane rag of llama-3.1-8b",
        "qwen2.5-7b: ", "qwen2.5-7b over the day:", "lane chat of qwen2.5-7b",
        "lane rag of qwen2.5-7b", "day plan (replicas per window)")]
    assert order == sorted(order)


def _unwrapped(text: str) -> list[str]:
    """The terminal's lines, a prose line's wrapped continuations ("    ...") joined to it."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("    ") and out and not out[-1].startswith(("vLLM", "SGLang")):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def test_the_comparison_pool_is_titled_an_alternative(one, two, tmp_path: Path):
    """The shared pool's launch lines, on the lanes' pools' GPUs and ports, are headed as an
    alternative to them in the terminal (once a model), the Markdown and the HTML reports."""
    # the shared pools' first lines: one model's one replica on port 8000; of two models, each
    # on its own first lane's GPU and port: Llama's lanes run on GPUs 0 and 1 (8100, 8101),
    # Qwen's on GPUs 2 and 3 (8102, 8103), so Llama's comparison on GPU 0, port 8100, and
    # Qwen's on GPU 2, port 8102
    llama, qwen = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B"
    for (text, _), first in ((one, [rf"vllm serve {llama} .* --port 8000"]),
                             (two, [rf"replica 0 \(localhost\): CUDA_VISIBLE_DEVICES=0 vllm "
                                    rf"serve {llama} .* --port 8100",
                                    rf"replica 0 \(localhost\): CUDA_VISIBLE_DEVICES=2 vllm "
                                    rf"serve {qwen} .* --port 8102"])):
        lines = _unwrapped(text)
        at = [i for i, line in enumerate(lines) if line == HEADER]
        assert len(at) == len(first)
        for i, pattern in zip(at, first, strict=True):
            assert re.fullmatch(rf"vLLM: +{pattern}", lines[i + 1]), lines[i + 1]
    title = "F" + HEADER[1:-1]  # as a sentence
    for name, heading, n in (("one", "## Engine commands (rank 1: h100-sxm)", 1),
                             ("two", "### Engine commands (rank 1: h100-sxm)", 2)):
        md = (tmp_path / f"{name}.md").read_text()
        assert md.count(f"{heading}\n\n{title}.\n\n") == n
        page = (tmp_path / f"{name}.html").read_text()
        assert page.count(f"<p>{title.replace(chr(39), '&#x27;')}; the recommended pool per "
                          "lane's launch and verify lines are in the pools' section "
                          "above.</p>") == n


def test_a_shared_plan_has_no_comparison_title(run_cli, tmp_path: Path):
    """A plan comparing both layouts (`pools: both`) where its one shared pool wins launches
    the shared pool: no alternative title. At the lanes' peaks (chat 15 req/s, rag 4) one
    H100 replica of the shared pool carries both ($3.78/h), a pool per lane takes one each
    ($7.56/h)."""
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump({**COMMON, "pools": "both", "model": MODELS[0],
                                    "workloads": LANES}, sort_keys=False))
    res = run_cli("plan", str(path))
    assert res.exit_code == 0, res.stderr
    assert "a pool per lane $7.56/h: shared is cheaper" in res.stdout  # the comparison ran
    assert "instead of the lanes' pools" not in res.stdout
