"""The prefill step against the silicon rows: measured TTFT growth with the prompt, by model family.

    python benchmarks/silicon_prefill_slope.py [--write-docs]

Every `agg` row with at most 8 clients (the queue is short: a returning client finds at most
7 others) whose configuration (engine, release, model, system, precision, layout, output
length, concurrency) was also measured at the other prompt length of the pair 1,024 / 8,192
tokens is replayed as benchmarks/silicon_loso.py replays it, with every fitted constant at
zero (engine time alone). The difference of the two TTFTs cancels whatever a request costs
outside the engine, so measured over replayed difference says how fast the replay's prefill
step is against the benchmark's. Families (silicon_loso.FAMILIES): dense (Llama-3.1,
Qwen3-32B), MoE (MiniMax-M2.5, gpt-oss-120b, Qwen3-235B, Qwen3.5-397B), MLA MoE (DeepSeek-R1/V3,
Kimi-K2.5, GLM-5). Each row runs twice: with the calibration's default (`expert_gemm_frac` 1:
quantized routed experts' grouped GEMMs at the dense GEMM rate) and with them at
CANDIDATE_FRAC of it, inside the published range (docs/perf.md, "Routed experts at
prefill"). A second table gives the TTFT at those loads by prompt length (every
configuration, paired or not, one row each), engine time alone against the measurement.
`--write-docs` rewrites the blocks `silicon_prefill_slope:by-family`, `:by-system` and
`:low-load` of docs/validation.md (section 4b).
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
from capplan.plan.aiconfigurator import agg_deployment, replayed_means  # noqa: E402

MAX_CLIENTS = 8
SHORT, LONG = 1024, 8192
ZERO = {"request_overhead_s": 0.0, "step_overhead_s": 0.0, "per_seq_overhead_s": 0.0}
CANDIDATE_FRAC = 0.25
"""expert_gemm_frac compared with the default: inside the published range for quantized
fine-grained experts (0.14-0.46, docs/perf.md "Routed experts at prefill")."""


def key(r: dict[str, str]) -> tuple:
    """A row's configuration apart from its prompt length."""
    return (r["backend"], r["backend_version"], r["model_path"], r["system"], r["precision"],
            r["tp_size"], r["pp_size"], r["attention_dp_size"], r["moe_ep_size"], r["osl"],
            V.concurrency(r))


def engine_ttft(cat, r: dict[str, str], frac: float) -> float | None:
    """Mean TTFT of the row's 20-round replay with zero fitted constants (engine time)."""
    try:
        dep = agg_deployment(cat, V.run_of(r, L.row_engine(r)),
                             {**ZERO, "expert_gemm_frac": frac})
        if not dep.memory.fits:
            return None
        return replayed_means(dep, V.concurrency(r), int(r["isl"]), int(r["osl"]))[0]
    except CapplanError:
        return None


def rows_of_pairs(cat) -> dict[tuple, dict[int, dict[str, str]]]:
    by: dict[tuple, dict[int, dict[str, str]]] = defaultdict(dict)
    for r in V.agg_rows():
        if V.concurrency(r) <= MAX_CLIENTS and not V.beyond_domain(cat, r):
            by[key(r)][int(r["isl"])] = r
    return by


def run(cat) -> list[tuple[dict[str, str], float, float]]:
    """(row, engine TTFT at expert_gemm_frac 1, at CANDIDATE_FRAC) of every low-load row."""
    out = []
    for lengths in rows_of_pairs(cat).values():
        for r in lengths.values():
            old, new = engine_ttft(cat, r, 1.0), engine_ttft(cat, r, CANDIDATE_FRAC)
            if old is not None and new is not None:
                out.append((r, old, new))
    return out


def _q(a: np.ndarray) -> str:
    p25, p50, p75 = np.percentile(a, [25, 50, 75])
    return f"{p50:.2f} ({p25:.2f}-{p75:.2f})"


