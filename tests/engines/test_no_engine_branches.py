"""No branch on an engine's name in capplan/: each engine's (and release's) behaviour lives in
its profile (capplan/models/engine.py EngineProfile, docs/engines.md), and the code reads the
profile's fields. The only name comparisons left are on a benchmark client or a benchmark
row's backend, which name benchmark tools and data, not engine behaviour. Nor is there a table
keyed by engine name (a module-level dict literal with a "vllm", "sglang" or "trtllm" key)
outside the profiles' own module: such data is a profile field."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "capplan"

ENGINE_BRANCH = re.compile(
    r"""(==|!=) ?['"](vllm|sglang|trtllm)['"]|in \(['"](vllm|sglang|trtllm)['"]""")
"""`x == "sglang"`, `x != 'vllm'`, `x in ("vllm", ...)`: a branch on an engine's name."""

BENCHMARK_CLIENT_FILES = frozenset({
    "capplan/plan/bench_cmds.py",  # the benchmark client's command (vllm bench, bench_serving)
    "capplan/plan/workload_file.py",  # the client's dataset format
    "capplan/plan/aiconfigurator.py",  # an AIConfigurator row's backend
    "capplan/sim/protocol.py",  # a silicon row's backend, as AIConfigurator's rules read it
})
"""Files whose name comparisons are on a benchmark client or a benchmark row's backend."""


def engine_branches(root: Path, allowed: frozenset[str] = BENCHMARK_CLIENT_FILES) -> list[str]:
    """`path:line: text` of every engine-name comparison under `root`, outside `allowed`
    (paths relative to the repository)."""
    return [f"{rel}:{i}: {line.strip()}" for rel, text in _sources(root, allowed)
            for i, line in enumerate(text.splitlines(), 1) if ENGINE_BRANCH.search(line)]


def _sources(root: Path, allowed: frozenset[str]):
    """(path relative to the repository, text) of every module under `root` not in
    `allowed`."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel not in allowed:
            yield rel, path.read_text(encoding="utf-8")


def test_no_engine_name_branch_in_capplan() -> None:
    found = engine_branches(PACKAGE)
    assert not found, ("a branch on an engine's name: state the behaviour as a field of "
                       "EngineProfile (capplan/models/engine.py) and read it\n"
                       + "\n".join(found))


def test_the_allowlist_names_files_that_exist() -> None:
    for rel in BENCHMARK_CLIENT_FILES:
        assert (ROOT / rel).is_file(), rel


def _plant(pkg: Path, bad: str, bench: str) -> None:
    """A planted module `plan/bad.py` and an allowlisted benchmark-client `plan/bench_cmds.py`."""
    (pkg / "plan" / "bad.py").write_text(bad, encoding="utf-8")
    (pkg / "plan" / "bench_cmds.py").write_text(bench, encoding="utf-8")


def test_the_check_sees_a_branch(tmp_path: Path) -> None:
    pkg = tmp_path / "capplan"
    (pkg / "plan").mkdir(parents=True)
    _plant(pkg, 'if engine == "sglang":\n    pass\n'
                "ok = p.name != 'trtllm'\n"
                'many = engine in ("vllm", "trtllm")\n'
                'fine = PROFILES["vllm"]\n',
           'if client == "vllm":\n    pass\n')
    assert [f.split(":")[1] for f in engine_branches(pkg)] == ["1", "3", "4"]


ENGINE_NAMES = frozenset({"vllm", "sglang", "trtllm"})
PROFILES_FILE = "capplan/models/engine.py"
ENGINE_KEYED_CODE = frozenset({
    ("capplan/plan/launch.py", "BUILDERS"),  # each engine's launch-line builder: code, which
    # the profiles (capplan.models, below capplan.plan) cannot hold
})
"""Module-level tables keyed by engine name that map to code, not to engine data."""


def _assigned_names(node: ast.Assign | ast.AnnAssign) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [t.id for t in targets if isinstance(t, ast.Name)]


def engine_keyed_tables(root: Path, allowed: frozenset[str] = BENCHMARK_CLIENT_FILES,
                        code: frozenset[tuple[str, str]] = ENGINE_KEYED_CODE) -> list[str]:
    """`path:line: names` of every module-level dict literal keyed by an engine name under
    `root`, outside the profiles' module, `allowed` and the `code` tables (paths relative to
    the repository)."""
    found = []
    for rel, text in _sources(root, allowed | {PROFILES_FILE}):
        for node in ast.parse(text).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            value = node.value
            if not isinstance(value, ast.Dict) or not any(
                    isinstance(k, ast.Constant) and k.value in ENGINE_NAMES for k in value.keys):
                continue
            names = _assigned_names(node)
            if not all((rel, n) in code for n in names):
                found.append(f"{rel}:{node.lineno}: {', '.join(names)}")
    return found


def test_no_engine_keyed_table_in_capplan() -> None:
    found = engine_keyed_tables(PACKAGE)
    assert not found, ("a table keyed by engine name: state each engine's entry as a field of "
                       "EngineProfile or its PdServing (capplan/models/engine.py) and read it "
                       "through the profile\n" + "\n".join(found))


def test_the_table_allowlists_name_what_exists() -> None:
    assert (ROOT / PROFILES_FILE).is_file()
    for rel, name in ENGINE_KEYED_CODE:
        assert name in (ROOT / rel).read_text(encoding="utf-8"), (rel, name)


def test_the_check_sees_an_engine_keyed_table(tmp_path: Path) -> None:
    pkg = tmp_path / "capplan"
    for sub in ("plan", "models"):
        (pkg / sub).mkdir(parents=True)
    _plant(pkg, 'PORTS = {"vllm": 8000, "sglang": 30000}\n'
                'NAMES: dict[str, str] = {"trtllm": "context"}\n'
                'OTHER = {"prefill": 8100}\n'
                'def f(engine):\n    return {"vllm": 1}.get(engine)\n'
                'ROLES = {"x": 1, "sglang": 2}\n',
           'CLIENT = {"vllm": "vllm bench"}\n')
    (pkg / "models" / "engine.py").write_text('VERSIONS = {"vllm": ()}\n', encoding="utf-8")
    assert engine_keyed_tables(pkg) == ["capplan/plan/bad.py:1: PORTS",
                                        "capplan/plan/bad.py:2: NAMES",
                                        "capplan/plan/bad.py:6: ROLES"]
