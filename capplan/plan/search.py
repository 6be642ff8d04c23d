"""Search over configurations for the cheapest fleet that meets every lane's SLOs.

For each (GPU, TP, weight dtype, KV dtype) the step-time constants are built once; the engine
knobs (max_num_seqs, max_num_batched_tokens) become array dimensions, and every configuration's
highest SLO-compliant arrival rate per replica is found by one vectorised bisection over all of
them at once (models/queueing.py). Replicas then cover the target rate with headroom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from capplan.catalog.calibration import calibration_gpu
from capplan.catalog.loader import Catalog
from capplan.catalog.schema import GpuSpec, ModelSpec
from capplan.errors import InputError
from capplan.models.engine import EngineSettings
from capplan.models.memory import memory_report
from capplan.models.perf import StepModel, build_step_model
from capplan.models.queueing import LengthStats, Limits, QueueModel
from capplan.plan.deployment import EngineOptions, calibration_for, resolve_settings

DEFAULT_SEQS = (64, 128, 256, 512, 1024)
DEFAULT_CHUNKS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_TPS = (1, 2, 4, 8)
_BISECT = 13


@dataclass(frozen=True)
class Traffic:
    """The load one pool serves: total rate, pooled length statistics, the strictest SLOs."""

    rate_per_s: float
    inp: LengthStats
    out: LengthStats
    arrival_scv: float
    ttft_p99_s: float | None
    tbt_p99_s: float | None
    e2e_p99_s: float | None
    lanes: tuple[str, ...]


@dataclass(frozen=True)
class SearchSpace:
    gpus: list[GpuSpec]
    tps: tuple[int, ...]
    weight_dtypes: tuple[str, ...]
    kv_dtypes: tuple[str, ...]
    max_num_seqs: tuple[int, ...]
    max_num_batched_tokens: tuple[int, ...]
    gpu_memory_utilization: float | None
    max_model_len: int
    block_size: int | None
    engine: str = "vllm"
    calibration: str | None = None


@dataclass
class Evaluated:
    """One configuration after the analytic search."""

    gpu: GpuSpec
    settings: EngineSettings
    kv_cache_tokens: int
    max_rate_per_s: float
    capacity_per_s: float
    binding_constraint: str
    step_index: int
    combo_index: int
    replicas: int = 0
    ttft_p99_s: float = math.inf
    """Analytic p99 TTFT at the per-replica rate (target / replicas), for ranking ties."""


def stack_step_models(models: list[StepModel]) -> StepModel:
    """One StepModel whose constants are column arrays (n, 1): evaluates all at once."""
    kw: dict[str, Any] = {}
    for f in fields(StepModel):
        vals = [getattr(m, f.name) for m in models]
        kw[f.name] = "; ".join(sorted(set(map(str, vals)))) if f.name == "calibration_source" \
            else np.asarray(vals, float)[:, None]
    return StepModel(**kw)


def _tp_ok(model: ModelSpec, tp: int, gpu: GpuSpec) -> bool:
    if model.num_attention_heads % tp or tp > gpu.interconnect.max_gpus_per_node:
        return False
    kvh = model.num_kv_heads
    return model.mla is not None or kvh % tp == 0 or tp % kvh == 0


def build_candidates(cat: Catalog, model: ModelSpec, space: SearchSpace, calibration_path=None
                     ) -> tuple[list[StepModel], list[dict[str, Any]]]:
    """Step models per (gpu, tp, wd, kvd) and, per step model, the memory of each combo."""
    steps: list[StepModel] = []
    meta: list[dict[str, Any]] = []
    cal_path = calibration_path or space.calibration
    cal_gpu = calibration_gpu(cal_path) if cal_path else None
    if cal_gpu is not None and cal_gpu not in {g.key for g in space.gpus}:
        raise InputError(f"calibration {cal_path} was measured on {cal_gpu}, which is not a "
                         "candidate GPU; a calibration applies only to its own device")
    combos = [(s, c) for s in space.max_num_seqs for c in space.max_num_batched_tokens]
    for gpu in space.gpus:
        # The file applies to the GPU it was measured on; the others keep their own.
        cal = calibration_for(cat, gpu, cal_path if cal_gpu == gpu.key else None)
        for tp in space.tps:
            if not _tp_ok(model, tp, gpu):
                continue
            for wd in space.weight_dtypes:
                for kvd in space.kv_dtypes:
                    base = resolve_settings(EngineOptions(
                        engine=space.engine, tp=tp, weight_dtype=wd, kv_dtype=kvd,
                        max_model_len=space.max_model_len,
                        gpu_memory_utilization=space.gpu_memory_utilization,
                        block_size=space.block_size), gpu)
                    kv_tokens, ok = [], False
                    for seqs, chunk in combos:
                        r = memory_report(model, gpu, base.with_(max_num_seqs=seqs,
                                                                 max_num_batched_tokens=chunk))
                        kv_tokens.append(r.kv_cache_tokens if r.fits else 0)
                        ok = ok or r.fits
                    if not ok:
                        continue
                    steps.append(build_step_model(model, gpu, base, cal))
                    meta.append({"gpu": gpu, "settings": base, "kv_tokens": kv_tokens,
                                 "combos": combos, "calibration": cal})
    return steps, meta


def _slo_ok(res: dict[str, Any], t: Traffic) -> np.ndarray:
    ok = np.asarray(res["stable"], bool)
    if t.ttft_p99_s is not None:
        ok = ok & (res["ttft_s"]["p99"] <= t.ttft_p99_s)
    if t.tbt_p99_s is not None:
        ok = ok & (res["tbt_s"]["p99"] <= t.tbt_p99_s)
    if t.e2e_p99_s is not None:
        ok = ok & (res["e2e_s"]["p99"] <= t.e2e_p99_s)
    return ok


def _binding(res: dict[str, Any], t: Traffic, qm: QueueModel, seqs: np.ndarray) -> np.ndarray:
    """Name what fails first just above the best rate."""
    out = np.full(np.shape(res["stable"]), "decode bandwidth", dtype=object)
    stable = np.asarray(res["stable"], bool)
    kv_limited = qm.cap < seqs
    slot = res["slot_utilization"] >= 0.98
    out = np.where(~stable & slot & kv_limited, "KV capacity", out)
    out = np.where(~stable & slot & ~kv_limited, "concurrency cap (max_num_seqs)", out)
    out = np.where(~stable & (res["prefill_utilization"] >= 0.98), "prefill compute", out)
    for key, slo, name in (("tbt_s", t.tbt_p99_s, "TBT SLO"), ("ttft_s", t.ttft_p99_s,
                                                                "TTFT SLO"),
                           ("e2e_s", t.e2e_p99_s, "E2E SLO")):
        if slo is not None:
            out = np.where(stable & (res[key]["p99"] > slo), name, out)
    return out


def analytic_search(steps: list[StepModel], meta: list[dict[str, Any]], t: Traffic,
                    headroom: float = 0.2) -> tuple[list[Evaluated], QueueModel, dict[str, Any]]:
    """Highest SLO-compliant rate per replica for every configuration, vectorised."""
    sm = stack_step_models(steps)
    seqs = np.asarray([[c[0] for c in m["combos"]] for m in meta], float)
    chunk = np.asarray([[c[1] for c in m["combos"]] for m in meta], float)
    kv = np.asarray([m["kv_tokens"] for m in meta], float)
    qm = QueueModel(sm, t.inp, t.out, Limits(seqs, chunk, kv), t.arrival_scv)
    with np.errstate(all="ignore"):
        cap = qm.capacity_rate()
        lo, hi = np.zeros_like(cap), np.maximum(cap, 1e-9)
        for _ in range(_BISECT):
            mid = 0.5 * (lo + hi)
            ok = _slo_ok(qm.at_rate(mid), t)
            lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
        above = qm.at_rate(np.maximum(lo * 1.03, 1e-6))
        binding = _binding(above, t, qm, seqs)
        floor = qm.at_rate(np.full_like(cap, 1e-6))
        reps = np.maximum(1.0, np.ceil(t.rate_per_s * (1 + headroom) / np.maximum(lo, 1e-12)
                                       - 1e-9))
        pred = qm.at_rate(np.where(lo > 0, t.rate_per_s / reps, 1e-6))
    results = []
    for i, m in enumerate(meta):
        for j, (s, c) in enumerate(m["combos"]):
            if kv[i, j] <= 0:
                continue
            results.append(Evaluated(
                gpu=m["gpu"], settings=m["settings"].with_(max_num_seqs=s, max_num_batched_tokens=c),
                kv_cache_tokens=int(kv[i, j]), max_rate_per_s=float(lo[i, j]),
                capacity_per_s=float(cap[i, j]), binding_constraint=str(binding[i, j]),
                step_index=i, combo_index=j, replicas=int(reps[i, j]),
                ttft_p99_s=float(pred["ttft_s"]["p99"][i, j])))
    return results, qm, {"floor": floor, "stack": sm, "pred": pred}


def replicas_for(rate: float, per_replica: float, headroom: float) -> int:
    if per_replica <= 0:
        return 0
    return max(1, math.ceil(rate * (1 + headroom) / per_replica - 1e-9))


def cost_per_hour(gpu: GpuSpec, gpus: int) -> float | None:
    return None if gpu.price_per_hour_usd is None else gpu.price_per_hour_usd * gpus


def rank_key(objective: str):
    def key(r: dict[str, Any]) -> tuple:
        cost = r["cost_per_hour"] if r["cost_per_hour"] is not None else math.inf
        ttft = r["predicted"]["ttft_s"]["p99"]
        # Ties (same cost and GPUs) go to the lower p99 TTFT (to the ms), then to the smaller
        # max_num_seqs: no reason to advertise a bigger cap than the traffic needs.
        tie = (round(ttft, 3), r.get("max_num_seqs", 0))
        if objective == "min_gpus":
            return (r["gpus_total"], cost, *tie)
        if objective == "max_goodput_per_dollar":
            gpd = r["capacity_per_replica_rps"] / (r["cost_per_hour"] / r["replicas"]) \
                if r["cost_per_hour"] else 0.0
            return (-gpd, r["gpus_total"], *tie)
        return (cost, r["gpus_total"], *tie)
    return key


MAX_REPLICAS = 4096
"""A configuration needing more replicas is a rounding artefact of the bisection near zero
rate, not a plan (planner.py filters on it)."""


def nearest_miss(evals: list[Evaluated], qm: QueueModel, floor: dict[str, Any], t: Traffic
                 ) -> str:
    """Why nothing meets the SLOs, and what it would take."""
    best, best_ratio, detail = None, math.inf, ""
    for e in evals:
        i, j = e.step_index, e.combo_index
        ratios = []
        for key, slo, name in (("ttft_s", t.ttft_p99_s, "p99 TTFT"), ("tbt_s", t.tbt_p99_s,
                                                                     "p99 TBT"),
                               ("e2e_s", t.e2e_p99_s, "p99 E2E")):
            if slo is not None:
                v = float(floor[key]["p99"][i, j])
                ratios.append((v / slo, name, v, slo))
        worst = max(ratios) if ratios else (0, "", 0, 0)
        if worst[0] < best_ratio:
            best_ratio, best, detail = worst[0], e, worst
    if best is None:
        return "no candidate configuration fits the model in memory"
    if best_ratio < 1:  # the SLOs hold at low load: the rate needs too many replicas
        fastest = max(evals, key=lambda e: e.max_rate_per_s)
        return (f"no configuration serves {t.rate_per_s:g} req/s within {MAX_REPLICAS} "
                f"replicas: the fastest, {fastest.gpu.key} TP {fastest.settings.tp}, sustains "
                f"{fastest.max_rate_per_s:.3g} req/s per replica within the SLOs; split the "
                "traffic into several deployments or plan a lower rate")
    _, name, v, slo = detail
    return (f"no configuration meets the SLOs: the closest, {best.gpu.key} TP {best.settings.tp} "
            f"({best.settings.weight_dtype}), reaches {name} {v * 1e3:.0f} ms even at negligible "
            f"load against {slo * 1e3:.0f} ms (binding: {name.split()[1]} SLO); loosen it to "
            f">= {v * 1.05 * 1e3:.0f} ms, shorten prompts/outputs, or use a faster GPU or more TP")
