"""Rendering only: tables (tabulate), CSV, Markdown and JSON. No arithmetic on results here
beyond unit conversion for display."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click
from tabulate import tabulate

FORMATS = ("table", "json", "csv", "markdown")


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    """Human header with its unit, e.g. 'KV cache (GiB)'."""
    to_display: Callable[[Any], Any] | None = None
    fmt: str = "g"


def _cell(col: Column, row: dict[str, Any]) -> Any:
    val = row.get(col.key)
    if val is None:
        return ""
    return col.to_display(val) if col.to_display else val


def render_rows(rows: Sequence[dict[str, Any]], columns: Sequence[Column], fmt: str) -> str:
    """Rows as a table, CSV or Markdown (human units from the columns)."""
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([c.header for c in columns])
        for r in rows:
            w.writerow([_cell(c, r) for c in columns])
        return buf.getvalue().rstrip("\n")
    table = [[_cell(c, r) for c in columns] for r in rows]
    floatfmt = tuple(c.fmt for c in columns)
    tablefmt = "github" if fmt == "markdown" else "simple"
    return tabulate(table, headers=[c.header for c in columns], floatfmt=floatfmt,
                    tablefmt=tablefmt, disable_numparse=False)


def to_json(obj: Any) -> str:
    """JSON text of a result (inf/nan -> null, numpy -> Python), as every command prints it."""
    from capplan.export.json_export import jsonable

    return json.dumps(jsonable(obj), indent=2, sort_keys=False)


def emit(text: str) -> None:
    click.echo(text)


def kv_table(pairs: Sequence[tuple[str, Any]], fmt: str) -> str:
    """A two-column 'quantity | value' table for single results."""
    rows = [{"q": k, "v": v} for k, v in pairs]
    return render_rows(rows, [Column("q", "quantity"), Column("v", "value")], fmt)
