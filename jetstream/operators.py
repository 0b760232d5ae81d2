"""The operators of the logical graph: frozen nodes that carry their output schema.

Each operator knows its semantic properties (``stateless``, ``keyed_by``, ``monotonic_in``,
``decomposable``) so rewrites can reason about it without executing anything. Operators are
changed with :func:`dataclasses.replace`, never in place.
"""

from __future__ import annotations

import bisect
import enum
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from jetstream.aggregates import Aggregate
from jetstream.errors import PlanError
from jetstream.expr import Col, Expr, Monotonicity
from jetstream.schema import Schema
from jetstream.tables import Table
from jetstream.windows import WindowSpec, format_duration

__all__ = [
    "Join",
    "KeyPartition",
    "Map",
    "Operator",
    "Phase",
    "Select",
    "Source",
    "TopK",
    "Union",
    "Where",
    "Window",
    "WindowAggregate",
    "WithColumn",
    "early_after",
    "hash_partition",
]


@dataclass(frozen=True, eq=False, kw_only=True)
class Operator:
    """Base of every logical operator; ``schema`` is the schema of its output."""

    schema: Schema
    kind: ClassVar[str]
    #: Whether each output record depends on one input record only.
    stateless: ClassVar[bool] = True

    @property
    def keyed_by(self) -> tuple[str, ...]:
        """The group key this operator partitions its state by; () if it keeps none."""
        return ()

    @property
    def writes(self) -> frozenset[str] | None:
        """The columns whose values this operator may set or change; None: it may change any."""
        return frozenset()

    def monotonic_in(self) -> dict[str, Monotonicity]:
        """For each input column the output moves with, the direction it moves."""
        return {}

    def describe(self) -> str:
        """One readable line: the operator and its arguments."""
        return self.kind

    def properties(self) -> list[str]:
        props = ["stateless"] if self.stateless else ["stateful"]
        if self.keyed_by:
            props.append("keyed_by=" + ",".join(self.keyed_by))
        props += [f"{m.value} in {c}" for c, m in sorted(self.monotonic_in().items())
                  if m in (Monotonicity.INCREASING, Monotonicity.DECREASING)]
        return props


@dataclass(frozen=True, eq=False, kw_only=True)
class Source(Operator):
    """The records named ``name``; ``format`` is their files' (:mod:`jetstream.formats`), or
    None: as the sites that hold the source declare it (CSV if they do not)."""

    name: str
    format: str | None = None
    kind: ClassVar[str] = "source"

    def describe(self) -> str:
        return f"source {self.name}" + (f" ({self.format})" if self.format else "")


@dataclass(frozen=True, eq=False, kw_only=True)
class Where(Operator):
    """Keeps the records for which ``predicate`` is true (NULL counts as false)."""

    predicate: Expr
    #: A conservative copy kept in place above a relaxed filter the rewriter pushed down.
    pinned: bool = False
    kind: ClassVar[str] = "where"

    def keeps(self, row: Mapping[str, Any]) -> bool:
        return self.predicate.evaluate(row) is True

    def describe(self) -> str:
        return f"where {self.predicate}" + (" (exact check, kept)" if self.pinned else "")


@dataclass(frozen=True, eq=False, kw_only=True)
class Select(Operator):
    columns: tuple[tuple[str, Expr], ...]
    kind: ClassVar[str] = "select"

    @property
    def writes(self) -> frozenset[str] | None:
        return frozenset(name for name, expr in self.columns
                         if not (isinstance(expr, Col) and expr.name == name))

    def monotonic_in(self) -> dict[str, Monotonicity]:
        return _combined(expr for _, expr in self.columns)

    def describe(self) -> str:
        items = (name if str(expr) == name else f"{name} = {expr}" for name, expr in self.columns)
        return "select " + ", ".join(items)


@dataclass(frozen=True, eq=False, kw_only=True)
class WithColumn(Operator):
    name: str
    expr: Expr
    kind: ClassVar[str] = "with_column"

    @property
    def writes(self) -> frozenset[str] | None:
        return frozenset((self.name,))

    def monotonic_in(self) -> dict[str, Monotonicity]:
        return _combined([self.expr])

    def describe(self) -> str:
        return f"with_column {self.name} = {self.expr}"


