"""History queries: a windowed aggregate over the past, answered from the sites' cubes.

Every site keeps the windows its own local stages make, rolled up into coarser resolutions
(10 s -> 1 min -> 1 h by default) and kept for a time per resolution
(:mod:`jetstream.dataplane.cubes`).
Each source site's own windows cover only its own records, so the union over the sites
counts every record once, whatever the aggregation tree was. A history query is answered
from the cubes of a query that ran (its *stored* query) when they hold what it needs —
:func:`plan_history` checks that, and refuses naming what is missing:

- the same source and the same record steps before the window (the stored query's filters
  and columns, applied identically), plus, at most, filters that read only the stored
  query's group keys;
- group keys among the stored query's, and aggregates among its (the same function of the
  same input; names may differ);
- a window whose size and slide are multiples of a resolution the sites keep — the stored
  query's tumbling window, or one of the coarser rollups — kept back far enough for the range
  asked (the sites' default retention, :data:`~jetstream.dataplane.cubes.DEFAULT_RETENTION`).

:meth:`HistoryPlan.finish` turns the sites' stored windows into the history query's results:
each stored row filtered, its keys cut to the history query's, its aggregates renamed, merged
per history window with the aggregates' own merge, and finished by the reference executor's
operators, as the root finishes live windows. Results say which sites answered.

A site whose answer would take more than its budget on its link (:data:`HISTORY_BUDGET_S`)
steps it down the stored query's own degradation ladder (:func:`degraded_answer`, up to
:attr:`HistoryPlan.max_level`): sketches of exact distinct counts and quantiles, and, for a
history query with the stored keys and ranking, truncations whose bounds the results carry.

:func:`seamed` makes the live part of a backfilled query (``jetstream submit --since``):
the query counting only the records at or after the seam, before which the cubes answer.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jetstream import finality
from jetstream.aggregates import Aggregate
from jetstream.approx import rollup
from jetstream.approx.levels import Ladder, ladder, ranking
from jetstream.approx.truncate import BoundedPartial
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.cubes import DEFAULT_RETENTION
from jetstream.dataplane.finish import with_top_k_bounds
from jetstream.dataplane.partials import PartialBatch, summarised
from jetstream.dsl import Query, Stream
from jetstream.errors import ControlPlaneError, DataError, PlanError
from jetstream.expr import Col, Expr
from jetstream.local import finish_from_partials
from jetstream.operators import (
    Join,
    Map,
    Operator,
    Select,
    Source,
    Where,
    Window,
    WindowAggregate,
    WithColumn,
)
from jetstream.planwire import query_to_proto
from jetstream.results import WindowResult
from jetstream.rewrite import distributed, partial_aggregate
from jetstream.rewrite.edit import insert_below, plan_of
from jetstream.stage.check import site_chains
from jetstream.v1 import control_pb2 as pb
from jetstream.v1 import dataplane_pb2 as dataplane

__all__ = ["HISTORY_BUDGET_S", "HistoryAnswer", "HistoryPlan", "ReadCubes", "answer",
           "degraded_answer", "plan_history", "seamed"]

Row = dict[str, Any]
Windows = tuple[int, int]


@dataclass(frozen=True)
class HistoryPlan:
    """How a history query is answered from a stored query's cubes (see the module)."""

    query: Query  # the history query, as the sites' partials finish it (distributed)
    stored: Query  # the stored query, as it ran (distributed)
    resolution_ms: int  # the length of the stored windows read
    rollup: bool  # read from the rollups (else the stored query's own windows)
    start_ms: int  # the history windows asked for lie in [start_ms, end_ms)
    end_ms: int
    keys: tuple[str, ...]  # the history query's group keys
    aggregates: tuple[tuple[str, str], ...]  # (history name, stored name)
    where: tuple[Expr, ...]  # the history query's filters on stored keys
    written: Query  # the stored query as written: what a site is sent to read its windows

    @property
    def ladder(self) -> Ladder:
        """The stored query's degradation levels: a site's answer steps down them."""
        return ladder(ranking(self.stored), partial_aggregate(self.stored))

    @property
    def max_level(self) -> int:
        """The coarsest level of :attr:`ladder` a site's answer may step down to: its
        sketches of distinct counts and quantiles, which merge whatever the keys; its
        truncations too when the history query keeps the stored keys and ranks by the stored
        ranking (then the rows carry top-k bounds); never its frequent-items sketches."""
        steps = self.ladder
        stored, mine = ranking(self.stored), ranking(self.query)
        same_rank = (stored is not None and mine is not None and self.keys == tuple(
            partial_aggregate(self.stored).keys) and (mine.by, stored.by) in self.aggregates)
        allowed = [lv.index for lv in steps.levels if steps.encoding(lv).lg_max_k is None
                   and not steps.encoding(lv).rollup
                   and (same_rank or steps.encoding(lv).keep is None)]
        return max(allowed)

    @property
    def window(self) -> Window:
        found = _window(_chain(self.query))
        assert found is not None, "plan_history checked the window"
        return found

    def windows(self) -> list[Windows]:
        """Every history window inside ``[start_ms, end_ms)``, in order."""
        spec = self.window.spec
        first = -(-self.start_ms // spec.every_ms) * spec.every_ms
        return [(s, s + spec.size_ms) for s in range(first, self.end_ms - spec.size_ms + 1,
                                                     spec.every_ms)]

    def finish(self, batches: Iterable[PartialBatch], *, expected: Collection[str],
               unanswered: Mapping[str, str]) -> list[WindowResult]:
        """The history query's results from the stored windows the source sites
        (``expected``) sent; ``unanswered``: those that did not, and why. A stored window
        that came truncated (a site's answer stepped down on a thin link, see
        :func:`degraded_answer`) makes its history windows' rows carry top-k bounds."""
        answered = set(expected) - set(unanswered)
        # What a stored window rolled up on its link holds of the history's keys.
        partial = dataclasses.replace(partial_aggregate(self.query), rollup=tuple(
            (k, e) for k, e in partial_aggregate(self.stored).rollup if k in self.keys))
        spec = self.window.spec
        wanted = set(self.windows())
        pieces: dict[Windows, list[BoundedPartial]] = {}
        for batch in batches:
            start = batch.window[0]
            # The history windows this stored window lies in (it lies wholly in each).
            owners = [w for w in spec.windows_of(start) if w in wanted
                      and w[0] <= start and batch.window[1] <= w[1]]
            if owners:
                piece = self._piece(batch, partial)
                for window in owners:
                    pieces.setdefault(window, []).append(piece)
        rank = ranking(self.query)
        missing = sorted(unanswered)
        warnings = [f"site {site} did not answer ({unanswered[site]}): its records are "
                    "missing" for site in missing]
        results = []
        for window in sorted(pieces):
            merged = rollup.merged(pieces[window], partial)
            for result in finish_from_partials(self.query, {window: list(merged.rows)}):
                if merged.rolled_up:
                    result = dataclasses.replace(result, exact=False,
                                                 rolled_up=rollup.rollup_text(partial))
                if merged.truncated and rank is not None:
                    result = with_top_k_bounds(result, merged, partial, rank)
                elif merged.truncated:  # (degraded_answer truncates only for a top-k)
                    result = dataclasses.replace(result, exact=False, error_bound=None)
                provisional = finality.provisional(
                    [*([finality.MISSING_SITE] if missing else []),
                     *([] if result.exact else [finality.APPROXIMATE])])
                results.append(dataclasses.replace(
                    result, sites_reporting=len(answered), sites_expected=len(expected),
                    missing_sites=missing, warnings=list(warnings), history=True,
                    final=not provisional, provisional=provisional))
        return results

    def _piece(self, batch: PartialBatch, partial: WindowAggregate) -> BoundedPartial:
        """A stored window's rows as the history query's partial: filtered on the stored
        keys, cut to the history query's keys (rows that then share a key merged), its
        aggregates renamed; with the window's truncation bounds, if it has any."""
        aggs = dict(partial.aggregates)
        bounded = batch.bounded
        rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        slack: dict[tuple[Any, ...], float] = {}
        complete: dict[tuple[Any, ...], bool] = {}
        for row, row_slack, whole in zip(bounded.rows, bounded.slack, bounded.complete,
                                         strict=True):
            if not all(expr.evaluate(row) is True for expr in self.where):
                continue
            key = tuple(row[k] for k in self.keys)
            into = rows.get(key)
            if into is None:
                into = rows[key] = {**dict(zip(self.keys, key, strict=True)),
                                    **{name: aggs[name].create() for name, _ in self.aggregates}}
            for name, stored in self.aggregates:
                into[name] = aggs[name].merge(into[name], row[stored])
            # (A truncated window is read only with the stored keys: no two rows share one.)
            slack[key] = slack.get(key, 0.0) + row_slack
            complete[key] = complete.get(key, True) and whole
        ranges = None if bounded.ranges is None else {
            name: bounded.ranges[stored] for name, stored in self.aggregates
            if stored in bounded.ranges}
        return BoundedPartial(tuple(rows.values()), tuple(slack.values()), bounded.omitted,
                              tuple(complete.values()), bounded.truncated, bounded.cut, ranges,
                              bounded.rolled_up and bool(partial.rollup))


@dataclass(frozen=True)
class HistoryAnswer:
    """A history query's results, the stored query and resolution that answered it, and the
    bytes the sites sent for it."""

    results: list[WindowResult]
    stored: str
    resolution_ms: int
    bytes: int


#: Seconds of its link's time a site's answer to a history query may take: past that, the
#: site sends it at a coarser level of the stored query's ladder (:func:`degraded_answer`).
HISTORY_BUDGET_S = 10.0


def degraded_answer(messages: list[dataplane.PartialBatch], stored: Query, max_bytes: int,
                    max_level: int) -> list[dataplane.PartialBatch]:
    """A site's kept windows (``messages``) of ``stored`` (the stored query, distributed)
    as the finest level of its ladder, up to ``max_level``, whose answer fits ``max_bytes``
    sends them (the coarsest allowed, if none does); ``max_bytes`` 0: no budget."""
    if not max_bytes or sum(m.ByteSize() for m in messages) <= max_bytes:
        return messages
    partial = partial_aggregate(stored)
    steps = ladder(ranking(stored), partial)
    batches = [decode_batch(message, partial) for message in messages]
    sent = messages
    for level in steps.levels[1:max_level + 1]:
        sent = [encode_batch(summarised(b, steps.degrade(b.bounded, partial, level),
                                        level.index), partial) for b in batches]
        if sum(m.ByteSize() for m in sent) <= max_bytes:
            break
    return sent


#: Reads one site's kept windows: (site, its controller's address, request) -> response.
ReadCubes = Callable[[str, str, pb.ReadCubesRequest], pb.ReadCubesResponse]


def answer(plan: HistoryPlan, sites: Mapping[str, str], read: ReadCubes,
           budgets: Mapping[str, int] | None = None) -> HistoryAnswer:
    """Ask each source site of the stored query (name -> address, "" when it is down) for
    its kept windows in the plan's range, and finish them into the history's results;
    ``budgets``: the bytes a site's answer may take on its link (none: no limit), past which
    it steps down the stored query's ladder."""
    windows = plan.windows()
    if not windows:
        return HistoryAnswer([], plan.stored.name, plan.resolution_ms, 0)
    stored = partial_aggregate(plan.stored)
    spec, level = query_to_proto(plan.written), plan.max_level
    batches: list[PartialBatch] = []
    unanswered: dict[str, str] = {}
    size = 0

    def ask(site: str, address: str) -> tuple[int, list[PartialBatch]]:
        request = pb.ReadCubesRequest(
            query=plan.stored.name, start_ms=windows[0][0], end_ms=windows[-1][1],
            resolution_ms=plan.resolution_ms if plan.rollup else 0,
            max_bytes=(budgets or {}).get(site, 0), max_level=level, stored=spec)
        response = read(site, address, request)
        return response.ByteSize(), [decode_batch(m, stored) for m in response.batches]

    up = {site: address for site, address in sites.items() if address}
    unanswered.update({site: "it is down" for site in sites if site not in up})
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(up)))) as pool:
        asked = {site: pool.submit(ask, site, address) for site, address in sorted(up.items())}
        for site, future in asked.items():  # the sites are asked at once
            try:
                got_bytes, got = future.result()
            except (ControlPlaneError, DataError) as e:
                unanswered[site] = str(e)
                continue
            size += got_bytes
            batches += got
    return HistoryAnswer(plan.finish(batches, expected=list(sites), unanswered=unanswered),
                         plan.stored.name, plan.resolution_ms, size)


