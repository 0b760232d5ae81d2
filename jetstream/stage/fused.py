"""One Spark plan for every local stage on a folder, built once (issue 57's design A).

Today a reader with several stages builds each stage's DataFrame steps again every
micro-batch (:mod:`jetstream.stage.reader`). Here the stages share one row instead: each
record is parsed once, every stage's steps are compiled to columns of that row under names of
the stage's own (``_q<k>_...``; :func:`~jetstream.stage.compile.columns_named` reads the
query's columns there), and a generator turns the record into one narrow row per stage and
window it falls in, tagged with the stage (``_q``), beside one row (``_q`` = -1) that only
counts it (the batch's counters, by ``observe``). All of that is :meth:`FusedPlan.prepare`,
built once, on the stream. A micro-batch then runs one aggregation (:meth:`FusedPlan.grouped`,
its columns built once too), grouped by the tag, every stage's keys and bands, and the file
(lateness is judged file by file), and :meth:`FusedPlan.split` gives each stage its rows in
the layout of its own plan (``LocalStage.plan``): its bookkeeping takes them unchanged.

Not fused (``fusable`` says why): the frequent-items sketch (``top_k(col, k)``), whose
per-item counts are a second job of their own.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from jetstream.aggregates import Count
from jetstream.approx.sketches import TopKItems
from jetstream.errors import PlanError
from jetstream.operators import Join, Map, Select, Where, Window, WithColumn
from jetstream.schema import DataType
from jetstream.stage.batches import ARRIVED_COLUMN, CORRUPT_COLUMN, FILE_COLUMN
from jetstream.stage.compile import columns_named, defined_as, lookup_table, map_udf, to_column
from jetstream.stage.forms import Input, form_of, scaled_exponent, summed_parts, window_starts
from jetstream.stage.job import LocalStage

__all__ = ["FusedPlan", "fusable"]

#: The columns of the record that every generated row keeps beside its own.
_RECORD = ("_reason", CORRUPT_COLUMN, ARRIVED_COLUMN, FILE_COLUMN, "_event")


def fusable(stage: LocalStage) -> str | None:
    """Why ``stage`` cannot share a fused plan, or None."""
    for _, agg in stage.partial.aggregates:
        if isinstance(agg, TopKItems):
            return f"{stage.name}: {agg} counts items in a job of its own"
    return None


@dataclass(frozen=True)
class _Part:
    """One stage's share of the fused row and of the grouped rows."""

    starts: str  # the column of the record's window starts, for this stage (empty: not kept)
    earliest: Column  # the start of the first window that holds the record
    slots: list[str]  # the columns of the shared row its generated rows carry
    keys: list[str]  # its group keys' slots, in the stage's order
    bands: list[str]  # its float sums' band slots, in the stage's order
    aggregates: list[Column]  # its aggregates' Spark columns, in the stage's order
    sliding: bool


