"""The reference executor: a query's logical plan run in one Python process, as the oracle.

Records flow one at a time through the record steps to the windows and aggregates. Each input
stream (a source's records, or one site folder of an input directory) has its own watermark:
the largest event time of the units of input it has read before (the files before, in
landing order; the records before, for records given as dicts), less the window's delay; a
record that arrives for a window its stream has already closed is late, dropped from that
window and counted (``docs/dsl.md``, "Late records": a site applies the same rule, so how
its files fall into micro-batches changes nothing). Because
lateness is decided per stream, the order in which separate streams interleave does not
matter, and neither does where a filter sits. When the input ends every window closes, the
aggregates are extracted, and the steps after them run once per window. Nothing here is
clever: every rewrite and the distributed path must give the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jetstream.dsl import Query
from jetstream.errors import DataError, PlanError
from jetstream.events import EventInput, Rejects, read_streams
from jetstream.formats import DEFAULT_FORMAT
from jetstream.operators import (
    Join,
    KeyPartition,
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
from jetstream.results import WindowResult
from jetstream.schema import DataType, value_order

__all__ = ["LocalRun", "RunStats", "finish_from_partials", "run_local"]

Row = dict[str, Any]
WindowBounds = tuple[int, int]
StreamId = tuple[int, int]  # (source node, stream number)


@dataclass
class RunStats:
    """What happened to the input: records read, records late, records rejected (and why)."""

    records_in: int = 0
    late_records: int = 0
    rejects: Rejects = field(default_factory=Rejects)


class LocalRun(list[WindowResult]):
    """The results of :func:`run_local`, one per window in window order, plus ``stats``."""

    def __init__(self, results: Iterable[WindowResult], stats: RunStats) -> None:
        super().__init__(results)
        self.stats = stats


@dataclass
class _Batch:
    """One window's rows at the output of a step after an aggregate."""

    rows: list[Row]
    exact: bool
    error_bound: float


def run_local(query: Query,
              events: EventInput | Mapping[str, EventInput]) -> LocalRun:
    """Run ``query`` over a finite input and return one :class:`WindowResult` per window.

    Parameters
    ----------
    query
        The query to run (as written, or as rewritten by :func:`jetstream.optimize`).
    events
        Records as dicts (field -> value), or the path of a CSV file or of a directory of them
        (``DIR/<site>/*.csv``: one stream per folder) in the source's schema; for a query with
        several sources, a dict from source name to such an input.

    Returns
    -------
    LocalRun
        A list of WindowResult sorted by window; ``.stats`` counts late and malformed records.

    Raises
    ------
    PlanError
        If ``events`` does not say which records feed which source.
    DataError
        If a ``map`` function raises or returns a record without its declared columns.
    """
    plan = query.plan()
    stats = RunStats()
    executor = _Executor(plan, stats)
    for stream, unit, record in _arrivals(plan, events, stats.rejects):
        stats.records_in += 1
        executor.read(stream, unit, record)
    return LocalRun(executor.finish(query.name), stats)


def _arrivals(plan: LogicalPlan, events: EventInput | Mapping[str, EventInput],
              rejects: Rejects) -> Iterator[tuple[StreamId, int, Row]]:
    """(stream, unit, record) for every record that fits its source's schema, stream by
    stream (see :func:`jetstream.events.read_streams`)."""
    by_name: dict[str, list[int]] = {}
    for node in plan.topological():
        op = plan.op(node)
        if isinstance(op, Source):
            by_name.setdefault(op.name, []).append(node)
    if isinstance(events, Mapping):
        unknown = sorted(set(events) - set(by_name))
        if unknown:
            msg = (f"run_local: no source named {unknown[0]!r}; the query reads "
                   f"{', '.join(sorted(by_name))}")
            raise PlanError(msg)
        feeds = {name: events.get(name, ()) for name in by_name}
    elif len(by_name) == 1:
        feeds = {next(iter(by_name)): events}
    else:
        msg = (f"run_local: the query reads sources {', '.join(sorted(by_name))}; pass events "
               "as a dict {source name: events}")
        raise PlanError(msg)
    for name, feed in feeds.items():
        nodes = by_name[name]
        schema = plan.op(nodes[0]).schema
        if any(plan.op(n).schema != schema for n in nodes):
            msg = f"run_local: the sources named {name!r} have different schemas"
            raise PlanError(msg)
        # A source used twice in one plan reads the same streams.
        formats = {getattr(plan.op(n), "format", None) or DEFAULT_FORMAT for n in nodes}
        if len(formats) > 1:
            msg = f"run_local: the sources named {name!r} have different formats"
            raise PlanError(msg)
        [fmt] = formats
        for number, stream in enumerate(read_streams(feed, schema, rejects, fmt)):
            for unit, record in stream:
                for node in nodes:
                    yield (node, number), unit, record


