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
    assert lone["mean_running_batch"] <= 8
    assert out["ttft_s"]["mean"] < lone["ttft_s"]["mean"] / 2