def seamed(query: Query, seam_ms: int) -> Query:
    """``query`` reading only the records stamped at or after ``seam_ms``: the live part of
    a query backfilled from the cubes, which hold the windows before the seam. A PlanError
    unless its window is tumbling (a sliding window across the seam would be counted in
    part on each side)."""
    plan = query.plan()
    node = next(n for n in plan.topological() if isinstance(plan.op(n), Window))
    window = plan.op(node)
    assert isinstance(window, Window)
    if window.spec.size_ms != window.spec.every_ms:
        msg = (f"query {query.name}: a backfill takes a tumbling window (a sliding one across "
               "the seam between the cubes and the live records would be split)")
        raise PlanError(msg)
    if seam_ms % window.spec.size_ms:
        msg = f"query {query.name}: the seam {seam_ms} is not at a window's start"
        raise PlanError(msg)
    graph = plan.graph.copy()
    below = plan.op(plan.inputs(node)[0])
    insert_below(graph, node, 0, Where(schema=below.schema,
                                       predicate=Col(window.time_column) >= seam_ms))
    return Query(query.name, Stream(plan_of(graph)), query.slo)


def plan_history(history: Query, stored: Sequence[Query], *, since_ms: int, until_ms: int,
                 now_ms: int, retention: Mapping[int, float] = DEFAULT_RETENTION,
                 finest: bool = False) -> HistoryPlan:
    """How to answer ``history`` over ``[since_ms, until_ms)`` from the cubes of one of the
    ``stored`` queries (as written); a PlanError naming what each one lacks otherwise.
    ``finest``: read the finest resolution that reaches back, not the coarsest (a backfill
    reads up to the newest windows, which are rolled up only once the rollup has ended)."""
    if until_ms <= since_ms:
        msg = f"history of {history.name}: the range is empty (--until is not after --since)"
        raise PlanError(msg)
    if not stored:
        msg = (f"history of {history.name}: no query has run here yet, so no site keeps "
               "cubes to answer it from")
        raise PlanError(msg)
    reasons = []
    for candidate in stored:
        try:
            return _derive(history, candidate, since_ms, until_ms, now_ms, retention, finest)
        except PlanError as e:
            reasons.append(f"{candidate.name}: {e}")
    msg = (f"history of {history.name}: no stored cubes answer it; " + "; ".join(reasons))
    raise PlanError(msg)


