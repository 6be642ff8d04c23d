"""Load descriptions (open/closed loop, trace, length distributions) and the analytic latency
of one deployment under them. Composition only: the formulas live in models/queueing/."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.limits import CONCURRENCY, RATE_PER_S
from capplan.models.closed_loop import (
    VLLM_BENCH_NUM_PROMPTS,
    BenchmarkProtocol,
    closed_loop_latency,
)
from capplan.models.perf import BOUNDS
from capplan.models.prefix import PrefixCache, PrefixSpec
from capplan.models.queueing import LengthStats, QueueModel, summarize
from capplan.plan.deployment import Deployment
from capplan.plan.lengths import clipped, length_stats


@dataclass(frozen=True)
class LoadSpec:
    rate_per_s: float | None
    concurrency: int | None
    input_stats: LengthStats
    output_stats: LengthStats
    arrival_scv: float = 1.0
    source: str = "flags"
    num_prompts: int | None = None
    """Closed loop: requests the benchmark sends and averages over (vllm bench serve's
    --num-prompts; default 1000)."""
    warmup_prompts: int = 0
    prefix: PrefixCache = PrefixCache()
    """What automatic prefix caching saves (models/prefix.py); none by default."""

    @property
    def open_loop_text(self) -> str:
        """What an open-loop load was: a trace's note, or the rate and its arrivals (Poisson,
        or gamma at the burstiness vllm bench serve's --burstiness names)."""
        if self.source != "flags":
            return self.source
        return open_loop_text(self.rate_per_s, 1.0 / self.arrival_scv)


def open_loop_text(rate_per_s: float | None, burstiness: float) -> str:
    """An open loop as the output's `load` line names it: its rate and its arrivals (Poisson,
    or gamma at vllm bench serve's --burstiness)."""
    arrivals = ("Poisson arrivals" if burstiness == 1.0
                else f"gamma arrivals, burstiness {burstiness:.3g}")
    return f"open loop, {float(rate_per_s or 0.0):.4g} req/s, {arrivals}"


def require_one_load(rate: float | None, concurrency: int | None, trace: str | None) -> None:
    """The one check that a load is described exactly once (latency and simulate)."""
    given = [x is not None for x in (rate, concurrency, trace)]
    if sum(given) != 1:
        raise InputError("give exactly one of --rate, --concurrency or --trace")
    # the edge's bounds, for the Python API as for the CLI (whose options checked them already)
    if rate is not None:
        RATE_PER_S.check(rate, "--rate")
    if concurrency is not None:
        CONCURRENCY.check(concurrency, "--concurrency")


def load_spec_from_options(rate: float | None, concurrency: int | None, trace: str | None,
                           input_len: str, output_len: str, burstiness: float = 1.0,
                           max_model_len: int | None = None, num_prompts: int | None = None,
                           warmup_prompts: int = 0, time_unit: str = "auto",
                           prefix: PrefixSpec | None = None,
                           cache: tuple[int, float] | None = None) -> LoadSpec:
    """`prefix`: the lane's sharing; `cache`: (block size, KV cache tokens) of the deployment,
    for the cache's block granularity and how long freed blocks survive."""
    require_one_load(rate, concurrency, trace)
    if concurrency is not None and prefix is not None and prefix.active:
        raise InputError("prefix sharing is modelled for open-loop rates (--rate); the analytic "
                         "closed loop does not take it: use `capplan simulate --concurrency`")
    block_size, kv_tokens = cache or (16, None)
    if trace is not None:
        from capplan.sim.workload import load_trace, replayable_rate

        t = load_trace(trace, time_unit)
        arrivals = np.asarray(t.arrival_at_s, float)
        rate = replayable_rate(arrivals, str(trace))
        gaps = np.diff(np.sort(arrivals))
        scv = float(gaps.var() / max(gaps.mean() ** 2, 1e-12))
        inp, out = clipped(np.asarray(t.input_tokens, float), np.asarray(t.output_tokens, float),
                           max_model_len)
        i_st, o_st = length_stats(inp, out)
        pc = PrefixCache()
        if t.has_prefix:  # Mooncake hash_ids: the hits an unbounded cache would give
            from capplan.sim.workload import trace_prefix_hits

            hits = np.minimum(trace_prefix_hits(t, block_size), np.maximum(inp - 1, 0))
            pc = PrefixCache(float(hits.mean()), tuple((inp - hits).tolist()))
        return LoadSpec(rate, None, i_st, o_st, scv, f"trace {t.note}",
                        prefix=pc)
    from capplan.plan.prefix import lane_lengths

    inp, out, pc = lane_lengths(prefix, input_len, output_len, max_model_len, block_size,
                                rate, kv_tokens)
    i_st, o_st = length_stats(inp, out)
    return LoadSpec(rate, concurrency, i_st, o_st, 1.0 / burstiness,
                    num_prompts=num_prompts, warmup_prompts=warmup_prompts, prefix=pc)


def queue_model(dep: Deployment, load: LoadSpec) -> QueueModel:
    return QueueModel(dep.step, load.input_stats, load.output_stats, dep.limits, load.arrival_scv,
                      dep.profile.scheduler, load.prefix)


