"""The plan's workload as requests a benchmark client sends to one replica, and the dataset
files each client reads (capplan/plan/bench_cmds.py names the clients and their sources).

The requests are drawn from the plan's lanes as the simulator draws them (capplan.sim.workload:
the lanes' arrival processes and length distributions, at the per-replica rate), or replay a
trace's timestamps (every `replicas`-th request: one replica's share of a round-robin router).
A prompt of n tokens is n - 1 common English words (about one token each for Llama and GPT
tokenizers, plus the BOS token), drawn per request from a seeded generator: no two prompts
share their first block, so a server's prefix cache (hash-chained blocks) finds no hit the plan
did not count on. The lengths the server counts are the planned ones within a few tokens; the
clients report what they measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.export.atomic import atomic_write_text
from capplan.plan.bench_cmds import num_prompts
from capplan.sim.workload import Lane as SimLane
from capplan.sim.workload import Workload, load_trace, parse_length

WORD = "hello "
WORDS = ("the of and to in is it that for on was with as at by be this from or an are not but "
         "all one can has more out up so what about there time some new would into other day "
         "also work first way many then make well just").split()
"""Common words, each one token after a space in Llama-3 and GPT BPE vocabularies."""


@dataclass(frozen=True)
class PlannedRequest:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    lane: str
    index: int = 0

    @property
    def prompt(self) -> str:
        """input_tokens - 1 words (BOS makes the last token), unique to this request."""
        rng = np.random.default_rng(self.index)
        picks = rng.integers(0, len(WORDS), max(1, self.input_tokens - 1))
        return " ".join(WORDS[int(i)] for i in picks)


def disaggregated_layout(plan: dict[str, Any]) -> dict[str, Any] | None:
    """The disaggregated layout a plan verifies: the one its plan file names
    (`fixed_disaggregated`), else the one `recommend --disagg` sized (`disaggregated`)."""
    fixed = plan.get("fixed_disaggregated") or {}
    if fixed.get("pools"):
        return fixed
    sized = plan.get("disaggregated") or {}
    return sized if sized.get("prefill") else None


def plan_rate(plan: dict[str, Any]) -> float:
    """A plan's whole rate (req/s): its lanes' sum, what a disaggregated layout's front end
    takes."""
    return sum(float(ln["rate_per_s"]) for ln in plan.get("lanes", []))


def plan_requests(plan: dict[str, Any], *, num_requests: int | None = None, seed: int = 0,
                  trace: str | Path | None = None, layout: str = "aggregated"
                  ) -> list[PlannedRequest]:
    """One replica's requests of the plan's best recommendation (a `plan --format json` dict);
    `layout` "disaggregated": the whole workload, which the P/D layout's front end takes."""
    recs = plan.get("recommendations") or []
    if not recs or not plan.get("lanes"):
        raise InputError("the plan has no recommendation or no lanes: pass the JSON that "
                         "`capplan plan FILE --export PLAN.json` writes")
    best = recs[0]
    replicas = max(1, int(best.get("replicas", 1)))
    rate = best["per_replica_rate_per_s"]
    if layout == "disaggregated":
        if not disaggregated_layout(plan):
            raise InputError("--layout disaggregated: the plan has no disaggregated layout "
                             "(name one in the plan file, or plan with `recommend` or "
                             "`plan --disagg`)")
        replicas, rate = 1, plan_rate(plan)
    max_len = int(best.get("max_model_len") or 1 << 30)
    if trace is not None:
        reqs = load_trace(trace)
        keep = np.arange(len(reqs)) % replicas == 0
        names = ["trace"]
    else:
        reqs, names = _generated(plan, replicas, num_requests or num_prompts(rate), seed)
        keep = np.ones(len(reqs), bool)
    reqs, _ = reqs.clip_to_context(max_len)
    idx = np.flatnonzero(keep)
    if num_requests and trace is not None:
        idx = idx[:num_requests]
    t0 = float(reqs.arrival_at_s[idx[0]]) if idx.size else 0.0
    return [PlannedRequest(float(reqs.arrival_at_s[i]) - t0, int(reqs.input_tokens[i]),
                           int(reqs.output_tokens[i]),
                           names[int(reqs.lane[i])] if len(names) > 1 else names[0],
                           index=seed * 1_000_003 + k)
            for k, i in enumerate(idx)]


def _generated(plan: dict[str, Any], replicas: int, n: int, seed: int
               ) -> tuple[Any, list[str]]:
    """`n` requests of the plan's lanes at one replica's share of their rates, and the lanes'
    names."""
    lanes = tuple(SimLane(name=ln["name"], rate_per_s=ln["rate_per_s"] / replicas,
                          arrival=ln.get("arrival", "poisson"),
                          burstiness=ln.get("burstiness", 1.0),
                          input_len=parse_length(str(ln["input_len"])),
                          output_len=parse_length(str(ln["output_len"])),
                          priority=ln.get("priority", 0)) for ln in plan["lanes"])
    reqs = Workload(lanes, num_requests=n).generate(np.random.default_rng(seed))
    return reqs, [ln.name for ln in lanes]


def _rows(client: str, reqs: list[PlannedRequest]) -> str:
    if client == "sglang":  # ShareGPT: the reply's length sets max_tokens (bench_serving)
        return json.dumps([{"id": str(i), "conversations": [
            {"from": "human", "value": r.prompt},
            {"from": "gpt", "value": WORD * max(1, r.output_tokens)}]}
            for i, r in enumerate(reqs)]) + "\n"
    lines = []
    for r in reqs:
        if client == "vllm":  # CustomDataset: prompt + output_tokens per line
            row: dict[str, Any] = {"prompt": r.prompt, "output_tokens": r.output_tokens}
        elif client == "aiperf":  # mooncake_trace: timestamp in ms, lengths in tokens
            row = {"timestamp": round(r.arrival_s * 1e3), "input_length": r.input_tokens,
                   "output_length": r.output_tokens}
        elif client == "guidellm":
            row = {"prompt": r.prompt, "prompt_tokens_count": r.input_tokens,
                   "output_tokens_count": r.output_tokens}
        else:  # capplan's own: everything
            row = {"arrival_s": round(r.arrival_s, 6), "lane": r.lane,
                   "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
                   "prompt": r.prompt}
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


def write_dataset(path: str | Path, client: str, reqs: list[PlannedRequest]) -> Path:
    """Write the requests in the client's dataset format (atomic)."""
    path = Path(path)
    atomic_write_text(path, _rows(client, reqs))
    return path
