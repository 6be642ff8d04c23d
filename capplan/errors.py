"""Error tiers (STYLE §2.8): bad input exits 2 with one line; anticipated failures exit 1."""

from __future__ import annotations


class CapplanError(Exception):
    """Base of every error capplan raises on purpose."""

    exit_code = 1


class InputError(CapplanError, ValueError):
    """The user's input is wrong: the message names the value, the constraint and the fix."""

    exit_code = 2


class CatalogError(InputError):
    """A catalog entry is unknown or malformed (user-facing: exit 2)."""


class InfeasibleError(InputError):
    """No configuration meets the constraints; the message names the binding one."""


class ProbeUnavailable(InputError):
    """The probe cannot run here (no torch, no GPU): the message says what to install."""


def nearest(name: str, choices: list[str], n: int = 3, cutoff: float = 0.0) -> list[str]:
    """The n choices closest to name (substring matches, then difflib ratio >= cutoff)."""
    import difflib

    low = name.lower()
    ranked = difflib.get_close_matches(low, [c.lower() for c in choices], n=n, cutoff=cutoff)
    by_low = {c.lower(): c for c in choices}
    subs = [c for c in choices if low and (low in c.lower() or c.lower() in low)]
    out: list[str] = []
    for c in subs + [by_low[r] for r in ranked]:
        if c not in out:
            out.append(c)
    return out[:n]


def one_line_error(e: BaseException) -> str:
    """One line for any error: a pydantic ValidationError becomes 'key.path: message' of its
    first error (the one home of this formatter); other errors keep their first line. Never
    echoes the offending input (a file's content must not leak into a message)."""
    errors = getattr(e, "errors", None)
    if callable(errors) and type(e).__name__ == "ValidationError":
        errs = e.errors(include_input=False)  # type: ignore[attr-defined]
        if errs:
            err = errs[0]
            where = ".".join(str(x) for x in err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            first = msg.splitlines()[0] if msg else err["type"]
            return f"{where}: {first}" if where else first
    text = str(e)
    return text.splitlines()[0] if text.strip() else type(e).__name__


def shown_key(key: str) -> str:
    """A key from a user's file as an error may quote it: only when it looks like a key name.
    A file that is not a plan (`--calibration /etc/shadow`) would otherwise have its first line
    echoed as an 'unknown key'."""
    import re

    return repr(key) if re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", key) else "(not a key name)"
