"""The site controller: places its site's fragment of each query on the site's own servers.

The global controller decides which site does what; the site controller decides which of its
servers runs which piece: the local stage on the server with the most cores, merge and final
partitions spread over the servers from the largest down; then it starts the pieces in the
site's data plane (:class:`~jetstream.runtime.SiteRuntime`) when it has one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from jetstream.aggtree.planner import Fragment
from jetstream.aggtree.topology import Server
from jetstream.errors import ControlPlaneError
from jetstream.runtime import Assignment, SiteRuntime
from jetstream.uplink import LinkLevel

__all__ = ["Piece", "SiteController"]


@dataclass(frozen=True)
class Piece:
    query: str
    name: str  # "local stage", "merge 1/2", "final 2/4"
    server: str


@dataclass
class _Deployment:
    fragment: Fragment
    version: int
    pieces: list[Piece] = field(default_factory=list)


class SiteController:
    def __init__(self, site: str, servers: list[Server],
                 runtime: SiteRuntime | None = None) -> None:
        if not servers:
            msg = f"site {site} has no servers to run anything on"
            raise ControlPlaneError(msg)
        self.site, self.runtime = site, runtime
        self.servers = sorted(servers, key=lambda s: (-s.cores, s.name))
        # _lock guards the deployments only, so that running() (every heartbeat) never
        # waits; _changing puts deploys and stops in order through to the runtime, which
        # may wait for Spark to stop a stream.
        self._lock = threading.Lock()
        self._changing = threading.Lock()
        self._deployments: dict[str, _Deployment] = {}

    def deploy(self, fragment: Fragment, version: int,
               assignment: Assignment | None = None) -> list[Piece]:
        """Place (or re-place, for a newer version) a fragment; the pieces and their servers.

        With an ``assignment`` (where the fragment's partials go) and a runtime, start it too.
        """
        if fragment.site != self.site:
            msg = f"site {self.site} was sent the fragment of site {fragment.site}"
            raise ControlPlaneError(msg)
        with self._changing:
            with self._lock:
                current = self._deployments.get(fragment.query)
                if current is not None and current.version > version:
                    msg = (f"site {self.site} runs version {current.version} of "
                           f"{fragment.query}; refusing the older version {version}")
                    raise ControlPlaneError(msg)
                pieces = self._place(fragment)
                # Listed while the runtime starts it, so that heartbeats do not ask again.
                self._deployments[fragment.query] = _Deployment(fragment, version, pieces)
            if self.runtime is not None and assignment is not None:
                try:
                    self.runtime.deploy(assignment)
                except BaseException:
                    # What failed to start is not listed: the controller deploys it again.
                    # (The old version, if it still runs, is.)
                    with self._lock:
                        if current is not None and self.runtime.run(fragment.query):
                            self._deployments[fragment.query] = current
                        else:
                            self._deployments.pop(fragment.query, None)
                    raise
            return pieces

    def stop(self, query: str) -> bool:
        """Stop a query's pieces here; whether it was running."""
        with self._changing:
            with self._lock:
                placed = self._deployments.pop(query, None) is not None
            if self.runtime is not None:
                self.runtime.stop(query)
            return placed

    def close(self) -> None:
        """Stop every query here and then the site's Spark, after any deploy or stop under
        way: a stop the controller asked for may still be waiting for Spark to end a stream,
        and stopping Spark under it fails that stream with a stack trace."""
        with self._changing:
            with self._lock:
                self._deployments.clear()
            if self.runtime is not None:
                self.runtime.close()

    def set_level(self, query: str, level: str) -> LinkLevel:
        """An operator's hold on this site's link for ``query`` (see ``QueryRun.set_level``)."""
        if self.runtime is None:
            msg = f"site {self.site} runs no data plane"
            raise ControlPlaneError(msg)
        return self.runtime.set_level(query, level)

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._deployments)

    def pieces(self) -> list[Piece]:
        with self._lock:
            return [p for d in self._deployments.values() for p in d.pieces]

    def _place(self, fragment: Fragment) -> list[Piece]:
        query = fragment.query
        pieces = []
        if fragment.sources:
            pieces.append(Piece(query, "local stage", self.servers[0].name))
        role = "final" if fragment.final else "merge" if fragment.children else None
        if role is not None:
            for i in range(fragment.partitions):
                server = self.servers[i % len(self.servers)].name
                label = f"{role} {i + 1}/{fragment.partitions}" if fragment.partitions > 1 else role
                pieces.append(Piece(query, label, server))
        return pieces

