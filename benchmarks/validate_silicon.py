"""Score the latency models against measured serving results (../shared/validation).

`silicon_sample.csv` (AIConfigurator, Apache-2.0) holds mean TTFT and TPOT of vLLM, SGLang and
TensorRT-LLM under a closed loop of C clients with fixed input/output lengths. For each `agg` row
of a model in the catalog, capplan predicts both with the engine's profile (--engine), the
analytic closed-loop model and, with --sim, the simulator.

Honest split: a row is a TRAINING row when sha1(row id) % 3 == 0 (about a third); only training
rows are used by --fit-host (each engine's host cost per step and per running sequence, from
TPOT) and by --fit, which fits the things the data cannot be predicted without:
  - each engine's per-request overhead (HTTP, tokenisation, streaming, the client): the
    engine profile's `request_overhead_s`;
  - the benchmark's effective rounds (measured requests per client, N / C), which the dump does
    not record (AIConfigurator's scripts say 10-20 rounds after 1-2 rounds of warm-up);
  - with --fit-jitter, each engine's client jitter (ClientJitter: per-request and per-streamed-
    token spread of the delay before a client's next request), jointly with the two above.
Every table row scores the OTHER rows only.

Run: .venv/bin/python benchmarks/validate_silicon.py [--fit-host] [--fit [--fit-jitter]] [--sim]
[--no-jitter] [--plain-tp] [--only ENGINE]
(--plain-tp scores every row as plain TP over tp_size GPUs, as before layouts;
--fit-host first: the engines' host costs per step and per sequence, from TPOT; then --fit,
with --fit-jitter also each engine's client jitter; --no-jitter scores without the profiles'
client jitter, for comparison.)
"""

from __future__ import annotations

import csv
import hashlib
import math
import pickle
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from capplan.catalog.loader import load_catalog
from capplan.errors import CapplanError
from capplan.models import engine as _engine
from capplan.models.engine import NO_JITTER, ClientJitter
from capplan.models.perf import mla_layers
from capplan.plan.aiconfigurator import (
    SYSTEM_GPUS,
    AggRun,
    agg_closed_loop,
    agg_closed_loop_replay,
    agg_deployment,
)
from capplan.sim.protocol import reported_ttft

_HERE = Path(__file__).resolve()
DATA = next((d / "shared" / "validation" / "silicon_sample.csv" for d in _HERE.parents[1:4]
             if (d / "shared" / "validation" / "silicon_sample.csv").exists()),
            _HERE.parents[1].parent / "shared" / "validation" / "silicon_sample.csv")
"""The public measured rows: ../shared/validation (searched up to the worktrees' parent)."""
SYSTEMS = ("h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300")
"""The systems whose `agg` rows are scored (capplan.plan.aiconfigurator.SYSTEM_GPUS maps them)."""
SILICON_ROUNDS = {"vllm": 4.0, "sglang": 1.5, "trtllm": 6.0}
"""Measured requests per client of the silicon benchmark (N / C) per engine's harness, fitted on
the training rows (--fit; docs/validation.md): the dump does not record the protocol."""
ROUNDS_GRID = (1, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20)
SIM_MAX_CLIENTS = 256
"""--sim simulates rows with at most this many clients (larger runs take minutes each)."""


def concurrency(row: dict[str, str]) -> int:
    src = row["silicon_data_source"]
    if "silicon_concurrency=" in src:
        return int(src.split("silicon_concurrency=")[1].split(";")[0])
    return int(row["batch_size"])


def is_training(row: dict[str, str]) -> bool:
    return int(hashlib.sha1(row["id"].encode()).hexdigest(), 16) % 3 == 0


def agg_rows() -> list[dict[str, str]]:
    with DATA.open() as f:
        return [r for r in csv.DictReader(f) if r["mode"] == "agg" and r["system"] in SYSTEMS]


