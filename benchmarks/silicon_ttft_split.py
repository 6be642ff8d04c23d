"""Where the closed-loop replay's TTFT misses the silicon rows: the start-up wave against the
later rounds, by engine and load.

    python benchmarks/silicon_ttft_split.py [--sample N] [--write-docs]

Each `agg` row of a deterministic sample (validate_silicon._sample, default 400 rows; attention-
DP rows included) is replayed as benchmarks/silicon_loso.py replays it (the row's release
profile and benchmark settings; rows whose recorded world exceeds the system's NVLink domain
left out, as the fits leave them: validate_silicon.beyond_domain) with every fitted constant at
zero (engine time alone), twice:
the start-up wave alone (C requests, all C clients start together: mean TTFT W) and four rounds
(4C requests); the later rounds' mean is S = (4 x mean(4 rounds) - W) / 3. AIPerf's measured
phase is 20 rounds (silicon_loso.MEASURED_ROUNDS), so the replay's answer is W / 20 + 19 S / 20
plus the request overhead. The measured mean M sits between S and W: the share of the wave it
implies, `(M - S) / (W - S)`, is 1/20 if the rounds after the first run as the replay runs them,
1 if every round queues like the start-up wave. A second table follows each configuration
(engine, release, model, system, precision, layout, lengths) across the concurrencies the
sample holds: the ratio of the measured TTFT to the replay's engine time (W / 20 + 19 S / 20)
at its lowest and at its highest concurrency. A ratio that stays put while C grows says the
miss belongs to the configuration (its prefill, its per-request costs), one that grows says it
is the load (queueing the replay lacks). `--write-docs` rewrites the blocks
`silicon_ttft_split:by-load` and `silicon_ttft_split:by-configuration` of docs/validation.md
(section 4b).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import silicon_loso as L  # noqa: E402
import validate_silicon as V  # noqa: E402

from capplan.errors import CapplanError  # noqa: E402
from capplan.plan.aiconfigurator import later_rounds_mean, rounds_mean  # noqa: E402

REGIMES = ((1, 8), (9, 64), (65, 1 << 30))


FOUR = 4
"""Rounds replayed for S (rounds 2-4): the wave and three later rounds, at zero constants."""


def split(cat, r: dict[str, str]) -> tuple[float, float, float, float] | None:
    """(W, S, replay TPOT, measured TPOT) of a row in seconds, at zero constants."""
    try:
        dep = V.deployment(cat, r, 0.0, (0.0, 0.0), engine=L.row_engine(r))
        if not dep.memory.fits:
            return None
        c, isl, osl = V.concurrency(r), int(r["isl"]), int(r["osl"])
        wave = L.benchmark_replay(dep, c, isl, osl, c)
        four = L.benchmark_replay(dep, c, isl, osl, FOUR * c)
    except CapplanError:
        return None
    w = wave["ttft_s"]["mean"]
    s = later_rounds_mean(w, four["ttft_s"]["mean"], FOUR)
    return w, s, four["tpot_s"]["mean"], float(r["silicon_tpot_ms"]) / 1e3


def table(rows: list[tuple[dict[str, str], tuple[float, float, float, float]]]) -> list[str]:
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for r, (w, s, _tp, _mp) in rows:
        c = V.concurrency(r)
        lo, hi = next(g for g in REGIMES if g[0] <= c <= g[1])
        rng = f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"
        m = float(r["silicon_ttft_ms"]) / 1e3
        share = (m - s) / (w - s) if w - s > 1e-4 else float("nan")
        groups[(r["backend"], rng)].append((m, w, s, share, rounds_mean(w, s) / m - 1))
    out = ["| engine | clients | rows | measured TTFT (ms) | wave W (ms) | later rounds S (ms) | "
           "implied wave share, median (p25-p75) | 20-round replay / measured - 1, median |",
           "|---|---|---|---|---|---|---|---|"]
    for (eng, rng), v in sorted(groups.items(), key=lambda kv: (kv[0][0], int(
            kv[0][1].split("-")[0].rstrip("+")))):
        a = np.asarray(v, float)
        sh = a[np.isfinite(a[:, 3]), 3]
        q = np.percentile(sh, [25, 50, 75]) if sh.size else [np.nan] * 3
        out.append(f"| {eng} | {rng} | {len(v)} | {np.median(a[:, 0]) * 1e3:.0f} | "
                   f"{np.median(a[:, 1]) * 1e3:.0f} | {np.median(a[:, 2]) * 1e3:.0f} | "
                   f"{q[1]:.2f} ({q[0]:.2f}-{q[2]:.2f}) | {np.median(a[:, 4]):+.0%} |")
    return out


def configuration(r: dict[str, str]) -> tuple:
    """What a row's TTFT depends on besides its concurrency (and the running-request cap the
    generator derives from it)."""
    return (r["backend"], r["backend_version"], r["model_path"], r["system"], r["precision"],
            r["tp_size"], r["pp_size"], r["attention_dp_size"], r["moe_ep_size"], r["isl"],
            r["osl"])


def by_configuration(rows: list[tuple[dict[str, str], tuple[float, float, float, float]]]
                     ) -> list[str]:
    """Per engine, over configurations with at least two concurrencies: the median ratio of
    measured TTFT to the replay's engine time at the lowest and at the highest concurrency, and
    the median of their quotient (1: the miss does not grow with the load)."""
    confs: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r, (w, s, _tp, _mp) in rows:
        engine_s = rounds_mean(w, s)
        if engine_s > 0:
            m = float(r["silicon_ttft_ms"]) / 1e3
            confs[configuration(r)][V.concurrency(r)].append(m / engine_s)
    per: dict[str, list[tuple[float, float, int, int]]] = defaultdict(list)
    for key, by_c in confs.items():
        if len(by_c) < 2:
            continue
        lo, hi = min(by_c), max(by_c)
        per[key[0]].append((float(np.median(by_c[lo])), float(np.median(by_c[hi])), lo, hi))
    out = ["| engine | configurations | clients, median lowest / highest | measured / replayed "
           "engine TTFT at the lowest C | at the highest C | highest / lowest, median (p25-p75) |",
           "|---|---|---|---|---|---|"]
    for eng, v in sorted(per.items()):
        a = np.asarray(v, float)
        q = np.percentile(a[:, 1] / a[:, 0], [25, 50, 75])
        out.append(f"| {eng} | {len(v)} | {np.median(a[:, 2]):.0f} / {np.median(a[:, 3]):.0f} | "
                   f"{np.median(a[:, 0]):.2f} | {np.median(a[:, 1]):.2f} | "
                   f"{q[1]:.2f} ({q[0]:.2f}-{q[2]:.2f}) |")
    return out


def main() -> None:
    n = int(sys.argv[sys.argv.index("--sample") + 1]) if "--sample" in sys.argv else 400
    cat = V.load_catalog()
    rows = []
    for r in V._sample([r for r in V.agg_rows() if not V.beyond_domain(cat, r)], n):
        got = split(cat, r)
        if got is not None:
            rows.append((r, got))
    body = table(rows)
    conf = by_configuration(rows)
    from docblocks import report

    report(V.DOC, "silicon_ttft_split", {"by-load": body, "by-configuration": conf},
           f"({len(rows)} of {n} sampled rows replayed)", "--write-docs" in sys.argv)


if __name__ == "__main__":
    V.run_if_data(main)
