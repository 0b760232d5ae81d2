"""The root's end of a run: each merged window finished into the query's results.

:class:`RootResults` runs the query's steps after the merge (the reference executor's own
operators, over the merged partials), adds what a reader needs to judge a result (the sites
it covers and misses, its latency after close, bounds on a degraded top-k or on a degraded
query's rows) and publishes the results to the global controller.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection
from typing import Any

from jetstream import finality, metrics
from jetstream.approx.levels import Ranking, heaviest
from jetstream.approx.rollup import rollup_text
from jetstream.approx.truncate import (
    BoundedPartial,
    bounds,
    missing_share,
    top_k_bounds,
    value_bounds,
)
from jetstream.dataplane.merger import MergedWindow
from jetstream.dsl import Query
from jetstream.local import finish_from_partials
from jetstream.operators import WindowAggregate
from jetstream.results import WindowResult

__all__ = ["Publish", "RootResults", "aggregate_bounds", "with_row_bounds", "with_top_k_bounds"]

#: Publishes a query's final results; ``finished``: there will be no more.
Publish = Callable[[str, list[WindowResult], bool], None]


class RootResults:
    """Finishes and publishes the windows a root's merger hands on, for one query."""

    def __init__(self, query: Query, partial: WindowAggregate, ranking: Ranking | None,
                 run_metrics: metrics.RunMetrics, publish: Publish) -> None:
        self.query, self.partial, self.ranking = query, partial, ranking
        self.heaviest = heaviest(query)  # without a top-k: what a degraded link kept keys by
        self.metrics, self._publish = run_metrics, publish
        self._published_finish = False

    def publish(self, merged: list[MergedWindow], finished: bool,
                expected: Collection[str]) -> None:
        """Publish the results of ``merged`` (``expected``: the sites they should cover), and
        once that the query has ``finished``."""
        results = [r for m in merged for r in self._finish(m, set(expected))]
        if results:
            self.metrics.handed_on(sum(len(r.rows) for r in results))
        if results or (finished and not self._published_finish):
            self._publish(self.query.name, results, finished)
            self._published_finish = finished

    def _finish(self, merged: MergedWindow, expected: set[str]) -> list[WindowResult]:
        now_ms = time.time_ns() // 1_000_000
        results = finish_from_partials(self.query, {merged.window: list(merged.rows)})
        if merged.slack is not None and self.ranking is not None:
            results = [with_top_k_bounds(r, merged.bounded, self.partial, self.ranking)
                       for r in results]
        elif merged.slack is not None and self.heaviest is not None:
            results = [with_row_bounds(r, merged.bounded, self.partial, self.heaviest)
                       for r in results]
        if merged.rolled_up:
            results = [dataclasses.replace(r, exact=False, rolled_up=rollup_text(self.partial))
                       for r in results]
        latency_s = (now_ms - merged.closed_at_ms) / 1000 if merged.closed_at_ms else 0.0
        if merged.closed_at_ms:
            self.metrics.result(latency_s)
        return [dataclasses.replace(
            r, sites_reporting=len(merged.covers & expected), sites_expected=len(expected),
            missing_sites=sorted(expected - merged.covers), latency_s=latency_s,
            wan_bytes=merged.wan_bytes, revision=merged.revision,
            warnings=list(merged.warnings), **_finality(r, merged, expected)) for r in results]



def _finality(result: WindowResult, merged: MergedWindow, expected: set[str]
              ) -> dict[str, Any]:
    """Whether ``result`` is final, and if not why (:mod:`jetstream.finality`): the merge's
    reasons, an expected site it lacks that is not known to have had nothing (an input of
    the root's merge whose watermark passed the window; a site under a merge below, or one
    the root no longer merges from, a standby that took over say, is not known so), and a
    degraded level's approximation (a query's own sketches are final once all is in: their
    result no later revision changes, though it is not ``exact``)."""
    unexplained = expected - merged.covers - merged.passed
    degraded = merged.degraded and not result.exact
    provisional = finality.provisional(
        [*merged.provisional, *([finality.MISSING_SITE] if unexplained else []),
         *([finality.APPROXIMATE] if degraded else [])])
    return {"final": not provisional, "provisional": provisional}


def with_top_k_bounds(result: WindowResult, bounded: BoundedPartial,
                      partial: WindowAggregate, ranking: Ranking) -> WindowResult:
    """Each top-k row of ``result`` (finished from ``bounded``, a window's merged partial
    with truncation bounds) with its ranking value's ``lb``/``ub``, whether it is certain,
    and its other aggregates' bounds (:func:`aggregate_bounds`)."""
    top = top_k_bounds(bounded, partial, ranking.by, ranking.k)
    keys = partial.keys
    known = {tuple(row[k] for k in keys): (lb, ub, sure, whole) for row, lb, ub, sure, whole
             in zip(top.rows, top.lb, top.ub, top.guaranteed, top.complete, strict=True)}
    others = aggregate_bounds(bounded, partial)
    rows = []
    for row in result.rows:
        key = tuple(row.get(k) for k in keys)
        lb, ub, sure, whole = known.get(key, (None, None, False, False))
        rows.append({**row, "lb": lb, "ub": ub, "guaranteed": sure, "complete": whole,
                     **others.get(key, {})})
    return dataclasses.replace(result, rows=rows, exact=False,
                               error_bound=max(result.error_bound or 0.0, top.error_bound))


def with_row_bounds(result: WindowResult, bounded: BoundedPartial, partial: WindowAggregate,
                    measure: Ranking) -> WindowResult:
    """Each row of ``result`` (finished from ``bounded``, a window's merged partial with
    truncation bounds, of a query without a top-k) with its ``measure``'s ``lb``/``ub`` and
    whether every aggregate of it is exact (``complete``). The result's ``error_bound`` is a
    share of the window's total of ``measure`` (see :func:`missing_share`): no row's value
    exceeds its ``lb`` by more than that share of the total, and the keys without a row hold
    at most that share of it together."""
    ranked = bounds(bounded, partial, measure.by)
    keys = partial.keys
    known = {tuple(row[k] for k in keys): (lb, ub, whole) for row, lb, ub, whole
             in zip(ranked.rows, ranked.lb, ranked.ub, ranked.complete, strict=True)}
    others = aggregate_bounds(bounded, partial)
    rows = []
    for row in result.rows:
        key = tuple(row.get(k) for k in keys)
        lb, ub, whole = known.get(key, (None, None, False))
        rows.append({**row, "lb": lb, "ub": ub, "complete": whole, **others.get(key, {})})
    missing = missing_share(bounded, partial, measure.by)
    return dataclasses.replace(result, rows=rows, exact=False,
                               error_bound=max(result.error_bound or 0.0, missing))


def aggregate_bounds(bounded: BoundedPartial,
                     partial: WindowAggregate) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Per group key of ``bounded``, ``{"bounds": [...]}``: a record ``{"aggregate", "lb",
    "ub"}`` for each min, max and average of the query, the interval its true value lies in
    (:func:`jetstream.approx.truncate.value_bounds`; a NULL side is open). Empty when the
    query has none of them."""
    per_row = value_bounds(bounded, partial)
    return {tuple(row[k] for k in partial.keys): {"bounds": [
        {"aggregate": name, "lb": lb, "ub": ub} for name, (lb, ub) in of.items()]}
        for row, of in zip(bounded.rows, per_row, strict=True) if of}

