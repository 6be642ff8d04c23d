"""Score the fixed-layout disaggregated prediction against the `disagg` rows of the silicon sample.

`../shared/validation/silicon_sample.csv` (AIConfigurator, Apache-2.0): mean TTFT and TPOT of
disaggregated deployments (prefill_num_workers x prefill layout, decode_num_workers x decode
layout) under a closed loop of C clients (`silicon_concurrency=`), fixed input/output lengths.

The harness reads rows and scores; the prediction is the product's: what `capplan latency
--prefill-workers ... --concurrency C` answers, the replay of the benchmark on the layout
(capplan.plan.pd_sim.benchmark_replay, AIConfigurator's script's 20 x C measured requests; a
row whose replay is above the sim_tokens limit by the analytic solve, as `latency` answers it;
--analytic: the analytic solve, capplan.plan.pd.PdModel.closed_loop, for every row); nothing
fitted but the implied counts' RIDGE_STEP, which the rule check measures:
- a worker's layout as the row gives it: tp_size x attention_dp_size GPUs (x pp_size), MoE
  layers over moe_ep_size expert-parallel ranks (capplan's notation is AIConfigurator's), and
  its batch_size as the engine's max batch per attention-DP rank when the row sets it;
- a worker wider than the GPU's NVLink domain spans nodes over the catalog's network
  (docs/multinode.md); the KV link is NVLink when both pools fit one domain (an NVL72 rack),
  else the network;
- a worker whose TP cannot split the model's attention heads (TP 48 of DeepSeek's 128), or an
  SGLang or TensorRT-LLM worker over more than 8 GPUs recorded as TP, as attention DP over its
  GPUs (`as_attention_dp`: such rows do not record DP attention);
- a row without counts whose measurement (engine, system, lengths, C, TTFT and TPOT) equals a
  stated row's exactly is that row's run (`as_twin`: the dump holds DeepSeek-R1 rows that are
  DeepSeek-V3 runs): predicted with the stated row's workers, layouts and batch sizes;
- a row that gives its workers' layouts but not how many ran: the counts a planner sizing its
  deployment for the sweep's largest C deploys (capplan.plan.pd.implied_workers: decode
  workers whose batch at that peak is at most the ridge batch, prefill workers that carry the
  decode pool's cycle rate with the planner's headroom), with the engine's default max batch
  (such rows give no batch either). A row's sweep is the rows of its configuration (the
  `config_id` of its source) with the same lengths; a row that names no configuration is its
  own sweep (its C is the peak).
Errors |predicted / measured - 1| as median / p90 / median signed bias, by engine and system.

Run: .venv/bin/python benchmarks/validate_disagg.py [--per-group N] [--data CSV] [--write-docs]
[--stated-only | --implied-all] [--decode-rule sweep|ridge|slots] [--analytic]
[--prefill-rate FRAC] [--replay-rounds K] [--batch-rule row|pow2|pow2-top]
(default 10 rows per engine and system, every k-th row by id; --per-group 0 scores every row;
--write-docs rewrites the generated blocks of docs/validation.md with the full scoring;
--stated-only scores only rows that give their worker counts; --implied-all applies the
implied-count rule to every row, ignoring the counts and batch sizes rows give: the rule's
check on rows whose counts are known, with the inferred vs the real counts; --decode-rule:
sweep, the default, sizes the decode workers for the sweep's largest C, ridge for the row's
own C, slots fills each worker's slots; --prefill-rate: a what-if, every engine profile's
prompt-token GEMMs and attention at FRAC of capplan's rates, EngineProfile.prefill_rate_frac;
--replay-rounds: a what-if, the benchmark replay runs K rounds before it repeats the mean of
rounds 2..K for the rest, capplan.plan.aiconfigurator.REPLAY_ROUNDS, 20 replays every round;
--batch-rule pow2: a what-if, a stated row's decode batch as its sweep's deployment's, the
largest power of two at most the rows' batch at the sweep's largest C; pow2-top: that cap on
the rows above it only, docs/validation.md 6)
"""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
from bars import PD_BARS

from capplan import limits
from capplan.catalog.loader import load_catalog
from capplan.errors import CapplanError
from capplan.models import engine
from capplan.models.queueing import LengthStats
from capplan.plan.aiconfigurator import MEASURED_ROUNDS, SYSTEM_GPUS, disagg_worker
from capplan.plan.pd import RIDGE_STEP, PdModel, implied_workers, make_layout
from capplan.plan.pd_sim import benchmark_replay, replayed_requests
from capplan.sim.protocol import preset

