"""Which sites are in, which of them is the root, and what their links measure: the global
controller's membership and liveness.

A site is in once its controller registers, and stays in while its heartbeats come, each
within the site's timeout (:meth:`Membership.timeout_of`). A site that falls silent, or says
it is leaving, is lost; a root that is lost gives its place to the first standby root alive,
for good. :meth:`Membership.effective_topology` is the topology the queries are planned on: the
measured bandwidths in, the dead sites and the sites they cut off from the root out.
Membership knows nothing of queries: the controller (:mod:`.global_controller`) re-plans
them when membership changes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType

import networkx as nx

from jetstream.aggtree.topology import Topology
from jetstream.control.links import LinkMeasurements
from jetstream.control.site_calls import (
    BEATS_PER_TIMEOUT,
    MAX_HEARTBEAT_SPACING_S,
    heartbeat_spacing,
)
from jetstream.control.state import LinkReport, Placement, SiteState, SiteView
from jetstream.errors import ControlPlaneError

__all__ = ["Membership"]

log = logging.getLogger(__name__)


class Membership:
    """The sites of ``topology`` as their controllers register, beat and fall silent, timed
    by ``clock``; not thread-safe (the controller holds its lock around every call)."""

    def __init__(self, topology: Topology, heartbeat_timeout_s: float,
                 clock: Callable[[], float]) -> None:
        self.topology, self.heartbeat_timeout_s, self.clock = topology, heartbeat_timeout_s, clock
        #: The site that makes the results: the topology's root until it dies, then the first
        #: of its standby roots alive; a root that comes back rejoins as a site.
        self.root = topology.root
        self.sites = {s.name: SiteState(s.name) for s in topology.sites}
        #: The links' bandwidths as the sites measured them.
        self.links = LinkMeasurements(topology, clock)

    def site(self, name: str) -> SiteState:
        if name not in self.sites:
            msg = (f"no site named {name!r} in topology {self.topology.name}; "
                   f"its sites are {', '.join(self.sites)}")
            raise ControlPlaneError(msg)
        return self.sites[name]

    def register(self, name: str, address: str, *, allows_code: bool = False) -> bool:
        """``name``'s controller registered at ``address`` (running the ``map`` functions
        plans carry if it ``allows_code``); whether the site was taken for dead before."""
        site = self.site(name)
        came_back = site.address is not None and not site.alive
        site.address, site.last_seen, site.alive = address, self.clock(), True
        site.allows_code = allows_code
        site.placements.clear()
        site.interval_s = 0.0  # the interval it was given, until its heartbeats say
        log.info("site %s registered at %s", name, address)
        return came_back

    def beat(self, name: str, links: Mapping[str, float], *, input_bytes: int,
             reports: Mapping[str, LinkReport], placements: list[Placement] | None,
             interval_s: float, behind: Mapping[str, tuple[int, float]] | None = None
             ) -> tuple[bool, list[str]]:
        """A heartbeat of ``name`` (see ``GlobalController.heartbeat``): whether the site was
        taken for dead before, and the peers whose links' measurements moved far enough to
        plan again."""
        site = self.site(name)
        if site.address is None:
            msg = f"site {name} sent a heartbeat before registering"
            raise ControlPlaneError(msg)
        site.last_seen = self.clock()
        # At most the longest a site may wait; what is not a positive number is ignored.
        site.interval_s = min(interval_s, MAX_HEARTBEAT_SPACING_S) if interval_s > 0 else 0.0
        # A report without a profile keeps the last one sent: sites send it only when it
        # changed, and at most every PROFILE_REPORT_S (it costs a thin link's heartbeats).
        site.input_bytes, site.links = input_bytes, {
            query: report if report.profile or query not in site.links
            else dataclasses.replace(report, profile=site.links[query].profile)
            for query, report in reports.items()}
        if placements is not None:
            site.placements = placements
        site.behind = dict(behind or {})
        changed = [peer for peer, bps in links.items() if self.links.record(name, peer, bps)]
        came_back, site.alive = not site.alive, True
        return came_back, changed

    def silent(self) -> list[str]:
        """The sites alive until now whose heartbeats stopped."""
        now = self.clock()
        return [s.name for s in self.sites.values() if s.alive and s.last_seen is not None
                and now - s.last_seen > self.timeout_of(s.name)]

    def lose(self, names: list[str]) -> str | None:
        """Take ``names`` for dead; if the root is among them, the standby root that takes
        its place (None: the root stays, lost or not)."""
        for name in names:
            self.sites[name].alive = False
            self.sites[name].placements.clear()
            self.sites[name].links.clear()  # its last levels are not the links' now
        return self._fail_over() if self.root in names else None

    def _fail_over(self) -> str | None:
        """The root is dead: the first standby root alive (the topology's root first, if it
        has come back since) takes its place, for good."""
        dead = self.root
        order = [self.topology.root, *self.topology.standby_roots]
        standby = next((name for name in order if name != dead and self.sites[name].alive
                        and self.sites[name].address is not None), None)
        if standby is None:
            if self.topology.standby_roots:
                log.error("the root %s is dead and no standby root is alive (%s)", dead,
                          ", ".join(self.topology.standby_roots))
            return None
        self.root = standby
        return standby

    def restore_root(self, root: str) -> None:
        """Where a previous controller left the root (it stays where it failed over to)."""
        if root in self.sites and root in {self.topology.root, *self.topology.standby_roots}:
            self.root = root

    def timeout_of(self, site: str) -> float:
        """How long ``site`` may be silent before it is taken for dead: the controller's
        heartbeat timeout, longer for a site whose thin link stretches its heartbeats (as
        configured, or as its last heartbeat said)."""
        said = self.sites[site].interval_s if site in self.sites else 0.0
        return max(self.heartbeat_timeout_s,
                   BEATS_PER_TIMEOUT * max(heartbeat_spacing(self.topology, site), said))

    @property
    def current_topology(self) -> Topology:
        """The topology with the root where it is now (see :attr:`root`)."""
        if self.root == self.topology.root:
            return self.topology
        return dataclasses.replace(self.topology, root=self.root)

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

    def addresses(self) -> dict[str, str]:
        """Each site's controller's address (empty: down)."""
        return {name: (site.address or "") if site.alive else ""
                for name, site in self.sites.items()}

    def views(self) -> tuple[SiteView, ...]:
        """Each site as it is now, read-only."""
        now = self.clock()
        return tuple(SiteView(
            s.name, self.topology.site(s.name).kind.value, s.address, s.alive,
            None if s.last_seen is None else now - s.last_seen, tuple(s.placements),
            s.input_bytes, MappingProxyType(dict(s.links)), MappingProxyType(dict(s.behind)))
            for s in self.sites.values())
