"""The site controller: places its site's fragment of each query on the site's own servers.

The global controller decides which site does what; the site controller decides which of its
servers runs which piece: the local stage on the server with the most cores (in the site's
own process, with its Spark), and each key partition of a merge or final step on a server of
its own, from the largest down. Given a :class:`~jetstream.control.workers.WorkerPool`, a
fragment spread over partitions runs them on the servers' workers (one process per server):
the site controller deploys each partition to its worker, and hands the site's data plane
(:class:`~jetstream.dataplane.site.SiteRuntime`) their addresses, so that it routes its inputs to
them; when a worker starts again, its partitions are deployed to it again. Without a pool
(or with one partition) the site's own process merges.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from jetstream.aggtree.planner import Fragment
from jetstream.aggtree.topology import Server
from jetstream.control.codec import fragment_to_proto
from jetstream.control.state import Piece
from jetstream.control.workers import WorkerPool
from jetstream.dataplane.history import degraded_answer
from jetstream.dataplane.options import Assignment
from jetstream.dataplane.run import merge_inputs
from jetstream.dataplane.site import SiteRuntime
from jetstream.dataplane.uplink import LinkLevel
from jetstream.errors import ControlPlaneError
from jetstream.planwire import query_from_bytes, query_from_proto
from jetstream.rewrite import distributed, partial_aggregate
from jetstream.v1 import control_pb2 as pb
from jetstream.v1 import control_pb2_grpc as rpc

__all__ = ["SiteController"]

log = logging.getLogger(__name__)

#: The deadline of a call from a site controller to one of its workers.
WORKER_CALL_TIMEOUT_S = 10.0


@dataclass
class _Deployment:
    fragment: Fragment
    version: int
    pieces: list[Piece] = field(default_factory=list)
    assignment: Assignment | None = None  # what the runtime runs (with its workers)


#: A history read asked from further back than a site keeps is refused only past this much:
#: the controller plans with its own clock, and expiry runs every 10 s.
RETENTION_MARGIN_MS = 60_000


class SiteController:
    """``address`` is the site process's own gRPC address (where its workers send what they
    merge); ``workers``, when given, runs key partitions as processes (see above)."""

    def __init__(self, site: str, servers: list[Server],
                 runtime: SiteRuntime | None = None, *, workers: WorkerPool | None = None,
                 address: str = "") -> None:
        if not servers:
            msg = f"site {site} has no servers to run anything on"
            raise ControlPlaneError(msg)
        self.site, self.runtime, self.workers, self.address = site, runtime, workers, address
        self.servers = sorted(servers, key=lambda s: (-s.cores, s.name))
        self._stubs: dict[str, Any] = {}
        if workers is not None:
            workers.on_restart = self._worker_started_again
        # _lock guards the deployments only, so that running() (every heartbeat) never
        # waits; _changing puts deploys and stops in order through to the runtime, which
        # may wait for Spark to stop a stream.
        self._lock = threading.Lock()
        self._changing = threading.Lock()
        self._deployments: dict[str, _Deployment] = {}

    @property
    def allow_code(self) -> bool:
        """Whether this site runs the ``map`` functions plans carry (``--allow-code``)."""
        return self.runtime is not None and self.runtime.options.allow_code

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
                deployment = _Deployment(fragment, version, pieces)
                self._deployments[fragment.query] = deployment
            if self.runtime is not None and assignment is not None:
                try:
                    deployment.assignment = assignment = self._on_workers(assignment)
                    self.runtime.deploy(assignment)
                    if current is not None and current.assignment is not None:
                        # Partitions the new version no longer has stop sending.
                        kept = {name for name, _ in assignment.workers}
                        self._stop_on_workers(fragment.query, [
                            w for w in current.assignment.workers if w[0] not in kept])
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
                deployment = self._deployments.pop(query, None)
            if self.runtime is not None:
                self.runtime.stop(query)
            if deployment is not None and deployment.assignment is not None:
                self._stop_on_workers(query, deployment.assignment.workers)
            if deployment is not None:
                log.info("site %s: stopped %s", self.site, query)
            return deployment is not None

    def _stop_on_workers(self, query: str, workers: Iterable[tuple[str, str]]) -> None:
        for name, address in workers:
            try:
                self._call(address, "StopFragment", pb.StopFragmentRequest(query=query))
            except ControlPlaneError as e:  # a worker gone stops nothing
                log.warning("site %s: stopping %s at %s: %s", self.site, query, name, e)

    def close(self) -> None:
        """Stop every query here and then the site's Spark, after any deploy or stop under
        way: a stop the controller asked for may still be waiting for Spark to end a stream,
        and stopping Spark under it fails that stream with a stack trace."""
        with self._changing:
            with self._lock:
                self._deployments.clear()
            if self.workers is not None:  # first: they send to this process, which stops
                self.workers.close()
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
        """Every piece running here, with the process that runs it now."""
        workers = self.workers.states() if self.workers is not None else {}
        with self._lock:
            placed = [p for d in self._deployments.values() for p in d.pieces]
        runtime = self.runtime
        starting = runtime.starting() if runtime is not None else set()
        out = []
        for piece in placed:
            worker = workers.get(piece.server) if piece.on_worker else None
            if worker is None:
                # A deployment is listed before the runtime has its run: a stage not yet
                # made is starting too.
                state = ("starting" if piece.name == "local stage" and runtime is not None and (
                    piece.query in starting or runtime.run(piece.query) is None)
                    else piece.state)
                out.append(dataclasses.replace(piece, pid=os.getpid(), address=self.address,
                                               on_worker=False, state=state))
            else:
                out.append(dataclasses.replace(piece, pid=worker.pid, address=worker.address,
                                               state=worker.state))
        return out

    def _place(self, fragment: Fragment) -> list[Piece]:
        query = fragment.query
        pieces = []
        if fragment.sources:
            pieces.append(Piece(query, "local stage", self.servers[0].name))
        role = "final" if fragment.final else "merge" if fragment.children else None
        if role is not None:
            if fragment.partitions > len(self.servers):
                msg = (f"site {self.site} has {len(self.servers)} servers for the "
                       f"{fragment.partitions} partitions of {query}")
                raise ControlPlaneError(msg)
            spread = fragment.partitions > 1 and self.workers is not None
            for i in range(fragment.partitions):
                label = f"{role} {i + 1}/{fragment.partitions}" if fragment.partitions > 1 else role
                pieces.append(Piece(query, label, self.servers[i].name, on_worker=spread))
        return pieces

    def read_cubes(self, request: pb.ReadCubesRequest) -> list[Any]:
        """The windows this site's own local stages made of ``request.query`` inside
        ``[start_ms, end_ms)``, as its cube store keeps them: as made (``resolution_ms`` 0)
        or rolled up to that length — rolled up now, so that the rollups hold every window
        the inbox has — and stepped down the stored query's ladder when they would take
        more than ``max_bytes``. A ControlPlaneError if the site keeps no cubes, or none of
        that resolution back to ``start_ms`` (its ``--retention``)."""
        query, start_ms, end_ms = request.query, request.start_ms, request.end_ms
        store = None if self.runtime is None else self.runtime.cube_store()
        if store is None:
            msg = f"site {self.site} keeps no cubes (it was started with --no-cubes)"
            raise ControlPlaneError(msg)
        stored = distributed(query_from_proto(request.stored, allow_code=self.allow_code))
        partial = partial_aggregate(stored)
        plan = stored.plan()
        window = plan.window_of(plan.partial_aggregates()[0])
        assert window is not None, "the DSL windows every aggregate"
        resolution = request.resolution_ms or window.spec.size_ms
        if request.resolution_ms and resolution not in store.retention:
            msg = (f"site {self.site} keeps no {resolution // 1000} s rollups (its "
                   f"--retention has {', '.join(str(r // 1000) for r in sorted(store.retention))}"
                   " s)")
            raise ControlPlaneError(msg)
        now_ms = time.time_ns() // 1_000_000
        kept_ms = int(store.kept_for(resolution) * 1000)
        if start_ms + RETENTION_MARGIN_MS < now_ms - kept_ms:
            msg = (f"site {self.site} keeps its {resolution // 1000} s windows for "
                   f"{kept_ms // 1000} s (--retention), not back to the start asked")
            raise ControlPlaneError(msg)
        own = [o for o in store.origins(query)
               if o == self.site or o.startswith(f"{self.site}[")]
        if not own:
            return []
        if request.resolution_ms:
            store.roll_up(query, partial, window.spec, now_ms, origins=own)
        kept = store.messages(query, start_ms, end_ms, request.resolution_ms or None, own)
        if not request.max_bytes:
            return kept
        return degraded_answer(kept, stored, request.max_bytes, request.max_level)

    # -- workers ------------------------------------------------------------------------------
    def _on_workers(self, assignment: Assignment) -> Assignment:
        """The assignment with its partitions deployed to the servers' workers (started if
        need be), or as it is when this site merges in its own process."""
        fragment = assignment.fragment
        if self.workers is None or fragment.partitions <= 1 or not (
                fragment.children or fragment.final):
            return dataclasses.replace(assignment, workers=())
        # The site's children and its local stages (one per input of a union held here).
        query = distributed(query_from_bytes(assignment.spec, allow_code=self.allow_code))
        inputs = tuple(merge_inputs(fragment, query))
        workers = []
        for i, server in enumerate(self.servers[:fragment.partitions]):
            address = self.workers.address(server.name)
            name = f"{self.site}/{server.name}"
            part = Fragment(fragment.query, name, children=inputs, parent=self.site,
                            final=fragment.final, part=(i, fragment.partitions))
            self._call(address, "DeployFragment", pb.DeployFragmentRequest(
                fragment=fragment_to_proto(part, assignment.spec, assignment.version,
                                           self.address, assignment.covers,
                                           assignment.expected, assignment.resend_from_ms)))
            workers.append((name, address))
        return dataclasses.replace(assignment, workers=tuple(workers))

    def _worker_started_again(self, server: str) -> None:
        """Deploy again every partition the worker of ``server`` ran, at its new address."""
        name = f"{self.site}/{server}"
        with self._changing:
            with self._lock:
                deployments = [d for d in self._deployments.values() if d.assignment
                               and any(n == name for n, _ in d.assignment.workers)]
            for deployment in deployments:
                assert deployment.assignment is not None and self.runtime is not None
                try:
                    before = deployment.assignment.workers
                    assignment = self._on_workers(deployment.assignment)
                    self.runtime.deploy(assignment)  # a new address: the run moves the part
                    deployment.assignment = assignment
                    run = self.runtime.run(assignment.fragment.query)
                    for i, (worker, was) in enumerate(zip(assignment.workers, before,
                                                          strict=True)):
                        if worker[0] == name and worker == was and run and run.router:
                            run.router.move(i, worker[1])  # started again on the same port
                except Exception:
                    log.exception("site %s: deploying %s again to the worker of %s failed",
                                  self.site, deployment.fragment.query, server)

    def _call(self, address: str, method: str, request: object) -> Any:
        assert self.workers is not None
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = rpc.SiteControllerStub(self.workers.channel(address))
        try:
            return getattr(stub, method)(request, timeout=WORKER_CALL_TIMEOUT_S)
        except grpc.RpcError as e:
            msg = f"worker at {address}: {e.code().name}: {e.details()}"
            raise ControlPlaneError(msg) from None