ROOT = Path(__file__).resolve().parents[1]
DATA = (Path(sys.argv[sys.argv.index("--data") + 1]) if "--data" in sys.argv
        else ROOT.parent / "shared" / "validation" / "silicon_sample.csv")
DOC = ROOT / "docs" / "validation.md"
WAVES = preset("aiperf").prompts_per_client
"""`--analytic`: the start-up wave's weight in the analytic closed loop, AIPerf as NVIDIA's
recipes run it (10 x C requests after the warm-ups, every client sending at t = 0;
capplan.sim.protocol)."""
ANALYTIC = "--analytic" in sys.argv
"""Score the analytic closed-loop solve (PdModel.closed_loop) instead of the benchmark replay
(capplan.plan.pd_sim.benchmark_replay, the default: AIConfigurator's benchmark script, 20 x C
measured requests after drained warm-ups, MEASURED_ROUNDS)."""
BARS = PD_BARS
"""The issue's bars for rows not seen: share predicted, median |error| of TPOT and TTFT."""


def concurrency(row: dict[str, str]) -> int | None:
    src = row["silicon_data_source"]
    if "silicon_concurrency=" in src:
        return int(src.split("silicon_concurrency=")[1].split(";")[0])
    return None


def _size(v: str) -> int:
    return int(v) if v and int(v) > 0 else 1


WIDE_TP = 8
"""The widest attention-TP worker of the SGLang and TensorRT-LLM rows that state their layout:
every worker of theirs over more GPUs (51) runs attention DP, and so does every such worker of
a stated row that a row without counts repeats with TP recorded (51 of 51: `twins_text`)."""


def as_attention_dp(cat, r: dict[str, str]) -> dict[str, str]:
    """The row with a worker read as attention DP over its GPUs where its recorded TP is one
    the deployment cannot or did not run: TP that cannot split the model's attention heads
    (TP 48 of DeepSeek's 128), and on SGLang and TensorRT-LLM TP over more than WIDE_TP GPUs.
    Large expert-parallel deployments run DP attention (SGLang --tp N --dp N
    --enable-dp-attention, TensorRT-LLM enable_attention_dp), which the rows without counts do
    not record (their attention_dp_size is 1)."""
    try:
        heads = cat.model(r["model_path"]).num_attention_heads
    except CapplanError:
        return r
    out = dict(r)
    wide = WIDE_TP if r["backend"] in ("sglang", "trtllm") else math.inf
    for role in ("prefill", "decode"):
        tp = _size(r[f"{role}_tp_size"])
        if (heads % tp or tp > wide) and _size(r[f"{role}_attention_dp_size"]) == 1:
            out[f"{role}_tp_size"], out[f"{role}_attention_dp_size"] = "1", str(tp)
    return out


_DEPS: dict[tuple, object] = {}


def _worker(cat, r: dict[str, str], role: str):
    """A worker's deployment (capplan.plan.aiconfigurator.disagg_worker), memoised."""
    size = [_size(r[f"{role}_{k}"]) for k in ("tp_size", "pp_size", "attention_dp_size",
                                               "moe_ep_size")]
    bs = _size(r[f"{role}_batch_size"]) if r[f"{role}_batch_size"] else None
    key = (r["backend"], r["model_path"], r["system"], r["precision"], *size, bs,
           int(r["isl"]) + int(r["osl"]))
    if key not in _DEPS:
        _DEPS[key] = disagg_worker(cat, r, role)
    return _DEPS[key]


PREFILL_RATE = (float(sys.argv[sys.argv.index("--prefill-rate") + 1])
                if "--prefill-rate" in sys.argv else None)
"""What-if: every engine profile's prefill_rate_frac (docs/perf.md, "Prefill of DeepSeek-V3/R1
against published deployments": capplan's prefill computation against the published one)."""
if PREFILL_RATE is not None:
    for _name, _versions in engine.VERSIONS.items():
        engine.VERSIONS[_name] = tuple(replace(p, prefill_rate_frac=PREFILL_RATE)
                                       for p in _versions)
        engine.PROFILES[_name] = engine.VERSIONS[_name][-1]
    engine._engine_profile.cache_clear()  # noqa: SLF001 (profiles resolved before the change)
ROUNDS_WHAT_IF = (int(sys.argv[sys.argv.index("--replay-rounds") + 1])
                  if "--replay-rounds" in sys.argv else None)
