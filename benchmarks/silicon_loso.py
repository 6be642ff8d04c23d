"""Fits that transfer: the silicon rows replayed, each engine's four constants fitted, and every
fit scored on rows it has not seen (leave-one-system-out, leave-one-engine-version-out).

Used by `validate_silicon.py --loso [--write-docs] [--write-bands] [--sample N]`.

Each `agg` row is run as its benchmark ran (AIConfigurator's protocol: `aiperf --concurrency C
--num-requests 20C --warmup-request-count 2C`, the warm-up drained before the measured phase,
so the measured phase starts with all C clients together: `benchmark_protocol`), by the
simulator's replay with the row's engine RELEASE profile (`row_engine`: vLLM 0.12 rows run
the synchronous 0.11 profile, 0.14+ the asynchronous one). Nothing about the protocol is
fitted (the analytic closed loop's rounds and client jitter are gone).

Per engine, four constants with a physical meaning are fitted (shared by its releases; a
release differs by mechanism, not by constants):
  F  step_overhead_s: the fixed cost of a step no overlap hides (launch, sampling, sync);
  s  per_seq_overhead_s: host work per running sequence per step (hidden by host overlap);
  o  request_overhead_s: per request outside the engine's steps (HTTP, tokenise, stream);
  m  mla_layer_request_overhead_s: more of it per MLA layer (DeepSeek/Kimi family).
F and s minimise TPOT's median |error|, then o and m TTFT's. The fit uses a first-order
surrogate of the replay (one replay per row at F = s = o = 0: TPOT(F, s) = TPOT0 + F +
s B - overlap min(s B, TPOT0), B the mean running batch; TTFT = TTFT0 TPOT(F, s) / TPOT0 + o
+ m x MLA layers, linearised around exact replays at a first fit); every held-out SCORE is an
exact replay of the row with its fold's constants (`held_out`'s `rescore`).
With `--prefill-frac-grid`, each fold also picks the engine's prefill rate
(EngineProfile.prefill_rate_frac) from a grid of replays (`held_out_grid`).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from bars import AGG_BARS

from capplan.errors import CapplanError
from capplan.models.engine import VERSIONS
from capplan.models.perf import mla_layers

# the protocol and the replay are the product's; these names stay importable from here
from capplan.plan.aiconfigurator import (  # noqa: F401
    MEASURED_ROUNDS,
    REPLAY_ROUNDS,
    benchmark_replay,
    measured_mean,
    release_engine,
    release_label,
    replayed_means,
)

LAYER_GRID_S = tuple(np.round(np.arange(0, 100.1e-6, 2.5e-6), 9))
SEQ_GRID_S = tuple(np.round(np.arange(0, 100.1e-6, 2.5e-6), 9))
OVERHEAD_GRID_S = tuple(np.round(np.arange(0, 0.4001, 0.005), 4))
MLA_GRID_S = tuple(np.round(np.arange(0, 4.01e-3, 0.125e-3), 7))
FAMILIES = (("dense", ("Llama-3.1", "Qwen3-32B")),
            ("MoE", ("MiniMax", "gpt-oss", "Qwen3-235B", "Qwen3.5-397B")),
            ("MLA MoE", ("DeepSeek", "Kimi", "GLM-5")))
"""Model families of the silicon rows, by checkpoint name (MLA: multi-head latent attention)."""
REGIMES = ((1, 8), (9, 64), (65, 256), (257, 1 << 30))
"""Concurrency ranges of the error bands (clients of a closed loop; running batch otherwise)."""


def family(model: str) -> str:
    """A checkpoint's family (FAMILIES): dense, MoE or MLA MoE."""
    return next((f for f, keys in FAMILIES if any(k in model for k in keys)), "other")


def row_release(r: dict[str, str]) -> str:
    """The row's engine release as AIConfigurator recorded it (release_label)."""
    return release_label(r["backend_version"])


def row_engine(r: dict[str, str]) -> str:
    """The engine spec a row runs with (release_engine: its release's profile)."""
    return release_engine(r["backend"], row_release(r))


@dataclass
class Replay:
    """One row's replay: TTFT and TPOT means (s), mean running batch, MLA layers."""

    ttft_s: float
    tpot_s: float
    batch: float
    mla: int
    overlap: bool
    layers: int


