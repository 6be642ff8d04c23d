"""Length distributions, arrival processes and trace files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from capplan.errors import InputError
from capplan.sim import Lane, Workload, load_trace, parse_length
from capplan.sim.workload import arrival_times, lognormal_sigma


def test_fixed_uniform_lognormal():
    rng = np.random.default_rng(0)
    assert parse_length("800").sample(rng, 3).tolist() == [800, 800, 800]
    u = parse_length("uniform:min=100,max=1000").sample(rng, 10000)
    assert u.min() >= 100 and u.max() <= 1000
    ln = parse_length("lognormal:mean=800,p99=4000")
    x = ln.sample(rng, 200000)
    assert x.mean() == pytest.approx(800, rel=0.02)
    assert np.percentile(x, 99) == pytest.approx(4000, rel=0.03)
    assert ln.mean == 800


def test_fixed_token_counts_are_whole(run_cli):
    """A fixed length is a count of tokens: 100.7 is refused (it was rounded to 101 in
    silence); 100.0 and 1e3 are whole; a distribution's mean may be fractional."""
    with pytest.raises(InputError, match=r"length '100.7': a token count is a whole number"):
        parse_length("100.7")
    assert parse_length("100.0").sample(None, 1).tolist() == [100]
    assert parse_length("1e3").sample(None, 1).tolist() == [1000]
    assert parse_length("lognormal:mean=800.5,p99=4000").mean == 800.5
    res = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "1",
                  "--input-len", "100.7")
    assert res.exit_code == 2 and res.exception is None
    assert res.stderr.strip() == ("Error: length '100.7': a token count is a whole number (e.g. "
                                  "100 or 101); a distribution's mean may be fractional "
                                  "(lognormal:mean=..,p99=..)")
    import capplan

    with pytest.raises(InputError, match="whole number"):
        capplan.latency("llama-3.1-8b", "h100-sxm", rate=1, input_len=100.7)


def test_lognormal_sigma_smaller_root():
    s = lognormal_sigma(800, 4000)
    assert math.exp(2.3263478740408408 * s - s * s / 2) == pytest.approx(5.0)
    assert s < 2.3263478740408408
    with pytest.raises(InputError, match="no lognormal"):
        parse_length("lognormal:mean=10,p99=1000")
    with pytest.raises(InputError, match="below mean"):
        parse_length("lognormal:mean=100,p99=50")


@pytest.mark.parametrize("bad", ["abc", "0", "-5", "inf", "uniform:min=5", "weird:x=1",
                                 "lognormal:mean=a,p99=3", "uniform:min=10,max=5"])
def test_bad_lengths(bad):
    with pytest.raises(InputError):
        parse_length(bad)


def test_empirical(tmp_path):
    p = tmp_path / "lens.csv"
    p.write_text("tokens\n10\n20\n30\n")
    d = parse_length(f"empirical:{p}")
    assert set(d.sample(np.random.default_rng(0), 100).tolist()) <= {10, 20, 30}
    assert d.mean == 20
    p.write_text("10\nx\n")
    with pytest.raises(InputError, match=r"lens.csv:2"):
        parse_length(f"empirical:{p}")


def test_gamma_burstiness_keeps_mean_rate():
    rng = np.random.default_rng(1)
    t = arrival_times(rng, 10.0, 100000, "gamma", 0.25)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)  # CV = 1/sqrt(shape)


def test_workload_is_deterministic_and_validated():
    wl = Workload((Lane(rate_per_s=5.0), Lane(name="b", rate_per_s=1.0, priority=1)),
                  num_requests=200)
    a, b = wl.generate(np.random.default_rng(0)), wl.generate(np.random.default_rng(0))
    assert np.array_equal(a.arrival_at_s, b.arrival_at_s)
    assert np.all(np.diff(a.arrival_at_s) >= 0)
    assert 0 < (a.lane == 1).sum() < 100
    for lane, n in [(Lane(rate_per_s=-1.0), 10), (Lane(rate_per_s=math.inf), 10),
                    (Lane(rate_per_s=1.0), 0), (Lane(), 10)]:
        with pytest.raises(InputError):
            Workload((lane,), num_requests=n).generate(np.random.default_rng(0))


