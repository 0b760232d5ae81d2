"""The long-running processes: ``jetstream controller``, ``jetstream site`` and ``jetstream
worker``."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc

from jetstream.aggtree.planner import Fragment
from jetstream.aggtree.topology import Server, Topology
from jetstream.approx.profile import LevelFigures
from jetstream.control.codec import (
    behind_to_proto,
    fragment_to_proto,
    link_report_to_proto,
    placement_to_proto,
    result_to_proto,
    server_from_proto,
)
from jetstream.control.dashboard import serve_dashboard
from jetstream.control.global_controller import GlobalController
from jetstream.control.server import start_server
from jetstream.control.servicers import GlobalControllerServicer, SiteControllerServicer
from jetstream.control.site_calls import SiteCalls, beat_spacing
from jetstream.control.site_controller import SiteController
from jetstream.control.state import LinkReport, QueryState
from jetstream.control.workers import WorkerPool
from jetstream.dataplane.options import LinkState, SiteOptions
from jetstream.dataplane.site import SiteRuntime
from jetstream.errors import ControlPlaneError, PlanError
from jetstream.formats import InputMeter
from jetstream.metrics import INPUT_FILES_WAITING, INPUT_LAG, serve_metrics
from jetstream.results import WindowResult
from jetstream.security import Security
from jetstream.v1 import control_pb2 as pb
from jetstream.v1 import control_pb2_grpc as rpc
from jetstream.v1 import dataplane_pb2_grpc as dataplane_rpc
from jetstream.v1.query_pb2 import QueryPlan

__all__ = ["CALL_TIMEOUT_S", "run_controller", "run_site", "run_worker"]

log = logging.getLogger(__name__)

#: The deadline of every unary control-plane call but a deploy.
CALL_TIMEOUT_S = 5.0
#: How long a site that shuts down waits for its last heartbeat to reach the controller.
GOODBYE_TIMEOUT_S = 3.0
#: The deadline of a deploy: a site may wait for its workers to start and register.
DEPLOY_TIMEOUT_S = 30.0
#: The deadline of a site's answer to a history query (its kept windows of the range).
HISTORY_TIMEOUT_S = 30.0


class _SiteClients:
    """One channel per site controller, for deploying and stopping fragments."""

    def __init__(self, security: Security) -> None:
        self._security = security
        self._stubs: dict[str, rpc.SiteControllerStub] = {}
        self._lock = threading.Lock()
        self.addresses: Callable[[str], str] = lambda site: ""

    def _stub(self, address: str) -> rpc.SiteControllerStub:
        with self._lock:
            if address not in self._stubs:
                self._stubs[address] = rpc.SiteControllerStub(self._security.channel(address))
            return self._stubs[address]

    def deploy(self, address: str, fragment: Fragment, state: QueryState) -> list[tuple[str, str]]:
        parent = self.addresses(fragment.parent) if fragment.parent else ""
        assert state.plan is not None
        request = pb.DeployFragmentRequest(fragment=fragment_to_proto(
            fragment, state.spec, state.version, parent, state.plan.covers(fragment.site),
            state.expected, state.resend_from_ms))
        response = self._call(address, "DeployFragment", request, DEPLOY_TIMEOUT_S)
        return [(p.piece, p.server) for p in response.placements]

    def stop(self, address: str, query: str) -> None:
        self._call(address, "StopFragment", pb.StopFragmentRequest(query=query))

    def set_level(self, address: str, request: pb.SetLevelRequest) -> pb.SetLevelResponse:
        response: pb.SetLevelResponse = self._call(address, "SetLevel", request)
        return response

    def read_cubes(self, address: str, request: pb.ReadCubesRequest) -> pb.ReadCubesResponse:
        response: pb.ReadCubesResponse = self._call(address, "ReadCubes", request,
                                                    HISTORY_TIMEOUT_S)
        return response

    def _call(self, address: str, method: str, request: object,
              timeout_s: float = CALL_TIMEOUT_S) -> Any:
        try:
            return getattr(self._stub(address), method)(request, timeout=timeout_s)
        except grpc.RpcError as e:
            msg = f"site at {address}: {e.code().name}: {e.details()}"
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:  # refused: asking again won't do
                raise PlanError(msg) from None
            raise ControlPlaneError(msg) from None


def _exporter(host: str, metrics_port: int, token: str | None) -> WSGIServer | None:
    """Serve ``/metrics`` on ``host:metrics_port`` (0: not at all), asking for ``token`` if
    given."""
    if not metrics_port:
        return None
    exporter, _ = serve_metrics(metrics_port, host, token=token)
    log.info("serving /metrics on %s:%d%s", host, metrics_port,
             " (token required)" if token else "")
    return exporter


def required_token(security: Security, wanted: bool, flag: str = "--http-token") -> str | None:
    """The token an HTTP server of the process asks for (``/metrics``, the dashboard, a
    site's push): the process's, if ``wanted`` (by ``flag``)."""
    if wanted and not security.token:
        msg = (f"{flag}: this process has no token to require (give --token, set "
               "JETSTREAM_TOKEN, or put a token file in its TLS folder)")
        raise ControlPlaneError(msg)
    return security.token if wanted else None


def _serve_until_stopped(server: grpc.Server, stop: threading.Event,
                         exporter: WSGIServer | None = None) -> None:
    """Block until ``stop`` is set, or SIGINT/SIGTERM when on the main thread; then drain
    (and stop serving ``/metrics``)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        if exporter is not None:
            exporter.shutdown()
            exporter.server_close()
        # Bounded: a call gRPC never finishes (a peer's malformed stream) would hold it.
        server.stop(grace=1.0).wait(5)


def run_controller(topology: Topology, port: int, *, security: Security,
                   host: str = "127.0.0.1", heartbeat_interval_s: float = 2.0,
                   heartbeat_timeout_s: float = 6.0, state_dir: Path | None = None,
                   ready: Callable[[int], None] | None = None,
                   stop: threading.Event | None = None, metrics_port: int = 0,
                   dashboard_port: int = 0, dashboard_host: str = "127.0.0.1",
                   allow_code: bool = False, cubes: Sequence[QueryPlan] = (),
                   http_token: bool = False) -> None:
    """Serve the global controller until SIGINT/SIGTERM (or ``stop``); ``security`` guards
    its server and its channels to the sites. With a ``state_dir`` its queries and their
    results outlive it (see :class:`GlobalController`). A ``metrics_port`` serves Prometheus
    metrics (:mod:`jetstream.metrics`) on ``host``; a ``dashboard_port`` the live dashboard
    (:mod:`jetstream.control.dashboard`) on ``dashboard_host``. ``allow_code``: accept
    queries whose ``map`` functions travel as code (see :mod:`jetstream.planwire`).
    ``cubes``: queries to run from the start, for history (see :class:`GlobalController`).
    ``http_token``: both ask for the process's token."""
    token = required_token(security, http_token)
    clients = _SiteClients(security)
    calls = SiteCalls()  # deploys and stops never hold the controller's lock
    controller = GlobalController(topology, clients.deploy, clients.stop,
                                  heartbeat_timeout_s=heartbeat_timeout_s, state_dir=state_dir,
                                  dispatch=calls, allow_code=allow_code, cubes=cubes)
    clients.addresses = lambda site: controller.sites[site].address or ""
    servicer = GlobalControllerServicer(controller, heartbeat_interval_s,
                                        set_level=lambda site, address, request: calls.wait(
                                            site, lambda: clients.set_level(address, request),
                                            2 * CALL_TIMEOUT_S),
                                        read_cubes=lambda site, address, request:
                                            clients.read_cubes(address, request))
    server, bound = start_server([(rpc.add_GlobalControllerServicer_to_server, servicer,
                                   "jetstream.v1.GlobalController")], port, host,
                                 security=security)
    stop = stop or threading.Event()
    log.info("global controller for %s listening on %s:%d", topology.name, host, bound)
    exporter = _exporter(host, metrics_port, token)
    if ready:
        ready(bound)

    def watch() -> None:
        while not stop.wait(min(1.0, heartbeat_timeout_s / 3)):
            try:
                controller.check_liveness()
            except Exception:  # one bad re-plan must not stop all failure detection
                log.exception("checking site liveness failed")
            try:
                controller.expire_measurements()
            except Exception:
                log.exception("forgetting old link measurements failed")

    threading.Thread(target=watch, name="liveness", daemon=True).start()
    dashboard = None
    if dashboard_port:
        dashboard = serve_dashboard(controller, dashboard_port, dashboard_host, token=token)
        log.info("serving the dashboard on http://%s:%d/", dashboard_host, dashboard.port)
    try:
        _serve_until_stopped(server, stop, exporter)
    finally:
        calls.close()
        if dashboard is not None:
            dashboard.close()


class _ResultsPublisher:
    """Hands the root's results to the global controller, in order, retrying until it takes
    them; a slow or restarting controller never holds up the data plane."""

    def __init__(self, controller: rpc.GlobalControllerStub, stop: threading.Event) -> None:
        self._controller, self._stop = controller, stop
        self._queue: queue.Queue[pb.PublishResultsRequest] = queue.Queue()
        threading.Thread(target=self._run, name="publish-results", daemon=True).start()

    def __call__(self, query: str, results: list[WindowResult], finished: bool) -> None:
        self._queue.put(pb.PublishResultsRequest(
            query=query, results=[result_to_proto(r) for r in results], finished=finished))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                request = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            backoff = 0.2
            while not self._stop.is_set():
                try:
                    self._controller.PublishResults(request, timeout=CALL_TIMEOUT_S)
                    break
                except grpc.RpcError as e:
                    if e.code() in (grpc.StatusCode.FAILED_PRECONDITION,
                                    grpc.StatusCode.INVALID_ARGUMENT):
                        log.warning("results of %s refused: %s", request.query, e.details())
                        break  # e.g. the query was cancelled meanwhile
                    log.warning("publishing results of %s: %s; retrying", request.query,
                                e.code().name)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)