@dataclass(frozen=True)
class Constants:
    """layer_s: fixed step cost per layer (EngineProfile.layer_step_overhead_s); seq_s: host
    cost per running sequence; overhead_s + mla_s x MLA layers: the request overhead."""

    layer_s: float
    seq_s: float
    overhead_s: float
    mla_s: float
    prefill_frac: float | None = None
    """EngineProfile.prefill_rate_frac replayed (None: the profile's); `--prefill-frac-grid`."""

    def request_overhead(self, mla: int) -> float:
        return self.overhead_s + self.mla_s * mla


def replay(v, cat, r: dict[str, str], c: Constants) -> Replay | None:
    """The row replayed with constants `c` (v: the validate_silicon module)."""
    try:
        nmla = mla_layers(cat.resolve_model(r["model_path"]).spec)
        layers = -(-cat.resolve_model(r["model_path"]).spec.num_layers
                   // max(int(r["pp_size"] or 1), 1))
        dep = v.deployment(cat, r, c.request_overhead(nmla), (c.layer_s * layers, c.seq_s),
                           engine=row_engine(r), prefill_frac=c.prefill_frac)
    except CapplanError:
        return None
    if not dep.memory.fits:
        return None
    try:
        ttft, tpot, batch = replayed_means(dep, v.concurrency(r), int(r["isl"]), int(r["osl"]))
    except CapplanError:
        return None
    return Replay(ttft, tpot, batch, nmla, dep.profile.host_overlap,
                  -(-dep.model.num_layers // dep.settings.pp))


ZERO = Constants(0.0, 0.0, 0.0, 0.0)
"""Replays at these constants (engine time alone) are what every fit starts from."""


def _tpot_zero(z: dict[str, np.ndarray], layer_s: np.ndarray, seq_s: np.ndarray) -> np.ndarray:
    host = seq_s * z["batch"]
    return z["tpot"] + layer_s * z["layers"] + host - z["overlap"] * np.minimum(host, z["tpot"])


def predict(z: dict[str, np.ndarray], layer_s, seq_s, overhead_s, mla_s
            ) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT, TPOT) of rows `z` under the constants (arrays broadcast), to first order: from
    the zero-constant replays (TPOT0 + F + s B - overlap min(s B, TPOT0); the engine's share
    of TTFT scales with the step), or, when `z` has exact replays at constants c0 (keys
    "ttft_x", "tpot_x", "c0"), linearised around those (the fold's constants are near c0).
    F = layer_s x the rows' layers per stage."""
    tpot = _tpot_zero(z, layer_s, seq_s)
    if "tpot_x" in z:
        f0, s0, o0, m0 = z["c0"]
        tpot = z["tpot_x"] + tpot - _tpot_zero(z, np.float64(f0), np.float64(s0))
        engine = z["ttft_x"] - o0 - m0 * z["mla"]
        return engine * tpot / z["tpot_x"] + overhead_s + mla_s * z["mla"], tpot
    return z["ttft"] * tpot / z["tpot"] + overhead_s + mla_s * z["mla"], tpot


def fit(z: dict[str, np.ndarray]) -> Constants:
    """The four constants minimising the median |error| of TPOT, then TTFT, on rows `z`
    (`predict`'s first-order model of the replay)."""
    zz = {k: (val if k == "c0" else val[None, None, :]) for k, val in z.items()}
    f = np.asarray(LAYER_GRID_S)[:, None, None]
    s = np.asarray(SEQ_GRID_S)[None, :, None]
    _, tpot = predict(zz, f, s, 0.0, 0.0)
    cost = np.median(np.abs(tpot / z["tpot_meas"] - 1), axis=2)
    i, j = np.unravel_index(np.argmin(cost), cost.shape)
    layer_s, seq_s = float(LAYER_GRID_S[i]), float(SEQ_GRID_S[j])
    o = np.asarray(OVERHEAD_GRID_S)[:, None, None]
    m = np.asarray(MLA_GRID_S)[None, :, None]
    ttft, _ = predict(zz, np.float64(layer_s), np.float64(seq_s), o, m)
    cost = np.median(np.abs(ttft / z["ttft_meas"] - 1), axis=2)
    i, j = np.unravel_index(np.argmin(cost), cost.shape)
    return Constants(layer_s, seq_s, float(OVERHEAD_GRID_S[i]), float(MLA_GRID_S[j]))


def _arrays(items: Sequence[tuple[dict[str, str], Replay]],
            exact: dict[str, tuple[Replay, Constants]] | None = None) -> dict[str, np.ndarray]:
    """Arrays of rows' zero-constant replays and measurements; with `exact` (row id -> exact
    replay at constants c0, one c0 per call), the exact replays too."""
    z = {"ttft": np.array([p.ttft_s for _, p in items]),
         "tpot": np.array([p.tpot_s for _, p in items]),
         "batch": np.array([p.batch for _, p in items]),
         "overlap": np.array([1.0 if p.overlap else 0.0 for _, p in items]),
         "mla": np.array([float(p.mla) for _, p in items]),
         "layers": np.array([float(p.layers) for _, p in items]),
         "ttft_meas": np.array([float(r["silicon_ttft_ms"]) / 1e3 for r, _ in items]),
         "tpot_meas": np.array([float(r["silicon_tpot_ms"]) / 1e3 for r, _ in items])}
    if exact:
        xs = [exact[r["id"]] for r, _ in items]
        z["ttft_x"] = np.array([x.ttft_s for x, _ in xs])
        z["tpot_x"] = np.array([x.tpot_s for x, _ in xs])
        c0 = xs[0][1] if xs else Constants(0, 0, 0, 0)
        z["c0"] = np.array([c0.layer_s, c0.seq_s, c0.overhead_s, c0.mla_s])
    return z


@dataclass
class Scored:
    """One held-out row: engine, group it was held out in, concurrency, signed errors."""

    engine: str
    group: str
    concurrency: int
    ttft_err: float
    tpot_err: float
    family: str = ""


def held_out(base: list[tuple[dict[str, str], Replay]], key: Callable[[dict[str, str]], str],
             exact: dict[str, tuple[Replay, Constants]], progress: bool = False,
             rescore: Callable[[dict[str, str], Constants], Replay | None] | None = None
             ) -> tuple[list[Scored], dict[tuple[str, str], Constants]]:
    """Per engine and group g of `key`: fit on the engine's rows outside g, predict g's rows
    with those constants, score them. Groups with no other rows of the engine are skipped.
    The fit searches with `predict`'s first-order model; `rescore(row, constants)`, when
    given, replays each held-out row exactly with its fold's constants and scores that (a row
    whose replay fails keeps the first-order prediction)."""
    return held_out_grid({None: (base, exact)}, key, progress, rescore)


TPOT_SLACK = 0.005
"""A prefill rate is chosen among those whose training TPOT median |error| is within this of
the best one's (TPOT no worse beyond half a point)."""


def _fit_scored(train: list[tuple[dict[str, str], Replay]], exact: dict
                ) -> tuple[Constants, float, float]:
    """`fit` on rows `train`, with its training TTFT and TPOT median |error| (first order)."""
    z = _arrays(train, exact)
    c = fit(z)
    ttft, tpot = predict(z, c.layer_s, c.seq_s, c.overhead_s, c.mla_s)
    return (c, _median_abs(ttft / z["ttft_meas"] - 1), _median_abs(tpot / z["tpot_meas"] - 1))


def held_out_grid(grid: dict[float | None, tuple[list[tuple[dict[str, str], Replay]], dict]],
                  key: Callable[[dict[str, str]], str], progress: bool = False,
                  rescore: Callable[[dict[str, str], Constants], Replay | None] | None = None
                  ) -> tuple[list[Scored], dict[tuple[str, str], Constants]]:
    """`held_out` with the engine's prefill rate fitted too: `grid` maps each prefill rate
    (EngineProfile.prefill_rate_frac) to the rows' replays at it (zero constants, and exact
    replays at a first fit to linearise around). Per fold, the four constants are fitted at
    every rate, and the rate with the lowest training TTFT median |error| is kept among those
    whose training TPOT is within TPOT_SLACK of the best; the held-out rows are scored at it."""
    scored: list[Scored] = []
    fits: dict[tuple[str, str], Constants] = {}
    ids = set.intersection(*({r["id"] for r, _ in b} for b, _ in grid.values()))
    by_engine: dict[str, dict[float | None, list]] = defaultdict(lambda: defaultdict(list))
    for f, (base, _) in grid.items():
        for r, p in base:
            if r["id"] in ids:
                by_engine[r["backend"]][f].append((r, p))
    for eng, per_f in sorted(by_engine.items()):
        items0 = next(iter(per_f.values()))
        for g in sorted({key(r) for r, _ in items0}):
            trials = {f: _fit_scored([(r, p) for r, p in items if key(r) != g], grid[f][1])
                      for f, items in per_f.items() if any(key(r) != g for r, _ in items)}
            if not trials:
                continue
            c = choose(trials)
            f = c.prefill_frac
            fits[(eng, g)] = c
            test = [(r, p) for r, p in per_f[f] if key(r) == g]
            if progress:
                rate = "" if f is None else f"prefill rate {f:g}, "
                n = sum(1 for r, _ in per_f[f] if key(r) != g)
                print(f"  {eng} without {g}: {n} rows fit {rate}F {c.layer_s * 1e6:g} us/layer, "
                      f"s {c.seq_s * 1e6:g} us, o {c.overhead_s * 1e3:g} ms + "
                      f"{c.mla_s * 1e3:g} ms/MLA layer; {len(test)} held out", flush=True)
            z = _arrays(test, grid[f][1])
            ttft, tpot = predict(z, c.layer_s, c.seq_s, c.overhead_s, c.mla_s)
            for (r, _), a, b, ma, mb in zip(test, ttft, tpot, z["ttft_meas"], z["tpot_meas"],
                                            strict=True):
                x = rescore(r, c) if rescore is not None else None
                if x is not None:
                    a, b = x.ttft_s, x.tpot_s
                scored.append(Scored(eng, g, int(r["_c"]), a / ma - 1, b / mb - 1,
                                     family(r.get("model_path", ""))))
    return scored, fits


def choose(trials: dict[float | None, tuple[Constants, float, float]]) -> Constants:
    """The fit of the prefill rate with the lowest training TTFT median |error| among those
    whose training TPOT is within TPOT_SLACK of the best (`_fit_scored`'s trials by rate)."""
    best_tpot = min(t[2] for t in trials.values())
    f = min((f for f, t in trials.items() if t[2] <= best_tpot + TPOT_SLACK),
            key=lambda f: trials[f][1])
    c = trials[f][0]
    return Constants(c.layer_s, c.seq_s, c.overhead_s, c.mla_s, f)


def in_sample(exact: list[tuple[dict[str, str], Replay, Replay | None]],
              fits_all: dict[str, Constants], exact0: dict[str, tuple[Replay, Constants]]
              ) -> tuple[list[str], list[str]]:
    """Markdown rows: every row replayed with its engine's all-rows constants (in sample), per
    engine and release profile; and how far `predict` (linearised around the first fit's
    replays `exact0`, as the held-out scores are) is from those exact replays. `exact` holds
    (row, zero-constant replay, replay at the final constants)."""
    err: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    gap: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r, p0, p in exact:
        if p is None:
            continue
        eng = r["backend"]
        meas = (float(r["silicon_ttft_ms"]) / 1e3, float(r["silicon_tpot_ms"]) / 1e3)
        e = (p.ttft_s / meas[0] - 1, p.tpot_s / meas[1] - 1)
        for g in (row_engine(r), "all"):
            err[(eng, g)].append(e)
        c = fits_all[eng]
        ttft, tpot = predict(_arrays([(r, p0)], exact0), c.layer_s, c.seq_s, c.overhead_s,
                             c.mla_s)
        gap[eng].append((float(ttft[0]) / p.ttft_s - 1, float(tpot[0]) / p.tpot_s - 1))
    t_in = ["| engine | profile | rows | TTFT median / p90 / bias | TPOT median / p90 / bias |",
            "|---|---|---|---|---|"]
    for (eng, g), es in sorted(err.items(), key=lambda kv: (kv[0][0], kv[0][1] == "all",
                                                            kv[0][1])):
        t_in.append(f"| {eng} | {g} | {len(es)} | {summary([a for a, _ in es])} | "
                    f"{summary([b for _, b in es])} |")
    t_sur = ["| engine | rows | first-order prediction vs replay: TTFT median / p90 / bias | "
             "TPOT |",
             "|---|---|---|---|"]
    for eng, gs in sorted(gap.items()):
        t_sur.append(f"| {eng} | {len(gs)} | {summary([a for a, _ in gs])} | "
                     f"{summary([b for _, b in gs])} |")
    return t_in, t_sur


def apart_table(apart: list[tuple[dict[str, str], Replay]], fits_all: dict[str, Constants],
                exact0: dict[str, tuple[Replay, Constants]], twins: dict[str, list[float]]
                ) -> list[str]:
    """Markdown rows: the rows left out of the fits (their recorded world exceeds the system's
    NVLink domain) per engine, replayed as recorded with the engine's all-rows constants
    (first order, as the held-out scores), and the median of their measured TPOT over that of
    the same configuration's rows within one domain (`twins`: those ratios per engine)."""
    lines = ["| engine | rows | TTFT median / p90 / bias | TPOT median / p90 / bias | "
             "measured TPOT / one-domain rows of the same configuration: median (p10-p90), "
             "pairs |", "|---|---|---|---|---|"]
    for eng in sorted({r["backend"] for r, _ in apart}):
        items = [(r, p) for r, p in apart if r["backend"] == eng]
        if eng not in fits_all:
            continue
        c = fits_all[eng]
        z = _arrays(items, exact0)
        ttft, tpot = predict(z, c.layer_s, c.seq_s, c.overhead_s, c.mla_s)
        tw = np.asarray(twins.get(eng, []), float)
        twin = (f"{np.median(tw):.2f} ({np.quantile(tw, 0.1):.2f}-{np.quantile(tw, 0.9):.2f}), "
                f"{tw.size}" if tw.size else "-")
        lines.append(f"| {eng} | {len(items)} | {summary(ttft / z['ttft_meas'] - 1)} | "
                     f"{summary(tpot / z['tpot_meas'] - 1)} | {twin} |")
    return lines


def summary(errs: Sequence[float]) -> str:
    e = np.asarray(errs, float)
    e = e[np.isfinite(e)]
    if not e.size:
        return "-"
    return f"{np.median(np.abs(e)):.0%} / {np.quantile(np.abs(e), 0.9):.0%} / {np.median(e):+.0%}"


def _median_abs(errs: Sequence[float]) -> float:
    e = np.asarray(errs, float)
    return float(np.median(np.abs(e[np.isfinite(e)]))) if len(e) else math.nan


def table(scored: list[Scored], what: str) -> list[str]:
    """Markdown rows: per engine and held-out group, then per engine all groups, with the
    bars (TTFT <= 30%, TPOT <= 15% median |error|)."""
    lines = [f"| engine | {what} held out | rows | TTFT median / p90 / bias | "
             "TPOT median / p90 / bias |", "|---|---|---|---|---|"]
    by: dict[tuple[str, str], list[Scored]] = defaultdict(list)
    for s in scored:
        by[(s.engine, s.group)].append(s)
        by[(s.engine, "all")].append(s)
    for (eng, g), ss in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] == "all",
                                                          kv[0][1])):
        ttft = [s.ttft_err for s in ss]
        tpot = [s.tpot_err for s in ss]
        label = f"**all** (bars: {_bars(ttft, tpot)})" if g == "all" else g
        lines.append(f"| {eng} | {label} | {len(ss)} | {summary(ttft)} | {summary(tpot)} |")
    return lines


