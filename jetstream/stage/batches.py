"""How a site's micro-batches meet Spark: its files read as records of their format
(:class:`Layout`), every column as text with the bad line and where and when each record's
file landed (:func:`read_stream` for a folder's stream, :func:`read_files` for files read
again); and around each batch, a stop
that interrupts its job ending the stream quietly, Python's cyclic collector paused, and
adaptive execution off, as Spark has it for a stream's own batches.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from jetstream.formats import FORMATS, input_files, unreadable
from jetstream.schema import Schema
from jetstream.stage.compile import spark_type

__all__ = ["ARRIVED_COLUMN", "CORRUPT_COLUMN", "FILE_COLUMN", "REASONS", "Layout",
           "batch_counters", "batch_files", "gc_paused", "logged_files", "not_adaptive",
           "read_files", "read_stream", "readable", "stopped_quietly"]

log = logging.getLogger(__name__)

#: Why a record is malformed, as a stage counts them (a record's ``_reason`` starts so).
REASONS = ("wrong field count", "malformed record", "missing field", "ill-typed field")
#: The column of a line that does not parse as a record (Spark's corrupt record).
CORRUPT_COLUMN = "_jetstream_corrupt"
ARRIVED_COLUMN = "_jetstream_arrived"  # epoch ms the record's file landed in the folder
#: The column of a record's file (``_metadata.file_path``).
FILE_COLUMN = "_jetstream_file"


@dataclass(frozen=True)
class Layout:
    """How a source's files are read: their format (:mod:`jetstream.formats`) and the
    source's schema. Every column comes as text (a JSON number as written, a Parquet value
    cast to it), with the bad line in :data:`CORRUPT_COLUMN`; the stage parses the text as
    the reference reader does. A ``.gz`` file is decompressed by Spark's codec for its
    suffix."""

    format: str
    schema: Schema

    @property
    def text_schema(self) -> StructType:
        return StructType([StructField(c, StringType()) for c in self.schema.names]
                          + [StructField(CORRUPT_COLUMN, StringType())])

    def unreadable(self, path: Path) -> str | None:
        """Why a file of this layout cannot be read whole, or None."""
        return unreadable(path, self.schema)

    def load(self, reader: Any, where: str | list[str]) -> DataFrame:
        """The records at ``where``, by ``reader`` (a stream's or a batch's)."""
        suffixes = ",".join(FORMATS[self.format])  # its files only, as the reference reads
        reader = reader.option("pathGlobFilter", f"*{{{suffixes}}}")
        if self.format == "parquet":  # typed in the file: checked first, then cast to text
            typed = StructType([StructField(f.name, spark_type(f.dtype)) for f in self.schema])
            records = _arrived(reader.schema(typed).format("parquet").load(where))
            return records.select(*(F.col(c).cast("string").alias(c) for c in self.schema.names),
                                  F.lit(None).cast("string").alias(CORRUPT_COLUMN),
                                  ARRIVED_COLUMN, FILE_COLUMN)
        reader = (reader.schema(self.text_schema).option("mode", "PERMISSIVE")
                  .option("columnNameOfCorruptRecord", CORRUPT_COLUMN))
        if self.format == "csv":
            reader = reader.option("header", True)
        return _arrived(reader.format(self.format).load(where))


def read_stream(spark: SparkSession, folder: str | Path, layout: Layout) -> DataFrame:
    """A folder's records as a stream: every column as text, the bad line, and when the
    record's file landed."""
    return layout.load(spark.readStream, str(folder))


def readable(folder: Path, layout: Layout, scratch: Path) -> tuple[Path, dict[Path, str]]:
    """The folder to read ``folder``'s files of ``layout`` from, and those that cannot be
    read whole, with why (:func:`jetstream.formats.unreadable`): ``folder`` itself when every
    file can be, else ``scratch`` (emptied first) holding links to the others."""
    files = [p for p in input_files(folder, layout.format) if p.parent == folder]
    bad = {path: reason for path in files if (reason := layout.unreadable(path)) is not None}
    if not bad:
        return folder, bad
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for path in files:
        if path not in bad:
            try:
                os.link(path, scratch / path.name)
            except OSError:  # another file system
                shutil.copy2(path, scratch / path.name)
    return scratch, bad


def read_files(spark: SparkSession, paths: Sequence[str], layout: Layout) -> DataFrame:
    """Some files' records, as :func:`read_stream` has them in a micro-batch."""
    return layout.load(spark.read, list(paths))


def logged_files(checkpoint: Path, wanted: Callable[[str], bool]) -> list[tuple[str, int]]:
    """The files in the file source log of a stream's ``checkpoint`` (``sources/0``: a
    version line, then a JSON object a file, ``path`` and ``batchId``) whose line is
    ``wanted`` (a cheap test before the JSON is read), with the micro-batch that read each,
    each once: a compaction (``<n>.compact``) repeats every entry before it, and the files
    it replaces stay a while."""
    out: dict[tuple[str, int], None] = {}
    for part in (checkpoint / "sources" / "0").glob("[0-9]*"):
        for line in part.read_text().splitlines()[1:]:
            if not wanted(line):
                continue
            try:
                entry = json.loads(line)
                out[str(entry["path"]), int(entry["batchId"])] = None
            except (ValueError, KeyError, TypeError):
                log.warning("%s: an entry of Spark's file source log is not as expected: "
                            "%.200s", part, line)
    return list(out)