@dataclass
class Prediction:
    wave_s: float
    steady_s: float
    tpot_s: float
    overhead_s: float
    sim_ttft_s: float = math.nan
    sim_tpot_s: float = math.nan

    def ttft(self, rounds: float) -> float:
        return reported_ttft(self.overhead_s, self.wave_s, self.steady_s, rounds)


_DEPS: dict[tuple, object] = {}
PLAIN_TP = "--plain-tp" in sys.argv
"""Score every row as plain TP over tp_size GPUs (how rows were predicted before layouts)."""
EXPERT_GEMM_FRAC = (float(sys.argv[sys.argv.index("--expert-gemm-frac") + 1])
                    if "--expert-gemm-frac" in sys.argv else None)
"""--expert-gemm-frac X: every row with the calibration's expert_gemm_frac at X (1: quantized
experts at the dense GEMM rate), to compare the fits with and without the mechanism."""
MOE_WITHOUT_FP4_S = (float(sys.argv[sys.argv.index("--moe-layer-without-fp4") + 1]) * 1e-6
                     if "--moe-layer-without-fp4" in sys.argv else None)
"""--moe-layer-without-fp4 US: TensorRT-LLM's profiles with `moe_layer_step_s_without_fp4` at
US microseconds (0: without the term; docs/engines.md, "MoE layers on Hopper"), to compare the
fits with and without the mechanism."""
if MOE_WITHOUT_FP4_S is not None:
    _engine.VERSIONS["trtllm"] = tuple(replace(p, moe_layer_step_s_without_fp4=MOE_WITHOUT_FP4_S)
                                       for p in _engine.VERSIONS["trtllm"])
    _engine._engine_profile.cache_clear()


def _size(v: str) -> int:
    return max(int(v or 1), 1)  # empty (and the few 0s) mean 1


def layout(r: dict[str, str]) -> tuple[int, int]:
    """(attention_dp, expert_parallel) of a row. AIConfigurator's columns: one engine spans
    tp_size x attention_dp_size (x pp_size) GPUs and moe_tp_size x moe_ep_size = tp_size x
    attention_dp_size (checked on the rows: docs/validation.md section 4)."""
    if PLAIN_TP:
        return 1, 1
    return _size(r["attention_dp_size"]), _size(r["moe_ep_size"])


def world(r: dict[str, str]) -> int:
    """GPUs of a row's engine as its columns record them: tp_size x pp_size x
    attention_dp_size (AIConfigurator's gpus_per_worker)."""
    return _size(r["tp_size"]) * _size(r["pp_size"]) * _size(r["attention_dp_size"])


def beyond_domain(cat, r: dict[str, str]) -> bool:
    """Whether a row's recorded world exceeds its system's NVLink domain (8 GPUs on the SXM
    systems, the 72 of an NVL72 rack on GB200/GB300). The sample's rows of that kind (TP 16 and
    64 on 8-GPU H200/B200/B300 nodes) measure the TPOT of the same system's one-node rows of
    the same model and load (`one_node_twins`), not what the recorded world would run: the
    replay is scored on them apart and fitted without them (docs/validation.md, 4b)."""
    return world(r) > cat.gpu(SYSTEM_GPUS[r["system"]]).interconnect.max_gpus_per_node


def one_node_twins(cat, rows: list[dict[str, str]]) -> dict[str, list[float]]:
    """Per engine, measured TPOT of each beyond-domain row over that of every row of the same
    engine, model, system, precision, lengths and concurrency within one domain."""
    key = lambda r: (r["backend"], r["model_path"], r["system"], r["precision"],  # noqa: E731
                     r["isl"], r["osl"], concurrency(r))
    inside: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if not beyond_domain(cat, r):
            inside[key(r)].append(float(r["silicon_tpot_ms"]))
    out: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if beyond_domain(cat, r):
            out[r["backend"]] += [float(r["silicon_tpot_ms"]) / t for t in inside[key(r)]]
    return out


def is_layout_row(r: dict[str, str]) -> bool:
    return _size(r["attention_dp_size"]) > 1 or _size(r["moe_ep_size"]) > 1