def _derive(history: Query, stored: Query, since_ms: int, until_ms: int, now_ms: int,
            retention: Mapping[int, float], finest: bool) -> HistoryPlan:
    h_chain, s_chain = _chain(history), _chain(stored)
    h_source, s_source = h_chain[0], s_chain[0]
    assert isinstance(h_source, Source) and isinstance(s_source, Source)
    if (h_source.name, h_source.schema) != (s_source.name, s_source.schema):
        msg = f"it reads source {s_source.name}, not {h_source.name}"
        raise PlanError(msg)
    h_partial, s_partial = partial_aggregate(distributed(history)), partial_aggregate(
        distributed(stored))
    missing = [k for k in h_partial.keys if k not in s_partial.keys]
    if missing:
        msg = (f"its cubes keep no group key {', '.join(missing)} (its keys: "
               f"{', '.join(s_partial.keys) or 'none'})")
        raise PlanError(msg)
    where = _steps_match(h_chain, s_chain, s_partial.keys)
    filtered = sorted({k for k, _ in s_partial.rollup} & set().union(
        *(e.columns() for e in where)))
    if filtered:
        msg = (f"a thin link may roll up its windows' {', '.join(filtered)}, and its cubes "
               f"keep them as sent, so they cannot answer a filter on {', '.join(filtered)}; "
               "filter on another key")
        raise PlanError(msg)
    aggregates = []
    for name, agg in h_partial.aggregates:
        same = next((s for s, other in s_partial.aggregates if _same(agg, other)), None)
        if same is None:
            kept = ", ".join(f"{n}={a}" for n, a in s_partial.aggregates)
            msg = f"its cubes hold {kept}; not {name}={agg}"
            raise PlanError(msg)
        aggregates.append((name, same))
    h_window, s_window = _window(h_chain), _window(s_chain)
    assert h_window is not None and s_window is not None, "the DSL windows every aggregate"
    if s_window.spec.size_ms != s_window.spec.every_ms:
        msg = "its windows slide; history reads tumbling windows"
        raise PlanError(msg)
    if h_window.time_column != s_window.time_column:
        msg = f"its windows are on {s_window.time_column}, not {h_window.time_column}"
        raise PlanError(msg)
    resolution = _resolution(h_window, s_window.spec.size_ms, since_ms, now_ms, retention,
                             finest)
    return HistoryPlan(distributed(history), distributed(stored), resolution,
                       resolution != s_window.spec.size_ms, since_ms, until_ms,
                       h_partial.keys, tuple(aggregates), where, stored)