"""What-if: rounds the benchmark replay runs before it repeats the mean of rounds 2..K for the
rest (capplan.plan.aiconfigurator.REPLAY_ROUNDS; 20 replays AIPerf's 20 rounds whole)."""
if ROUNDS_WHAT_IF is not None:
    import capplan.plan.aiconfigurator as _aic

    _aic.REPLAY_ROUNDS = ROUNDS_WHAT_IF
STATED_ONLY = "--stated-only" in sys.argv
"""Score only the rows that give their worker counts."""
DECODE_RULE = sys.argv[sys.argv.index("--decode-rule") + 1] if "--decode-rule" in sys.argv \
    else "sweep"
"""The implied decode workers: sweep (the default: implied_workers' ridge rule sized for the
sweep's largest C), ridge (the same for the row's own C) or slots (the fewest workers whose
slots hold the row's C)."""
RULES = {"sweep": ("ridge", True), "ridge": ("ridge", False), "slots": ("slots", False)}
"""--decode-rule -> (implied_workers' decode_rule, sized for the sweep's peak)."""
PEAKS: dict[tuple, int] = {}
"""A sweep's largest C (`sweep`), filled from every row of the file (`note_peaks`)."""


def sweep(r: dict[str, str]) -> tuple | None:
    """The row's configuration sweep: its source's config_id with the row's engine, model,
    system, precision and lengths (None: the row names no configuration)."""
    src = r["silicon_data_source"]
    if "config_id=" not in src:
        return None
    cid = src.split("config_id=")[1].split(";")[0].strip()
    return (cid, r["backend"], r["model_path"], r["system"], r["precision"], r["isl"],
            r["osl"])


def note_peaks(rows: list[dict[str, str]]) -> None:
    """Record each sweep's largest C (every row of the file, before any sampling)."""
    for r in rows:
        key, c = sweep(r), concurrency(r)
        if key is not None and c is not None:
            PEAKS[key] = max(PEAKS.get(key, 0), c)


def peak(r: dict[str, str]) -> int:
    """The clients the row's deployment is sized for: its sweep's largest C, else its C."""
    c = concurrency(r) or 1
    key = sweep(r)
    return max(c, PEAKS.get(key, c)) if key is not None else c
BATCH_RULE = sys.argv[sys.argv.index("--batch-rule") + 1] if "--batch-rule" in sys.argv \
    else "row"
"""A stated row's decode batch: row (its batch_size, the default), pow2 (what-if: its sweep's
deployment's, `deployed_batch`) or pow2-top (that cap where it is below the row's batch)."""


