"""A fixed disaggregated deployment: P prefill workers of one layout, D decode workers of
another, and the KV link between them, under an open loop, a closed loop or a trace.

Per request (models/disagg.py has the pieces; docs/disaggregation.md the derivation):

    TTFT = prefill-pool queue + prefill (+ the request overhead)  [prefill replica at rate / P]
           + KV transfer of the prompt over the link
           + decode-pool admission + its first step                [decode replica at rate / D]
    TBT  = the decode pool's token gap (no prefill chunk ever shares a decode step)

Quantiles of TTFT add the pools' quantiles (an upper bound for p90/p99: the stages are not
perfectly correlated). Each pool is one replica's analytic queue at its share of the rate; a
pool whose share exceeds its capacity is SATURATED: the open loop has no steady state and the
answer says which pool (never a saturated pool taken as stable). A closed loop of C clients
is a closed network (`PdModel.closed_loop`): the decode pool holds min(C, its slots) with no
wait while C fits them, the prefill pool queues at the rate lambda = C / (TTFT + (osl - 1)
TPOT); a station at its bound holds the clients' queue and is named saturated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.limits import DEFAULT_HEADROOM
from capplan.models.disagg import INTER_NODE, Link, decode_side_prefix, kv_transfer_s
from capplan.models.disagg import kv_link as _nvlink_or_default
from capplan.models.engine import engine_profile
from capplan.models.layout import engine_world, tp_from_engine_notation
from capplan.models.queueing import LengthStats, QueueModel
from capplan.plan.deployment import (
    Deployment,
    EngineOptions,
    build_deployment,
    resolve_deployment,
)
from capplan.plan.launch import pd_front_port
from capplan.plan.launch_multinode import pd_launch
from capplan.plan.load import LoadSpec
from capplan.sim.pd import check_router

SATURATED_UTILIZATION = 0.97
"""A pool at this share of its capacity in a closed loop is where the clients queue."""
_GRID, _GRID_PASSES = 32, 4
"""The closed loop's rate is bracketed on _GRID rates per pass, _GRID_PASSES passes: 32^-4
(1e-6) of the slower station's capacity."""
DEFAULT_PROMPTS = 1000
"""Requests of a closed-loop benchmark when none is given (`vllm bench serve --num-prompts`)."""
QUANTILES = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class PdLayout:
    """P prefill workers x their deployment, D decode workers x theirs, the KV link."""

    prefill: Deployment
    prefill_workers: int
    decode: Deployment
    decode_workers: int
    link: Link
    prefill_router: str = "round-robin"
    """How the frontend places requests on the prefill workers (capplan.sim.pd.ROUTERS)."""
    decode_router: str = "round-robin"
    """How it places them on the decode workers (the replay's; the analytic solve spreads
    the clients evenly)."""

    @property
    def gpus(self) -> int:
        return (self.prefill_workers * self.prefill.gpus_per_replica
                + self.decode_workers * self.decode.gpus_per_replica)

    def describe(self) -> str:
        return (f"prefill {self.prefill_workers} x ({self.prefill.layout_text}), decode "
                f"{self.decode_workers} x ({self.decode.layout_text}), KV over "
                f"{self.link.name}; {self.gpus} GPUs")


def network_link(dep: Deployment) -> Link:
    """The decode GPU's scale-out network from the catalog (models/disagg.INTER_NODE if the
    catalog gives none)."""
    net = dep.gpu.network
    if net is None:
        return INTER_NODE
    return Link(f"network ({net.bandwidth_gb_per_s * 8:g} Gb/s per GPU)", net.bytes_per_s,
                net.latency_s, f"the GPU catalog's network: entry ({dep.gpu.key})")


ROLE_DEEPEP_MODE = {"prefill": "normal", "decode": "low_latency"}
"""The DeepEP mode each pool runs when its EP all-to-all crosses domains: a prefill worker's
steps all carry prompt tokens (normal kernels), a decode worker's none (low-latency, which
CUDA graphs capture): SGLang's auto resolves so step by step, vLLM and TensorRT-LLM run one
mode per server and their launch lines pin it (EngineProfile.deepep_flags)."""


