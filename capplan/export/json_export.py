"""JSON export: the whole plan result as it is (SI units, snake_case keys); inf and nan -> null."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from capplan.errors import InputError
from capplan.export.atomic import atomic_write_text


def jsonable(obj: Any) -> Any:
    """A copy of obj that json.dumps accepts with allow_nan=False (inf/nan -> None).

    The one conversion of results to JSON-able values: `--format json`, the JSON export and
    every cell of the CSV, Markdown and XLSX exports go through it.
    """
    if getattr(obj, "ndim", 0) and hasattr(obj, "tolist"):  # numpy arrays
        return jsonable(obj.tolist())
    if hasattr(obj, "item") and not isinstance(obj, str | bytes):  # numpy scalars
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, str | int | bool):
        return obj
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):  # numpy arrays
        return jsonable(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    raise InputError(f"cannot write a {type(obj).__name__} value to JSON: {obj!r}")


def plan_to_json(plan: dict[str, Any]) -> str:
    """The plan as indented JSON text, ending in a newline."""
    if not isinstance(plan, dict):
        raise InputError(f"a plan result must be a dict, got {type(plan).__name__}")
    return json.dumps(jsonable(plan), indent=2, allow_nan=False) + "\n"


def write_json(plan: dict[str, Any], path: str | Path) -> Path:
    """Write the whole plan as JSON, atomically."""
    path = Path(path)
    atomic_write_text(path, plan_to_json(plan))
    return path