class _Executor:
    def __init__(self, plan: LogicalPlan, stats: RunStats) -> None:
        self.plan = plan
        self.stats = stats
        # The largest event time of each stream's units before the one being read; that
        # unit's (its number, its largest event time so far).
        self.latest: dict[StreamId, int] = {}
        self.unit: dict[StreamId, tuple[int, int | None]] = {}
        self.groups: dict[int, dict[tuple[WindowBounds, tuple[Any, ...]], list[Any]]] = {}

    # -- records, one at a time -------------------------------------------------------------
    def read(self, stream: StreamId, unit: int, record: Row) -> None:
        node = stream[0]
        time = self.plan.op(node).schema.event_time
        if time is not None:
            current, reached = self.unit.get(stream, (unit, None))
            if current != unit and reached is not None:  # the unit before has been read
                self.latest[stream] = max(self.latest.get(stream, reached), reached)
                reached = None
            self.unit[stream] = (unit, record[time] if reached is None
                                 else max(reached, record[time]))
        self.arrive(node, record, None, stream)

    def arrive(self, node: int, row: Row, window: WindowBounds | None, stream: StreamId) -> None:
        op = self.plan.op(node)
        if isinstance(op, WindowAggregate):
            assert window is not None, "the DSL puts a window before every aggregate"
            self._accumulate(node, op, row, window)
            return
        for out_row, out_window in self._step(op, row, window, stream):
            for successor in self.plan.graph.successors(node):
                self.arrive(successor, out_row, out_window, stream)

    def _step(self, op: Operator, row: Row, window: WindowBounds | None,
              stream: StreamId) -> Iterator[tuple[Row, WindowBounds | None]]:
        if isinstance(op, Window):
            for bounds in self._open_windows(op, row, stream):
                yield row, bounds
        elif isinstance(op, Source | Union):
            yield row, window
        elif isinstance(op, Where | KeyPartition):
            if op.keeps(row):
                yield row, window
        elif isinstance(op, Join):
            if (joined := op.joined(row)) is not None:
                yield joined, window
        else:
            yield _transform(op, row), window

    def _open_windows(self, op: Window, row: Row, stream: StreamId) -> list[WindowBounds]:
        ts = row[op.time_column]
        if ts is None:
            self.stats.rejects.add(f"window {op.spec}", "missing event time", row)
            return []
        windows = op.spec.windows_of(ts)
        if stream not in self.latest:
            return windows
        watermark = self.latest[stream] - op.watermark_ms
        open_windows = [w for w in windows if w[1] > watermark]
        if len(open_windows) < len(windows):
            self.stats.late_records += 1
        return open_windows

    def _accumulate(self, node: int, op: WindowAggregate, row: Row,
                    window: WindowBounds) -> None:
        groups = self.groups.setdefault(node, {})
        key = tuple(row[k] for k in op.keys)
        accs = groups.get((window, key))
        if accs is None:
            accs = groups[(window, key)] = [agg.create() for _, agg in op.aggregates]
        for i, (_, agg) in enumerate(op.aggregates):
            value = None if agg.expr is None else agg.expr.evaluate(row)
            if agg.expr is None or value is not None:
                accs[i] = agg.add(accs[i], value)

    # -- windows, once the input has ended --------------------------------------------------
    def finish(self, query: str) -> list[WindowResult]:
        batches = {node: _output(op, self.groups.get(node, {}))
                   for node, op in ((n, self.plan.op(n)) for n in self.plan.topological())
                   if isinstance(op, WindowAggregate) and op.phase.reads_records}
        return _finish(self.plan, query, batches)


def _finish(plan: LogicalPlan, query: str, batches: dict[int, dict[WindowBounds, _Batch]]
            ) -> list[WindowResult]:
    """Run the steps after the aggregates, window by window, from the aggregates' output."""
    for node in plan.topological():
        if node not in batches and (inputs := plan.inputs(node)) and all(
                i in batches for i in inputs):
            batches[node] = _window_step(plan.op(node), [batches[i] for i in inputs])
    # A window is reported when it has rows, wherever the filters that emptied it sit.
    return [WindowResult(query, start, end, b.rows, b.exact, b.error_bound)
            for (start, end), b in sorted(batches[plan.sink].items()) if b.rows]


def finish_from_partials(query: Query, partials: Mapping[WindowBounds, list[Row]]
                         ) -> list[WindowResult]:
    """The results of a split query from its merged partial rows, window by window.

    ``query`` is the optimized query (it has partial aggregates); ``partials`` holds, per
    window, the partial rows of all its inputs merged or not: the final step merges them. This
    is what the root of the aggregation tree runs, with the reference executor's own steps.
    """
    plan = query.plan()
    nodes = plan.partial_aggregates()
    if not nodes:
        msg = f"query {query.name} has no partial aggregates; optimize it first"
        raise PlanError(msg)
    batches: dict[int, dict[WindowBounds, _Batch]] = {node: {} for node in nodes}
    for window, rows in partials.items():  # all rows enter at one partial: a union follows
        batches[nodes[0]][window] = _Batch(list(rows), True, 0.0)
    return _finish(plan, query.name, batches)


