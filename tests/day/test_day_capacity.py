"""A day plan sizes its windows at the capacity the simulator sustains within the SLOs when
that is below the analytic one (plan/day_capacity.py), so a plan without headroom does not
put a replica over its capacity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from tests.day.test_window_peaks import HOUR, chat_day_plan

DIURNAL = [("00:00", 10), ("04:00", 5), ("08:00", 20), ("11:00", 35), ("15:00", 40),
           ("19:00", 30), ("22:00", 18)]
"""examples/day/diurnal.csv."""


def test_headroom_0_is_sized_at_the_simulated_capacity(run_cli, tmp_path: Path):
    """Llama-3.1-8B on H100 (800 / 250-token lognormal requests, TTFT 1 s, TBT 60 ms) over
    the example's diurnal curve, headroom 0. The analytic model gives a replica 24.26 req/s,
    but `latency --rate 24.3` finds the replay overloaded, serving 23.39 req/s: the stability
    check's capacity, above which no SLO holds. Sized at 24.26, 08:30 (23.75 req/s) got one
    replica, which the whole day's replay put at TTFT p99 1.90 s. The simulated capacity
    within the SLOs is below 23.39, and every window's count is ceil(sizing / it)."""
    (tmp_path / "diurnal.csv").write_text(
        "at,rate_per_s\n" + "".join(f"{a},{r}\n" for a, r in DIURNAL))
    plan = chat_day_plan("diurnal.csv", 0)
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    res = run_cli("plan", str(tmp_path / "plan.yaml"), "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    sim = d["day"]["simulated_capacity_per_replica_rps"]
    (note,) = [n for n in d["day"]["notes"] if "the simulator sustains" in n]
    analytic = float(note.split("below the ")[1].split(" req/s")[0])
    assert 24.0 < analytic < 24.5 and "the analytic model gave" in note
    # below what `capplan latency --rate 24.3` serves on the same replica when it reports the
    # replay overloaded (23.39 req/s): a stable rate within the SLOs cannot exceed it
    assert sim < 23.39 and sim > 0.8 * analytic
    # one capacity per replica in the output: the recommendation states the simulated one
    assert d["day"]["capacity_per_replica_rps"] == sim
    assert d["recommendations"][0]["capacity_per_replica_rps"] == sim
    for w in d["schedule"]:
        assert w["replicas"] == max(1, math.ceil(w["sizing_rps"] / sim - 1e-9)), w
    w = d["schedule"][int(8.5 * HOUR // 900)]  # 08:30-08:45: 20 + 15 x 0.75 / 3 = 23.75
    assert abs(w["sizing_rps"] - 23.75) < 1e-9 and w["replicas"] == 2
    assert d["recommendations"][0]["replicas"] == d["peak_replicas"]
