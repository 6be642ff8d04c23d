"""`recommend`'s disaggregated plan is sized while the verification workers simulate, for the
GPU type of the best before verification (planner.run_plan); the answer reads it only when the
verified best has that type, and sizes the plan for the verified best's type otherwise."""

from __future__ import annotations

from types import SimpleNamespace

from capplan.plan import planner


def _result(gpu_key: str) -> SimpleNamespace:
    cand = SimpleNamespace(gpu=SimpleNamespace(key=gpu_key), binding_constraint="TTFT SLO")
    return SimpleNamespace(best=SimpleNamespace(candidate=cand, gpus_total=2,
                                                cost_per_hour=4.0))


def test_an_early_plan_is_read_only_for_its_gpu_type(monkeypatch):
    sized = []

    def plan_for(cat, plan, resolved, lanes, key):  # noqa: ANN001, ANN202, ARG001
        sized.append(key)

    monkeypatch.setattr(planner, "_disaggregated_plan", plan_for)
    # the early plan is of the verified best's type: read, nothing sized again
    out = planner._disaggregated(None, None, None, [], _result("h100-sxm"), {"h100-sxm": None})
    assert sized == [] and out["winner"] == "aggregated"
    # the verified best changed type: its own plan is sized
    planner._disaggregated(None, None, None, [], _result("a100-sxm-80gb"), {"h100-sxm": None})
    assert sized == ["a100-sxm-80gb"]