class FusedPlan:
    """The stages of one folder (one source schema and layout) in one plan."""

    def __init__(self, stages: Sequence[LocalStage]) -> None:
        if not stages:
            msg = "a fused plan needs at least one stage"
            raise PlanError(msg)
        for stage in stages:
            if (why := fusable(stage)) is not None:
                raise PlanError(why)
        self.stages = list(stages)
        self._parts: list[_Part] = []
        self._keys: list[str] = []
        self._aggregates: list[Column] = []
        self._pick: list[Callable[[Any], tuple[Any, ...]]] = []

    # -- built once, on the stream ----------------------------------------------------------
    def prepare(self, typed: DataFrame) -> DataFrame:
        """``typed`` records (``LocalStage.typed``) as narrow rows: one per stage and window
        a kept record falls in, and one (``_q`` -1) per record."""
        df, self._parts = typed, []
        for k, stage in enumerate(self.stages):
            df, part = _stage_columns(df, k, stage)
            self._parts.append(part)
        types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        slots = [name for part in self._parts for name in part.slots]

        def wide(q: int, start: Column | None, first: Column | None, own: set[str]) -> Column:
            return F.struct(
                F.lit(q).alias("_q"),
                (start if start is not None else F.lit(None).cast("bigint")).alias("_start"),
                (first if first is not None else F.lit(None).cast("boolean")).alias("_first"),
                *(F.col(s) if s in own else F.lit(None).cast(types[s]).alias(s)
                  for s in slots))

        def windows(k: int, part: _Part) -> Column:
            own = set(part.slots)
            return F.transform(F.col(part.starts),
                               lambda s: wide(k, s, s == part.earliest, own))

        rows = [F.array(wide(-1, None, None, set())),
                *(windows(k, part) for k, part in enumerate(self._parts))]
        out = df.select(*_RECORD, F.inline(F.concat(*rows)))
        self._plan_aggregation()
        return out

    def _plan_aggregation(self) -> None:
        keys = [k for part in self._parts for k in part.keys]
        bands = [b for part in self._parts for b in part.bands]
        self._keys = ["_q", "_start", *keys, *bands, FILE_COLUMN, ARRIVED_COLUMN]
        events_at = len(self._keys)
        columns = [F.count(F.lit(1)), F.count(F.when(F.col("_first"), True))]
        picks = []
        for part in self._parts:
            at = events_at + len(columns)
            columns += part.aggregates
            picks.append((at, len(part.aggregates)))
        latest_at = events_at + len(columns)
        columns.append(F.max(F.when(F.col("_reason").isNull(), F.col("_event"))))
        self._aggregates = [c.alias(f"_a{j}") for j, c in enumerate(columns)]
        file_at = self._keys.index(FILE_COLUMN)
        self._pick = []
        for part, (at, n) in zip(self._parts, picks, strict=True):
            index = [1, *(self._keys.index(k) for k in part.keys),
                     *(self._keys.index(b) for b in part.bands), file_at, file_at + 1,
                     events_at, *([events_at + 1] if part.sliding else []),
                     *range(at, at + n), latest_at]
            self._pick.append(operator.itemgetter(*index))

    # -- a micro-batch ----------------------------------------------------------------------
    def grouped(self, prepared: DataFrame) -> DataFrame:
        """The batch's one aggregation, over :meth:`prepare`'s rows."""
        return prepared.groupBy(*self._keys).agg(*self._aggregates)

    def split(self, rows: Sequence[Any]) -> list[list[tuple[Any, ...]]]:
        """The grouped rows of each stage, each as its own plan lays a row out."""
        out: list[list[tuple[Any, ...]]] = [[] for _ in self.stages]
        pick = self._pick
        for row in rows:
            q = row[0]
            if q >= 0:
                out[q].append(pick[q](row))
        return out