def deployed_batch(r: dict[str, str]) -> dict[str, str]:
    """The row with its decode batch as its sweep's deployment's: one max batch per
    deployment, the largest power of two at most the batch_size at the sweep's largest C."""
    if BATCH_RULE == "row" or not stated(r) or not r["decode_batch_size"]:
        return r
    ranks = _size(r["decode_num_workers"]) * _size(r["decode_attention_dp_size"])
    top = max(1, peak(r) // ranks)
    cap = 1 << (top.bit_length() - 1)
    if BATCH_RULE == "pow2-top":
        cap = min(cap, _size(r["decode_batch_size"]))
    return {**r, "decode_batch_size": str(cap)}


IMPLIED_ALL = "--implied-all" in sys.argv
"""Apply the implied-count rule to every row, its stated counts and batch sizes ignored."""


TWINS: dict[tuple, dict[str, str]] = {}
"""Stated rows by their measurement (`twin_key`), filled from every row of the file
(`note_twins`)."""


def twin_key(r: dict[str, str]) -> tuple:
    """A measurement: engine, system, lengths, C, TTFT and TPOT as the row records them."""
    return (r["backend"], r["system"], r["isl"], r["osl"], concurrency(r), r["silicon_ttft_ms"],
            r["silicon_tpot_ms"])


def note_twins(rows: list[dict[str, str]]) -> None:
    """Record every stated row by its measurement (before any sampling)."""
    for r in rows:
        if stated(r):
            TWINS.setdefault(twin_key(r), r)


def as_twin(r: dict[str, str]) -> dict[str, str]:
    """A row without counts whose measurement equals a stated row's exactly is that row's run
    (the dump holds DeepSeek-R1 rows that are DeepSeek-V3 runs): its workers and layouts as
    the stated row gives them; any other row as it is."""
    twin = None if stated(r) else TWINS.get(twin_key(r))
    if twin is None:
        return r
    return {**r, **{k: v for k, v in twin.items() if k.startswith(("prefill_", "decode_"))}}


def stated(r: dict[str, str]) -> bool:
    """Whether the row gives both pools' worker counts."""
    return bool(r["prefill_num_workers"] and r["decode_num_workers"])


def as_unstated(r: dict[str, str]) -> dict[str, str]:
    """The row as one without worker counts or batch sizes (what the other rows give)."""
    return {**r, **{f"{role}_{k}": "" for role in ("prefill", "decode")
                    for k in ("num_workers", "batch_size")}}


def why_not(cat, r: dict[str, str]) -> str | None:
    """Why a row cannot be placed as given (None: it can): the reason counted in the table."""
    if concurrency(r) is None:
        return "no concurrency in its source"
    if not stated(r) and STATED_ONLY:
        return "no worker counts (the layout it measured is not given)"
    try:
        cat.model(r["model_path"])
    except CapplanError:
        return "model not in the catalog"
    return None


_MODELS: dict[tuple, PdModel] = {}


def counts(cat, r: dict[str, str], rule: str | None = None,
           ridge_step: float | None = None) -> tuple[int, int]:
    """(prefill, decode) workers: the row's, or the implied ones (`rule`, default DECODE_RULE;
    `ridge_step`: the ridge rule at that step ratio instead of RIDGE_STEP) when it gives
    none."""
    if stated(r):
        return _size(r["prefill_num_workers"]), _size(r["decode_num_workers"])
    isl, osl = int(r["isl"]), int(r["osl"])
    decode_rule, at_peak = RULES[rule or DECODE_RULE]
    if ridge_step is not None and decode_rule == "ridge":
        decode_rule = ridge_step
    c = concurrency(r)
    return implied_workers(_worker(cat, r, "prefill"), _worker(cat, r, "decode"),
                           LengthStats.fixed(isl), LengthStats.fixed(osl), c,
                           decode_rule=decode_rule, peak_concurrency=peak(r) if at_peak else c)


def model_for(cat, r: dict[str, str], p: int, d: int) -> PdModel:
    """The layout's PdModel for the row's lengths, memoised (rows that differ only in C share
    it: its pools' capacities are the costly part)."""
    pre, dec = _worker(cat, r, "prefill"), _worker(cat, r, "decode")
    key = (id(pre), p, id(dec), d, r["isl"], r["osl"])
    if key not in _MODELS:
        _MODELS[key] = PdModel(make_layout(pre, p, dec, d), LengthStats.fixed(int(r["isl"])),
                               LengthStats.fixed(int(r["osl"])))
    return _MODELS[key]


_REPLAYS: dict[tuple, dict] = {}
FALLBACK: set[str] = set()
"""Ids of rows whose replay is above the sim_tokens limit, answered analytically as `latency`
answers them."""


def _replayed(cat, r: dict[str, str], p: int, d: int) -> dict:
    """The product's benchmark replay of the row's layout (capplan.plan.pd_sim.
    benchmark_replay: 20 x C requests), memoised by its inputs (rows that repeat a layout,
    its lengths and C, and the rule check's second scoring, replay once)."""
    pre, dec = _worker(cat, r, "prefill"), _worker(cat, r, "decode")
    c = concurrency(r)
    if replayed_requests(c, MEASURED_ROUNDS * c, int(r["osl"])) * int(r["osl"]) > limits.cap(
            "sim_tokens"):
        # `latency` answers such a loop with the analytic solve (pd_sim.closed_loop_latency)
        FALLBACK.add(r["id"])
        return model_for(cat, r, p, d).closed_loop(c, waves=MEASURED_ROUNDS)
    key = (id(pre), p, id(dec), d, r["isl"], r["osl"], c)
    if key not in _REPLAYS:
        _REPLAYS[key] = benchmark_replay(make_layout(pre, p, dec, d), c, r["isl"], r["osl"],
                                         MEASURED_ROUNDS * c)
    return _REPLAYS[key]


def predict(cat, r: dict[str, str], implied: bool = IMPLIED_ALL,
            ridge_step: float | None = None) -> tuple[float, float] | str:
    """(TTFT, TPOT) in seconds, or why the row has no prediction (`implied`: the row's worker
    counts and batch sizes ignored, the implied counts used, `ridge_step` as `counts`)."""
    r = as_unstated(r) if implied else (r if STATED_ONLY else as_twin(r))
    r = deployed_batch(as_attention_dp(cat, r))
    reason = why_not(cat, r)
    if reason:
        return reason
    c = concurrency(r)
    try:
        p, d = counts(cat, r, ridge_step=ridge_step)
        if ANALYTIC:
            res = model_for(cat, r, p, d).closed_loop(c, waves=WAVES)
        else:
            res = _replayed(cat, r, p, d)
    except CapplanError as e:
        msg = str(e)
        if "fit" in msg:
            return "a worker does not fit its GPUs"
        if "capacity" in msg:
            return "no prefill capacity for its lengths"
        return f"a layout the engine does not run ({msg.split(':')[0]})"
    ttft, tpot = res["ttft_s"]["mean"], res["tpot_s"]
    tpot = tpot["mean"] if isinstance(tpot, dict) else tpot
    if not (math.isfinite(ttft) and math.isfinite(tpot)):
        return "no steady state"
    return ttft, tpot


def cell(e: np.ndarray) -> str:
    if not e.size:
        return "-"
    return (f"{np.median(np.abs(e)):.0%} / {np.quantile(np.abs(e), 0.9):.0%} / "
            f"{np.median(e):+.0%}")


def score(rows: list[dict[str, str]], implied: bool = IMPLIED_ALL,
          ridge_steps: dict[str, float] | None = None) -> tuple[dict, dict[str, int]]:
    """Errors by (engine, system), (engine, all) and (all, all); `ridge_steps`: the implied
    ridge rule's step ratio by system (the leave-one-system-out check)."""
    cat = load_catalog()
    groups: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    reasons: dict[str, int] = defaultdict(int)
    for r in rows:
        p = predict(cat, r, implied, (ridge_steps or {}).get(r["system"]))
        keys = ((r["backend"], r["system"]), (r["backend"], "all"), ("all", "all"))
        for key in keys:
            groups[key]["rows"].append(1.0)
        if isinstance(p, str):
            reasons[p] += 1
            continue
        mt, mp = float(r["silicon_ttft_ms"]) / 1e3, float(r["silicon_tpot_ms"]) / 1e3
        for key in keys:
            groups[key]["ttft"].append(p[0] / mt - 1)
            groups[key]["tpot"].append(p[1] / mp - 1)
    return groups, dict(reasons)


def table(groups: dict) -> str:
    lines = ["| engine | system | rows | predicted | TTFT median / p90 / bias | "
             "TPOT median / p90 / bias |", "|---|---|---|---|---|---|"]
    for key in sorted(groups, key=lambda k: (k[0] == "all", k[1] == "all", k)):
        g = groups[key]
        n, k = len(g["rows"]), len(g["ttft"])
        lines.append(f"| {key[0]} | {key[1]} | {n} | {k / n:.0%} | "
                     f"{cell(np.asarray(g['ttft']))} | {cell(np.asarray(g['tpot']))} |")
    return "\n".join(lines)


def count_check(rows: list[dict[str, str]], rule: str) -> str:
    """The implied counts (capplan.plan.pd.implied_workers, the row's counts and batch sizes
    ignored) against the counts the rows state, by engine: how often each pool's count is the
    same, fewer or more, and the median of implied over stated GPUs."""
    cat = load_catalog()
    by: dict[str, list[tuple[int, int, int, int, float]]] = defaultdict(list)
    for r in rows:
        if not stated(r) or why_not(cat, r):
            continue
        r = as_attention_dp(cat, r)
        try:
            p, d = counts(cat, as_unstated(r), rule)
        except CapplanError:
            continue
        sp, sd = counts(cat, r)
        pg, dg = (_worker(cat, r, role).gpus_per_replica for role in ("prefill", "decode"))
        ratio = (p * pg + d * dg) / (sp * pg + sd * dg)
        for key in (r["backend"], "all"):
            by[key].append((np.sign(p - sp), np.sign(d - sd), p, d, ratio))

    def split(v: list[int]) -> str:
        n = len(v)
        return " / ".join(f"{sum(1 for x in v if x == s) / n:.0%}" for s in (0, -1, 1))

    lines = ["| engine | rows | prefill workers same / fewer / more | decode workers same / "
             "fewer / more | implied / stated GPUs, median (p10-p90) |", "|---|---|---|---|---|"]
    for key in sorted(by, key=lambda k: (k == "all", k)):
        v = by[key]
        g = np.asarray([x[4] for x in v])
        lines.append(f"| {key} | {len(v)} | {split([x[0] for x in v])} | "
                     f"{split([x[1] for x in v])} | {np.median(g):.2f} "
                     f"({np.quantile(g, 0.1):.2f}-{np.quantile(g, 0.9):.2f}) |")
    return "\n".join(lines)


def unstated_text(rows: list[dict[str, str]]) -> str:
    """What the rows without counts share with other rows: a group of them by layout, lengths
    and source measuring the same C twice (it mixes configurations), and measurements that are
    a stated row's too (same engine, system, lengths and C, TPOT within 0.5%)."""
    def layout(r: dict[str, str]) -> tuple:
        return tuple(r[f"{role}_{k}"] for role in ("prefill", "decode")
                     for k in ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
                               "moe_ep_size"))

    def source(r: dict[str, str]) -> str:
        return ";".join(x for x in r["silicon_data_source"].split(";")
                        if "silicon_concurrency=" not in x)

    bare = [r for r in rows if not stated(r)]
    seen: dict[tuple, int] = defaultdict(int)
    for r in bare:
        seen[(r["backend"], r["model_path"], r["system"], r["isl"], r["osl"], source(r),
              layout(r), concurrency(r))] += 1
    twice = sum(n for n in seen.values() if n > 1)
    known: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if stated(r):
            known[(r["backend"], r["system"], r["isl"], r["osl"], concurrency(r))].append(
                float(r["silicon_tpot_ms"]))
    same = sum(1 for r in bare if any(
        abs(float(r["silicon_tpot_ms"]) / t - 1) < 0.005 for t in known[(
            r["backend"], r["system"], r["isl"], r["osl"], concurrency(r))]))
    return (f"Rows without counts: {len(bare)}; {twice} share their layout, lengths, source and "
            "C with another row (one group measured two configurations); "
            f"{same} repeat a stated row's measurement (same engine, system, lengths and C, "
            f"TPOT within 0.5%). " + twins_text(rows, bare))


