"""SIGTERM is said on stderr as Ctrl-C is ("terminated", exit 143; before: exit 143 and an
empty stderr, so a killed run's partial output read as a finished one)."""

from __future__ import annotations

import os
import signal
import threading

from capplan.cli import _terminate


def test_sigterm_says_terminated_and_exits_143(run_cli) -> None:  # noqa: ANN001
    old = signal.signal(signal.SIGTERM, _terminate)  # as main() installs it
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:
        timer.start()  # a run of minutes: 400,000 requests
        r = run_cli("--limit", "sim_requests=400000", "simulate", "--model", "llama-3.1-8b",
                    "--gpu", "h100-sxm", "--rate", "50", "--requests", "400000",
                    "--input-len", "500", "--output-len", "100", "--sim-engine", "reference")
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, old)
    assert r.exit_code == 143, (r.exit_code, r.stderr)
    assert r.stderr.strip().splitlines()[-1] == "terminated", r.stderr