def _pairs(got: list[tuple[dict[str, str], float, float]]
           ) -> list[tuple[dict[str, str], float, float, float]]:
    """(row at LONG, measured, replayed at the dense rate, at CANDIDATE_FRAC) TTFT differences
    LONG - SHORT of every configuration measured at both."""
    idx = {(key(r), int(r["isl"])): (r, a, b) for r, a, b in got}
    out = []
    for (k, isl), (r, a, b) in idx.items():
        if isl != LONG or (k, SHORT) not in idx:
            continue
        r0, a0, b0 = idx[(k, SHORT)]
        meas = (float(r["silicon_ttft_ms"]) - float(r0["silicon_ttft_ms"])) / 1e3
        out.append((r, meas, a - a0, b - b0))
    return out


def by_system(got: list[tuple[dict[str, str], float, float]]) -> list[str]:
    """Markdown rows: measured over replayed TTFT growth (experts at the dense rate) by
    engine, family and system."""
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r, meas, a, _ in _pairs(got):
        if a > 0:
            groups[(r["backend"], L.family(r["model_path"]), r["system"])].append(meas / a)
    out = ["| engine | family | system | pairs | measured / replayed TTFT growth 1,024 -> "
           "8,192, experts at the dense rate: median (p25-p75) |", "|---|---|---|---|---|"]
    for (eng, fam, system), v in sorted(groups.items()):
        out.append(f"| {eng} | {fam} | {system} | {len(v)} | {_q(np.asarray(v))} |")
    return out


def by_family(got: list[tuple[dict[str, str], float, float]]) -> list[str]:
    groups: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    for r, meas, a, b in _pairs(got):
        groups[(r["backend"], L.family(r["model_path"]))].append((meas, a, b))
    out = [f"| engine | family | pairs | measured TTFT {LONG:,} - {SHORT:,} (ms) | replayed, "
           f"experts at the dense rate / at {CANDIDATE_FRAC:g} of it (ms) | measured / "
           f"replayed, dense rate: median (p25-p75) | at {CANDIDATE_FRAC:g} |",
           "|---|---|---|---|---|---|---|"]
    for (eng, fam), v in sorted(groups.items()):
        a = np.asarray(v, float)
        a = a[(a[:, 1] > 0) & (a[:, 2] > 0)]
        if not len(a):
            continue
        out.append(f"| {eng} | {fam} | {len(a)} | {np.median(a[:, 0]) * 1e3:.0f} | "
                   f"{np.median(a[:, 1]) * 1e3:.0f} / {np.median(a[:, 2]) * 1e3:.0f} | "
                   f"{_q(a[:, 0] / a[:, 1])} | {_q(a[:, 0] / a[:, 2])} |")
    return out


def low_load(got: list[tuple[dict[str, str], float, float]]) -> list[str]:
    groups: dict[tuple[str, str, int], list[tuple[float, float, float]]] = defaultdict(list)
    for r, a, b in got:
        groups[(r["backend"], L.family(r["model_path"]), int(r["isl"]))].append(
            (float(r["silicon_ttft_ms"]) / 1e3, a, b))
    out = ["| engine | family | prompt | rows | measured TTFT (ms) | engine time, experts at "
           f"the dense rate / at {CANDIDATE_FRAC:g} of it (ms) | measured / engine time, dense "
           f"rate | at {CANDIDATE_FRAC:g} |", "|---|---|---|---|---|---|---|---|"]
    for (eng, fam, isl), v in sorted(groups.items()):
        a = np.asarray(v, float)
        out.append(f"| {eng} | {fam} | {isl:,} | {len(a)} | {np.median(a[:, 0]) * 1e3:.0f} | "
                   f"{np.median(a[:, 1]) * 1e3:.0f} / {np.median(a[:, 2]) * 1e3:.0f} | "
                   f"{np.median(a[:, 0] / a[:, 1]):.2f} | {np.median(a[:, 0] / a[:, 2]):.2f} |")
    return out


def main() -> None:
    cat = V.load_catalog()
    got = run(cat)
    fam, low = by_family(got), low_load(got)
    from docblocks import report

    report(V.DOC, "silicon_prefill_slope", {"by-family": fam, "by-system": by_system(got),
                                            "low-load": low},
           f"({len(got)} rows replayed)", "--write-docs" in sys.argv)


if __name__ == "__main__":
    V.run_if_data(main)
