"""The global controller: plans each query over the topology and hands every site its part.

It knows the topology, which site controllers have registered and when each last sent a
heartbeat, and every running query with its physical plan. Given a state folder it keeps
the queries and their results there, so that a controller restarted after a crash takes
up its queries again as the sites register. It re-plans a query when a site
stops sending heartbeats (or comes back), or when a link's measured bandwidth moves by more
than ``REPLAN_BANDWIDTH_CHANGE``. It holds no query semantics of its own: rewriting and
planning are :mod:`jetstream.rewrite` and :mod:`jetstream.aggtree`.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType

import networkx as nx

from jetstream import metrics
from jetstream.aggtree.planner import Fragment, PhysicalPlan, plan_query
from jetstream.aggtree.topology import Link, Topology
from jetstream.control.links import LinkMeasurements
from jetstream.control.past import PastQueries
from jetstream.control.results_hub import ResultsHub, utc
from jetstream.control.site_calls import (
    BEATS_PER_TIMEOUT,
    MAX_HEARTBEAT_SPACING_S,
    call_now,
    heartbeat_spacing,
)
from jetstream.control.state import (
    ControllerView,
    LinkReport,
    Placement,
    QueryState,
    QueryView,
    SavedQueries,
    SiteState,
    SiteView,
)
from jetstream.dataplane.history import (
    ReadCubes,
)
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError, JetstreamError, PlacementError
from jetstream.operators import Source
from jetstream.planwire import query_from_bytes, query_from_proto, query_to_proto
from jetstream.results import WindowResult
from jetstream.rewrite import distributed, explain, partial_aggregate
from jetstream.stage.check import check_stage
from jetstream.v1.query_pb2 import QueryPlan

__all__ = ["GlobalController"]

log = logging.getLogger(__name__)



#: Deploys one fragment to the site controller at an address; returns (piece, server) pairs.
Deployer = Callable[[str, Fragment, "QueryState"], list[tuple[str, str]]]
Stopper = Callable[[str, str], None]
#: Makes a call to one site's controller (named first): now, or later (see SiteCalls).
Dispatch = Callable[[str, Callable[[], None]], None]


class GlobalController:
    """The control plane's brain; thread-safe, driven by the gRPC servicer and a clock."""

    def __init__(self, topology: Topology, deploy: Deployer, stop: Stopper, *,
                 heartbeat_timeout_s: float = 6.0, clock: Callable[[], float] = time.monotonic,
                 state_dir: Path | None = None, dispatch: Dispatch = call_now,
                 allow_code: bool = False, cubes: Sequence[QueryPlan] = ()):
        self.topology = topology
        #: The site that makes the results: the topology's root until it dies, then the first
        #: of its standby roots alive; a root that comes back rejoins as a site.
        self.root = topology.root
        #: Declared cubes: queries run from the start so that the sites keep their windows
        #: for history (``jetstream controller --cube``); each is submitted once it can be
        #: placed (a site registers), unless a query of its name runs already.
        self._cubes = list(cubes)
        #: Whether queries may carry code (a ``map`` function, pickled) to run on the sites.
        self.allow_code = allow_code
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.state_dir = state_dir
        self.results = ResultsHub(state_dir / "results" if state_dir else None)
        self.saved = SavedQueries(state_dir)
        self._deploy, self._stop, self.clock = deploy, stop, clock
        self._dispatch = dispatch
        self._deploying: set[tuple[str, str, int]] = set()  # (query, site, version) under way
        self.lock = threading.RLock()
        self.sites = {s.name: SiteState(s.name) for s in topology.sites}
        self.queries: dict[str, QueryState] = {}
        #: The links' bandwidths as the sites measured them.
        self.links = LinkMeasurements(topology, clock)
        #: Questions about the past, answered from the cubes the sites keep.
        self.past = PastQueries(self._known, self.results, self.effective_topology,
                                allow_code)
        self._restore()

    # -- what outlives a restart --------------------------------------------------------------
    def _restore(self) -> None:
        """Take up the queries a previous controller kept in the state folder: each is planned
        anew, under a newer version, and deployed to each site as it registers."""
        root, saved = self.saved.load()
        if root is None:
            return
        path = self.saved.path
        if root in self.sites and root in {self.topology.root, *self.topology.standby_roots}:
            self.root = root  # the root stays where it failed over to
        for entry in saved:
            try:
                if "plan" not in entry:
                    msg = ("it was saved as Python source by an older JetStream-py; submit "
                           "it again")
                    raise ControlPlaneError(msg)
                spec = base64.b64decode(entry["plan"])
                query = query_from_bytes(spec, allow_code=self.allow_code)
                state = QueryState(entry["name"], spec, query,
                                   state=entry["state"], detail=entry["detail"],
                                   replans=entry["replans"], version=entry["version"] + 1,
                                   expected=tuple(entry["expected"]),
                                   resend_from_ms=entry.get("resend_from_ms", 0))
                if state.active:
                    state.plan = self._plan(query)
            except (JetstreamError, KeyError, TypeError, ValueError) as e:
                log.error("%s: cannot take up query %s again: %s", path,
                          entry.get("name", "?"), e)
                continue
            self.queries[state.name] = state
            if not state.active:
                self.results.close(state.name)
            log.info("query %s taken up again (%s, version %d)", state.name, state.state,
                     state.version)
        self._save()

    def _save(self) -> None:
        """Keep every query in the state folder (if any): written whole, atomically."""
        self.saved.save(self.root, self.queries.values())

    # -- sites ------------------------------------------------------------------------------
    def register_site(self, name: str, address: str) -> None:
        with self.lock:
            site = self._site(name)
            came_back = site.address is not None and not site.alive  # it was declared dead
            site.address, site.last_seen, site.alive = address, self.clock(), True
            site.placements.clear()
            site.interval_s = 0.0  # the interval it was given, until its heartbeats say
            log.info("site %s registered at %s", name, address)
            for query in self.queries.values():
                query.deployed.discard(name)  # a fresh controller holds nothing yet
            self._replan_all(f"site {name} is back" if came_back else "")
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
                  failures: dict[str, str] | None = None, interval_s: float = 0.0
                  ) -> list[str]:
        """Record that ``name`` is alive and what it measured (and, for the dashboard, its
        raw input, its links' levels and which process runs which piece, and which queries'
        local stages failed there, and why), and that its next heartbeat comes within
        ``interval_s`` (0: its usual interval); the queries it should run."""
        with self.lock:
            site = self._site(name)
            if site.address is None:
                msg = f"site {name} sent a heartbeat before registering"
                raise ControlPlaneError(msg)
            site.last_seen = self.clock()
            # At most the longest a site may wait; what is not a positive number is ignored.
            site.interval_s = (min(interval_s, MAX_HEARTBEAT_SPACING_S) if interval_s > 0
                               else 0.0)
            site.input_bytes, site.links = input_bytes, dict(reports or {})
            if placements is not None:
                site.placements = [p for p in placements if p.query in self.queries]
            for failed, error in (failures or {}).items():
                self._stage_failed(failed, name, error)
            changed = [peer for peer, bps in links.items() if self.links.record(name, peer, bps)]
            if not site.alive:
                site.alive = True
                self._replan_all(f"site {name} is back")
            elif changed:
                self._replan_all(f"measured bandwidth of {name}-{changed[0]} changed")
            for query in self.queries.values():  # retry what could not be deployed before
                if (query.active and query.plan is not None
                        and name in query.plan.fragments and name not in query.deployed):
                    self._deploy_all(query)
            # Planned here but not deployed yet (its parent has not registered) counts too:
            # a site that runs it already, for a restarted controller, goes on with it.
            return sorted(q.name for q in self.queries.values() if q.active and (
                name in q.deployed or (q.plan is not None and name in q.plan.fragments)))

    def _stage_failed(self, query: str, site: str, error: str) -> None:
        """A site's local stage of ``query`` failed: the query goes on without its records,
        degraded, and says so in its status and in every result from now on."""
        state = self.queries.get(query)
        if state is None or state.failures.get(site) == error:
            return
        state.failures[site] = error
        log.error("query %s: %s", query, error)
        if state.state == "running":
            state.state = "degraded"
        state.detail = "; ".join(state.failures.values())
        self._save()

    def check_liveness(self) -> list[str]:
        """Mark sites whose heartbeats stopped as dead, re-plan; the sites newly dead."""
        with self.lock:
            now = self.clock()
            dead = [s.name for s in self.sites.values() if s.alive and s.last_seen is not None
                    and now - s.last_seen > self.timeout_of(s.name)]
            for name in dead:
                log.warning("site %s missed its heartbeats; re-planning", name)
            if dead:
                self._lose(dead, f"site {', '.join(dead)} stopped sending heartbeats")
            return dead

    def leave(self, name: str) -> None:
        """``name`` is shutting down: re-plan without it now, as if it were dead (it comes
        back by registering again)."""
        with self.lock:
            if self._site(name).alive:
                log.info("site %s is shutting down; re-planning without it", name)
                self._lose([name], f"site {name} shut down")

    def _lose(self, names: list[str], reason: str) -> None:
        for name in names:
            self.sites[name].alive = False
            self.sites[name].placements.clear()
            self.sites[name].links.clear()  # its last levels are not the links' now
        if self.root in names:
            self._fail_over()
        self._replan_all(reason)

    def _fail_over(self) -> None:
        """The root is dead: the first standby root alive (the topology's root first, if it
        has come back since) takes its place, for good. Every running query starts again
        from its first window not settled: its sites send what they kept of it again."""
        dead = self.root
        order = [self.topology.root, *self.topology.standby_roots]
        standby = next((name for name in order if name != dead and self.sites[name].alive
                        and self.sites[name].address is not None), None)
        if standby is None:
            if self.topology.standby_roots:
                log.error("the root %s is dead and no standby root is alive (%s)", dead,
                          ", ".join(self.topology.standby_roots))
            return
        self.root = standby
        for state in self.queries.values():
            if state.active:
                state.resend_from_ms = self.results.unsettled_from(state.name)
                log.warning("query %s: the root %s is dead, %s takes its place; the sites "
                            "send again what they kept of the windows since %s", state.name,
                            dead, standby, utc(state.resend_from_ms))
        metrics.ROOT_FAILOVERS.inc()
        self._save()

    @property
    def current_topology(self) -> Topology:
        """The topology with the root where it is now (see :attr:`root`)."""
        if self.root == self.topology.root:
            return self.topology
        return dataclasses.replace(self.topology, root=self.root)

    def timeout_of(self, site: str) -> float:
        """How long ``site`` may be silent before it is taken for dead: the controller's
        heartbeat timeout, longer for a site whose thin link stretches its heartbeats (as
        configured, or as its last heartbeat said)."""
        said = self.sites[site].interval_s if site in self.sites else 0.0
        return max(self.heartbeat_timeout_s,
                   BEATS_PER_TIMEOUT * max(heartbeat_spacing(self.topology, site), said))

    def expire_measurements(self) -> list[str]:
        """Forget the link measurements no heartbeat has repeated lately (see
        :meth:`LinkMeasurements.expire`), re-planning if the configured bandwidths they fall
        back to are far from what the plans assumed; the links forgotten, as "site-peer"."""
        with self.lock:
            names, moved = self.links.expire(self.timeout_of)
            if moved:
                self._replan_all(f"no recent measurement of {', '.join(names)}: planned at "
                                 "the configured bandwidth")
            return names

    def effective_topology(self, *, measured: bool = True) -> Topology:
        """The topology as it stands: measured bandwidths in (unless not ``measured``: then
        the configured ones); dead sites, links measured at zero (cut, either way), and the
        sites they cut off from the root left out."""
        dead = {s.name for s in self.sites.values() if s.address is not None and not s.alive}
        bandwidth = {ends: bps for ends, bps in self.links.bps().items()
                     if measured or bps <= 0}
        links = [dataclasses.replace(link, bandwidth_bps=bandwidth.get(link.ends,
                                                                       link.bandwidth_bps))
                 for link in self.topology.links if not link.ends & dead]
        links = [link for link in links if link.bandwidth_bps > 0]
        graph = nx.Graph([tuple(link.ends) for link in links])
        graph.add_nodes_from(s.name for s in self.topology.sites if s.name not in dead)
        reachable = (nx.node_connected_component(graph, self.root)
                     if self.root in graph else set())
        sites = tuple(s for s in self.topology.sites if s.name in reachable)
        links = [link for link in links if link.ends <= reachable]
        return dataclasses.replace(self.current_topology, sites=sites, links=tuple(links))

    def _plan(self, query: Query) -> PhysicalPlan:
        """Plan ``query`` on the topology as it stands. A link is measured only while it is
        saturated, so its measurement is below what exact partials need: where no tree fits
        the measured bandwidths, the plan is made for the configured ones, and the links'
        degradation levels carry what does not fit."""
        topology = self.effective_topology()
        if not topology.sites:
            standby = (f" and no standby root ({', '.join(self.topology.standby_roots)}) is up"
                       if self.topology.standby_roots else "")
            msg = (f"the root {self.root} is down{standby}; the sites keep their partials "
                   "until it is back")
            raise PlacementError(msg)
        try:
            return plan_query(query, topology)
        except PlacementError:
            if not self.links.measured:
                raise
            return plan_query(query, self.effective_topology(measured=False))

    # -- queries ----------------------------------------------------------------------------
    def submit(self, spec: QueryPlan, since_ms: int | None = None,
               read: ReadCubes | None = None) -> QueryState:
        """Run the query whose plan is ``spec`` (refused, with a PlanError, if it does not
        check out, carries code this controller does not allow, or cannot be placed).

        With ``since_ms``, its results start with the windows since then, from the cubes of
        a query that ran (see :meth:`backfill`; ``read`` asks a site for its kept windows),
        and it runs live from the seam on."""
        query = query_from_proto(spec, allow_code=self.allow_code)
        backfill, seam = None, 0
        if since_ms is not None:
            if read is None:
                msg = "this controller reads no cubes: it cannot backfill"
                raise ControlPlaneError(msg)
            query, backfill, seam = self.past.backfill(query, since_ms, read)
            spec = query_to_proto(query)
        split = distributed(query)  # refuse now what no site could run
        partial_aggregate(split)
        check_stage(split)
        with self.lock:
            existing = self.queries.get(query.name)
            if existing is not None and existing.active:
                msg = f"query {query.name} is already running; cancel it first"
                raise ControlPlaneError(msg)
            self.links.planning()
            plan = self._plan(query)  # refuse what cannot be placed
            self.results.reset(query.name)
            for result in backfill.results if backfill is not None else ():
                self.results.publish(result)  # before the first live window
            state = self.queries[query.name] = QueryState(
                query.name, spec.SerializeToString(deterministic=True), query, plan,
                expected=tuple(sorted(self._source_sites(query))))
            if backfill is not None:
                state.backfill = (
                    f"backfilled {len(backfill.results)} window(s) from the "
                    f"{backfill.resolution_ms // 1000} s cubes of {backfill.stored} "
                    f"({backfill.bytes:,} bytes from the sites); live from {seam} "
                    f"({utc(seam)})")
            self._deploy_all(state)
            self._save()
            return state

    def explain(self, spec: QueryPlan) -> str:
        query = query_from_proto(spec, allow_code=self.allow_code)
        with self.lock:
            plan = self._plan(query)
        return f"{explain(query)}\n\n{plan.render()}"

    def publish(self, name: str, results: list[WindowResult], finished: bool) -> None:
        """The root's results for a query; ``finished``: its finite input is all done."""
        with self.lock:
            state = self._query(name)
            for result in results:
                result.warnings.extend(f"the local stage at {site} failed, its records are "
                                       f"missing: {error}"
                                       for site, error in sorted(state.failures.items()))
                self.results.publish(result)
            if finished and state.active:
                self._stop_all(state, "finished")
                state.detail = "every input has ended"

    def cancel(self, name: str) -> None:
        with self.lock:
            self._stop_all(self._query(name), "cancelled")

    def _stop_all(self, state: QueryState, why: str) -> None:
        for site in sorted(state.deployed):
            self._stop_on(site, state.name)
        state.state, state.deployed = why, set()
        self.results.close(state.name)
        self._save()

    def _replan_all(self, reason: str) -> None:
        for state in self.queries.values():
            if not state.active:
                continue
            if reason:
                self._replan(state, reason)
            else:
                self._deploy_all(state)

    def _replan(self, state: QueryState, reason: str) -> None:
        """Plan ``state``'s query anew; deploy the new version where its tree changed."""
        self.links.planning()
        try:
            plan = self._plan(state.query)
        except JetstreamError as e:
            state.state, state.detail = "degraded", f"{reason}; cannot re-plan: {e}"
            log.error("query %s: %s", state.name, state.detail)
            self._save()
            return
        # Nothing to send again if every site of the same tree holds its part already (a
        # site that registered anew since, at a new address perhaps, does not).
        unchanged = (state.plan is not None and plan.fragments == state.plan.fragments
                     and set(plan.fragments) <= state.deployed)
        state.plan, state.replans, state.detail = plan, state.replans + 1, reason
        metrics.REPLANS.labels(state.name).inc()
        missing = sorted(self._source_sites(state.query) - set(plan.fragments))
        state.state = "degraded" if missing else "running"
        if missing:
            state.detail += f"; no data from {', '.join(missing)}"
        # A site the new plan leaves out stops its part, unless it is only cut off from the
        # root: then it goes on processing locally for when the partition heals.
        reachable = {s.name for s in self.effective_topology().sites}
        for site in sorted(state.deployed - set(plan.fragments)):
            if site in reachable:
                self._stop_on(site, state.name)
            if site in reachable or not self.sites[site].alive:
                state.deployed.discard(site)
        if unchanged:
            log.info("query %s re-planned (%s): the same tree", state.name, reason)
            self._save()
            return
        state.version += 1
        log.info("query %s re-planned (%s)", state.name, reason)
        self._deploy_all(state, force=True)
        self._save()

    def _deploy_all(self, state: QueryState, force: bool = False) -> None:
        assert state.plan is not None
        for name, fragment in state.plan.fragments.items():
            site = self.sites[name]
            if not site.alive or site.address is None or (name in state.deployed and not force):
                continue  # deployed when the site registers
            if fragment.parent and self.sites[fragment.parent].address is None:
                continue  # deployed when its parent registers: it has nowhere to send yet
            if (state.name, name, state.version) in self._deploying:
                continue  # on its way
            self._deploying.add((state.name, name, state.version))
            self._dispatch(name, functools.partial(self._deploy_to, state, copy.copy(state),
                                                   fragment, site.address))

    def _deploy_to(self, state: QueryState, asked: QueryState, fragment: Fragment,
                   address: str) -> None:
        """Deploy ``fragment`` of the query version ``asked`` (a copy of ``state`` as it was
        when the deploy was asked for) to the site controller at ``address``; record where
        it runs unless the query moved on meanwhile (a newer version, or cancelled) or the
        site registered anew."""
        name = fragment.site
        try:
            placements = self._deploy(address, fragment, asked)
        except ControlPlaneError as e:
            log.warning("deploying %s to %s failed: %s", state.name, name, e)
            placements = None
        with self.lock:
            self._deploying.discard((state.name, name, asked.version))
            site = self.sites[name]
            if (placements is None or not state.active or state.version != asked.version
                    or site.address != address):
                return
            site.placements = [p for p in site.placements if p.query != state.name] + [
                Placement(state.name, piece, server) for piece, server in placements]
            state.deployed.add(name)

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
            state = self._query(query)
            site_state = self._site(site)
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

    def _stop_on(self, site: str, query: str) -> None:
        state = self.sites[site]
        state.placements = [p for p in state.placements if p.query != query]
        if state.alive and state.address is not None:
            self._dispatch(site, functools.partial(self._stop_at, state.address, query, site))

    def _stop_at(self, address: str, query: str, site: str) -> None:
        try:
            self._stop(address, query)
        except ControlPlaneError as e:
            log.warning("stopping %s on %s failed: %s", query, site, e)

    def _source_sites(self, query: Query) -> set[str]:
        plan = query.plan()
        names = {op.name for op in map(plan.op, plan.topological()) if isinstance(op, Source)}
        return {site.name for name in names for site in self.topology.sites_with(name)}

    def _site(self, name: str) -> SiteState:
        if name not in self.sites:
            msg = (f"no site named {name!r} in topology {self.topology.name}; "
                   f"its sites are {', '.join(self.sites)}")
            raise ControlPlaneError(msg)
        return self.sites[name]

    def _query(self, name: str) -> QueryState:
        if name not in self.queries:
            msg = f"no query named {name!r}"
            raise ControlPlaneError(msg)
        return self.queries[name]

    def view(self) -> ControllerView:
        """The controller's state now, read-only (see :class:`ControllerView`)."""
        with self.lock:
            now = self.clock()
            return ControllerView(
                self.current_topology,
                tuple(SiteView(
                    s.name, self.topology.site(s.name).kind.value, s.address, s.alive,
                    None if s.last_seen is None else now - s.last_seen, tuple(s.placements),
                    s.input_bytes, MappingProxyType(dict(s.links)))
                    for s in self.sites.values()),
                tuple(QueryView(q.name, q.state, q.detail, q.replans, q.plan,
                                MappingProxyType(dict(q.failures)))
                      for q in self.queries.values()),
                tuple(self.link_load()),
                MappingProxyType(self.links.bps()))

    def _known(self) -> tuple[list[QueryState], dict[str, str]]:
        """The queries, running ones first, and each site's address (empty: down)."""
        with self.lock:
            states = sorted(self.queries.values(), key=lambda q: not q.active)
            addresses = {name: (site.address or "") if site.alive else ""
                         for name, site in self.sites.items()}
        return states, addresses

    def has_query(self, name: str) -> bool:
        with self.lock:
            return name in self.queries

    def link_load(self) -> list[tuple[Link, float]]:
        """Every link with the bytes/s the running queries plan to put on it."""
        load: dict[frozenset[str], float] = {}
        for state in self.queries.values():
            if state.plan is None or not state.active:
                continue
            for child, parent, rate in state.plan.tree.edges(data="bytes_per_s"):
                ends = frozenset((child, parent))
                load[ends] = load.get(ends, 0.0) + rate
        topology = self.effective_topology()
        return [(link, load.get(link.ends, 0.0)) for link in topology.links]


