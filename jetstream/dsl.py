"""The query DSL: ``js.source(...)`` gives a :class:`Stream`; its methods build the logical plan.

Every method checks its step against the input schema at once and refuses misuse with a
:class:`~jetstream.errors.PlanError` that names the step and the column, so a bad query never
starts running.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from jetstream.aggregates import Aggregate
from jetstream.errors import PlanError
from jetstream.expr import Col, Expr, Lit
from jetstream.formats import check_format
from jetstream.operators import (
    Join,
    Map,
    Operator,
    Select,
    Source,
    TopK,
    Union,
    Where,
    Window,
    WindowAggregate,
    WithColumn,
)
from jetstream.plan import LogicalPlan
from jetstream.schema import DataType, Schema
from jetstream.tables import Table
from jetstream.windows import WindowSpec, format_duration, parse_duration

__all__ = ["SLO", "GroupedStream", "Query", "Stream", "reading", "source"]


def _fail(step: str, problem: str) -> PlanError:
    return PlanError(f"{step}: {problem}")


def _typed(step: str, expr: Expr, schema: Schema) -> DataType:
    """The type of ``expr``, or a PlanError prefixed with the step that used it."""
    if not isinstance(expr, Expr):
        raise _fail(step, f"expected an expression such as col('x') > 1, not {expr!r}")
    try:
        return expr.dtype(schema)
    except PlanError as e:
        raise _fail(step, str(e)) from None


def source(name: str, schema: Schema, format: str | None = None) -> Stream:
    """The stream of records named ``name`` (one per site once the query is distributed).
    ``format``: its files' -- ``"csv"`` (a header row), ``"json"`` (JSON lines) or
    ``"parquet"``, gzip-compressed or not (``.gz``); None, as the sites declare the source
    (CSV if they do not)."""
    if not isinstance(name, str) or not name:
        raise _fail("source", f"a source needs a non-empty name, not {name!r}")
    if not isinstance(schema, Schema):
        raise _fail(f"source {name}", "schema must be a js.Schema, e.g. js.CDN_LOG_SCHEMA")
    if format is not None:
        check_format(format, f"source {name}")
    return Stream(LogicalPlan.leaf(Source(name=name, schema=schema, format=format)))


@dataclass(frozen=True, eq=False)
class Stream:
    """A handle on one node of a logical plan; every method returns a new Stream."""

    plan: LogicalPlan

    @property
    def schema(self) -> Schema:
        return self.plan.output.schema

    @property
    def window_op(self) -> Window | None:
        return self.plan.window_of(self.plan.sink)

    @property
    def aggregate_op(self) -> WindowAggregate | None:
        return self.plan.aggregate_of(self.plan.sink)

    def _then(self, op: Operator, *others: Stream) -> Stream:
        return Stream(self.plan.then(op, *(o.plan for o in others)))

    # -- stateless steps --------------------------------------------------------------------
    def where(self, condition: Expr) -> Stream:
        """Keep the records where ``condition`` holds; after an aggregate this is SQL's HAVING."""
        step = "having" if self.aggregate_op else "where"
        if _typed(step, condition, self.schema) is not DataType.BOOL:
            raise _fail(step, f"{condition} is not a condition; compare it, e.g. {condition} > 0")
        return self._then(Where(schema=self.schema, predicate=condition))

    def with_column(self, name: str, expr: Expr | Any) -> Stream:
        """Add (or replace) the column ``name`` computed by ``expr``."""
        step = f"with_column {name}"
        _check_name(step, name)
        expr = expr if isinstance(expr, Expr) else _literal(step, expr)
        dtype = _typed(step, expr, self.schema)
        return self._then(WithColumn(schema=self.schema.with_field(name, dtype),
                                     name=name, expr=expr))

    def select(self, /, *columns: str | Expr, **named: Expr) -> Stream:
        """Keep the listed columns (names or ``col``s) and named expressions, in that order."""
        items: list[tuple[str, Expr]] = []
        for c in columns:
            if isinstance(c, str):
                items.append((c, Col(c)))
            elif isinstance(c, Col):
                items.append((c.name, c))
            else:
                raise _fail("select", f"{c!r} needs a name; pass it as select(name=expr)")
        items += named.items()
        if not items:
            raise _fail("select", "no columns given")
        names = [n for n, _ in items]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise _fail("select", f"column {dupes[0]!r} is selected twice")
        fields = {n: _typed(f"select {n}", e, self.schema) for n, e in items}
        time = self.schema.event_time
        keeps_time = any(isinstance(e, Col) and n == e.name == time for n, e in items)
        schema = Schema.of(fields, time if keeps_time else None)
        return self._then(Select(schema=schema, columns=tuple(items)))

    def map(self, fn: Callable[[dict[str, Any]], Mapping[str, Any]], *,
            schema: Schema | Mapping[str, DataType] | None = None,
            monotonic: bool = False, changes: Iterable[str] | None = None,
            name: str | None = None) -> Stream:
        """Apply an opaque Python function to each record (a dict), giving one record.

        ``schema`` is the output schema (default: unchanged). Two promises let the rewriter
        move filters past the function: ``changes`` names the only columns it may set (default:
        any), and ``monotonic=True`` says each output column is non-decreasing in the input
        column of the same name.
        """
        label = name or str(getattr(fn, "__name__", "function"))
        step = f"map {label}"
        if not callable(fn):
            raise _fail(step, f"{fn!r} is not callable")
        fields = dict(self.schema.fields_by_name() if schema is None else
                      {f.name: f.dtype for f in schema} if isinstance(schema, Schema) else schema)
        # Event time comes from the sources, so a map can keep the time column but not add one.
        event_time = self.schema.event_time if self.schema.event_time in fields else None
        out = Schema.of(fields, event_time)
        changed = None if changes is None else frozenset(changes)
        if changed is not None and (unknown := sorted(changed - set(out.names))):
            raise _fail(step, f"changes names unknown column {unknown[0]!r}")
        if changed is not None and (added := sorted(set(out.names) - set(self.schema.names)
                                                    - changed)):
            raise _fail(step, f"the function adds column {added[0]!r}, so changes must name it")
        return self._then(Map(schema=out, fn=fn, label=label, monotonic=bool(monotonic),
                              changes=changed))

    def join(self, table: Table, on: str, how: str = "inner") -> Stream:
        """Add to each record the columns of ``table``'s row whose ``on`` column equals the
        record's (a lookup join; the table holds one row per value). ``how="inner"`` drops a
        record with no such row, ``"left"`` keeps it with NULLs. The join runs at the edge,
        next to the data, before any window."""
        step = f"join {getattr(table, 'name', table)!s} on {on}"
        if not isinstance(table, Table):
            raise _fail(step, f"expected a js.table(...), not {table!r}")
        if how not in ("inner", "left"):
            raise _fail(step, f"how is 'inner' or 'left', not {how!r}")
        if self.window_op is not None:
            raise _fail(step, "join the records before the window (a join adds columns to "
                              "each record)")
        if on not in self.schema:
            raise _fail(step, f"unknown column {on!r}; the input has "
                              f"{', '.join(self.schema.names)}")
        if on not in table.schema:
            raise _fail(step, f"the table has no column {on!r}; it has "
                              f"{', '.join(table.schema.names)}")
        mine, theirs = self.schema.dtype(on), table.schema.dtype(on)
        if mine is not theirs:
            raise _fail(step, f"{on} is {mine.value} here but {theirs.value} in the table; "
                              "declare the same type in the table's schema")
        table.index(on)  # refuse a table with two rows for one value now
        fields = self.schema.fields_by_name()
        for f in table.schema:
            if f.name != on and f.name in fields:
                raise _fail(step, f"the table's column {f.name!r} is already a column of the "
                                  "stream; rename it in the table (its header and schema)")
            fields.setdefault(f.name, f.dtype)
        return self._then(Join(schema=Schema.of(fields, self.schema.event_time), table=table,
                               on=on, how=how))

    def union(self, *others: Stream) -> Stream:
        """All records of this stream and of ``others`` (same columns, same windowing)."""
        if not others:
            raise _fail("union", "give at least one other stream")
        for other in others:
            if not isinstance(other, Stream):
                raise _fail("union", f"expected a Stream, not {other!r}")
            if set(other.schema.fields) != set(self.schema.fields):
                raise _fail("union", f"the inputs differ in columns: {self.schema} "
                                     f"vs {other.schema}")
            if _window_key(other.window_op) != _window_key(self.window_op) or (
                    (other.aggregate_op is None) != (self.aggregate_op is None)):
                raise _fail("union", "the inputs are windowed or aggregated differently; "
                                     "union the raw streams, then window once")
        return self._then(Union(schema=self.schema), *others)

    # -- windows and aggregates -------------------------------------------------------------
    def window(self, spec: WindowSpec, watermark: str | dt.timedelta = "0s",
               early: str | dt.timedelta | None = None) -> Stream:
        """Group the stream into event-time windows (``js.tumbling`` or ``js.sliding``).

        Records are assigned by the schema's event time column (``ts`` for CDN logs).
        ``watermark`` is how long to wait for out-of-order records: a stream's watermark is
        the largest event time its source has produced, less this delay, and a window closes
        for that stream once the watermark reaches the window's end.

        ``early`` (at most ``watermark``; default half of it): a live site sends a window on
        once the largest event time it has read is this far past the window's end, while the
        watermark still holds it open, so that a thin link carries it before it closes; the
        root still waits for the watermark. Records for it that come later send it again at
        close, whole. Set it to how out of order the records are; results do not change.
        """
        if not isinstance(spec, WindowSpec):
            raise _fail("window", f"expected js.tumbling(...) or js.sliding(...), not {spec!r}")
        if self.window_op is not None:
            raise _fail("window", f"the stream is already windowed by {self.window_op.spec}")
        time = self.schema.event_time
        if time is None:
            raise _fail("window", "the input has no event time column; keep the source's "
                                  "event time column (e.g. ts) in select and map")
        watermark_ms = parse_duration(watermark, "window watermark")
        early_ms = None if early is None else parse_duration(early, "window early")
        if early_ms is not None and early_ms > watermark_ms:
            raise _fail("window", f"early={format_duration(early_ms)} is past the watermark "
                                  f"({format_duration(watermark_ms)}): a window closes then; "
                                  "give early at most the watermark")
        return self._then(Window(schema=self.schema, spec=spec, watermark_ms=watermark_ms,
                                 time_column=time, early_ms=early_ms))

    def group_by(self, *keys: str, rollup: Mapping[str, Expr] | None = None) -> GroupedStream:
        """Group each window's records by the values of ``keys``; follow with ``.agg(...)``.

        ``rollup`` declares coarser values a key may be reported at when a link cannot carry
        its rows: ``group_by("url", rollup={"url": col("url").url_domain()})``. A degraded
        window then goes with its rows rolled up to those values, and its result says so
        (``rolled_up``). Each expression reads only its own key and keeps its type; the
        query's rows must be the aggregate's (no top_k or step after it).
        """
        for key in keys:
            if not isinstance(key, str):
                raise _fail("group_by", f"keys are column names, not {key!r}; add the column "
                                        "with with_column first")
            if key not in self.schema:
                raise _fail("group_by", f"unknown column {key!r}; the input has "
                                        f"{', '.join(self.schema.names)}")
            if self.schema.dtype(key) is DataType.LIST:
                raise _fail("group_by", f"column {key!r} is a list and cannot be a key")
        if len(set(keys)) != len(keys):
            raise _fail("group_by", "a key is listed twice")
        return GroupedStream(self, tuple(keys), _rollup(keys, rollup or {}, self.schema))

    def agg(self, /, **aggregates: Aggregate) -> Stream:
        """Aggregate each whole window (no group key)."""
        return GroupedStream(self, ()).agg(**aggregates)

    def top_k(self, k: int, by: str) -> Stream:
        """Per window, the ``k`` rows with the largest ``by`` (ties: smaller group key first)."""
        step = f"top_k by {by}"
        aggregate = self.aggregate_op
        if aggregate is None:
            raise _fail(step, "needs an aggregated stream; call .group_by(...).agg(...) first")
        if aggregate.rollup:
            raise _fail(step, f"the aggregate may roll up {_keys(aggregate.rollup)}, and a "
                              "rolled-up window would rank the coarser values instead of "
                              "the rows; drop the top_k or the group_by's rollup")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise _fail(step, f"k must be a positive integer, not {k!r}")
        if by not in self.schema:
            raise _fail(step, f"unknown column {by!r}; the input has "
                              f"{', '.join(self.schema.names)}")
        if self.schema.dtype(by) in (DataType.LIST, DataType.BOOL):
            raise _fail(step, f"column {by!r} is {self.schema.dtype(by).value} and cannot rank")
        tie_break = tuple(key for key in aggregate.keys if key in self.schema)
        return self._then(TopK(schema=self.schema, k=k, by=by, tie_break=tie_break))


