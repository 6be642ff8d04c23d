"""A plan of several models, each recommending a pool per lane: every lane's pool of every model
runs at once, so the printed launch lines place them as one (no two on a GPU or a port of one
host), each lane's verify line sends to its own pool's first replica and names its model, and
the shared pools printed for comparison sit after every pool that runs."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

SLO = {"ttft_p99_s": 1.0, "tbt_p99_s": "60ms"}
# each lane small enough for one H100 replica (about 14 req/s per replica of either model)
LANES = [{"name": "chat", "rate_per_s": 2, "input_len": 800, "output_len": 250, "slo": SLO},
         {"name": "rag", "rate_per_s": 1, "input_len": 4000, "output_len": 200,
          "slo": {**SLO, "ttft_p99_s": 2.0}}]
MODELS = ("llama-3.1-8b", "qwen2.5-7b")


def _plan(run_cli, tmp_path: Path) -> tuple[str, Path]:
    doc = {"version": 1, "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
           "engine": {"max_num_seqs": [128], "max_num_batched_tokens": [2048]},
           "pools": "separate", "verify": {"top": 0}, "day": {"replay": "none"},
           "models": [{"model": m, "workloads": LANES} for m in MODELS]}
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "models.json"
    res = run_cli("plan", str(path), "--export", str(out), "--export",
                  str(tmp_path / "models.html"))
    assert res.exit_code == 0, res.stderr
    return res.stdout, out


def _launch(text: str, model_id: str, lane: str) -> tuple[str, str]:
    """(GPUs, port) of a lane's one vLLM replica as its line prints it."""
    m = re.search(rf"^vLLM \({lane}\): replica 0 \(localhost\): CUDA_VISIBLE_DEVICES=(\S+) "
                  rf"vllm serve {re.escape(model_id)} .* --port (\d+)$", text, re.M)
    assert m, f"no vLLM line of lane {lane} of {model_id}"
    return m[1], m[2]


def test_every_models_lane_pools_are_placed_together(run_cli, tmp_path: Path):
    text, _ = _plan(run_cli, tmp_path)
    llama, qwen = text.split("qwen2.5-7b: ", 1)  # each model's block: its plan, then its day
    # the four lane pools, one replica each, in the order the models and lanes are given:
    # GPUs 0-3 on ports 8100-8103 (before, the second model's lanes restarted at GPU 0, port
    # 8100: on the first model's lanes' GPUs and ports)
    assert _launch(llama, "meta-llama/Llama-3.1-8B-Instruct", "chat") == ("0", "8100")
    assert _launch(llama, "meta-llama/Llama-3.1-8B-Instruct", "rag") == ("1", "8101")
    assert _launch(qwen, "Qwen/Qwen2.5-7B", "chat") == ("2", "8102")
    assert _launch(qwen, "Qwen/Qwen2.5-7B", "rag") == ("3", "8103")
    # each lane's verify line sends to its own pool's replica
    urls = re.findall(r"^verify \(lane (\w+)\): vllm bench serve .*--base-url (\S+) ", text,
                      re.M)
    assert urls == [("chat", "http://localhost:8100"), ("rag", "http://localhost:8101"),
                    ("chat", "http://localhost:8102"), ("rag", "http://localhost:8103")]
    # the shared pools, for comparison, after the lanes' pools: GPUs 4 and 5
    shared = re.findall(r"^vLLM: +replica 0 \(localhost\): CUDA_VISIBLE_DEVICES=(\d) .* "
                        r"--port (\d+)$", text, re.M)
    assert shared == [("4", "8104"), ("5", "8105")]


def test_a_lanes_verify_steps_name_its_model(run_cli, tmp_path: Path):
    """The dataset line of a lane of one model of several names the model (the JSON holds
    every model: without --model verify refuses) and writes that model's lane's own file
    (both models have a lane `chat`); run as printed, it writes the file."""
    text, out = _plan(run_cli, tmp_path)
    steps = re.findall(r"^dataset \(lane \w+\): (.*)$", text, re.M)
    assert steps == [
        f"capplan verify {out} --model {m} --lane {ln} --client vllm --write-dataset "
        f"capplan-workload-{m}-lane-{ln}.jsonl"
        for m in MODELS for ln in ("chat", "rag")]
    # the HTML report's measure line of each lane names its model too
    page = (tmp_path / "models.html").read_text()
    for k, (m, ln) in enumerate((m, ln) for m in MODELS for ln in ("chat", "rag")):
        assert (f"capplan verify {out} --model {m} --lane {ln} --endpoint "
                f"http://localhost:{8100 + k}") in page
    dataset = tmp_path / "qwen-chat.jsonl"
    res = run_cli("verify", str(out), "--model", "qwen2.5-7b", "--lane", "chat", "--client",
                  "vllm", "--write-dataset", str(dataset))
    assert res.exit_code == 0, res.stderr
    assert dataset.read_text().count("\n") > 0
