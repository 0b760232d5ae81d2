"""Questions about the past, answered from the cubes the sites keep: a history query
(``jetstream history``) and a new query's backfill (``jetstream submit --since``). See
:mod:`jetstream.dataplane.history` for how a query is answered from a stored one's cubes."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable

from jetstream.aggtree.topology import Topology
from jetstream.control.results_hub import MAX_RESULTS, ResultsHub
from jetstream.control.state import QueryState
from jetstream.dataplane.history import (
    HISTORY_BUDGET_S,
    HistoryAnswer,
    ReadCubes,
    answer,
    plan_history,
    seamed,
)
from jetstream.dsl import Query
from jetstream.errors import PlacementError, PlanError
from jetstream.planwire import query_from_proto
from jetstream.v1.query_pb2 import QueryPlan

__all__ = ["PastQueries"]

log = logging.getLogger(__name__)

#: The controller's queries (running ones first) and each site's address (empty: down).
Known = Callable[[], tuple[list[QueryState], dict[str, str]]]


class PastQueries:
    """History and backfill for a global controller: ``known`` says its queries and sites,
    ``results`` holds their results, ``topology`` is the topology as it stands (measured
    bandwidths in)."""

    def __init__(self, known: Known, results: ResultsHub, topology: Callable[[], Topology],
                 allow_code: bool) -> None:
        self._known, self.results, self._topology = known, results, topology
        self.allow_code = allow_code

    def backfill(self, query: Query, since_ms: int, read: ReadCubes
                 ) -> tuple[Query, HistoryAnswer, int]:
        """``query`` from a seam on, its windows from ``since_ms`` to the seam answered
        from the cubes of a query that ran (another name): the seam is the end of that
        query's newest window every site has reported, at a window of ``query``. So the
        cubes hold every window before the seam, and the live query counts only the records
        at or after it (:func:`~jetstream.dataplane.history.seamed`): no gap, nothing twice. And the
        seam."""
        known, addresses = self._known()
        states = [s for s in known if s.name != query.name]
        now_ms = time.time_ns() // 1_000_000
        plan = plan_history(query, [state.query for state in states], since_ms=since_ms,
                            until_ms=now_ms, now_ms=now_ms, finest=True)
        state = next(s for s in states if s.name == plan.stored.name)
        complete = [r.window_end for r in self.results.newest(state.name, MAX_RESULTS)
                    if not r.history and r.sites_expected
                    and r.sites_reporting == r.sites_expected]
        if not complete:
            msg = (f"backfill of {query.name}: {state.name}, whose cubes would answer it, has "
                   "no window every site reported yet; try again once it has")
            raise PlanError(msg)
        size = plan.window.spec.size_ms
        # At a window's start, and not before --since: the live query starts there.
        seam = max(max(complete) // size * size, -(-since_ms // size) * size)
        live = seamed(query, seam)
        found = answer(dataclasses.replace(plan, end_ms=max(seam, since_ms)),
                       {site: addresses.get(site, "") for site in state.expected}, read,
                       self._budgets(state))
        log.info("%s: backfilled %d windows from the cubes of %s, live from %d", query.name,
                 len(found.results), state.name, seam)
        return live, found, seam

    def history(self, spec: QueryPlan, since_ms: int, until_ms: int, read: ReadCubes,
                now_ms: int | None = None) -> HistoryAnswer:
        """Answer the query of ``spec`` over ``[since_ms, until_ms)`` from the cubes the
        sites keep of a query that ran here (see :mod:`jetstream.dataplane.history`); ``read``
        asks a site for its kept windows. Refused, naming what is missing, when no stored query's
        cubes hold what it needs."""
        query = query_from_proto(spec, allow_code=self.allow_code)
        states, addresses = self._known()  # running queries first, then the newest others
        plan = plan_history(query, [state.query for state in states], since_ms=since_ms,
                            until_ms=until_ms,
                            now_ms=time.time_ns() // 1_000_000 if now_ms is None else now_ms)
        state = next(s for s in states if s.name == plan.stored.name)
        return answer(plan, {site: addresses.get(site, "") for site in state.expected}, read,
                      self._budgets(state))

    def _budgets(self, state: QueryState) -> dict[str, int]:
        """The bytes each source site's answer to a history query may take: what the
        thinnest link on its way to the root in the stored query's tree carries in
        HISTORY_BUDGET_S (by the measured bandwidth where there is one; the root's own, no
        limit)."""
        topology = self._topology()
        fragments = state.plan.fragments if state.plan is not None else {}
        budgets = {}
        for site in state.expected:
            bps, node = math.inf, site
            while node in fragments and fragments[node].parent:
                parent = fragments[node].parent
                assert parent is not None
                try:
                    bps = min(bps, topology.link(node, parent).bandwidth_bps)
                except PlacementError:  # a site out of the tree now: no budget known
                    break
                node = parent
            budgets[site] = 0 if math.isinf(bps) else int(bps / 8 * HISTORY_BUDGET_S)
        return budgets