@dataclass(frozen=True, eq=False)
class GroupedStream:
    stream: Stream
    keys: tuple[str, ...]
    rollup: tuple[tuple[str, Expr], ...] = ()

    def agg(self, /, **aggregates: Aggregate) -> Stream:
        """Compute the named aggregates per window and key: ``.agg(n=js.count())``."""
        stream, step = self.stream, "agg"
        if not aggregates:
            raise _fail(step, "give at least one aggregate, e.g. .agg(requests=js.count())")
        if stream.aggregate_op is not None:
            raise _fail(step, "the stream is already aggregated; nested aggregation is not "
                              "supported")
        if stream.window_op is None:
            raise _fail(step, "the stream has no window; add .window(js.tumbling('10s')) "
                              "before group_by")
        fields = {key: stream.schema.dtype(key) for key in self.keys}
        for name, agg in aggregates.items():
            if not isinstance(agg, Aggregate):
                raise _fail(f"{step} {name}", f"expected an aggregate such as js.count(), "
                                              f"not {agg!r}")
            if name in fields:
                raise _fail(f"{step} {name}", "the name is already a group key")
            try:
                fields[name] = agg.result_type(stream.schema)
            except PlanError as e:
                raise _fail(f"{step} {name}", str(e)) from None
        op = WindowAggregate(schema=Schema.of(fields), keys=self.keys,
                             aggregates=tuple(aggregates.items()), rollup=self.rollup)
        return stream._then(op)


