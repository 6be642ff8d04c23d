"""What `latency` and the API answer on a fixed P/D layout, beside the replay's mechanics
(tests/disagg/test_pd_replay.py): quantiles of the closed loop, a saturated open loop, the
API's refusals."""

from __future__ import annotations

import pytest

from capplan.api import disaggregated, pd_latency, pd_simulate
from capplan.errors import InputError
from capplan.plan.load import load_spec_from_options
from capplan.plan.pd import pd_latency as analytic_pd_latency

LAYOUT = {"prefill_workers": 1, "decode_workers": 2}


def test_closed_loop_ttft_quantiles_are_the_prefill_queues() -> None:
    """The closed loop's TTFT p50/p90/p99 come from the prefill pool's queue at the cycle's
    rate, not its mean copied (before: p50 and p90 were the mean plus the transfer's spread,
    0.1127 / 0.1130 s against a mean of 0.1127 s): prompts of 200-3,000 tokens spread the
    prefill time, so p50 is below the mean and p90 well above it."""
    lay = disaggregated("llama-3.1-8b", "h100-sxm", max_model_len=8192, **LAYOUT)
    load = load_spec_from_options(None, 32, None, "uniform:min=200,max=3000", "200", 1.0,
                                  lay.decode.memory.max_model_len)
    ttft = analytic_pd_latency(lay, load)["ttft_s"]
    assert ttft["p50"] < 0.97 * ttft["mean"] and ttft["p90"] > 1.1 * ttft["mean"], ttft


def test_a_saturated_open_loop_is_not_replayed() -> None:
    """One prefill worker offered 40 req/s of 4,096-token prompts is past its capacity: the
    answer names the saturated pool and its reason, with no latencies from a finite replay."""
    res = pd_latency("llama-3.1-8b", "h100-sxm", rate=40, input_len=4096, output_len=64,
                     max_model_len=8192, **LAYOUT).data
    assert res["stable"] is False and "prefill" in res["saturated_pools"]
    assert res["answered_by"].startswith("analytic") and "saturated" in res["reason"]
    assert res["ttft_s"]["mean"] is None


@pytest.mark.parametrize(("kw", "fragment"), [
    ({"seed": -1}, "seed"), ({"requests": 0}, "requests"), ({"rate": -1.0}, "rate")])
def test_pd_simulate_refuses_what_simulate_refuses(kw, fragment) -> None:
    args = {"rate": 1.0, **kw}
    with pytest.raises(InputError, match=fragment):
        pd_simulate("llama-3.1-8b", "h100-sxm", max_model_len=8192, **LAYOUT, **args)


def test_a_trace_on_a_layout_is_capped_before_the_replay(run_cli) -> None:  # noqa: ANN001
    """The trace's own output tokens count against `sim_tokens` on a layout too (they were
    checked for one replica only): 200 conversations hold far more than 1,000 tokens."""
    from pathlib import Path

    trace = Path(__file__).resolve().parents[1] / "data" / "traces" / \
        "vidur_splitwise_conv_head200.csv"
    r = run_cli("--limit", "sim_tokens=1000", "simulate", "--model", "llama-3.1-8b", "--gpu",
                "h100-sxm", "--prefill-workers", "1", "--decode-workers", "2", "--trace",
                str(trace))
    assert r.exit_code == 2, r.stdout
    assert "sim_tokens" in r.stderr and "output tokens" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_replayed_layout_still_prints_its_launch_lines(run_cli) -> None:  # noqa: ANN001
    """A closed loop on a layout is answered by the replay, whose table had dropped the launch
    lines the analytic table prints: one line per worker and the router's."""
    r = run_cli("latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prefill-workers",
                "1", "--decode-workers", "2", "--concurrency", "16", "--num-prompts", "48",
                "--input-len", "1000", "--output-len", "100")
    assert r.exit_code == 0, r.stderr
    assert "answered by: replay" in r.stdout
    lines = r.stdout.split("launch (one line per host", 1)[1].splitlines()[1:]
    assert sum("vllm serve" in x for x in lines) == 3 and any("router" in x for x in lines)


def test_the_check_replays_with_the_seed_asked() -> None:
    """`latency --seed` reaches the replay that checks a layout's analytic answer (it was
    fixed at 0): random prompt lengths drawn with two seeds give two replays."""
    kw = {"rate": 5, "input_len": "uniform:min=200,max=3000", "output_len": 100,
          "max_model_len": 8192, **LAYOUT}
    a = pd_latency("llama-3.1-8b", "h100-sxm", seed=0, **kw).data["analytic_check"]
    b = pd_latency("llama-3.1-8b", "h100-sxm", seed=7, **kw).data["analytic_check"]
    assert a["rel_diff"]["ttft_s"] != b["rel_diff"]["ttft_s"]
