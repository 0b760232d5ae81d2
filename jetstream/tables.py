"""Reference tables: small static CSV files that a query joins its records with (``js.table``).

A table is read once, where the query file runs (on the user's side), and travels inside the
query's plan to the controller and every site, so it must stay small: at most
:data:`MAX_TABLE_ROWS` rows and :data:`MAX_TABLE_BYTES` bytes of CSV. A relative path is
relative to the query file's folder (the working folder when no query file is being read).
"""

from __future__ import annotations

import contextlib
import contextvars
import csv
import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jetstream.errors import PlanError
from jetstream.schema import DataType, Schema

__all__ = ["MAX_TABLE_BYTES", "MAX_TABLE_ROWS", "Table", "relative_to", "table"]

#: The most rows a reference table may have.
MAX_TABLE_ROWS = 100_000
#: The largest CSV file a reference table may come from (the plan carries every row).
MAX_TABLE_BYTES = 2 * 1024 * 1024

_base: contextvars.ContextVar[Path | None] = contextvars.ContextVar("table_base", default=None)


@contextlib.contextmanager
def relative_to(folder: Path) -> Iterator[None]:
    """While the query file in ``folder`` runs, its tables' relative paths start there."""
    token = _base.set(folder)
    try:
        yield
    finally:
        _base.reset(token)


@dataclass(frozen=True, eq=False)
class Table:
    """A named static table: its schema and its rows (dicts; a NULL cell is None)."""

    name: str
    schema: Schema
    rows: tuple[Mapping[str, Any], ...]
    origin: str = "<rows>"
    _indexes: dict[str, dict[Any, Mapping[str, Any]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            msg = f"table: a table needs a non-empty name, not {self.name!r}"
            raise PlanError(msg)
        if len(self.rows) > MAX_TABLE_ROWS:
            msg = (f"table {self.name}: {len(self.rows):,} rows, more than the "
                   f"{MAX_TABLE_ROWS:,} a reference table may have (it travels in the plan)")
            raise PlanError(msg)
        for f in self.schema:
            if f.dtype not in (DataType.STRING, DataType.INT, DataType.FLOAT, DataType.BOOL):
                msg = f"table {self.name}: column {f.name} is {f.dtype.value}; a table holds " \
                      "strings, ints, floats and bools"
                raise PlanError(msg)
        for i, row in enumerate(self.rows):
            if set(row) != set(self.schema.names) or not all(
                    v is None or self.schema.dtype(k).accepts(v) for k, v in row.items()):
                msg = f"table {self.name}: row {i + 1} does not fit the schema {self.schema}"
                raise PlanError(msg)

    def index(self, on: str) -> dict[Any, Mapping[str, Any]]:
        """The rows by their value of ``on`` (one row a value; NULL keys left out)."""
        if on not in self._indexes:
            by_key: dict[Any, Mapping[str, Any]] = {}
            for row in self.rows:
                key = row[on]
                if key is None:
                    continue
                if key in by_key:
                    msg = (f"join {self.name} on {on}: the table has two rows for {key!r}; "
                           "a lookup join needs one row per value of the join column")
                    raise PlanError(msg)
                by_key[key] = row
            self._indexes[on] = by_key
        return self._indexes[on]

    def __str__(self) -> str:
        return f"{self.name} ({len(self.rows):,} rows from {self.origin})"


def table(name: str, path: str | Path, schema: Schema) -> Table:
    """The reference table ``name`` read from the CSV file at ``path`` (a header row naming
    at least the schema's columns; other columns are ignored). An empty cell of a number or
    bool column is NULL. A relative path is relative to the query file's folder."""
    step = f"table {name}"
    if not isinstance(schema, Schema):
        msg = f"{step}: schema must be a js.Schema, e.g. js.Schema.of({{'domain': " \
              "js.DataType.STRING}})"
        raise PlanError(msg)
    p = Path(path)
    if not p.is_absolute():
        p = (_base.get() or Path.cwd()) / p
    try:
        size = p.stat().st_size
        if size > MAX_TABLE_BYTES:
            msg = (f"{step}: {p} has {size:,} bytes, more than the {MAX_TABLE_BYTES:,} a "
                   "reference table may have (it travels in the plan)")
            raise PlanError(msg)
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        msg = f"{step}: cannot read {p}: {e.strerror or e}"
        raise PlanError(msg) from None
    except UnicodeDecodeError as e:
        msg = f"{step}: {p} is not UTF-8 ({e.reason} at byte {e.start})"
        raise PlanError(msg) from None
    return Table(name, schema, tuple(_rows(step, p, text, schema)), str(p))


def _rows(step: str, path: Path, text: str, schema: Schema) -> Iterator[dict[str, Any]]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        msg = f"{step}: {path} is empty; it needs a header row naming its columns"
        raise PlanError(msg)
    where = {name: i for i, name in enumerate(header)}
    if missing := [f.name for f in schema if f.name not in where]:
        msg = (f"{step}: {path} has no column {missing[0]!r} (its header: "
               f"{', '.join(header)})")
        raise PlanError(msg)
    for line, cells in enumerate(reader, start=2):
        if not cells:
            continue
        if len(cells) != len(header):
            msg = f"{step}: {path}:{line}: {len(cells)} fields, the header has {len(header)}"
            raise PlanError(msg)
        row = {}
        for f in schema:
            cell = cells[where[f.name]]
            try:
                row[f.name] = (None if cell == "" and f.dtype is not DataType.STRING
                               else f.dtype.parse(cell))
            except ValueError as e:
                msg = f"{step}: {path}:{line}: column {f.name}: {e}"
                raise PlanError(msg) from None
        yield row
