"""Findings of the plan-file and export audit: what `plan --format csv|markdown` says, the
CSV's pool note, and small wording."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import yaml

LANES = [{"name": "chat", "rate_per_s": 8, "input_len": 800, "output_len": 200,
          "slo": {"ttft_p99_s": 0.5}},
         {"name": "batch", "rate_per_s": 2, "input_len": 4000, "output_len": 500,
          "slo": {"e2e_p99_s": 120}}]


def _plan(tmp_path: Path, **doc) -> Path:
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump({
        "version": 1, "model": "llama-3.1-8b", "verify": {"top": 0},
        "candidates": {"gpus": ["h100-sxm"], "tp": [1]}, "workloads": LANES, **doc}))
    return p


def test_csv_and_markdown_say_what_is_recommended_and_give_the_pools(run_cli, tmp_path):
    plan = _plan(tmp_path, pools="separate")
    res = run_cli("plan", str(plan), "--format", "csv")
    assert res.exit_code == 0, res.stderr
    sections = [list(csv.reader(io.StringIO(s))) for s in res.stdout.strip().split("\n\n")]
    assert sections[0][0] == ["recommended"]
    assert sections[0][1][0].startswith("a pool per lane, as the plan asks: lane chat:")
    assert sections[1][0][-1] == "recommended" and sections[1][1][-1] == "no"
    pools = {r[0]: r for r in sections[2][1:]}
    assert pools["lane chat"][-1] == "yes" and pools["shared (all lanes)"][-1] == "no"
    res = run_cli("plan", str(plan), "--format", "markdown")
    assert res.stdout.startswith("Recommended: a pool per lane, as the plan asks")
    assert "## pools" in res.stdout and "| lane batch" in res.stdout
    one = _plan(tmp_path)  # one layout: the headline the exports give
    res = run_cli("plan", str(one), "--format", "json")
    assert res.exit_code == 0, res.stderr
    from capplan.export.layout import headline, sentence

    said = sentence(headline(json.loads(res.stdout)))
    assert said.startswith("Recommended: ") and " x h100-sxm TP 1" in said
    res = run_cli("plan", str(one), "--format", "markdown")
    assert res.stdout.startswith(said)


def test_csv_pool_total_note_is_in_a_note_column(run_cli, tmp_path):
    out = tmp_path / "p.csv"
    res = run_cli("plan", str(_plan(tmp_path, pools="separate")), "--export", str(out))
    assert res.exit_code == 0, res.stderr
    with out.open(encoding="utf-8", newline="") as f:
        rows = {r["rank"]: r for r in csv.DictReader(f)}
    total = rows["pool: a pool per lane, total"]
    assert total["binding constraint"] == ""
    assert total["note"].startswith("cheaper: ")


def _case(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "case.yaml"
    p.write_text(text)
    return p


BASE = """version: 1
model: llama-3.1-8b
candidates:
  gpus: [h100-sxm]
  tp: [1]
engine:
  max_num_seqs: [64]
workloads:
  - {name: chat, rate_per_s: 4, input_len: 500, output_len: 100, slo: {ttft_p99_s: 1}}
