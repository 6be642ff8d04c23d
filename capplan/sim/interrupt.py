"""Ctrl-C and SIGTERM during a compiled simulation loop.

A numba loop never returns to the interpreter, so Python's signal handlers (KeyboardInterrupt;
the CLI's SIGTERM -> SystemExit(143)) never ran: only SIGKILL stopped a long compiled run.
While the loop runs, `signals_as_flag` swaps those handlers for one that only records the
signal; the loop reads `pending()` every few thousand steps (sim/compiled.py, through numba's
objmode, where CPython runs pending handlers) and stops; on the way out the recorded signal is
handed to the handler it replaced, so the run ends exactly as it would have in Python. No
exception ever crosses the compiled code.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_PENDING: list[int] = []
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def pending() -> int:
    """Signals recorded since the loop started (read by the compiled loop)."""
    return len(_PENDING)


def _record(signum: int, _frame: Any) -> None:
    _PENDING.append(signum)


@contextmanager
def signals_as_flag() -> Iterator[None]:
    """SIGINT/SIGTERM recorded (not raised) for the duration when a Python handler would take
    them; then delivered to that handler. Outside the main thread (handlers cannot be set
    there) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # only Python handlers need the flag: SIG_DFL (a verification worker's SIGTERM) ends the
    # process from the kernel, compiled loop or not, and SIG_IGN ignores it
    old = {s: h for s in _SIGNALS if callable(h := signal.getsignal(s))}
    _PENDING.clear()
    for s in old:
        signal.signal(s, _record)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        got = list(_PENDING)
        _PENDING.clear()
        if got:
            _deliver(got[0], old[got[0]])


def _deliver(signum: int, handler: Any) -> None:
    handler(signum, None)  # default_int_handler raises KeyboardInterrupt; the CLI's SystemExit
