"""Accuracy at a glance: the headline figures of docs/validation.md in one table.

Reads the tables the validation scripts generated (docs/validation.md's blocks; no model runs)
and writes block `accuracy_summary:glance` at the top of the same file. Run it after the other
scripts (`make validate` does): `python benchmarks/accuracy_summary.py [--write-docs]`.
tests/docs/test_generated_tables.py fails when the committed summary differs from what this
script derives from the committed tables.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bars import AGG_BARS, PD_BARS  # noqa: E402
from docblocks import ROOT, blocks, report  # noqa: E402

DOC = ROOT / "docs" / "validation.md"
ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
BARS = {"ttft": round(AGG_BARS["ttft"] * 100), "tpot": round(AGG_BARS["tpot"] * 100),
        "pd_ttft": round(PD_BARS["ttft"] * 100), "pd_tpot": round(PD_BARS["tpot"] * 100)}
"""The bars in percent (benchmarks/bars.py)."""


def _rows(body: str) -> list[list[str]]:
    """A Markdown table's body rows as cells (header and rule skipped)."""
    out = []
    for line in body.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            out.append([c.strip() for c in line.strip().strip("|").split("|")])
    return out[1:] if out else out


def _median_bias(cell: str) -> tuple[str, str]:
    """'43% / 90% / -26%' -> ('43%', '-26%')."""
    med, _p90, bias = (p.strip() for p in cell.split("/"))
    return med, bias


def _cell(median: str, bias: str) -> str:
    return median if median == "-" else f"{median} ({bias})"


def _bar_values(cell: str) -> tuple[str, str]:
    """'**all** (bars: 42.9% > 30%, 16.4% > 15%)' -> ('42.9%', '16.4%')."""
    m = re.search(r"bars: ([\d.]+%)[^,]*, ([\d.]+%)", cell)
    if m is None:
        raise SystemExit(f"no bar figures in {cell!r}")
    return m[1], m[2]


def _bar_rows(block: str) -> dict[str, tuple[str, str, str, str]]:
    """Per engine: exact TTFT and TPOT medians of the bold 'all' row and their biases."""
    out = {}
    for cells in _rows(block):
        if cells[1].startswith("**all**"):
            ttft, tpot = _bar_values(cells[1])
            out[cells[0]] = (ttft, _median_bias(cells[3])[1], tpot, _median_bias(cells[4])[1])
    return out


def _disagg(block: str, marker: str | None) -> dict[str, tuple[str, ...]]:
    """Per engine: rows, predicted share, TTFT and TPOT medians and biases of the 'all' rows of
    the table after `marker` (the first table when None)."""
    if marker is not None:
        block = block[block.index(marker):]
        block = block[block.index("|"):]
    table = block.split("\n\n")[0]
    out = {}
    for cells in _rows(table):
        if cells[1] == "all":
            t_med, t_bias = _median_bias(cells[4])
            p_med, p_bias = _median_bias(cells[5])
            out[cells[0]] = (cells[2], cells[3], t_med, t_bias, p_med, p_bias)
    return out


def _seeds(block: str) -> str:
    """The seeds' decode points (A100, Llama-3.1-8B): the errors at batch 1 / 8 / 32."""
    errs = [cells[10] for cells in _rows(block) if cells[0] == "brief"]
    return " / ".join(errs)


def _saturation(block: str) -> str:
    """Open-loop plateaus under the profile of the release measured (vllm@0.6 for vLLM 0.6.0,
    sglang@0.3 for SGLang 0.3.0): the `latency --rate` column's errors."""
    out = []
    for cells in _rows(block):
        if len(cells) < 6:
            continue
        measured, profile = cells[2], cells[3]
        release = measured.split()[-1].rsplit(".", 1)[0]
        if profile.endswith("@" + release):
            err = re.search(r"\(([-+]\d+%)\)", cells[5])
            out.append(f"{cells[0]} on {measured}: {err[1] if err else cells[5]}")
    return "; ".join(out)


def glance() -> str:
    b = blocks(DOC)
    loso = _bar_rows(b["validate_silicon:loso"])
    loev = _bar_rows(b["validate_silicon:loev"])
    every = _disagg(b["validate_disagg:by-engine"], None)
    stated = _disagg(b["validate_disagg:rule-check"], "Scored with the stated counts")
    lines = [
        "| engine | aggregated, held-out system: TTFT | TPOT | held-out release: TTFT | TPOT "
        "| disaggregated rows (predicted) | TTFT | TPOT | stated layouts: TTFT | TPOT "
        "| bars missed |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, name in ENGINES.items():
        t, tb, p, pb = loso[key]
        et, etb, ep, epb = loev[key]
        rows, pred, dt, dtb, dp, dpb = every.get(key, ("0", "-", "-", "-", "-", "-"))
        st = stated.get(key, ("0", "-", "-", "-", "-", "-"))
        missed = [what for what, value, bar in (
            ("TTFT", t, BARS["ttft"]), ("TPOT", p, BARS["tpot"]),
            ("disaggregated TTFT", dt, BARS["pd_ttft"]), ("disaggregated TPOT", dp,
                                                          BARS["pd_tpot"]))
            if value != "-" and float(value.rstrip("%")) > bar]
        lines.append(
            f"| {name} | {_cell(t, tb)} | {_cell(p, pb)} | {_cell(et, etb)} | {_cell(ep, epb)} "
            f"| {rows} ({pred}) | {_cell(dt, dtb)} | {_cell(dp, dpb)} | {_cell(st[2], st[3])} "
            f"| {_cell(st[4], st[5])} | {', '.join(missed) or 'none'} |")
    lines += [
        "",
        f"Bars: aggregated TTFT <= {BARS['ttft']}%, TPOT <= {BARS['tpot']}% median |error| "
        f"(leave-one-system-out, section 4b); disaggregated TTFT <= {BARS['pd_ttft']}%, TPOT <= "
        f"{BARS['pd_tpot']}% (section 6), each the median |predicted / measured - 1|, with "
        "the median signed error in brackets (negative: capplan "
        "predicts less than was measured).",
        f"Decode speed of the seed points (Llama-3.1-8B, A100, batch 1 / 8 / 32): "
        f"{_seeds(b['validate_perf:published'])} (section 2). Open-loop saturation against "
        f"published sweeps, under the measured release's profile: "
        f"{_saturation(b['validate_saturation:published'])} (section 4c)."]
    return "\n".join(lines) + "\n"


TABLES = {"accuracy_summary:glance": glance}


if __name__ == "__main__":
    report(DOC, "accuracy_summary", {"glance": glance().splitlines()}, "",
           "--write-docs" in sys.argv)
