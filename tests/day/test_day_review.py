"""Two edges of the day replay's corrections, with stand-in replays (hand figures)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from capplan.plan import day_capacity, day_replay
from capplan.plan.slo import SloSet
from tests.day.test_replay_slos import _Day

NEED = [1, 10, 1]
"""Replicas each window needs in the stand-in replay (window 1's need is out of reach)."""


def _replay(part, dep, w, lo, hi, slos):  # noqa: ANN001, ARG001 (replay_range's signature)
    out = []
    for x in w[lo:hi]:
        i = int(x.start_s // 900)
        att = min(1.0, x.replicas / NEED[i])  # each replica helps until the need is met
        out.append({"ttft_p99_s": 0.5 if att >= 1 else 5.0 / att, "attainment": att,
                    "unfinished": 0, "overloaded": False})
    return out


def test_a_window_that_still_misses_keeps_its_added_replicas(monkeypatch):
    # Planned [1, 2, 1]; window 1 needs 10. Each round adds one replica to it (2 -> 6 after
    # MAX_ROUNDS = 4), still short, so giving any back cannot be judged harmless: the plan
    # keeps 6 there and says the window still misses.
    monkeypatch.setattr(day_replay, "_replay_range", _replay)
    assert day_replay.MAX_ROUNDS == 4
    reps, added, _, _, notes = day_replay._correct(None, None, _Day([1, 2, 1]), 0, 3,
                                                   SloSet(ttft_p99_s=1.0))
    assert reps.tolist() == [1, 6, 1] and added.tolist() == [0, 4, 0]
    assert any("still miss" in n for n in notes)


def test_no_simulated_rate_meeting_the_slos_keeps_the_analytic_sizing(monkeypatch):
    # The bisection found no rate that meets the SLOs (capacity 0): scaling every window by
    # 0 / analytic would divide by zero downstream; the sizing stays and a note says why.
    monkeypatch.setattr(day_capacity, "simulated_capacity",
                        lambda *a, **k: day_capacity.CapacityCheck(0.0))
    monkeypatch.setattr(day_replay, "replica_deployment", lambda *a, **k: None)
    size = SimpleNamespace(capacity_rps=np.array([4.0, 8.0]))
    plan = SimpleNamespace(model="m", workloads=[SimpleNamespace(slo=None)])
    out, check, notes = day_capacity.sized_at_simulated(None, plan, None, size, 1, 900.0)
    assert out is size and check.rate_rps == 0.0
    assert len(notes) == 1 and "analytic capacity" in notes[0]