def _chain(query: Query) -> list[Operator]:
    """The query's one chain from its source to its aggregate, as written."""
    chains = site_chains(distributed(query))
    if len(chains) != 1:
        msg = f"query {query.name} reads a union; history reads one source"
        raise PlanError(msg)
    plan = query.plan()
    node = next(n for n in plan.topological() if isinstance(plan.op(n), WindowAggregate))
    chain = [plan.op(node), *plan.upstream(node)]
    chain.reverse()
    return chain


def _window(chain: Sequence[Operator]) -> Window | None:
    return next((op for op in chain if isinstance(op, Window)), None)


def _steps_match(history: Sequence[Operator], stored: Sequence[Operator],
                 keys: Sequence[str]) -> tuple[Expr, ...]:
    """The history query's filters on stored keys, once its other steps before the window
    are found to be the stored query's; a PlanError naming the first that is not. A filter
    on a key that a stored step makes or changes is not one (the cubes hold the key as the
    step left it), and a ``map`` is refused (two functions of one label look alike here)."""
    def steps(chain: Sequence[Operator]) -> list[Operator]:
        return [op for op in chain[1:] if not isinstance(op, Window | WindowAggregate)]

    for op in (*steps(stored), *steps(history)):
        if isinstance(op, Map):
            msg = f"`{op.describe()}`: history cannot tell one map function from another"
            raise PlanError(msg)
    written = set().union(*(_written(op) for op in steps(stored)))
    extra, mine = [], []
    theirs = [op.describe() for op in steps(stored)]
    for op in steps(history):
        if (isinstance(op, Where) and op.describe() not in theirs
                and op.predicate.columns() <= set(keys)
                and not op.predicate.columns() & written):
            extra.append(op.predicate)
        else:
            mine.append(op.describe())
    if mine != theirs:
        first = next((m for m, t in zip(mine, theirs, strict=False) if m != t),
                     (mine + theirs)[min(len(mine), len(theirs))])
        msg = (f"its steps before the window are {'; '.join(theirs) or 'none'}, the history "
               f"query's differ at `{first}` (its filters on other columns than the stored "
               "keys, and its columns, must be the stored query's)")
        raise PlanError(msg)
    return tuple(extra)