def rate_table(splits: Sequence[tuple[str, list[Scored], dict[tuple[str, str], Constants]]]
               ) -> list[str]:
    """Markdown rows: per engine, split (`what`, scored rows, fold fits) and held-out group,
    the prefill rate the fold chose (`held_out_grid`) and the group's scores; then all groups
    with the bars."""
    lines = ["| engine | held out | rows | prefill rate fitted | TTFT median / p90 / bias | "
             "TPOT median / p90 / bias |", "|---|---|---|---|---|---|"]
    for eng in sorted({s.engine for _, sc, _ in splits for s in sc}):
        for what, scored, fits in splits:
            mine = [s for s in scored if s.engine == eng]
            for g in sorted({s.group for s in mine}):
                ss = [s for s in mine if s.group == g]
                lines.append(f"| {eng} | {what} {g} | {len(ss)} | {fits[(eng, g)].prefill_frac:g} "
                             f"| {summary([s.ttft_err for s in ss])} | "
                             f"{summary([s.tpot_err for s in ss])} |")
            ttft, tpot = [s.ttft_err for s in mine], [s.tpot_err for s in mine]
            lines.append(f"| {eng} | **every {what}** (bars: {_bars(ttft, tpot)}) | {len(mine)} "
                         f"| - | {summary(ttft)} | "
                         f"{summary(tpot)} |")
    return lines


