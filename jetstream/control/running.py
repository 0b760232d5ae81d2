"""The queries a global controller runs: each planned on the topology as it stands, deployed
to its sites, planned again when the sites or their links move, stopped when it ends.

:class:`RunningQueries` keeps every query's state (:class:`~jetstream.control.state.QueryState`)
and, given a state folder, keeps it there too, so that a controller restarted after a crash
takes its queries up again as the sites register. It asks :class:`~.membership.Membership`
where the sites are, and makes its calls to the sites' controllers through ``deploy`` and
``stop``, each on its site's own queue (``dispatch``, see :mod:`.site_calls`).
"""

from __future__ import annotations

import base64
import copy
import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from jetstream import metrics
from jetstream.aggtree.planner import Fragment, PhysicalPlan, plan_query
from jetstream.aggtree.topology import Link
from jetstream.control.membership import Membership
from jetstream.control.results_hub import ResultsHub, utc
from jetstream.control.state import Placement, QueryState, SavedQueries
from jetstream.dsl import Query, reading
from jetstream.errors import ControlPlaneError, JetstreamError, PlacementError, PlanError
from jetstream.formats import DEFAULT_FORMAT
from jetstream.operators import Map, Source
from jetstream.planwire import query_from_bytes

__all__ = ["Deployer", "Dispatch", "RunningQueries", "Stopper"]

log = logging.getLogger(__name__)

#: Deploys one fragment to the site controller at an address; returns (piece, server) pairs.
Deployer = Callable[[str, Fragment, QueryState], list[tuple[str, str]]]
Stopper = Callable[[str, str], None]
#: Makes a call to one site's controller (named first): now, or later (see SiteCalls).
Dispatch = Callable[[str, Callable[[], None]], None]


