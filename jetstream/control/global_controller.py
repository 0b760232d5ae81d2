"""The global controller: plans each query over the topology and hands every site its part.

It is a short composition of parts with one job each:

- :class:`~.membership.Membership`: which sites have registered, which still send heartbeats,
  where the root is (a standby root takes its place when it dies), and the links as measured;
- :class:`~.running.RunningQueries`: each query's plan, its deploys to the sites, re-planning,
  stopping, and keeping the queries in the state folder so that a controller restarted after
  a crash takes them up again as the sites register;
- :class:`~.results_hub.ResultsHub`: the results the root publishes, to every subscriber;
- :class:`~.past.PastQueries`: history and backfill, from the cubes the sites keep.

The controller ties them together under one lock: a site that registers, comes back, falls
silent or measures its link anew has the running queries planned again (a link when its
bandwidth moves by more than ``REPLAN_BANDWIDTH_CHANGE``, :mod:`.links`). It holds no query
semantics of its own: rewriting and planning are :mod:`jetstream.rewrite` and
:mod:`jetstream.aggtree`. The status, the dashboard and the metrics read one snapshot of it
(:meth:`GlobalController.view`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType

from jetstream import finality, metrics
from jetstream.aggtree.planner import PhysicalPlan
from jetstream.aggtree.topology import Link, Topology
from jetstream.control.links import LinkMeasurements
from jetstream.control.membership import Membership
from jetstream.control.past import PastQueries
from jetstream.control.results_hub import ResultsHub, utc
from jetstream.control.running import Deployer, Dispatch, RunningQueries, Stopper
from jetstream.control.site_calls import call_now
from jetstream.control.state import (
    ControllerView,
    LinkReport,
    Placement,
    QueryState,
    QueryView,
    SiteState,
)
from jetstream.dataplane.history import ReadCubes
from jetstream.errors import ControlPlaneError, JetstreamError, PlacementError
from jetstream.planwire import query_from_proto, query_to_proto
from jetstream.results import WindowResult
from jetstream.rewrite import distributed, explain, partial_aggregate
from jetstream.stage.check import check_stage
from jetstream.v1.query_pb2 import QueryPlan

__all__ = ["GlobalController"]

log = logging.getLogger(__name__)


class GlobalController:
    """The control plane's brain; thread-safe, driven by the gRPC servicer and a clock."""

    def __init__(self, topology: Topology, deploy: Deployer, stop: Stopper, *,
                 heartbeat_timeout_s: float = 6.0, clock: Callable[[], float] = time.monotonic,
                 state_dir: Path | None = None, dispatch: Dispatch = call_now,
                 allow_code: bool = False, cubes: Sequence[QueryPlan] = ()):
        self.topology, self.clock = topology, clock
        #: Whether queries may carry code (a ``map`` function, pickled) to run on the sites.
        self.allow_code = allow_code
        #: Declared cubes: queries run from the start so that the sites keep their windows
        #: for history (``jetstream controller --cube``); each is submitted once it can be
        #: placed (a site registers), unless a query of its name runs already.
        self._cubes = list(cubes)
        self.lock = threading.RLock()
        self.membership = Membership(topology, heartbeat_timeout_s, clock)
        self.results = ResultsHub(state_dir / "results" if state_dir else None)
        self.running = RunningQueries(self.membership, self.results, deploy, stop, dispatch,
                                      self.lock, state_dir, allow_code)
        #: Questions about the past, answered from the cubes the sites keep.
        self.past = PastQueries(self._known, self.results, self.effective_topology,
                                allow_code)
        self.running.restore()

    # -- what the parts hold --------------------------------------------------------------
    @property
    def root(self) -> str:
        """The site that makes the results (see :attr:`Membership.root`)."""
        return self.membership.root

    @property
    def sites(self) -> dict[str, SiteState]:
        return self.membership.sites

    @property
    def queries(self) -> dict[str, QueryState]:
        return self.running.queries

    @property
    def links(self) -> LinkMeasurements:
        return self.membership.links

    @property
    def current_topology(self) -> Topology:
        return self.membership.current_topology

    def effective_topology(self, *, measured: bool = True) -> Topology:
        return self.membership.effective_topology(measured=measured)

    def timeout_of(self, site: str) -> float:
        return self.membership.timeout_of(site)

    # -- sites ----------------------------------------------------------------------------
    def register_site(self, name: str, address: str, *, allows_code: bool = False) -> None:
        with self.lock:
            came_back = self.membership.register(name, address, allows_code=allows_code)
            self.running.registered(name)  # a fresh site controller holds nothing yet
            self.running.replan_all(f"site {name} is back" if came_back else "")
            self._start_cubes()

    def _start_cubes(self) -> None:
        """Submit each declared cube not running yet that can be placed now."""
        for spec in list(self._cubes):
            existing = self.queries.get(spec.name)
            if existing is None or not existing.active:
                try:
                    self.submit(spec)
                except PlacementError as e:  # the root is not up yet, say: the next one
                    log.info("cube %s waits to be placed: %s", spec.name, e)
                    continue
                except JetstreamError as e:
                    log.error("cube %s cannot run: %s", spec.name, e)
                else:
                    log.info("cube %s runs: the sites keep its windows", spec.name)
            self._cubes.remove(spec)

    def heartbeat(self, name: str, links: dict[str, float], *, input_bytes: int = 0,
                  reports: dict[str, LinkReport] | None = None,
                  placements: list[Placement] | None = None,
                  failures: dict[str, str] | None = None, interval_s: float = 0.0,
                  behind: dict[str, tuple[int, float]] | None = None,
                  late_records: dict[str, int] | None = None) -> list[str]:
        """Record that ``name`` is alive and what it measured (and, for the dashboard, its
        raw input, its links' levels and which process runs which piece, and which queries'
        local stages failed there, and why, how far it is behind its input folders, and each
        query's records its stages dropped as late),
        and that its next heartbeat comes within
        ``interval_s`` (0: its usual interval); the queries it should run."""
        with self.lock:
            came_back, changed = self.membership.beat(
                name, links, input_bytes=input_bytes, reports=reports or {},
                placements=None if placements is None
                else [p for p in placements if p.query in self.queries],
                interval_s=interval_s, behind=behind)
            for failed, error in (failures or {}).items():
                self.running.stage_failed(failed, name, error)
            for query, late in (late_records or {}).items():
                if (state := self.queries.get(query)) is not None:
                    state.late_records[name] = late
            if came_back:
                self.running.replan_all(f"site {name} is back")
            elif changed:
                self.running.replan_all(f"measured bandwidth of {name}-{changed[0]} changed")
            self.running.deploy_missing(name)  # retry what could not be deployed before
            return self.running.at(name)

    def check_liveness(self) -> list[str]:
        """Mark sites whose heartbeats stopped as dead, re-plan; the sites newly dead."""
        with self.lock:
            dead = self.membership.silent()
            for name in dead:
                log.warning("site %s missed its heartbeats; re-planning", name)
            if dead:
                self._lose(dead, f"site {', '.join(dead)} stopped sending heartbeats")
            return dead

    def leave(self, name: str) -> None:
        """``name`` is shutting down: re-plan without it now, as if it were dead (it comes
        back by registering again)."""
        with self.lock:
            if self.membership.site(name).alive:
                log.info("site %s is shutting down; re-planning without it", name)
                self._lose([name], f"site {name} shut down")

    def _lose(self, names: list[str], reason: str) -> None:
        dead = self.root
        standby = self.membership.lose(names)
        if standby is not None:
            self.running.resend_since_unsettled(dead, standby)
            metrics.ROOT_FAILOVERS.inc()
        self.running.replan_all(reason)

    def expire_measurements(self) -> list[str]:
        """Forget the link measurements no heartbeat has repeated lately (see
        :meth:`LinkMeasurements.expire`), re-planning if the configured bandwidths they fall
        back to are far from what the plans assumed; the links forgotten, as "site-peer"."""
        with self.lock:
            names, moved = self.links.expire(self.timeout_of)
            if moved:
                self.running.replan_all(f"no recent measurement of {', '.join(names)}: "
                                        "planned at the configured bandwidth")
            return names

    # -- queries --------------------------------------------------------------------------
    def submit(self, spec: QueryPlan, since_ms: int | None = None,
               read: ReadCubes | None = None) -> QueryState:
        """Run the query whose plan is ``spec`` (refused, with a PlanError, if it does not
        check out, carries code this controller does not allow, or cannot be placed).

        With ``since_ms``, its results start with the windows since then, from the cubes of
        a query that ran (see :meth:`PastQueries.backfill`; ``read`` asks a site for its kept
        windows), and it runs live from the seam on."""
        query = query_from_proto(spec, allow_code=self.allow_code)
        backfill, seam = None, 0
        if since_ms is not None:
            if read is None:
                msg = "this controller reads no cubes: it cannot backfill"
                raise ControlPlaneError(msg)
            query, backfill, seam = self.past.backfill(query, since_ms, read)
        with self.lock:
            read_as = self.running.read_as(query)  # the sites' format, or refused
        if read_as is not query or since_ms is not None:
            query, spec = read_as, query_to_proto(read_as)
        split = distributed(query)  # refuse now what no site could run
        partial_aggregate(split)
        check_stage(split)
        with self.lock:
            state = self.running.start(query, spec.SerializeToString(deterministic=True))
            self.results.reset(query.name)
            for result in backfill.results if backfill is not None else ():
                self.results.publish(result)  # before the first live window
            if backfill is not None:
                state.backfill = (
                    f"backfilled {len(backfill.results)} window(s) from the "
                    f"{backfill.resolution_ms // 1000} s cubes of {backfill.stored} "
                    f"({backfill.bytes:,} bytes from the sites); live from {seam} "
                    f"({utc(seam)})")
            self.running.deploy_all(state)
            self.running.save()
            return state

    def explain(self, spec: QueryPlan) -> str:
        query = query_from_proto(spec, allow_code=self.allow_code)
        with self.lock:
            plan: PhysicalPlan = self.running.plan(query)
        return f"{explain(query)}\n\n{plan.render()}"

    def publish(self, name: str, results: list[WindowResult], finished: bool) -> None:
        """The root's results for a query; ``finished``: its finite input is all done."""
        with self.lock:
            state = self.running.get(name)
            for result in results:
                # A site's failed stage read none of its records since: whatever its
                # merge says, the window may lack some, and is not final.
                if state.failures:
                    result.warnings.extend(
                        f"the local stage at {site} failed, its records are missing: {error}"
                        for site, error in sorted(state.failures.items()))
                    result = dataclasses.replace(result, final=False, provisional=(
                        finality.provisional([*result.provisional, finality.MISSING_SITE])))
                self.results.publish(result)
            if finished and state.active:
                self.running.stop_all(state, "finished")
                state.detail = "every input has ended"

    def cancel(self, name: str) -> None:
        with self.lock:
            self.running.stop_all(self.running.get(name), "cancelled")

    def link_owner(self, query: str, site: str) -> str:
        """The address of the site controller whose link to its parent carries ``query``
        from ``site``.

        Raises
        ------
        ControlPlaneError
            If the query is not running, the site is not in its tree below the root, or the
            site is down.
        """
        with self.lock:
            state = self.running.get(query)
            site_state = self.membership.site(site)
            if not state.active or state.plan is None:
                msg = f"query {query} is {state.state}, not running"
                raise ControlPlaneError(msg)
            fragment = state.plan.fragments.get(site)
            if fragment is None or not fragment.parent:
                sending = sorted(s for s, f in state.plan.fragments.items() if f.parent)
                msg = (f"{site} sends {query} over no link (it is the root, or not in the "
                       f"query's tree); sites with a link: {', '.join(sending)}")
                raise ControlPlaneError(msg)
            if not site_state.alive or site_state.address is None:
                msg = f"site {site} is down"
                raise ControlPlaneError(msg)
            return site_state.address

    # -- what it shows --------------------------------------------------------------------
    def view(self) -> ControllerView:
        """The controller's state now, read-only (see :class:`ControllerView`)."""
        with self.lock:
            return ControllerView(
                self.current_topology, self.membership.views(),
                tuple(QueryView(q.name, q.state, q.detail, q.replans, q.plan,
                                MappingProxyType(dict(q.failures)),
                                MappingProxyType(dict(q.late_records)))
                      for q in self.queries.values()),
                tuple(self.running.link_load()),
                MappingProxyType(self.links.bps()))

    def _known(self) -> tuple[list[QueryState], dict[str, str]]:
        """The queries, running ones first, and each site's address (empty: down)."""
        with self.lock:
            states = sorted(self.queries.values(), key=lambda q: not q.active)
            return states, self.membership.addresses()

    def has_query(self, name: str) -> bool:
        with self.lock:
            return name in self.queries

    def link_load(self) -> list[tuple[Link, float]]:
        """Every link with the bytes/s the running queries plan to put on it."""
        with self.lock:
            return self.running.link_load()
