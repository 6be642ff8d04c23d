"""Docs as tests: every plan file in examples/ runs as shipped and exports a readable workbook.

The simulator check is skipped (--no-verify) except for chat-8b, the README's first example,
to keep this file short; each run also writes an XLSX that openpyxl must read back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plan.test_launch_lines import check_engine_lines

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))
VERIFIED = {"chat-8b"}
SLOW = {"chat-8b", "shared-70b"}  # the simulator check; three plans (shared + one per lane)


def test_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert len(EXAMPLES) >= 5, names
    assert VERIFIED | SLOW <= names


def _param(p: Path):  # noqa: ANN202
    marks = [pytest.mark.slow] if p.stem in SLOW else []
    return pytest.param(p, id=p.stem, marks=marks)


@pytest.mark.parametrize("example", [_param(p) for p in EXAMPLES])
def test_example_plans_and_exports_xlsx(run_cli, tmp_path, example: Path) -> None:
    openpyxl = pytest.importorskip("openpyxl")
    import yaml

    xlsx = tmp_path / f"{example.stem}.xlsx"
    args = ["plan", str(example), "--format", "json", "--export", str(xlsx)]
    if example.stem not in VERIFIED:
        args.append("--no-verify")
    res = run_cli(*args)
    assert res.exit_code == 0, (res.stderr, res.exception)
    out = json.loads(res.stdout)

    spec = yaml.safe_load(example.read_text(encoding="utf-8"))
    recs = out["recommendations"]
    assert recs, example
    assert out["objective"] == spec.get("objective", "min_cost")
    assert out["target_rate_per_s"] == pytest.approx(
        sum(w["rate_per_s"] for w in spec["workloads"]))
    gpus = spec.get("candidates", {}).get("gpus")
    for r in recs:
        if gpus:
            assert r["gpu"] in gpus
        assert r["replicas"] >= 1 and r["gpus_total"] == (
            r["replicas"] * r["tp"] * r.get("pp", 1) * r.get("attention_dp", 1))
        assert r["engine_flags"]["vllm"].startswith("vllm serve ")
        check_engine_lines(r)  # every engine's line: dtype, memory fraction, max-model-len
    if example.stem in VERIFIED:
        ver = recs[0]["verified"]
        assert ver and ver["ok"], ver  # the simulator confirms the first recommendation
    if len(spec["workloads"]) > 1:
        assert out["pools"]["cheaper"] in ("shared", "separate", "equal")

    wb = openpyxl.load_workbook(xlsx, read_only=True)
    try:
        assert {"recommendations", "inputs", "curve"} <= set(wb.sheetnames), wb.sheetnames
        rows = list(wb["recommendations"].iter_rows(values_only=True))
        assert len(rows) == 1 + len(recs)
    finally:
        wb.close()