def _rollup(keys: tuple[str, ...], rollup: Mapping[str, Expr],
            schema: Schema) -> tuple[tuple[str, Expr], ...]:
    """``group_by``'s ``rollup``, checked: each an expression of its own key alone, of its
    type."""
    if not isinstance(rollup, Mapping):
        raise _fail("group_by", f"rollup maps a key to its coarser value, e.g. "
                                f"{{'url': col('url').url_domain()}}, not {rollup!r}")
    for key, expr in rollup.items():
        step = f"group_by rollup of {key!r}"
        if key not in keys:
            raise _fail(step, f"{key!r} is not a group key; roll up one of {', '.join(keys)}")
        dtype = _typed(step, expr, schema)
        if expr.columns() != {key}:
            raise _fail(step, f"{expr} reads {', '.join(sorted(expr.columns())) or 'no column'}; "
                              f"a roll-up maps {key}'s own value to a coarser one, so it "
                              f"reads {key} alone")
        if dtype is not schema.dtype(key):
            raise _fail(step, f"{expr} is {dtype.value} but {key} is "
                              f"{schema.dtype(key).value}; a rolled-up value replaces the key's")
    return tuple(rollup.items())


def _keys(rollup: tuple[tuple[str, Expr], ...]) -> str:
    return ", ".join(key for key, _ in rollup)