def family_table(scored: list[Scored]) -> list[str]:
    """Markdown rows: the held-out scores of `table` by engine and model family."""
    lines = ["| engine | family | rows | TTFT median / p90 / bias | TPOT median / p90 / bias |",
             "|---|---|---|---|---|"]
    by: dict[tuple[str, str], list[Scored]] = defaultdict(list)
    for s in scored:
        by[(s.engine, s.family)].append(s)
    for (eng, fam), ss in sorted(by.items()):
        lines.append(f"| {eng} | {fam} | {len(ss)} | {summary([s.ttft_err for s in ss])} | "
                     f"{summary([s.tpot_err for s in ss])} |")
    return lines


def fold_table(fits: dict[tuple[str, str], Constants], what: str) -> list[str]:
    """Markdown rows: each held-out fold's constants (fitted on the engine's other groups),
    beside which the engine's all-rows fit is the `constants` table."""
    lines = [f"| engine | {what} held out | step, per layer (us) | per sequence (us) | "
             "request (ms) | per MLA layer (ms) |", "|---|---|---|---|---|---|"]
    for (eng, g), c in sorted(fits.items()):
        lines.append(f"| {eng} | {g} | {c.layer_s * 1e6:g} | {c.seq_s * 1e6:g} | "
                     f"{c.overhead_s * 1e3:g} | {c.mla_s * 1e3:g} |")
    return lines


