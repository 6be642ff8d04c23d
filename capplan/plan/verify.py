"""Simulator verification of a recommendation (placeholder until the simulator API settles)."""
from __future__ import annotations

from typing import Any


def simulate_recommendation(r: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"ok": True, "reason": "", "simulated": None}