class RunningQueries:
    """The controller's queries; every method but the deploys' own calls runs under ``lock``,
    which the controller holds (the deploys take it when their calls return)."""

    def __init__(self, membership: Membership, results: ResultsHub, deploy: Deployer,
                 stop: Stopper, dispatch: Dispatch, lock: threading.RLock,
                 state_dir: Path | None, allow_code: bool) -> None:
        self.membership, self.results = membership, results
        self._deploy, self._stop, self._dispatch, self._lock = deploy, stop, dispatch, lock
        self.saved = SavedQueries(state_dir)
        self.allow_code = allow_code
        self.queries: dict[str, QueryState] = {}
        self._deploying: set[tuple[str, str, int]] = set()  # (query, site, version) under way

    # -- what outlives a restart ----------------------------------------------------------
    def restore(self) -> None:
        """Take up the queries a previous controller kept in the state folder: each is planned
        anew, under a newer version, and deployed to each site as it registers."""
        root, saved = self.saved.load()
        if root is None:
            return
        self.membership.restore_root(root)
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
                    state.plan = self.plan(query)
            except (JetstreamError, KeyError, TypeError, ValueError) as e:
                log.error("%s: cannot take up query %s again: %s", self.saved.path,
                          entry.get("name", "?"), e)
                continue
            self.queries[state.name] = state
            if not state.active:
                self.results.close(state.name)
            log.info("query %s taken up again (%s, version %d)", state.name, state.state,
                     state.version)
        self.save()

    def save(self) -> None:
        """Keep every query in the state folder (if any): written whole, atomically."""
        self.saved.save(self.membership.root, self.queries.values())

    # -- planning ---------------------------------------------------------------------------
    def plan(self, query: Query) -> PhysicalPlan:
        """Plan ``query`` on the topology as it stands. A link is measured only while it is
        saturated, so its measurement is below what exact partials need: where no tree fits
        the measured bandwidths, the plan is made for the configured ones, and the links'
        degradation levels carry what does not fit."""
        members = self.membership
        topology = members.effective_topology()
        if not topology.sites:
            standby = members.topology.standby_roots
            down = f" and no standby root ({', '.join(standby)}) is up" if standby else ""
            msg = (f"the root {members.root} is down{down}; the sites keep their partials "
                   "until it is back")
            raise PlacementError(msg)
        try:
            return plan_query(query, topology)
        except PlacementError:
            if not members.links.measured:
                raise
            return plan_query(query, members.effective_topology(measured=False))

    def start(self, query: Query, spec: bytes) -> QueryState:
        """Run ``query`` (``spec``: its plan as submitted): planned now (refused if it cannot
        be placed), deployed to every site that is up."""
        existing = self.queries.get(query.name)
        if existing is not None and existing.active:
            msg = f"query {query.name} is already running; cancel it first"
            raise ControlPlaneError(msg)
        self.read_as(query)  # again: a query started since the submit's check may disagree
        self.membership.links.planning()
        plan = self.plan(query)  # refuse what cannot be placed
        self.check_code(query, plan)
        state = self.queries[query.name] = QueryState(
            query.name, spec, query, plan, expected=tuple(sorted(self.source_sites(query))))
        return state

    def read_as(self, query: Query) -> Query:
        """``query`` reading each source in the format the topology declares for it where
        it names none; refused (PlanError) where it names another, or where a running query
        reads the source in another: a site reads a source's files one way."""
        topology = self.membership.topology
        declared = {s.name: f for s in query.plan().sources()
                    if (f := topology.source_format(s.name)) is not None}
        query = reading(query, declared)
        running = {(s.name, s.format or DEFAULT_FORMAT): q.name for q in self.queries.values()
                   if q.active and q.name != query.name for s in q.query.plan().sources()}
        for source in query.plan().sources():
            format = source.format or DEFAULT_FORMAT
            if declared.get(source.name, format) != format:
                msg = (f"query {query.name}: source {source.name} is read as {format}, and "
                       f"the topology's sites declare its files {declared[source.name]}: "
                       f"drop the source's format=, or make it {declared[source.name]!r}")
                raise PlanError(msg)
            other = next((f"query {name} reads it as {f}" for (s, f), name in running.items()
                          if s == source.name and f != format), None)
            if other:
                msg = (f"query {query.name}: source {source.name} is read as {format}, and "
                       f"{other}: a site reads a source's files one way; name one format "
                       "in both, or declare it in the topology")
                raise PlanError(msg)
        return query

    def check_code(self, query: Query, plan: PhysicalPlan) -> None:
        """Refuse a plan that sends a ``map`` step's function (code) to a registered site
        that said it runs none (started without ``--allow-code``): every site of the plan
        reads the whole query. A site not registered yet refuses it itself when deployed."""
        logical = query.plan()
        maps = [op.label for op in map(logical.op, logical.topological()) if isinstance(op, Map)]
        sites = self.membership.sites
        refusing = sorted(name for name in plan.fragments
                          if name in sites and sites[name].address is not None
                          and not sites[name].allows_code)
        if maps and refusing:
            msg = (f"query {query.name}: map {maps[0]} travels as code, and the plan sends it "
                   f"to sites that run none (started without --allow-code): "
                   f"{', '.join(refusing)}; start them with jetstream site --allow-code, or "
                   "write the step with with_column and where")
            raise PlacementError(msg)

    def source_sites(self, query: Query) -> set[str]:
        """The sites that hold a source of ``query``."""
        plan = query.plan()
        names = {op.name for op in map(plan.op, plan.topological()) if isinstance(op, Source)}
        return {site.name for name in names
                for site in self.membership.topology.sites_with(name)}

    def replan_all(self, reason: str) -> None:
        """Plan every running query again (``reason`` empty: deploy each where it is not yet)."""
        for state in self.queries.values():
            if not state.active:
                continue
            if reason:
                self._replan(state, reason)
            else:
                self.deploy_all(state)

    def _replan(self, state: QueryState, reason: str) -> None:
        """Plan ``state``'s query anew; deploy the new version where its tree changed."""
        self.membership.links.planning()
        try:
            plan = self.plan(state.query)
        except JetstreamError as e:
            state.state, state.detail = "degraded", f"{reason}; cannot re-plan: {e}"
            log.error("query %s: %s", state.name, state.detail)
            self.save()
            return
        # Nothing to send again if every site of the same tree holds its part already (a
        # site that registered anew since, at a new address perhaps, does not).
        unchanged = (state.plan is not None and plan.fragments == state.plan.fragments
                     and set(plan.fragments) <= state.deployed)
        state.plan, state.replans, state.detail = plan, state.replans + 1, reason
        metrics.REPLANS.labels(state.name).inc()
        missing = sorted(self.source_sites(state.query) - set(plan.fragments))
        state.state = "degraded" if missing else "running"
        if missing:
            state.detail += f"; no data from {', '.join(missing)}"
        # A site the new plan leaves out stops its part, unless it is only cut off from the
        # root: then it goes on processing locally for when the partition heals.
        reachable = {s.name for s in self.membership.effective_topology().sites}
        for site in sorted(state.deployed - set(plan.fragments)):
            if site in reachable:
                self._stop_on(site, state.name)
            if site in reachable or not self.membership.sites[site].alive:
                state.deployed.discard(site)
        if unchanged:
            log.info("query %s re-planned (%s): the same tree", state.name, reason)
            self.save()
            return
        state.version += 1
        log.info("query %s re-planned (%s)", state.name, reason)
        self.deploy_all(state, force=True)
        self.save()

    def resend_since_unsettled(self, dead: str, standby: str) -> None:
        """The root ``dead`` failed over to ``standby``: every running query starts again
        from its first window not settled, its sites sending what they kept of it again."""
        for state in self.queries.values():
            if state.active:
                state.resend_from_ms = self.results.unsettled_from(state.name)
                log.warning("query %s: the root %s is dead, %s takes its place; the sites "
                            "send again what they kept of the windows since %s", state.name,
                            dead, standby, utc(state.resend_from_ms))
        self.save()

    # -- the sites --------------------------------------------------------------------------
    def registered(self, site: str) -> None:
        """``site``'s controller registered anew: it holds no query yet."""
        for query in self.queries.values():
            query.deployed.discard(site)

    def deploy_missing(self, site: str) -> None:
        """Deploy to ``site`` what could not be deployed there before."""
        for query in self.queries.values():
            if (query.active and query.plan is not None
                    and site in query.plan.fragments and site not in query.deployed):
                self.deploy_all(query)

    def at(self, site: str) -> list[str]:
        """The queries ``site`` should run. Planned there but not deployed yet (its parent has
        not registered) counts too: a site that runs it already, for a restarted controller,
        goes on with it."""
        return sorted(q.name for q in self.queries.values() if q.active and (
            site in q.deployed or (q.plan is not None and site in q.plan.fragments)))

    def stage_failed(self, query: str, site: str, error: str) -> None:
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
        self.save()

    def deploy_all(self, state: QueryState, force: bool = False) -> None:
        assert state.plan is not None
        sites = self.membership.sites
        for name, fragment in state.plan.fragments.items():
            site = sites[name]
            if not site.alive or site.address is None or (name in state.deployed and not force):
                continue  # deployed when the site registers
            if fragment.parent and sites[fragment.parent].address is None:
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
        refused = None
        try:
            placements = self._deploy(address, fragment, asked)
        except ControlPlaneError as e:
            log.warning("deploying %s to %s failed: %s", state.name, name, e)
            placements = None
        except PlanError as e:  # the site cannot run its fragment: the query's status says so
            placements, refused = None, f"site {name} refused its part: {e}"
        with self._lock:
            self._deploying.discard((state.name, name, asked.version))
            if refused is not None and state.active and state.version == asked.version:
                self.stage_failed(state.name, name, refused)
            site = self.membership.sites[name]
            if (placements is None or not state.active or state.version != asked.version
                    or site.address != address):
                return
            site.placements = [p for p in site.placements if p.query != state.name] + [
                Placement(state.name, piece, server) for piece, server in placements]
            state.deployed.add(name)

    def stop_all(self, state: QueryState, why: str) -> None:
        """Stop ``state``'s query on every site, for ``why`` ("finished", "cancelled")."""
        for site in sorted(state.deployed):
            self._stop_on(site, state.name)
        state.state, state.deployed = why, set()
        self.results.close(state.name)
        self.save()

    def _stop_on(self, site: str, query: str) -> None:
        state = self.membership.sites[site]
        state.placements = [p for p in state.placements if p.query != query]
        if state.alive and state.address is not None:
            self._dispatch(site, functools.partial(self._stop_at, state.address, query, site))

    def _stop_at(self, address: str, query: str, site: str) -> None:
        try:
            self._stop(address, query)
        except ControlPlaneError as e:
            log.warning("stopping %s on %s failed: %s", query, site, e)

    def get(self, name: str) -> QueryState:
        if name not in self.queries:
            msg = f"no query named {name!r}"
            raise ControlPlaneError(msg)
        return self.queries[name]

    def link_load(self) -> list[tuple[Link, float]]:
        """Every link with the bytes/s the running queries plan to put on it."""
        load: dict[frozenset[str], float] = {}
        for state in self.queries.values():
            if state.plan is None or not state.active:
                continue
            for child, parent, rate in state.plan.tree.edges(data="bytes_per_s"):
                ends = frozenset((child, parent))
                load[ends] = load.get(ends, 0.0) + rate
        topology = self.membership.effective_topology()
        return [(link, load.get(link.ends, 0.0)) for link in topology.links]