def _quartiles(x: Sequence[float]) -> str:
    a = np.asarray(x, float)
    return (f"{np.median(a):.2f} ({np.quantile(a, 0.25):.2f}-{np.quantile(a, 0.75):.2f})"
            if a.size else "-")


def engine_time_table(base: list[tuple[dict[str, str], Replay]]) -> list[str]:
    """Markdown rows: measured TPOT over the replay's with every constant at zero (engine time
    alone), per engine, model family, system and precision: what the fitted constants must
    carry in each group, before any fit."""
    by: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    for r, p in base:
        key = (r["backend"], family(r["model_path"]), r["system"], r["precision"] or "-")
        by[key].append(float(r["silicon_tpot_ms"]) / 1e3 / p.tpot_s)
    lines = ["| engine | family | system | precision | rows | measured TPOT / engine time: "
             "median (p25-p75) |", "|---|---|---|---|---|---|"]
    for (eng, fam, system, prec), xs in sorted(by.items()):
        lines.append(f"| {eng} | {fam} | {system} | {prec} | {len(xs)} | {_quartiles(xs)} |")
    return lines


def engine_time_by_tp(base: list[tuple[dict[str, str], Replay]], model: str) -> list[str]:
    """Markdown rows: `engine_time_table`'s ratio for one checkpoint (name contains `model`)
    by engine, system and tensor-parallel size, rows of one attention-DP rank and no expert
    parallelism only."""
    by: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for r, p in base:
        if model in r["model_path"] and (r["attention_dp_size"] or "1") == "1" \
                and (r["moe_ep_size"] or "1") == "1":
            key = (r["backend"], r["system"], int(r["tp_size"] or 1))
            by[key].append(float(r["silicon_tpot_ms"]) / 1e3 / p.tpot_s)
    lines = ["| engine | system | TP | rows | measured TPOT / engine time: median (p25-p75) |",
             "|---|---|---|---|---|"]
    for (eng, system, tp), xs in sorted(by.items()):
        lines.append(f"| {eng} | {system} | {tp} | {len(xs)} | {_quartiles(xs)} |")
    return lines


