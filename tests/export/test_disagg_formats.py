"""The disaggregated layout in every export format, not only the terminal and JSON: CSV rows,
a Markdown section and an XLSX sheet repeat the JSON's pools."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import pytest

from capplan.plan.launch import pool_command


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
        # the pool's first replica's line as it runs, without the replica count ("1 x: ")
        assert pool_command(d["launch"][f"vllm_{role}"]) in md
    assert not re.search(r"^\d+ x: ", md, flags=re.M)
    assert d["bench"] in md  # the layout's own verify line


DEEPSEEK = ["recommend", "--model", "deepseek-v3", "--gpu", "h200", "--engine", "sglang",
            "--rate", "5", "--input-len", "2000", "--output-len", "500", "--ttft-p99", "2",
            "--tbt-p99", "0.1"]
"""The audit's plan: disaggregated wins (16 GPUs against 24), its replay confirms it."""


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory) -> tuple[dict[str, Path], dict[str, Any]]:
    from click.testing import CliRunner

    from capplan.cli import cli

    d = tmp_path_factory.mktemp("pd")
    out = {s: d / f"plan.{s}" for s in ("csv", "md", "xlsx", "json", "html", "k8s.yaml")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAPPLAN_HOME", str(d))
        res = CliRunner().invoke(cli, [*DEEPSEEK, *[a for p in out.values()
                                                    for a in ("--export", str(p))]],
                                 prog_name="capplan")
    assert res.exit_code == 0, res.output
    import json

    return out, json.loads(out["json"].read_text())


def _xlsx_rows(path: Path, sheet: str) -> list[dict[str, Any]]:
    openpyxl = pytest.importorskip("openpyxl")
    wb = openpyxl.load_workbook(path)
    rows = [[c.value for c in r] for r in wb[sheet].iter_rows()]
    wb.close()
    return [dict(zip(rows[0], r, strict=True)) for r in rows[1:]]


def test_disaggregated_figures_sit_under_their_headers(deepseek) -> None:
    """Capacity under capacity, the plan's load under load, the layout's end-to-end TTFT and
    TBT under the headers the aggregated rows use, each pool's own share apart; GPUs per
    replica and dtypes filled; command cells runnable lines. Before: "load per replica" held
    the capacities (19.06, 11.75 at 5 req/s), TTFT p99 each pool's share, the command cells
    began "1 x: ", GPUs per replica and dtypes were empty."""
    out, plan = deepseek
    d = plan["disaggregated"]
    assert d["winner"] == "disaggregated" and d["replay"]["ok"]
    with out["csv"].open() as f:
        csv_rows = {r["rank"]: r for r in csv.DictReader(f)}
    xlsx_rows = {r["rank"]: r for r in _xlsx_rows(out["xlsx"], "disaggregated")}
    for role in ("prefill", "decode"):
        p = d[role]
        load = plan["target_rate_per_s"] / p["replicas"]
        assert p["per_replica_rate_per_s"] == pytest.approx(load)
        for r in (csv_rows[f"disaggregated {role}"], xlsx_rows[f"disaggregated {role}"]):
            assert float(r["load per replica (req/s)"]) == pytest.approx(load)
            assert float(r["capacity per replica (req/s)"]) == pytest.approx(
                p["rate_per_replica_per_s"])
            assert float(r["TTFT p99 (ms)"]) == pytest.approx(d["ttft_p99_s"] * 1e3)
            assert float(r["TBT p99 (ms)"]) == pytest.approx(d["tbt_p99_s"] * 1e3)
            assert float(r["pool's share of TTFT p99 (ms)"]) == pytest.approx(
                p["ttft_p99_s"] * 1e3)
            assert int(r["GPUs per replica"]) == p["gpus_total"] // p["replicas"] == 8
            assert (r["weight dtype"], r["KV dtype"]) == ("fp8", "bf16")
            assert float(r["sim TTFT p99 (ms)"]) == pytest.approx(
                d["replay"]["ttft_s"]["p99"] * 1e3)
            assert r["which layout wins"] == d["verdict"]
            assert not r.get("binding constraint")  # the verdict is not a binding constraint
            cmd = r["SGLang command"]
            assert cmd == pool_command(d["launch"][f"sglang_{role}"])
            assert re.match(r"^CUDA_VISIBLE_DEVICES=[0-9,]+ python -m sglang\.launch_server ",
                            cmd), cmd
            assert f"--disaggregation-mode {role}" in cmd
    # the aggregated rows keep their own figures and have no pool share
    best = csv_rows["1"]
    rec = plan["recommendations"][0]
    assert float(best["load per replica (req/s)"]) == pytest.approx(rec["per_replica_rate_per_s"])
    assert not best["pool's share of TTFT p99 (ms)"]
    md = out["md"].read_text()
    table = md[md.index("## Disaggregated prefill/decode"):]
    head = next(ln for ln in table.splitlines() if ln.startswith("| rank"))
    for h in ("TTFT p99 (ms)", "pool's share of TTFT p99 (ms)", "capacity per replica (req/s)",
              "load per replica (req/s)", "GPUs per replica", "weight dtype", "KV dtype"):
        assert f" {h} " in head, h
    prefill = next(ln for ln in table.splitlines() if ln.startswith("| disaggregated prefill"))
    cells = dict(zip([c.strip() for c in head.split("|")],
                     [c.strip() for c in prefill.split("|")], strict=True))
    assert float(cells["load per replica (req/s)"]) == pytest.approx(5.0)
    assert float(cells["TTFT p99 (ms)"]) == pytest.approx(d["ttft_p99_s"] * 1e3, abs=0.5)
    assert "```bash\nCUDA_VISIBLE_DEVICES=" in table and not re.search(r"^\d+ x: ", md,
                                                                        flags=re.M)