class _Stops:
    """Stops, each on a thread of its own, the queries the controller no longer wants here:
    a stop may wait for Spark to end a stream, and the heartbeat that asks for it must not."""

    def __init__(self, site: str) -> None:
        self._site = site
        self._lock = threading.Lock()
        self._stopping: set[str] = set()

    def __call__(self, local: SiteController, query: str) -> None:
        with self._lock:
            if query in self._stopping:  # asked again by the next heartbeat
                return
            self._stopping.add(query)
        threading.Thread(target=self._stop, args=(local, query), name=f"stop-{query}",
                         daemon=True).start()

    def _stop(self, local: SiteController, query: str) -> None:
        try:
            local.stop(query)
        except Exception:  # the next heartbeat asks again
            log.exception("site %s: stopping %s failed", self._site, query)
        finally:
            with self._lock:
                self._stopping.discard(query)


#: The least time between two heartbeats that carry a link's profile (when it changed).
PROFILE_REPORT_S = 30.0


class ProfileReports:
    """Which heartbeats carry a link's profile: one that changed since it was last sent, at
    most every ``PROFILE_REPORT_S`` (the controller keeps the last one meanwhile), so that a
    thin link's heartbeats stay small."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._sent: dict[str, tuple[tuple[LevelFigures, ...], float]] = {}
        self._clock = clock

    def __call__(self, links: dict[str, LinkState]) -> dict[str, LinkState]:
        """``links``, the profiles not due left out."""
        now, out = self._clock(), {}
        for query, link in links.items():
            last = self._sent.get(query)
            if link.profile and (last is None or (last[0] != link.profile
                                                  and now - last[1] >= PROFILE_REPORT_S)):
                self._sent[query] = (link.profile, now)
                out[query] = link
            else:
                out[query] = dataclasses.replace(link, profile=())
        return out


def link_reports(links: dict[str, LinkState]) -> list[pb.LinkReport]:
    """What a heartbeat says of each query's link: its level, the bytes sent, its profile."""
    return [link_report_to_proto(query, LinkReport(link.level, link.level_index, link.pinned,
                                                   link.sent_bytes, link.profile))
            for query, link in sorted(links.items())]


