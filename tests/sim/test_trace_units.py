"""Trace time units detected from the span and stated in every format (issue 30).

Before: a Mooncake JSONL whose columns were renamed kept its millisecond stamps read as seconds
(0.003 req/s, 1000x slow) and `latency` printed no trace note in its table; a trace mixing
stamps with and without a UTC offset was read hours apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capplan.errors import InputError
from capplan.sim.workload import load_trace

MOONCAKE = (Path(__file__).resolve().parents[1] / "data" / "traces"
            / "mooncake_conversation_trace_head200.jsonl")
LAT = ("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm")


@pytest.fixture
def renamed(tmp_path: Path) -> Path:
    """The Mooncake excerpt with generic column names (no hash_ids: not Mooncake's schema)."""
    out = tmp_path / "renamed.jsonl"
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    out.write_text("".join(json.dumps({"timestamp": r["timestamp"], "input_tokens":
                                       r["input_length"], "output_tokens": r["output_length"]})
                           + "\n" for r in rows))
    return out


def test_renamed_millisecond_trace_is_read_in_milliseconds(renamed: Path) -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    ts = [r["timestamp"] for r in rows]
    want = (len(ts) - 1) / ((max(ts) - min(ts)) / 1000)  # req/s, the stamps in ms (README)
    t = load_trace(renamed)
    got = (len(t) - 1) / float(t.arrival_at_s[-1])
    assert got == pytest.approx(want, rel=1e-9)
    assert "(ms, whole-number stamps" in t.note
    assert load_trace(renamed, "s").arrival_at_s[-1] == pytest.approx(max(ts) - min(ts))


@pytest.mark.parametrize("fmt", ["table", "csv", "markdown", "json"])
def test_latency_states_the_trace_unit_in_every_format(run_cli, renamed: Path, fmt: str  # noqa: ANN001
                                                       ) -> None:
    r = run_cli(*LAT, "--trace", str(renamed), "--format", fmt)
    assert r.exit_code == 0, r.stderr
    assert "timestamp (ms, whole-number stamps" in r.stdout.replace("\n", " ") \
        .replace("  ", " "), r.stdout


def test_fractional_seconds_stay_seconds(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("timestamp,input_tokens,output_tokens\n0.0,10,10\n4.3,10,10\n900.5,10,10\n")
    t = load_trace(p)
    assert t.arrival_at_s[-1] == pytest.approx(900.5) and "(s, seconds)" in t.note


def test_mixed_utc_offsets_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,10\n"
                 "2023-11-16T18:15:50+05:00,10,10\n")
    with pytest.raises(InputError, match="mix stamps with a UTC offset"):
        load_trace(p)


def test_simulate_json_states_the_trace_unit(run_cli, renamed: Path) -> None:  # noqa: ANN001
    r = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace",
                str(renamed), "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert "timestamp (ms, whole-number stamps" in r.json()["load"]
