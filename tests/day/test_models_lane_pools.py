"""A plan of several models, each recommending a pool per lane: every lane's pool of every model
runs at once, so the printed launch lines place them as one (no two on a GPU or a port of one
host), each lane's verify line sends to its own pool's first replica and names its model, and
each model's shared pool printed for comparison is an alternative to its own lanes' pools,
placed on their GPUs and ports, then on hosts past every pool that runs, never on another
model's, so it never changes the lines of the pools that run.
Its schedule and totals count the pools that run: each model's lanes' pools."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
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
    # each model's shared pool, for comparison, an alternative to its own lanes' pools: on its
    # first lane's GPU and port, Llama's GPU 0 port 8100, Qwen's GPU 2 port 8102 (GPU 1 and
    # port 8101 are Llama's rag lane, which keeps running when Qwen's layout changes)
    shared = re.findall(r"^vLLM: +replica 0 \(localhost\): CUDA_VISIBLE_DEVICES=(\d) .* "
                        r"--port (\d+)$", text, re.M)
    assert shared == [("0", "8100"), ("2", "8102")]


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


# Lanes busy enough for two replicas of chat (30 req/s + 20% headroom = 36 req/s; one H100 TP 1
# replica carries 18.2 req/s of Llama, 23.6 of Qwen at this mix, as the plans print) and one of
# rag (7.2 req/s): 2 + 1 = 3 GPUs per model run, 6 in all, on one 8-GPU host; the shared pools
# for comparison take 3 (Llama) and 2 (Qwen): 11 GPUs if they were counted with those that run.
BUSY = [{**LANES[0], "rate_per_s": 30}, {**LANES[1], "rate_per_s": 6}]
LLAMA, QWEN = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B"
REPLICA = re.compile(r"replica (\d) \((\S+)\): CUDA_VISIBLE_DEVICES=(\S+) vllm serve (\S+) .* "
                     r"--port (\d+)$", re.M)
ROUTER = re.compile(r"router: vllm-router --worker-urls (.*?) --policy round_robin --host "
                    r"0\.0\.0\.0 --port (\d+) ")


def _busy(run_cli, tmp_path: Path, *args: str, models=MODELS) -> str:
    doc = {"version": 1, "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
           "engine": {"max_num_seqs": [128], "max_num_batched_tokens": [2048]},
           "pools": "separate", "verify": {"top": 0}}
    if len(models) == 1:  # one model at a steady rate: `day:` needs a lane's rate curve
        doc.update(model=models[0], workloads=BUSY)
    else:
        doc.update(day={"replay": "none"},
                   models=[{"model": m, "workloads": BUSY} for m in models])
    path = tmp_path / f"busy{len(models)}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = run_cli("plan", str(path), *args)
    assert res.exit_code == 0, res.stderr
    return res.stdout


def test_comparison_pools_past_one_host_leave_the_running_lines_on_localhost(run_cli, tmp_path):
    """The 6 GPUs that run fit one 8-GPU host: every lane's line and verify URL says
    `localhost` (before, the 5 comparison GPUs counted with them made 11, over HOST0 and
    HOST1, and every line said HOST0). Each model's shared pool for comparison is placed on its
    own lanes' GPUs and ports, router on its first lane's: an alternative to its lanes' pools."""
    text = _busy(run_cli, tmp_path)
    assert "HOST" not in text
    # (replica, host, GPUs, model, port) of each vLLM line, in the order printed: Llama's lanes
    # chat (2) and rag (1), its shared pool (3); Qwen's lanes, its shared pool (2)
    assert REPLICA.findall(text) == [
        ("0", "localhost", "0", LLAMA, "8100"), ("1", "localhost", "1", LLAMA, "8101"),
        ("0", "localhost", "2", LLAMA, "8102"),
        ("0", "localhost", "0", LLAMA, "8100"), ("1", "localhost", "1", LLAMA, "8101"),
        ("2", "localhost", "2", LLAMA, "8102"),
        ("0", "localhost", "3", QWEN, "8103"), ("1", "localhost", "4", QWEN, "8104"),
        ("0", "localhost", "5", QWEN, "8105"),
        ("0", "localhost", "3", QWEN, "8103"), ("1", "localhost", "4", QWEN, "8104")]
    # the routers (vLLM's and TensorRT-LLM's are one): the lanes' on 8000 (Llama chat) and 8002
    # (Qwen chat: the 3rd fleet that runs); each comparison's on its model's first lane's: 8000
    # (Llama) and 8002 (Qwen: the same workers, so the same line as its chat lane's router)
    assert list(dict.fromkeys(ROUTER.findall(text))) == [
        ("http://localhost:8100 http://localhost:8101", "8000"),
        ("http://localhost:8100 http://localhost:8101 http://localhost:8102", "8000"),
        ("http://localhost:8103 http://localhost:8104", "8002")]
    urls = re.findall(r"^verify \(lane (\w+)\): vllm bench serve .*--base-url (\S+) ", text,
                      re.M)
    assert urls == [("chat", "http://localhost:8100"), ("rag", "http://localhost:8102"),
                    ("chat", "http://localhost:8103"), ("rag", "http://localhost:8105")]
    assert "hosts: localhost: replica 0 (GPU 2, port 8102)" not in text  # one replica: no line


