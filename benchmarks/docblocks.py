"""Generated tables in docs/: read and rewrite the blocks a validation script owns.

A block is delimited in a Markdown file by
    <!-- generated: <script-stem>:<table-id> -->
    ...
    <!-- /generated -->
`python benchmarks/<script>.py --write-docs` rewrites its blocks; `make validate` runs every
script that owns one, and tests/docs/test_generated_tables.py recomputes the fast ones and fails
when a committed table differs from what the code now computes.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"(<!-- generated: (?P<key>[\w.-]+:[\w.-]+) -->\n)(?P<body>.*?)"
                    r"(<!-- /generated -->)", re.S)


def blocks(path: Path) -> dict[str, str]:
    """Every generated block of a file, by `script:table` key, body without its markers."""
    return {m["key"]: m["body"] for m in _BLOCK.finditer(path.read_text())}


def write_block(path: Path, key: str, body: str) -> None:
    """Replace the body of block `key` in `path` (atomically); the block must already exist."""
    text = path.read_text()
    body = body.rstrip("\n") + "\n"
    found = False

    def repl(m: re.Match[str]) -> str:
        nonlocal found
        if m["key"] != key:
            return m.group(0)
        found = True
        return m.group(1) + body + m.group(4)

    new = _BLOCK.sub(repl, text)
    if not found:
        raise SystemExit(f"{path}: no block '<!-- generated: {key} -->' to rewrite")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, path)


def report(path: Path, script: str, tables: dict[str, list[str]], footer: str,
           write: bool) -> None:
    """Print a script's tables (each a list of lines, in order) and `footer`; with `write`
    (`--write-docs`) rewrite each as block `script:<table id>` of `path`."""
    print("\n\n".join("\n".join(t) for t in tables.values()))
    print(footer)
    if write:
        for tid, lines in tables.items():
            write_block(path, f"{script}:{tid}", "\n".join(lines))
        print(f"wrote {path}")
