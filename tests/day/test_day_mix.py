"""Each window of a day plan is sized at its own lane mix (plan/day_mix.py): a lane that
peaks at another hour changes a replica's capacity there."""

from __future__ import annotations

import numpy as np
import pytest

from capplan.catalog.loader import load_catalog
from capplan.plan.day_mix import MIX_STEP, _mix_groups
from capplan.plan.day_run import run_day_plan
from capplan.plan.planner import run_plan
from capplan.plan.rate_curve import WindowSeries
from capplan.plan.schema import PlanFile

ENGINE = {"max_num_seqs": [128], "max_num_batched_tokens": [2048]}
SLO = {"ttft_p99_s": 2.0, "tbt_p99_s": "60ms"}


def _lane(name: str, inp: int, out: int, **load) -> dict:
    return {"name": name, "input_len": inp, "output_len": out, "slo": SLO, **load}


def test_mix_groups_by_hand():
    # three windows: lanes at (3, 1), (6, 2) (the same shares, 3/4 and 1/4) and (0, 5)
    z = np.zeros(3)
    s = WindowSeries(z, z + 1, z, z, z, z, "t", sizing_rps=np.array([4.0, 8.0, 5.0]),
                     lane_rps=np.array([[3.0, 6.0, 0.0], [1.0, 2.0, 5.0]]))
    group, shares = _mix_groups(s, 2)
    assert group[0] == group[1] != group[2]
    assert shares[group[0]].tolist() == pytest.approx([0.75, 0.25])
    # a lane at 0 keeps a trickle (1e-3 before the shares are normalised)
    assert shares[group[2]].tolist() == pytest.approx([1e-3 / 1.001, 1 / 1.001])
    # shares are rounded to MIX_STEP: 0.7501 and 0.75 are one mix
    s2 = WindowSeries(z[:2], z[:2] + 1, z[:2], z[:2], z[:2], z[:2], "t",
                      lane_rps=np.array([[0.7501, 0.75], [0.2499, 0.25]]))
    assert len(set(_mix_groups(s2, 2)[0])) == 1 and MIX_STEP == 1 / 256


def _night_rag_plan(replay: str) -> dict:
    """A chat lane (500 / 200 tokens) from 2 req/s at 02:00 to 30 at 14:00 and a RAG lane
    (8,000 / 300) from 6 to 1, Llama-3.1-8B on one H100, headroom 20%, the day replay as
    `replay` says."""
    lanes = [_lane("chat", 500, 200, rate_curve=[{"at": "02:00", "rate_per_s": 2},
                                                 {"at": "14:00", "rate_per_s": 30}]),
             _lane("rag", 8000, 300, rate_curve=[{"at": "02:00", "rate_per_s": 6},
                                                 {"at": "14:00", "rate_per_s": 1}])]
    return {"version": 1, "model": "llama-3.1-8b", "engine": ENGINE, "headroom": 0.2,
            "candidates": {"gpus": ["h100-sxm"], "tp": [1]}, "workloads": lanes,
            "day": {"window_s": 900, "replay": replay}, "verify": {"top": 0}}


def test_night_rag_mix_sizes_the_night():
    """A chat lane (500 / 200 tokens) from 2 req/s at 02:00 to 30 at 14:00, and a RAG lane
    (8,000 / 300) from 6 req/s at 02:00 to 1 at 14:00, on Llama-3.1-8B / H100, headroom 20%.
    The window 02:00-02:15 is sized for 8.48 req/s (chat 2.58, RAG 5.90 at 02:15, its
    highest); the steady planner at that mix (an independent search) gives a replica's
    capacity c, so the window needs ceil(8.48 x 1.2 / c) replicas (c ~4.9: 3). Sized with the
    14:00 mix (30.3 req/s per replica) it got 1, which replays at TTFT p99 ~1,600 s."""
    doc = _night_rag_plan("none")
    cat = load_catalog()
    d = run_day_plan(cat, PlanFile.model_validate(doc)).to_dict()
    w = d["schedule"][8]  # 02:00
    # by hand: at 02:15 chat = 2 + 28 x 0.25 / 12 = 2.583, RAG = 6 - 5 x 0.25 / 12 = 5.896
    assert w["sizing_rps"] == pytest.approx(2 + 28 * 0.25 / 12 + 6 - 5 * 0.25 / 12)
    steady = {**doc, "workloads": [
        _lane("chat", 500, 200, rate_per_s=2 + 28 * 0.25 / 12),
        _lane("rag", 8000, 300, rate_per_s=6 - 5 * 0.25 / 12)]}
    steady.pop("day")
    c = run_plan(cat, PlanFile.model_validate(steady), False).best.candidate.max_rate_per_s
    assert c < 10  # the RAG prompts make the night's replica far slower than the day's
    assert w["replicas"] == int(np.ceil(w["sizing_rps"] * 1.2 / c)) == 3
    peak = d["schedule"][55]  # 13:45-14:00, sized for 31 req/s at 14:00 (the day's peak)
    assert peak["replicas"] == 2
    # the recommendation is the schedule's peak fleet: the night's 3 replicas, not the 2 of
    # the busiest window's traffic
    assert d["recommendations"][0]["replicas"] == d["peak_replicas"] == 3
    assert any("its own lane mix" in n for n in d["day"]["notes"])


def test_several_lanes_replayed_at_the_peak(run_cli, tmp_path):
    """The same two lanes with the replay on: the simulated capacity replays the peak window's
    two-lane mix on one replica (its requests in one queue, as the day replay's; the lanes'
    indices once reached the engine and failed), and the peak window's count is
    ceil(31 x 1.2 / that capacity)."""
    import json

    import yaml

    doc = _night_rag_plan("peak")
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(doc))
    res = run_cli("plan", str(tmp_path / "mix.yaml"), "--format", "json")
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    sim = d["day"]["simulated_capacity_per_replica_rps"]
    assert 0 < sim <= d["recommendations"][0]["capacity_per_replica_rps"]
    peak = d["schedule"][d["day"]["peak"]["window"]]
    assert peak["sizing_rps"] == pytest.approx(31.0)
    assert peak["replicas"] == int(np.ceil(31.0 * 1.2 / d["day"]["capacity_per_replica_rps"]
                                           - 1e-9))
    assert peak["replay"]["planned"]["meets_slo"]
