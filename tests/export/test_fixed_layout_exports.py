"""A plan file's fixed `disaggregated_layout` reaches every export as the terminal prints it:
its pool table, latencies, launch and verify lines (CSV rows, an XLSX sheet, Markdown and HTML
sections), read back from the files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import openpyxl
import yaml


def test_fixed_layout_in_every_export(run_cli, tmp_path: Path) -> None:
    plan = tmp_path / "pd.yaml"
    plan.write_text(yaml.safe_dump({
        "version": 1, "model": "llama-3.1-8b", "verify": {"top": 0},
        "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
        "workloads": [{"name": "chat", "rate_per_s": 4, "input_len": 2000, "output_len": 200,
                       "slo": {"ttft_p99_s": 2, "tbt_p99_s": 0.06}}],
        "disaggregated_layout": {"prefill": {"workers": 1, "tp": 1},
                                 "decode": {"workers": 2, "tp": 1}}}))
    out = {s: tmp_path / f"X.{s}" for s in ("csv", "xlsx", "md", "html", "json")}
    args = [a for p in out.values() for a in ("--export", str(p))]
    res = run_cli("plan", str(plan), *args)
    assert res.exit_code == 0, res.stderr
    d = json.loads(out["json"].read_text())["fixed_disaggregated"]
    ttft = f"{d['ttft_s']['p99'] * 1e3:.1f}"
    assert ttft in res.stdout
    prefill = d["launch"]["prefill worker 0"][0]
    with out["csv"].open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    fixed = {r["rank"]: r for r in rows if r["rank"].startswith("fixed disaggregated")}
    assert set(fixed) == {"fixed disaggregated prefill", "fixed disaggregated decode"}
    assert fixed["fixed disaggregated decode"]["replicas"] == "2"
    assert prefill in fixed["fixed disaggregated prefill"]["vLLM command"]
    wb = openpyxl.load_workbook(out["xlsx"])
    cells = [str(c) for r in wb["fixed disaggregated"].iter_rows(values_only=True)
             for c in r if c is not None]
    wb.close()
    assert "prefill" in cells and "decode" in cells and ttft in cells and prefill in cells
    assert any(c.startswith("capplan verify") and "--layout disaggregated" in c for c in cells)
    for fmt in ("md", "html"):
        text = out[fmt].read_text()
        assert "fixed disaggregated layout" in text and ttft in text, fmt
        assert "--layout disaggregated" in text and "prefill worker 0" in text, fmt
