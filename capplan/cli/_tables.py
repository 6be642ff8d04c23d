"""Shared tables of latency results (ms), used by latency, simulate and plan."""

from __future__ import annotations

from typing import Any

from capplan.cli._render import Column, render_rows


def latency_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for metric, label in (("ttft_s", "TTFT"), ("tbt_s", "TBT"), ("e2e_s", "E2E")):
        d = res.get(metric) or {}
        rows.append({"metric": label, **{k: d.get(k) for k in ("mean", "p50", "p90", "p99")}})
    return rows


def latency_table(res: dict[str, Any], fmt: str) -> str:
    if not res.get("stable", True):
        if fmt in ("csv", "markdown"):
            row = {k: res.get(k) for k in ("stable", "offered_requests_per_s",
                                           "capacity_requests_per_s", "bound", "reason")}
            return render_rows([row], [Column(k, k) for k in row], fmt)
        return (f"UNSTABLE: {res.get('reason', 'arrivals exceed capacity')}; capacity is about "
                f"{res.get('capacity_requests_per_s', float('nan')):.2f} requests/s per replica")
    ms = lambda x: x * 1e3  # noqa: E731
    cols = [Column("metric", "latency"), Column("mean", "mean (ms)", ms, ".1f"),
            Column("p50", "p50 (ms)", ms, ".1f"), Column("p90", "p90 (ms)", ms, ".1f"),
            Column("p99", "p99 (ms)", ms, ".1f")]
    text = render_rows(latency_rows(res), cols, fmt)
    thr = [
        {"q": "requests (1/s)", "v": f"{res['requests_per_s']:.3f}"},
        {"q": "output tokens (tok/s)", "v": f"{res['output_tokens_per_s']:.0f}"},
        {"q": "input tokens (tok/s)", "v": f"{res['input_tokens_per_s']:.0f}"},
        {"q": "mean running batch", "v": f"{res['mean_running_batch']:.1f}"},
        {"q": "KV peak utilization", "v": f"{res['kv_peak_utilization']:.0%}"},
        {"q": "bound", "v": res.get("bound", "")},
        {"q": "calibration", "v": res.get("calibration", "")},
    ]
    return text + "\n\n" + render_rows(thr, [Column("q", "throughput"), Column("v", "value")],
                                       fmt)
