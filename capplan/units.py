"""The one home of unit constants, parsing and printing.

Everything inside capplan is SI: bytes, seconds, FLOP/s, bytes/s. Human units appear only at
the edges: YAML keys name their unit (``memory_mib``, ``memory_bandwidth_gb_per_s``) and are
converted here, once; tables convert back for display.
"""

from __future__ import annotations

import math
import re

KIB_BYTES = 2**10
MIB_BYTES = 2**20
GIB_BYTES = 2**30
KB_BYTES = 10**3
MB_BYTES = 10**6
GB_BYTES = 10**9
TB_BYTES = 10**12
TERA = 10**12
GIGA = 10**9
MS_S = 1e-3
US_S = 1e-6

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,
    "mxfp4": 0.5,
    "nvfp4": 0.5,
}
"""Storage bytes per element, before any group-scale overhead (see models/memory.py)."""


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers: cdiv(17, 16) == 2."""
    return -(-a // b)


def gib_to_bytes(gib: float) -> float:
    return gib * GIB_BYTES


def mib_to_bytes(mib: float) -> float:
    return mib * MIB_BYTES


def gb_per_s_to_bytes_per_s(gb_per_s: float) -> float:
    return gb_per_s * GB_BYTES


def tflops_to_flops_per_s(tflops: float) -> float:
    return tflops * TERA


def bytes_to_gib(n_bytes: float) -> float:
    return n_bytes / GIB_BYTES


def bytes_to_gb(n_bytes: float) -> float:
    return n_bytes / GB_BYTES


def s_to_ms(seconds: float) -> float:
    return seconds / MS_S


_SIZE_UNITS = {
    "b": 1, "kb": KB_BYTES, "mb": MB_BYTES, "gb": GB_BYTES, "tb": TB_BYTES,
    "kib": KIB_BYTES, "mib": MIB_BYTES, "gib": GIB_BYTES, "tib": 2**40,
}
_TIME_UNITS = {"s": 1.0, "ms": MS_S, "us": US_S, "µs": US_S, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUM_UNIT = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([a-zA-Zµ]*)\s*$")


def _split(text: str) -> tuple[float, str]:
    m = _NUM_UNIT.match(str(text))
    if not m:
        raise ValueError(f"not a number with a unit: {text!r}")
    return float(m.group(1)), m.group(2).lower()


def parse_bytes(text: str | float) -> float:
    """'80GiB' -> 85899345920.0; a bare number is bytes."""
    if isinstance(text, int | float):
        return float(text)
    value, unit = _split(text)
    unit = unit or "b"
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit {unit!r} in {text!r} (use B, GB, GiB, MiB...)")
    return value * _SIZE_UNITS[unit]


CLOCK_PATTERN = r"^\s*(([01]?[0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]+)?)?|24:00(:00)?)\s*$"
"""A time of day as a rate curve's `at` may write it ('09:00', '9:30:15', '24:00'): the
planner's check (plan/rate_curve._clock) and the plan file's JSON Schema."""


def parse_seconds(text: str | float) -> float:
    """'50ms' -> 0.05; a bare number is seconds (YAML `true` is not 1 s)."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration (give seconds, e.g. 1.0 or '800ms')")
    if isinstance(text, int | float):
        return float(text)
    value, unit = _split(text)
    unit = unit or "s"
    if unit not in _TIME_UNITS:
        raise ValueError(f"unknown time unit {unit!r} in {text!r} (use s, ms, us)")
    return value * _TIME_UNITS[unit]


def is_finite_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def ci(word: str) -> str:
    """A regex of `word` in any case (JSON Schema patterns take no flags): 'ms' -> '[mM][sS]'.
    A letter whose upper case does not come back to it ('µ' -> 'Μ' -> 'μ') is kept as is: the
    planner lower-cases what it reads."""
    return "".join(f"[{c.lower()}{c.upper()}]"
                   if c.isalpha() and c.lower() != c.upper() and c.upper().lower() == c
                   else re.escape(c) for c in word)