def test_a_comparison_pool_follows_one_rule_for_one_model_and_several(run_cli, tmp_path):
    """Llama's shared pool for comparison prints the same lines planned alone (a steady plan of
    one model) and planned first of two models: GPUs 0-2, ports 8100-8102, router 8000
    (before, with two models it sat after every lane's pool: GPUs 6, 7 of HOST0 and 0 of
    HOST1, router 8004)."""
    alone = _busy(run_cli, tmp_path, models=MODELS[:1])
    both = _busy(run_cli, tmp_path)

    def shared(text: str) -> str:
        return re.search(r"^vLLM: .*?(?=^SGLang:)", text, re.M | re.S)[0]

    assert shared(both.split("qwen2.5-7b: ", 1)[0]) == shared(alone)
    assert REPLICA.findall(shared(alone)) == [
        ("0", "localhost", "0", LLAMA, "8100"), ("1", "localhost", "1", LLAMA, "8101"),
        ("2", "localhost", "2", LLAMA, "8102")]
    assert ROUTER.findall(shared(alone)) == [
        ("http://localhost:8100 http://localhost:8101 http://localhost:8102", "8000")]


def test_schedule_and_totals_count_the_lanes_pools_that_run(run_cli, tmp_path):
    """CSV, Markdown, JSON, the terminal and the Kubernetes export count the lanes' pools the
    plan recommends: 3 GPUs per model (2 + 1), 6 in the pool, 6 x 24 h = 144 GPU-hours at this
    constant rate, $3.78 per GPU-hour: $544.32 a day (before: the shared pools' 3 + 2 = 5 GPUs,
    120 GPU-hours, and the lanes' Deployments left unscheduled at the peak's replicas)."""
    import csv
    import io
    import json

    parts = _busy(run_cli, tmp_path, "--format", "csv").strip().split("\n\n")
    sched, totals = (list(csv.reader(io.StringIO(p))) for p in parts[-2:])
    head = sched[0]
    by = {h: head.index(h) for h in ("GPUs llama-3.1-8b", "GPUs qwen2.5-7b",
                                      "GPUs h100-sxm pool")}
    assert {tuple(row[i] for i in by.values()) for row in sched[1:]} == {("3", "3", "6")}
    rows = dict(totals[1:])
    assert rows["peak GPUs"] == "6"
    assert float(rows["GPU-hours, autoscaled"]) == 144.0
    assert float(rows["cost per day, autoscaled ($)"]) == pytest.approx(6 * 24 * 3.78)
    assert (rows["llama-3.1-8b: peak GPUs"], rows["qwen2.5-7b: peak GPUs"]) == ("3", "3")
    md = _busy(run_cli, tmp_path, "--format", "markdown")
    assert re.search(r"^\| peak GPUs +\| +6 +\|$", md, re.M)
    plan = json.loads(_busy(run_cli, tmp_path, "--format", "json"))
    assert (plan["peak_gpus"], plan["gpu_pools"][0]["peak_gpus"]) == (6, 6)
    assert [m["peak_gpus"] for m in plan["models"]] == [3, 3]
    text = _busy(run_cli, tmp_path)
    assert ("pool h100-sxm (llama-3.1-8b, qwen2.5-7b): peak 6 GPUs shared vs 6 with each fleet "
            "at its own peak") in text
    # the Kubernetes export deploys the lanes' pools by their own schedules (2 + 1 replicas a
    # model), as the totals count them: no pool is left out of the schedule
    k8s = tmp_path / "busy.k8s.yaml"
    _busy(run_cli, tmp_path, "--export", str(k8s))
    docs = [d for d in yaml.safe_load_all(k8s.read_text()) if d and d["kind"] == "Deployment"]
    assert {d["metadata"]["name"]: d["spec"]["replicas"] for d in docs} == {
        "llama-3-1-8b-chat": 2, "llama-3-1-8b-rag": 1, "qwen2-5-7b-chat": 2, "qwen2-5-7b-rag": 1}
    assert "not scheduled" not in k8s.read_text()