def twins_text(rows: list[dict[str, str]], bare: list[dict[str, str]]) -> str:
    """The rows without counts that equal a stated row's TTFT and TPOT exactly: how many carry
    another model name, and how their recorded layouts read the stated ones' attention DP."""
    exact = {}
    for r in rows:
        if stated(r):
            exact.setdefault(twin_key(r), r)
    twins = [(r, exact[k]) for r in bare if (k := twin_key(r)) in exact]
    names = defaultdict(int)
    for r, s in twins:
        if r["model_path"] != s["model_path"]:
            names[(r["model_path"].split("/")[-1], s["model_path"].split("/")[-1])] += 1
    renamed = ", ".join(f"{n} {a} rows that are a {b} row's measurement"
                        for (a, b), n in sorted(names.items(), key=lambda x: -x[1]))
    wide = [(r, s, role) for r, s in twins for role in ("prefill", "decode")
            if _size(r[f"{role}_tp_size"]) > WIDE_TP]
    wide_dp = sum(1 for r, s, role in wide if _size(s[f"{role}_tp_size"]) == 1
                  and _size(s[f"{role}_attention_dp_size"]) == _size(r[f"{role}_tp_size"]))
    renamed = renamed or "none under another model name"
    own = [(r, role) for r in rows if stated(r) and r["backend"] in ("sglang", "trtllm")
           for role in ("prefill", "decode") if gpus_of(r, role) > WIDE_TP]
    own_dp = sum(1 for r, role in own if _size(r[f"{role}_attention_dp_size"]) > 1)
    return (f"Of the stated SGLang and TensorRT-LLM rows' workers over {WIDE_TP} GPUs, "
            f"{own_dp} of {len(own)} run attention DP. {len(twins)} equal a stated row's TTFT "
            f"and TPOT exactly ({renamed}); their recorded layouts give the worker's GPUs as its "
            f"TP: of their {len(wide)} workers over more than {WIDE_TP} GPUs, {wide_dp} are "
            "attention DP in the stated row.")