def link_measurements(links: dict[str, LinkState]) -> list[pb.LinkMeasurement]:
    """The bandwidth of each link to a parent that the site measured at capacity: where some
    query's windows are paced by the link (:attr:`LinkState.saturated`: its policy stepped
    down, or would and cannot -- one level, ``max_error=0``, a level held by an operator),
    the sum of the recent throughputs of every query on it, as they share it. A link that
    carries everything its queries send is not: what its senders see is what they sent;
    the controller forgets a measurement no heartbeat repeats (see
    :meth:`GlobalController.expire_measurements`)."""
    saturated = {link.parent for link in links.values()
                 if link.saturated and link.throughput is not None}
    bps: dict[str, float] = {}
    for link in links.values():
        if link.parent in saturated and link.throughput is not None:
            bps[link.parent] = bps.get(link.parent, 0.0) + link.throughput * 8
    return [pb.LinkMeasurement(peer=parent, bandwidth_bps=value)
            for parent, value in sorted(bps.items())]


def heartbeat_interval(given_s: float, links: dict[str, LinkState]) -> float:
    """The time until a site's next heartbeat: what the controller gave it, or longer where
    its senders time its links to their parents thinner than that allows (see
    :func:`beat_spacing`): a heartbeat that meets a window's partial on a thin link holds it
    up."""
    rates = [rate for rate in map(_carries_bps, links.values()) if rate]
    return max(given_s, beat_spacing(max(rates, default=None)))


