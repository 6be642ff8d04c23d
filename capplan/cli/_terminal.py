"""Control characters from user input never reach the terminal raw.

Option values, file names, file contents and a server's error text are echoed in error lines,
notes and tables; an ESC, OSC or CSI sequence among them would retitle the window, clear the
screen or rewrite earlier lines. The CLI's stdout and stderr go through EscapingStream, which
writes every control character except newline, tab and carriage return (click's progress bar
redraws with it) as a visible escape (`\\x1b`); the two cursor sequences click's progress bar
itself sends are kept.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

_KEEP = ("\x1b[?25l", "\x1b[?25h")
"""click.progressbar hides the cursor while it draws and shows it after (click/_termui_impl)."""
_CONTROL = re.compile("|".join(map(re.escape, _KEEP))
                      + r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    s = m.group(0)
    if s in _KEEP:
        return s
    c = ord(s)
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escape_controls(text: str) -> str:
    """text with C0/C1 control characters (but newline, tab, CR) and bidi overrides escaped."""
    return _CONTROL.sub(_escape, text)


class EscapingStream:
    """A text stream that escapes control characters (escape_controls) and delegates the rest
    (encoding, isatty, flush...) to the stream it wraps."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(escape_controls(text) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def escaped_output() -> Iterator[None]:
    """sys.stdout and sys.stderr through EscapingStream for the duration (idempotent)."""
    saved = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, EscapingStream) and sys.stdout is not None:
        sys.stdout = EscapingStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, EscapingStream) and sys.stderr is not None:
        sys.stderr = EscapingStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