def _window_key(window: Window | None) -> tuple[Any, ...] | None:
    return None if window is None else (window.spec, window.watermark_ms, window.time_column)


def _check_name(step: str, name: str) -> None:
    if not isinstance(name, str) or not name:
        raise _fail(step, f"a column name must be a non-empty string, not {name!r}")


def _literal(step: str, value: Any) -> Expr:
    try:
        return Lit(value)
    except PlanError as e:
        raise _fail(step, str(e)) from None


@dataclass(frozen=True)
class SLO:
    """What the user asks of a query's results.

    ``max_latency``: from a window's end to its result (e.g. ``"3s"``); ``max_error``: the
    largest relative error an approximate result may carry (None: any, 0: exact only);
    ``max_wan_kbps``: a cap on the wide-area bandwidth the query may use.
    """

    max_latency: str | dt.timedelta | None = None
    max_error: float | None = None
    max_wan_kbps: float | None = None
    max_latency_ms: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.max_latency is not None:
            ms = parse_duration(self.max_latency, "slo max_latency")
            if ms <= 0:
                raise _fail("slo", f"max_latency must be positive, not {self.max_latency!r}")
            object.__setattr__(self, "max_latency_ms", ms)
        if self.max_error is not None and (
                not isinstance(self.max_error, int | float) or not 0 <= self.max_error < 1):
            raise _fail("slo", f"max_error is a fraction in [0, 1), not {self.max_error!r}")
        if self.max_wan_kbps is not None and (
                not isinstance(self.max_wan_kbps, int | float) or self.max_wan_kbps <= 0):
            raise _fail("slo", f"max_wan_kbps must be a positive number, "
                               f"not {self.max_wan_kbps!r}")

    def __str__(self) -> str:
        parts = [f"{name}={value}" for name, value in (
            ("max_latency", self.max_latency), ("max_error", self.max_error),
            ("max_wan_kbps", self.max_wan_kbps)) if value is not None]
        return ", ".join(parts) or "none"


