"""No branch on an engine's name in capplan/: each engine's (and release's) behaviour lives in
its profile (capplan/models/engine.py EngineProfile, docs/engines.md), and the code reads the
profile's fields. The only name comparisons left are on a benchmark client or a benchmark
row's backend, which name benchmark tools and data, not engine behaviour."""

from __future__ import annotations

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
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel in allowed:
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ENGINE_BRANCH.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    return found


def test_no_engine_name_branch_in_capplan() -> None:
    found = engine_branches(PACKAGE)
    assert not found, ("a branch on an engine's name: state the behaviour as a field of "
                       "EngineProfile (capplan/models/engine.py) and read it\n"
                       + "\n".join(found))


def test_the_allowlist_names_files_that_exist() -> None:
    for rel in BENCHMARK_CLIENT_FILES:
        assert (ROOT / rel).is_file(), rel


def test_the_check_sees_a_branch(tmp_path: Path) -> None:
    pkg = tmp_path / "capplan"
    (pkg / "plan").mkdir(parents=True)
    (pkg / "plan" / "bad.py").write_text(
        'if engine == "sglang":\n    pass\n'
        "ok = p.name != 'trtllm'\n"
        'many = engine in ("vllm", "trtllm")\n'
        'fine = PROFILES["vllm"]\n', encoding="utf-8")
    (pkg / "plan" / "bench_cmds.py").write_text('if client == "vllm":\n    pass\n',
                                                encoding="utf-8")
    assert [f.split(":")[1] for f in engine_branches(pkg)] == ["1", "3", "4"]