def pair_key(r: dict[str, str], clients: int) -> tuple:
    """A measured configuration regardless of the engine: model, system, precision, layout,
    lengths and clients."""
    return (r["model_path"], r["system"], r["precision"], r["tp_size"], r["pp_size"] or "1",
            r["attention_dp_size"] or "1", r["moe_ep_size"] or "1", r["isl"], r["osl"], clients)


def engine_pairs_table(rows: list[dict[str, str]], clients: Callable[[dict[str, str]], int]
                       ) -> list[str]:
    """Markdown rows: on configurations measured under two engines (pair_key), the ratio of
    their measured TPOT (medians over repeated rows), per engine pair, system and family."""
    tpot: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        tpot[pair_key(r, clients(r))][r["backend"]].append(float(r["silicon_tpot_ms"]))
    by: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for k, engines in tpot.items():
        for a, b in (("trtllm", "vllm"), ("trtllm", "sglang"), ("sglang", "vllm")):
            if a in engines and b in engines:
                ratio = float(np.median(engines[a]) / np.median(engines[b]))
                by[(f"{a} / {b}", k[1], family(k[0]))].append(ratio)
    lines = ["| engines | system | family | configurations | measured TPOT ratio: median "
             "(p25-p75) |", "|---|---|---|---|---|"]
    for (pair, system, fam), xs in sorted(by.items()):
        lines.append(f"| {pair} | {system} | {fam} | {len(xs)} | {_quartiles(xs)} |")
    return lines