def role_pool(dep: Deployment, role: str) -> Deployment:
    """`dep` as a P/D pool of `role` runs it: its role's DeepEP mode (ROLE_DEEPEP_MODE) unless
    its settings pin one, and a prefill worker's host overlap where the engine runs those
    without its default (EngineProfile.prefill_worker_overlap) unless the engine spec sets one
    (+overlap, +no-overlap); the same deployment when neither applies."""
    s, prof = dep.settings, dep.profile
    changes: dict[str, object] = {}
    if s.deepep_mode is None and dep.deepep_mode is not None:
        changes["deepep_mode"] = ROLE_DEEPEP_MODE[role]
    want = prof.prefill_worker_overlap
    if (role == "prefill" and want is not None and want != prof.host_overlap
            and not {"overlap", "no-overlap"} & set(prof.options)):
        changes["engine"] = f"{prof.spec}+{'overlap' if want else 'no-overlap'}"
    if not changes:
        return dep
    out = build_deployment(dep.model, dep.gpu, s.with_(**changes), dep.calibration,
                           dep.served_id)
    # an image encoder's prompt FLOPs are set on the step after it is built (plan/images.py)
    return replace(out, step=replace(
        out.step, prefill_extra_flops_per_token=dep.step.prefill_extra_flops_per_token))


def make_layout(prefill: Deployment, prefill_workers: int, decode: Deployment,
                decode_workers: int, link: str = "auto") -> PdLayout:
    """Check a P/D layout and pick its KV link: `nvlink` when both pools fit one NVLink domain
    of the same GPU (a node; a GB200/GB300 NVL72 rack), else `network`; `auto` chooses so.
    Each pool runs as its role does (`role_pool`: DeepEP mode, a prefill worker's overlap)."""
    prefill, decode = role_pool(prefill, "prefill"), role_pool(decode, "decode")
    for role, n, dep in (("prefill", prefill_workers, prefill), ("decode", decode_workers,
                                                                 decode)):
        if not isinstance(n, int) or n < 1:
            raise InputError(f"--{role}-workers {n}: must be a positive integer")
        if not dep.memory.fits:
            raise InputError(f"{role} pool: {dep.model.key} does not fit on {dep.gpu.key} "
                             f"({dep.layout_text}): {dep.memory.reason}")
    if prefill.model.key != decode.model.key:
        raise InputError("prefill and decode pools must serve the same model")
    total = prefill_workers * prefill.gpus_per_replica + decode_workers * decode.gpus_per_replica
    one_domain = (prefill.gpu.key == decode.gpu.key
                  and total <= decode.gpu.interconnect.max_gpus_per_node)
    if link not in ("auto", "nvlink", "network"):
        raise InputError(f"--kv-link {link!r}: expected auto, nvlink or network")
    if link == "nvlink" and not one_domain:
        raise InputError(f"--kv-link nvlink: the two pools ({total} GPUs) do not fit one "
                         f"{decode.gpu.interconnect.max_gpus_per_node}-GPU NVLink domain of "
                         "one GPU type")
    use_nvlink = link == "nvlink" or (link == "auto" and one_domain)
    chosen = (_nvlink_or_default(decode.gpu.interconnect.bytes_per_s, True,
                                 decode.gpu.interconnect.label) if use_nvlink
              else network_link(decode))
    return PdLayout(prefill, prefill_workers, decode, decode_workers, chosen)


def pool_queue(role: str, step: Any, limits: Any, inp: LengthStats, out: LengthStats,
               arrival_scv: float = 1.0, scheduler: Any = None, prefix: Any = None
               ) -> QueueModel:
    """A P/D pool worker's analytic queue (models/queueing.py), the one definition that
    `latency`'s solve (`PdModel`) and `recommend`'s P/D search (plan/disagg.py) both use: a
    prefill worker runs each prompt with a one-token output (`prefix`: the load's prefix
    cache), a decode worker the outputs with the prompt's KV arrived (its prefix: the prompt
    less one token, models/disagg.decode_side_prefix); both cost a token budget longer than
    one prompt as whole prompts packed into the step (`QueueModel.pack_prompts`: a P/D pool's
    steps carry many prompts, not one sequence's chunk)."""
    if role == "prefill":
        q = QueueModel(step, inp, LengthStats.fixed(1.0), limits, arrival_scv, scheduler,
                       prefix)
    else:
        q = QueueModel(step, inp, out, limits, arrival_scv, scheduler, decode_side_prefix(inp))
    q.pack_prompts = True
    return q


