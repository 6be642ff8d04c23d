"""The disaggregated layout in every export format, not only the terminal and JSON: CSV rows,
a Markdown section and an XLSX sheet repeat the JSON's pools."""

from __future__ import annotations

import csv
import re
from html.parser import HTMLParser
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


def test_every_format_says_which_layout_is_recommended(deepseek, run_cli) -> None:
    """Disaggregated wins: the Markdown headline, the CSV and XLSX "recommended" column, the
    XLSX inputs sheet and the terminal say so, as the Kubernetes export deploys it (its
    prefill and decode pools). Before, only the terminal's verdict line said it."""
    out, plan = deepseek
    d = plan["disaggregated"]
    want = (f"the disaggregated prefill/decode layout: prefill 1 x h200 TP 8 (8 GPUs, $32.00/h)"
            f" + decode 1 x h200 TP 8 (8 GPUs, $32.00/h) = {d['gpus_total']} GPUs, "
            f"${d['cost_per_hour']:.2f}/h")
    assert d["gpus_total"] == 16 and plan["recommendations"][0]["gpus_total"] == 24
    md = out["md"].read_text()
    assert md.splitlines()[2].startswith(f"- **Recommended: {want}")
    assert "## Disaggregated prefill/decode (recommended)" in md
    with out["csv"].open() as f:
        marks = {r["rank"]: r["recommended"] for r in csv.DictReader(f)}
    assert marks == {"1": "no", "disaggregated prefill": "yes", "disaggregated decode": "yes"}
    rec_sheet = _xlsx_rows(out["xlsx"], "recommendations")
    assert [r["recommended"] for r in rec_sheet] == ["no"]
    assert [r["recommended"] for r in _xlsx_rows(out["xlsx"], "disaggregated")] == ["yes"] * 2
    openpyxl = pytest.importorskip("openpyxl")
    wb = openpyxl.load_workbook(out["xlsx"])
    first = next(wb["inputs"].iter_rows(min_row=2, max_row=2, values_only=True))
    wb.close()
    assert first[0] == "recommended" and first[1].startswith(want)
    import yaml

    kinds = {(o["kind"], o["metadata"]["name"]) for o in
             yaml.safe_load_all(out["k8s.yaml"].read_text())}
    assert {("StatefulSet", "deepseek-v3-prefill"), ("StatefulSet", "deepseek-v3-decode")} <= kinds
    res = run_cli(*DEEPSEEK, "--verify-top", "0")
    assert res.exit_code == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert f"recommended: {want}" in text
    assert "rank 1, the best aggregated fleet: 3 x h200 TP 8 (24 GPUs)" in text


class _Paragraphs(HTMLParser):
    """Every <p>'s class and text, with the <h2> it sits under, and the page's whole text."""

    def __init__(self) -> None:
        super().__init__()
        self.paragraphs: list[tuple[str, str, str]] = []
        self.text, self._h2, self._in = "", "", ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "h2":
            self._h2, self._in = "", "h2"
        elif tag == "p":
            self.paragraphs.append((self._h2, dict(attrs).get("class") or "", ""))
            self._in = "p"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h2", "p"):
            self._in = ""

    def handle_data(self, data: str) -> None:
        self.text += data
        if self._in == "h2":
            self._h2 += data
        elif self._in == "p":
            h2, cls, text = self.paragraphs[-1]
            self.paragraphs[-1] = (h2, cls, text + data)


def test_aggregated_winner_is_said_so_beside_the_losing_layout(run_cli, tmp_path) -> None:
    # `recommend ... --disagg --export report.html` (docs/takeaways.md's command) where the
    # aggregated layout wins: every report says the verdict once, in its disaggregated section
    # (the HTML and Markdown also said it in their headline)
    out = {s: tmp_path / f"plan.{s}" for s in ("csv", "md", "html", "xlsx")}
    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "20",
                  "--input-len", "lognormal:mean=800,p99=3000", "--output-len", "200",
                  "--ttft-p99", "1", "--verify-top", "0", "--format", "json",
                  *[a for p in out.values() for a in ("--export", str(p))])
    assert res.exit_code == 0, res.stderr
    plan = res.json()
    d, best = plan["disaggregated"], plan["recommendations"][0]
    assert d["winner"] == "aggregated" and d.get("prefill"), d["verdict"]
    with out["csv"].open() as f:
        marks = {r["rank"]: r["recommended"] for r in csv.DictReader(f)}
    assert marks["1"] == "yes" and marks["disaggregated prefill"] == "no"
    assert all(v == "no" for k, v in marks.items() if k.isdigit() and k != "1")
    md = out["md"].read_text()
    assert md.splitlines()[2].startswith(
        f"- **Recommended: {best['replicas']} x h100-sxm TP {best['tp']} ")
    assert "## Disaggregated prefill/decode\n" in md
    page = out["html"].read_text()
    assert "<h2>Disaggregated prefill/decode (not recommended)</h2>" in page
    assert f"<b>Recommended: {best['replicas']} x h100-sxm TP {best['tp']} " in page
    html = _Paragraphs()
    html.feed(page)
    assert html.text.count(d["verdict"]) == 1
    assert [(h2, cls) for h2, cls, text in html.paragraphs if d["verdict"] in text] == [
        ("Disaggregated prefill/decode (not recommended)", "verdict")]
    assert md.count(d["verdict"]) == 1
    assert md.index(d["verdict"]) > md.index("## Disaggregated prefill/decode\n")
    # the XLSX says it in its disaggregated sheet's column, not beside the recommendation
    inputs = _xlsx_rows(out["xlsx"], "inputs")
    assert [r["value"] for r in inputs if r["input"] == "recommended"] == [
        md.splitlines()[2].removeprefix("- **Recommended: ").removesuffix(".**")]
    assert not [r for r in inputs if d["verdict"] in str(r["value"])]
    assert {r["which layout wins"] for r in _xlsx_rows(out["xlsx"], "disaggregated")} == {
        d["verdict"]}