def run_of(r: dict[str, str], engine: str | None = None) -> AggRun:
    """A row as the run capplan predicts (capplan.plan.aiconfigurator.AggRun)."""
    dp, ep = layout(r)
    return AggRun(backend=r["backend"], model=r["model_path"], system=r["system"],
                  precision=r["precision"], tp=int(r["tp_size"] or 1) * int(r["pp_size"] or 1),
                  isl=int(r["isl"]), osl=int(r["osl"]), batch_size=int(r["batch_size"] or 0),
                  concurrency=concurrency(r), attention_dp=dp, expert_parallel=ep,
                  engine=engine)


def deployment(cat, r: dict[str, str], overhead_s: float | None = None,
               host: tuple[float, float] | None = None, engine: str | None = None,
               prefill_frac: float | None = None):
    """The deployment of a row (capplan.plan.aiconfigurator.agg_deployment), memoised;
    `overhead_s` and `host` replace the calibration's request overhead and host costs per step
    and per sequence (--fit's trials), `engine` the profile (--loso: the row's release),
    `prefill_frac` the profile's prefill rate (--loso --prefill-frac-grid's trials)."""
    tp = int(r["tp_size"] or 1) * int(r["pp_size"] or 1)
    dp, ep = layout(r)
    key = (engine or r["backend"], r["model_path"], r["system"], tp, dp, ep, r["precision"],
           int(r["isl"]), int(r["osl"]), concurrency(r), overhead_s, host, r.get("batch_size"),
           prefill_frac)
    if key not in _DEPS:
        cal: dict[str, float] = {}
        if overhead_s is not None:  # --fit tries other overheads (they change cohort merging)
            cal["request_overhead_s"] = overhead_s
        if host is not None:  # --fit tries other host costs per step and per sequence
            cal.update(step_overhead_s=host[0], per_seq_overhead_s=host[1])
        if EXPERT_GEMM_FRAC is not None:
            cal["expert_gemm_frac"] = EXPERT_GEMM_FRAC
        dep = agg_deployment(cat, run_of(r, engine), cal)
        if prefill_frac is not None:
            dep = replace(dep, step=replace(dep.step, prefill_rate_frac=prefill_frac))
        _DEPS[key] = dep
    return _DEPS[key]


def predict(cat, r: dict[str, str], with_sim: bool, rounds: float,
            overhead_s: float | None = None,
            host: tuple[float, float] | None = None,
            jitter: ClientJitter | None = None) -> Prediction | None:
    """Analytic (and with_sim, simulated) mean TTFT and TPOT of a row
    (capplan.plan.aiconfigurator.agg_closed_loop); `jitter` replaces the engine profile's
    client jitter (--fit tries several)."""
    try:
        dep = deployment(cat, r, overhead_s, host)
    except CapplanError:
        return None
    if not dep.memory.fits:
        return None
    run = run_of(r)
    c = run.concurrency
    n = max(int(round(rounds * c)), c)
    out = agg_closed_loop(dep, run, n, jitter)
    p = Prediction(out["ttft_wave_s"], out["ttft_steady_s"], out["tpot_s"],
                   out["request_overhead_s"])
    if with_sim and c <= SIM_MAX_CLIENTS:
        try:
            sim = agg_closed_loop_replay(dep, run, n, jitter)
            p.sim_ttft_s, p.sim_tpot_s = sim["ttft_s"]["mean"], sim["tpot_s"]["mean"]
        except CapplanError:
            pass
    return p


def errors(pred: list[float], meas: list[float]) -> np.ndarray:
    e = np.asarray(pred, float) / np.asarray(meas, float) - 1
    return e[np.isfinite(e)]


def cell(e: np.ndarray) -> str:
    if not e.size:
        return "-"
    return (f"{np.median(np.abs(e)):.0%} / {np.quantile(np.abs(e), 0.9):.0%} / "
            f"{np.median(e):+.0%}")