class PdModel:
    """The two pools' analytic queues for one load's lengths (`pool_queue`)."""

    def __init__(self, layout: PdLayout, inp: LengthStats, out: LengthStats,
                 arrival_scv: float = 1.0, prefix: Any = None):
        self.layout, self.inp, self.out = layout, inp, out
        p, d = layout.prefill, layout.decode
        self.qp = pool_queue("prefill", p.step, p.limits, inp, out, arrival_scv,
                             p.profile.scheduler, prefix)
        self.qd = pool_queue("decode", d.step, d.limits, inp, out, arrival_scv,
                             d.profile.scheduler)
        kv = d.memory.kv_bytes_per_token_per_gpu
        self.transfer = {"mean": float(kv_transfer_s(inp.mean, kv, layout.link)),
                         "p50": float(kv_transfer_s(inp.quantile(0.5), kv, layout.link)),
                         "p90": float(kv_transfer_s(inp.quantile(0.9), kv, layout.link)),
                         "p99": float(kv_transfer_s(inp.quantile(0.99), kv, layout.link))}
        # the client's request overhead is counted once, on the prefill side
        self.decode_overhead_s = float(np.asarray(d.step.request_overhead_s))
        self.request_overhead_s = float(np.asarray(p.step.request_overhead_s))
        self.capacity = {"prefill": float(self.qp.capacity_rate()) * layout.prefill_workers,
                         "decode": float(self.qd.capacity_rate()) * layout.decode_workers}

    def at_rate(self, rate_per_s: float, metrics: set[str] | None = None) -> dict[str, Any]:
        """The pools at a total open-loop rate: per-pool figures, composed TTFT, saturation
        (`metrics`: as QueueModel.at_rate, the keys whose quantiles are read; means always)."""
        lay = self.layout
        rp, rd = rate_per_s / lay.prefill_workers, rate_per_s / lay.decode_workers
        p = _plain(self.qp.at_rate(rp, metrics))
        d = _plain(self.qd.at_rate(rd, metrics))
        saturated = [role for role, r in (("prefill", p), ("decode", d)) if not r["stable"]]
        ttft = {q: p["ttft_s"][q] + self.transfer[q] + d["ttft_s"][q] - self.decode_overhead_s
                for q in QUANTILES if q in p["ttft_s"] and q in d["ttft_s"]}
        # E2E = TTFT + (osl - 1) x the decode pool's mean token gap, per TTFT quantile (the
        # gaps of one request average out over its output)
        gaps = max(self.out.mean - 1.0, 0.0) * d["tbt_s"]["mean"]
        e2e = {q: v + gaps for q, v in ttft.items()}
        pools = {"prefill": self._pool("prefill", p, rp), "decode": self._pool("decode", d, rd)}
        return {"stable": not saturated, "saturated_pools": saturated,
                "ttft_s": ttft, "tbt_s": d["tbt_s"], "e2e_s": e2e,
                "tpot_s": d["tbt_s"]["mean"], "kv_transfer_s": dict(self.transfer),
                "requests_per_s": rate_per_s, "request_overhead_s": self.request_overhead_s,
                **_occupancy(pools["decode"]), "pools": pools}

    def _pool(self, role: str, r: dict[str, Any], rate_per_replica: float) -> dict[str, Any]:
        lay = self.layout
        dep, n = (lay.prefill, lay.prefill_workers) if role == "prefill" else (
            lay.decode, lay.decode_workers)
        cap = self.capacity[role]
        out = {"workers": n, "gpus_per_worker": dep.gpus_per_replica,
               "layout": dep.layout_text, "engine_settings": dep.settings_summary(),
               "requests_per_s_per_worker": rate_per_replica,
               "capacity_requests_per_s": cap,
               "utilization": rate_per_replica * n / cap if cap > 0 else math.inf,
               "stable": bool(r["stable"]), "mean_running_batch": r.get("mean_running_batch"),
               "kv_peak_utilization": r.get("kv_peak_utilization")}
        if role == "prefill":  # the prefill stage: queue and prompt, as the replay's pool row
            out["ttft_s"] = {q: v - self.request_overhead_s for q, v in r["ttft_s"].items()}
        else:
            out["admission_s"] = {q: v - self.decode_overhead_s for q, v in r["ttft_s"].items()}
            out["tbt_s"] = r["tbt_s"]
        return out

    def decode_slots(self) -> float:
        """Sequences the decode pool runs at once: per worker its engine's max_num_seqs (all
        DP ranks) or the full-length sequences its KV cache holds (window layers capped at
        their window, Limits.held_kv), whichever is smaller."""
        lim = self.layout.decode.limits
        per_seq = max(float(np.asarray(lim.held_kv(self.inp.mean + self.out.mean))), 1.0)
        kv_seqs = float(np.asarray(lim.kv_cache_tokens)) / per_seq
        return self.layout.decode_workers * max(min(float(np.asarray(lim.max_num_seqs)),
                                                    kv_seqs), 1.0)

    def _ttft_at(self, lam: Any, tpot: float) -> np.ndarray:
        """Mean TTFT at `lam` req/s over the pool (an array of rates; inf where the prefill
        queue is unstable): the prefill queue, the KV transfer and the decode step that emits
        the first token."""
        p = self.qp.at_rate(np.asarray(lam, float) / self.layout.prefill_workers, {"ttft_s"})
        t = np.asarray(p["ttft_s"]["mean"], float) + self.transfer["mean"] + tpot
        return np.where(np.asarray(p["stable"], bool), t, math.inf)

    def _closed_rate(self, concurrency: int, hi: float, tpot: float) -> float:
        """The cycle's rate: lambda (TTFT(lambda) + (osl - 1) TPOT) = C below `hi` (the slower
        station's capacity). The excess C / cycle(lambda) - lambda falls with lambda, so its
        root is bracketed on a grid of _GRID rates per pass (one vectorised queue call)."""
        lo, osl = 0.0, self.out.mean
        for _ in range(_GRID_PASSES):
            lam = np.linspace(lo, hi, _GRID + 1)[1:]
            t = self._ttft_at(lam, tpot)
            with np.errstate(divide="ignore", invalid="ignore"):
                implied = np.where(np.isfinite(t), concurrency / (t + (osl - 1) * tpot), 0.0)
            above = np.nonzero(implied > lam)[0]
            k = int(above[-1]) + 1 if above.size else 0  # lam[:k] lie below the root
            lo, hi = (float(lam[k - 1]) if k else lo), (float(lam[k]) if k < _GRID else hi)
        return lo if lo > 0 else hi * 1e-6

    def closed_loop(self, concurrency: int, waves: float | None = None) -> dict[str, Any]:
        """C clients, each sending its next request when the last ends: a closed network of
        two stations (the mean-value view of Lazowska et al., "Quantitative System
        Performance", ch. 6). The decode pool holds min(C, slots) sequences, spread evenly over
        its workers (the router sends each request to a worker with a free slot): while C fits
        its slots no request waits for it, and TPOT is one decode step at that batch. The
        prefill pool is a queue at the cycle's rate: lambda solves lambda (TTFT(lambda) +
        (osl - 1) TPOT) = C (`_closed_rate`) below the capacity of the slower station; a station
        at that bound holds the clients' queue (then TTFT = C / lambda - (osl - 1) TPOT,
        Little's law) and is named saturated: the prefill pool at its capacity, the decode pool
        when C exceeds its slots.

        `waves`: the benchmark's requests over C (AIPerf as NVIDIA's recipes run it: 10;
        capplan.sim.protocol). Its clients all send at t = 0, so the first wave's C prompts
        queue at the prefill pool together: the k-th waits (k - 1) / mu (mu the pool's capacity
        in prompts/s), (C - 1) / (2 mu) on average, once in `waves` rounds; added to the mean
        TTFT (`startup_wave_s`). None: the steady state alone."""
        lay, osl = self.layout, self.out.mean
        slots = self.decode_slots()
        running = min(float(concurrency), slots)
        ctx = self.inp.mean + osl / 2.0
        tpot = float(np.asarray(lay.decode.step.decode_step(running / lay.decode_workers, ctx,
                                                            detail=False)["step_s"]))
        decode_s = max(osl, 1.0) * tpot  # the first decode step emits the client's first token
        caps = {"prefill": self.capacity["prefill"], "decode": slots / decode_s}
        if not caps["prefill"] > 0:
            raise InputError("the prefill pool has no capacity for these lengths "
                             "(see `capplan memory`)")
        lam = self._closed_rate(concurrency, min(caps.values()) * (1 - 1e-9), tpot)
        t = float(self._ttft_at(lam, tpot))
        p = _plain(self.qp.at_rate(lam / lay.prefill_workers))  # every quantile, not the mean's
        bound = (["prefill"] if lam >= SATURATED_UTILIZATION * caps["prefill"] else []) + (
            ["decode"] if concurrency > slots else [])
        # Little's law over the clients fixes the mean TTFT once the rate is known; a station
        # at its bound holds the clients that the cycle leaves over
        little = concurrency / lam - (osl - 1) * tpot
        ttft_mean = max(little, t) if math.isfinite(t) else little
        startup = (max(concurrency - 1, 0) / (2.0 * caps["prefill"]) / waves
                   if waves else 0.0)
        shift = ttft_mean - (t if math.isfinite(t) else ttft_mean) + startup
        ttft = {q: (p["ttft_s"].get(q, p["ttft_s"]["mean"]) + self.transfer[q] + tpot + shift)
                for q in QUANTILES}
        gaps = max(osl - 1.0, 0.0) * tpot
        res = self.at_rate(min(lam, 0.999 * self.capacity["prefill"]) if lam > 0 else lam)
        res.update({"stable": True, "saturated_pools": bound, "ttft_s": ttft,
                    "tbt_s": {q: tpot for q in QUANTILES}, "tpot_s": tpot,
                    "e2e_s": {q: v + gaps for q, v in ttft.items()}, "requests_per_s": lam})
        res["pools"]["decode"].update({
            "mean_running_batch": running / lay.decode_workers, "utilization": running / slots,
            "stable": True, "capacity_requests_per_s": caps["decode"],
            "admission_s": {q: tpot for q in QUANTILES}, "tbt_s": {q: tpot for q in QUANTILES},
            "slots": slots})
        res["pools"]["prefill"]["utilization"] = lam / caps["prefill"]
        res.update(_occupancy(res["pools"]["decode"]))
        res["capacity_closed_loop_requests_per_s"] = caps
        res["startup_wave_s"] = startup
        return res