def _carries_bps(link: LinkState) -> float | None:
    """What a link carries as its sender sees it: the lower of the rate its acks time and
    its policy's throughput (which a window slow to be acked caps before its ack comes)."""
    known = [rate for rate in (link.rate_bps,
                               None if link.throughput is None else link.throughput * 8) if rate]
    return min(known) if known else None


def _dialable(host: str) -> str:
    """An address this machine's processes can dial for a server listening on ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def run_site(name: str, controller_address: str, *, security: Security, port: int = 0,
             host: str = "127.0.0.1", advertise: str | None = None,
             options: SiteOptions | None = None,
             ready: Callable[[int], None] | None = None,
             stop: threading.Event | None = None, metrics_port: int = 0,
             http_token: bool = False) -> None:
    """Serve a site: register, send heartbeats, and run the data plane of what is deployed.
    ``security`` guards its server, its channel to the controller and those to its parents.
    A ``metrics_port`` serves Prometheus metrics (:mod:`jetstream.metrics`) on ``host``,
    asking for the process's token with ``http_token``."""
    stop = stop or threading.Event()
    options = options or SiteOptions()
    options.connect = security.channel
    given_master = options.spark_master is not None
    given_conf = dict(options.spark_conf)  # the command line's: over the topology's
    runtime = SiteRuntime(name, options, lambda *_: None)
    started_early = given_master and options.input_dir is not None
    if started_early:
        runtime.session()  # before any gRPC thread exists: see SiteRuntime.session
    controller = rpc.GlobalControllerStub(security.channel(controller_address))
    runtime.publish = _ResultsPublisher(controller, stop)
    servicer = SiteControllerServicer()
    server, bound = start_server([
        (rpc.add_SiteControllerServicer_to_server, servicer, "jetstream.v1.SiteController"),
        (dataplane_rpc.add_DataPlaneServicer_to_server, runtime.servicer,
         "jetstream.v1.DataPlane")], port, host, security=security)
    address = advertise or f"{host}:{bound}"  # where the controller and peers reach us
    # Where the site's workers reach it: where it listens, not through a NAT or proxy.
    listening = f"{_dialable(host)}:{bound}"
    # Peers that reach the site through another address cannot reach its workers, nor
    # those on other machines workers that listen on a wildcard (dialled as 127.0.0.1).
    options.offer_routes = address == f"{host}:{bound}" and _dialable(host) == host
    exporter = _exporter(host, metrics_port, required_token(security, http_token))
    if ready:
        ready(bound)

    def register() -> float:
        response = controller.RegisterSite(
            pb.RegisterSiteRequest(site=name, address=address, allows_code=options.allow_code),
            timeout=CALL_TIMEOUT_S)
        servers = [server_from_proto(s) for s in response.servers]
        if not given_master:
            options.spark_master = response.spark_master or None
        if not started_early:
            options.spark_conf = {**response.spark_conf, **given_conf}
        if servicer.controller is None:
            # Workers only where a merge can be spread over servers: a site with several.
            workers = None if len(servers) < 2 else WorkerPool(
                name, servers, listening, security=security, host=host,
                deadline_s=options.deadline_s, allow_code=options.allow_code)
            servicer.controller = SiteController(name, servers, runtime, workers=workers,
                                                 address=listening)
            if workers is not None:
                workers.warm_up()
            if started_early:
                # Spark started before registering: the topology's settings came too late.
                late = sorted(key for key, value in response.spark_conf.items()
                              if key not in given_conf and options.spark_conf.get(key) != value)
                if late:
                    log.warning("site %s: Spark started before registering (--spark-master), "
                                "without the topology's %s; pass them with --spark-conf",
                                name, ", ".join(late))
            elif options.input_dir is not None:
                # The JVM takes 10-40 s: start it now rather than when the first fragment
                # arrives. This forks under running gRPC threads, as a start at the first
                # deploy would (see SiteRuntime.session); --spark-master avoids both.
                runtime.warm_up()
        log.info("site %s registered with %s (%s, %d servers)", name, controller_address,
                 response.topology, len(servers))
        return float(response.heartbeat_interval_s) or 2.0

    input_bytes = InputMeter(options.input_dir)
    stop_here = _Stops(name)
    beats = _Beats()
    profiles = ProfileReports()
    runtime.on_failure = lambda: beats.ask(CALL_TIMEOUT_S)

    def beat() -> None:
        given, interval, logged, registered, backoff = 2.0, 2.0, 2.0, False, 0.5
        while not stop.is_set():
            try:
                if not registered:
                    given, registered = register(), True
                    logged = given
                local = servicer.controller
                asked = beats.asked
                running = local.running() if local else []
                links = runtime.links()
                interval = heartbeat_interval(given, links)
                if abs(interval - logged) > 0.25 * logged:  # said when it moves by a quarter
                    log.info("site %s: a heartbeat every %.1f s (%s)", name, interval,
                             "as given" if interval == given
                             else "its links to its parents are timed thin")
                    logged = interval
                behind = runtime.behind()
                for folder, (files, lag_s) in behind.items():
                    INPUT_FILES_WAITING.labels(name, folder).set(files)
                    INPUT_LAG.labels(name, folder).set(lag_s)
                response = controller.Heartbeat(pb.HeartbeatRequest(
                    site=name, running=running, input_bytes=input_bytes(),
                    links=link_measurements(links), query_links=link_reports(profiles(links)),
                    placements=[placement_to_proto(p) for p in local.pieces()] if local
                    else [], failures=[pb.StageFailure(query=q, error=e)
                                       for q, e in runtime.failures().items()],
                    interval_s=interval, behind=behind_to_proto(behind),
                    late_records=runtime.late_records()),
                    # A thin link's are far apart, and slow: a late one still counts.
                    timeout=max(CALL_TIMEOUT_S, 2 * interval))
                beats.sent(asked)
                for query in set(running) - set(response.queries):
                    assert local is not None
                    stop_here(local, query)  # the controller no longer wants it here
                backoff = 0.5
            except grpc.RpcError as e:
                if e.code() is grpc.StatusCode.FAILED_PRECONDITION:
                    registered = False  # e.g. the controller restarted and forgot us
                log.warning("site %s: controller at %s: %s: %s", name, controller_address,
                            e.code().name, e.details())
                stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            beats.wait(interval)
        if registered:  # the last heartbeat: re-plan without us now, not at the timeout
            with contextlib.suppress(grpc.RpcError):
                controller.Heartbeat(pb.HeartbeatRequest(site=name, leaving=True),
                                     timeout=GOODBYE_TIMEOUT_S)

    beating = threading.Thread(target=beat, name="heartbeat", daemon=True)
    beating.start()
    try:
        _serve_until_stopped(server, stop, exporter)
    finally:
        beats.close()
        beating.join(GOODBYE_TIMEOUT_S)  # before the stage stops, which may take a while
        local = servicer.controller
        if local is not None and local.runtime is runtime:
            local.close()  # waits for a stop under way (e.g. a cancel) before Spark stops
        else:
            runtime.close()


