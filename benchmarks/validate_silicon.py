"""Score the latency models against measured serving results (../shared/validation).

`silicon_sample.csv` (AIConfigurator, Apache-2.0) holds mean TTFT and TPOT of vLLM, SGLang and
TensorRT-LLM under a closed loop of `batch_size` clients with fixed input/output lengths. For
each `agg` row of a model in the catalog, capplan predicts both with the analytic closed-loop
model (and, with --sim, the simulator), using datasheet calibrations; nothing is fitted here.

Run: .venv/bin/python benchmarks/validate_silicon.py [--sim] [--per-group N]
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from capplan.catalog.loader import load_catalog
from capplan.errors import CapplanError
from capplan.models.engine import EngineSettings
from capplan.models.queueing import LengthStats, Limits, QueueModel
from capplan.plan.deployment import resolve_deployment

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "validation" / "silicon_sample.csv"
SYSTEMS = {"h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300", "gb200": "gb200",
           "gb300": "gb300"}


def concurrency(row: dict[str, str]) -> int:
    src = row["silicon_data_source"]
    if "silicon_concurrency=" in src:
        return int(src.split("silicon_concurrency=")[1].split(";")[0])
    return int(row["batch_size"])


def dtype_for(precision: str, own: str | None) -> str:
    if not precision or precision == own:
        return "auto"
    if precision in ("fp4", "nvfp4") and own in ("mxfp4", "fp4", "nvfp4"):
        return "auto"
    if precision == "int4" and own == "int4":
        return "auto"
    return {"fp8": "fp8", "fp4": "fp4", "int4": "int4", "bf16": "bf16"}.get(precision, "auto")


def rows(per_group: int) -> list[dict[str, str]]:
    out, seen = [], defaultdict(int)
    with DATA.open() as f:
        for r in csv.DictReader(f):
            if r["mode"] != "agg" or r["system"] not in SYSTEMS:
                continue
            key = (r["backend"], r["system"], r["model_path"], r["precision"], r["isl"], r["osl"])
            if seen[key] < per_group:
                seen[key] += 1
                out.append(r)
    return out


def predict(cat, r: dict[str, str], with_sim: bool) -> dict[str, float] | None:
    try:
        res = cat.resolve_model(r["model_path"])
    except CapplanError:
        return None
    own = res.spec.quantization.format if res.spec.quantization else res.spec.torch_dtype
    tp = int(r["tp_size"] or 1) * int(r["pp_size"] or 1)
    conc = concurrency(r)
    s = EngineSettings(tp=tp, weight_dtype=dtype_for(r["precision"], own),
                       max_num_seqs=max(conc, 256), max_num_batched_tokens=8192,
                       max_model_len=int(r["isl"]) + int(r["osl"]) + 16)
    try:
        dep = resolve_deployment(cat, r["model_path"], SYSTEMS[r["system"]], s)
    except CapplanError:
        return None
    if not dep.memory.fits:
        return None
    isl, osl = int(r["isl"]), int(r["osl"])
    qm = QueueModel(dep.step, LengthStats.fixed(isl), LengthStats.fixed(osl),
                    Limits(s.max_num_seqs, s.max_num_batched_tokens, dep.memory.kv_cache_tokens))
    cl = qm.closed_loop(conc)
    out = {"ttft_s": float(cl["ttft_s"]["mean"]), "tpot_s": float(cl["tbt_s"]["mean"]),
           # a decode-only step of the whole batch: what TPOT would be if prefill were free
           "decode_only_s": float(dep.step.decode_step(min(conc, s.max_num_seqs),
                                                       isl + osl / 2)["step_s"])}
    if with_sim:
        from capplan.plan.verify import simulate_closed_loop

        sim = simulate_closed_loop(dep, conc, isl, osl, requests=max(4 * conc, 200))
        out.update({"sim_ttft_s": sim["ttft_s"]["mean"], "sim_tpot_s": sim["tpot_s"]["mean"]})
    return out


def main() -> None:
    if not DATA.exists():
        print(f"{DATA} not found; nothing to score")
        return
    per_group = int(sys.argv[sys.argv.index("--per-group") + 1]) if "--per-group" in sys.argv \
        else 6
    with_sim = "--sim" in sys.argv
    cat = load_catalog()
    errs: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    n = 0
    for r in rows(per_group):
        p = predict(cat, r, with_sim)
        if p is None:
            continue
        n += 1
        key = (r["backend"], r["system"])
        meas_ttft, meas_tpot = float(r["silicon_ttft_ms"]) / 1e3, float(r["silicon_tpot_ms"]) / 1e3
        errs[key]["ttft"].append(p["ttft_s"] / meas_ttft - 1)
        errs[key]["tpot"].append(p["tpot_s"] / meas_tpot - 1)
        errs[key]["decode_only"].append(p["decode_only_s"] / meas_tpot - 1)
        if with_sim:
            errs[key]["sim_ttft"].append(p["sim_ttft_s"] / meas_ttft - 1)
            errs[key]["sim_tpot"].append(p["sim_tpot_s"] / meas_tpot - 1)
    metrics = ["ttft", "tpot", "decode_only"] + (["sim_ttft", "sim_tpot"] if with_sim else [])
    head = " | ".join(f"{m} median / p90 / bias" for m in metrics)
    print(f"| engine | system | rows | {head} |")
    print("|---|---|---|" + "---|" * len(metrics))
    allv: dict[str, list[float]] = defaultdict(list)
    for key in sorted(errs):
        cells = []
        for m in metrics:
            e = np.asarray(errs[key][m])
            allv[m] += list(e)
            cells.append(f"{np.median(np.abs(e)):.0%} / {np.quantile(np.abs(e), 0.9):.0%} / "
                         f"{np.median(e):+.0%}")
        print(f"| {key[0]} | {key[1]} | {len(errs[key]['ttft'])} | " + " | ".join(cells) + " |")
    cells = [f"{np.median(np.abs(allv[m])):.0%} / {np.quantile(np.abs(allv[m]), 0.9):.0%} / "
             f"{np.median(allv[m]):+.0%}" for m in metrics]
    print(f"| all | all | {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
