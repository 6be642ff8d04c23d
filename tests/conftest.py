"""Shared fixtures: an isolated CAPPLAN_HOME for every test, and two ways to run the CLI.

`run_cli` uses click's CliRunner in-process (fast; stdout and stderr kept apart);
`run_module` runs `python -m capplan` in a subprocess, to check what a user's shell sees
(exit code, one-line stderr, no traceback) end to end.

Hypothesis profiles: "ci" (chosen when the CI environment variable is set, as GitHub Actions,
GitLab and most runners set it) is derandomised, so a CI run tries the same examples every time
and a red build is reproducible; "dev" (the default elsewhere) keeps Hypothesis's random search.
HYPOTHESIS_PROFILE=ci|dev overrides the choice. Neither has a per-example deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import settings

from capplan.catalog.loader import Catalog, load_catalog

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = Path(__file__).resolve().parent / "data" / "configs"

# No per-example deadline (Hypothesis's default is 200 ms of wall time): the suite runs on 2
# cores beside a second xdist worker, where a 20 ms example can take a second; the work a test
# may do is bounded where it matters by CPU time (tests/fuzz) or by the test's own checks.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("dev", deadline=None)
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI")
                                                              else "dev")
settings.load_profile(HYPOTHESIS_PROFILE)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, compile the simulator's loops once in the controlling process before
    the workers start (tests/numba_warm.py): on a cold numba cache each worker compiled them."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from numba_warm import warm

        warm()


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _signal_state() -> tuple[Any, ...]:
    """The main thread's SIGINT/SIGTERM handlers and blocked signals."""
    return (*(signal.getsignal(s) for s in _SIGNALS),
            frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, [])))


_BASE_SIGNAL_STATE = _signal_state()
"""As this process (a test worker) started."""


def _restore_signal_state(when: str, nodeid: str) -> None:
    state = _signal_state()
    if state == _BASE_SIGNAL_STATE:
        return
    for s, h in zip(_SIGNALS, _BASE_SIGNAL_STATE, strict=False):
        signal.signal(s, h)
    signal.pthread_sigmask(signal.SIG_SETMASK, _BASE_SIGNAL_STATE[-1])
    warnings.warn(f"signal state changed {when} {nodeid}: SIGINT/SIGTERM handlers and blocked "
                  f"signals {state} restored to {_BASE_SIGNAL_STATE}", stacklevel=1)


@pytest.fixture(autouse=True)
def signal_state(request: pytest.FixtureRequest) -> Any:
    """Every test starts with the worker's SIGINT/SIGTERM handlers and signal mask as the worker
    started, and one that leaves them changed fails with a warning naming it (the suite turns
    warnings into errors): the Ctrl-C tests send signals to this process and to children that
    inherit ignored and blocked signals through exec."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _restore_signal_state("before", request.node.nodeid)
    yield
    _restore_signal_state("by", request.node.nodeid)


@pytest.fixture(autouse=True)
def capplan_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point CAPPLAN_HOME at a fresh folder so no test reads or writes the user's own."""
    home = tmp_path / "capplan-home"
    home.mkdir()
    monkeypatch.setenv("CAPPLAN_HOME", str(home))
    monkeypatch.delenv("CAPPLAN_CATALOG_DIR", raising=False)
    return home


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog()


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None = None

    def json(self) -> Any:
        return json.loads(self.stdout)

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def _cli_runner() -> CliRunner:
    try:  # click >= 8.2 always keeps stderr apart; older versions need mix_stderr=False
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:
        return CliRunner()


@pytest.fixture
def run_cli():
    """run_cli("memory", "--model", ...) -> CliResult, in-process through main()'s error path."""
    from capplan.cli import cli

    def _run(*args: str) -> CliResult:
        runner = _cli_runner()
        # prog_name as the console script sets it; CapplanGroup.main turns every error into
        # one 'Error: ...' line and a SystemExit, which CliRunner records as exit_code.
        res = runner.invoke(cli, list(args), prog_name="capplan", catch_exceptions=True)
        exc = res.exception if not isinstance(res.exception, SystemExit) else None
        return CliResult(res.exit_code, res.stdout, res.stderr, exc)

    return _run


@pytest.fixture
def run_module():
    """run_module("memory", ...) -> CliResult from `python -m capplan` in a subprocess."""

    def _run(*args: str, timeout: float = 60) -> CliResult:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.run(
            [sys.executable, "-m", "capplan", *args], capture_output=True, text=True,
            cwd=REPO_ROOT, env=env, timeout=timeout, check=False,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return _run


@pytest.fixture(autouse=True)
def _default_caps():
    """Each test starts from the default work caps: `--limit` in an in-process CLI call sets
    them for the process, which an API call in a later test would otherwise inherit."""
    yield
    from capplan import limits

    limits.reset_caps()