def _bars(ttft: list[float], tpot: list[float]) -> str:
    """The TTFT and TPOT medians against their bars (benchmarks/bars.py)."""
    return f"{_bar(ttft, AGG_BARS['ttft'])}, {_bar(tpot, AGG_BARS['tpot'])}"


def _bar(errs: Sequence[float], bar: float) -> str:
    m = _median_abs(errs)
    return f"{m:.1%} {'<=' if m <= bar else '>'} {bar:.0%}"


def bands(scored: list[Scored]) -> dict[str, dict]:
    """Per engine and concurrency regime: p10 and p90 of the signed error of TTFT and TPOT
    (prediction / measurement - 1) over the leave-one-system-out rows."""
    out: dict[str, dict] = {}
    for eng in sorted({s.engine for s in scored}):
        regimes = []
        for lo, hi in REGIMES:
            ss = [s for s in scored if s.engine == eng and lo <= s.concurrency <= hi]
            if len(ss) < 10:
                continue
            entry: dict = {"concurrency": [lo, hi], "rows": len(ss)}
            for m in ("ttft", "tpot"):
                e = np.array([getattr(s, f"{m}_err") for s in ss])
                e = e[np.isfinite(e)]
                entry[m] = [round(float(np.quantile(e, 0.1)), 4),
                            round(float(np.quantile(e, 0.9)), 4)]
            regimes.append(entry)
        pooled: dict = {"rows": sum(1 for s in scored if s.engine == eng)}
        for m in ("ttft", "tpot"):
            e = np.array([getattr(s, f"{m}_err") for s in scored if s.engine == eng])
            e = e[np.isfinite(e)]
            pooled[m] = [round(float(np.quantile(e, 0.1)), 4),
                         round(float(np.quantile(e, 0.9)), 4)]
        out[eng] = {"regimes": regimes, "all": pooled}
    return out


def run_base(v, cat, rows: list[dict[str, str]], progress: bool = False,
             prefill_frac: float | None = None) -> list[tuple[dict[str, str], Replay]]:
    """Every row replayed with zero constants (at the profile's prefill rate, or at
    `prefill_frac`); rows whose replay fails are left out."""
    base = []
    zero = Constants(0.0, 0.0, 0.0, 0.0, prefill_frac)
    for i, r in enumerate(rows):
        p = replay(v, cat, r, zero)
        if p is not None and p.tpot_s > 0 and math.isfinite(p.ttft_s):
            base.append(({**r, "_c": str(v.concurrency(r))}, p))
        if progress and i % 200 == 0:
            print(f"  replayed {i} / {len(rows)}", flush=True)
    return base


def release_key(r: dict[str, str]) -> str:
    """Leave-one-engine-version-out groups: the row's release family (major.minor, with the
    profile it runs), unlabelled and dev builds as their own groups."""
    rel = row_release(r)
    if rel in ("unlabelled", "dev"):
        return rel
    m = re.match(r"^(\d+)\.(\d+)", rel)
    return f"{m.group(1)}.{m.group(2)}" if m else rel


def write_bands(path: Path, b: dict, fits_all: dict[str, Constants], n_rows: int,
                sample: int | None) -> None:
    doc = {
        "provenance": ("benchmarks/validate_silicon.py --loso --write-bands: p10/p90 of the "
                       "signed error (predicted / measured - 1) of mean TTFT and TPOT, "
                       "leave-one-system-out, per engine and concurrency range, on the "
                       "AIConfigurator silicon rows (../shared/validation/silicon_sample.csv, "
                       f"{n_rows} agg rows replayed" + (f", subsample {sample}" if sample
                                                       else "") + "); docs/validation.md"),
        "metric": "signed relative error of the prediction: measured = predicted / (1 + e)",
        "engines": b,
        "fitted_constants": {e: {"layer_step_overhead_s": c.layer_s,
                                 "per_seq_overhead_s": c.seq_s,
                                 "request_overhead_s": c.overhead_s,
                                 "mla_layer_request_overhead_s": c.mla_s}
                             for e, c in fits_all.items()},
        "versions": {e: [p.version for p in ps] for e, ps in VERSIONS.items()},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