@dataclass(frozen=True, eq=False)
class Query:
    """A named stream whose output is aggregated per window, with its service-level objective."""

    name: str
    stream: Stream
    slo: SLO = field(default_factory=SLO)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise _fail("query", f"a query needs a non-empty name, not {self.name!r}")
        if not isinstance(self.stream, Stream):
            raise _fail(f"query {self.name}", f"expected a Stream, not {self.stream!r}")
        if not isinstance(self.slo, SLO):
            raise _fail(f"query {self.name}", "slo must be a js.SLO(...)")
        aggregate = self.stream.aggregate_op
        if aggregate is None:
            raise _fail(f"query {self.name}", "the output is not aggregated; end the query "
                                              "with .window(...).group_by(...).agg(...)")
        last = self.stream.plan.output
        if aggregate.rollup and last is not aggregate:
            raise _fail(f"query {self.name}",
                        f"the aggregate may roll up {_keys(aggregate.rollup)}, so its rows "
                        f"must be the result: a step after it ({last.describe()}) would see "
                        "coarser rows; drop the step or the group_by's rollup")

    def plan(self) -> LogicalPlan:
        return self.stream.plan

    def describe(self) -> str:
        """The query's logical plan as written, under its name and SLO."""
        return self.plan().render(f"query {self.name}  (slo: {self.slo})")


def reading(query: Query, formats: Mapping[str, str]) -> Query:
    """``query`` with each of its sources that names no format reading ``formats[name]``
    (what the sites declare), the others as they are; ``query`` itself if none changes."""
    graph = query.stream.plan.graph.copy()
    changed = [node for node, op in graph.nodes(data="op")
               if isinstance(op, Source) and op.format is None and op.name in formats]
    for node in changed:
        op = graph.nodes[node]["op"]
        graph.nodes[node]["op"] = replace(op, format=formats[op.name])
    if not changed:
        return query
    return replace(query, stream=Stream(LogicalPlan(graph, query.stream.plan.sink)))
