"""Is the benchmark's first token some generated tokens after the engine's? TTFT = engine TTFT +
h x TPOT, scored against a constant request overhead on the silicon rows.

    python benchmarks/silicon_ttft_lead.py [--cache FILE] [--write-docs]

Every `agg` row is replayed once with every fitted constant at zero (engine time alone), as
benchmarks/silicon_loso.py replays it (`run_base`; rows beyond their system's NVLink domain
left out, as the fits leave them). With `--cache FILE` the replays are read from FILE (a pickle
of `run_base`'s list) and written there when FILE is missing. The TTFT of each row is then
predicted with silicon_loso's first-order model of the replay (`predict`: the engine's share
of TTFT scales with the step) at the engine's step constants F and s (`silicon_loso.fit`, fitted
on TPOT and untouched here), plus a request term:
  constant:   o + m x MLA layers (silicon_loso's o and m, same grids);
  lead h:     o [+ m x MLA layers] + h x the row's TPOT, h on a grid of quarter tokens 0-32:
              the benchmark's first token taken as the (1 + h)-th generated token (per row,
              TTFT + h x mean TPOT: the gaps after the first token are near the mean);
  prompt lag: o + (a + b x prompt / 1,024) x TPOT, a lag that grows with the prompt (no client
              or server mechanism gives one: it tests what the per-prompt fits point to).
Both minimise TTFT's median |error| on the rows they see; each is scored leave-one-system-out
(fit on every other system, score the held-out one) with the first-order model, so the table
compares the two terms like for like, not the exact replays of docs/validation.md 4b.
A second table fits h per model (in sample, o and m refitted) for the models with at least
MIN_ROWS rows of an engine: a mechanism fixed by the chat format or the client would give one
model the same h on every engine, and the same h at every prompt length (the table fits h on
the 1,024- and the 8,192-token prompts apart). `--write-docs` rewrites the blocks
`silicon_ttft_lead:loso` and `silicon_ttft_lead:by-model` of docs/validation.md (section 4b).
"""

from __future__ import annotations

import pickle
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import silicon_loso as L  # noqa: E402
import validate_silicon as V  # noqa: E402

H_GRID = tuple(np.round(np.arange(0, 32.001, 0.25), 2))
"""Generated tokens the benchmark's first token lags the engine's (quarter tokens)."""
MIN_ROWS = 15
MIN_ISL_ROWS = 12
ENGINES = ("vllm", "sglang", "trtllm")


def load_base(cache: Path | None) -> list:
    """Zero-constant replays of every agg row inside its NVLink domain (cached when asked)."""
    if cache is not None and cache.exists():
        with cache.open("rb") as fh:
            return pickle.load(fh)
    cat = V.load_catalog()
    base = [(r, p) for r, p in L.run_base(V, cat, V.agg_rows(), progress=True)
            if not V.beyond_domain(cat, r)]
    if cache is not None:
        with cache.open("wb") as fh:
            pickle.dump(base, fh)
    return base


PROMPT_GRID = tuple(np.round(np.arange(0, 4.001, 0.25), 2))
"""Steps of lag per 1,024 prompt tokens (the h = a + b x prompt / 1,024 variant)."""

TERMS = (("o + m MLA", False, L.MLA_GRID_S, (0.0,)), ("o + h TPOT", True, (0.0,), (0.0,)),
         ("o + m MLA + h TPOT", True, L.MLA_GRID_S, (0.0,)),
         ("o + (a + b prompt/1,024) TPOT", True, (0.0,), PROMPT_GRID))
"""The request terms compared: (label, h fitted, grid of m, grid of b)."""


def arrays(items: list) -> dict[str, np.ndarray]:
    """silicon_loso's arrays plus the prompt length in units of 1,024 tokens."""
    z = L._arrays(items)
    z["isl_k"] = np.array([int(r["isl"]) / 1024 for r, _ in items])
    return z


def fit(z: dict[str, np.ndarray], lead: bool, mla_grid=L.MLA_GRID_S, b_grid=(0.0,)
        ) -> tuple[L.Constants, tuple[float, float]]:
    """Step constants from silicon_loso.fit, then (o, m[, h = a + b x prompt / 1,024])
    minimising TTFT's median |error|."""
    c = L.fit(z)
    if not lead:
        return c, (0.0, 0.0)
    eng, tpot = L.predict(z, np.float64(c.layer_s), np.float64(c.seq_s), 0.0, 0.0)
    o = np.asarray(L.OVERHEAD_GRID_S)[:, None, None]
    m = np.asarray(mla_grid)[None, :, None]
    best = (np.inf, (0.0, 0.0), 0.0, 0.0)
    for bb in b_grid:
        for h in H_GRID:
            pred = (eng + (h + bb * z["isl_k"]) * tpot)[None, None, :] + o \
                + m * z["mla"][None, None, :]
            cost = np.median(np.abs(pred / z["ttft_meas"] - 1), axis=2)
            i, j = np.unravel_index(np.argmin(cost), cost.shape)
            if cost[i, j] < best[0]:
                best = (cost[i, j], (float(h), float(bb)), L.OVERHEAD_GRID_S[i], mla_grid[j])
    return L.Constants(c.layer_s, c.seq_s, float(best[2]), float(best[3])), best[1]