def _output(op: WindowAggregate, groups: Mapping[tuple[WindowBounds, tuple[Any, ...]], list[Any]]
            ) -> dict[WindowBounds, _Batch]:
    """Each window's rows from an aggregate's accumulators: values, or compacted partials."""
    out: dict[WindowBounds, _Batch] = {}
    for (window, key), accs in sorted(groups.items(), key=_group_order):
        batch = out.setdefault(window, _Batch([], op.exact, 0.0))
        row = dict(zip(op.keys, key, strict=True))
        for (name, agg), acc in zip(op.aggregates, accs, strict=True):
            if op.phase.extracts:
                row[name] = agg.extract(acc)
                batch.error_bound = max(batch.error_bound, agg.error_bound(acc))
                batch.exact = batch.exact and agg.is_exact(acc)
            else:
                row[name] = agg.compact(acc)
        batch.rows.append(row)
    return out


def _merge(op: WindowAggregate, batches: Mapping[WindowBounds, _Batch]
           ) -> dict[tuple[WindowBounds, tuple[Any, ...]], list[Any]]:
    """Partial rows merged per window and key, into fresh accumulators."""
    groups: dict[tuple[WindowBounds, tuple[Any, ...]], list[Any]] = {}
    for window, batch in batches.items():
        for row in batch.rows:
            key = tuple(row[k] for k in op.keys)
            accs = groups.setdefault((window, key), [agg.create() for _, agg in op.aggregates])
            for i, (name, agg) in enumerate(op.aggregates):
                accs[i] = agg.merge(accs[i], row[name])
    return groups


def _group_order(item: tuple[tuple[WindowBounds, tuple[Any, ...]], Any]) -> Any:
    (window, key), _ = item
    return window, tuple((v is None, v) for v in key)


def _transform(op: Operator, row: Row) -> Row:
    """The one output record of a record-to-record step."""
    if isinstance(op, WithColumn):
        return {**row, op.name: op.expr.evaluate(row)}
    if isinstance(op, Select):
        return {name: expr.evaluate(row) for name, expr in op.columns}
    if isinstance(op, Map):
        return map_record(op, row)
    msg = f"{op.kind} cannot run record by record"
    raise PlanError(msg)


def map_record(op: Map, row: Row) -> Row:
    """The record ``op``'s function makes of ``row``, with the step's columns; a DataError
    if the function raises or returns something else (the Spark stage runs this too)."""
    try:
        out = op.fn(dict(row))
    except Exception as e:
        msg = f"map {op.label}: the function raised {type(e).__name__}: {e} on {row}"
        raise DataError(msg) from e
    missing = [n for n in op.schema.names if not isinstance(out, Mapping) or n not in out]
    if missing:
        msg = f"map {op.label}: the function returned {out!r}, which lacks {missing[0]!r}"
        raise DataError(msg)
    # A float column holds floats, whatever number the function returned.
    return {f.name: float(out[f.name]) if f.dtype is DataType.FLOAT and out[f.name] is not None
            else out[f.name] for f in op.schema}


def _window_step(op: Operator, inputs: list[dict[WindowBounds, _Batch]]
                 ) -> dict[WindowBounds, _Batch]:
    """One step after an aggregate, applied to each window's rows."""
    if isinstance(op, Union):
        out: dict[WindowBounds, _Batch] = {}
        for batches in inputs:
            for window, b in batches.items():
                merged = out.setdefault(window, _Batch([], True, 0.0))
                merged.rows += b.rows
                merged.exact = merged.exact and b.exact
                merged.error_bound = max(merged.error_bound, b.error_bound)
        return out
    (batches,) = inputs
    if isinstance(op, WindowAggregate):  # a merge or final step over partials
        values = _output(op, _merge(op, batches))
        return {window: values.get(window, _Batch([], op.exact, 0.0)) for window in batches}
    return {window: _Batch(_rows_step(op, b.rows), b.exact, b.error_bound)
            for window, b in batches.items()}


def _rows_step(op: Operator, rows: list[Row]) -> list[Row]:
    if isinstance(op, Where | KeyPartition):
        return [r for r in rows if op.keeps(r)]
    if isinstance(op, TopK):
        # Ties go to the smaller group key, then to the smaller other columns: a total order
        # on what a row holds, so the top k never depends on the order rows arrived in.
        columns = [*op.tie_break, *(c for c in op.schema.names if c not in op.tie_break)]
        ranked = sorted(rows, key=lambda r: tuple(value_order(r[c]) for c in columns))
        # Python's sort is stable also in reverse, so ties keep that order.
        ranked.sort(key=lambda r: _rank(r[op.by]), reverse=True)
        return ranked[: op.k]
    return [_transform(op, r) for r in rows]


def _rank(value: Any) -> tuple[bool, Any]:
    """A sort key that puts NULL below every value."""
    return (False, 0) if value is None else (True, value)
