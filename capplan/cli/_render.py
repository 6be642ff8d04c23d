"""Rendering only: tables (tabulate), CSV, Markdown and JSON. No arithmetic on results here
beyond unit conversion for display."""

from __future__ import annotations

import csv
import io
import json
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

FORMATS = ("table", "json", "csv", "markdown")


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    """Human header with its unit, e.g. 'KV cache (GiB)'."""
    to_display: Callable[[Any], Any] | None = None
    fmt: str = "g"
    """The number format; "text": cells already formatted (to_display), printed as they are,
    right-aligned."""


def _cell(col: Column, row: dict[str, Any]) -> Any:
    val = row.get(col.key)
    if val is None:
        return ""
    return col.to_display(val) if col.to_display else val


def _one_line(x: Any) -> Any:
    """A wrapped header or cell on one line: breaks after '/' or '-' join, others are spaces."""
    return re.sub(r"([/-])\n", r"\1", x).replace("\n", " ") if isinstance(x, str) else x


def render_rows(rows: Sequence[dict[str, Any]], columns: Sequence[Column], fmt: str) -> str:
    """Rows as a table, CSV or Markdown (human units from the columns).

    Headers and cells may hold line breaks to keep a table within 120 columns; CSV and Markdown
    get them on one line."""
    if fmt != "table":
        columns = [Column(c.key, _one_line(c.header),
                          (lambda v, f=c.to_display: _one_line(f(v))) if c.to_display else None,
                          c.fmt) for c in columns]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([c.header for c in columns])
        for r in rows:
            w.writerow([_cell(c, r) for c in columns])
        return buf.getvalue().rstrip("\n")
    import tabulate as tabulate_module  # a text table only (JSON and CSV answers need none)

    table = [[_cell(c, r) for c in columns] for r in rows]
    floatfmt = tuple("g" if c.fmt == "text" else c.fmt for c in columns)
    text = [i for i, c in enumerate(columns) if c.fmt == "text"]
    align = {"colalign": tuple("right" if c.fmt == "text" else None for c in columns)
             } if text else {}
    tablefmt = "github" if fmt == "markdown" else "simple"
    saved = tabulate_module.MIN_PADDING
    # tabulate widens every column by 2 beyond its header; the 2-space gap between columns
    # already separates them, and tables must fit 120 columns
    tabulate_module.MIN_PADDING = 0 if fmt == "table" else saved
    try:
        return tabulate_module.tabulate(table, headers=[c.header for c in columns],
                                        floatfmt=floatfmt, tablefmt=tablefmt,
                                        disable_numparse=text or False, **align)
    finally:
        tabulate_module.MIN_PADDING = saved


def to_json(obj: Any) -> str:
    """JSON text of a result (inf/nan -> null, numpy -> Python), as every command prints it."""
    from capplan.export.json_export import jsonable

    return json.dumps(jsonable(obj), indent=2, sort_keys=False)


def emit(text: str) -> None:
    click.echo(text)


def kv_table(pairs: Sequence[tuple[str, Any]], fmt: str) -> str:
    """A two-column 'quantity | value' table for single results."""
    # long values (reasons, sources) wrap so that the table fits 120 columns
    rows = [{"q": k, "v": textwrap.fill(v, 72) if fmt == "table" and isinstance(v, str) else v}
            for k, v in pairs]
    return render_rows(rows, [Column("q", "quantity"), Column("v", "value")], fmt)
