"""No import circle in capplan/: every module-to-module import, lazy ones included."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "capplan"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in mods:
                subs = {f"{node.module}.{a.name}" for a in node.names} & mods.keys()
                graph[name] |= subs
                if len(subs) < len(node.names):  # names defined in the module itself
                    graph[name].add(node.module)
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names} & mods.keys()
    return graph


def test_no_import_circle() -> None:
    try:
        tuple(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"import circle: {' -> '.join(e.args[1])}") from None


def test_the_check_sees_a_circle() -> None:
    graph = import_graph()
    graph["capplan.catalog.schema"].add("capplan.catalog.loader")  # loader imports schema
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError:
        return
    raise AssertionError("a circle went unseen")