WORKER_HEADROOM = DEFAULT_HEADROOM
"""Spare prefill capacity of an implied layout (`implied_workers`): the planner's default
headroom (replicas cover rate x (1 + headroom))."""


RIDGE_STEP = 2.4
"""The ridge rule's step ratio: a decode worker's batch at the clients' peak at most where its
step is this many times its one-sequence step. With step(b) = fixed + b x per-sequence (weights
read once, each sequence's KV and FLOPs), past the ridge each added sequence costs the worker's
token latency one for one. Fitted (the one parameter of the rule): the geometric median of the
step ratio at which the measured deployments that state their counts run their decode workers
at their sweep's largest C (256 rows of ../shared/validation/silicon_sample.csv, 2.40; fitted
without each system in turn, 2.33-2.53; docs/validation.md section 6)."""


def ridge_batch(decode: Deployment, ctx: float, slots: float,
                ridge_step: float = RIDGE_STEP) -> float:
    """The largest batch (<= slots) whose decode step at context `ctx` is at most `ridge_step`
    times the one-sequence step (a geometric grid of 96 batches, one vectorised call)."""
    grid = np.unique(np.round(np.geomspace(1.0, max(slots, 1.0), 96)))
    t = np.asarray(decode.step.decode_step(grid, ctx, detail=False)["step_s"], float)
    return float(grid[t <= ridge_step * t[0]].max())