HOST_STEP_GRID_S = (0.5e-3, 1.0e-3, 1.25e-3, 1.5e-3, 1.75e-3, 2.0e-3, 2.5e-3, 3.0e-3, 4.0e-3)
HOST_SEQ_GRID_S = (0.0, 5e-6, 10e-6, 15e-6, 20e-6, 30e-6, 45e-6, 60e-6)
"""Session 5 added 1.25/1.75 ms and 5/15 us and refitted TensorRT-LLM alone on this grid
(`--fit-host --only trtllm`); vLLM's and SGLang's values come from session 4's coarser grid."""


def fit_host_costs(cat, rows: list[dict[str, str]]) -> None:
    """Per engine: the host cost per step and per running sequence (EngineProfile
    step_overhead_s, per_seq_overhead_s) minimising the median |error| of TPOT on that
    engine's training rows. TPOT does not depend on the request overhead or the rounds, so
    this comes first (slow: one full prediction per grid point)."""
    train = [r for r in rows if is_training(r)]
    best: dict[str, tuple[float, float, float]] = {}
    for step_s in HOST_STEP_GRID_S:
        for seq_s in HOST_SEQ_GRID_S:
            preds = [(r, predict(cat, r, False, 1.0, host=(step_s, seq_s))) for r in train]
            for eng in sorted({r["backend"] for r in train}):
                got = [abs(p.tpot_s / (float(r["silicon_tpot_ms"]) / 1e3) - 1)
                       for r, p in preds if p is not None and r["backend"] == eng]
                cost = float(np.median(got))
                if eng not in best or cost < best[eng][0]:
                    best[eng] = (cost, step_s, seq_s)
    for eng, (cost, step_s, seq_s) in sorted(best.items()):
        print(f"{eng}: host step {step_s * 1e3:.1f} ms, per sequence {seq_s * 1e6:.0f} us, "
              f"TPOT median |err| {cost:.3f}")


JITTER_GRID = (NO_JITTER,) + tuple(
    ClientJitter(request_s=a, per_token_s=b)
    for a in (0.0, 0.01, 0.03, 0.1) for b in (0.0, 0.2e-3, 0.6e-3, 2e-3) if a or b)
"""Client jitter tried by --fit (per-request spread, per-streamed-token spread)."""


TOTAL_OVERHEAD_GRID_S = tuple(round(0.025 * i, 3) for i in range(25))
"""Per-request overheads (s) each training row is predicted at by --fit (interpolated between)."""
BASE_OVERHEAD_GRID_S = TOTAL_OVERHEAD_GRID_S[:17]
"""Base request overheads (s) tried by --fit (0-400 ms; request_overhead_s)."""
MLA_LAYER_GRID_S = tuple(round(0.25e-3 * i, 5) for i in range(17))
"""Per-MLA-layer request overheads (s) tried by --fit (mla_layer_request_overhead_s)."""