def _written(op: Operator) -> set[str]:
    """The columns a record step makes or changes."""
    if isinstance(op, WithColumn):
        return {op.name}
    if isinstance(op, Select):
        return {name for name, expr in op.columns
                if not (isinstance(expr, Col) and expr.name == name)}
    if isinstance(op, Join):
        return set(op.table.schema.names) - {op.on}
    return set()


def _same(a: Aggregate, b: Aggregate) -> bool:
    """The same function of the same input (names aside)."""
    def fields(agg: Aggregate) -> dict[str, Any]:
        return {f.name: getattr(agg, f.name) for f in dataclasses.fields(agg)
                if f.name != "expr"}
    return type(a) is type(b) and str(a.expr) == str(b.expr) and fields(a) == fields(b)


def _resolution(window: Window, stored_ms: int, since_ms: int, now_ms: int,
                retention: Mapping[int, float], finest: bool) -> int:
    """The coarsest (or ``finest``) kept resolution the window is made of that reaches back
    to ``since_ms``."""
    levels, finer = [stored_ms], stored_ms
    for level in sorted(r for r in retention if r > stored_ms):
        if level % finer == 0:  # the rollups the sites make (CubeStore.roll_up)
            levels.append(level)
            finer = level
    spec = window.spec
    fits = [r for r in levels if spec.size_ms % r == 0 and spec.every_ms % r == 0]
    if not fits:
        kept = ", ".join(_duration(r) for r in levels)
        msg = (f"its cubes are of {kept}; a window of {_duration(spec.size_ms)} every "
               f"{_duration(spec.every_ms)} is not made of any: use a multiple of one")
        raise PlanError(msg)
    for r in sorted(fits, reverse=not finest):
        if now_ms - _kept_s(r, retention) * 1000 <= since_ms:
            return r
    longest = max(fits, key=lambda r: _kept_s(r, retention))
    kept = _duration(int(_kept_s(longest, retention) * 1000))
    msg = (f"its {_duration(longest)} cubes are kept for {kept}, not back to --since; ask "
           "for less, or for a window of a coarser resolution")
    raise PlanError(msg)


def _kept_s(resolution: int, retention: Mapping[int, float]) -> float:
    listed = [r for r in retention if r <= resolution] or [min(retention)]
    return retention[max(listed)]


def _duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"
