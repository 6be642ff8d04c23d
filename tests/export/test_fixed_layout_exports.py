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
    router = d["launch"]["router"][0]
    hosts = d["launch"]["hosts"][0]
    # the terminal's figures, each in every export: utilization, E2E p99, KV transfer, dtypes
    util = [f"{100 * d['pools'][r]['utilization']:.0f}%" for r in ("prefill", "decode")]
    e2e = f"{d['e2e_s']['p99'] * 1e3:.1f}"
    kv = f"{d['kv_transfer_s']['p99'] * 1e3:.1f}"
    for fig in (*util, e2e, kv, router, hosts.split(";")[0]):
        assert fig in res.stdout, fig
    dtypes = f"weights {d['pools']['prefill']['engine_settings']['weight_dtype']}"
    with out["csv"].open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    fixed = {r["rank"]: r["note"] for r in rows if r["rank"].startswith("fixed disaggregated")}
    csv_text = "\n".join(f"{k} {v}" for k, v in fixed.items())
    assert "replicas: " not in csv_text
    assert "workers: 2" in fixed["fixed disaggregated pools: decode"]
    assert prefill in fixed["fixed disaggregated launch and verify lines: prefill worker 0"]
    assert router in fixed["fixed disaggregated launch and verify lines: router"]
    assert fixed["fixed disaggregated launch and verify lines: hosts"] == hosts
    assert f"capplan verify {out['json']}" in fixed[
        "fixed disaggregated launch and verify lines: dataset"]
    assert "fixed disaggregated launch and verify lines: verify" in fixed
    assert "fixed disaggregated launch and verify lines: measure" in fixed
    for fig in (*util, e2e, kv, dtypes, ttft):
        assert fig in csv_text, fig
    wb = openpyxl.load_workbook(out["xlsx"])
    cells = [str(c) for r in wb["fixed disaggregated"].iter_rows(values_only=True)
             for c in r if c is not None]
    wb.close()
    assert "prefill" in cells and "decode" in cells and ttft in cells and prefill in cells
    assert router in cells and hosts in cells and e2e in cells and kv in cells
    verify = [c for c in cells if c.startswith("capplan verify")]
    assert verify and all(c.startswith(f"capplan verify {out['json']}") for c in verify)
    assert any("--layout disaggregated" in c for c in verify)
    for fmt in ("md", "html"):
        text = out[fmt].read_text()
        assert "fixed disaggregated layout" in text and ttft in text, fmt
        assert "--layout disaggregated" in text and "prefill worker 0" in text, fmt
        assert f"capplan verify {out['json']} --layout disaggregated --endpoint" in text, fmt
        for fig in (*util, e2e, kv, dtypes):
            assert fig in text, (fmt, fig)
    md = out["md"].read_text()
    assert f"\n# hosts: {hosts}\n" in md  # a comment in the bash block, not a bare line
