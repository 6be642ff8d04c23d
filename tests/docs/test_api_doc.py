"""docs/api.md's code runs as written (issue 10: the Python API works as its page shows)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_api_page_runs(capsys):
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 4
    cwd = os.getcwd()
    os.chdir(ROOT)  # the page names examples/ relative to the repository
    try:
        scope: dict = {}
        for block in blocks:
            exec(compile(block, "docs/api.md", "exec"), scope)  # noqa: S102 - our own docs
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert "binding:" in out and "vllm serve" in out