def gpus_of(r: dict[str, str], role: str) -> int:
    """GPUs of a row's worker as its columns record them (tp x attention DP x pp)."""
    return (_size(r[f"{role}_tp_size"]) * _size(r[f"{role}_attention_dp_size"])
            * _size(r[f"{role}_pp_size"]))


def reasons_text(reasons: dict[str, int]) -> str:
    return "Rows not predicted, by reason: " + (
        "; ".join(f"{why}: {n}" for why, n in sorted(reasons.items(), key=lambda x: -x[1]))
        or "none") + "."


def peak_step_ratio(cat, r: dict[str, str]) -> float | None:
    """The step ratio at which a row that states its counts runs its decode workers at its
    sweep's largest C: the decode step at peak / D sequences a worker (at most its slots)
    over its one-sequence step, the worker as the rows without counts give it (engine's
    default batch). None: the row cannot be placed."""
    workers = _size(r["decode_num_workers"])
    r = as_attention_dp(cat, as_unstated(r))
    if why_not(cat, r):
        return None
    try:
        pre, dec = _worker(cat, r, "prefill"), _worker(cat, r, "decode")
        isl, osl = int(r["isl"]), int(r["osl"])
        one = PdModel(make_layout(pre, 1, dec, 1), LengthStats.fixed(isl),
                      LengthStats.fixed(osl))
    except CapplanError:
        return None
    batch = min(peak(r) / workers, one.decode_slots())
    t = dec.step.decode_step(np.asarray([1.0, max(batch, 1.0)]), isl + osl / 2.0,
                             detail=False)["step_s"]
    t = np.asarray(t, float)
    return float(t[1] / t[0])