def _decode_batch_cap(decode: Deployment, ctx: float, slots: float,
                      decode_rule: str | float) -> float:
    """A decode worker's batch at the peak under `decode_rule` (implied_workers)."""
    if decode_rule == "slots":
        return slots
    ratio = RIDGE_STEP if decode_rule == "ridge" else decode_rule
    if isinstance(ratio, int | float) and not isinstance(ratio, bool) and ratio > 1:
        return ridge_batch(decode, ctx, slots, float(ratio))
    raise InputError(f"decode rule {decode_rule!r}: expected slots, ridge or a step ratio "
                     "above 1")


def implied_workers(prefill: Deployment, decode: Deployment, inp: LengthStats,
                    out: LengthStats, concurrency: int, link: str = "auto",
                    decode_rule: str | float = "ridge",
                    peak_concurrency: int | None = None) -> tuple[int, int]:
    """The worker counts a planner sizing a closed loop for its peak of `peak_concurrency`
    clients (default: `concurrency`, the C answered) deploys with these two worker layouts,
    when the counts are not given (docs/disaggregation.md, "Worker counts"). The counts are
    one deployment's: a closed loop at C below the peak runs on the peak's workers, as the
    measured deployments keep their workers from the smallest C of a sweep to the largest.

    - decode ("ridge", the default): the fewest workers that hold the peak's clients with
      each worker's batch at most its `ridge_batch` (step RIDGE_STEP x its one-sequence step)
      and its slots (`PdModel.decode_slots`: the engine's max batch over its attention-DP
      ranks, bounded by the sequences of prompt + output tokens its KV cache holds, window
      layers at their window): disaggregation is
      deployed to protect TPOT, and past the ridge a sequence costs every other one's token
      latency; a number k > 1: the same at step ratio k; "slots": the fewest workers whose
      slots hold the peak (the fewest GPUs);
    - prefill: the fewest workers that carry the cycle rate the decode pool sets at the peak,
      peak / (osl x TPOT) (TTFT -> 0: the most the clients can send), with WORKER_HEADROOM
      spare (the planner's replicas = ceil(rate (1 + headroom) / capacity)), so the decode
      pool, not the prefill queue, bounds the loop (the point of disaggregating)."""
    if not isinstance(concurrency, int) or concurrency < 1:
        raise InputError(f"--concurrency {concurrency}: implied worker counts need a closed "
                         "loop of at least one client")
    peak = concurrency if peak_concurrency is None else peak_concurrency
    if not isinstance(peak, int) or peak < concurrency:
        raise InputError(f"--peak-concurrency {peak}: the clients the counts are sized for "
                         f"must be a whole number at least --concurrency {concurrency}")
    one = _one_worker_model(prefill, decode, inp, out, link)
    ctx = inp.mean + out.mean / 2.0  # the mean context of a running sequence, as closed_loop
    per = _decode_batch_cap(decode, ctx, one.decode_slots(), decode_rule)
    d = max(1, math.ceil(peak / per - 1e-9))
    tpot = float(np.asarray(decode.step.decode_step(peak / d, ctx, detail=False)["step_s"]))
    rate = peak / (max(out.mean, 1.0) * tpot)
    per_worker = one.capacity["prefill"]
    if not per_worker > 0:
        raise InputError("the prefill pool has no capacity for these lengths "
                         "(see `capplan memory`)")
    p = max(1, math.ceil(rate * (1 + WORKER_HEADROOM) / per_worker - 1e-9))
    return p, d


