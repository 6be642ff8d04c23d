"""Search over configurations for the cheapest fleet that meets every lane's SLOs.

For each (GPU, TP, weight dtype, KV dtype) the step-time constants are built once; the engine
knobs (max_num_seqs, max_num_batched_tokens) become array dimensions, and every configuration's
highest SLO-compliant arrival rate per replica is found by one vectorised bisection over all of
them at once (models/queueing.py). Replicas then cover the target rate with headroom.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import cached_property
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

from capplan.catalog.calibration import calibration_gpu
from capplan.catalog.loader import Catalog, names_entry
from capplan.catalog.schema import GpuSpec, ModelSpec
from capplan.errors import InputError
from capplan.limits import DEFAULT_HEADROOM
from capplan.models.calibration import Calibration
from capplan.models.engine import EngineSettings, engine_profile
from capplan.models.features import resolve_draft_model
from capplan.models.layers import stack_layouts
from capplan.models.memory import MemoryReport, fp8_refusal, memory_report
from capplan.models.perf import StepModel, build_step_model
from capplan.models.prefix import PrefixCache
from capplan.models.queueing import LengthStats, Limits, QueueModel
from capplan.models.queueing.steady import tree_bisect
from capplan.plan.deployment import EngineOptions, KvPool, calibration_for, resolve_settings
from capplan.plan.slo import SloSet

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
    slos: SloSet
    lanes: tuple[str, ...]
    priority_scheduling: bool = False
    """Lanes of different priorities share the pool: the plan (and its simulation) assumes
    the engine serves lower priority values first."""
    prefix: PrefixCache = PrefixCache()
    """What automatic prefix caching saves on this traffic (none unless lanes share)."""
    lane_slos: tuple[tuple[str, SloSet], ...] = ()
    """Each lane's own SLOs (`slos` is their strictest): what a verify line of the mixed load
    can check (bench_cmds.shared_slos)."""


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
    max_model_len_reason: str = ""
    """Why max_model_len has its value (capplan.plan.launch.max_model_len_choice)."""
    features: tuple[tuple[str, Any], ...] = ()
    """Fixed feature settings (EngineOptions field, value): capplan/plan/features_plan.py."""
    spec_tokens: tuple[int | None, ...] = (None,)
    """Draft lengths searched (None: speculation off, or the method's default)."""
    max_loras: tuple[int, ...] = (0,)
    """LoRA slot counts searched (0: no LoRA)."""
    prefill_extra_flops_per_token: float = 0.0
    """Vision-encoder FLOPs per prefill token at TP 1 (features_plan, lanes with images)."""


@dataclass(frozen=True)
class ConfigGroup:
    """One (GPU, TP, weight dtype, KV dtype): its step model, and the KV cache of each
    (max_num_seqs, max_num_batched_tokens) combination (0 where it does not fit)."""

    gpu: GpuSpec
    settings: EngineSettings
    step: StepModel
    calibration: Calibration
    combos: tuple[tuple[int, int], ...]
    kv_tokens: tuple[int, ...]
    pool: KvPool | None = None
    """Block size and hybrid state blocks (num_blocks and the window cap vary by combination:
    `pool_at`)."""

    def pool_at(self, j: int) -> KvPool:
        """The KV block pool of combination j: its kv_tokens in blocks, window layers capped at
        the window behind its token budget (hybrids' block size and state blocks included)."""
        p = self.pool or KvPool(0, self.settings.block_size)
        return KvPool(self.kv_tokens[j] // p.block_size, p.block_size, p.state_blocks_per_seq,
                      p.layout.for_budget(p.block_size, self.combos[j][1]))


REPLAY_BINDING = "(replay)"
"""Suffix of a binding constraint the replay found (the SLO it missed by most)."""
_REPLAY_OPEN = REPLAY_BINDING[:-1]
"""The "(replay" prefix a binding with a detail continues: "KV capacity (replay: 647 ...)"."""


def replay_binding(what: str, detail: str | None = None) -> str:
    """The binding constraint `what` as the replay found it: "TTFT SLO (replay)", or with a
    detail "KV capacity (replay: 647 preemptions)"."""
    return f"{what} {REPLAY_BINDING}" if detail is None else f"{what} {_REPLAY_OPEN}: {detail})"


def replay_found(binding: str) -> bool:
    """A binding constraint the simulator's replay found (`replay_binding`): "TTFT SLO
    (replay)", "KV capacity (replay: 647 preemptions)" (verified._replay_binding)."""
    return binding.endswith(REPLAY_BINDING) or f"{_REPLAY_OPEN}:" in binding


def replay_bound(binding: str) -> str:
    """What binds, without the replay's suffix: "TTFT SLO (replay)" -> "TTFT SLO" (a binding
    the replay did not find unchanged)."""
    return binding.split(f" {_REPLAY_OPEN}")[0]


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One configuration tried by the analytic search, with what the search found for it."""

    group: ConfigGroup
    settings: EngineSettings
    kv_cache_tokens: int
    max_rate_per_s: float
    """Highest per-replica arrival rate that meets every SLO analytically, or the rate the
    replay confirmed where it found less (each replica's share plus the headroom: the
    replicas `sized_by_replay`, or verified._confirmed)."""
    capacity_per_s: float
    """Highest stable per-replica arrival rate (SLOs aside)."""
    binding_constraint: str
    """What limits a replica; ends in REPLAY_BINDING when the replay found it (it sized the
    replicas, `sized_by_replay`, or a replica missed the SLOs in the replay at the screen's
    capacity and carries what the replay confirmed: verified._confirmed)."""
    index: tuple[int, int]
    """(group, combination) position in the search's arrays."""
    replicas: int
    ttft_p99_s: float = math.inf
    """Analytic p99 TTFT at the per-replica rate (target / replicas), for ranking ties."""
    sized_by_replay: bool = False
    """The simulator's replay, not the analytic screen, set the replicas (and
    max_rate_per_s): the screen's count missed in simulation (verified._scaled_out)."""

    @property
    def gpu(self) -> GpuSpec:
        return self.group.gpu

    @property
    def step(self) -> StepModel:
        return self.group.step

    @property
    def gpus_total(self) -> int:
        return self.replicas * self.settings.tp * self.settings.pp * self.settings.attention_dp

    @property
    def cost_per_hour(self) -> float | None:
        return cost_per_hour(self.gpu, self.gpus_total)

    @property
    def pool(self) -> KvPool:
        """The KV block pool a simulation of this candidate runs on (hybrids' block size and
        state blocks included)."""
        return self.group.pool_at(self.index[1])

    @property
    def num_gpu_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def family(self) -> tuple[str, int, str, str] | tuple[str, int, str, str, int, int]:
        """What a recommendation row stands for: GPU, TP, weight and KV dtypes (and the
        attention-DP / EP layout when there is one)."""
        s = self.settings
        if s.attention_dp > 1 or s.expert_parallel > 1:
            return (self.gpu.key, s.tp, s.weight_dtype, s.kv_dtype, s.attention_dp,
                    s.expert_parallel)
        return (self.gpu.key, s.tp, s.weight_dtype, s.kv_dtype)


@dataclass(frozen=True)
class SearchResult:
    """Every candidate, and the analytic arrays they index (for predictions and near-misses)."""

    candidates: list[Candidate]
    queue: QueueModel
    at_plan: dict[str, Any]
    """QueueModel.at_rate at each configuration's planned per-replica rate."""
    floor_metrics: frozenset[str] = frozenset()
    """The SLOs' metrics, whose p99 at_floor holds."""
    searched: int | None = None
    """Configurations searched, when `candidates` holds only those that can reach the output
    (search_bound.planner_search); None: all of them."""

    @property
    def configurations_searched(self) -> int:
        return len(self.candidates) if self.searched is None else self.searched

    @cached_property
    def at_floor(self) -> dict[str, Any]:
        """QueueModel.at_rate at negligible load: the latency floor of each configuration (of
        the SLOs' metrics, p99 only). Computed when first read (a near-floor note or a
        nearest miss): most searches never read it."""
        with np.errstate(all="ignore"):
            return self.queue.at_rate(np.full(np.shape(self.queue.cap), 1e-6),
                                      self.floor_metrics)


def stack_step_models(models: list[StepModel]) -> StepModel:
    """One StepModel whose constants are column arrays (n, 1): evaluates all at once."""
    kw: dict[str, Any] = {}
    for f in fields(StepModel):
        vals = [getattr(m, f.name) for m in models]
        kw[f.name] = "; ".join(sorted(set(map(str, vals)))) if f.name in (
            "calibration_source", "spec_source") else np.asarray(vals, float)[:, None]
    return StepModel(**kw)


def _tp_ok(model: ModelSpec, tp: int, gpu: GpuSpec) -> bool:
    if model.num_attention_heads % tp or tp > gpu.interconnect.max_gpus_per_node:
        return False
    kvh = model.num_kv_heads
    return model.mla is not None or kvh % tp == 0 or tp % kvh == 0


Keep = Callable[[GpuSpec, EngineSettings], bool]
"""Which (GPU, engine settings) groups a search builds (the others are not sized at all)."""


def build_candidates(cat: Catalog, model: ModelSpec, space: SearchSpace,
                     calibration_path: str | Path | None = None,
                     keep: Keep | None = None) -> list[ConfigGroup]:
    """A step model per (gpu, tp, wd, kvd) that fits at all (and that `keep` allows), with
    the memory of each combo."""
    groups: list[ConfigGroup] = []
    combos = tuple((s, c) for s in space.max_num_seqs for c in searched_budgets(space))
    for gpu in space.gpus:
        cal = calibration_of(cat, gpu, space, calibration_path)
        for base in _gpu_settings(cat, model, gpu, space):
            if keep is not None and not keep(gpu, base):
                continue
            if fp8_refusal(model, base, gpu):  # the engine cannot run it: not searched
                continue
            group = _config_group(model, gpu, base, cal, combos, space)
            if group is not None:
                groups.append(group)
    return groups


def calibration_of(cat: Catalog, gpu: GpuSpec, space: SearchSpace,
                   calibration_path: str | Path | None = None) -> Calibration:
    """The calibration a search sizes `gpu` with: the file given (`calibration_path`, else the
    space's) applies to the GPU it was measured on; the others keep their own."""
    cal_path = calibration_path or space.calibration
    applies = cal_path is not None and names_entry(calibration_gpu(cal_path), gpu)
    return calibration_for(cat, gpu, cal_path if applies else None)


def refused(cat: Catalog, model: ModelSpec, space: SearchSpace) -> tuple[list[str], bool]:
    """Why configurations of the space were not searched: "gpu: reason", once each (the
    dtypes an engine cannot run on a GPU, models.memory.fp8_refusal), and whether that is
    every configuration."""
    out: dict[str, None] = {}
    every = True
    for gpu in space.gpus:
        for base in _gpu_settings(cat, model, gpu, space):
            why = fp8_refusal(model, base, gpu)
            every = every and why is not None
            if why:
                out[f"{gpu.key}: {why}"] = None
    return list(out), every and bool(out)


def searched_budgets(space: SearchSpace) -> tuple[int, ...]:
    """The token budgets a search sizes: those the engine runs with
    (SchedulerPolicy.launched_budget, which its launch line sets), so the plan predicts the
    budget it launches."""
    chunks = space.max_num_batched_tokens
    policy = engine_profile(space.engine).scheduler
    if policy.chunked_prefill:
        return chunks
    return tuple(sorted({policy.launched_budget(c, space.max_model_len) for c in chunks}))


def check_calibration_candidate(cal_path: str | Path | None, gpus: list[GpuSpec]) -> None:
    """A calibration file given to a search must be of one of its candidate GPUs (the others
    keep their own calibrations); checked once on the whole candidate list, since a search
    narrowed later (the disaggregated layout on the best's GPU) may leave that GPU out."""
    cal_gpu = calibration_gpu(cal_path) if cal_path else None
    if cal_gpu is None:
        return
    if any(names_entry(cal_gpu, g) for g in gpus):  # the file may name an alias (`h100`)
        return
    raise InputError(f"calibration {cal_path} was measured on {cal_gpu}, which is not a "
                     "candidate GPU; a calibration applies only to its own device")


def _gpu_settings(cat: Catalog, model: ModelSpec, gpu: GpuSpec, space: SearchSpace
                  ) -> list[EngineSettings]:
    """The engine settings searched on one GPU: every layout (TP, and the MoE attention-DP /
    EP layouts) x weight dtype x KV dtype x draft length x LoRA slots, engine knobs aside."""
    layouts = [(tp, 1, 1) for tp in space.tps if _tp_ok(model, tp, gpu)]
    layouts += moe_layouts(model, gpu, space)
    out = []
    for tp, dp, ep in layouts:
        for wd, kvd, k, loras in product(space.weight_dtypes, space.kv_dtypes,
                                         space.spec_tokens, space.max_loras):
            base = resolve_settings(EngineOptions(
                engine=space.engine, tp=tp, weight_dtype=wd, kv_dtype=kvd,
                max_model_len=space.max_model_len,
                gpu_memory_utilization=space.gpu_memory_utilization,
                block_size=space.block_size, attention_dp=dp, expert_parallel=ep,
                **dict(space.features), spec_tokens=k, max_loras=loras), gpu)
            out.append(resolve_draft_model(cat, base))
    return out


def _config_group(model: ModelSpec, gpu: GpuSpec, base: EngineSettings, cal: Calibration,
                  combos: tuple[tuple[int, int], ...], space: SearchSpace
                  ) -> ConfigGroup | None:
    """One group's memory per (max_num_seqs, chunk) combination and its step model; None when
    no combination fits."""
    reports = [_report(model, gpu, base, seqs, chunk) for seqs, chunk in combos]
    kv_tokens = tuple(r.replica_kv_cache_tokens if r.fits else 0 for r in reports)
    if not any(kv_tokens):
        return None
    step = build_step_model(model, gpu, base, cal)
    if space.prefill_extra_flops_per_token:
        step = replace(step, prefill_extra_flops_per_token=(
            space.prefill_extra_flops_per_token / base.tp))
    return ConfigGroup(gpu, base, step, cal, combos, kv_tokens, KvPool.of(reports[0]))


def moe_layouts(model: ModelSpec, gpu: GpuSpec, space: SearchSpace
                ) -> list[tuple[int, int, int]]:
    """(tp, attention_dp, expert_parallel) layouts searched for a MoE model besides plain TP:
    attention DP over every GPU of the world with the experts sharded over all of them (how
    SGLang and TensorRT-LLM serve DeepSeek: `--tp W --enable-dp-attention --dp W --ep-size W`;
    vLLM `--data-parallel-size W --enable-expert-parallel`), for the space's TP sizes as
    worlds, and a two-node world on a GPU with a scale-out network (docs/multinode.md)."""
    p = engine_profile(space.engine)
    if model.moe is None or not (p.supports_attention_dp and p.supports_expert_parallel):
        return []
    node = gpu.interconnect.max_gpus_per_node
    worlds = {w for w in space.tps if 1 < w <= node}
    if gpu.network is not None and node <= 8:
        worlds.add(2 * node)
    return [(1, w, w) for w in sorted(worlds) if model.moe.num_experts % w == 0]


def _report(model: ModelSpec, gpu: GpuSpec, base: EngineSettings, seqs: int, chunk: int
            ) -> MemoryReport:
    return memory_report(model, gpu, base.with_(max_num_seqs=seqs, max_num_batched_tokens=chunk))


def _binding(res: dict[str, Any], slos: SloSet, qm: QueueModel, seqs: np.ndarray) -> np.ndarray:
    """Name what fails first just above the best rate."""
    out = np.full(np.shape(res["stable"]), "decode bandwidth", dtype=object)
    stable = np.asarray(res["stable"], bool)
    kv_limited = qm.cap < seqs
    slot = res["slot_utilization"] >= 0.98
    out = np.where(~stable & slot & kv_limited, "KV capacity", out)
    out = np.where(~stable & slot & ~kv_limited, "concurrency cap (max_num_seqs)", out)
    out = np.where(~stable & (res["prefill_utilization"] >= 0.98), "prefill compute", out)
    # A stable configuration is bound by the SLO it exceeds; E2E over TTFT over TBT.
    missed = {t.metric: (t, mask) for t, mask in slos.violated(res)}
    for metric in ("tbt_s", "tpot_s", "ttft_s", "e2e_s"):
        if metric in missed:
            t, mask = missed[metric]
            out = np.where(stable & mask, f"{t.label} SLO", out)
    return out


def analytic_search(groups: list[ConfigGroup], t: Traffic, headroom: float = DEFAULT_HEADROOM
                    ) -> SearchResult:
    """Highest SLO-compliant rate per replica for every configuration, vectorised."""
    qm, seqs, kv = _queue_model(groups, t)
    need = {tgt.metric for tgt in t.slos}
    with np.errstate(all="ignore"):
        cap = qm.capacity_rate()
        lo = _slo_rate(qm, cap, t.slos, need)
        binding = _binding(qm.at_rate(np.maximum(lo * 1.03, 1e-6), need), t.slos, qm, seqs)
        reps = np.maximum(1.0, np.ceil(t.rate_per_s * (1 + headroom) / np.maximum(lo, 1e-12)
                                       - 1e-9))
        pred = qm.at_rate(np.where(lo > 0, t.rate_per_s / reps, 1e-6))
    found = [Candidate(
        group=g, settings=g.settings.with_(max_num_seqs=s, max_num_batched_tokens=c),
        kv_cache_tokens=int(kv[i, j]), max_rate_per_s=float(lo[i, j]),
        capacity_per_s=float(cap[i, j]), binding_constraint=str(binding[i, j]), index=(i, j),
        replicas=int(reps[i, j]), ttft_p99_s=float(pred["ttft_s"]["p99"][i, j]))
        for i, g in enumerate(groups) for j, (s, c) in enumerate(g.combos) if kv[i, j] > 0]
    return SearchResult(found, qm, pred, frozenset(need))


def _queue_model(groups: list[ConfigGroup], t: Traffic
                 ) -> tuple[QueueModel, np.ndarray, np.ndarray]:
    """One QueueModel over every (group, combination): rows are groups, columns combinations;
    with the replica's max_num_seqs and KV tokens as arrays of that shape."""
    sm = stack_step_models([g.step for g in groups])
    # engine limits are per attention-DP rank: a replica holds dp x them
    dps = np.asarray([[g.settings.attention_dp] for g in groups], float)
    seqs = np.asarray([[c[0] for c in g.combos] for g in groups], float) * dps
    chunk = np.asarray([[c[1] for c in g.combos] for g in groups], float) * dps
    kv = np.asarray([g.kv_tokens for g in groups], float)
    policy = groups[0].settings.profile.scheduler if groups else None  # one engine per plan
    pools = [[g.pool_at(j) for j in range(len(g.combos))] for g in groups]
    state = np.asarray([[p[0].state_tokens_per_seq] for p in pools], float)
    block = np.asarray([[p[0].block_size] for p in pools], float)
    # window layers capped at the window behind each combination's chunk (per rank)
    layout = stack_layouts([[p.layout for p in row] for row in pools])
    qm = QueueModel(sm, t.inp, t.out, Limits(seqs, chunk, kv, state, block, layout),
                    t.arrival_scv, policy, t.prefix)
    return qm, seqs, kv


def _slo_rate(qm: QueueModel, cap: np.ndarray, slos: SloSet, need: set[str]) -> np.ndarray:
    """The highest rate meeting every SLO, by _BISECT halvings of [0, capacity] per row (the
    SLOs read only their metrics' p99: the rest of the laws is not built)."""
    def ok(rate: np.ndarray) -> np.ndarray:
        res = qm.at_rate(rate, need)
        return np.asarray(res["stable"], bool) & slos.ok(res)

    return tree_bisect(ok, np.zeros_like(cap), np.maximum(cap, 1e-9), _BISECT)[0]


def cost_per_hour(gpu: GpuSpec, gpus: int) -> float | None:
    return None if gpu.price_per_hour_usd is None else gpu.price_per_hour_usd * gpus


RankKey = Callable[[Candidate], tuple[float, ...]]


def slot_shortfall(settings: Any) -> int:
    """The traffic's LoRA adapters beyond the slots (0 without LoRA): a tie-break of the
    ranking (`rank_key`, search_bound._to_bisect)."""
    if not settings.max_loras:
        return 0
    return max(int(settings.lora_adapters or settings.max_loras) - int(settings.max_loras), 0)


def rank_key(objective: str) -> RankKey:
    """Sort key of candidates for an objective (smaller is better)."""
    def key(c: Candidate) -> tuple[float, ...]:
        cost = c.cost_per_hour if c.cost_per_hour is not None else math.inf
        # Ties (same cost and GPUs) go to the fewer adapters without a LoRA slot (the screen
        # does not price a request's wait for its adapter's slot, models/lora.py; a slot
        # costs its adapter's weights), then to the lower p99 TTFT (to the ms), then to the
        # smaller max_num_seqs: no reason to advertise a bigger cap than the traffic needs.
        tie = (slot_shortfall(c.settings), round(c.ttft_p99_s, 3), c.settings.max_num_seqs)
        if objective == "min_gpus":
            return (c.gpus_total, cost, *tie)
        if objective == "max_goodput_per_dollar":
            gpd = c.max_rate_per_s / (c.cost_per_hour / c.replicas) if c.cost_per_hour else 0.0
            return (-gpd, c.gpus_total, *tie)
        return (cost, c.gpus_total, *tie)
    return key


def nearest_miss(found: SearchResult, t: Traffic) -> str:
    """Why nothing meets the SLOs, and what it would take."""
    best: Candidate | None = None
    best_ratio, detail = math.inf, None
    for c in found.candidates:
        i, j = c.index
        at_floor: dict[str, dict[str, Any]] = {}
        for tgt in t.slos:
            at_floor.setdefault(tgt.metric, {})[tgt.stat] = \
                found.at_floor[tgt.metric][tgt.stat][i, j]
        worst = t.slos.worst(at_floor)
        if worst[0] < best_ratio:
            best_ratio, best, detail = worst[0], c, worst
    if best is None or detail is None:
        return "no candidate configuration fits the model in memory"
    if best_ratio < 1:  # the SLOs hold at low load: the rate needs too many replicas
        fastest = max(found.candidates, key=lambda c: c.max_rate_per_s)
        return (f"no configuration serves {t.rate_per_s:g} req/s with a sensible number of "
                f"replicas: the fastest, {fastest.gpu.key} TP {fastest.settings.tp}, sustains "
                f"{fastest.max_rate_per_s:.3g} req/s per replica within the SLOs; split the "
                "traffic into several deployments or plan a lower rate")
    _, target, v = detail
    name = f"p99 {target.label}" if target else ""
    slo = target.limit_s if target else 0.0
    label = target.label if target else ""
    return (f"no configuration meets the SLOs: the closest, {best.gpu.key} TP {best.settings.tp} "
            f"({best.settings.weight_dtype}), reaches {name} {v * 1e3:.0f} ms even at negligible "
            f"load against {slo * 1e3:.0f} ms (binding: {label} SLO); loosen it to "
            f">= {v * 1.05 * 1e3:.0f} ms, shorten prompts/outputs, or use a faster GPU or more TP")