def fit(cat, rows: list[dict[str, str]], jitters: tuple[ClientJitter, ...] = (NO_JITTER,)
        ) -> None:
    """Per engine: the benchmark's rounds, the per-request overhead (a base and a cost per MLA
    layer: EngineProfile.request_overhead_s, mla_layer_request_overhead_s) and (--fit-jitter)
    the client jitter minimising the median |error| of TTFT (the metric the rows are scored on,
    as --fit-host does for TPOT) on that engine's training rows (each engine was benchmarked
    through its own harness, so none is assumed shared). The overhead changes the cohorts, so
    each row is fully predicted at every overhead of TOTAL_OVERHEAD_GRID_S and interpolated in
    between; rounds only reweight the wave."""
    train = [r for r in rows if is_training(r)]
    grid = np.asarray(TOTAL_OVERHEAD_GRID_S)
    best: dict[str, tuple] = {}
    for jit in jitters:
        table: dict[int, list] = defaultdict(list)
        for o in TOTAL_OVERHEAD_GRID_S:
            for i, r in enumerate(train):
                table[i].append(predict(cat, r, False, 1.0, o, jitter=jit))
        for eng in sorted({r["backend"] for r in train}):
            idx = [i for i, r in enumerate(train) if r["backend"] == eng
                   and all(p is not None for p in table[i])]
            wave = np.array([[p.wave_s for p in table[i]] for i in idx])
            steady = np.array([[p.steady_s for p in table[i]] for i in idx])
            meas = np.array([float(train[i]["silicon_ttft_ms"]) / 1e3 for i in idx])
            nmla = np.array([mla_layers(cat.resolve_model(train[i]["model_path"]).spec)
                             for i in idx])
            for base in BASE_OVERHEAD_GRID_S:
                for per in MLA_LAYER_GRID_S:
                    tot = base + per * nmla
                    if tot.max() > grid[-1]:  # beyond the predicted overheads: not extrapolated
                        continue
                    wv = np.array([np.interp(t, grid, w) for t, w in zip(tot, wave, strict=True)])
                    st = np.array([np.interp(t, grid, s) for t, s in zip(tot, steady, strict=True)])
                    for rounds in ROUNDS_GRID:
                        pred = reported_ttft(tot, wv, st, rounds)
                        cost = float(np.median(np.abs(pred / meas - 1)))
                        if eng not in best or cost < best[eng][0]:
                            best[eng] = (cost, rounds, base, per, jit)
            print(f"  {eng} jitter {jit.request_s * 1e3:g} ms + {jit.per_token_s * 1e3:g} "
                  f"ms/token: best so far {best[eng][0]:.3f}", flush=True)
    for eng, (cost, rounds, base, per, jit) in sorted(best.items()):
        print(f"{eng}: rounds {rounds}, overhead {base * 1e3:.0f} ms + {per * 1e3:g} ms per MLA "
              f"layer, jitter {jit.request_s * 1e3:g} ms + {jit.per_token_s * 1e3:g} ms/token, "
              f"median |err| {cost:.3f}")


DOC = Path(__file__).resolve().parents[1] / "docs" / "validation.md"
BANDS = Path(__file__).resolve().parents[1] / "capplan" / "plan" / "error_bands.json"


def _sample(rows: list[dict[str, str]], n: int) -> list[dict[str, str]]:
    """A deterministic subsample of n rows (lowest sha1 of the id)."""
    return sorted(rows, key=lambda r: hashlib.sha1(r["id"].encode()).hexdigest())[:n]


def first_fits(exact0: dict, base: list) -> dict:
    """Each engine's constants of the first fit (those `exact0` was replayed at)."""
    return {r["backend"]: exact0[r["id"]][1] for r, _ in base}


def first_passes(me, cat, rows: list[dict[str, str]], cache: Path | None,
                 prefill_frac: float | None) -> tuple[list, dict]:
    """The rows replayed with zero constants, each engine's first fit, and the rows replayed
    exactly at it (every fit is then linearised around those), at the profiles' prefill rate
    or at `prefill_frac` (--prefill-frac-grid); `cache` keeps them (FILE, FILE.prefill-X)."""
    import silicon_loso as L

    if cache is not None and prefill_frac is not None:
        cache = cache.with_name(f"{cache.name}.prefill-{prefill_frac:g}")
    if cache is not None and cache.exists():  # --cache FILE: the first two passes, reused
        base, exact0 = pickle.loads(cache.read_bytes())
        print(f"{len(base)} replays from {cache}")
        return base, exact0
    base = L.run_base(me, cat, rows, progress=True, prefill_frac=prefill_frac)
    print(f"{len(base)} of {len(rows)} rows replayed"
          + ("" if prefill_frac is None else f" at prefill rate {prefill_frac:g}"))
    first = {eng: replace(L.fit(L._arrays([(r, p) for r, p in base if r["backend"] == eng
                                            and not beyond_domain(cat, r)])),
                          prefill_frac=prefill_frac)
             for eng in sorted({r["backend"] for r, _ in base})}
    exact0 = {r["id"]: (L.replay(me, cat, r, first[r["backend"]]), first[r["backend"]])
              for r, _ in base}
    if cache is not None:
        cache.write_bytes(pickle.dumps((base, exact0)))
    return base, exact0


