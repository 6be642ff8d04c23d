"""How the P/D replay places requests on a pool's workers (capplan.sim.pd.route: round_robin,
random, least_loaded), the workers' speed spread, and the router options of the CLI / API."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import yaml

from capplan.api import disaggregated, pd_simulate
from capplan.errors import InputError
from capplan.plan.pd_sim import spec_of
from capplan.sim.pd import SPEED_SPREAD, replay_pd, route, worker_speeds
from capplan.sim.workload import Requests


@pytest.fixture(scope="module")
def batch1():
    # Llama-3.1-8B bf16 on H100: one prefill worker, two decode workers of one sequence each
    return disaggregated("llama-3.1-8b", "h100-sxm", max_model_len=8192, prefill_workers=1,
                         decode_workers=2, decode={"max_num_seqs": 1})


def test_round_robin_is_a_counter_in_arrival_order():
    # arrivals 0.3, 0.1, 0.2, 0.0: in time order requests 3, 1, 2, 0 take workers 0, 1, 0, 1
    got = route("round_robin", np.array([0.3, 0.1, 0.2, 0.0]), 2)
    assert got.tolist() == [1, 1, 0, 0]
    # ties keep the requests' order
    assert route("round_robin", np.zeros(5), 3).tolist() == [0, 1, 2, 0, 1]


def test_random_is_reproducible_by_seed():
    at = np.arange(200) * 0.1
    a, b = route("random", at, 4, seed=3), route("random", at, 4, seed=3)
    assert np.array_equal(a, b) and set(a.tolist()) == {0, 1, 2, 3}
    assert not np.array_equal(a, route("random", at, 4, seed=4))


def test_least_loaded_counts_requests_in_flight_by_hand():
    # two workers; requests 0 and 1 at t = 0 take workers 0 and 1 (none in flight, then one on
    # worker 0); request 1 ends at 0.5, request 0 at 5.0. Request 2 at t = 1: worker 0 holds
    # one request in flight, worker 1 none -> worker 1 (round-robin's counter says worker 0)
    at, done = np.array([0.0, 0.0, 1.0]), np.array([5.0, 0.5, 9.0])
    assert route("least_loaded", at, 2, done_s=done).tolist() == [0, 1, 1]
    assert route("round_robin", at, 2).tolist() == [0, 1, 0]
    # with no finish times known (a first pass) it balances the counts: round-robin
    assert route("least_loaded", np.zeros(5), 2).tolist() == [0, 1, 0, 1, 0]


def _swapped(layout, router: str):
    # 2 clients; request 0 decodes 64 tokens, request 1 only 8, requests 2 and 3 8 each.
    # Request 1's client comes back first: its next request (2) is the third the counter
    # sees -> decode worker 0, still decoding request 0 at batch 1.
    out = np.array([64, 8, 8, 8])
    reqs = Requests(np.zeros(4), np.full(4, 512), out, np.zeros(4, np.int64), concurrency=2)
    return replay_pd(replace(spec_of(layout), decode_router=router), reqs)


def test_round_robin_with_the_order_swapped_waits_a_whole_decode(batch1):
    rr, ll = _swapped(batch1, "round_robin"), _swapped(batch1, "least_loaded")
    assert rr.decode_worker[:3].tolist() == [0, 1, 0]
    assert ll.decode_worker[:3].tolist() == [0, 1, 1]
    step = float(batch1.decode.step.decode_step(1, 512 + 32)["step_s"])
    # round-robin: request 2 is ready while request 0 still has most of its 64 tokens to go
    # (request 1's 8 tokens, the client's overhead, a prefill and a transfer have passed):
    # it is admitted only when request 0 ends, then its first step
    wait = rr.finished_at_s[0] - rr.decode_ready_at_s[2]
    assert wait > 40 * step
    assert rr.first_token_at_s[2] >= rr.finished_at_s[0]
    assert rr.first_token_at_s[2] - rr.finished_at_s[0] < 3 * step
    # least-loaded: worker 1 is idle, request 2's first token one step after it is ready
    assert ll.first_token_at_s[2] - ll.decode_ready_at_s[2] < 3 * step
    ttft = {k: r.first_token_at_s - r.sent_at_s for k, r in (("rr", rr), ("ll", ll))}
    assert ttft["rr"][2] - ttft["ll"][2] == pytest.approx(wait, abs=3 * step)
    assert ttft["ll"].mean() <= ttft["rr"].mean()  # never worse here


def test_speed_spread_scales_each_worker_by_its_factor(batch1):
    f = worker_speeds(2, SPEED_SPREAD, seed=1)
    # two workers: the quantiles 1/4 and 3/4 of the spread, 1 -+ SPEED_SPREAD / 4, in a seeded order
    assert sorted(f.tolist()) == pytest.approx([1 - SPEED_SPREAD / 4, 1 + SPEED_SPREAD / 4])
    assert np.array_equal(f, worker_speeds(2, SPEED_SPREAD, seed=1))
    assert np.all(worker_speeds(3, 0.0, seed=1) == 1.0)
    # two requests at t = 0, one per decode worker: each one's decode time (first token to
    # last) is the identical workers' times the worker's factor
    reqs = Requests(np.zeros(2), np.full(2, 512), np.full(2, 32), np.zeros(2, np.int64))
    base = replay_pd(replace(spec_of(batch1), speed_spread=0.0), reqs)
    spread = replay_pd(replace(spec_of(batch1), speed_spread=SPEED_SPREAD, seed=0), reqs)
    fd = worker_speeds(2, SPEED_SPREAD, seed=1)  # the decode pool's draw: seed + 1
    dec = lambda r: r.finished_at_s - r.first_token_at_s  # noqa: E731
    np.testing.assert_allclose(dec(spread) / dec(base), fd[spread.decode_worker], rtol=1e-9)


def test_router_options_cli_and_api(run_cli):
    args = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prefill-workers",
            "1", "--decode-workers", "2", "--rate", "4", "--requests", "30", "--input-len",
            "512", "--output-len", "16", "--max-model-len", "8192")
    ok = run_cli(*args, "--decode-router", "least_loaded", "--prefill-router", "random",
                 "--format", "json")
    assert ok.exit_code == 0 and ok.json()["num_requests"] == 30
    # least_loaded is an alias: the answer names the policy's one name (capplan.sim.routers)
    assert ok.json()["routing"] == {"prefill_router": "random",
                                    "decode_router": "least-outstanding",
                                    "worker_speed_spread": SPEED_SPREAD}
    bad = run_cli(*args, "--decode-router", "fastest")
    assert bad.exit_code == 2 and "decode router 'fastest'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    res = pd_simulate("llama-3.1-8b", "h100-sxm", prefill_workers=1, decode_workers=2,
                      rate=4.0, requests=30, input_len=512, output_len=16, max_model_len=8192,
                      decode_router="random").data
    assert res["num_requests"] == 30
    with pytest.raises(InputError, match="prefill router 'fastest'"):
        disaggregated("llama-3.1-8b", "h100-sxm", prefill_workers=1, decode_workers=1,
                      max_model_len=8192, prefill_router="fastest")
    # the P/D replay has no prefix-affinity router (the fleet's): refused, not aliased
    with pytest.raises(InputError, match="expected one of round-robin, random, "
                                         "least-outstanding"):
        disaggregated("llama-3.1-8b", "h100-sxm", prefill_workers=1, decode_workers=1,
                      max_model_len=8192, decode_router="prefix-affinity")


@pytest.mark.parametrize(("engine", "prefill", "decode", "want", "note"), [
    # sglang_router's own default is cache_aware: the line names what the replay assumed
    ("sglang", "round_robin", "round_robin",
     {"--prefill-policy": "round_robin", "--decode-policy": "round_robin"}, False),
    ("sglang", "random", "least_loaded",
     {"--prefill-policy": "random", "--decode-policy": "round_robin"}, True),
    ("trtllm", "round_robin", "least_loaded",
     {"context_servers": "round_robin", "generation_servers": "load_balancing"}, False),
    # vLLM's router (vllm-router, SGLang's fork): random and round-robin, no least-outstanding
    ("vllm", "round_robin", "random",
     {"--prefill-policy": "round_robin", "--decode-policy": "random"}, False),
    ("vllm", "random", "least_loaded",
     {"--prefill-policy": "random", "--decode-policy": "round_robin"}, True),
])
def test_front_end_line_names_the_routers(engine, prefill, decode, want, note):
    import shlex

    from capplan.plan.launch_multinode import pd_launch

    lay = disaggregated("llama-3.1-8b", "h100-sxm", prefill_workers=2, decode_workers=2,
                        max_model_len=8192, engine=engine, prefill_router=prefill,
                        decode_router=decode)
    (line,) = pd_launch(lay)["router"]
    if engine in ("sglang", "vllm"):
        words = shlex.split(line, comments=True)
        assert words[:3] == (["python", "-m", "sglang_router.launch_router"] if engine == "sglang"
                             else ["vllm-router", "--vllm-pd-disaggregation", "--prefill"])
        for flag, value in want.items():
            assert words[words.index(flag) + 1] == value
    elif engine == "trtllm":  # the disaggregated server's configuration, after `#`
        assert shlex.split(line, comments=True) == [
            "trtllm-serve", "disaggregated", "-c", "disagg_config.yaml"]
        cfg = yaml.safe_load(line.split("# disagg_config.yaml: ", 1)[1])
        for key, router in want.items():  # tensorrt_llm/llmapi/disagg_utils.py's keys
            assert cfg[key]["router"]["type"] == router
            assert cfg[key]["num_instances"] == len(cfg[key]["urls"]) == 2
    assert ("this front end has no" in line) is note
    if note:  # the router it lacks is named
        assert (("least-outstanding" in line) if decode == "least_loaded"
                else ("random" in line))
