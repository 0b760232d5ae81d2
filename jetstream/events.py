"""Reading input records: log files of a source's format (:mod:`jetstream.formats`) or
Python dicts, checked against a schema.

A record that does not fit the schema is never a crash and never silently dropped: it is
counted by reason and kept (up to a limit) in :class:`Rejects` for the user to inspect. A
file that cannot be read whole (a corrupt gzip stream, say) is counted and set aside whole,
none of its records read: the Spark stage reads the same files so (see
:mod:`jetstream.stage.batches`). A JSON value is read as its text -- a string's content, a
number as written -- and parsed as a CSV cell is, so both formats read a value alike.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jetstream.formats import (
    DEFAULT_FORMAT,
    compressed,
    in_landing_order,
    input_files,
    read_parquet,
    unreadable,
)
from jetstream.schema import DataType, Schema

__all__ = ["Arrival", "Rejected", "Rejects", "read_streams"]

#: How many rejected records to keep for inspection; the counts are always complete.
KEEP_REJECTED = 1000

EventInput = Iterable[Mapping[str, Any]] | str | os.PathLike[str]
#: A record and the unit of input it came in (a file's number in its folder's landing order;
#: each record given as a dict is a unit of its own): lateness is judged unit by unit.
Arrival = tuple[int, dict[str, Any]]


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


def read_streams(events: EventInput, schema: Schema, rejects: Rejects,
                 format: str = DEFAULT_FORMAT) -> list[Iterator[Arrival]]:
    """The concurrent streams in ``events``, each an iterator of the records that fit
    ``schema``, with the unit of input each came in (:data:`Arrival`).

    A directory holds one stream per folder of files of ``format`` (``DIR/<site>/*.csv``: one
    per site), the files of a folder read in landing order (modification time, then name:
    :func:`jetstream.formats.landing_key`), a file a unit; an iterable of dicts is one
    stream, a record a unit. Records that do not fit go to ``rejects``.
    """
    if not isinstance(events, str | os.PathLike):
        return [enumerate(_check_records(events, schema, rejects))]
    folders: dict[Path, list[Path]] = {}
    for path in input_files(events, format):
        folders.setdefault(path.parent, []).append(path)
    return [_read_files(in_landing_order(paths), schema, rejects, format)
            for _, paths in sorted(folders.items())]


def _read_files(paths: list[Path], schema: Schema, rejects: Rejects,
                format: str) -> Iterator[Arrival]:
    for unit, path in enumerate(paths):
        for record in _read_file(path, schema, rejects, format):
            yield unit, record


def _read_file(path: Path, schema: Schema, rejects: Rejects,
               format: str) -> Iterator[dict[str, Any]]:
    if format == "parquet":
        reason = unreadable(path, schema)
        if reason is not None:
            rejects.add(str(path), f"unreadable file: {reason}", None)
            return
        rows = read_parquet(path).to_pylist()
        yield from _check_records(rows, schema, rejects, f"{path}:")
        return
    text = _text(path, rejects)
    if text is not None:
        read = _read_json if format == "json" else _read_csv
        yield from read(path, text, schema, rejects)


def _text(path: Path, rejects: Rejects) -> str | None:
    """A file's whole text, or None (counted, set aside) if it cannot be read whole."""
    try:
        data = path.read_bytes()
        if compressed(path.name):
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        rejects.add(str(path), f"unreadable file: {e}", None)
        return None


def _check_records(events: Iterable[Mapping[str, Any]], schema: Schema,
                   rejects: Rejects, where: str = "record ") -> Iterator[dict[str, Any]]:
    for i, record in enumerate(events):
        checked = _check_record(record, schema)
        if isinstance(checked, str):
            rejects.add(f"{where}{i}", checked, record)
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


def _read_csv(path: Path, text: str, schema: Schema,
              rejects: Rejects) -> Iterator[dict[str, Any]]:
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
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
    except csv.Error as e:
        rejects.add(str(path), f"unreadable file: {e}", None)


def _read_json(path: Path, text: str, schema: Schema,
               rejects: Rejects) -> Iterator[dict[str, Any]]:
    """JSON lines: an object a line; a blank line is none."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:  # numbers as written: parsed as a CSV cell is, as Spark reads them into text
            record = json.loads(line, parse_int=str, parse_float=str, parse_constant=str)
        except ValueError as e:
            rejects.add(where, f"malformed record: {e}", line)
            continue
        if not isinstance(record, dict):
            rejects.add(where, f"malformed record: a JSON {type(record).__name__}", line)
            continue
        parsed = _parse_json(record, schema)
        if isinstance(parsed, str):
            rejects.add(where, parsed, line)
        else:
            yield parsed


def _parse_json(record: dict[str, Any], schema: Schema) -> dict[str, Any] | str:
    out = {}
    for f in schema:
        value = record.get(f.name)
        if value is None:
            return f"missing field: {f.name}"
        text = ("true" if value else "false") if isinstance(value, bool) else value
        if not isinstance(text, str):  # an object or a list: no column's value
            return f"ill-typed field: {f.name} should be {f.dtype.value}, got {value!r}"
        try:
            out[f.name] = f.dtype.parse(text)
        except ValueError:
            return f"ill-typed field: {f.name} should be {f.dtype.value}, got {text!r}"
    return out


def _parse_cells(cells: list[str], index: Iterable[tuple[Any, int]]) -> dict[str, Any] | str:
    out = {}
    for f, i in index:
        try:
            out[f.name] = f.dtype.parse(cells[i])
        except ValueError:
            return f"ill-typed field: {f.name} should be {f.dtype.value}, got {cells[i]!r}"
    return out
