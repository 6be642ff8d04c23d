"""A serving engine's speculative-decoding counters, read from its Prometheus /metrics.

vLLM V1 exports `vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_draft_tokens_total`
and `vllm:spec_decode_num_accepted_tokens_total` (vllm/v1/metrics/loggers.py
`SpecDecodingProm`, v0.10); its mean acceptance length is 1 + accepted / drafts. `calibrate
--endpoint` reads them before and after each level, and the difference gives the acceptance the
server reached on the level's requests; the fit pools them into the calibration parameter
`spec_acceptance_length`, which replaces the published default (capplan/models/speculative.py).
SGLang has no such counters; its /get_server_info reports `avg_spec_accept_length` in
`internal_states` (read the same way by sglang/bench_serving.py), an average over everything the
server has served since it started: `calibrate --endpoint` records it after each level when no
vLLM counters are found, and the fit takes the last level's value. Servers with neither
(speculation off, other engines) give nothing.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from capplan.probe.deadline import get

COUNTERS = {"drafts": "vllm:spec_decode_num_drafts_total",
            "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
            "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total"}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFaN]+)")


def parse_counters(text: str) -> dict[str, float]:
    """The spec-decode counters in a Prometheus text exposition, summed over label sets
    (one per engine / model); missing counters are left out."""
    names = {v: k for k, v in COUNTERS.items()}
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m or m.group(1) not in names:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(v) and v >= 0:
            key = names[m.group(1)]
            out[key] = out.get(key, 0.0) + v
    return out


def fetch_counters(target: Any, timeout_s: float) -> dict[str, float] | None:
    """GET /metrics of the endpoint's server (within min(timeout_s, 10) s of wall-clock time,
    whatever the server sends); None when it has none or cannot be read."""
    got = get(target, "/metrics", min(timeout_s, 10.0), 8 * 2**20)  # expositions: ~100 KB
    if got is None or got[0] != 200:
        return None
    found = parse_counters(got[1].decode("utf-8", "replace"))
    return found if "drafts" in found and "accepted_tokens" in found else None


def fetch_sglang_accept_length(target: Any, timeout_s: float) -> float | None:
    """SGLang's server-cumulative mean acceptance length, or None (same deadline as
    fetch_counters)."""
    got = get(target, "/get_server_info", min(timeout_s, 10.0), 2**20)
    if got is None or got[0] != 200:
        return None
    try:
        states = json.loads(got[1]).get("internal_states") or [{}]
        v = float(states[0].get("avg_spec_accept_length"))
    except (ValueError, TypeError, AttributeError, IndexError):
        return None
    return v if math.isfinite(v) and v >= 1 else None


def acceptance(before: dict[str, float] | None, after: dict[str, float] | None
               ) -> dict[str, float] | None:
    """What happened between two snapshots: drafts, tokens, and the acceptance length."""
    if not before or not after:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
    if d["drafts"] <= 0 or d["accepted_tokens"] < 0:
        return None
    out = {**d, "acceptance_length": 1.0 + d["accepted_tokens"] / d["drafts"]}
    if d["draft_tokens"] > 0:
        out["acceptance_rate"] = d["accepted_tokens"] / d["draft_tokens"]
    return out


def pooled_acceptance_length(levels: list[dict[str, Any]]) -> float | None:
    """1 + accepted / drafts over every level that recorded vLLM's counters; else the last
    level's SGLang server-cumulative figure."""
    counted = [lv["spec_decode"] for lv in levels
               if isinstance(lv.get("spec_decode"), dict) and "drafts" in lv["spec_decode"]]
    drafts = sum(d["drafts"] for d in counted)
    if drafts > 0:
        return 1.0 + sum(d["accepted_tokens"] for d in counted) / drafts
    cumulative = [lv["spec_decode"]["acceptance_length"] for lv in levels
                  if isinstance(lv.get("spec_decode"), dict)
                  and "acceptance_length" in lv["spec_decode"]]
    return float(cumulative[-1]) if cumulative else None
