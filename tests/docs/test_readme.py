"""Docs as tests: every `capplan ...` line in the code blocks of README.md and
docs/day-planning.md runs as written, except those that need hardware, a server or files the
reader would bring (listed with the reason)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = ("README.md", "docs/day-planning.md")

SKIP = {
    "--device cuda": "needs a GPU",
    "--endpoint": "needs a running server (tests/probe runs one)",
    "--from-results": "needs the user's result files (tests/probe ingests samples)",
    "azure_conv.csv": "needs the user's trace (tests/sim replays traces)",
    "--calibration /tmp/h100.yaml": "needs a file from a GPU run",
    "config.json": "needs a config.json (tests/catalog imports real ones)",
    "--device cpu": "slow here; tests/probe runs the CPU calibration end to end",
    "--trace day.csv": "needs the user's day of traffic (tests/day plans a warped day)",
}


def _commands(text: str = README) -> list[str]:
    cmds = []
    # fences paired from the start of a line: a ```yaml block's closing fence opens nothing
    for lang, block in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if lang:
            continue
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("capplan "):
                cmds.append(line)
    return cmds


COMMANDS = [c for doc in DOCS for c in _commands((ROOT / doc).read_text(encoding="utf-8"))]
MKDIRS = {m.rstrip("/") for doc in DOCS for m in re.findall(
    r"^mkdir -p (\S+)", (ROOT / doc).read_text(encoding="utf-8"), flags=re.M)}
"""Folders the docs create before a command writes charts into them (`--plot DIR` writes into
an existing folder, as `--export` does)."""


def test_readme_has_commands():
    assert len(_commands()) >= 12
    assert len(COMMANDS) >= len(_commands()) + 4  # docs/day-planning.md's four


@pytest.mark.slow
@pytest.mark.parametrize("cmd", COMMANDS)
def test_readme_command_runs(cmd, run_cli, tmp_path, monkeypatch):
    for marker, why in SKIP.items():
        if marker in cmd:
            pytest.skip(why)
    monkeypatch.chdir(ROOT)
    args = shlex.split(cmd)[1:]
    if ">" in args:  # shell redirection: drop it, the output is checked here instead
        args = args[: args.index(">")]
    # run as printed: outputs the README names go to /tmp, never into the checkout
    assert not any(a.endswith((".xlsx", ".json", ".csv", ".md", ".html", ".jsonl"))
                   and not a.startswith(("/tmp/", "examples/", "tests/")) for a in args), cmd
    if "--plot" in args:  # the docs create its folder first (a `mkdir -p` line), as here
        folder = args[args.index("--plot") + 1].rstrip("/")
        assert folder in MKDIRS, f"{cmd}: the docs show no `mkdir -p {folder}` before it"
        Path(folder).mkdir(parents=True, exist_ok=True)
    if args[0] in ("recommend", "plan"):
        args.append("--format=json")
    before = _untracked()
    res = run_cli(*args)
    assert res.exit_code == 0, (cmd, res.stderr)
    assert res.stdout.strip() or "--write-dataset" in cmd
    assert _untracked() == before, f"{cmd} wrote into the checkout"


def _untracked() -> set[str]:
    """Files in the checkout git does not know (outputs a command left behind)."""
    import subprocess

    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                             cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return set()  # not a git checkout (an sdist): nothing to compare
    return {ln[3:] for ln in out.stdout.splitlines() if ln.startswith("??")}


def test_readme_counts_are_the_catalogs(catalog) -> None:
    """`capplan gpus` / `capplan models` list every catalog entry: the README's counts say how
    many there are."""
    gpus = re.search(r"capplan gpus +# (\d+) GPUs", README)
    models = re.search(r"capplan models +# (\d+) models", README)
    assert gpus and models
    assert int(gpus.group(1)) == len(catalog.gpus)
    assert int(models.group(1)) == len(catalog.models)
