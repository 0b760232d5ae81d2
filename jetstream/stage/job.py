"""A site's local stage: a Spark Structured Streaming job that turns raw records into partials.

The job reads the site's input folder (CSV files that log shippers drop in atomically), every
column as text, and runs each micro-batch (``foreachBatch``, on the driver) through:

1. parsing against the source schema: a malformed record (wrong field count, a value that is
   not of its column's type, a missing field) is counted by reason and written, with the
   reason, to the quarantine folder — never a crash, never a silent change;
2. the query's record steps, compiled from the expression IR to Spark columns;
3. event-time windows, assigned exactly as :meth:`WindowSpec.windows_of` does; a record for a
   window the site's watermark has already closed is late: counted and dropped;
4. the partial aggregates per window and group key, with Spark's own functions (``count``,
   ``sum``, ``min``, ``max``, ``collect_set``, ``collect_list``, ``hll_sketch_agg``,
   ``kll_sketch_agg_double``; frequent items from per-item counts), turned into the
   accumulators of :mod:`jetstream.aggregates`; a sum of doubles is exact, as the reference's
   is (see ``LocalStage._aggregate``);
5. merged into the windows' running partials, and every window the watermark has now closed
   is handed to ``emit``.

An idle input (:meth:`LocalStage.flush`) hands on its open windows before the watermark closes
them. Such a window is kept until the watermark passes it: records for it that come later are
merged into it, and the whole window is handed on again with the next revision (0, 1, 2, ...),
which replaces the earlier one downstream.

The watermark is the largest event time the site has read, less the window's delay — the
reference executor's rule, applied at micro-batch granularity.

With a ``snapshot`` file, a live stage survives the death of its process: after each
micro-batch, before Spark commits it, the windows still open (and those about to be handed
on), the watermark and the batch's id go to the file, atomically. A restarted stage loads
them; Spark re-runs the batches it had not committed, and the batches the snapshot already
holds are skipped, so every record counts once. Windows the snapshot holds as closed are
handed on again at the first batch; whoever receives them drops what it already has.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasketches as ds
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

from jetstream.aggregates import Aggregate, Count, CountDistinct, Max, Min, Quantile, Sum
from jetstream.approx.sketches import ApproxCountDistinct, ApproxQuantile, TopKItems
from jetstream.dsl import Query
from jetstream.errors import DataError, PlanError
from jetstream.operators import (
    Operator,
    Select,
    Source,
    Where,
    Window,
    WindowAggregate,
    WithColumn,
)
from jetstream.partials import PartialBatch, decode_batch, encode_batch
from jetstream.schema import DataType
from jetstream.stage.compile import spark_type, to_column
from jetstream.v1 import dataplane_pb2 as pb

__all__ = ["LocalStage", "StageStats"]

log = logging.getLogger(__name__)

# (window, rows, events, revision): a window handed on again (revision 1, 2, ...) is whole.
Emit = Callable[[tuple[int, int], list[dict[str, Any]], int, int], None]
# (the stats so far, seconds the micro-batch took): after each micro-batch.
OnBatch = Callable[["StageStats", float], None]
_CORRUPT = "_jetstream_corrupt"
_MANTISSA_BITS = 52  # a double's fraction bits: an integer below 2**53 is exactly a double
_MIN_EXPONENT = -1074  # 2**-1074, the smallest subnormal: every double is a multiple of it
# Exponents summed together in one DECIMAL(38,0): a term is below 2**(53 + 32), so a sum holds
# 2**41 of them, and a column's values rarely span more than two bands.
_EXPONENT_BAND = 32
_NON_FINITE = (math.inf, -math.inf, math.nan)  # Spark, unlike Python, has NaN = NaN


@dataclass
class StageStats:
    records_in: int = 0
    late_records: int = 0
    malformed: Counter[str] = field(default_factory=Counter)
    batches: int = 0


class LocalStage:
    """One query's local stage at one site, over one input folder. ``emit`` gets each window
    it hands on; ``on_batch``, if given, the stats after each micro-batch and its duration."""

    def __init__(self, spark: SparkSession, query: Query, input_dir: str | Path, *,
                 checkpoint_dir: str | Path, quarantine_dir: str | Path, emit: Emit,
                 snapshot: Path | None = None, on_batch: OnBatch | None = None) -> None:
        plan = query.plan()
        self.name = query.name
        chain = _site_chain(plan, query.name)
        source, partial = chain[0], chain[-1]
        assert isinstance(source, Source) and isinstance(partial, WindowAggregate)
        self.source, self.steps, self.partial = source, chain[1:-1], partial
        if source.schema.event_time is None:
            msg = f"query {query.name}: source {source.name} has no event time column"
            raise PlanError(msg)
        self.event_time: str = source.schema.event_time
        window = next((s for s in self.steps if isinstance(s, Window)), None)
        if window is None:
            msg = f"query {query.name}: the local stage needs a window before the aggregate"
            raise PlanError(msg)
        self.window = window
        self.spark, self.emit, self.on_batch = spark, emit, on_batch
        self.input_dir, self.checkpoint_dir = str(input_dir), str(checkpoint_dir)
        self.quarantine_dir = str(quarantine_dir)
        self.stats = StageStats()
        self._latest: int | None = None  # the largest event time read so far
        self._open: dict[tuple[int, int], dict[tuple[Any, ...], list[Any]]] = {}
        self._events: Counter[tuple[int, int]] = Counter()
        # Windows flushed before the watermark closed them: their rows, events and revision.
        self._flushed: dict[tuple[int, int], tuple[dict[tuple[Any, ...], list[Any]], int, int]] = {}
        self._stream: StreamingQuery | None = None
        self._lock = threading.Lock()  # a live stage's micro-batches against flush()
        self.snapshot = snapshot
        self._done = -1  # the last micro-batch the snapshot holds
        if snapshot is not None and snapshot.exists():
            self._restore(snapshot)

    # -- running ------------------------------------------------------------------------------
    @property
    def text_schema(self) -> StructType:
        """What :meth:`process_batch` reads: every source column as text, and the bad line."""
        return StructType([StructField(f.name, StringType()) for f in self.source.schema]
                          + [StructField(_CORRUPT, StringType())])

    def _reader(self) -> DataFrame:
        return (self.spark.readStream.schema(self.text_schema).option("header", True)
                .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", _CORRUPT)
                .csv(self.input_dir))

    def run_available(self) -> StageStats:
        """Process every file in the folder now, then close every window (finite input)."""
        self._stream = (self._reader().writeStream.foreachBatch(self.process_batch)
                        .option("checkpointLocation", self.checkpoint_dir)
                        .trigger(availableNow=True).start())
        self._stream.awaitTermination()
        self.flush()
        return self.stats

    def start(self, trigger_s: float = 1.0) -> StreamingQuery:
        """Run live: a micro-batch every ``trigger_s`` seconds over the files that arrived."""
        self._stream = (self._reader().writeStream.foreachBatch(self.process_batch)
                        .option("checkpointLocation", self.checkpoint_dir)
                        .trigger(processingTime=f"{trigger_s} seconds").start())
        return self._stream

    def stop(self) -> None:
        if self._stream is not None and self._stream.isActive:
            self._stream.stop()

    @property
    def watermark(self) -> int | None:
        """Every window ending at or before this has been handed on (None: nothing read)."""
        return None if self._latest is None else self._latest - self.window.watermark_ms

    def flush(self) -> None:
        """The input has ended (or gone idle): every open window is final."""
        with self._lock:
            self._emit_closed(None)

    # -- one micro-batch ----------------------------------------------------------------------
    def process_batch(self, raw: DataFrame, batch_id: int) -> None:
        with self._lock:
            if batch_id <= self._done:  # re-run after a restart: the snapshot has it
                log.info("%s: micro-batch %d is in the snapshot already", self.name, batch_id)
                return
            started = time.monotonic()
            self._process(raw, batch_id)
            if self.on_batch is not None:
                self.on_batch(self.stats, time.monotonic() - started)

    # -- the snapshot -------------------------------------------------------------------------
    def _save(self, batch_id: int) -> None:
        assert self.snapshot is not None
        state = {"version": 2, "query": self.name, "batch": batch_id, "latest": self._latest,
                 "windows": [[*w, self._events[w], -1, self._encode(w, g)]
                             for w, g in sorted(self._open.items())],
                 "flushed": [[*w, events, revision, self._encode(w, g)]
                             for w, (g, events, revision) in sorted(self._flushed.items())]}
        temporary = self.snapshot.with_name(f".{self.snapshot.name}.tmp")
        self.snapshot.parent.mkdir(parents=True, exist_ok=True)
        with temporary.open("w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.snapshot)
        self._done = batch_id

    def _encode(self, window: tuple[int, int], groups: dict[tuple[Any, ...], list[Any]]) -> str:
        batch = PartialBatch(self.name, window, "snapshot", tuple(self._rows(groups)))
        return base64.b64encode(encode_batch(batch, self.partial).SerializeToString()).decode()

    def _decode(self, encoded: str) -> dict[tuple[Any, ...], list[Any]]:
        message = pb.PartialBatch.FromString(base64.b64decode(encoded))
        return {tuple(row[k] for k in self.partial.keys):
                [agg.merge(agg.create(), row[name]) for name, agg in self.partial.aggregates]
                for row in decode_batch(message, self.partial).rows}

    def _restore(self, path: Path) -> None:
        try:
            state = json.loads(path.read_text())
            if state.get("version") != 2 or state.get("query") != self.name:
                msg = f"it is not a version 2 snapshot of {self.name}"
                raise DataError(msg)
            for start, end, events, _, encoded in state["windows"]:
                self._open[(start, end)] = self._decode(encoded)
                self._events[(start, end)] = events
            for start, end, events, revision, encoded in state["flushed"]:
                self._flushed[(start, end)] = (self._decode(encoded), events, revision)
            self._latest, self._done = state["latest"], state["batch"]
        except (OSError, ValueError, KeyError, TypeError, DataError) as e:
            msg = f"{self.name}: cannot restore the local stage from {path}: {e}"
            raise DataError(msg) from e
        log.info("%s: restored %d open windows at micro-batch %d from %s", self.name,
                 len(self._open), self._done, path)

    def _process(self, raw: DataFrame, batch_id: int | None = None) -> None:
        self.stats.batches += 1
        checked = self._check(raw).cache()
        try:
            self._quarantine(checked)
            valid = checked.filter(F.col("_reason").isNull()).drop("_reason", _CORRUPT)
            batch_latest = valid.agg(F.max(self.event_time), F.count(F.lit(1))).first()
            self.stats.records_in += int(batch_latest[1]) if batch_latest else 0
            watermark = (None if self._latest is None
                         else self._latest - self.window.watermark_ms)
            self._aggregate(self._windowed(self._steps(valid), watermark))
            if batch_latest is not None and batch_latest[0] is not None:
                self._latest = max(self._latest or batch_latest[0], batch_latest[0])
            if self.snapshot is not None and batch_id is not None:
                self._save(batch_id)  # before handing on: what is handed on is kept there
            if self._latest is not None:
                self._emit_closed(self._latest - self.window.watermark_ms)
        finally:
            checked.unpersist()

    def _check(self, raw: DataFrame) -> DataFrame:
        """Typed columns, and ``_reason`` saying why a record is malformed (NULL: it is fine)."""
        reason: Column = F.when(F.col(_CORRUPT).isNotNull(), F.lit("wrong field count"))
        typed = []
        for f in self.source.schema:
            text = F.col(f"`{f.name}`")
            value = _parse(f.name, f.dtype)
            reason = reason.when(text.isNull(), F.lit(f"missing field: {f.name}"))
            reason = reason.when(value.isNull(), F.lit(f"ill-typed field: {f.name}"))
            typed.append(value.alias(f.name))
        return raw.select(*typed, F.col(_CORRUPT), reason.alias("_reason"))

    def _quarantine(self, checked: DataFrame) -> None:
        bad = checked.filter(F.col("_reason").isNotNull())
        counts = bad.groupBy("_reason").count().collect()
        if not counts:
            return
        for row in counts:
            self.stats.malformed[row["_reason"].split(":", 1)[0]] += int(row["count"])
        (bad.select(F.col("_reason").alias("reason"), F.input_file_name().alias("file"),
                    F.col(_CORRUPT).alias("line"))
         .write.mode("append").json(self.quarantine_dir))

    def _steps(self, df: DataFrame) -> DataFrame:
        for step in self.steps:
            if isinstance(step, Where):
                df = df.filter(to_column(step.predicate))
            elif isinstance(step, WithColumn):
                df = df.withColumn(step.name, to_column(step.expr))
            elif isinstance(step, Select):
                df = df.select(*(to_column(e).alias(n) for n, e in step.columns))
            elif not isinstance(step, Window):
                msg = f"{step.kind} does not run in the Spark local stage yet"
                raise PlanError(msg)
        return df

    def _windowed(self, df: DataFrame, watermark: int | None) -> DataFrame:
        spec, ts = self.window.spec, F.col(self.window.time_column)
        last = ts - F.pmod(ts, F.lit(spec.every_ms))
        first = last - F.lit((math.ceil(spec.size_ms / spec.every_ms) - 1) * spec.every_ms)
        df = (df.withColumn("_record", F.monotonically_increasing_id())
              .withColumn("_start", F.explode(F.sequence(first, last, F.lit(spec.every_ms))))
              .filter(F.col("_start") + F.lit(spec.size_ms) > ts)
              .withColumn("_end", F.col("_start") + F.lit(spec.size_ms)))
        if watermark is None:
            return df
        closed = F.col("_end") <= F.lit(watermark)
        late = df.filter(closed).select("_record").distinct().count()
        self.stats.late_records += late
        return df.filter(~closed)

    def _aggregate(self, df: DataFrame) -> None:
        keys = ["_start", "_end", *self.partial.keys]
        inputs = {f"_in{i}": to_column(agg.expr)
                  for i, (_, agg) in enumerate(self.partial.aggregates) if agg.expr is not None}
        df = df.select(*keys, *(c.alias(n) for n, c in inputs.items()))
        # A sum of doubles adds integers (x = m * 2**e, see _binary_parts), which is exact, one
        # total per band of exponents: the band joins the group key, so a window and key can
        # come as a few rows, which _merge merges like the partials of two micro-batches.
        bands = []
        for i, (_, agg) in enumerate(self.partial.aggregates):
            x = f"_in{i}"
            if isinstance(agg, Sum) and isinstance(df.schema[x].dataType, DoubleType):
                band, integer = _binary_parts(F.when(_finite(F.col(x)), F.col(x)))
                df = df.withColumn(f"{x}_e", band).withColumn(f"{x}_m", integer)
                bands.append(f"{x}_e")
        # A result row is read by position (a Row finds a name by a list search): the keys, the
        # bands, the count of events, then each aggregate's values.
        columns, slices = [F.count(F.lit(1))], []
        for i, (_, agg) in enumerate(self.partial.aggregates):
            parts = _spark_partial(agg, f"_in{i}", floating=f"_in{i}_e" in bands)
            start = len(keys) + len(bands) + len(columns)
            slices.append(slice(start, start + len(parts)))
            columns += parts
        for row in df.groupBy(*keys, *bands).agg(*columns).collect():
            values = tuple(row)
            accs = [_accumulator(agg, list(values[part])) for (_, agg), part in
                    zip(self.partial.aggregates, slices, strict=True)]
            self._merge((int(values[0]), int(values[1])), values[2:len(keys)], accs,
                        int(values[len(keys) + len(bands)]))
        for i, (_, agg) in enumerate(self.partial.aggregates):
            if isinstance(agg, TopKItems):
                self._top_items(df, keys, i, agg)

    def _top_items(self, df: DataFrame, keys: list[str], i: int, agg: TopKItems) -> None:
        counts = (df.filter(F.col(f"_in{i}").isNotNull())
                  .groupBy(*keys, F.col(f"_in{i}").cast("string").alias("_item")).count())
        sketches: dict[tuple[tuple[int, int], tuple[Any, ...]], Any] = {}
        for row in counts.collect():
            group = ((int(row["_start"]), int(row["_end"])),
                     tuple(row[k] for k in self.partial.keys))
            sketch = sketches.setdefault(group, agg.create())
            sketch.update(row["_item"], int(row["count"]))
        for (window, key), sketch in sketches.items():
            accs = self._open[window][key]
            accs[i] = agg.merge(accs[i], sketch)

    def _merge(self, window: tuple[int, int], key: tuple[Any, ...], accs: list[Any],
               events: int) -> None:
        groups = self._open.setdefault(window, {})
        current = groups.get(key)
        if current is None:
            groups[key] = accs
        else:
            groups[key] = [agg.merge(a, b) for (_, agg), a, b in
                           zip(self.partial.aggregates, current, accs, strict=True)]
        self._events[window] += events

    def _emit_closed(self, watermark: int | None) -> None:
        """Hand on every window ending at or before ``watermark`` (None: every open window;
        those the watermark has not closed are kept, whole, for records that come later)."""
        for window in sorted(self._open):
            if watermark is not None and window[1] > watermark:
                continue
            groups, events, revision = self._open.pop(window), self._events.pop(window, 0), 0
            if window in self._flushed:  # handed on before: merge, hand on whole again
                before, before_events, last = self._flushed.pop(window)
                for key, accs in before.items():
                    groups[key] = accs if key not in groups else [
                        agg.merge(a, b) for (_, agg), a, b in
                        zip(self.partial.aggregates, accs, groups[key], strict=True)]
                events, revision = events + before_events, last + 1
            self.emit(window, self._rows(groups), events, revision)
            if watermark is None and not self._closed(window):
                self._flushed[window] = (groups, events, revision)
        for window in [w for w in self._flushed if self._closed(w)]:
            del self._flushed[window]

    def _closed(self, window: tuple[int, int]) -> bool:
        watermark = self.watermark
        return watermark is not None and window[1] <= watermark

    def _rows(self, groups: dict[tuple[Any, ...], list[Any]]) -> list[dict[str, Any]]:
        return [dict(zip(self.partial.keys, key, strict=True)) | {
            name: agg.compact(acc) for (name, agg), acc in
            zip(self.partial.aggregates, accs, strict=True)}
            for key, accs in groups.items()]


def _site_chain(plan: Any, name: str) -> list[Operator]:
    """Source, record steps, partial aggregate: the part of the plan a site runs."""
    partials = plan.partial_aggregates()
    if len(partials) != 1:
        msg = (f"query {name}: the local stage runs one partial aggregate, the plan has "
               f"{len(partials)} (optimize the query; one source per site)")
        raise PlanError(msg)
    chain, node = [], partials[0]
    while True:
        chain.append(plan.op(node))
        inputs = plan.inputs(node)
        if len(inputs) != 1:
            break
        node = inputs[0]
    chain.reverse()
    if not isinstance(chain[0], Source):
        msg = f"query {name}: a union below the partial aggregate does not run in one stage"
        raise PlanError(msg)
    return chain


def _parse(name: str, dtype: DataType) -> Column:
    """The text column ``name`` as ``dtype``, NULL where it does not parse."""
    text = F.col(f"`{name}`")
    if dtype is DataType.STRING:
        return text
    if dtype is DataType.BOOL:
        lowered = F.lower(F.trim(text))
        return (F.when(lowered.isin("true", "1"), F.lit(True))
                .when(lowered.isin("false", "0"), F.lit(False)))
    value = F.expr(f"try_cast(`{name}` AS {spark_type(dtype).simpleString()})")
    if dtype is DataType.FLOAT:  # NaN and infinities are not numbers a log line can hold
        return F.when(~F.isnan(value) & (F.abs(value) != F.lit(math.inf)), value)
    return value


def _finite(x: Column) -> Column:
    return x.isNotNull() & ~F.isnan(x) & (F.abs(x) != F.lit(math.inf))


def _binary_parts(x: Column) -> tuple[Column, Column]:
    """Columns ``(e, m)`` with ``x == m * 2**e`` exactly for a finite double ``x``: ``m`` an
    integer, as DECIMAL(31,0), and ``e`` where its band of ``_EXPONENT_BAND`` exponents starts;
    for a NULL ``x``, a NULL ``m``.

    The exponent of ``x``'s last bit is ``floor(log2(|x|)) - 52``, and never below -1074,
    where the subnormals' last bit sits; ``x`` over it is an integer below 2**53. Spark's
    ``log2`` can be one off near a power of two, so the floor is corrected by comparing
    ``|x|`` with the powers of two around it. ``pow(2, k)`` and the division by it are exact
    for every exponent this gives (-1074 to 971), so no double here overflows or rounds. Zero
    has no ``log2`` (NULL), and ``greatest`` skips a NULL: zero gets ``e = -1074, m = 0``.
    """
    two = F.lit(2.0)
    magnitude = F.when(x != 0, F.abs(x))
    guess = F.floor(F.log2(magnitude))
    top = (F.when(magnitude < F.pow(two, guess), guess - 1)
           .when(magnitude >= F.pow(two, guess + 1), guess + 1)
           .otherwise(guess))
    last = F.greatest(top - F.lit(_MANTISSA_BITS), F.lit(_MIN_EXPONENT))
    # Through bigint, exactly; Spark casts a double to a decimal by way of a decimal string.
    integer = (x / F.pow(two, last)).cast("bigint").cast("decimal(20,0)")
    into_band = F.pmod(last - F.lit(_MIN_EXPONENT), F.lit(_EXPONENT_BAND))
    return (last - into_band,
            integer * F.pow(two, into_band).cast("bigint").cast("decimal(10,0)"))


def _exact_floats(total: int, e: int) -> list[float]:
    """Floats whose exact sum is ``total * 2**e``: [0.0] for zero.

    Cut into 52-bit chunks, each chunk times its power of two is a double, exactly. A total of
    2**1024 or more has no such chunks: it becomes ±inf, what a float addition overflows to.
    That is the one case where the stage is not exact (it is while the values of one band, at
    one site, in one micro-batch, window and key add up to less than 2**1024); the reference's
    exact partials overflow there too, to infinities that depend on the order of the values.
    """
    sign, rest, shift = -1.0 if total < 0 else 1.0, abs(total), 0
    chunks = []
    try:
        while rest:
            if chunk := rest & ((1 << _MANTISSA_BITS) - 1):
                chunks.append(sign * math.ldexp(chunk, e + shift))
            rest >>= _MANTISSA_BITS
            shift += _MANTISSA_BITS
    except OverflowError:
        return [sign * math.inf]
    return chunks or [0.0]


def _spark_partial(agg: Aggregate, column: str, *, floating: bool = False) -> list[Column]:
    """Spark aggregate expressions whose values make ``agg``'s accumulator.

    ``floating``: ``agg`` is a sum of doubles, whose finite values ``column`` has as integers
    in ``{column}_m`` for the exponent band ``{column}_e`` (see ``LocalStage._aggregate``);
    those that are not finite (an expression's overflow: ±inf, NaN) are counted. (Counts, not
    ``collect_list``: that would cost Spark its fast hash aggregate.)
    """
    c = F.col(column)
    if isinstance(agg, Count):
        return [F.count(F.lit(1)) if agg.expr is None else F.count(c)]
    if isinstance(agg, Sum) and floating:  # and Avg, a Sum
        return [F.count(c), F.sum(f"{column}_m"), F.any_value(f"{column}_e"),
                *(F.count(F.when(c == F.lit(v), True)) for v in _NON_FINITE)]
    if isinstance(agg, Sum):  # DECIMAL(38, 0): a bigint total can overflow, Python's int cannot
        return [F.count(c), F.try_sum(c.cast("decimal(38,0)"))]
    if isinstance(agg, Min):
        return [F.min(c)]
    if isinstance(agg, Max):
        return [F.max(c)]
    if isinstance(agg, CountDistinct):  # both skip NULLs, as the reference's ``add`` does
        return [F.collect_set(c)]
    if isinstance(agg, Quantile):
        return [F.collect_list(c)]
    if isinstance(agg, ApproxCountDistinct):
        return [F.hll_sketch_agg(c, agg.lg_k)]
    if isinstance(agg, ApproxQuantile):
        return [F.kll_sketch_agg_double(c.cast("double"), agg.k)]
    if isinstance(agg, TopKItems):
        return [F.lit(None)]  # built from per-item counts, see LocalStage._top_items
    msg = f"{agg} does not run in the Spark local stage"
    raise PlanError(msg)


def _accumulator(agg: Aggregate, values: list[Any]) -> Any:
    """``agg``'s accumulator from the values of its Spark aggregate expressions."""
    if isinstance(agg, Sum):
        if not values[0]:
            return agg.create()
        if len(values) == 2:  # integers: the count and the total
            return [int(values[0]), int(values[1]), []]
        count, total, band, *non_finite = values  # doubles (see _spark_partial)
        acc = [int(count), 0, []]
        for value, times in zip(_NON_FINITE, non_finite, strict=True):
            acc = agg.merge(acc, [0, 0, [value] * times])
        if total is not None:
            acc = agg.merge(acc, [0, 0, _exact_floats(int(total), band)])
        return acc
    if isinstance(agg, CountDistinct):
        return set(values[0])
    if isinstance(agg, Quantile):
        return list(values[0])
    if isinstance(agg, ApproxCountDistinct):
        return agg.create() if values[0] is None else ds.hll_sketch.deserialize(bytes(values[0]))
    if isinstance(agg, ApproxQuantile):
        return (agg.create() if values[0] is None
                else ds.kll_doubles_sketch.deserialize(bytes(values[0])))
    if isinstance(agg, TopKItems):
        return agg.create()
    if isinstance(agg, Count):
        return int(values[0])
    return values[0]  # min, max