def test_trace_csv_jsonl_azure(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_time_s,input_tokens,output_tokens\n1.5,100,20\n0.5,50,10\n")
    r = load_trace(p)
    assert r.arrival_at_s.tolist() == [0.0, 1.0]
    assert r.input_tokens.tolist() == [50, 100]
    j = tmp_path / "t.jsonl"
    j.write_text(json.dumps({"timestamp": 3, "prompt_tokens": 7, "output_tokens": 2}) + "\n"
                 + json.dumps({"timestamp": 4, "prompt_tokens": 8, "output_tokens": 3}) + "\n")
    assert load_trace(j).output_tokens.tolist() == [2, 3]
    az = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    r = load_trace(az)
    assert r.arrival_at_s.tolist() == pytest.approx([0.0, 4.314579])
    assert r.output_tokens.tolist() == [44, 109]


@pytest.mark.parametrize("text, msg", [
    ("when,input_tokens,output_tokens\n1,2,3\n", r"t.csv:1: no arrival time column; expected "
                                                 r"one of arrival_time_s, arrived_at, timestamp"),
    ("timestamp,input_tokens,output_tokens\n1,2,3\n2,-4,3\n", r"t.csv:3: input_tokens '-4'"),
    ("timestamp,input_tokens,output_tokens\n1,2,3\n2,4,x\n", r"t.csv:3: output_tokens 'x'"),
    ("timestamp,input_tokens,output_tokens\n", r"t.csv: empty trace"),
    ("timestamp,prompt_tokens\n1,2\n", r"t.csv:1: no output tokens column"),
])
def test_bad_traces(tmp_path, text, msg):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(InputError, match=msg):
        load_trace(p)


def test_bad_jsonl_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 1, "input_tokens": 2, "output_tokens": 3}\n{oops\n')
    with pytest.raises(InputError, match=r"t.jsonl:2: not valid JSON"):
        load_trace(p)


# ---------------------------------------------------------------------------------------------
# Real (excerpted) public traces, tests/data/traces (sources in SOURCES.md)
# ---------------------------------------------------------------------------------------------
TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"


def test_mooncake_trace_milliseconds():
    # conversation_trace.jsonl, first 200 lines: timestamps 0 ... 72000 (ms, per the Mooncake
    # README); 199 gaps over 72 s = 2.764 req/s (read as seconds it would be 1000x lower)
    r = load_trace(TRACES / "mooncake_conversation_trace_head200.jsonl")
    assert len(r) == 200 and r.arrival_at_s[-1] == pytest.approx(72.0)
    assert (len(r) - 1) / r.arrival_at_s[-1] == pytest.approx(199 / 72.0)
    assert r.input_tokens[0] == 6758 and r.output_tokens[0] == 500
    assert "timestamp (ms" in r.note and "input_length" in r.note
    # an explicit unit wins
    assert load_trace(TRACES / "mooncake_conversation_trace_head200.jsonl",
                      "s").arrival_at_s[-1] == pytest.approx(72000.0)


def test_vidur_trace_seconds():
    # splitwise_conv.csv head: arrived_at 0.0 ... 61.26..., the Azure conversation trace's
    # first rows re-based (0.0,374,44 and 4.314579,396,109 as in the Azure test above)
    r = load_trace(TRACES / "vidur_splitwise_conv_head200.csv")
    assert len(r) == 200
    assert r.arrival_at_s[1] == pytest.approx(4.314579)
    assert (r.input_tokens[1], r.output_tokens[1]) == (396, 109)
    last = float(Path(TRACES / "vidur_splitwise_conv_head200.csv").read_text()
                 .splitlines()[-1].split(",")[0])
    assert (len(r) - 1) / r.arrival_at_s[-1] == pytest.approx(199 / last)
    assert "arrived_at (s" in r.note and "num_prefill_tokens" in r.note


def test_burstgpt_trace_seconds():
    # BurstGPT_1.csv head: Timestamp 5, 45, 118 s -> arrivals 0, 40, 113; 2 gaps / 113 s
    r = load_trace(TRACES / "burstgpt_1_head3.csv")
    assert r.arrival_at_s.tolist() == [0.0, 40.0, 113.0]
    assert r.input_tokens.tolist() == [472, 1087, 417]
    assert r.output_tokens.tolist() == [18, 230, 276]
    assert "Request tokens" in r.note


def test_epoch_stamps_recognised(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("timestamp,input_tokens,output_tokens\n1700000000000,10,5\n1700000000500,10,5\n")
    assert load_trace(p).arrival_at_s.tolist() == [0.0, 0.5]  # epoch milliseconds
    with pytest.raises(InputError, match="--time-unit 'h'"):
        load_trace(p, "h")


def test_simulate_trace_cli_says_columns(run_cli):
    res = run_cli("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace",
                  str(TRACES / "burstgpt_1_head3.csv"), "--format", "json")
    assert res.exit_code == 0, res.stderr
    assert "columns Timestamp (s, seconds), Request tokens, Response tokens" in res.stderr
