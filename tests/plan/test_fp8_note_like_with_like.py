"""The fp8 note compares the fp8 fleet (analytic screen) with the plan's fleet as the same
screen plans it, and says what the simulator's replay sized (as the prefix-cache note does)."""

from __future__ import annotations

from types import SimpleNamespace as NS

from capplan.plan import alternatives


def _rec(gpu: str, tp: int, replicas: int, cost: float, replayed: bool = False) -> NS:
    return NS(candidate=NS(gpu=NS(key=gpu), settings=NS(tp=tp), sized_by_replay=replayed),
              replicas=replicas, gpus_total=replicas * tp, cost_per_hour=cost)


def _note(monkeypatch, best: NS, screened: NS) -> dict:
    alt = _rec("h100-sxm", 1, 8, 8 * 3.78)
    monkeypatch.setattr(alternatives, "_searched_best", lambda *a, **k: alt)
    return alternatives.fp8_alternative(lambda *a, **k: NS(best=screened), None, None, None,
                                        [], [best])


def test_replay_sized_best_is_compared_through_the_screen(monkeypatch) -> None:
    screened = _rec("h100-sxm", 2, 8, 16 * 3.78)  # the analytic screen's bf16 fleet: 16 GPUs
    best = _rec("h100-sxm", 2, 16, 32 * 3.78, replayed=True)  # the replay doubled it: 32
    alt = _note(monkeypatch, best, screened)
    assert "8 GPUs ($30.24/h) instead of 16 h100-sxm" in alt["note"]
    assert "instead of 32" not in alt["note"]
    assert "replay then sized this plan at 32 GPUs" in alt["note"]
    assert alt["gpu_saving_frac"] == 1 - 8 / 16


def test_screen_sized_best_is_compared_as_it_is(monkeypatch) -> None:
    best = _rec("h100-sxm", 2, 8, 16 * 3.78)
    alt = _note(monkeypatch, best, _rec("a100", 8, 8, 1.0))  # the screen is not asked again
    assert "instead of 16 h100-sxm" in alt["note"] and "replay" not in alt["note"]