def test_a_verdict_without_a_layout_is_said_once_in_every_report(run_cli, tmp_path) -> None:
    # no disaggregated layout meets the SLOs: the plan's `disaggregated` holds the verdict
    # alone, which each report says once (the XLSX, without a disaggregated sheet, in its
    # inputs sheet)
    from capplan.export import export_plan
    from capplan.plan.disagg import compare

    res = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "20",
                  "--input-len", "800", "--output-len", "200", "--ttft-p99", "1",
                  "--verify-top", "0", "--format", "json")
    assert res.exit_code == 0, res.stderr
    plan = res.json()
    best = plan["recommendations"][0]
    verdict = compare(best["gpus_total"], best["cost_per_hour"], best["binding_constraint"], None)
    plan["disaggregated"] = {"verdict": verdict, "winner": "aggregated"}  # as the planner's
    out = {s: export_plan(plan, tmp_path / f"plan.{s}") for s in ("md", "html", "xlsx")}
    assert out["md"].read_text().count(verdict) == 1
    html = _Paragraphs()
    html.feed(out["html"].read_text())
    assert html.text.count(verdict) == 1
    assert [(h2, cls) for h2, cls, text in html.paragraphs if verdict in text] == [
        ("Disaggregated prefill/decode (not recommended)", "verdict")]
    inputs = _xlsx_rows(out["xlsx"], "inputs")
    assert [r["input"] for r in inputs if r["value"] == verdict] == [
        "disaggregated prefill/decode"]


def test_each_replica_of_a_pool_has_its_own_line_in_every_report(run_cli, tmp_path) -> None:
    """Two prefill replicas on one host (Llama-3.1-70B, SGLang with mixed chunks, TP 4 each):
    Markdown, HTML and CSV give each replica's own line, at its GPUs, server port and
    bootstrap port, as the terminal does (a rule "the others take port + 1" left the KV
    handshake ports out)."""
    paths = {s: tmp_path / f"a{s}" for s in (".md", ".csv", ".html")}
    res = run_cli("recommend", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--engine",
                  "sglang+mixed-chunk", "--rate", "13", "--input-len", "1000", "--output-len",
                  "300", "--ttft-p99", "1", "--tbt-p99", "0.06",
                  *[w for p in paths.values() for w in ("--export", str(p))])
    assert res.exit_code == 0, res.stderr
    for suffix, path in paths.items():
        text = path.read_text()
        for gpus, port, boot in (("0,1,2,3", 8100, 8998), ("4,5,6,7", 8101, 8999)):
            assert re.search(rf"CUDA_VISIBLE_DEVICES={gpus} [^\n]*--disaggregation-bootstrap-port "
                             rf"{boot} [^\n]*--port {port}\b", text), (suffix, gpus)
        assert "port + 1" not in text



def test_reports_give_an_attention_dp_pool_its_layout_not_tp_1(run_cli, tmp_path) -> None:
    """At 10 req/s the decode pool runs `--tp 8 --dp 8 --ep-size 8`: 8 GPUs as attention DP 8
    with EP 8, TP 1 per rank. The Markdown and HTML tables read "TP 1" (CSV and XLSX keep TP,
    DP and EP columns); their TP cell is now the layout, "1xDP8 EP8", as the terminal's."""
    out = {s: tmp_path / f"plan.{s}" for s in ("md", "html")}
    args = [a if a != "5" else "10" for a in DEEPSEEK]
    res = run_cli(*args, "--verify-top", "0", "--format", "json",
                  *[a for p in out.values() for a in ("--export", str(p))])
    assert res.exit_code == 0, res.stderr
    dec = res.json()["disaggregated"]["decode"]
    assert (dec["tp"], dec["attention_dp"], dec["expert_parallel"]) == (1, 8, 8)
    md = out["md"].read_text()
    table = md[md.index("## Disaggregated prefill/decode"):]
    head = next(ln for ln in table.splitlines() if ln.startswith("| rank"))
    row = next(ln for ln in table.splitlines() if ln.startswith("| disaggregated decode"))
    cells = dict(zip([c.strip() for c in head.split("|")], [c.strip() for c in row.split("|")],
                     strict=True))
    assert cells["TP"] == "1xDP8 EP8"
    html = out["html"].read_text()
    section = html[html.index("<h2>Disaggregated prefill/decode"):]
    assert "1xDP8 EP8" in section[:section.index("</table>")]
