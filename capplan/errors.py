"""Error tiers (STYLE §2.8): bad input exits 2 with one line; anticipated failures exit 1."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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


def validation_error_line(e: Any, valid_keys: Sequence[str] = ()) -> tuple[tuple[Any, ...], str]:
    """The one pydantic ValidationError worth showing, as (location, one-line message).

    An unknown key is reported first (it often replaces a required one, `workload:` for
    `workloads:`, and names the fix): "unknown key 'a.b' (did you mean 'c'?)". Otherwise the
    first error: "a.b: message" (pydantic's "Value error, " prefix dropped). The input is
    never echoed, and an unknown key only when it looks like a key name (shown_key).
    """
    errs = e.errors(include_input=False)
    err = next((x for x in errs if x["type"] == "extra_forbidden"), errs[0])
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        near = nearest(str(loc[-1]), list(valid_keys), 1, cutoff=0.5) if valid_keys else []
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return loc, f"unknown key {shown_key(key)}{hint}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return loc, f"{key or 'file'}: {msg.splitlines()[0] if msg else err['type']}"


def one_line_error(e: BaseException) -> str:
    """One line for any error (the CLI's formatter): a pydantic ValidationError through
    validation_error_line, any other error its first line."""
    if type(e).__name__ == "ValidationError" and callable(getattr(e, "errors", None)):
        return validation_error_line(e)[1]
    text = str(e)
    return text.splitlines()[0] if text.strip() else type(e).__name__


def shown_key(key: str) -> str:
    """A key from a user's file as an error may quote it: only when it looks like a key name.
    A file that is not a plan (`--calibration /etc/shadow`) would otherwise have its first line
    echoed as an 'unknown key'."""
    import re

    return repr(key) if re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", key) else "(not a key name)"
