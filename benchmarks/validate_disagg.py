"""Score the disaggregated model against the `disagg` rows of the silicon sample.

`../shared/validation/silicon_sample.csv` (AIConfigurator, Apache-2.0): mean TTFT and TPOT of
disaggregated deployments (prefill_num_workers x prefill layout, decode_num_workers x decode
layout) under a closed loop of C clients (`silicon_concurrency=`), fixed input/output lengths.

Per row (models/disagg.py, plan/disagg.py; nothing fitted):
- a worker's GPUs are tp x pp x attention_dp (attention data parallelism runs on its own GPUs;
  capplan models the worker as one replica over that many GPUs, TP = that count);
- TPOT: the decode pool's mean token gap at the per-worker rate, the decode pool being a queue
  whose prompts arrive as a cache hit (one token computed);
- TTFT: prefill pool TTFT (queue + prefill + the engine's request overhead) + KV transfer over
  NVLink inside an NVL72 rack (gb200, gb300) and over the network elsewhere + the decode
  side's admission and first step;
- the closed loop: the rate solves lambda = C / (TTFT + (osl - 1) TPOT) by bisection.
Errors |predicted / measured - 1| as median / p90 / median signed bias, by engine and system.

Run: .venv/bin/python benchmarks/validate_disagg.py [--per-group N]   (default 10 rows per
engine and system, every k-th row by id: ~0.5 s a row; --per-group 0 scores every row)
"""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from capplan.catalog.loader import load_catalog
from capplan.errors import CapplanError
from capplan.models.disagg import kv_link, kv_transfer_s
from capplan.models.queueing import LengthStats
from capplan.plan.deployment import EngineOptions, resolve_deployment
from capplan.plan.disagg import decode_model, prefill_model
from capplan.plan.search import Traffic
from capplan.plan.slo import SloSet

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "validation" / "silicon_sample.csv"
SYSTEMS = {"h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300", "gb200": "gb200",
           "gb300": "gb300"}
NVL72 = {"gb200", "gb300"}
"""Systems whose NVLink domain spans the rack: prefill and decode workers share it."""


def concurrency(row: dict[str, str]) -> int | None:
    src = row["silicon_data_source"]
    if "silicon_concurrency=" in src:
        return int(src.split("silicon_concurrency=")[1].split(";")[0])
    return None


def dtype_for(precision: str) -> str:
    return {"fp8": "fp8", "fp4": "fp4"}.get(precision, "auto")


_DEPS: dict[tuple, object] = {}


def _worker(cat, r: dict[str, str], role: str):
    gpus = (int(r[f"{role}_tp_size"] or 1) * int(r[f"{role}_pp_size"] or 1)
            * int(r[f"{role}_attention_dp_size"] or 1))
    kvd = "fp8" if r["precision"] in ("fp8", "fp4") else "auto"
    isl, osl = int(r["isl"]), int(r["osl"])
    key = (r["backend"], r["model_path"], r["system"], r["precision"], gpus, isl + osl)
    if key not in _DEPS:
        opts = EngineOptions(engine=r["backend"], tp=gpus,
                             weight_dtype=dtype_for(r["precision"]), kv_dtype=kvd,
                             max_model_len=isl + osl + 16)
        _DEPS[key] = resolve_deployment(cat, r["model_path"], SYSTEMS[r["system"]], opts)
    return _DEPS[key]


def predict(cat, r: dict[str, str]) -> tuple[float, float] | None:
    c = concurrency(r)
    if c is None:
        return None
    try:
        pd, dd = _worker(cat, r, "prefill"), _worker(cat, r, "decode")
    except CapplanError:
        return None
    if not (pd.memory.fits and dd.memory.fits):
        return None
    isl, osl = int(r["isl"]), int(r["osl"])
    n_p, n_d = int(r["prefill_num_workers"] or 1), int(r["decode_num_workers"] or 1)
    t = Traffic(1.0, LengthStats.fixed(isl), LengthStats.fixed(osl), 1.0, SloSet(), ("row",))
    qp, qd = prefill_model(pd, t), decode_model(dd, t)
    link = kv_link(dd.gpu.interconnect.bytes_per_s, r["system"] in NVL72)
    tx = float(kv_transfer_s(isl, dd.memory.kv_bytes_per_token_per_gpu, link))
    overhead = float(np.asarray(dd.step.request_overhead_s))

    def at(lam: float) -> tuple[float, float]:
        p, d = qp.at_rate(lam / n_p), qd.at_rate(lam / n_d)
        ttft = float(p["ttft_s"]["mean"]) + tx + float(d["ttft_s"]["mean"]) - overhead
        return ttft, float(d["tbt_s"]["mean"])

    lo, hi = 1e-6, min(float(qp.capacity_rate()) * n_p, float(qd.capacity_rate()) * n_d)
    for _ in range(24):  # closed loop: lambda = C / (TTFT + (osl - 1) TPOT)
        lam = 0.5 * (lo + hi)
        ttft, tpot = at(lam)
        implied = c / (ttft + (osl - 1) * tpot) if math.isfinite(ttft + tpot) else 0.0
        lo, hi = (lam, hi) if implied > lam else (lo, lam)
    ttft, tpot = at(lo)
    return (ttft, tpot) if math.isfinite(ttft) and math.isfinite(tpot) else None


def cell(e: np.ndarray) -> str:
    if not e.size:
        return "-"
    return (f"{np.median(np.abs(e)):.0%} / {np.quantile(np.abs(e), 0.9):.0%} / "
            f"{np.median(e):+.0%}")


def main() -> None:
    if not DATA.exists():
        print(f"{DATA} not found; nothing to score")
        return
    cat = load_catalog()
    with DATA.open() as f:
        rows = [r for r in csv.DictReader(f) if r["mode"] == "disagg" and r["system"] in SYSTEMS]
    per_group = int(sys.argv[sys.argv.index("--per-group") + 1]) if "--per-group" in sys.argv \
        else 10
    if per_group:
        by: dict[tuple[str, str], list] = defaultdict(list)
        for r in sorted(rows, key=lambda r: r["id"]):
            by[(r["backend"], r["system"])].append(r)
        rows = [r for g in by.values() for r in g[::max(1, math.ceil(len(g) / per_group))]]
    groups: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    skipped = 0
    for r in rows:
        p = predict(cat, r)
        if p is None:
            skipped += 1
            continue
        mt, mp = float(r["silicon_ttft_ms"]) / 1e3, float(r["silicon_tpot_ms"]) / 1e3
        for key in ((r["backend"], r["system"]), ("all", "all")):
            groups[key]["ttft"].append(p[0] / mt - 1)
            groups[key]["tpot"].append(p[1] / mp - 1)
    print(f"disagg rows: {len(rows)}, scored {len(rows) - skipped}, skipped {skipped} "
          "(model not in the catalog, no concurrency, or does not fit)")
    print("| engine | system | rows | TTFT median / p90 / bias | TPOT median / p90 / bias |")
    print("|---|---|---|---|---|")
    for key in sorted(groups, key=lambda k: (k[0] == "all", k)):
        g = groups[key]
        print(f"| {key[0]} | {key[1]} | {len(g['ttft'])} | {cell(np.asarray(g['ttft']))} | "
              f"{cell(np.asarray(g['tpot']))} |")


if __name__ == "__main__":
    main()
