"""STYLE §2.4: unit constants live in capplan/units.py only."""

from __future__ import annotations

import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "capplan"
PATTERN = re.compile(r"1024\s*\*\*\s*3|2\s*\*\*\s*30|\b10\s*\*\*\s*9\b|\b1e9\b|\b1e12\b")


def test_no_unit_literals_outside_units():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name == "units.py":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#")[0]
            if PATTERN.search(code):
                offenders.append(f"{path.relative_to(PKG.parent)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
