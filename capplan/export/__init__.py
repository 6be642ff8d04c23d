"""Writers for plan results: CSV, JSON, Markdown and XLSX (chosen by suffix), and charts.

Exporters consume the plan dict that `capplan plan --format json` prints (a PlanResult is
turned into it first) and never recompute anything. Every export is rendered first (a refusal,
such as Kubernetes manifests of a TensorRT-LLM replica over hosts, comes before any file is
touched), then written through `atomic.atomic_write_all`: several exports are written all or
none, and a failed export leaves any existing file untouched.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capplan.errors import InputError

EXPORT_SUFFIXES = (".csv", ".json", ".md", ".xlsx", ".k8s.yaml", ".llm-d.yaml", ".html")


def export_kind(path: str | Path) -> str | None:
    """The export suffix a file name ends with (case-insensitive), else None."""
    name = Path(path).name.lower()
    return next((s for s in sorted(EXPORT_SUFFIXES, key=len, reverse=True)
                 if name.endswith(s)), None)


def export_files(plan: Any, path: str | Path, run: Any = None) -> list[Any]:
    """The files an export to `path` writes, rendered and not yet written: (path, write)
    pairs for `atomic.atomic_write_all` (a day plan's `.csv` adds its `.schedule.csv`).

    plan: a PlanResult (`capplan.plan.planner.run_plan`) or the dict its `to_dict()` gives
    (what `capplan plan --format json` prints). run: the `html.Run` that made it (the report's
    deploy and verify lines name its command and exports), or None.

    Raises:
        InputError: for any other suffix, a plan without recommendations, a missing extra, or
            a plan the format cannot hold.
    """
    from capplan.export.csv_export import recommendations_of

    if hasattr(plan, "to_dict"):  # the typed result: its dict is the export edge
        plan = plan.to_dict()
    path = Path(path)
    suffix = export_kind(path)
    if suffix is None:
        raise InputError(f"cannot export to {path}: unknown suffix {path.suffix or '(none)'!r}; "
                         f"use one of {', '.join(EXPORT_SUFFIXES)}")
    recommendations_of(plan)  # one shape check for every format, before any file is touched
    if suffix == ".csv":
        from capplan.export.csv_export import csv_files

        return csv_files(plan, path, run)
    if suffix == ".xlsx":
        from capplan.export.xlsx import xlsx_files

        return xlsx_files(plan, path, run)
    from capplan.export.atomic import text_file

    return [text_file(path, _text(plan, suffix, run))]


def _text(plan: dict[str, Any], suffix: str, run: Any) -> str:
    """The content of a text export."""
    if suffix == ".json":
        from capplan.export.json_export import plan_to_json

        return plan_to_json(plan)
    if suffix == ".md":
        from capplan.export.markdown import plan_to_markdown

        return plan_to_markdown(plan, run)
    if suffix == ".k8s.yaml":
        from capplan.export.k8s import k8s_text

        return k8s_text(plan)
    if suffix == ".llm-d.yaml":
        from capplan.export.llmd import llmd_text

        return llmd_text(plan)
    from capplan.export.html import render_html

    return render_html(plan, run)


def export_plan(plan: Any, path: str | Path) -> Path:
    """Write plan to path in the format its suffix names (.csv, .json, .md, .xlsx, .k8s.yaml
    Kubernetes manifests, .llm-d.yaml llm-d Helm values, .html a self-contained report), with
    its companion files (`export_files`), atomically.

    Raises:
        InputError: as `export_files`, or when a file cannot be written.
    """
    from capplan.export.atomic import atomic_write_all

    atomic_write_all(export_files(plan, path))
    return Path(path)


def _file_key(path: Path) -> str:
    """One spelling per file: its folder resolved (symbolic links followed), its own name."""
    folder = path.parent if str(path.parent) else Path(".")
    return os.path.normcase(str(folder.resolve() / path.name))


def companions(path: Path, day: bool) -> list[Path]:
    """The files an export writes beside `path`: a day plan's CSV its schedule."""
    if day and export_kind(path) == ".csv":
        from capplan.export.day_export import schedule_csv_path

        return [schedule_csv_path(path)]
    return []


def check_exports(paths: Sequence[Path], *, day: bool = False,
                  models: Sequence[str] = (), engines: Sequence[str] = ()) -> list[Path]:
    """The exports to write, each file once (a path given twice, however spelled, is written
    once), checked before the plan runs: the format is known, the name has a stem, the folder
    exists and takes a file, every target (companions too) is absent or a regular file, and
    what the plan's shape refuses is refused now (`day`: a day plan; `models`: the models of
    a plan of several; `engines`: the engines it is sized for).

    Raises:
        InputError: naming the export and what is wrong with it.
    """
    out: list[Path] = []
    seen: set[str] = set()
    for path in map(Path, paths):
        if _file_key(path) in seen:
            continue
        seen.add(_file_key(path))
        _check_name(path, day, models, engines)
        out.append(path)
    from capplan.export.atomic import check_writable

    for path in out:
        for target in (path, *companions(path, day)):
            check_writable(target)
    return out


def _check_name(path: Path, day: bool, models: Sequence[str], engines: Sequence[str]) -> None:
    kind = export_kind(path)
    if kind is None:
        raise InputError(f"--export {path}: use a {', '.join(EXPORT_SUFFIXES[:-1])} or "
                         f"{EXPORT_SUFFIXES[-1]} file")
    if len(path.name) == len(kind):
        raise InputError(f"--export {path}: the file name is only its suffix; give it a name "
                         f"(e.g. {path.with_name('plan' + path.name)})")
    if kind == ".llm-d.yaml":
        from capplan.export.llmd import one_llmd_model, vllm_only

        one_llmd_model(list(models))
        for engine in engines:
            vllm_only(engine)
    if day and kind == ".csv" and path.name.lower().endswith(".schedule.csv"):
        base = path.name[: -len(".schedule.csv")] or "plan"
        raise InputError(f"--export {path}: a day plan's NAME.csv export writes its schedule "
                         f"to NAME.schedule.csv; name the export {base}.csv (its schedule goes "
                         f"to {base}.schedule.csv) or another name")


__all__ = ["EXPORT_SUFFIXES", "check_exports", "companions", "export_files", "export_kind",
           "export_plan"]
