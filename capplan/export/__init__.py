"""Writers for plan results: CSV, JSON, Markdown and XLSX (chosen by suffix), and charts.

Exporters consume the plan dict that `capplan plan --format json` prints (a PlanResult is
turned into it first) and never recompute anything. Every file goes through
`atomic.atomic_write`, so a failed export leaves any existing file untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capplan.errors import InputError

EXPORT_SUFFIXES = (".csv", ".json", ".md", ".xlsx", ".k8s.yaml", ".llm-d.yaml", ".html")


def export_kind(path: str | Path) -> str | None:
    """The export suffix a file name ends with (case-insensitive), else None."""
    name = Path(path).name.lower()
    return next((s for s in sorted(EXPORT_SUFFIXES, key=len, reverse=True)
                 if name.endswith(s)), None)


def export_plan(plan: Any, path: str | Path) -> Path:
    """Write plan to path in the format its suffix names (.csv, .json, .md, .xlsx, .k8s.yaml
    Kubernetes manifests, .llm-d.yaml llm-d Helm values, .html a self-contained report).

    plan: a PlanResult (`capplan.plan.planner.run_plan`) or the dict its `to_dict()` gives
    (what `capplan plan --format json` prints).

    Raises:
        InputError: for any other suffix, a plan without recommendations, or a missing extra.
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
        from capplan.export.csv_export import write_csv as writer
    elif suffix == ".json":
        from capplan.export.json_export import write_json as writer
    elif suffix == ".md":
        from capplan.export.markdown import write_markdown as writer
    elif suffix == ".k8s.yaml":
        from capplan.export.k8s import write_k8s as writer
    elif suffix == ".llm-d.yaml":
        from capplan.export.llmd import write_llmd as writer
    elif suffix == ".html":
        from capplan.export.html import write_html as writer
    else:
        from capplan.export.xlsx import write_xlsx as writer
    return writer(plan, path)


def check_exports(plan: Any, paths: list[Path]) -> None:
    """Refuse (InputError, one line) the first of `paths` whose export would refuse the plan,
    before any file is written: Kubernetes manifests or llm-d values the plan cannot be
    deployed as (llm-d values of a plan sized for SGLang, TensorRT-LLM across hosts), a
    malformed CAPPLAN_RDMA_RESOURCE. `export_plan` refuses what else it would."""
    if hasattr(plan, "to_dict"):
        plan = plan.to_dict()
    from capplan.export.csv_export import recommendations_of

    recommendations_of(plan)
    for path in paths:
        suffix = export_kind(path)
        if suffix == ".k8s.yaml":
            from capplan.export.k8s import Site, k8s_objects

            k8s_objects(plan, rdma_resource=Site.from_env().rdma_resource)
        elif suffix == ".llm-d.yaml":
            from capplan.export.k8s import Site
            from capplan.export.llmd import llmd_values

            llmd_values(plan, Site.from_env())


__all__ = ["EXPORT_SUFFIXES", "check_exports", "export_kind", "export_plan"]
