"""A trace's arrival column that states its unit in its name is read in that unit, whatever
its values look like; `recommend --trace` and `plan` say which unit they read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from capplan.errors import InputError
from capplan.sim.workload import load_trace, unit_from_name


@pytest.mark.parametrize(("name", "unit"), [
    ("arrival_time_s", "s"), ("timestamp_ms", "ms"), ("arrival_time_us", "us"),
    ("arrival_time_ns", "ns"), ("timestamp_seconds", "s"), ("Timestamp (ms)", "ms"),
    ("arrived_at.msec", "ms"), ("TIMESTAMP_MS", "ms"),
    ("timestamp", None), ("arrived_at", None), ("TIMESTAMP", None), ("status", None),
])
def test_unit_from_name(name, unit):
    assert unit_from_name(name) == unit


def _sparse(path: Path, column: str, scale: float = 1.0) -> Path:
    """600 requests at whole-second stamps over a day (0.007 req/s), as `scale` units."""
    t = np.sort(np.random.default_rng(1).choice(86_400, 600, replace=False))
    path.write_text(f"{column},input_tokens,output_tokens\n"
                    + "".join(f"{int(x * scale)},800,250\n" for x in t))
    return path


def test_sparse_whole_seconds_named_s_are_seconds(tmp_path: Path):
    # whole-number stamps this sparse (0.007 req/s) read as milliseconds when the name says
    # nothing (600 requests in 86 s); `arrival_time_s` says seconds: 600 over ~86,000 s
    named = load_trace(_sparse(tmp_path / "s.csv", "arrival_time_s"))
    assert named.arrival_at_s[-1] > 80_000
    assert "arrival_time_s (s, the column's name says s)" in named.note
    bare = load_trace(_sparse(tmp_path / "t.csv", "timestamp"))
    assert bare.arrival_at_s[-1] < 87  # the span rule, unchanged where the name says nothing
    # the flag still decides over the name
    assert load_trace(tmp_path / "s.csv", "ms").arrival_at_s[-1] < 87


@pytest.mark.parametrize(("column", "scale"), [("timestamp_ms", 1e3), ("arrival_time_us", 1e6),
                                               ("arrival_time_ns", 1e9)])
def test_a_unit_suffix_names_the_arrival_column_and_its_unit(tmp_path: Path, column, scale):
    s = load_trace(_sparse(tmp_path / "s.csv", "arrival_time_s"))
    t = load_trace(_sparse(tmp_path / "x.csv", column, scale))
    assert np.allclose(t.arrival_at_s, s.arrival_at_s, atol=1e-6)
    assert f"columns {column} (" in t.note


def test_no_arrival_column_names_the_suffix_form(tmp_path: Path):
    p = tmp_path / "x.csv"
    p.write_text("when_ms,input_tokens,output_tokens\n1,2,3\n")
    with pytest.raises(InputError, match=r"no arrival time column; expected one of "
                                         r"arrival_time_s, .* \(or with a unit suffix"):
        load_trace(p)


def test_recommend_trace_says_the_unit_it_read(run_cli, tmp_path: Path):
    """The audit's sparse day (600 requests in a column `arrival_time_s`) for Llama-3.1-70B:
    read as milliseconds it was 7 req/s and took TP 4; in seconds, 0.007 req/s, one TP 2
    replica. The output says which unit it read."""
    path = _sparse(tmp_path / "sparse.csv", "arrival_time_s")
    res = run_cli("recommend", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--trace",
                  str(path), "--ttft-p99", "1", "--tbt-p99", "50ms", "--replay", "none",
                  "--verify-top", "0", "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["recommendations"][0]["tp"] == 2
    assert any("columns arrival_time_s (s, the column's name says s)" in n
               for n in d["day"]["notes"])
    table = run_cli("recommend", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--trace",
                    str(path), "--ttft-p99", "1", "--tbt-p99", "50ms", "--replay", "none",
                    "--verify-top", "0")
    assert "arrival_time_s (s, the column's name says s)" in " ".join(table.stdout.split())
