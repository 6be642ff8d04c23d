"""Start-up (issue 17): `capplan --help` and `--version` import only click and the CLI shell;
each command's modules load when that command runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("numpy", "scipy", "pydantic", "tabulate", "yaml", "matplotlib", "torch",
         "capplan.models", "capplan.sim", "capplan.plan", "capplan.catalog")
"""Modules `--help` and `--version` never need (the numerical stack and capplan's own)."""

PROBE = """
import json, sys
from capplan.cli import cli
try:
    cli.main(args=sys.argv[1:], prog_name="capplan")
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def _modules_after(*args: str) -> tuple[str, set[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, timeout=60, check=False)
    return proc.stdout, set(json.loads(proc.stderr.splitlines()[-1]))


def _heavy(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("args", [("--help",), ("--version",)])
def test_help_and_version_import_nothing_heavy(args):
    out, mods = _modules_after(*args)
    assert "capplan" in out
    assert _heavy(mods) == []


def test_a_command_loads_its_modules():
    # the probe can fail: `memory --help` must import the command module (and with it numpy)
    out, mods = _modules_after("memory", "--help")
    assert "--gpu" in out
    assert "capplan.cli.memory_cmd" in mods
    assert "capplan.cli.simulate_cmd" not in mods


def test_listed_short_help_is_each_commands_own():
    from capplan.cli import COMMANDS, CapplanGroup, cli

    fresh = CapplanGroup("capplan")
    for name, (module, text) in COMMANDS.items():
        cmd = cli.get_command(click.Context(cli), name)
        assert cmd is not None, name
        assert cmd.callback is not None and cmd.callback.__module__ == f"capplan.cli.{module}"
        assert (cmd.help or "").split("\n\n")[0] == text, name
        for limit in (20, 45, 80):  # the truncation click applies at each terminal width
            assert (click.Command(name, help=text).get_short_help_str(limit)
                    == cmd.get_short_help_str(limit)), (name, limit)
    assert fresh.list_commands(click.Context(fresh)) == sorted(COMMANDS)
