"""The layouts a source's log files come in, and which files of a folder are its input.

A source's records arrive as files of one format: ``csv`` (a header row, then a record a
line: the default), ``json`` (JSON lines: an object a line, what CDNs' log products and log
shippers write) or ``parquet``. CSV and JSON lines files may be gzip-compressed (a ``.gz``
suffix); Parquet compresses inside. A file is an input of a source by its name's suffix, so
a folder may hold other files; hidden ones (``.`` or ``_`` first) are being written.
"""

from __future__ import annotations

import gzip
import os
import urllib.parse
import zlib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from jetstream.errors import PlanError
from jetstream.schema import Schema

__all__ = ["DEFAULT_FORMAT", "FORMATS", "PARQUET_TYPES", "InputMeter", "check_format",
           "compressed", "file_name", "in_landing_order", "input_files", "is_input",
           "landing_key", "read_parquet", "unreadable"]

#: Each format and the suffixes of its files.
FORMATS: dict[str, tuple[str, ...]] = {
    "csv": (".csv", ".csv.gz"),
    "json": (".json", ".jsonl", ".ndjson", ".json.gz", ".jsonl.gz", ".ndjson.gz"),
    "parquet": (".parquet",),
}
DEFAULT_FORMAT = "csv"
#: The Parquet types a column of each of our types may hold, as pyarrow names them.
PARQUET_TYPES: dict[str, tuple[str, ...]] = {
    "int": ("int64",), "float": ("double",), "string": ("string", "large_string"),
    "bool": ("bool",)}


def check_format(value: object, where: str) -> str:
    """``value`` if it names a format, else a PlanError that says ``where`` and the choices."""
    if not isinstance(value, str) or value not in FORMATS:
        msg = (f"{where}: format must be one of {', '.join(FORMATS)}, not {value!r}")
        raise PlanError(msg)
    return value


def is_input(name: str, format: str = DEFAULT_FORMAT) -> bool:
    """Whether a file of this name is an input of a source of ``format``."""
    return not name.startswith((".", "_")) and name.endswith(FORMATS[format])


def compressed(name: str) -> bool:
    """Whether a file of this name is gzip-compressed."""
    return name.endswith(".gz")


def unreadable(path: Path, schema: Schema) -> str | None:
    """Why the file at ``path`` cannot be read whole as records of ``schema`` -- a corrupt or
    cut-off gzip stream, a Parquet file that does not decode, or one whose column holds
    another type than its schema's (:data:`PARQUET_TYPES`) -- or None: its records can be
    read, each checked on its own (a Parquet file may lack a column: its records then lack
    that field). A reader sets such a file aside whole rather than read the records before
    the fault, so a site and the reference executor read the same records whatever the
    fault."""
    try:
        if path.name.endswith(FORMATS["parquet"]):
            return _parquet_unfit(read_parquet(path), schema)
        if compressed(path.name):
            with gzip.open(path) as stream:
                while stream.read(1 << 20):
                    pass
    except (OSError, EOFError, zlib.error, ValueError) as e:  # pyarrow's are OSError or these
        return f"{type(e).__name__}: {e}"
    return None


def read_parquet(path: Path) -> Any:
    """A Parquet file's table, decoded whole (``pyarrow.Table``)."""
    import pyarrow.parquet as pq  # only where Parquet is read

    return pq.read_table(path)


def _parquet_unfit(table: Any, schema: Schema) -> str | None:
    for f in schema:
        if f.name in table.column_names:
            held = str(table.schema.field(f.name).type)
            if held not in PARQUET_TYPES.get(f.dtype.value, ()):
                return (f"column {f.name} holds {held}, not {f.dtype.value} "
                        f"({' or '.join(PARQUET_TYPES[f.dtype.value])})")
    return None


def input_files(path: str | os.PathLike[str], format: str = DEFAULT_FORMAT) -> list[Path]:
    """The input files at ``path``: the file itself, or every file of ``format`` below a
    directory, in name order."""
    p = Path(path)
    if p.is_dir():
        return sorted(q for q in p.rglob("*") if is_input(q.name, format) and q.is_file())
    if p.is_file():
        return [p]
    msg = f"no such file or directory: {p}"
    raise FileNotFoundError(msg)


def landing_key(mtime_ms: int, name: str) -> tuple[int, str]:
    """Where a file stands in its folder's landing order: its modification time (epoch ms,
    when a shipper renamed it into place), then its name. The lateness rule
    (``docs/dsl.md``, "Late records") judges each file against the files before it in this
    order, in the reference executor and at a site alike; a site's gate lets files in in
    this order, and stamps a file that lands behind one it let in already
    (:mod:`jetstream.stage.gate`)."""
    return (mtime_ms, name)


def in_landing_order(paths: Iterable[Path]) -> list[Path]:
    """``paths`` (files of one folder) in landing order (:func:`landing_key`)."""
    return sorted(paths, key=lambda p: landing_key(p.stat().st_mtime_ns // 1_000_000, p.name))


def file_name(path: str) -> str:
    """A file's name from Spark's ``file:`` URI of it (or from a plain path)."""
    return PurePosixPath(urllib.parse.unquote(urllib.parse.urlparse(path).path)).name


class InputMeter:
    """The bytes of raw logs (files of any format) that have landed in a site's input folder
    since it started.

    Shippers drop whole files (written elsewhere, then renamed), so a file's size is read
    once; a file removed later still counts: it was raw input all the same."""

    def __init__(self, folder: Path | None) -> None:
        self._folder = folder
        self._sizes: dict[str, int] = {}

    def __call__(self) -> int:
        if self._folder is None:
            return 0
        try:
            with os.scandir(self._folder) as entries:
                for entry in entries:
                    if entry.name not in self._sizes and any(
                            is_input(entry.name, format) for format in FORMATS):
                        self._sizes[entry.name] = entry.stat().st_size
        except OSError:  # not there yet, or a file renamed away while we looked
            pass
        return sum(self._sizes.values())
