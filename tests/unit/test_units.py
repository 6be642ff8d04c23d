"""capplan.units: constants, parsing and conversions, checked against hand-written numbers."""

from __future__ import annotations

import math

import pytest

from capplan import units
from capplan.units import (
    DTYPE_BYTES,
    bytes_to_gb,
    bytes_to_gib,
    cdiv,
    gb_per_s_to_bytes_per_s,
    gib_to_bytes,
    is_finite_number,
    mib_to_bytes,
    parse_bytes,
    parse_seconds,
    s_to_ms,
    tflops_to_flops_per_s,
)


def test_binary_and_decimal_constants():
    assert units.KIB_BYTES == 1024
    assert units.MIB_BYTES == 1_048_576
    assert units.GIB_BYTES == 1_073_741_824
    assert units.GB_BYTES == 1_000_000_000
    assert units.TB_BYTES == 1_000_000_000_000


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (17, 16, 2),  # vLLM: a 17-token sequence needs 2 blocks of 16
        (16, 16, 1),
        (1, 16, 1),
        (0, 16, 0),
        (32, 16, 2),
        (33, 16, 3),
        (4095, 16, 256),  # Gemma-2 window 4096: (W - 1) / 16 rounds up to 256
    ],
)
def test_cdiv(a, b, expected):
    assert cdiv(a, b) == expected


@pytest.mark.parametrize(
    ("dtype", "nbytes"),
    [("fp32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 1), ("int8", 1), ("int4", 0.5),
     ("fp4", 0.5), ("mxfp4", 0.5), ("nvfp4", 0.5)],
)
def test_dtype_bytes(dtype, nbytes):
    assert DTYPE_BYTES[dtype] == nbytes


def test_conversions_round_trip():
    # 80 GiB = 80 * 1024^3 = 85,899,345,920 B
    assert gib_to_bytes(80) == 85_899_345_920
    assert bytes_to_gib(85_899_345_920) == 80
    # H100 NVML total 81559 MiB = 81559 * 1,048,576 = 85,520,809,984 B
    assert mib_to_bytes(81559) == 85_520_809_984
    # 3350 GB/s = 3.35e12 B/s; 989.4 TFLOPS = 9.894e14 FLOP/s
    assert gb_per_s_to_bytes_per_s(3350) == 3.35e12
    assert tflops_to_flops_per_s(989.4) == pytest.approx(9.894e14)
    assert bytes_to_gb(2e9) == 2
    assert s_to_ms(0.05) == pytest.approx(50)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 2**30),
        ("80 GiB", 80 * 2**30),
        ("80GB", 80e9),
        ("1.5 MiB", 1.5 * 2**20),
        ("512", 512),
        ("2kib", 2048),
        ("1e3 B", 1000),
        (42, 42.0),
        (0.5, 0.5),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("50ms", 0.05), ("2", 2.0), ("2 s", 2.0), ("100us", 1e-4), ("1.5m", 90.0), ("1h", 3600.0),
     (0.25, 0.25)],
)
def test_parse_seconds(text, expected):
    assert parse_seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["abc", "80 parsecs", "GiB", "", "1..2GB"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)


@pytest.mark.parametrize("bad", ["abc", "5 weeks", "ms"])
def test_parse_seconds_rejects(bad):
    with pytest.raises(ValueError):
        parse_seconds(bad)


@pytest.mark.parametrize(
    ("x", "ok"),
    [(1, True), (0.0, True), (-3.5, True), (math.nan, False), (math.inf, False),
     (True, False), ("1", False), (None, False)],
)
def test_is_finite_number(x, ok):
    assert is_finite_number(x) is ok