_ONE_WORKER: dict[tuple, PdModel] = {}
"""PdModels of one prefill and one decode worker by (deployments, lengths, link): the pools'
capacities are the costly part of `implied_workers`, and a sweep's rows share them. Keyed by
the deployments' ids; an entry holds its deployments (its layout), so an id is not reused
while it is cached, and a hit checks them by identity."""
_ONE_WORKER_MAX = 256


def _lengths_key(x: LengthStats) -> tuple:
    return (x.mean, x.mean_sq, tuple(sorted(x.q.items())), x.table)


def _one_worker_model(prefill: Deployment, decode: Deployment, inp: LengthStats,
                      out: LengthStats, link: str) -> PdModel:
    """PdModel(one prefill worker, one decode worker) for these lengths, cached."""
    key = (id(prefill), id(decode), _lengths_key(inp), _lengths_key(out), link)
    got = _ONE_WORKER.get(key)
    if got is not None and got.layout.prefill is prefill and got.layout.decode is decode:
        return got
    if len(_ONE_WORKER) >= _ONE_WORKER_MAX:
        _ONE_WORKER.pop(next(iter(_ONE_WORKER)))
    got = _ONE_WORKER[key] = PdModel(make_layout(prefill, 1, decode, 1, link), inp, out)
    return got


IMPLIED_RULE = ("decode workers: the fewest that hold the peak's clients with each one's batch "
                f"where its step is at most {RIDGE_STEP:g} times the one-sequence step; "
                "prefill workers: the fewest that carry the decode pool's rate at the peak "
                f"with the planner's {WORKER_HEADROOM:.0%} headroom")
"""What an answer with implied counts says of them (`implied_workers`)."""


def implied_layout(layout: PdLayout, load: LoadSpec, link: str = "auto",
                   peak_concurrency: int | None = None) -> tuple[PdLayout, dict[str, Any]]:
    """`with_implied_workers` and the answer's `implied_workers` record of it (`peak`: the
    clients the counts are sized for)."""
    lay = with_implied_workers(layout, load, link, peak_concurrency)
    peak = peak_concurrency if peak_concurrency is not None else load.concurrency
    return lay, {"prefill": lay.prefill_workers, "decode": lay.decode_workers,
                 "peak_concurrency": peak, "rule": IMPLIED_RULE}


def with_implied_workers(layout: PdLayout, load: LoadSpec, link: str = "auto",
                         peak_concurrency: int | None = None) -> PdLayout:
    """The layout's worker layouts with the counts a closed loop implies (`implied_workers`,
    sized for `peak_concurrency` clients, default the loop's); the answer's `layout` and
    `implied_workers` say so."""
    if load.concurrency is None:
        raise InputError("implied worker counts need a closed loop (--concurrency C)")
    p, d = implied_workers(layout.prefill, layout.decode, load.input_stats, load.output_stats,
                           int(load.concurrency), link, peak_concurrency=peak_concurrency)
    return replace(make_layout(layout.prefill, p, layout.decode, d, link),
                   prefill_router=layout.prefill_router, decode_router=layout.decode_router)


OCCUPANCY_SOURCE = ("analytic steady state: the decode pool's mean running batch per worker "
                    "(Little's law), its KV peak from the queue's occupancy; no preemptions "
                    "(the analytic queue admits within its KV cache)")
"""What the analytic answer's `mean_running_batch`, `kv_peak_utilization` and `preemptions`
are (`occupancy_source`); a replayed answer counts them from its steps."""


def _occupancy(decode: dict[str, Any]) -> dict[str, Any]:
    """The contract keys `latency` gives of occupancy, from the analytic decode pool's row (the
    replay's answer gives its decode pool's too, pd_sim._result)."""
    return {"mean_running_batch": decode.get("mean_running_batch"), "preemptions": 0,
            "kv_peak_utilization": decode.get("kv_peak_utilization"),
            "occupancy_source": OCCUPANCY_SOURCE}