verify: {top: 0}
"""


def test_empty_candidate_lists_are_refused_at_their_line(run_cli, tmp_path):
    for old, new, line, key in (
            ("max_num_seqs: [64]", "max_num_seqs: []", 7, "engine.max_num_seqs"),
            ("gpus: [h100-sxm]", "gpus: []", 4, "candidates.gpus"),
            ("tp: [1]", "tp: []", 5, "candidates.tp"),
            ("tp: [1]", "tp: [1]\n  weight_dtypes: []", 6, "candidates.weight_dtypes")):
        p = _case(tmp_path, BASE.replace(old, new))
        res = run_cli("plan", str(p))
        assert res.exit_code == 2, key
        assert res.stderr.strip() == (
            f"Error: {p}:{line}: {key}: an empty list: give at least one value, or leave the "
            "key out for its default")


def test_plan_file_errors_name_the_key_and_line(run_cli, tmp_path):
    p = _case(tmp_path, BASE.replace("max_num_seqs: [64]", "max_num_seqs: [64]\n"
                                     "  speculative: medusa"))
    res = run_cli("plan", str(p))
    assert res.exit_code == 2
    assert res.stderr.strip().startswith(f"Error: {p}:8: engine.speculative 'medusa': ")
    assert "--speculative" not in res.stderr
    p = _case(tmp_path, BASE.replace("[h100-sxm]", "[h1000]"))
    res = run_cli("plan", str(p))
    assert res.stderr.strip().startswith(f"Error: {p}:4: unknown GPU 'h1000'")
    p = _case(tmp_path, BASE + "export: [x.pdf]\n")
    res = run_cli("plan", str(p))
    assert res.exit_code == 2
    assert res.stderr.strip().startswith(f"Error: {p}:11: export 'x.pdf': use a .csv")
    assert "--export" not in res.stderr and str(tmp_path) not in res.stderr.replace(str(p), "")
    p = _case(tmp_path, BASE + "export:\n  - nosub/x.json\n")
    res = run_cli("plan", str(p))
    assert res.exit_code == 2
    assert res.stderr.strip() == (f"Error: {p}:11: export 'nosub/x.json': folder nosub does "
                                  "not exist")


def test_command_line_errors_name_the_flags(run_cli):
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--rate", "4", "--speculative",
                  "eagle3", "--acceptance-length", "2.5", "--verify-top", "0")
    assert res.exit_code == 2
    assert res.stderr.strip() == ("Error: --acceptance-length holds for one draft length: "
                                  "give one --spec-tokens value with it")


def _line(text: str, key: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith(key))


def test_one_error_named_by_each_side(run_cli, tmp_path):
    """The same check through a plan file (its key, at its line) and through recommend (the
    flag): the key/flag table (plan/names.py) read by real errors, both ways."""
    text = BASE.replace("  max_num_seqs: [64]\n", "  max_num_seqs: [64]\n  speculative: ngram\n")
    p = _case(tmp_path, text)
    res = run_cli("plan", str(p))
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.startswith(f"Error: {p}:{_line(text, 'speculative:')}: engine.speculative ngram: ")
    assert "engine.acceptance_length" in err and "--" not in err.replace(str(p), "")
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1",
                  "--rate", "4", "--speculative", "ngram", "--verify-top", "0")
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.startswith("Error: --speculative ngram: ") and "--acceptance-length" in err
    assert "engine." not in err


def test_a_lane_error_is_named_by_each_side(run_cli, tmp_path):
    text = BASE.replace("input_len: 500", "input_len: 'lognormal:mean=800'")
    p = _case(tmp_path, text)
    res = run_cli("plan", str(p))
    assert res.exit_code == 2
    assert res.stderr.strip().startswith(f"Error: {p}:{_line(text, '- {name: chat')}: "
                                         "workloads.0.input_len: ")
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1",
                  "--verify-top", "0", "--output-len", "100", "--rate", "2",
                  "--input-len", "lognormal:mean=800")
    assert res.exit_code == 2
    assert res.stderr.strip().startswith("Error: --input-len: length 'lognormal:mean=800'")
    assert "workloads" not in res.stderr


def test_image_lane_error_is_named_by_each_side(run_cli, tmp_path):
    text = ("version: 1\nmodel: qwen2.5-vl-7b\ncandidates: {gpus: [h100-sxm], tp: [1]}\n"
            "verify: {top: 0}\nworkloads:\n  - name: chat\n    rate_per_s: 2\n"
            "    input_len: 'lognormal:mean=800,p99=4000'\n    output_len: 100\n"
            "    images_per_request: 1\n")
    p = _case(tmp_path, text)
    res = run_cli("plan", str(p))
    assert res.exit_code == 2
    assert res.stderr.strip().startswith(f"Error: {p}:{_line(text, 'input_len:')}: lane 'chat': "
                                         "workloads.input_len 'lognormal")
    assert "--" not in res.stderr.replace(str(p), "")
    res = run_cli("recommend", "--model", "qwen2.5-vl-7b", "--gpu", "h100-sxm", "--tp", "1",
                  "--verify-top", "0", "--rate", "2", "--images-per-request", "1",
                  "--input-len", "lognormal:mean=800,p99=4000")
    assert res.exit_code == 2
    assert "--input-len 'lognormal:mean=800,p99=4000' with --images-per-request" in res.stderr
    assert "workloads" not in res.stderr


def test_a_fixed_layout_error_names_its_key_and_line(run_cli, tmp_path):
    text = ("version: 1\nmodel: llama-3.1-70b\ncandidates: {gpus: [h100-sxm], tp: [4]}\n"
            "verify: {top: 0}\nworkloads:\n  - {name: chat, rate_per_s: 4, input_len: 3000, "
            "output_len: 300}\ndisaggregated_layout:\n  prefill: {workers: 2, tp: 4}\n"
            "  decode: {workers: 2, tp: 4}\n  kv_link: nvlink\n")
    p = _case(tmp_path, text)
    res = run_cli("plan", str(p))
    assert res.exit_code == 2
    assert res.stderr.strip().startswith(
        f"Error: {p}:{_line(text, 'kv_link:')}: disaggregated_layout.kv_link nvlink: the two "
        "pools (16 GPUs)")


def test_command_line_advice_keeps_its_flag():
    from capplan.plan.names import as_keys

    assert as_keys("--tp-size 3") == "--tp-size 3"  # a longer flag is not --tp
    assert as_keys("x: give a relative path (or pass --export on the command line)") == (
        "x: give a relative path (or pass --export on the command line)")


def test_a_path_under_a_file_says_it_is_a_file(run_cli, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    res = run_cli("plan", str(_plan(tmp_path)), "--export", str(f / "x.json"))
    assert res.exit_code == 2
    assert res.stderr.strip() == f"Error: {f / 'x.json'}: {f} is a file, not a folder"


def test_a_miss_shows_the_digits_that_make_it():
    from capplan.plan.slo import SloSet

    s = SloSet(tbt_p99_s=0.08)
    assert s.misses({"tbt_s": {"p99": 0.0800412}}) == ["p99 TBT 80.04 ms > 80.0 ms"]
    assert s.misses({"tbt_s": {"p99": 0.0812}}) == ["p99 TBT 81.2 ms > 80.0 ms"]


def test_one_gpu_and_a_layout_counting_its_gpus():
    from capplan.export.layout import fleet_text

    wide = {"replicas": 1, "gpu": "h100-sxm", "tp": 1, "attention_dp": 16,
            "expert_parallel": 16, "gpus_total": 16, "cost_per_hour": None,
            "layout": "16 GPUs over 2 nodes: attention TP 1 x DP 16, EP 16"}
    assert fleet_text(wide) == "1 x h100-sxm (16 GPUs over 2 nodes: attention TP 1 x DP 16, EP 16)"
    assert fleet_text({**wide, "replicas": 2, "gpus_total": 32}).endswith(") (32 GPUs)")
    one = {"replicas": 1, "gpu": "h100-sxm", "tp": 1, "gpus_total": 1, "cost_per_hour": 3.78}
    assert fleet_text(one) == "1 x h100-sxm TP 1 (1 GPU, $3.78/h)"


def test_empty_lane_name_and_a_day_block_without_a_day_are_refused(run_cli, tmp_path):
    p = _case(tmp_path, BASE.replace("name: chat", 'name: ""'))
    res = run_cli("plan", str(p))
    assert res.exit_code == 2
    assert res.stderr.strip() == (f"Error: {p}:9: workloads.0.name: the lane's name is empty: "
                                  "name it (pools, exports and Kubernetes objects are named "
                                  "after their lane)")
    p = _case(tmp_path, BASE + "day: {window_s: 600}\n")
    res = run_cli("plan", str(p))
    assert res.exit_code == 2
    assert res.stderr.strip() == (f"Error: {p}:11: day: applies to a day plan, and no lane has "
                                  "a rate_curve or trace: drop day:, or give a lane one")


def test_an_alternative_of_one_gpu_says_gpu():
    from types import SimpleNamespace as NS

    from capplan.plan.alternatives import _fleet_versus

    def fleet(n: int, cost: float) -> NS:
        return NS(replicas=n, gpus_total=n, cost_per_hour=cost,
                  candidate=NS(gpu=NS(key="h100-sxm"), settings=NS(tp=1)))

    said = str(_fleet_versus(fleet(1, 3.78), fleet(2, 7.56)))
    assert "= 1 GPU ($3.78/h)" in said and "1 GPUs" not in said


DISAGG = ["recommend", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4,8", "--rate",
          "10", "--input-len", "8000", "--output-len", "500", "--ttft-p99", "3", "--tbt-p99",
          "0.025", "--verify-top", "0", "--disagg"]


def test_csv_and_markdown_give_the_recommended_disaggregated_layout(run_cli, tmp_path):
    """With the disaggregated layout recommended, stdout's CSV and Markdown give its pools
    (as the .csv export's rows), not only the headline and the aggregated ranks."""
    out = tmp_path / "x.csv"
    res = run_cli(*DISAGG, "--format", "csv", "--export", str(out))
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("recommended\n\"the disaggregated prefill/decode layout")
    with out.open(encoding="utf-8", newline="") as f:
        exported = {r["rank"]: r for r in csv.DictReader(f) if r["rank"].startswith("disagg")}
    assert set(exported) == {"disaggregated prefill", "disaggregated decode"}
    sections = [list(csv.DictReader(io.StringIO(s))) for s in res.stdout.strip().split("\n\n")]
    said = {r["rank"]: r for s in sections for r in s if r.get("rank", "").startswith("disagg")}
    assert set(said) == set(exported)
    for rank, row in exported.items():
        for key in ("replicas", "GPU", "TP", "recommended", "cost ($/h)"):
            assert said[rank][key] == row[key], (rank, key)
        assert said[rank]["recommended"] == "yes"
    res = run_cli(*DISAGG, "--format", "markdown")
    assert res.exit_code == 0, res.stderr
    assert "## disaggregated" in res.stdout
    table = res.stdout.split("## disaggregated", 1)[1]
    for rank, row in exported.items():
        line = next(ln for ln in table.splitlines() if ln.startswith(f"| {rank}"))
        assert f" {row['replicas']} " in line and " yes " in line