def batch_files(checkpoint: Path, batch_id: int) -> list[str]:
    """The files micro-batch ``batch_id`` of the stream of ``checkpoint`` read, as Spark's
    file source logged them."""
    tag = f'"batchId":{batch_id}'
    return sorted(path for path, batch in logged_files(checkpoint, lambda line: tag in line)
                  if batch == batch_id)


def _arrived(records: DataFrame) -> DataFrame:
    # A record's file's modification time is when the site received it (shippers
    # write elsewhere, then rename into the folder).
    return records.withColumns({
        ARRIVED_COLUMN: F.unix_millis(F.col("_metadata.file_modification_time")),
        FILE_COLUMN: F.col("_metadata.file_path")})


def batch_counters(once: Column) -> list[Column]:
    """What ``observe`` collects of a batch's rows, ``once`` true in one row a record: the
    records read (kept or not), the largest event time, when the record it stands on
    landed, the files, the malformed records by reason."""
    valid = F.col("_reason").isNull()
    return [F.count(F.when(valid & once, True)).alias("records"),
            F.max(F.when(valid, F.col("_event"))).alias("latest"),
            # When the record the watermark stands on landed (the gate may have held the
            # batch's first file a while): the close of what the batch closes.
            F.max_by(ARRIVED_COLUMN, F.when(valid, F.col("_event"))).alias("arrived"),
            F.collect_set(FILE_COLUMN).alias("files"),
            *(F.count(F.when(F.col("_reason").startswith(reason), True)).alias(reason)
              for reason in REASONS)]


class _Stoppable(Protocol):
    @property
    def stopping(self) -> bool: ...


class _Interrupted(Exception):
    """A micro-batch's Spark job interrupted by the stream's stop (see ``stopped_quietly``)."""


class _NotTheInterruption(logging.Filter):
    """py4j logs every error a Python callback raises, with its traceback; a stop's
    interruption of a micro-batch is not an error (the stream says what is one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _Interrupted))


logging.getLogger("py4j.clientserver").addFilter(_NotTheInterruption())


@contextlib.contextmanager
def stopped_quietly(stage: _Stoppable) -> Iterator[None]:
    """Let a stop that interrupts the batch's Spark job end the stream quietly.

    Spark tells a stop's interruption of a ``foreachBatch`` function from a failure by
    matching the Python error's text against ``Py4JJavaError: An error occurred while
    calling((.|\\r\\n|\\r|\\n)*)(java.lang.InterruptedException|...)`` (``StreamExecution.
    PROXY_ERROR``): a regex that recurses once per character, so on the error's usual text (the
    Java stack trace, several kB) it overflows the stream thread's stack, and the stop ends
    in a StackOverflowError and stack traces in the site's log. Raised again with only its
    first line, the interruption matches in a few frames and the stream stops as asked.
    """
    try:
        yield
    except Exception as e:
        text = str(e)
        if not (stage.stopping and "Py4JJavaError" in type(e).__name__ + text
                and "java.lang.InterruptedException" in text):
            raise
        first = text.strip().splitlines()[0]
        raise _Interrupted(f"py4j.protocol.Py4JJavaError: {first}\n"
                           ": java.lang.InterruptedException") from None


_gc_lock = threading.Lock()
_gc_pausers = 0  # the batches under way that paused Python's cyclic garbage collector


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a batch's rows are read and merged.

    Tens of thousands of new objects a batch (a row, a list per accumulator) would start
    several collections over every object the process holds; what a batch makes is short-lived
    and free of cycles, so it is freed as it goes anyway. The merge of 37,439 rows took 160 ms
    (median) with the collector, 95 ms without it.
    Stages of several queries share the process: the last batch under way to end turns the
    collector back on, and the collections put off run with the next allocations.
    """
    global _gc_pausers
    with _gc_lock:
        if _gc_pausers == 0 and not gc.isenabled():  # someone else's pause: not ours to end
            paused = False
        else:
            paused = True
            _gc_pausers += 1
            gc.disable()
    try:
        yield
    finally:
        if paused:
            with _gc_lock:
                _gc_pausers -= 1
                if _gc_pausers == 0:
                    gc.enable()


@contextlib.contextmanager
def not_adaptive(spark: SparkSession) -> Iterator[None]:
    """Adaptive execution off while a batch runs, as Spark has it for every micro-batch of a
    stream (the stream's own session); a batch given directly gets the same. (Adaptive
    execution replans a batch that comes out empty and drops what ``observe`` collected.)"""
    key = "spark.sql.adaptive.enabled"
    before = spark.conf.get(key) or "true"
    if before == "false":
        yield
        return
    spark.conf.set(key, "false")
    try:
        yield
    finally:
        spark.conf.set(key, before)