def _plain(res: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in res.items():
        if isinstance(v, dict):
            out[k] = {kk: float(np.asarray(vv)) for kk, vv in v.items()}
        elif isinstance(v, np.ndarray | float | int | np.floating | np.bool_):
            a = np.asarray(v)
            out[k] = bool(a) if a.dtype == bool else float(a)
        else:
            out[k] = v
    return out


def pd_latency(layout: PdLayout, load: LoadSpec) -> dict[str, Any]:
    """Contract keys of `latency` for a fixed P/D layout, plus per-pool figures
    (`pools.prefill`, `pools.decode`), `kv_transfer_s`, `saturated_pools` and `bound`."""
    model = PdModel(layout, load.input_stats, load.output_stats, load.arrival_scv, load.prefix)
    if load.concurrency is not None:
        c = int(load.concurrency)
        # the clients all send at t = 0, as `vllm bench serve --max-concurrency C` does, over
        # --num-prompts requests (its default 1000)
        prompts = max(load.num_prompts or DEFAULT_PROMPTS, c)
        res = model.closed_loop(c, waves=prompts / c)
        res["load"] = f"closed loop, {load.concurrency} clients, {prompts} requests"
    else:
        res = model.at_rate(float(load.rate_per_s or 0.0))
        res["load"] = load.open_loop_text
    sat = res["saturated_pools"]
    res["output_tokens_per_s"] = res["requests_per_s"] * load.output_stats.mean
    res["input_tokens_per_s"] = res["requests_per_s"] * load.input_stats.mean
    res["bound"] = (f"{' and '.join(sat)} pool saturated" if sat else
                    "prefill pool" if _util(res, "prefill") >= _util(res, "decode")
                    else "decode pool")
    if not res["stable"]:
        caps = model.capacity
        res["capacity_requests_per_s"] = min(caps.values())
        res["offered_requests_per_s"] = res["requests_per_s"]
        res["reason"] = "; ".join(
            f"the {role} pool is saturated: {res['requests_per_s']:.3g} req/s exceeds its "
            f"{caps[role]:.3g} req/s ({res['pools'][role]['workers']} x "
            f"{res['pools'][role]['layout']})" for role in sat)
        for key in ("ttft_s", "tbt_s", "e2e_s"):
            res[key] = {q: None for q in QUANTILES}
        res["tpot_s"] = None
        for key in ("requests_per_s", "output_tokens_per_s", "input_tokens_per_s",
                    "mean_running_batch", "kv_peak_utilization", "preemptions"):
            res[key] = None
    lay = layout
    res.update({"model": lay.decode.model.key, "gpu": lay.decode.gpu.key,
                "disaggregated": True, "layout": lay.describe(), "gpus_total": lay.gpus,
                "kv_link": {"name": lay.link.name, "bytes_per_s": lay.link.bytes_per_s,
                            "latency_s": lay.link.latency_s, "source": lay.link.source},
                "capacity_by_pool_requests_per_s": model.capacity,
                "launch": pd_launch(lay),
                "calibration": lay.decode.calibration.source})
    return res


def _util(res: dict[str, Any], role: str) -> float:
    return float(res["pools"][role]["utilization"])


@dataclass(frozen=True, kw_only=True)
class PdPools:
    """The two pools of a fixed layout as given: workers, per-pool engine options (a pool may
    name its own "gpu"), the KV link."""

    prefill_workers: int
    decode_workers: int
    prefill: dict[str, Any] = field(default_factory=dict)
    decode: dict[str, Any] = field(default_factory=dict)
    kv_link: str = "auto"
    prefill_router: str = "round-robin"
    decode_router: str = "round-robin"


def build_layout(cat: Any, model: str, gpu: str, pools: PdPools, *, calibration: Any = None,
                 engine_notation: bool = False, **options: Any) -> PdLayout:
    """Resolve both pools' deployments (options, updated per pool) and check the layout
    (`make_layout`). With `engine_notation`, each pool's `tp` is read as its engine writes it
    (models/layout.py)."""
    prefill, decode = pools.prefill, pools.decode
    prefill_workers, decode_workers, kv_link = (pools.prefill_workers, pools.decode_workers,
                                                pools.kv_link)
    deps = []
    for role, extra in (("prefill", prefill or {}), ("decode", decode or {})):
        opts = {k: v for k, v in {**options, **extra}.items() if k != "gpu" and v is not None}
        try:
            if engine_notation and opts.get("tp"):
                opts["tp"] = tp_from_engine_notation(
                    engine_profile(opts.get("engine") or "vllm").name, int(opts["tp"]),
                    int(opts.get("attention_dp") or 1), f"{role}-")
            dep = resolve_deployment(cat, model, extra.get("gpu") or gpu, EngineOptions(**opts),
                                     calibration)
        except InputError as e:
            raise InputError(f"{role} pool: {e}") from e
        if not dep.memory.fits:
            raise InputError(f"{role} pool: {dep.model.key} does not fit on {dep.gpu.key} "
                             f"({dep.layout_text}): {dep.memory.reason}"
                             f"{_wider_hint(dep, role)}")
        deps.append(dep)
    return replace(make_layout(deps[0], prefill_workers, deps[1], decode_workers, kv_link),
                   prefill_router=check_router(pools.prefill_router, "prefill router"),
                   decode_router=check_router(pools.decode_router, "decode router"))


def pool_flags(role: str, dep: Deployment) -> str:
    """A pool's layout as `latency`'s fixed-layout flags, in its engine's notation
    (models/layout.engine_world): --ROLE-tp, and --ROLE-attention-dp / --ROLE-expert-parallel
    where above 1."""
    s = dep.settings
    out = f"--{role}-tp {engine_world(dep.profile.name, s.tp, s.attention_dp)['tp']}"
    if s.attention_dp > 1:
        out += f" --{role}-attention-dp {s.attention_dp}"
    return out + (f" --{role}-expert-parallel {s.expert_parallel}"
                  if s.expert_parallel > 1 else "")


def _wider_hint(dep: Deployment, role: str) -> str:
    """'; --prefill-tp 16 (16 GPUs over 2 nodes: TP 16) fits': the smallest doubling that holds
    the model, in the engine's own flags (SGLang's and TensorRT-LLM's --tp is the tp x dp
    world, models/layout.engine_world). An attention-DP layout doubles its DP ranks (and its
    EP with them where EP spans the world, as wide-EP deployments grow); others double TP."""
    s = dep.settings
    widen_dp = s.attention_dp > 1
    for k in range(1, 7):
        f = 2 ** k
        if widen_dp:
            ep = s.expert_parallel * f if s.expert_parallel == s.tp * s.attention_dp else (
                s.expert_parallel)
            cand = s.with_(attention_dp=s.attention_dp * f, expert_parallel=ep)
        else:
            cand = s.with_(tp=s.tp * f)
        try:
            wider = build_deployment(dep.model, dep.gpu, cand, dep.calibration)
        except InputError:
            return ""
        if wider.memory.fits:
            flags = pool_flags(role, wider) if widen_dp else (
                f"--{role}-tp {engine_world(dep.profile.name, wider.settings.tp, 1)['tp']}")
            return f"; {flags} ({wider.layout_text}) fits"
    return ""


def fixed_layout_for_plan(cat: Any, plan: Any, resolved: Any, traffic: Any) -> dict[str, Any]:
    """A plan file's `disaggregated_layout` predicted at the lanes' pooled rate and lengths
    (open loop; the plan's engine settings; each pool's GPU or the first candidate's)."""
    spec, eng = plan.disaggregated_layout, plan.engine
    gpu = spec.prefill.gpu or spec.decode.gpu or (
        plan.candidates.gpus[0] if plan.candidates.gpus else None)
    if gpu is None:
        raise InputError("disaggregated_layout: name a gpu in a pool or in candidates.gpus")

    def pool(p: Any) -> dict[str, Any]:
        return {k: v for k, v in p.model_dump().items() if k != "workers" and v is not None}

    base: dict[str, Any] = {"engine": eng.name, "max_model_len": eng.max_model_len,
                            "gpu_memory_utilization": eng.gpu_memory_utilization,
                            "block_size": eng.block_size}
    if isinstance(eng.max_num_seqs, int):
        base["max_num_seqs"] = eng.max_num_seqs
    pools = PdPools(prefill_workers=spec.prefill.workers, decode_workers=spec.decode.workers,
                    prefill=pool(spec.prefill), decode=pool(spec.decode), kv_link=spec.kv_link)
    lay = build_layout(cat, getattr(resolved, "served_id", "") or plan.model, gpu, pools,
                       engine_notation=True, calibration=plan.calibration, **base)
    load = LoadSpec(traffic.rate_per_s, None, traffic.inp, traffic.out, traffic.arrival_scv,
                    "the plan's lanes, pooled")
    from capplan.plan.bench_cmds import verify_lines

    engine = lay.decode.profile.name
    return {**pd_latency(lay, load), **verify_lines(  # at the port of the layout's router line
        lay.decode.served_id, traffic.rate_per_s, engine, pd_front_port(engine),
        traffic, layout="disaggregated")}