@dataclass(frozen=True, eq=False, kw_only=True)
class Map(Operator):
    """An opaque Python function from one record (a dict) to one record.

    ``monotonic`` is the user's promise that every output column is non-decreasing in the
    input column of the same name; ``changes``, that it sets no column outside that set
    (None: it may set any). Nothing else is known about ``fn``.
    """

    fn: Callable[[dict[str, Any]], Mapping[str, Any]]
    label: str
    monotonic: bool = False
    changes: frozenset[str] | None = None
    kind: ClassVar[str] = "map"

    @property
    def writes(self) -> frozenset[str] | None:
        return self.changes

    def monotonic_in(self) -> dict[str, Monotonicity]:
        if not self.monotonic:
            return {}
        return {name: Monotonicity.INCREASING for name in self.schema.names}

    def describe(self) -> str:
        notes = (["monotonic"] if self.monotonic else []) + (
            [f"changes {', '.join(sorted(self.changes)) or 'nothing'}"]
            if self.changes is not None else [])
        return f"map {self.label}" + (f" ({'; '.join(notes)})" if notes else "")


@dataclass(frozen=True, eq=False, kw_only=True)
class Join(Operator):
    """A lookup join with a static table: each record gets the columns of the table's row
    whose ``on`` equals the record's (one row a value). ``inner`` drops a record with no such
    row, ``left`` keeps it with NULLs; a NULL ``on`` matches nothing."""

    table: Table
    on: str
    how: str = "inner"
    kind: ClassVar[str] = "join"

    @property
    def added(self) -> tuple[str, ...]:
        """The table's columns that the join adds to each record."""
        return tuple(n for n in self.table.schema.names if n != self.on)

    @property
    def writes(self) -> frozenset[str] | None:
        return frozenset(self.added)

    def joined(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        """``row`` with the table's columns, or None when an inner join drops it."""
        match = self.table.index(self.on).get(row[self.on])
        if match is None and self.how == "inner":
            return None
        return {**row, **{n: None if match is None else match[n] for n in self.added}}

    def describe(self) -> str:
        return f"{self.how} join {self.table.name} on {self.on}"


@dataclass(frozen=True, eq=False, kw_only=True)
class Union(Operator):
    """The records of all inputs, in arrival order; inputs have the same schema."""

    kind: ClassVar[str] = "union"


def early_after(watermark_ms: int, early_ms: int | None) -> int:
    """How far past a window's end its stage's event time must be for it to go early:
    ``early_ms``, or half the watermark delay when not given."""
    return watermark_ms // 2 if early_ms is None else early_ms


@dataclass(frozen=True, eq=False, kw_only=True)
class Window(Operator):
    """Assigns each record to the event-time windows of ``spec``.

    A window closes once the watermark (the largest event time seen, less ``watermark_ms``)
    reaches its end; a record arriving for a closed window is late and dropped. A live site
    sends it on early, while the watermark holds it open, once the largest event time seen
    is ``early_ms`` past its end (None: half the watermark delay; see
    :mod:`jetstream.stage.bookkeeping`); the results are the same.
    """

    spec: WindowSpec
    watermark_ms: int
    time_column: str
    early_ms: int | None = None
    kind: ClassVar[str] = "window"

    @property
    def early_after_ms(self) -> int:
        """How far past a window's end the event time read must be for it to go early."""
        return early_after(self.watermark_ms, self.early_ms)

    def describe(self) -> str:
        early = ("" if self.early_ms is None
                 else f", early {format_duration(self.early_ms)}")
        return (f"window {self.spec} on {self.time_column}, "
                f"watermark {format_duration(self.watermark_ms)}{early}")


class Phase(enum.Enum):
    """Which part of an aggregate's life a node runs (see :mod:`jetstream.aggregates`)."""

    COMPLETE = "complete"  # records in, values out: create, add, extract
    PARTIAL = "partial"  # records in, accumulators out: create, add, compact
    MERGE = "merge"  # accumulators in, accumulators out: merge, compact
    FINAL = "final"  # accumulators in, values out: merge, extract

    @property
    def reads_records(self) -> bool:
        return self in (Phase.COMPLETE, Phase.PARTIAL)

    @property
    def extracts(self) -> bool:
        return self in (Phase.COMPLETE, Phase.FINAL)


@dataclass(frozen=True, eq=False, kw_only=True)
class WindowAggregate(Operator):
    """Per window and group key, the named aggregates; output columns are keys then aggregates.

    ``phase`` splits one aggregate over sites: partials at the sources, merges on the way up,
    a final step that extracts the values (a complete aggregate does all of it in one place).
    """

    keys: tuple[str, ...]
    aggregates: tuple[tuple[str, Aggregate], ...]
    phase: Phase = Phase.COMPLETE
    #: Keys a degraded link may coarsen: each with an expression of that key alone giving
    #: its coarser value (``url`` to ``url_domain(url)``), see jetstream.approx.rollup.
    rollup: tuple[tuple[str, Expr], ...] = ()
    kind: ClassVar[str] = "aggregate"
    stateless: ClassVar[bool] = False

    @property
    def keyed_by(self) -> tuple[str, ...]:
        return self.keys

    @property
    def writes(self) -> frozenset[str] | None:
        return None

    @property
    def decomposable(self) -> bool:
        """Whether every aggregate can be split into partials and merges of bounded size."""
        return all(agg.decomposable for _, agg in self.aggregates)

    @property
    def exact(self) -> bool:
        return all(agg.exact for _, agg in self.aggregates)

    def describe(self) -> str:
        aggs = ", ".join(f"{name}={agg}" for name, agg in self.aggregates)
        by = f" by {', '.join(self.keys)}" if self.keys else ""
        phase = "" if self.phase is Phase.COMPLETE else f"{self.phase.value} "
        rollup = "".join(f"; {key} rolls up to {expr}" for key, expr in self.rollup)
        return f"{phase}aggregate{by}: {aggs}{rollup}"

    def properties(self) -> list[str]:
        return [*super().properties(),
                "decomposable" if self.decomposable else "holistic"]


def hash_partition(key: tuple[Any, ...], count: int) -> int:
    """Which of ``count`` hash partitions a group key falls in: the same in every process
    (Python's own hash of a str changes from process to process)."""
    return zlib.crc32(repr(key).encode()) % count


@dataclass(frozen=True, eq=False, kw_only=True)
class KeyPartition(Operator):
    """Keeps the rows whose group key falls in partition ``index`` of ``count`` (an exchange).

    By hash of the key, or, given ``bounds`` (``count - 1`` ascending split points on the
    first key), by range: partition i holds keys in ``[bounds[i-1], bounds[i])``. The
    partitions of one exchange are disjoint and together hold every row.
    """

    keys: tuple[str, ...]
    index: int
    count: int
    bounds: tuple[Any, ...] | None = None
    kind: ClassVar[str] = "partition"

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            msg = f"partition: index {self.index} is not in 0..{self.count - 1}"
            raise PlanError(msg)
        if self.bounds is not None and (len(self.bounds) != self.count - 1
                                        or list(self.bounds) != sorted(self.bounds)):
            msg = f"partition: {self.count} ranges need {self.count - 1} ascending bounds"
            raise PlanError(msg)

    def partition_of(self, row: Mapping[str, Any]) -> int:
        if self.bounds is not None:
            return bisect.bisect_right(self.bounds, row[self.keys[0]])
        return hash_partition(tuple(row[k] for k in self.keys), self.count)

    def keeps(self, row: Mapping[str, Any]) -> bool:
        return self.partition_of(row) == self.index

    def same_exchange(self, other: KeyPartition) -> bool:
        return (self.keys, self.count, self.bounds) == (other.keys, other.count, other.bounds)

    def describe(self) -> str:
        keys = ", ".join(self.keys)
        if self.bounds is None:
            return f"partition {self.index + 1}/{self.count} by hash({keys})"
        ends = [None, *self.bounds, None]
        low, high = (repr(e) if e is not None else "" for e in ends[self.index:self.index + 2])
        return f"partition {self.index + 1}/{self.count} by range({keys}) [{low}, {high})"


@dataclass(frozen=True, eq=False, kw_only=True)
class TopK(Operator):
    """Per window, the ``k`` rows with the largest ``by``; ties go to the smaller ``tie_break``
    (the group keys), then to the smaller other columns, so the order is total."""

    k: int
    by: str
    tie_break: tuple[str, ...]
    #: A partial top_k on one input of a union; the final one stays above the union.
    per_input: bool = False
    kind: ClassVar[str] = "top_k"
    stateless: ClassVar[bool] = False

    def describe(self) -> str:
        return f"top_k {self.k} by {self.by}" + (" (partial)" if self.per_input else "")


def _combined(exprs: Any) -> dict[str, Monotonicity]:
    """Per input column, the direction that every expression agrees on."""
    result: dict[str, Monotonicity] = {}
    for expr in exprs:
        for column in expr.columns():
            m = expr.monotonicity(column)
            result[column] = m if column not in result else result[column].plus(m)
    return result
