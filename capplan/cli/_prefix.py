"""Prefix-sharing options of latency, simulate and recommend (docs/prefix_caching.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from capplan import limits
from capplan.cli._options import BoundedInt, FiniteFloat
from capplan.models.prefix import PrefixSpec

_KEYS = ("shared_prefix", "shared_fraction", "prefix_hit_rate", "turns", "think_time")


def prefix_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add --shared-prefix, --shared-fraction, --prefix-hit-rate, --turns, --think-time."""
    opts = [
        click.option("--shared-prefix", type=BoundedInt(limits.TOKENS), default=None,
                     help="Tokens of a prompt prefix (a system prompt) shared by "
                          "--shared-fraction of the requests; part of --input-len."),
        click.option("--shared-fraction", type=FiniteFloat(bound=limits.SHARE_FRAC),
                     default=None, help="Fraction of requests that start with the shared "
                                        "prefix (default 1 with --shared-prefix)."),
        click.option("--prefix-hit-rate", type=FiniteFloat(bound=limits.HIT_RATE), default=None,
                     help="Fraction of prompt tokens found in the prefix cache (when the "
                          "sharing is known only as a rate)."),
        click.option("--turns", type=BoundedInt(limits.TURNS), default=None,
                     help="Multi-turn sessions: turn k resends turns 1..k-1; --input-len is "
                          "each turn's new message."),
        click.option("--think-time", type=FiniteFloat(bound=limits.THINK_S), default=None,
                     help="Seconds between a session's turns, arrival to arrival (open loop: a "
                          "turn does not wait for the previous answer, so give at least the "
                          "answer's time plus the reading; default 0: all turns at once)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def pop_prefix_spec(kw: dict[str, Any]) -> PrefixSpec | None:
    """The PrefixSpec of the options in kw (removed from it); None when none was given."""
    v = {k: kw.pop(k, None) for k in _KEYS}
    if all(x is None for x in v.values()):
        return None
    if v["shared_fraction"] is not None and v["shared_prefix"] is None:
        raise click.UsageError("--shared-fraction needs --shared-prefix")
    if v["think_time"] is not None and v["turns"] is None:
        raise click.UsageError("--think-time needs --turns")
    return PrefixSpec(
        shared_tokens=int(v["shared_prefix"] or 0),
        share_frac=(1.0 if v["shared_fraction"] is None else v["shared_fraction"])
        if v["shared_prefix"] else 0.0,
        turns=int(v["turns"] or 1), think_s=float(v["think_time"] or 0.0),
        hit_rate=v["prefix_hit_rate"])