class _Beats:
    """Heartbeats asked for out of turn: :meth:`ask` wakes the heartbeat loop and waits
    (at most ``timeout_s``) until a heartbeat that began after the ask has reached the
    controller."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.asked = 0  # asks so far; a heartbeat notes the count it began at
        self._sent = 0  # the count the last heartbeat that got through began at
        self._closed = False

    def ask(self, timeout_s: float) -> None:
        with self._changed:
            self.asked += 1
            wanted = self.asked
            self._changed.notify_all()
            self._changed.wait_for(lambda: self._sent >= wanted, timeout_s)

    def sent(self, asked: int) -> None:
        with self._changed:
            self._sent = max(self._sent, asked)
            self._changed.notify_all()

    def wait(self, interval_s: float) -> None:
        """Until the next heartbeat is due, or one is asked for, or :meth:`close`."""
        with self._changed:
            self._changed.wait_for(lambda: self.asked > self._sent or self._closed,
                                   interval_s)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()


#: Revisions a worker sends start at ``epoch * REVISION_EPOCH``: see SiteOptions.revision_base.
REVISION_EPOCH = 1_000_000


def run_worker(site: str, server: str, register_at: str, *, security: Security,
               host: str = "127.0.0.1", port: int = 0, parent_pid: int = 0, epoch: int = 0,
               deadline_s: float | None = None, allow_code: bool = False,
               stop: threading.Event | None = None) -> None:
    """Serve one worker of ``site`` on ``server``: register with the site at ``register_at``,
    then run the partitions it is given, until SIGINT/SIGTERM, ``stop``, or (given
    ``parent_pid``) the end of the site's process. ``epoch`` counts the worker's starts (its
    revisions replace those of the starts before); ``deadline_s`` is its site's window
    deadline, ``allow_code`` its ``--allow-code``."""
    stop = stop or threading.Event()
    name = f"{site}/{server}"
    options = SiteOptions(worker=True, connect=security.channel, deadline_s=deadline_s,
                          revision_base=epoch * REVISION_EPOCH, allow_code=allow_code)
    runtime = SiteRuntime(name, options, lambda *_: None)
    options.received = runtime.servicer.received  # its progress reports carry them home
    servicer = SiteControllerServicer()
    servicer.controller = SiteController(name, [Server(server, 1, 1.0)], runtime)
    grpc_server, bound = start_server([
        (rpc.add_SiteControllerServicer_to_server, servicer, "jetstream.v1.SiteController"),
        (dataplane_rpc.add_DataPlaneServicer_to_server, runtime.servicer,
         "jetstream.v1.DataPlane")], port, host, security=security)
    address = f"{_dialable(host)}:{bound}"

    def register_and_watch() -> None:
        stub = rpc.SiteControllerStub(security.channel(register_at))
        backoff = 0.2
        while not stop.is_set():
            if parent_pid and os.getppid() != parent_pid:
                log.warning("worker %s: site process %d ended before it registered; stopping",
                            name, parent_pid)
                stop.set()
                return
            try:
                stub.RegisterWorker(pb.RegisterWorkerRequest(
                    site=site, server=server, address=address, pid=os.getpid()),
                    timeout=CALL_TIMEOUT_S)
                break
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.FAILED_PRECONDITION,
                                grpc.StatusCode.INVALID_ARGUMENT):
                    log.error("worker %s: site %s refused it: %s", name, register_at,
                              e.details())
                    stop.set()
                    return
                stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
        log.info("worker %s: registered with %s, serving at %s", name, register_at, address)
        while parent_pid and not stop.wait(0.5):
            if os.getppid() != parent_pid:  # the site's process is gone: so is our work
                log.warning("worker %s: site process %d ended; stopping", name, parent_pid)
                stop.set()

    threading.Thread(target=register_and_watch, name="register", daemon=True).start()
    started = time.monotonic()
    try:
        _serve_until_stopped(grpc_server, stop)
    finally:
        servicer.controller.close()
        log.info("worker %s: stopped after %.0fs", name, time.monotonic() - started)