# Llama's batch lane at 6 req/s at 15:00 makes its shared pool 45 x TP 2 = 90 GPUs, its lanes'
# pools 5 x TP 4 (chat) + 2 x TP 4 (batch) = 28; Qwen's lanes 1 x TP 4 each (as the plan prints).
CLASH = {
    "version": 1, "candidates": {"gpus": ["h100-sxm"], "tp": [1, 2, 4]},
    "engine": {"max_num_seqs": [128, 256], "max_num_batched_tokens": [2048, 8192]},
    "day": {"window_s": 3600, "replay": "none", "timezone": "Europe/Berlin"},
    "verify": {"top": 0}, "pools": "separate",
    "models": [
        {"model": "llama-3.1-70b", "workloads": [
            {"name": "chat", "input_len": "lognormal:mean=1000,p99=6000",
             "output_len": "lognormal:mean=250,p99=1000",
             "rate_curve": [{"at": "03:00", "rate_per_s": 0.5}, {"at": "15:00", "rate_per_s": 4}],
             "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": "50ms"}},
            {"name": "batch", "input_len": 2000, "output_len": 300,
             "rate_curve": [{"at": "03:00", "rate_per_s": 1}, {"at": "15:00", "rate_per_s": 6}],
             "slo": {"e2e_p99_s": 60}}]},
        {"model": "qwen2.5-72b", "workloads": [
            {"name": "chat", "input_len": 1000, "output_len": 200,
             "rate_curve": [{"at": "03:00", "rate_per_s": 1}, {"at": "15:00", "rate_per_s": 3}],
             "slo": {"ttft_p99_s": 2.0}},
            {"name": "summarise", "input_len": 2000, "output_len": 300,
             "rate_curve": [{"at": "03:00", "rate_per_s": 5}, {"at": "15:00", "rate_per_s": 1}],
             "slo": {"e2e_p99_s": 60}}]}]}
HOSTED = re.compile(r"replica \d+ \((\S+)\): CUDA_VISIBLE_DEVICES=(\S+) vllm serve .* "
                    r"--port (\d+)$")


def _vllm_blocks(text: str) -> list[tuple[str, list[tuple[str, int, str]]]]:
    """Each vLLM launch block in order: its heading (`vLLM (lane):` or `vLLM:`) and the
    (host, GPU, port) of every GPU its replicas take."""
    out: list[tuple[str, list[tuple[str, int, str]]]] = []
    block = None
    for line in text.splitlines():
        if line.startswith("vLLM"):
            block = (line.split(":", 1)[0], [])
            out.append(block)
        elif not line.startswith(" "):
            block = None
        if block is not None and (m := HOSTED.search(line)):
            block[1].extend((m[1], int(g), m[3]) for g in m[2].split(","))
    return out