def fit_all_rows(passes: dict) -> dict:
    """Each engine's constants (and prefill rate, with --prefill-frac-grid) fitted on all its
    rows: `passes` maps each prefill rate to (zero-constant replays, exact replays)."""
    import silicon_loso as L

    fits_all = {}
    for eng in sorted({r["backend"] for b, _ in passes.values() for r, _ in b}):
        fits_all[eng] = c = L.choose({f: L._fit_scored([(r, p) for r, p in b
                                                         if r["backend"] == eng], x)
                                      for f, (b, x) in passes.items()})
        rate = "" if c.prefill_frac is None else f", prefill rate {c.prefill_frac:g}"
        print(f"{eng} (all rows): step {c.layer_s * 1e6:g} us per layer, per sequence "
              f"{c.seq_s * 1e6:g} us, request {c.overhead_s * 1e3:g} ms + {c.mla_s * 1e3:g} ms "
              f"per MLA layer{rate}", flush=True)
    return fits_all


def main_loso() -> None:
    """--loso: replay every row, fit each engine's constants, score leave-one-system-out and
    leave-one-engine-version-out (benchmarks/silicon_loso.py); --write-docs rewrites the
    generated blocks of docs/validation.md, --write-bands capplan/plan/error_bands.json;
    --sample N replays N rows only (a quick look; never written into the docs); held-out rows
    are scored by exact replays with their fold's constants (--first-order: by the fit's
    first-order model, faster); --prefill-frac-grid R1,R2,... fits each engine's prefill rate
    too (first_passes at every rate) and writes only its own blocks."""
    import silicon_loso as L

    cat = load_catalog()
    rows = agg_rows()
    sample = int(sys.argv[sys.argv.index("--sample") + 1]) if "--sample" in sys.argv else None
    if sample:
        rows = _sample(rows, sample)
    if "--engine" in sys.argv:  # --engine NAME: that engine's rows alone (folds are per engine)
        rows = [r for r in rows if r["backend"] == sys.argv[sys.argv.index("--engine") + 1]]
    me = sys.modules[__name__]
    cache = Path(sys.argv[sys.argv.index("--cache") + 1]) if "--cache" in sys.argv else None
    grid = ([float(x) for x in sys.argv[sys.argv.index("--prefill-frac-grid") + 1].split(",")]
            if "--prefill-frac-grid" in sys.argv else [None])
    passes = {f: first_passes(me, cat, rows, cache, f) for f in grid}
    ids = {r["id"] for r in rows}  # a cache may hold rows --engine or --sample leave out
    aparts: dict[float | None, list] = {}
    for f, (base, exact0) in passes.items():
        base = [(r, p) for r, p in base if exact0[r["id"]][0] is not None and r["id"] in ids]
        # rows whose recorded world exceeds their system's NVLink domain: scored apart
        aparts[f] = [(r, p) for r, p in base if beyond_domain(cat, r)]
        passes[f] = ([(r, p) for r, p in base if not beyond_domain(cat, r)], exact0)
    fits_all = fit_all_rows(passes)
    # each engine's rows at its chosen prefill rate
    chosen = {eng: c.prefill_frac for eng, c in fits_all.items()}
    base = [x for f in grid for x in passes[f][0] if chosen[x[0]["backend"]] == f]
    apart = [x for f in grid for x in aparts[f] if chosen.get(x[0]["backend"], f) == f]
    exact0 = {r["id"]: passes[chosen.get(r["backend"], grid[0])][1][r["id"]]
              for r, _ in base + apart}
    lins = {f: x for f, (_, x) in passes.items()}  # where the folds' fits are linearised
    if "--skip-final" in sys.argv:  # in sample at the first fit's replays; no model check
        t_in, _ = L.in_sample([(r, p, exact0[r["id"]][0]) for r, p in base],
                              {e: c for (e, c) in first_fits(exact0, base).items()}, exact0)
        t_sur = ["(not run: --skip-final; `--sample 60` measures it in seconds)"]
    else:
        exact = [(r, p, L.replay(me, cat, r, fits_all[r["backend"]])) for r, p in base]
        t_in, t_sur = L.in_sample(exact, fits_all, exact0)
        # a fold's constants are nearer the all-rows fit than the first fit: its search is
        # linearised around the replays at the all-rows constants (at the chosen rate)
        final = {r["id"]: (x, fits_all[r["backend"]]) for r, _, x in exact if x is not None}
        for f in grid:
            lins[f] = {**lins[f], **{k: v for k, v in final.items()
                                     if v[1].prefill_frac == f}}
        keep = set(final)
        passes = {f: ([(r, p) for r, p in b if r["id"] in keep], x)
                  for f, (b, x) in passes.items()}
        base = [(r, p) for r, p in base if r["id"] in keep]
    memo: dict[tuple, L.Replay | None] = {}

    def rescore(r: dict[str, str], c: L.Constants) -> L.Replay | None:
        """The held-out row replayed exactly with its fold's constants (memoised: folds that
        fit the same constants share replays); --first-order scores with the fit's model."""
        if (r["id"], c) not in memo:
            memo[(r["id"], c)] = L.replay(me, cat, r, c)
        return memo[(r["id"], c)]

    exact_scores = None if "--first-order" in sys.argv else rescore
    folds_in = {f: (b, lins[f]) for f, (b, _) in passes.items()}
    loso, folds = L.held_out_grid(folds_in, lambda r: r["system"], progress=True,
                                  rescore=exact_scores)
    loev, folds_v = L.held_out_grid(folds_in, L.release_key, progress=True,
                                    rescore=exact_scores)
    t_sys, t_ver = L.table(loso, "system"), L.table(loev, "release")
    t_fam = L.family_table(loso)
    t_apart = L.apart_table(apart, fits_all, exact0, one_node_twins(cat, agg_rows()))
    t_folds, t_engine = L.fold_table(folds, "system"), L.engine_time_table(base)
    t_tp = L.engine_time_by_tp(base, "gpt-oss-120b")
    t_pairs = L.engine_pairs_table([r for r in agg_rows() if not beyond_domain(cat, r)],
                                   concurrency)
    print("\n\n".join("\n".join(t) for t in (t_in, t_sur, t_sys, t_fam, t_ver, t_apart,
                                             t_folds, t_engine, t_tp, t_pairs)))
    const = ["| engine | step, per layer (us) | per sequence (us) | request (ms) | "
             "per MLA layer (ms) |", "|---|---|---|---|---|"] + [
        f"| {e} | {c.layer_s * 1e6:g} | {c.seq_s * 1e6:g} | {c.overhead_s * 1e3:g} | "
        f"{c.mla_s * 1e3:g} |" for e, c in sorted(fits_all.items())]
    print("\n".join(const))
    if sample or "--engine" in sys.argv:
        print("(subsample or one engine: nothing written)")
        return
    if grid != [None]:  # the prefill rate's fit: its own blocks, the product's tables stay
        t_rate = L.rate_table([("system", loso, folds), ("release", loev, folds_v)])
        print("\n\n".join("\n".join(t) for t in (t_rate, t_fam)))
        if "--write-docs" in sys.argv:
            from docblocks import write_block

            write_block(DOC, "validate_silicon:prefill-rate", "\n".join(t_rate))
            write_block(DOC, "validate_silicon:prefill-rate-family", "\n".join(t_fam))
            print(f"wrote {DOC}")
        return
    if "--write-docs" in sys.argv:
        from docblocks import write_block  # benchmarks/ is on sys.path when run as a script

        for bid, body in (("constants", const), ("in-sample", t_in), ("surrogate", t_sur),
                          ("loso", t_sys), ("loso-family", t_fam), ("loev", t_ver),
                          ("apart", t_apart), ("loso-folds", t_folds),
                          ("engine-time", t_engine), ("engine-time-tp", t_tp),
                          ("engine-pairs", t_pairs)):
            write_block(DOC, f"validate_silicon:{bid}", "\n".join(body))
        print(f"wrote {DOC}")
    if "--write-bands" in sys.argv:
        L.write_bands(BANDS, L.bands(loso), fits_all, len(base), sample)
        print(f"wrote {BANDS}")


