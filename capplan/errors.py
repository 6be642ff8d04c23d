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
    errs = plain_errors(e)
    err = next((x for x in errs if x["type"] == "extra_forbidden"), errs[0])
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        near = nearest(str(loc[-1]), list(valid_keys), 1, cutoff=0.5) if valid_keys else []
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return loc, f"unknown key {shown_key(key)}{hint}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "too_short" and (err.get("ctx") or {}).get("actual_length") == 0:
        msg = "an empty list: give at least one value" + (
            "" if loc and loc[-1] in ("workloads", "models") else
            ", or leave the key out for its default")
    return loc, f"{key or 'file'}: {msg.splitlines()[0] if msg else err['type']}"


_BRANCH_TAG = r"str|int|float|bool|bytes|none|[A-Z]\w*|[\w-]+\[.*\]"
"""How pydantic names a union's branch in an error location ('str', 'list[CurvePoint]',
'CurvePoint'); capplan's own keys are snake_case, never one of these."""


def _is_tag(part: Any) -> bool:
    import re

    return isinstance(part, str) and re.fullmatch(_BRANCH_TAG, part) is not None


def plain_errors(e: Any) -> list[dict[str, Any]]:
    """A ValidationError's errors (input never included) with unions resolved.

    A value that fails a union (`rate_curve: str | list[CurvePoint]`) gets an error from every
    branch, each under the branch's tag: `rate_curve.str: Input should be a valid string`
    beside `rate_curve.list[CurvePoint].0.rate_per_s: ... >= 0`. The branch the value is
    shaped for is the one that went past the type check, so a branch's bare type mismatch is
    dropped where another branch of the same value has other errors; where every branch only
    mismatched, one error lists what the value may be. Tags are dropped from locations.
    (A miss is an error whose location ends at a tag; the shaped branch's go deeper.)
    """
    errs = [dict(x) for x in e.errors(include_input=False)]

    def miss(x: dict[str, Any]) -> bool:
        return bool(x["loc"]) and _is_tag(x["loc"][-1]) and str(x["type"]).endswith("_type")

    out: list[dict[str, Any]] = []
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for x in errs:
        loc = tuple(x["loc"])
        if miss(x):
            base = loc[:-1]
            if any(tuple(y["loc"])[:len(base)] == base and len(y["loc"]) > len(loc)
                   for y in errs):
                continue  # the value was shaped for another branch: its errors say why
            if base in merged:  # every branch mismatched: "a valid string or a valid list"
                merged[base]["msg"] += " or " + str(x["msg"]).removeprefix("Input should be ")
                continue
            x = merged[base] = {**x, "loc": base}
        x["loc"] = tuple(p for p in x["loc"] if not _is_tag(p))
        out.append(x)
    return out or errs


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
