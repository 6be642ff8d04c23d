"""Control characters from user input reach the terminal escaped (issue 30, defect 8).

Before: a trace path holding an OSC sequence was echoed raw in the error line (it could retitle
the terminal or rewrite earlier lines); the fix escapes everything the CLI prints."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from capplan.cli._terminal import escape_controls

RAW = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_escaped_text_holds_no_control_character_and_keeps_the_rest(text: str) -> None:
    out = escape_controls(text)
    kept = out.replace("\x1b[?25l", "").replace("\x1b[?25h", "")
    assert not RAW.search(kept)
    if not RAW.search(text) and not re.search("[\u202a-\u202e\u2066-\u2069]", text):
        assert out == text


def test_file_name_with_a_control_character_is_escaped(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    # (CliRunner strips CSI sequences itself, as click does for a pipe: a bell it keeps; on a
    # terminal click strips nothing, and the escaping stream shows ESC as \x1b)
    r = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace",
                str(tmp_path / "a\x07b.csv"))
    assert r.exit_code == 2 and "a\\x07b.csv" in r.stderr and "\x07" not in r.stderr


def test_warnings_reach_the_user_as_one_line_without_a_source_path(capsys) -> None:  # noqa: ANN001
    """Before: numpy RuntimeWarnings printed `/path/to/capplan/...py:629: RuntimeWarning` and the
    source line on stderr."""
    import warnings

    import numpy as np

    from capplan.cli import _warnings_as_notes

    with warnings.catch_warnings(), _warnings_as_notes():
        warnings.simplefilter("always")
        np.float64(0) / np.float64(0)
    err = capsys.readouterr().err
    assert err == ("note: RuntimeWarning: invalid value encountered in scalar divide (in "
                   "capplan; the result may be affected, please report it)\n")
