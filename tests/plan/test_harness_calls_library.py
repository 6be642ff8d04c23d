"""benchmarks/ reads data and scores; the predictions it reports are the library's.

The benchmark protocol, the reported-TTFT definition, the deployment of an AIConfigurator run,
its closed-loop prediction and replay, and the fixed-batch formulas of published figures live in
capplan/ and are defined nowhere in benchmarks/ (a harness may import them)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MOVED = {
    "capplan/plan/aiconfigurator.py": (
        "SYSTEM_GPUS", "MEASURED_ROUNDS", "REPLAY_ROUNDS", "AggRun", "agg_weight_dtype",
        "run_kv_dtype", "agg_deployment", "agg_policy", "agg_closed_loop",
        "agg_closed_loop_replay", "benchmark_replay", "later_rounds_mean", "rounds_mean",
        "measured_mean", "replayed_means",
        "release_label", "release_engine", "disagg_worker_options", "disagg_worker"),
    "capplan/sim/protocol.py": ("reported_ttft", "aiconfigurator_settings"),
    "capplan/models/fixed_batch.py": ("decode_tok_per_s", "first_token_s", "mean_tpot_s",
                                      "batch_e2e_s"),
}
"""Where each moved name is defined (the only place)."""
GONE = ("dtype_for", "bench_settings", "BenchSettings")
"""The harness's old names for logic now in the library (agg_weight_dtype,
aiconfigurator_settings)."""


def definitions(path: Path) -> set[str]:
    """Names a module defines: functions and classes at any depth, module-level assignments."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = {n.name for n in ast.walk(tree)
           if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def defined_in(folder: Path, names: set[str]) -> list[str]:
    """`file: name` for every name of `names` that a .py file under `folder` defines."""
    return [f"{p.relative_to(folder)}: {n}" for p in sorted(folder.rglob("*.py"))
            for n in sorted(definitions(p) & names)]


def test_moved_logic_is_defined_in_capplan_only():
    names = {n for group in MOVED.values() for n in group} | set(GONE)
    assert defined_in(ROOT / "benchmarks", names) == []


def test_each_moved_name_is_where_the_list_says():
    for module, names in MOVED.items():
        missing = set(names) - definitions(ROOT / module)
        assert not missing, f"{module} no longer defines {sorted(missing)}"


def test_the_check_sees_a_definition(tmp_path: Path):
    (tmp_path / "harness.py").write_text(
        "from capplan.plan.aiconfigurator import measured_mean\n"  # an import is allowed
        "REPLAY_ROUNDS = 4\n"
        "def score(rows):\n"
        "    def reported_ttft(o, w, s, n):\n"
        "        return o\n"
        "    return rows\n", encoding="utf-8")
    found = defined_in(tmp_path, {"measured_mean", "REPLAY_ROUNDS", "reported_ttft"})
    assert found == ["harness.py: REPLAY_ROUNDS", "harness.py: reported_ttft"]
