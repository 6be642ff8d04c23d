"""Tables in docs/ that a validation script generates must be what the code computes now.

Each block `<!-- generated: script:table -->` names its script (benchmarks/docblocks.py); the
fast ones are recomputed here and compared with the committed text. When a model changes, run
`make validate` and commit the regenerated tables.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
docblocks = importlib.import_module("docblocks")

# script stem -> the doc file holding its blocks; every script listed here must be fast (< 2 s).
FAST = {"validate_perf": ROOT / "docs" / "validation.md",
        "speculative_vllm": ROOT / "docs" / "features.md",
        "features_tables": ROOT / "docs" / "features.md",
        "published_prefill": ROOT / "docs" / "perf.md",
        "accuracy_summary": ROOT / "docs" / "validation.md"}


def _committed() -> dict[str, str]:
    out: dict[str, str] = {}
    for doc in (ROOT / "docs").glob("*.md"):
        out.update(docblocks.blocks(doc))
    return out


@pytest.mark.parametrize("stem", sorted(FAST))
def test_committed_tables_match_the_code(stem: str) -> None:
    module = importlib.import_module(stem)
    committed = docblocks.blocks(FAST[stem])
    for key, make in module.TABLES.items():
        assert key in committed, f"{FAST[stem].name} lacks the block {key}"
        assert committed[key] == make(), (
            f"docs table {key} is stale: run `make validate` and commit the result")


def test_every_block_names_a_script_that_can_rewrite_it() -> None:
    for key in _committed():
        stem = key.split(":")[0]
        script = ROOT / "benchmarks" / f"{stem}.py"
        assert script.exists(), f"block {key}: no benchmarks/{stem}.py"
        assert "--write-docs" in script.read_text(), f"benchmarks/{stem}.py has no --write-docs"


def test_write_block_replaces_only_its_own_block(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text("a\n<!-- generated: s:one -->\nold\n<!-- /generated -->\nb\n"
                   "<!-- generated: s:two -->\nkeep\n<!-- /generated -->\n")
    docblocks.write_block(doc, "s:one", "new\nrows")
    assert docblocks.blocks(doc) == {"s:one": "new\nrows\n", "s:two": "keep\n"}
    assert doc.read_text().startswith("a\n") and "\nb\n" in doc.read_text()
    with pytest.raises(SystemExit):
        docblocks.write_block(doc, "s:three", "x")
