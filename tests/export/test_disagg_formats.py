"""The disaggregated layout in every export format, not only the terminal and JSON: CSV rows,
a Markdown section and an XLSX sheet repeat the JSON's pools."""

from __future__ import annotations

import csv

import pytest


def test_disaggregated_pools_in_csv_markdown_xlsx(run_cli, tmp_path) -> None:
    openpyxl = pytest.importorskip("openpyxl")
    out = {s: tmp_path / f"plan.{s}" for s in ("csv", "md", "xlsx")}
    res = run_cli("recommend", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--rate", "10",
                  "--input-len", "8000", "--output-len", "300", "--ttft-p99", "2",
                  "--tbt-p99", "0.05", "--verify-top", "0", "--format", "json",
                  *[a for p in out.values() for a in ("--export", str(p))])
    assert res.exit_code == 0, res.stderr
    d = res.json()["disaggregated"]
    assert d.get("prefill"), "this traffic has a disaggregated layout"
    with out["csv"].open() as f:
        rows = {r["rank"]: r for r in csv.DictReader(f)}
    md = out["md"].read_text()
    assert "## Disaggregated prefill/decode" in md and d["verdict"] in md
    wb = openpyxl.load_workbook(out["xlsx"])
    sheet = [[c.value for c in r] for r in wb["disaggregated"].iter_rows()]
    wb.close()
    head = sheet[0]
    by_rank = {r[head.index("rank")]: dict(zip(head, r, strict=True)) for r in sheet[1:]}
    for role in ("prefill", "decode"):
        p = d[role]
        for table in (rows, by_rank):
            r = table[f"disaggregated {role}"]
            assert (str(r["GPU"]), int(r["TP"]), int(r["replicas"]), int(r["GPUs"])) == (
                p["gpu"], p["tp"], p["replicas"], p["gpus_total"])
            assert (int(r["attention DP"]), int(r["EP"])) == (p["attention_dp"],
                                                             p["expert_parallel"])
            assert int(r["max seqs"]) == p["max_num_seqs"]
        assert d["launch"][f"vllm_{role}"] in md
    assert d["bench"] in md  # the layout's own verify line