def geometric_median(v: list[float]) -> float:
    return float(np.exp(np.median(np.log(v)))) if v else math.nan


def sweeps_text(known: list[dict[str, str]]) -> str:
    """How many configuration sweeps keep their worker counts from the smallest C to the
    largest."""
    by: dict[tuple, set] = defaultdict(set)
    for r in known:
        key = sweep(r)
        if key is not None:
            by[key].add((r["prefill_num_workers"], r["decode_num_workers"]))
    multi = {k: v for k, v in by.items()
             if sum(1 for r in known if sweep(r) == k) > 1}
    fixed = sum(1 for v in multi.values() if len(v) == 1)
    return (f"They come from {len(by)} configuration sweeps (a source's config_id, its lengths); "
            f"{fixed} of the {len(multi)} sweeps with more than one C keep the same prefill and "
            "decode workers from their smallest C to their largest.")


def ridge_fit(cat, known: list[dict[str, str]]) -> tuple[str, dict[str, float], float]:
    """The step ratio the deployments run at their sweep's peak, by engine (a table), the
    ridge step fitted without each system (geometric median of the other systems' rows) and
    fitted on all."""
    ratios = [(r, peak_step_ratio(cat, r)) for r in known]
    ratios = [(r, x) for r, x in ratios if x is not None]
    lines = ["| engine | rows | step ratio at the sweep's largest C, median (p10-p90) |",
             "|---|---|---|"]
    for eng in sorted({r["backend"] for r, _ in ratios}) + ["all"]:
        v = np.asarray([x for r, x in ratios if eng in ("all", r["backend"])])
        lines.append(f"| {eng} | {v.size} | {geometric_median(list(v)):.2f} "
                     f"({np.quantile(v, 0.1):.2f}-{np.quantile(v, 0.9):.2f}) |")
    systems = sorted({r["system"] for r, _ in ratios})
    loso = {s: geometric_median([x for r, x in ratios if r["system"] != s]) for s in systems}
    return "\n".join(lines), loso, geometric_median([x for _, x in ratios])


def loso_table(known: list[dict[str, str]], loso: dict[str, float]) -> str:
    """Each system scored with the implied counts (sweep rule) at the step ratio fitted
    without it."""
    groups, _ = score(known, True, loso)
    lines = ["| system | rows | step ratio fitted without it | predicted | TTFT median / p90 / "
             "bias | TPOT median / p90 / bias |", "|---|---|---|---|---|---|"]
    by: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (eng, system), g in groups.items():
        if eng != "all" and system != "all":
            for k, v in g.items():
                by[system][k] += v
    for system in sorted(by):
        g = by[system]
        n, k = len(g["rows"]), len(g["ttft"])
        lines.append(f"| {system} | {n} | {loso.get(system, math.nan):.2f} | {k / n:.0%} | "
                     f"{cell(np.asarray(g['ttft']))} | {cell(np.asarray(g['tpot']))} |")
    g = groups[("all", "all")]
    n, k = len(g["rows"]), len(g["ttft"])
    lines.append(f"| all | {n} | - | {k / n:.0%} | {cell(np.asarray(g['ttft']))} | "
                 f"{cell(np.asarray(g['tpot']))} |")
    return "\n".join(lines)


