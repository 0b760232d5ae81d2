"""The reference executor: a query's logical plan run in one Python process, as the oracle.

Records arrive one at a time and flow through the stateless steps to the windows; each
window node keeps a watermark (the largest event time it has seen, less the allowed lateness)
and drops a record from any window that has already closed, counting it as late. When the
input ends every window closes, the aggregates are extracted, and the steps after them run
once per window. Nothing here is clever: the distributed path must give the same answer.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jetstream.dsl import Query
from jetstream.errors import DataError, PlanError
from jetstream.events import EventInput, Rejects, read_streams
from jetstream.operators import (
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
from jetstream.schema import DataType, Schema

__all__ = ["LocalRun", "RunStats", "run_local"]

Row = dict[str, Any]
WindowBounds = tuple[int, int]


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
        The query to run (as written, or as rewritten by the optimizer).
    events
        Records as dicts (field -> value), or the path of a CSV file or a directory of them
        in the source's schema; for a query with several sources, a dict from source name to
        such an input. Separate streams (sources, and the site folders of a directory) are
        taken to arrive concurrently, advancing together in event time; within a stream,
        records arrive in the order given, so its out-of-order records can be late.

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
    for node, record in _arrivals(plan, events, stats):
        stats.records_in += 1
        executor.arrive(node, record, None)
    return LocalRun(executor.finish(query.name), stats)


def _arrivals(plan: LogicalPlan, events: EventInput | Mapping[str, EventInput],
              stats: RunStats) -> Iterator[tuple[int, Row]]:
    """(source node, record) in arrival order; each source's records are checked first."""
    by_name: dict[str, list[int]] = {}
    for node in plan.topological():
        op = plan.op(node)
        if isinstance(op, Source):
            by_name.setdefault(op.name, []).append(node)
    schemas = {name: plan.op(nodes[0]).schema for name, nodes in by_name.items()}
    for name, nodes in by_name.items():
        if any(plan.op(n).schema != schemas[name] for n in nodes):
            msg = f"run_local: the sources named {name!r} have different schemas"
            raise PlanError(msg)
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
    streams = [((name, record) for record in stream)
               for name, feed in feeds.items()
               for stream in read_streams(feed, schemas[name], stats.rejects)]
    for name, record in heapq.merge(*streams, key=lambda item: _event_time(schemas, item)):
        for node in by_name[name]:
            yield node, record


def _event_time(schemas: Mapping[str, Schema], item: tuple[str, Row]) -> int:
    """Concurrent streams are taken to advance together in event time."""
    name, record = item
    time = schemas[name].event_time
    return record[time] if time is not None else 0


class _Executor:
    def __init__(self, plan: LogicalPlan, stats: RunStats) -> None:
        self.plan = plan
        self.stats = stats
        self.max_event_time: dict[int, int] = {}
        self.groups: dict[int, dict[tuple[WindowBounds, tuple[Any, ...]], list[Any]]] = {}

    # -- records, one at a time -------------------------------------------------------------
    def arrive(self, node: int, row: Row, window: WindowBounds | None) -> None:
        op = self.plan.op(node)
        if isinstance(op, WindowAggregate):
            assert window is not None, "the DSL puts a window before every aggregate"
            self._accumulate(node, op, row, window)
            return
        for out_row, out_window in self._step(node, op, row, window):
            for successor in self.plan.graph.successors(node):
                self.arrive(successor, out_row, out_window)

    def _step(self, node: int, op: Operator, row: Row,
              window: WindowBounds | None) -> Iterator[tuple[Row, WindowBounds | None]]:
        if isinstance(op, Window):
            for bounds in self._open_windows(node, op, row):
                yield row, bounds
        elif isinstance(op, Source | Union):
            yield row, window
        elif isinstance(op, Where):
            if op.predicate.evaluate(row) is True:
                yield row, window
        else:
            yield _transform(op, row), window

    def _open_windows(self, node: int, op: Window, row: Row) -> list[WindowBounds]:
        ts = row[op.time_column]
        if ts is None:
            self.stats.rejects.add(f"window {op.spec}", "missing event time", row)
            return []
        windows = op.spec.windows_of(ts)
        seen = self.max_event_time.get(node)
        if seen is None:
            open_windows = windows
        else:
            watermark = seen - op.watermark_ms
            open_windows = [w for w in windows if w[1] > watermark]
        if len(open_windows) < len(windows):
            self.stats.late_records += 1
        self.max_event_time[node] = ts if seen is None else max(seen, ts)
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
        batches: dict[int, dict[WindowBounds, _Batch]] = {}
        for node in self.plan.topological():
            op = self.plan.op(node)
            if isinstance(op, WindowAggregate):
                batches[node] = self._extract(node, op)
            elif (inputs := self.plan.inputs(node)) and all(i in batches for i in inputs):
                batches[node] = _window_step(op, [batches[i] for i in inputs])
        return [WindowResult(query, start, end, b.rows, b.exact,
                             b.error_bound)
                for (start, end), b in sorted(batches[self.plan.sink].items())]

    def _extract(self, node: int, op: WindowAggregate) -> dict[WindowBounds, _Batch]:
        out: dict[WindowBounds, _Batch] = {}
        for (window, key), accs in sorted(self.groups.get(node, {}).items(), key=_group_order):
            batch = out.setdefault(window, _Batch([], op.exact, 0.0))
            row = dict(zip(op.keys, key, strict=True))
            for (name, agg), acc in zip(op.aggregates, accs, strict=True):
                row[name] = agg.extract(acc)
                batch.error_bound = max(batch.error_bound, agg.error_bound(acc))
            batch.rows.append(row)
        return out


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
        try:
            out = op.fn(dict(row))
        except Exception as e:
            msg = f"map {op.label}: the function raised {type(e).__name__}: {e} on {row}"
            raise DataError(msg) from e
        missing = [n for n in op.schema.names if not isinstance(out, Mapping) or n not in out]
        if missing:
            msg = f"map {op.label}: the function returned {out!r}, which lacks {missing[0]!r}"
            raise DataError(msg)
        return {f.name: float(out[f.name]) if f.dtype is DataType.FLOAT and out[f.name] is not None
                else out[f.name] for f in op.schema}
    msg = f"{op.kind} cannot run record by record"
    raise PlanError(msg)


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
    return {window: _Batch(_rows_step(op, b.rows), b.exact, b.error_bound)
            for window, b in batches.items()}


def _rows_step(op: Operator, rows: list[Row]) -> list[Row]:
    if isinstance(op, Where):
        return [r for r in rows if op.predicate.evaluate(r) is True]
    if isinstance(op, TopK):
        ranked = sorted(rows, key=lambda r: tuple((r[c] is None, r[c]) for c in op.tie_break))
        # Python's sort is stable also in reverse, so ties keep the tie-break order.
        ranked.sort(key=lambda r: _rank(r[op.by]), reverse=True)
        return ranked[: op.k]
    return [_transform(op, r) for r in rows]


def _rank(value: Any) -> tuple[bool, Any]:
    """A sort key that puts NULL below every value."""
    return (False, 0) if value is None else (True, value)