def ttft(z: dict[str, np.ndarray], c: L.Constants, lag: tuple[float, float]) -> np.ndarray:
    eng, tpot = L.predict(z, np.float64(c.layer_s), np.float64(c.seq_s), c.overhead_s, c.mla_s)
    return eng + (lag[0] + lag[1] * z["isl_k"]) * tpot


def _err(items: list, c: L.Constants, lag: tuple[float, float]) -> np.ndarray:
    z = arrays(items)
    return ttft(z, c, lag) / z["ttft_meas"] - 1


def _lag(lag: tuple[float, float]) -> str:
    return f"{lag[0]:g}" if lag[1] == 0 else f"{lag[0]:g} + {lag[1]:g} x"


def loso(base: list) -> list[str]:
    out = ["| engine | rows | systems | request term | all rows: o (ms) / m (ms) / h | in sample "
           "TTFT median | held-out TTFT median / p90 / bias | h per fold |",
           "|---|---|---|---|---|---|---|---|"]
    for eng in ENGINES:
        items = [(r, p) for r, p in base if r["backend"] == eng]
        systems = sorted({r["system"] for r, _ in items})
        for term, lead, grid, b_grid in TERMS:
            c, lag = fit(arrays(items), lead, grid, b_grid)
            errs, lags = [], []
            for s in systems:
                train = [(r, p) for r, p in items if r["system"] != s]
                test = [(r, p) for r, p in items if r["system"] == s]
                cs, lg = fit(arrays(train), lead, grid, b_grid)
                errs.extend(_err(test, cs, lg))
                lags.append(lg)
            e = np.asarray(errs)
            hcol = ", ".join(_lag(lg) for lg in lags) if lead else "-"
            out.append(f"| {eng} | {len(items)} | {len(systems)} | {term} | "
                       f"{c.overhead_s * 1e3:.0f} / {c.mla_s * 1e3:.3g} / {_lag(lag)} | "
                       f"{np.median(np.abs(_err(items, c, lag))):.1%} | "
                       f"{np.median(np.abs(e)):.1%} / {np.percentile(np.abs(e), 90):.0%} / "
                       f"{np.median(e):+.0%} | {hcol} |")
    return out


def _h_at(items: list, isl: str) -> str:
    """h fitted (o, m refitted) on the rows with prompt length `isl`, with their count."""
    sub = [(r, p) for r, p in items if r["isl"] == isl]
    if len(sub) < MIN_ISL_ROWS:
        return "-"
    return f"{fit(arrays(sub), True)[1][0]:g} ({len(sub)})"


def by_model(base: list) -> list[str]:
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for r, p in base:
        groups[(r["model_path"].split("/")[-1], r["backend"])].append((r, p))
    out = ["| model | engine | rows | h (o, m refitted) | o (ms) | TTFT median, constant / "
           "with h | h at 1,024-token prompts (rows) | at 8,192 (rows) |",
           "|---|---|---|---|---|---|---|---|"]
    for (model, eng), items in sorted(groups.items()):
        if len(items) < MIN_ROWS:
            continue
        c0, lag0 = fit(arrays(items), False)
        c, lag = fit(arrays(items), True)
        out.append(f"| {model} | {eng} | {len(items)} | {lag[0]:g} | {c.overhead_s * 1e3:.0f} | "
                   f"{np.median(np.abs(_err(items, c0, lag0))):.0%} / "
                   f"{np.median(np.abs(_err(items, c, lag))):.0%} | {_h_at(items, '1024')} | "
                   f"{_h_at(items, '8192')} |")
    return out


def main() -> None:
    cache = None
    if "--cache" in sys.argv:
        i = sys.argv.index("--cache")
        if i + 1 >= len(sys.argv):
            print("error: --cache needs a file", file=sys.stderr)
            sys.exit(2)
        cache = Path(sys.argv[i + 1])
    base = load_base(cache)
    tab, mod = loso(base), by_model(base)
    from docblocks import report

    report(V.DOC, "silicon_ttft_lead", {"loso": tab, "by-model": mod}, f"({len(base)} rows)",
           "--write-docs" in sys.argv)


if __name__ == "__main__":
    V.run_if_data(main)