def rule_check(rows: list[dict[str, str]]) -> str:
    """The rows that state their counts: what they chose, the ridge step fitted on them (and
    without each system), their counts implied and scored."""
    cat = load_catalog()
    known = [r for r in rows if stated(r)]
    out = [f"Rows with stated worker counts: {len(known)}. " + sweeps_text(known)]
    fit_table, loso, fitted = ridge_fit(cat, known)
    out += ["", "The step ratio at which they run their decode workers at their sweep's "
            "largest C (the decode step at that C over the decode workers, over the "
            "one-sequence step; the engine's default batch):", "", fit_table, "",
            f"Geometric median over the rows: {fitted:.2f} (RIDGE_STEP = {RIDGE_STEP:g}, "
            "capplan/plan/pd.py). Fitted without each system and scored on it, the counts and "
            "batch sizes hidden (sweep rule):", "", loso_table(known, loso)]
    for rule, what in (("sweep", "sized for the sweep's largest C (the default)"),
                       ("ridge", "sized for the row's own C"),
                       ("slots", "the fewest decode workers whose slots hold the row's C")):
        out += ["", f"Implied counts, {what}, against the stated ones:", "",
                count_check(known, rule)]
    for implied, what in ((False, "the stated counts and batch sizes"),
                          (True, f"the implied counts ({DECODE_RULE}), the engine's default "
                                 "batch")):
        groups, reasons = score(known, implied)
        out += ["", f"Scored with {what}:", "", table(groups), "", reasons_text(reasons)]
    if not ANALYTIC:
        out += ["", "TTFT of the same replays over other numbers of rounds (the start-up wave "
                "and the later rounds' mean, the stated counts):", "", rounds_table(cat, known)]
    return "\n".join(out)


ROUNDS = (1, 5, 10, 20, 50)
"""Rounds of the measured phase the rounds table reads the replays at (1: the wave alone)."""


def rounds_table(cat, known: list[dict[str, str]]) -> str:
    """TTFT error of the rows that state their counts when the benchmark measures R rounds
    (ROUNDS), from the same replays (wave w and later rounds' mean L, read back from the
    20-round mean: (w + (R - 1) L) / R); the rows answered analytically are left out."""
    errs: dict[int, list[float]] = {k: [] for k in ROUNDS}
    for r in known:
        if r["id"] in FALLBACK:
            continue
        r = as_attention_dp(cat, r)
        if why_not(cat, r):
            continue
        try:
            res = _replayed(cat, r, *counts(cat, r))
        except CapplanError:
            continue
        w = res["benchmark_replay"]["ttft_wave_mean_s"]
        later = (MEASURED_ROUNDS * res["ttft_s"]["mean"] - w) / (MEASURED_ROUNDS - 1)
        mt = float(r["silicon_ttft_ms"]) / 1e3
        for k in ROUNDS:
            errs[k].append((w + (k - 1) * later) / k / mt - 1)
    lines = ["| rounds measured | rows | TTFT median / p90 / bias |", "|---|---|---|"]
    lines += [f"| {k} | {len(v)} | {cell(np.asarray(v))} |" for k, v in errs.items()]
    return "\n".join(lines)


def write_docs(text: str, block: str = "validate_disagg:by-engine") -> None:
    """Rewrite the generated block `block` of docs/validation.md with `text` (atomic)."""
    from docblocks import write_block

    write_block(DOC, block, text)


def main() -> None:
    if "--write-docs" in sys.argv and (PREFILL_RATE is not None or ROUNDS_WHAT_IF is not None
                                       or BATCH_RULE != "row"):
        sys.exit("--prefill-rate, --replay-rounds and --batch-rule are what-ifs: they write no "
                 "docs")
    if not DATA.exists():
        print(f"{DATA} not found; nothing to score")
        return
    with DATA.open() as f:
        rows = [r for r in csv.DictReader(f)
                if r["mode"] == "disagg" and r["system"] in SYSTEM_GPUS]
    note_peaks(rows)
    note_twins(rows)
    per_group = int(sys.argv[sys.argv.index("--per-group") + 1]) if "--per-group" in sys.argv \
        else (0 if "--write-docs" in sys.argv else 10)
    if per_group:
        by: dict[tuple[str, str], list] = defaultdict(list)
        for r in sorted(rows, key=lambda r: r["id"]):
            by[(r["backend"], r["system"])].append(r)
        rows = [r for g in by.values() for r in g[::max(1, math.ceil(len(g) / per_group))]]
    groups, reasons = score(rows)
    skipped = sum(reasons.values())
    print(f"disagg rows: {len(rows)}, scored {len(rows) - skipped}, not predicted {skipped}")
    text = table(groups) + "\n\n" + reasons_text(reasons) + "\n\n" + unstated_text(rows)
    if not ANALYTIC:
        n = sum(1 for r in rows if r["id"] in FALLBACK)
        text += (f"\n\nScored by the benchmark replay; {n} rows answered by the analytic solve "
                 "(one pass of their replay decodes more than the sim_tokens limit, as "
                 "`latency` answers them).")
    print(text)
    check = None if (STATED_ONLY or IMPLIED_ALL) else rule_check(rows)
    if check:
        print("\n" + check)
    if "--write-docs" in sys.argv:
        write_docs(text)
        if check:
            write_docs(check, "validate_disagg:rule-check")
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
