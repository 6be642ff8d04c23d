"""The leave-one-out pipeline of benchmarks/validate_silicon.py --loso on a small subsample of the
public silicon rows (the full run replays ~2,300 rows and takes tens of minutes; this checks
the machinery, not the figures: those are in docs/validation.md section 4b)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
vs = pytest.importorskip("validate_silicon")
L = pytest.importorskip("silicon_loso")

pytestmark = pytest.mark.skipif(not vs.DATA.exists(), reason="../shared/validation is absent")


def _small_rows(n: int = 8) -> list[dict[str, str]]:
    rows = [r for r in vs.agg_rows() if vs.concurrency(r) <= 16 and int(r["osl"]) <= 1024
            and r["model_path"].startswith("meta-llama")]
    return vs._sample(rows, n)


def test_a_row_runs_its_release_profile():
    row = {"backend": "vllm", "backend_version": "0.12.0"}
    assert L.row_engine(row) == "vllm@0.11"
    assert L.row_engine({**row, "backend_version": "0.19.0"}) == "vllm"
    assert L.row_engine({**row, "backend_version": "nightly-5b8c"}) == "vllm"
    assert L.row_engine({"backend": "sglang", "backend_version": ""}) == "sglang+mixed-chunk"
    assert L.release_key({**row, "backend_version": "0.12.0"}) == "0.12"


def test_replay_fit_and_held_out_scores_on_a_subsample():
    from capplan.catalog.loader import load_catalog

    cat = load_catalog()
    base = L.run_base(vs, cat, _small_rows())
    assert len(base) >= 4
    from capplan.models.engine import engine_profile

    for r, p in base:  # each row runs its release's profile
        assert p.overlap == engine_profile(L.row_engine(r)).host_overlap
    c = L.fit(L._arrays(base))
    assert c.layer_s in L.LAYER_GRID_S and c.overhead_s in L.OVERHEAD_GRID_S
    # the first-order model is exact at zero constants and moves TPOT by F + s B at most
    z = L._arrays(base)
    ttft0, tpot0 = L.predict(z, 0.0, 0.0, 0.0, 0.0)
    assert np.allclose(tpot0, z["tpot"]) and np.allclose(ttft0, z["ttft"])
    _, tpot = L.predict(z, 10e-6, 20e-6, 0.0, 0.0)
    assert np.all(tpot <= z["tpot"] + 10e-6 * z["layers"] + 20e-6 * z["batch"] + 1e-12)
    scored, fits = L.held_out(base, lambda row: row["system"], {})
    assert all(np.isfinite(s.tpot_err) for s in scored)
    lines = L.table(scored, "system")
    assert lines[0].startswith("| engine | system held out |")


def test_rows_beyond_the_nvlink_domain_are_told_apart():
    """A world larger than the system's NVLink domain (8 GPUs per H200/B200/B300 node, 72 per
    GB200 rack) is left out of the fits; the sample's TP 64 rows measure the TPOT of the same
    configuration's one-node rows (ratios near 1), not what 64-way TP over 8 nodes would run."""
    from capplan.catalog.loader import load_catalog

    cat = load_catalog()
    row = {"tp_size": "64", "pp_size": "1", "attention_dp_size": "1", "system": "b200_sxm"}
    assert vs.world(row) == 64 and vs.beyond_domain(cat, row)
    assert not vs.beyond_domain(cat, {**row, "tp_size": "8"})
    assert not vs.beyond_domain(cat, {**row, "tp_size": "4", "attention_dp_size": "2"})
    assert vs.beyond_domain(cat, {**row, "tp_size": "4", "attention_dp_size": "4"})
    assert not vs.beyond_domain(cat, {**row, "tp_size": "36", "system": "gb200"})
    twins = vs.one_node_twins(cat, vs.agg_rows())
    ratios = np.concatenate([np.asarray(v, float) for v in twins.values()])
    assert ratios.size >= 50
    assert 0.8 <= float(np.median(ratios)) <= 1.25  # one node's speed, not eight nodes'


def test_held_out_rows_are_scored_by_their_replay_when_given():
    """`rescore` replaces the first-order prediction of each held-out row by its replay with the
    fold's constants (the published scores are replays, not the fit's model)."""
    rows = [{"id": str(i), "backend": "vllm", "system": s, "_c": "4",
             "silicon_ttft_ms": "100", "silicon_tpot_ms": "10"}
            for i, s in enumerate(("h200_sxm", "h200_sxm", "b200_sxm", "b200_sxm"))]
    base = [(r, L.Replay(0.05, 0.008, 4.0, 0, True, 32)) for r in rows]
    seen = []

    def rescore(r, c):
        seen.append((r["id"], c))
        return L.Replay(0.2, 0.02, 4.0, 0, True, 32)

    scored, fits = L.held_out(base, lambda r: r["system"], {}, rescore=rescore)
    assert len(scored) == 4 and len(seen) == 4
    assert all(abs(s.ttft_err - 1.0) < 1e-9 and abs(s.tpot_err - 1.0) < 1e-9 for s in scored)
    assert {c for _, c in seen} <= set(fits.values())


def test_diagnostic_tables_compute_their_ratios():
    """The engine-time, by-TP, engine-pair and fold tables of 4b on hand-made rows: measured
    TPOT 10 ms over replays of 8 and 5 ms (ratios 1.25 and 2.00, median 1.62); two engines on
    one configuration at 10 and 8 ms (ratio 1.25)."""
    def row(i, eng, tpot, tp="1"):
        return {"id": str(i), "backend": eng, "model_path": "openai/gpt-oss-120b",
                "system": "h200_sxm", "precision": "fp4", "tp_size": tp, "pp_size": "1",
                "attention_dp_size": "1", "moe_ep_size": "1", "isl": "1024", "osl": "1024",
                "silicon_tpot_ms": tpot}

    base = [(row(0, "trtllm", "10"), L.Replay(0.1, 0.008, 4.0, 0, True, 36)),
            (row(1, "trtllm", "10"), L.Replay(0.1, 0.005, 4.0, 0, True, 36))]
    ratio = "1.62 (1.44-1.81) |"
    assert L.engine_time_table(base)[2] == "| trtllm | MoE | h200_sxm | fp4 | 2 | " + ratio
    assert L.engine_time_by_tp(base, "gpt-oss")[2] == "| trtllm | h200_sxm | 1 | 2 | " + ratio
    pairs = L.engine_pairs_table([row(0, "trtllm", "10"), row(1, "vllm", "8")], lambda r: 8)
    assert pairs[2] == "| trtllm / vllm | h200_sxm | MoE | 1 | 1.25 (1.25-1.25) |"
    assert len(L.engine_pairs_table([row(0, "trtllm", "10"), row(1, "vllm", "8", tp="2")],
                                    lambda r: 8)) == 2  # another layout: no pair
    folds = L.fold_table({("trtllm", "b200_sxm"): L.Constants(7.5e-6, 0.0, 0.065, 2.75e-3)},
                         "system")
    assert folds[2] == "| trtllm | b200_sxm | 7.5 | 0 | 65 | 2.75 |"
