"""Score the fixed-layout disaggregated prediction against the `disagg` rows of the silicon sample.

`../shared/validation/silicon_sample.csv` (AIConfigurator, Apache-2.0): mean TTFT and TPOT of
disaggregated deployments (prefill_num_workers x prefill layout, decode_num_workers x decode
layout) under a closed loop of C clients (`silicon_concurrency=`), fixed input/output lengths.

The harness reads rows and scores; the prediction is the product's (capplan.plan.pd, the same
solve as `capplan latency --prefill-workers ... --concurrency C`; nothing fitted):
- a worker's layout as the row gives it: tp_size x attention_dp_size GPUs (x pp_size), MoE
  layers over moe_ep_size expert-parallel ranks (capplan's notation is AIConfigurator's), and
  its batch_size as the engine's max batch per attention-DP rank when the row sets it;
- a worker wider than the GPU's NVLink domain spans nodes over the catalog's network
  (docs/multinode.md); the KV link is NVLink when both pools fit one domain (an NVL72 rack),
  else the network;
- closed loop: lambda = C / (TTFT + (osl - 1) TPOT), a saturated pool named as the bottleneck.
Errors |predicted / measured - 1| as median / p90 / median signed bias, by engine and system.

Run: .venv/bin/python benchmarks/validate_disagg.py [--per-group N] [--data CSV] [--write-docs]
[--assume-one-worker]
(default 10 rows per engine and system, every k-th row by id; --per-group 0 scores every row;
--write-docs rewrites the generated block of docs/validation.md with the full scoring)
"""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from capplan.catalog.loader import load_catalog
from capplan.errors import CapplanError
from capplan.models.queueing import LengthStats
from capplan.plan.deployment import EngineOptions, resolve_deployment
from capplan.plan.pd import PdModel, make_layout
from capplan.sim.protocol import preset

ROOT = Path(__file__).resolve().parents[1]
DATA = (Path(sys.argv[sys.argv.index("--data") + 1]) if "--data" in sys.argv
        else ROOT.parent / "shared" / "validation" / "silicon_sample.csv")
DOC = ROOT / "docs" / "validation.md"
SYSTEMS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300",
           "gb200": "gb200", "gb300": "gb300"}
WAVES = preset("aiperf").prompts_per_client
"""The rows are Dynamo deployments measured with AIPerf as NVIDIA's recipes run it: 10 x C
requests after the warm-ups, every client sending at t = 0 (capplan.sim.protocol)."""
BARS = {"predicted": 0.90, "tpot": 0.15, "ttft": 0.35}
"""The issue's bars for rows not seen: share predicted, median |error| of TPOT and TTFT."""


def concurrency(row: dict[str, str]) -> int | None:
    src = row["silicon_data_source"]
    if "silicon_concurrency=" in src:
        return int(src.split("silicon_concurrency=")[1].split(";")[0])
    return None


def dtype_for(precision: str) -> str:
    return {"fp8": "fp8", "fp4": "fp4"}.get(precision, "auto")


def _size(v: str) -> int:
    return int(v) if v and int(v) > 0 else 1


_DEPS: dict[tuple, object] = {}


