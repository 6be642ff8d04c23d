"""The plan file `recommend` runs: one home for the dict the CLI's `capplan recommend` and the
Python API's `capplan.recommend` build from their options, so both plan the same thing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from capplan.limits import DEFAULT_HEADROOM


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """recommend's search options (the CLI's flags; None or empty: the plan file's default)."""

    gpus: tuple[str, ...] = ()
    """Candidate GPUs (--gpu); empty: every catalog GPU."""
    tp: list[int] | None = None
    """TP sizes searched (--tp)."""
    prices: dict[str, float] = field(default_factory=dict)
    """USD per GPU-hour by GPU (--price)."""
    weight_dtypes: tuple[str, ...] = ()
    """Weight dtypes searched (--weight-dtype); empty: auto."""
    kv_dtypes: tuple[str, ...] = ()
    """KV dtypes searched (--kv-dtype); empty: auto."""
    max_num_seqs: list[int] | None = None
    max_num_batched_tokens: list[int] | None = None
    max_model_len: int | None = None
    engine: str = "vllm"
    gpu_memory_utilization: float | None = None
    calibration: str | None = None
    objective: str = "min_cost"
    headroom: float | str = DEFAULT_HEADROOM
    verify_top: int = 5
    """Recommendations the simulator checks (--verify-top; 0: none)."""
    allow_near_floor: bool = False
    engine_features: dict[str, Any] = field(default_factory=dict)
    """The plan's engine: keys of the feature options (speculation, LoRA)."""


def recommend_doc(model: str, lane: dict[str, Any], opts: SearchOptions,
                  day: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan-file dict for one lane of traffic (`lane`: a workloads: entry) under `opts`;
    `day`: the plan's day: settings when the lane is a trace or a rate curve."""
    return {
        "model": model,
        "candidates": {"gpus": list(opts.gpus) or None, "tp": opts.tp, "prices": opts.prices,
                       "weight_dtypes": list(opts.weight_dtypes) or ["auto"],
                       "kv_dtypes": list(opts.kv_dtypes) or ["auto"]},
        "engine": {"name": opts.engine.lower(), "max_num_seqs": opts.max_num_seqs,
                   "max_num_batched_tokens": opts.max_num_batched_tokens,
                   "max_model_len": opts.max_model_len,
                   "gpu_memory_utilization": opts.gpu_memory_utilization,
                   **opts.engine_features},
        "calibration": opts.calibration,
        "workloads": [lane],
        "objective": opts.objective, "headroom": opts.headroom,
        "verify": {"top": opts.verify_top},
        "allow_near_floor": opts.allow_near_floor,
        **({"day": day} if day else {}),
    }
