"""A site's local stage: a Spark Structured Streaming job that turns raw records into partials.

The job reads the site's input folder (files that log shippers drop in atomically, in the
source's format), every column as text, and runs each micro-batch (``foreachBatch``, on the
driver) as one Spark job:

1. parsing against the source schema: a malformed record (wrong field count, a value that is
   not of its column's type, a missing field) is counted by reason — and, in the rare batch
   that has any, written with the reason to the quarantine folder by a second job — never a
   crash, never a silent change;
2. the query's record steps, compiled from the expression IR to Spark columns;
3. event-time windows, assigned exactly as :meth:`WindowSpec.windows_of` does;
4. the partial aggregates per window and group key, each aggregate in its Spark form
   (:mod:`jetstream.stage.forms`), turned into the accumulators of
   :mod:`jetstream.aggregates`; a sum of doubles is exact, as the reference's is;
5. merged into the open windows (:mod:`jetstream.stage.bookkeeping`), which decide what is
   late and hand on every window the watermark has now closed.

The counters the batch needs besides its partials (records read, malformed ones by reason, the
largest event time) ride on the same job (``DataFrame.observe``), and lateness is decided in
Python from the collected rows, so nothing that changes from batch to batch enters the plan:
Spark compiles the same code every batch and finds it in its cache. Steps 1-3 are built once,
on the stream (a ``where`` clears a record's ``_keep`` rather than dropping it, so that it
still counts as read); a batch adds the ``observe`` and the aggregation, two calls into Spark.
(``top_k(col, k)``, the frequent-items sketch, adds a second job of per-item counts.)

With a ``snapshot`` file, a live stage survives the death of its process: after each
micro-batch, once its closed windows are handed on and before Spark commits it, the windows
still open (and those handed on before the watermark closed them), the watermark and the
batch's id go to the file, atomically. A restarted stage loads them; Spark re-runs the
batches it had not committed, and the batches the snapshot already holds are skipped, so
every record counts once. A window handed on again (its batch re-run) is dropped by whoever
has it already; one the snapshot no longer holds is in the site's inbox (the cube store).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from jetstream import trace
from jetstream.aggregates import Count
from jetstream.approx.sketches import TopKItems
from jetstream.dsl import Query
from jetstream.errors import PlanError
from jetstream.formats import DEFAULT_FORMAT
from jetstream.operators import (
    Source,
    Window,
    WindowAggregate,
)
from jetstream.schema import DataType
from jetstream.stage.batches import (
    ARRIVED_COLUMN,
    CORRUPT_COLUMN,
    FILE_COLUMN,
    REASONS,
    Layout,
    batch_counters,
    gc_paused,
    not_adaptive,
    read_stream,
    readable,
    stopped_quietly,
)
from jetstream.stage.bookkeeping import Emit, OpenWindows
from jetstream.stage.check import Chain, check_stage
from jetstream.stage.compile import (
    defined_as,
    parse_text,
    record_steps,
    to_column,
)
from jetstream.stage.forms import Input, form_of, scaled_exponent, summed_parts, window_starts

__all__ = ["DEFAULT_TRIGGER_S", "Emit", "LocalStage", "PlannedBatch", "StageStats"]

log = logging.getLogger(__name__)

#: Micro-batch interval of a live stage: how long a new file can wait before it is read.
DEFAULT_TRIGGER_S = 0.25
# (the stats so far, seconds the micro-batch took): after each micro-batch.
OnBatch = Callable[["StageStats", float], None]
# What the stage carries past the query's own steps: whether the record is kept (valid and
# through every ``where``), why it is malformed, its line, file time and event time.
_INTERNAL = ("_keep", "_reason", CORRUPT_COLUMN, ARRIVED_COLUMN, FILE_COLUMN, "_event")


@dataclass
class StageStats:
    records_in: int = 0
    late_records: int = 0
    malformed: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    #: Records of the windows a stage that joined its source's reader late withholds.
    withheld_records: int = 0
    #: Spark jobs the micro-batches ran (see :meth:`LocalStage.jobs_run`), when counted.
    jobs: int = 0


@dataclass(frozen=True)
class PlannedBatch:
    """A micro-batch's job for one stage, planned (:meth:`LocalStage.plan`), not run."""

    prepared: DataFrame  # the batch's records as the aggregation takes them
    grouped: DataFrame  # a row per window and group key
    observation: Observation  # the batch's counters, once ``grouped`` has run