def _stage_columns(df: DataFrame, k: int, stage: LocalStage) -> tuple[DataFrame, _Part]:
    """``stage``'s steps, window starts and aggregate inputs as columns of the shared row,
    named ``_q<k>_...``."""
    p = f"_q{k}_"
    cols: dict[str, Column] = {n: F.col(_quoted(n)) for n in stage.source.schema.names}
    keep = F.col("_keep")
    schemas = [stage.source.schema, *(step.schema for step in stage.steps)]
    for i, step in enumerate(stage.steps):
        with columns_named(cols):
            if isinstance(step, Where):
                df = df.withColumn(f"{p}keep",
                                   keep & F.coalesce(to_column(step.predicate), F.lit(False)))
                keep = F.col(f"{p}keep")
            elif isinstance(step, WithColumn):
                df = df.withColumn(f"{p}{i}_{step.name}", to_column(step.expr))
                cols = {**cols, step.name: F.col(_quoted(f"{p}{i}_{step.name}"))}
            elif isinstance(step, Select):
                df = df.withColumns({f"{p}{i}_{n}": to_column(e) for n, e in step.columns})
                cols = {n: F.col(_quoted(f"{p}{i}_{n}")) for n, _ in step.columns}
            elif isinstance(step, Map):
                names = schemas[i].names
                mapped = f"{p}{i}_map"
                df = df.withColumn(mapped, map_udf(step, schemas[i])(
                    keep, *(cols[n] for n in names)))
                cols = {f.name: F.col(mapped).getField(f.name) for f in step.schema}
            elif isinstance(step, Join):
                df, keep, cols = _join(df, step, f"{p}{i}_", keep, cols)
            else:
                assert isinstance(step, Window), f"check_stage let {step.kind} through"
    slots: list[str] = []
    keys = []
    for j, key in enumerate(stage.partial.keys):
        df = df.withColumn(f"{p}k{j}", cols[key])
        keys.append(f"{p}k{j}")
    spec, t = stage.window.spec, cols[stage.window.time_column]
    size, every = F.lit(spec.size_ms), F.lit(spec.every_ms)
    last, first, earliest = window_starts(spec, t)
    sliding = spec.size_ms != spec.every_ms
    if sliding:
        starts = F.filter(F.sequence(first, last, every), lambda s: s + size > t)
    else:
        starts = F.array(last)
    df = df.withColumns({f"{p}starts": F.when(keep, starts).otherwise(F.array().cast(
        "array<bigint>")), f"{p}earliest": earliest})
    given: list[Input] = []
    bands: list[str] = []
    for i, (_, agg) in enumerate(stage.partial.aggregates):
        if agg.expr is None:
            given.append(Input(F.lit(None)))
            continue
        name = f"{p}in{i}"
        with columns_named(cols):
            df = df.withColumn(name, to_column(agg.expr))
        slots.append(name)
        x = F.col(name)
        if not (form_of(agg).banded and agg.expr.dtype(schemas[-1]) is DataType.FLOAT):
            given.append(Input(x))
            continue
        # A sum of doubles: its band of exponents joins the keys, its limbs are summed.
        exponent = scaled_exponent(*defined_as(agg.expr, stage.source, stage.steps))
        summed, band, limbs = summed_parts(f"{name}_x", x, exponent)
        df = df.withColumn(f"{name}_x", summed)
        df = df.withColumns(band).withColumns(limbs)  # each after the one it reads
        bands.append(f"{name}_x_e")
        slots += [f"{name}_x_e", *limbs]
        given.append(Input(x, F.col(f"{name}_x_e"), tuple(F.col(m) for m in limbs)))
    aggregates: list[Column] = []
    for (_, agg), its in zip(stage.partial.aggregates, given, strict=True):
        if isinstance(agg, Count) and agg.expr is None:  # count(): the events, read again
            continue
        aggregates += form_of(agg).columns(agg, its)
    return df, _Part(f"{p}starts", F.col(f"{p}earliest"), [*keys, *slots], keys, bands,
                     aggregates, sliding)


def _join(df: DataFrame, join: Join, prefix: str, keep: Column, cols: dict[str, Column]
          ) -> tuple[DataFrame, Column, dict[str, Column]]:
    """A lookup join on the shared row: a broadcast left join with the table under the
    stage's names; an inner join clears the stage's ``keep`` where no row matched."""
    key, hit = f"{prefix}on", f"{prefix}hit"
    table = lookup_table(df.sparkSession, join)
    table = table.select(*(F.col(_quoted(n)).alias(key if n == join.on else f"{prefix}{n}")
                           for n in table.columns), F.lit(True).alias(hit))
    df = df.withColumn(f"{prefix}by", cols[join.on])
    df = df.join(F.broadcast(table), F.col(f"{prefix}by") == F.col(key), "left")
    if join.how == "inner":
        df = df.withColumn(f"{prefix}keep", keep & F.col(hit).isNotNull())
        keep = F.col(f"{prefix}keep")
    cols = {**cols, **{n: F.col(_quoted(f"{prefix}{n}")) for n in join.added}}
    return df, keep, cols


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
