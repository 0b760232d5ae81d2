"""The wide-area links as the sites measure them: what a global controller plans with.

A site reports a link's bandwidth in its heartbeats only while the link paces some query (see
:func:`jetstream.control.daemons.link_measurements`). :class:`LinkMeasurements` keeps the
latest report of each link, says when one is far enough from what the plans were made with
to plan again (``REPLAN_BANDWIDTH_CHANGE``), and forgets a report no heartbeat has repeated
for a while, so that the link is planned at its configured bandwidth again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from jetstream import metrics
from jetstream.aggtree.topology import Topology
from jetstream.control.state import Measurement
from jetstream.errors import PlacementError

__all__ = ["REPLAN_BANDWIDTH_CHANGE", "LinkMeasurements"]

#: A measured bandwidth this far (relative) from the planned one triggers a re-plan.
REPLAN_BANDWIDTH_CHANGE = 0.25


class LinkMeasurements:
    """The latest measurement of each link of ``topology``, by its ends, timed by ``clock``;
    not thread-safe (the controller holds its lock)."""

    def __init__(self, topology: Topology, clock: Callable[[], float]) -> None:
        self.topology, self.clock = topology, clock
        self.measured: dict[frozenset[str], Measurement] = {}
        #: The measurements the latest plan was made with (link ends -> bits/s).
        self.planned: dict[frozenset[str], float] = {}

    def bps(self) -> dict[frozenset[str], float]:
        """Each measured link's bandwidth (bits/s), by its ends."""
        return {ends: m.bandwidth_bps for ends, m in self.measured.items()}

    def planning(self) -> None:
        """A plan is being made with the measurements as they are now."""
        self.planned = self.bps()

    def record(self, site: str, peer: str, bps: float) -> bool:
        """Record a measurement; whether it is far from what the plans were made for."""
        try:
            configured = self.topology.link(site, peer).bandwidth_bps
        except PlacementError:
            return False  # not a link of the topology
        ends = frozenset((site, peer))
        self.measured[ends] = Measurement(bps, self.clock(), site, peer)
        metrics.LINK_MEASURED_BANDWIDTH.labels(metrics.link_name(site, peer)).set(bps / 8)
        planned = self.planned.get(ends, configured)
        return abs(bps - planned) > REPLAN_BANDWIDTH_CHANGE * planned

    def expire(self, timeout_of: Callable[[str], float]) -> tuple[list[str], bool]:
        """Forget the measurements no heartbeat has repeated for two of the measuring site's
        heartbeat timeouts (``timeout_of``): such a link is planned at its configured
        bandwidth again. The links forgotten, as "site-peer", and whether that bandwidth is
        far from what the plans assumed."""
        now = self.clock()
        stale = [ends for ends, m in self.measured.items()
                 if now - m.at > 2 * timeout_of(m.site)]
        names, moved = [], False
        for ends in stale:
            forgotten = self.measured.pop(ends)
            site, peer = forgotten.site, forgotten.peer
            names.append(f"{site}-{peer}")
            with contextlib.suppress(KeyError):
                metrics.LINK_MEASURED_BANDWIDTH.remove(metrics.link_name(site, peer))
            configured = self.topology.link(site, peer).bandwidth_bps
            planned = self.planned.get(ends, configured)
            moved |= abs(configured - planned) > REPLAN_BANDWIDTH_CHANGE * planned
        return names, moved