def _worker(cat, r: dict[str, str], role: str):
    tp, pp = _size(r[f"{role}_tp_size"]), _size(r[f"{role}_pp_size"])
    dp, ep = _size(r[f"{role}_attention_dp_size"]), _size(r[f"{role}_moe_ep_size"])
    bs = _size(r[f"{role}_batch_size"]) if r[f"{role}_batch_size"] else None
    kvd = "fp8" if r["precision"] in ("fp8", "fp4") else "auto"
    isl, osl = int(r["isl"]), int(r["osl"])
    key = (r["backend"], r["model_path"], r["system"], r["precision"], tp, pp, dp, ep, bs,
           isl + osl)
    if key not in _DEPS:
        opts = EngineOptions(engine=r["backend"], tp=tp, pp=pp, attention_dp=dp,
                             expert_parallel=ep, weight_dtype=dtype_for(r["precision"]),
                             kv_dtype=kvd, max_model_len=isl + osl + 16,
                             max_num_seqs=bs)
        dep = resolve_deployment(cat, r["model_path"], SYSTEMS[r["system"]], opts)
        if (not dep.profile.scheduler.chunked_prefill
                and dep.settings.max_num_batched_tokens < isl):
            # an engine that prefills whole prompts runs only with a token budget that holds
            # one (TensorRT-LLM rejects a request longer than max_num_tokens without chunking):
            # the deployment measured set it so
            dep = resolve_deployment(cat, r["model_path"], SYSTEMS[r["system"]],
                                     replace(opts, max_num_batched_tokens=isl))
        _DEPS[key] = dep
    return _DEPS[key]


ASSUME_ONE_WORKER = "--assume-one-worker" in sys.argv
"""Score rows without worker counts as 1 prefill + 1 decode worker (a stated assumption, off by
default: such a row does not give the layout it measured)."""


def why_not(cat, r: dict[str, str]) -> str | None:
    """Why a row cannot be placed as given (None: it can): the reason counted in the table."""
    if concurrency(r) is None:
        return "no concurrency in its source"
    if not (r["prefill_num_workers"] and r["decode_num_workers"]) and not ASSUME_ONE_WORKER:
        return "no worker counts (the layout it measured is not given)"
    try:
        cat.model(r["model_path"])
    except CapplanError:
        return "model not in the catalog"
    return None


def predict(cat, r: dict[str, str]) -> tuple[float, float] | str:
    """(TTFT, TPOT) in seconds, or why the row has no prediction."""
    reason = why_not(cat, r)
    if reason:
        return reason
    c = concurrency(r)
    try:
        lay = make_layout(_worker(cat, r, "prefill"), _size(r["prefill_num_workers"]),
                          _worker(cat, r, "decode"), _size(r["decode_num_workers"]))
        isl, osl = int(r["isl"]), int(r["osl"])
        res = PdModel(lay, LengthStats.fixed(isl), LengthStats.fixed(osl)).closed_loop(
            c, waves=WAVES)
    except CapplanError as e:
        msg = str(e)
        if "fit" in msg:
            return "a worker does not fit its GPUs"
        if "capacity" in msg:
            return "no prefill capacity for its lengths"
        return f"a layout the engine does not run ({msg.split(':')[0]})"
    ttft, tpot = res["ttft_s"]["mean"], res["tpot_s"]
    if not (math.isfinite(ttft) and math.isfinite(tpot)):
        return "no steady state"
    return ttft, tpot


def cell(e: np.ndarray) -> str:
    if not e.size:
        return "-"
    return (f"{np.median(np.abs(e)):.0%} / {np.quantile(np.abs(e), 0.9):.0%} / "
            f"{np.median(e):+.0%}")


def score(rows: list[dict[str, str]]) -> tuple[dict, dict[str, int]]:
    cat = load_catalog()
    groups: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    reasons: dict[str, int] = defaultdict(int)
    for r in rows:
        p = predict(cat, r)
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


def write_docs(text: str, block: str = "validate_disagg:by-engine") -> None:
    """Rewrite the generated block `block` of docs/validation.md with `text` (atomic)."""
    from docblocks import write_block

    write_block(DOC, block, text)


def main() -> None:
    if not DATA.exists():
        print(f"{DATA} not found; nothing to score")
        return
    with DATA.open() as f:
        rows = [r for r in csv.DictReader(f) if r["mode"] == "disagg" and r["system"] in SYSTEMS]
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
    text = table(groups) + "\n\nRows not predicted, by reason: " + (
        "; ".join(f"{why}: {n}" for why, n in sorted(reasons.items(), key=lambda x: -x[1]))
        or "none") + "."
    print(text)
    if "--write-docs" in sys.argv:
        write_docs(text)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
