"""SIGTERM is said on stderr as Ctrl-C is ("terminated", exit 143; before: exit 143 and an
empty stderr, so a killed run's partial output read as a finished one), and an interrupted run
ends at once (issue 30: SIGINT/SIGTERM end a compiled run within a second)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from capplan.cli import _terminate

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_says_terminated_and_exits_143(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's SIGTERM handler (installed by main()) says so and unwinds with 143."""
    with pytest.raises(SystemExit) as e:
        _terminate(signal.SIGTERM, None)
    assert e.value.code == 143
    assert capsys.readouterr().err == "terminated\n"


PROBE = """
import atexit, sys
import capplan.cli as c

class Teardown:
    def __del__(self):
        print("teardown", file=sys.stderr, flush=True)

held = Teardown()  # a module global: deleted in the interpreter's teardown
atexit.register(lambda: print("atexit", file=sys.stderr, flush=True))

def run(**kw):
    raise SystemExit(int(sys.argv[1]))

c.cli.main = run
c.main()
"""


@pytest.mark.parametrize("code", [130, 143, 0, 2])
def test_every_run_skips_the_interpreters_teardown(code: int) -> None:
    """`interrupted` was printed 0.04 s after SIGINT and the process ended 1.2 s later (2.5 s
    on a loaded machine), in the teardown of the loaded compiled engine; an answer of
    `latency` spent 0.2 s of its 1.3 s there. Every run ends after its atexit handlers,
    without the teardown, with its exit code."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    p = subprocess.run([sys.executable, "-c", PROBE, str(code)], capture_output=True, text=True,
                       env=env, timeout=60, check=False)
    assert p.returncode == code, p.stderr
    assert "atexit" in p.stderr.split()
    assert "teardown" not in p.stderr.split(), p.stderr


def test_a_reader_that_leaves_ends_the_run_quietly_with_141() -> None:
    """`capplan speed ... | true`: the reader is gone when the answer is written; the run stops
    with the shell's SIGPIPE status (128 + 13) and says nothing (it said "Error: Broken pipe",
    exit 2, as if the input were bad)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "capplan", "speed", "--model", "llama-3.1-8b", "--gpu",
         "h100-sxm", "--batch", "1-256", "--context", "1024", "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the answer is written, as `| true` does
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141
    assert err == b""
