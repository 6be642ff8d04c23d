"""Attention DP in closed-loop replays: each rank schedules its own batch, so a replica of dp
ranks runs dp x a rank's running-sequence cap (capplan.plan.deployment.Deployment.limits),
over the dp ranks' pooled KV blocks (Deployment.pool)."""

from __future__ import annotations

import pytest

import capplan
from capplan.plan.verify import simulate_closed_loop


@pytest.fixture(scope="module")
def dp2():
    # 2 ranks of 8 running sequences each: the replica runs 16
    return capplan.deployment("gpt-oss-120b", "b200", attention_dp=2, expert_parallel=2,
                              max_num_seqs=8)


def test_replica_runs_every_ranks_batch(dp2):
    assert dp2.limits.max_num_seqs == 16
    out = simulate_closed_loop(dp2, 16, 256, 64, requests=48)
    # 16 clients fit the two ranks' 16 slots: none waits for a slot, so after the start-up
    # wave all 16 decode together (a rank's 8 would leave half the clients queued: batch <= 8)
    assert out["mean_running_batch"] > 12
    # the same 16 clients on one rank's cap: half of them queue for a slot
    one = capplan.deployment("gpt-oss-120b", "b200", max_num_seqs=8)
    lone = simulate_closed_loop(one, 16, 256, 64, requests=48)
    assert lone["mean_running_batch"] <= 8 + 1e-9  # a time-weighted mean: rounding
    assert out["ttft_s"]["mean"] < lone["ttft_s"]["mean"] / 2


def test_each_rank_chunks_its_own_prompt():
    # 4 ranks of 1,024 tokens a step each: the replica's budget is 4,096, but one 4,000-token
    # prompt runs on one rank, 1,024 tokens a step (vLLM's engine core per DP rank, SGLang's
    # chunked_prefill_size / dp per rank): four chunks after 0, 1,024, 2,048 and 3,072 cached
    # tokens, the last one's step giving the first token; TTFT = the four steps (written out
    # with StepModel.step) + the request overhead
    from capplan.models.perf import chunk_attention

    d = capplan.deployment("gpt-oss-120b", "b200", attention_dp=4, expert_parallel=4,
                           max_num_batched_tokens=1024)
    assert d.limits.max_num_batched_tokens == 4096
    s = d.step
    want = float(s.request_overhead_s)
    for p in (0, 1024, 2048, 3072):
        c = min(1024, 4000 - p)
        pairs, pairs_w, read_w = chunk_attention(c, p, float(s.window))
        want += float(s.step(prefill_tokens=c, prefill_pairs=pairs, prefill_pairs_window=pairs_w,
                             prefill_kv_read=p, prefill_kv_read_window=read_w,
                             num_prefill_seqs=1, num_logits=int(p == 3072),
                             detail=False)["step_s"])
    out = simulate_closed_loop(d, 1, 4000, 2, requests=1)
    assert out["ttft_s"]["mean"] == pytest.approx(want, rel=1e-9)