def run_if_data(main_fn) -> None:  # noqa: ANN001
    """Run a script's `main_fn` when the silicon data is there, else say there is nothing to
    score (the scripts that replay these rows share it)."""
    if not DATA.exists():
        print(f"{DATA} not found; nothing to score")
    else:
        main_fn()


def main() -> None:
    if not DATA.exists():
        print(f"{DATA} not found; nothing to score")
    elif "--loso" in sys.argv:
        main_loso()
    else:
        main_analytic()


def main_analytic() -> None:
    """The analytic closed loop's scores on the test split (and --fit, --fit-host)."""
    with_sim = "--sim" in sys.argv
    cat = load_catalog()
    rows = agg_rows()
    if "--only" in sys.argv:  # --only ENGINE: fit that engine's rows alone
        rows = [r for r in rows if r["backend"] == sys.argv[sys.argv.index("--only") + 1]]
    if "--fit-host" in sys.argv:
        fit_host_costs(cat, rows)
        return
    if "--fit" in sys.argv:
        fit(cat, rows, JITTER_GRID if "--fit-jitter" in sys.argv else (NO_JITTER,))
        return
    scored = []
    jitter = NO_JITTER if "--no-jitter" in sys.argv else None  # None: the profiles' own
    for r in agg_rows():
        try:
            p = predict(cat, r, with_sim, SILICON_ROUNDS[r["backend"]], jitter=jitter)
        except CapplanError:
            p = None
        if p is not None:
            scored.append((r, p))
    groups: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r, p in scored:
        kind = "EP/DP rows" if is_layout_row(r) else "TP-only rows"
        for key in ((r["backend"], r["system"]), (r["backend"], kind), (r["backend"], "all"),
                    ("all", kind), ("all", "all")):
            g = groups[key]
            g["train"].append(is_training(r))
            if is_training(r):
                continue
            mt, mp = float(r["silicon_ttft_ms"]) / 1e3, float(r["silicon_tpot_ms"]) / 1e3
            g["ttft"].append((p.ttft(SILICON_ROUNDS[r["backend"]]), mt))
            g["tpot"].append((p.tpot_s, mp))
            g["c"].append(concurrency(r))
            if with_sim:
                g["sim_ttft"].append((p.sim_ttft_s, mt))
                g["sim_tpot"].append((p.sim_tpot_s, mp))
    metrics = ["ttft", "tpot"] + (["sim_ttft", "sim_tpot"] if with_sim else [])
    print("| engine | system | rows (train / scored) | "
          + " | ".join(f"{m} median / p90 / bias" for m in metrics)
          + " | TTFT meas/pred C<=8 vs C>=128 |")
    print("|---|---|---|" + "---|" * (len(metrics) + 1))
    for key in sorted(groups, key=lambda k: (k[0] == "all", k[0], k[1] == "all",
                                             k[1].endswith("rows"), k[1])):
        g = groups[key]
        cells = []
        for m in metrics:
            pairs = g[m]
            cells.append(cell(errors([a for a, _ in pairs], [b for _, b in pairs])))
        ratio = [b / a for a, b in g["ttft"]]
        lo = [x for x, c in zip(ratio, g["c"], strict=True) if c <= 8]
        hi = [x for x, c in zip(ratio, g["c"], strict=True) if c >= 128]
        rr = (f"{np.median(lo):.2f} vs {np.median(hi):.2f}" if lo and hi else "-")
        ntrain = sum(g["train"])
        print(f"| {key[0]} | {key[1]} | {ntrain} / {len(g['train']) - ntrain} | "
              + " | ".join(cells) + f" | {rr} |")


if __name__ == "__main__":
    main()
