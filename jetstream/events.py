"""Reading input records: CDN-log CSV files or Python dicts, checked against a schema.

A record that does not fit the schema is never a crash and never silently dropped: it is
counted by reason and kept (up to a limit) in :class:`Rejects` for the user to inspect.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jetstream.schema import DataType, Schema

__all__ = ["Rejected", "Rejects", "csv_files", "read_streams"]

#: How many rejected records to keep for inspection; the counts are always complete.
KEEP_REJECTED = 1000

EventInput = Iterable[Mapping[str, Any]] | str | os.PathLike[str]


@dataclass(frozen=True)
class Rejected:
    where: str  # "file.csv:17" or "record 3"
    reason: str
    record: Any


@dataclass
class Rejects:
    """Malformed input, counted by reason; the first few records kept with their reasons."""

    counts: Counter[str] = field(default_factory=Counter)
    kept: list[Rejected] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, where: str, reason: str, record: Any) -> None:
        # Count by the kind of problem, not the offending value, so counts stay few.
        self.counts[reason.split(":", 1)[0]] += 1
        if len(self.kept) < KEEP_REJECTED:
            self.kept.append(Rejected(where, reason, record))


def csv_files(path: str | os.PathLike[str]) -> list[Path]:
    """The CSV files at ``path``: the file itself, or every ``*.csv`` below a directory."""
    p = Path(path)
    if p.is_dir():
        return sorted(q for q in p.rglob("*.csv") if q.is_file())
    if p.is_file():
        return [p]
    msg = f"no such file or directory: {p}"
    raise FileNotFoundError(msg)


def read_streams(events: EventInput, schema: Schema,
                 rejects: Rejects) -> list[Iterator[dict[str, Any]]]:
    """The concurrent streams in ``events``, each an iterator of the records that fit ``schema``.

    A directory holds one stream per folder of CSV files (``DIR/<site>/*.csv``: one per site),
    the files of a folder read in name order; an iterable of dicts is one stream. Records that
    do not fit go to ``rejects``.
    """
    if not isinstance(events, str | os.PathLike):
        return [_check_records(events, schema, rejects)]
    folders: dict[Path, list[Path]] = {}
    for path in csv_files(events):
        folders.setdefault(path.parent, []).append(path)
    return [_read_csvs(paths, schema, rejects) for _, paths in sorted(folders.items())]


def _read_csvs(paths: list[Path], schema: Schema, rejects: Rejects) -> Iterator[dict[str, Any]]:
    for path in paths:
        yield from _read_csv(path, schema, rejects)


def _check_records(events: Iterable[Mapping[str, Any]], schema: Schema,
                   rejects: Rejects) -> Iterator[dict[str, Any]]:
    for i, record in enumerate(events):
        checked = _check_record(record, schema)
        if isinstance(checked, str):
            rejects.add(f"record {i}", checked, record)
        else:
            yield checked


def _check_record(record: Any, schema: Schema) -> dict[str, Any] | str:
    """The record restricted to the schema's columns, or the reason it does not fit."""
    if not isinstance(record, Mapping):
        return f"not a record: a {type(record).__name__}"
    out = {}
    for f in schema:
        if f.name not in record or record[f.name] is None:
            return f"missing field: {f.name}"
        value = record[f.name]
        if not f.dtype.accepts(value):
            return f"ill-typed field: {f.name} should be {f.dtype.value}, got {value!r}"
        # A float column holds floats, so that 1 and 1.0 are one value to every aggregate.
        out[f.name] = float(value) if f.dtype is DataType.FLOAT else value
    return out


def _read_csv(path: Path, schema: Schema, rejects: Rejects) -> Iterator[dict[str, Any]]:
    try:
        with path.open(newline="", encoding="utf-8", errors="strict") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                return
            missing = [n for n in schema.names if n not in header]
            if missing:
                rejects.add(str(path), f"bad header: missing {', '.join(missing)}", header)
                return
            index = [(f, header.index(f.name)) for f in schema]
            for cells in reader:
                where = f"{path}:{reader.line_num}"
                if len(cells) != len(header):
                    if cells:  # a blank line is not a record
                        rejects.add(where, f"wrong field count: {len(cells)}, "
                                           f"expected {len(header)}", cells)
                    continue
                parsed = _parse_cells(cells, index)
                if isinstance(parsed, str):
                    rejects.add(where, parsed, cells)
                else:
                    yield parsed
    except (UnicodeDecodeError, csv.Error) as e:
        rejects.add(str(path), f"unreadable file: {e}", None)


def _parse_cells(cells: list[str], index: Iterable[tuple[Any, int]]) -> dict[str, Any] | str:
    out = {}
    for f, i in index:
        try:
            out[f.name] = f.dtype.parse(cells[i])
        except ValueError:
            return f"ill-typed field: {f.name} should be {f.dtype.value}, got {cells[i]!r}"
    return out