@dataclass(frozen=True)
class _Compiled:
    """The Spark columns of a stage's plan, built once: every batch runs the same plan."""

    typed: list[Column]  # the text columns parsed, the bad line, and the reason it is bad
    counters: list[Column]  # what ``observe`` collects of prepared rows
    steps: list[Callable[[DataFrame], DataFrame]]  # the query's record steps
    windows: Column  # each record's window starts
    in_window: Column  # whether a start's window holds the record
    inputs: list[Column]  # window, keys, first window, each aggregate's input
    parts: list[dict[str, Column]]  # projections adding float sums' bands, then limbs
    # the group keys: window, the query's keys, bands of float sums, the file, when it landed
    keys: list[str]
    # events, first-window records, each aggregate's Spark form (count() reads the events)
    aggregates: list[Column]
    firsts_at: int  # where the count of records whose first window this is sits in a row
    file_at: int  # where the row's file sits in a row (then when it landed)
    latest_at: int  # where the largest event time of the row's valid records sits
    slices: list[slice]  # where each aggregate's values sit in a collected row
    bands: list[int | None]  # where each aggregate's band sits in a row (None: it has none)
    accumulators: list[Callable[[Any, Sequence[Any], int | None], Any]]


class LocalStage:
    """One query's local stage at one site, over one input folder: the chain of steps from
    the query's source to its partial aggregate (``chain``, one of :func:`check_stage`'s, for
    a query with several). ``emit`` gets each window it hands on, ``emit_early`` (if given)
    each it hands on before its watermark closes it (see :mod:`jetstream.stage.bookkeeping`);
    ``on_batch``, if given, the stats after each micro-batch and its duration."""

    def __init__(self, spark: SparkSession, query: Query, input_dir: str | Path, *,
                 checkpoint_dir: str | Path, quarantine_dir: str | Path, emit: Emit,
                 snapshot: Path | None = None, on_batch: OnBatch | None = None,
                 chain: Chain | None = None, emit_early: Emit | None = None,
                 emit_idle: Emit | None = None) -> None:
        self.name = query.name
        if chain is None:  # the query's one chain, checked as the controller did at submit
            chains = check_stage(query)
            if len(chains) != 1:
                msg = (f"query {query.name}: a site runs a stage per input of its union "
                       f"({len(chains)}); give the stage one of them")
                raise PlanError(msg)
            chain = chains[0]
        source, partial = chain[0], chain[-1]
        assert isinstance(source, Source) and isinstance(partial, WindowAggregate)
        assert source.schema.event_time is not None
        self.source, self.steps, self.partial = source, chain[1:-1], partial
        self.event_time: str = source.schema.event_time
        self.window = next(s for s in self.steps if isinstance(s, Window))
        self.spark, self.on_batch = spark, on_batch
        self.input_dir, self.checkpoint_dir = str(input_dir), str(checkpoint_dir)
        self.quarantine_dir = str(quarantine_dir)
        self.stats = StageStats()
        #: Wall-clock ms when this input received the records that closed the windows being
        #: handed on now (read it in ``emit``): the earliest time a file of the micro-batch
        #: landed — or the stage started, if later — (an upper bound on when the closing
        #: record landed); for windows closed because the input went idle, that moment.
        self.received_ms = 0
        self._started_ms = time.time_ns() // 1_000_000
        self.windows = OpenWindows(query.name, partial, self.window.watermark_ms, emit,
                                   emit_early, self.window.early_after_ms, emit_idle)
        self._stream: StreamingQuery | None = None
        # The watermark each file of the micro-batch under way is judged against.
        self._watermarks: dict[str | None, int | None] = {}
        self._lock = threading.Lock()  # a live stage's micro-batches against flush()
        self._stopping = False
        #: Why the stage failed, when a reader it was attached to detached it for that.
        self.failure: Exception | None = None
        #: (the folder its stream reads, the site's folder), paths ending in "/", when a
        #: reader's gate lets the files in elsewhere (``jetstream.stage.gate``).
        self.read_from: tuple[str, str] | None = None
        self.snapshot = snapshot
        if snapshot is not None and snapshot.exists():
            self.windows.restore(snapshot)
        self._compiled = self._compile()

    # -- running ------------------------------------------------------------------------------
    @property
    def layout(self) -> Layout:
        """How its source's files are read: :meth:`process_batch` takes every source column
        as text, and the bad line."""
        return Layout(self.source.format or DEFAULT_FORMAT, self.source.schema)

    def _reader(self) -> DataFrame:
        """The folder's records, as a stream."""
        return read_stream(self.spark, self.input_dir, self.layout)

    def run_available(self) -> StageStats:
        """Process every file in the folder now, then close every window (finite input). A
        file that cannot be read whole is set aside (:meth:`set_aside`), none of it read:
        the stream then reads links to the others (the user's folder is left as it is)."""
        self._started_ms = time.time_ns() // 1_000_000
        given = Path(self.input_dir)
        folder, bad = readable(given, self.layout,
                               Path(self.checkpoint_dir).parent / "readable")
        for path, reason in bad.items():
            self.set_aside(str(path), reason)
        if folder != given:
            self.read_from = (f"{folder.resolve()}/", f"{given.resolve()}/")
        reader = read_stream(self.spark, folder, self.layout)
        self._stream = (self.prepare(reader).writeStream.foreachBatch(self._batch)
                        .option("checkpointLocation", self.checkpoint_dir)
                        .trigger(availableNow=True).start())
        self._stream.awaitTermination()
        self.stats.jobs = self.jobs_run()
        self.flush()
        return self.stats

    def set_aside(self, file: str, reason: str) -> None:
        """A file of its input that cannot be read whole, none of it read: counted, and
        noted in the quarantine folder."""
        self.stats.malformed["unreadable file"] += 1
        Path(self.quarantine_dir).mkdir(parents=True, exist_ok=True)
        with (Path(self.quarantine_dir) / "unreadable.jsonl").open("a") as out:
            out.write(json.dumps({"reason": f"unreadable file: {reason}", "file": file}) + "\n")
        log.warning("%s: %s set aside, unreadable: %s", self.name, file, reason)

    def start(self, trigger_s: float = DEFAULT_TRIGGER_S) -> StreamingQuery:
        """Run live: a micro-batch every ``trigger_s`` seconds over the files that arrived."""
        self._started_ms = time.time_ns() // 1_000_000
        self._stream = (self.prepare(self._reader()).writeStream.foreachBatch(self._batch)
                        .option("checkpointLocation", self.checkpoint_dir)
                        .trigger(processingTime=f"{int(trigger_s * 1000)} milliseconds")
                        .start())
        return self._stream

    def stop(self) -> None:
        """Stop the stream between micro-batches: one under way ends first (stopping the
        stream interrupts its Spark job, and the batch would run again after a restart)."""
        with self._lock:
            self._stopping = True
        if self._stream is not None and self._stream.isActive:
            self._stream.stop()

    def jobs_run(self) -> int:
        """The Spark jobs this stage's stream has run (Spark names them by the stream's run),
        as far as Spark still keeps their status."""
        if self._stream is None:
            return 0
        tracker = self.spark.sparkContext.statusTracker()
        return len(tracker.getJobIdsForGroup(str(self._stream.runId)))

    @property
    def watermark(self) -> int | None:
        """Every window ending at or before this has been handed on (None: nothing read)."""
        return self.windows.watermark

    def flush(self, idle: bool = False) -> None:
        """The input has ended (every open window is final) or gone ``idle`` (every open
        window is handed on provisional: records for it may come yet). The snapshot says so: a
        stage started again on it hands a flushed window on again only with the records that
        came after, under the next revision (the one handed on is kept)."""
        with self._lock:
            self.received_ms = time.time_ns() // 1_000_000
            self.windows.close(None, idle=idle)
            if self.snapshot is not None and self.windows.done >= 0:
                self.windows.save(self.snapshot, self.windows.done)

    # -- one micro-batch ----------------------------------------------------------------------
    def process_batch(self, raw: DataFrame, batch_id: int) -> None:
        """Run one micro-batch of raw records (every column as text, see ``layout``)."""
        self._batch(self.prepare(raw), batch_id)

    def _batch(self, prepared: DataFrame, batch_id: int) -> None:
        with self._lock:
            if self.has(batch_id):
                return
            started = time.monotonic()
            with not_adaptive(prepared.sparkSession), stopped_quietly(self), gc_paused():
                self._process(prepared, batch_id)
            self.batch_done(time.monotonic() - started)

    def has(self, batch_id: int) -> bool:
        """Whether the snapshot holds the micro-batch already (one re-run after a restart)."""
        if batch_id > self.windows.done:
            return False
        log.info("%s: micro-batch %d is in the snapshot already", self.name, batch_id)
        return True

    def batch_done(self, seconds: float) -> None:
        if self.on_batch is not None:
            self.on_batch(self.stats, seconds)

    def due_ms(self) -> int | None:
        """The least event time whose reading may hand a window on (close it, or hand it on
        early; see ``OpenWindows.due_ms``). None: nothing read yet."""
        latest, spec = self.windows.latest, self.window.spec
        if latest is None:
            return None
        return self.windows.due_ms(spec.last_end(latest) + spec.every_ms)

    @property
    def lock(self) -> threading.Lock:
        """Held while a micro-batch runs (and by :meth:`flush`)."""
        return self._lock

    @property
    def stopping(self) -> bool:
        return self._stopping

    def prepare(self, raw: DataFrame) -> DataFrame:
        """Raw records as the aggregation takes them, a row per kept record and window it
        falls in, and a row (with no window) per record that is malformed or that a ``where``
        drops, for the counters. Built once on the stream, so a batch adds two steps."""
        return self.prepare_typed(self.typed(raw))

    def typed(self, raw: DataFrame) -> DataFrame:
        """Raw records parsed against the source's schema, a row per record: the first
        step of :meth:`prepare`, the same for every stage of one source."""
        if ARRIVED_COLUMN not in raw.columns:  # a batch not read from the folder (tests)
            raw = raw.withColumns({ARRIVED_COLUMN: F.lit(None).cast("long"),
                                   FILE_COLUMN: F.lit(None).cast("string")})
        return raw.select(*self._compiled.typed)

    def prepare_typed(self, typed: DataFrame) -> DataFrame:
        """:meth:`prepare` of records already :meth:`typed`."""
        c, df = self._compiled, typed
        for step in c.steps:
            df = step(df)
        df = df.select("*", c.windows.alias("_start")).filter(c.in_window).select(*c.inputs)
        for projection in c.parts:
            df = df.withColumns(projection)
        return df

    @property
    def record_counters(self) -> list[Column]:
        """What ``observe`` collects of :meth:`typed` records (see :meth:`plan`)."""
        return batch_counters(F.lit(True))

    def _process(self, prepared: DataFrame, batch_id: int | None = None) -> None:
        started = time.time()
        planned = self.plan(prepared, batch_id)
        self.take(planned, planned.grouped.collect(), batch_id, started)

    def plan(self, prepared: DataFrame, batch_id: int | None, one_task: bool = False,
             observation: Observation | None = None) -> PlannedBatch:
        """The micro-batch's one Spark job, not run yet: its rows grouped by window and key,
        with the batch's counters observed on the way, or by the caller, on the records
        ``prepared`` was prepared from (``observation``, its ``record_counters``).
        ``one_task``: grouped in one partition, with no shuffle (a stage of one task; see
        ``SourceReader._run``)."""
        c, df = self._compiled, prepared
        if observation is None:
            observation = Observation(f"{self.name}/{id(self)}/{batch_id}")
            df = prepared.observe(observation, *c.counters)
        if one_task:
            df = df.coalesce(1)
        return PlannedBatch(prepared, df.groupBy(*c.keys).agg(*c.aggregates), observation)

    def take(self, planned: PlannedBatch, rows: Sequence[Any], batch_id: int | None,
             started: float) -> None:
        """Take the grouped rows of :meth:`plan`'s job (run by the caller since ``started``,
        wall-clock seconds) into the open windows, hand on what closed, keep the snapshot."""
        prepared, collected = planned.prepared, time.time()
        self.stats.batches += 1
        counters = planned.observation.get
        self.stats.records_in += int(counters["records"])
        malformed = {reason: int(counters[reason]) for reason in REASONS if counters[reason]}
        if malformed:
            self.stats.malformed.update(malformed)
            self._quarantine(prepared)
        self._merge(rows)
        for i, (_, agg) in enumerate(self.partial.aggregates):
            if isinstance(agg, TopKItems):
                self._top_items(prepared, i, agg)
        self.windows.advance(counters["latest"])
        self.received_ms = max(counters["arrived"] or time.time_ns() // 1_000_000,
                               self._started_ms)
        # Handed on before the snapshot is written: the snapshot (and its fsync) is not on a
        # window's way. Spark commits the batch only after the snapshot; a process that dies
        # before that runs the batch again, and what is handed on again is dropped downstream.
        self.windows.close_passed()
        self.windows.hand_on_early()
        trace.mark("batch", query=self.name, batch=batch_id, start=f"{started:.3f}",
                   collected=f"{collected:.3f}", watermark=self.windows.watermark,
                   arrived=counters["arrived"])
        if self.snapshot is not None and batch_id is not None:
            self.windows.save(self.snapshot, batch_id)

    def _compile(self) -> _Compiled:
        keep = F.col("_keep")
        counters = batch_counters(F.coalesce(F.col("_first"), F.lit(True)))  # a record's one row
        # Each kept record once per window it falls in, and whether that is its first window
        # (the one the watermark closes first): the first start s with s + size > ts.
        spec, time_column = self.window.spec, F.col(self.window.time_column)
        size, every = F.lit(spec.size_ms), F.lit(spec.every_ms)
        last, first, earliest = window_starts(spec, time_column)
        start = F.col("_start")
        # A record not kept has no window and no keys or inputs: one row, in no group.
        # (A window is its start: its end, start + size, is added in Python, a column fewer
        # to send from the JVM for every group.)
        inputs: list[Column] = [start,
                                *(F.when(keep, F.col(k)).alias(k) for k in self.partial.keys),
                                (start == earliest).alias("_first"),
                                *(F.col(c) for c in _INTERNAL)]
        schema = (self.steps[-1] if self.steps else self.source).schema
        given, bands, parts = [], [], [{}, {}]  # type: ignore[var-annotated]
        for i, (_, agg) in enumerate(self.partial.aggregates):
            if agg.expr is None:
                given.append(Input(F.lit(None)))
                continue
            name = f"_in{i}"
            value = F.when(keep, to_column(agg.expr))
            inputs.append(value.alias(name))
            if not (form_of(agg).banded and agg.expr.dtype(schema) is DataType.FLOAT):
                given.append(Input(F.col(name)))
                continue
            exponent = scaled_exponent(*defined_as(agg.expr, self.source, self.steps))
            summed, band, limbs = summed_parts(f"{name}_x", value, exponent)
            inputs.append(summed.alias(f"{name}_x"))
            parts[0] |= band
            parts[1] |= limbs
            bands.append(f"{name}_x_e")
            given.append(Input(F.col(name), F.col(f"{name}_x_e"),
                               tuple(F.col(limb) for limb in limbs)))
        keys = ["_start", *self.partial.keys]
        # A result row is read by position (a Row finds a name by a list search): the keys,
        # the bands, the file and when it landed, the events, the records whose first window
        # this is, each aggregate's, the largest event time. (A tumbling window is each
        # record's first and only one: no count of its own.) Rows are by file, as lateness
        # is judged file by file (``_merge``).
        tumbling = spec.size_ms == spec.every_ms
        file_at = len(keys) + len(bands)
        events_at = file_at + 2
        aggregates = [F.count(F.lit(1))]
        if not tumbling:
            aggregates.append(F.count(F.when(F.col("_first"), True)))
        firsts_at = events_at + len(aggregates) - 1
        slices: list[slice] = []
        for (_, agg), x in zip(self.partial.aggregates, given, strict=True):
            if isinstance(agg, Count) and agg.expr is None:  # count(): the events, read again
                slices.append(slice(events_at, events_at + 1))
                continue
            columns = form_of(agg).columns(agg, x)
            at = events_at + len(aggregates)
            slices.append(slice(at, at + len(columns)))
            aggregates += columns
        latest_at = events_at + len(aggregates)
        aggregates.append(F.max(F.when(F.col("_reason").isNull(), F.col("_event"))))
        # Each a name of its own (Spark's would repeat for a repeated expression): a row of
        # several stages' puts them in a struct by name (``jetstream.stage.reader``).
        aggregates = [column.alias(f"_a{j}") for j, column in enumerate(aggregates)]
        band_at = [None if x.band is None else len(keys) + bands.index(f"_in{i}_x_e")
                   for i, x in enumerate(given)]
        if tumbling:  # one window a record: no row per window to make, none to drop
            windows, in_window = F.when(keep, last), F.lit(True)
        else:
            windows = F.explode_outer(F.when(keep, F.sequence(first, last, every)))
            in_window = start.isNull() | (start + size > time_column)
        return _Compiled(
            self._typed(), counters,
            record_steps(self.spark, self.source.schema, self.steps, _INTERNAL), windows,
            in_window, inputs,
            [p for p in parts if p], [*keys, *bands, FILE_COLUMN, ARRIVED_COLUMN], aggregates,
            firsts_at, file_at, latest_at, slices, band_at,
            [form_of(agg).accumulator for _, agg in self.partial.aggregates])

    def _typed(self) -> list[Column]:
        """Typed columns, the bad line, and ``_reason`` saying why a record is malformed
        (NULL: it is fine)."""
        malformed = "wrong field count" if self.layout.format == "csv" else "malformed record"
        reason: Column = F.when(F.col(CORRUPT_COLUMN).isNotNull(), F.lit(malformed))
        typed = []
        for f in self.source.schema:
            text = F.col(f"`{f.name}`")
            value = parse_text(f.name, f.dtype)
            reason = reason.when(text.isNull(), F.lit(f"missing field: {f.name}"))
            reason = reason.when(value.isNull(), F.lit(f"ill-typed field: {f.name}"))
            typed.append(value.alias(f.name))
        event = parse_text(self.event_time, self.source.schema.dtype(self.event_time))
        return [*typed, F.col(CORRUPT_COLUMN), F.col(ARRIVED_COLUMN), F.col(FILE_COLUMN),
                reason.alias("_reason"), reason.isNull().alias("_keep"), event.alias("_event")]

    def _quarantine(self, prepared: DataFrame) -> None:
        """Set the batch's malformed records aside, each with its reason and file (in the
        site's folder, where the stream read it elsewhere: ``read_from``)."""
        file = F.col(FILE_COLUMN)
        if self.read_from is not None:
            file = F.replace(file, F.lit(self.read_from[0]), F.lit(self.read_from[1]))
        (prepared.filter(F.col("_reason").isNotNull())
         .select(F.col("_reason").alias("reason"), file.alias("file"),
                 F.col(CORRUPT_COLUMN).alias("line"))
         .write.mode("append").json(self.quarantine_dir))

    def _merge(self, rows: Sequence[Any]) -> None:
        """Merge a batch's grouped rows into the open windows; the rows of a window the
        watermark has closed are dropped, their records counted late, and those of a window
        that began before the stage joined its reader (``OpenWindows.joined_ms``) are
        withheld.

        Lateness is judged file by file, as the reference executor judges it: each file of
        the batch against the watermark of the files read before it, in landing order
        (``_file_watermarks``), so how files fall into micro-batches changes nothing."""
        c, n = self._compiled, len(self.partial.keys)
        events_at, size = c.file_at + 2, self.window.spec.size_ms
        forms = list(zip([agg for _, agg in self.partial.aggregates], c.accumulators, c.slices,
                         c.bands, strict=True))
        values_of = [tuple(row) for row in rows]  # a Row's own indexing is slow; a tuple's not
        watermarks = self._file_watermarks(values_of)
        add = self.windows.add
        joined = -math.inf if self.windows.joined_ms is None else self.windows.joined_ms
        for values in values_of:
            if values[0] is None:  # the records not kept: they count, in no window
                continue
            window = (values[0], values[0] + size)
            if window[0] <= joined:  # it holds records read before the stage joined
                self.stats.withheld_records += values[c.firsts_at]
                continue
            watermark = watermarks[values[c.file_at]]
            if watermark is not None and window[1] <= watermark:
                self.stats.late_records += values[c.firsts_at]
                continue
            accs = [accumulator(agg, values[part], None if band is None else values[band])
                    for agg, accumulator, part, band in forms]
            add(window, values[1:1 + n], accs, values[events_at])

    def _file_watermarks(self, rows: Sequence[tuple[Any, ...]]) -> dict[str | None, int | None]:
        """The watermark each file of a batch's grouped rows is judged against
        (``OpenWindows.file_watermarks``), kept for the batch's other jobs (``_top_items``)."""
        c = self._compiled
        files: dict[str | None, tuple[int, int | None]] = {}
        for values in rows:
            file, latest = values[c.file_at], values[c.latest_at]
            arrived, before = files.get(file, (values[c.file_at + 1] or 0, None))
            files[file] = (arrived, before if latest is None else
                           latest if before is None else max(before, latest))
        self._watermarks = self.windows.file_watermarks(files)
        return self._watermarks

    def _top_items(self, df: DataFrame, i: int, agg: TopKItems) -> None:
        keys = ["_start", *self.partial.keys, FILE_COLUMN]
        counts = (df.filter(F.col("_start").isNotNull() & F.col(f"_in{i}").isNotNull())
                  .groupBy(*keys, F.col(f"_in{i}").cast("string").alias("_item")).count())
        sketches: dict[tuple[tuple[int, int], tuple[Any, ...]], Any] = {}
        joined = self.windows.joined_ms
        for row in counts.collect():
            start = int(row["_start"])
            window = (start, start + self.window.spec.size_ms)
            watermark = self._watermarks.get(row[FILE_COLUMN], self.windows.watermark)
            if ((joined is not None and start <= joined)
                    or (watermark is not None and window[1] <= watermark)):
                continue
            group = (window, tuple(row[k] for k in self.partial.keys))
            sketch = sketches.setdefault(group, agg.create())
            sketch.update(row["_item"], int(row["count"]))
        for (window, key), sketch in sketches.items():
            self.windows.merge_into(window, key, i, sketch)
