"""Assertions shared by the CLI tests."""

from __future__ import annotations


def assert_one_line_error(res, fragment: str = "") -> None:
    """Bad input: exit 2, exactly one 'Error: ...' line on stderr, nothing else, no traceback."""
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr, res.exception)
    assert res.exception is None, repr(res.exception)
    assert "Traceback" not in res.stderr + res.stdout
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("Error: "), lines[0]
    assert fragment in lines[0], (fragment, lines[0])
    assert res.stdout == ""


def assert_answer_then_refusal(res, fragment: str = "") -> None:
    """An export that refuses a plan once it is made: exit 2, the plan's answer on stdout as
    without the export (its verify lines reading the placeholder PLAN.json, no export named),
    then exactly one 'Error: ...' line on stderr (no 'wrote' line: nothing is written)."""
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr, res.exception)
    assert res.exception is None, repr(res.exception)
    assert "Traceback" not in res.stderr + res.stdout
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    assert fragment in lines[0], (fragment, lines[0])
    assert res.stdout.strip(), "the plan's answer is missing"