def analytic_latency(dep: Deployment, load: LoadSpec) -> dict[str, Any]:
    """Contract keys (ttft_s, tbt_s, e2e_s, throughput...) for one deployment and load."""
    if not dep.memory.fits:
        raise InputError(f"{dep.model.key} does not fit on {dep.gpu.key} with TP "
                         f"{dep.settings.tp}: {dep.memory.reason}")
    q = queue_model(dep, load)
    if not bool(np.all(q.whole_prompts_fit)):
        raise InputError(_prompts_over_budget(dep, load.input_stats))
    if load.concurrency is not None:
        return _closed_loop(dep, load)
    else:
        res = summarize(q.at_rate(np.asarray(float(load.rate_per_s))))
    step = dep.step.decode_step(max(res["mean_running_batch"], 1.0), q.ctx_mean)
    res["bound"] = BOUNDS[int(step["bound_index"])]
    res["calibration"] = dep.calibration.source
    res["model"], res["gpu"], res["tp"] = dep.model.key, dep.gpu.key, dep.settings.tp
    res["engine_settings"] = dep.settings_summary()
    res["load"] = (load.open_loop_text if load.concurrency is None
                   else f"closed loop, {load.concurrency}")
    if not res["stable"]:
        cap = float(q.capacity_rate())
        res["capacity_requests_per_s"] = cap
        res["offered_requests_per_s"] = res["requests_per_s"]
        res["reason"] = (f"arrival rate {res['requests_per_s']:.3g}/s exceeds what one replica "
                         f"sustains ({cap:.3g}/s)")
        res["bound"] = _unstable_bound(res)
        # No steady state: throughput and utilisations of an overloaded queue are not numbers
        # to report (latencies are already null); say what the replica can do instead.
        for key in ("requests_per_s", "output_tokens_per_s", "input_tokens_per_s",
                    "mean_running_batch", "kv_mean_utilization", "kv_peak_utilization",
                    "prefill_utilization", "slot_utilization", "step_s", "decode_step_s",
                    "prefill_step_s", "prefill_step_frac"):
            res[key] = None
    return res


def _prompts_over_budget(dep: Deployment, inp: LengthStats) -> str:
    """Why a whole-prompt engine has no steady state: the prompts above its token budget,
    which it rejects (their share of a distribution's quantile table, and the longest)."""
    budget = dep.settings.max_num_batched_tokens
    table = np.asarray(inp.table or (inp.mean,), float)
    share = float(np.mean(table > budget)) if len(table) > 1 else 1.0
    over = (f"{share:.1%} of prompts exceed it (the longest: {table.max():.0f} tokens)"
            if 0 < share < 1 else f"the prompts ({table.max():.0f} tokens) exceed it")
    chunk = ("chunked-prefill" in dep.profile.option_flags
             and f", or chunk them (--engine {dep.profile.spec}+chunked-prefill)")
    return (f"{dep.profile.name} prefills whole prompts (chunked prefill off) and rejects one "
            f"over --max-num-batched-tokens {budget}: {over}; raise it, shorten prompts"
            + (chunk or ""))


def _closed_loop(dep: Deployment, load: LoadSpec) -> dict[str, Any]:
    """A closed-loop benchmark run (models/closed_loop.py) with the contract keys."""
    s = dep.settings
    proto = BenchmarkProtocol(int(load.concurrency or 1),
                              load.num_prompts or VLLM_BENCH_NUM_PROMPTS, load.warmup_prompts,
                              client_jitter=dep.profile.client_jitter)
    res = closed_loop_latency(dep.step, load.input_stats.mean, load.output_stats.mean,
                              dep.limits.max_num_seqs, dep.limits.max_num_batched_tokens,
                              dep.memory.replica_kv_cache_tokens, dep.pool.block_size, proto,
                              dep.profile.scheduler, dep.pool.state_tokens_per_seq,
                              dep.pool.layout)
    if res["bound"] == "clients":  # not capped: the decode step's own bound
        step = dep.step.decode_step(res["mean_running_batch"],
                                    load.input_stats.mean + load.output_stats.mean / 2)
        res["bound"] = BOUNDS[int(step["bound_index"])]
    res["calibration"] = dep.calibration.source
    res["engine"] = dep.profile.label
    res["model"], res["gpu"], res["tp"] = dep.model.key, dep.gpu.key, s.tp
    res["engine_settings"] = dep.settings_summary()
    res["load"] = (f"closed loop, {proto.concurrency} clients, {proto.num_prompts} prompts"
                   + (f" after {proto.warmup_prompts} warm-up" if proto.warmup_prompts else ""))
    return res


def _unstable_bound(res: dict[str, Any]) -> str:
    if res.get("prefill_utilization", 0) >= 1:
        return "prefill compute"
    if res.get("slot_utilization", 0) >= 1:
        return "concurrency cap"
    return "decode bandwidth"


def plan_output_path(entry: str, plan_dir: Path, out_dir: Path | None = None) -> Path:
    """Where a plan file's `export:` entry is written: inside the plan's folder (or `out_dir`).

    A plan file can come from someone else: an absolute path or a `..` would let it overwrite
    any file the user can write, so both are refused, and a path that resolves outside the
    folder through a symlinked sub-folder is refused too.
    """
    base = Path(out_dir) if out_dir is not None else Path(plan_dir)
    if not entry or any(ord(ch) < 32 or ord(ch) == 127 for ch in entry):
        raise InputError(f"export {entry!r}: a file name without control characters (NUL, "
                         "newline, ESC) is needed")
    rel = Path(entry)
    if rel.is_absolute() or rel.drive or rel.anchor:
        raise InputError(f"export {entry!r}: a plan file writes only inside {base}; give a "
                         "relative path (or pass --export on the command line)")
    if ".." in rel.parts:
        raise InputError(f"export {entry!r}: '..' leaves {base}; a plan file writes only "
                         "inside its folder (pass --out-dir or --export on the command line to "
                         "write elsewhere)")
    path = base / rel
    root = base.resolve()
    if not path.parent.resolve().is_relative_to(root):
        raise InputError(f"export {entry!r}: resolves outside {base} through a symbolic link")
    from capplan.export.atomic import confine

    confine(path, root)  # checked again at write time (the folder may change meanwhile)
    return path