def test_a_models_comparison_never_lands_on_another_models_running_pools(run_cli, tmp_path):
    """Llama's shared pool (90 GPUs) outgrows its lanes' pools (28): it fills its own lanes'
    GPUs, then goes on past every pool that runs, never onto Qwen's pools, which keep running
    while Llama's layout changes (before, its replicas 14-17 sat on Qwen's HOST3 GPUs 4-7 and
    HOST4 GPUs 0-3, port 8100, and Qwen's comparison on HOST11/HOST12, none of its lanes'
    hosts)."""
    path = tmp_path / "clash.yaml"
    path.write_text(yaml.safe_dump(CLASH, sort_keys=False))
    res = run_cli("plan", str(path))
    assert res.exit_code == 0, res.stderr
    llama, qwen = res.stdout.split("qwen2.5-72b: ", 1)
    (l_chat, l_batch, l_cmp), (q_chat, q_sum, q_cmp) = _vllm_blocks(llama), _vllm_blocks(qwen)
    assert [b[0] for b in (l_chat, l_batch, l_cmp, q_chat, q_sum, q_cmp)] == [
        "vLLM (chat)", "vLLM (batch)", "vLLM", "vLLM (chat)", "vLLM (summarise)", "vLLM"]
    l_run = {(h, g) for b in (l_chat, l_batch) for h, g, _ in b[1]}
    q_run = {(h, g) for b in (q_chat, q_sum) for h, g, _ in b[1]}
    assert (len(l_run), len(q_run), len(l_cmp[1]), len(q_cmp[1])) == (28, 8, 90, 8)
    # Llama: 7 x TP 4 on HOST0-HOST2 and HOST3 GPUs 0-3; Qwen: HOST3 GPUs 4-7, HOST4 GPUs 0-3
    assert q_run == {("HOST3", g) for g in range(4, 8)} | {("HOST4", g) for g in range(4)}
    # no comparison GPU is another model's running GPU, nor its port on that host
    assert not {(h, g) for h, g, _ in l_cmp[1]} & q_run
    assert not {(h, g) for h, g, _ in q_cmp[1]} & l_run
    q_ports = {(h, p) for b in (q_chat, q_sum) for h, _, p in b[1]}
    l_ports = {(h, p) for b in (l_chat, l_batch) for h, _, p in b[1]}
    assert not {(h, p) for h, _, p in l_cmp[1]} & q_ports
    assert not {(h, p) for h, _, p in q_cmp[1]} & l_ports
    # Llama's 45 x TP 2 start on its own 28 GPUs (14 replicas), the other 31 replicas on hosts
    # past every running pool: HOST5 up, none on Qwen's HOST4
    assert {(h, g) for h, g, _ in l_cmp[1][:28]} == l_run
    assert {h for h, _, _ in l_cmp[1][28:]} == {f"HOST{k}" for k in range(5, 13)}
    # Qwen's 2 x TP 4 comparison sits exactly on its own lanes' GPUs and ports
    assert {(h, g, p) for h, g, p in q_cmp[1]} == {x for b in (q_chat, q_sum) for x in b[1]}


def test_the_fleets_at_their_own_peaks_are_named_as_counted(run_cli, tmp_path):
    """Llama's batch lane peaks at 03:00 (8 req/s), its chat lane at 15:00: each lane's pool
    at its own peak is 5 x TP 4 = 20 (chat) and 2 x TP 4 = 8 (batch), Qwen's 4 + 4, so the
    fleets at their own peaks take 20 + 8 + 4 + 4 = 36 GPUs, while the models at theirs take
    24 + 8 = 32 (Llama's lanes never both peak). The 36 is labelled as what it counts, each
    fleet at its own peak (before: "one fleet per model", whose sum is 32)."""
    import copy
    import csv
    import io

    doc = copy.deepcopy(CLASH)
    doc["models"][0]["workloads"][1]["rate_curve"] = [{"at": "03:00", "rate_per_s": 8},
                                                      {"at": "15:00", "rate_per_s": 0.5}]
    path = tmp_path / "offpeak.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = run_cli("plan", str(path), "--format", "csv")
    assert res.exit_code == 0, res.stderr
    rows = dict(r for r in csv.reader(io.StringIO(res.stdout)) if len(r) == 2)
    assert rows["peak GPUs, each fleet at its own peak"] == str(20 + 8 + 4 + 4)
    assert (rows["llama-3.1-70b: peak GPUs"], rows["qwen2.5-72b: peak GPUs"]) == ("24", "8")
    text = run_cli("plan", str(path)).stdout
    assert "peak 32 GPUs shared vs 36 with each fleet at its own peak (saves 4 GPUs)" in text
    assert "the launch lines above start each fleet at its own peak (36 GPUs together)" in text


def test_a_markdown_launch_heading_names_model_and_lane_in_one_parenthesis(run_cli, tmp_path):
    """Each lane's launch block of a plan of several models is headed "vLLM (MODEL, lane
    NAME):" (before: "vLLM (lane chat) (llama-3.1-8b):")."""
    md = _busy(run_cli, tmp_path, "--format", "markdown")
    heads = re.findall(r"^vLLM \(.*\):$", md, re.M)
    assert heads == [f"vLLM ({m}, lane {ln}):" for m in MODELS for ln in ("chat", "rag")]
