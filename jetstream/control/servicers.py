"""The gRPC servicers: each decodes a request, calls a plain controller method, encodes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NoReturn

import grpc

from jetstream.control.codec import (
    assignment_from_proto,
    link_report_from_proto,
    placement_to_proto,
    result_from_proto,
    result_to_proto,
    server_to_proto,
    status_to_proto,
)
from jetstream.control.global_controller import GlobalController
from jetstream.control.site_calls import heartbeat_spacing
from jetstream.control.site_controller import SiteController
from jetstream.control.state import Placement
from jetstream.dataplane.history import ReadCubes
from jetstream.errors import ControlPlaneError, JetstreamError, PlacementError, PlanError
from jetstream.security import peer_identity
from jetstream.v1 import control_pb2 as pb
from jetstream.v1 import control_pb2_grpc as rpc
from jetstream.v1 import query_pb2

__all__ = ["GlobalControllerServicer", "SiteControllerServicer"]

_CODES = {PlanError: grpc.StatusCode.INVALID_ARGUMENT,
          PlacementError: grpc.StatusCode.FAILED_PRECONDITION,
          ControlPlaneError: grpc.StatusCode.FAILED_PRECONDITION}


def _abort(context: grpc.ServicerContext, error: JetstreamError) -> NoReturn:
    code = next((c for t, c in _CODES.items() if isinstance(error, t)),
                grpc.StatusCode.INTERNAL)
    context.abort(code, str(error))
    raise AssertionError("abort returns only by raising")


#: Who may submit and cancel queries and hold links' levels: the CLI (and the controller).
OPERATORS = ("cli", "controller")


def _as_site(context: grpc.ServicerContext, site: str, what: str) -> None:
    """Refuse, PERMISSION_DENIED, a call about ``site`` from a peer whose certificate names
    another (a plaintext server checks nobody; one that names no role acts as anyone)."""
    _as_role(context, (), f"{what} as site {site!r}", site)


def _as_role(context: grpc.ServicerContext, roles: tuple[str, ...], what: str,
             site: str = "") -> None:
    """Refuse, PERMISSION_DENIED, a call whose caller's certificate names none of ``roles``
    (nor is ``site``'s own, when given): a site's certificate cannot submit or cancel
    queries, nor deploy to another site."""
    identity = peer_identity(context)
    if identity is None or identity.role in ("any", *roles) or (
            site and identity.role == "site" and identity.name == site):
        return
    context.abort(grpc.StatusCode.PERMISSION_DENIED,
                  f"{what} refused: the caller's certificate is {identity}'s")


def _plan(spec: query_pb2.QuerySpec) -> query_pb2.QueryPlan:
    """The plan a submitted query carries; a request without one (from a client that sends
    Python source, before plans) is refused."""
    if not spec.HasField("plan"):
        msg = (f"query {spec.name or '?'}: the request carries no plan; the client is older "
               "than this controller (it sends the query file's text): upgrade it")
        raise PlanError(msg)
    return spec.plan


#: Relays a SetLevel request to a site's controller, at its address (after the calls to
#: the site already under way, such as the deploy of the query).
LevelRelay = Callable[[str, str, pb.SetLevelRequest], pb.SetLevelResponse]


class GlobalControllerServicer(rpc.GlobalControllerServicer):
    def __init__(self, controller: GlobalController, heartbeat_interval_s: float, *,
                 set_level: LevelRelay | None = None,
                 read_cubes: ReadCubes | None = None) -> None:
        self.controller = controller
        self.heartbeat_interval_s = heartbeat_interval_s
        self._set_level, self._read_cubes = set_level, read_cubes

    def SubmitQuery(self, request: pb.SubmitQueryRequest,
                    context: grpc.ServicerContext) -> pb.SubmitQueryResponse:
        _as_role(context, OPERATORS, "submitting a query")
        try:
            state = self.controller.submit(
                _plan(request.query),
                request.since_ms if request.HasField("since_ms") else None, self._read_cubes)
        except JetstreamError as e:
            _abort(context, e)
        assert state.plan is not None
        return pb.SubmitQueryResponse(query=state.name, plan=state.plan.render(),
                                      backfill=state.backfill)

    def Explain(self, request: pb.ExplainRequest,
                context: grpc.ServicerContext) -> pb.ExplainResponse:
        try:
            return pb.ExplainResponse(text=self.controller.explain(_plan(request.query)))
        except JetstreamError as e:
            _abort(context, e)

    def Status(self, request: pb.StatusRequest,
               context: grpc.ServicerContext) -> pb.StatusResponse:
        return status_to_proto(self.controller.view())

    def CancelQuery(self, request: pb.CancelQueryRequest,
                    context: grpc.ServicerContext) -> pb.CancelQueryResponse:
        _as_role(context, OPERATORS, "cancelling a query")
        try:
            self.controller.cancel(request.query)
        except JetstreamError as e:
            _abort(context, e)
        return pb.CancelQueryResponse()

    def StreamResults(self, request: pb.StreamResultsRequest,
                      context: grpc.ServicerContext) -> Iterator[query_pb2.WindowResult]:
        if not self.controller.has_query(request.query):
            _abort(context, ControlPlaneError(f"no query named {request.query!r}"))
        for result in self.controller.results.follow(request.query,
                                                      stop=lambda: not context.is_active()):
            yield result_to_proto(result)

    def RegisterSite(self, request: pb.RegisterSiteRequest,
                     context: grpc.ServicerContext) -> pb.RegisterSiteResponse:
        _as_site(context, request.site, "registering")
        try:
            self.controller.register_site(request.site, request.address,
                                          allows_code=request.allows_code)
            site = self.controller.topology.site(request.site)
        except JetstreamError as e:
            _abort(context, e)
        return pb.RegisterSiteResponse(
            topology=self.controller.topology.name, kind=site.kind.value,
            spark_master=site.master, spark_conf=dict(site.spark_conf),
            heartbeat_interval_s=max(self.heartbeat_interval_s,
                                     heartbeat_spacing(self.controller.topology, site.name)),
            servers=[server_to_proto(s) for s in site.servers])

    def Heartbeat(self, request: pb.HeartbeatRequest,
                  context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        _as_site(context, request.site, "a heartbeat")
        try:
            if request.leaving:
                self.controller.leave(request.site)
                return pb.HeartbeatResponse()
            queries = self.controller.heartbeat(
                request.site, {m.peer: m.bandwidth_bps for m in request.links},
                input_bytes=request.input_bytes,
                reports={r.query: link_report_from_proto(r) for r in request.query_links},
                # What the site lists is what runs there, none included: a list left
                # stale here would show a stopped query's pieces as running for good.
                placements=[Placement(p.query, p.piece, p.server, p.pid, p.address, p.state)
                            for p in request.placements],
                failures={f.query: f.error for f in request.failures},
                interval_s=request.interval_s,
                behind={b.folder: (max(b.files_waiting, 0), max(b.lag_s, 0.0))
                        for b in request.behind},
                late_records=dict(request.late_records))
        except JetstreamError as e:
            _abort(context, e)
        return pb.HeartbeatResponse(queries=queries)

    def SetLevel(self, request: pb.SetLevelRequest,
                 context: grpc.ServicerContext) -> pb.SetLevelResponse:
        _as_role(context, OPERATORS, "setting a link's level")
        if self._set_level is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this controller relays no levels")
        assert self._set_level is not None
        try:
            return self._set_level(request.site,
                                   self.controller.link_owner(request.query, request.site),
                                   request)
        except JetstreamError as e:
            _abort(context, e)

    def History(self, request: pb.HistoryRequest,
                context: grpc.ServicerContext) -> pb.HistoryResponse:
        if self._read_cubes is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this controller reads no cubes")
        assert self._read_cubes is not None
        try:
            found = self.controller.past.history(_plan(request.query), request.since_ms,
                                            request.until_ms, self._read_cubes)
        except JetstreamError as e:
            _abort(context, e)
        return pb.HistoryResponse(results=[result_to_proto(r) for r in found.results],
                                  stored=found.stored, resolution_ms=found.resolution_ms,
                                  bytes=found.bytes)

    def PublishResults(self, request: pb.PublishResultsRequest,
                       context: grpc.ServicerContext) -> pb.PublishResultsResponse:
        # Results come from the root, where the final step runs.
        _as_site(context, self.controller.root, f"publishing results of {request.query}")
        try:
            self.controller.publish(request.query, [result_from_proto(r) for r in request.results],
                                    request.finished)
        except JetstreamError as e:
            _abort(context, e)
        return pb.PublishResultsResponse()


class SiteControllerServicer(rpc.SiteControllerServicer):
    """Serves a site controller that exists once the site has registered."""

    def __init__(self) -> None:
        self.controller: SiteController | None = None

    def _ready(self, context: grpc.ServicerContext) -> SiteController:
        if self.controller is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the site has not registered yet")
        assert self.controller is not None
        return self.controller

    def _from_controller(self, context: grpc.ServicerContext, what: str) -> SiteController:
        """The site controller, for a call from the global controller or this site's own
        processes (it to its workers); else PERMISSION_DENIED."""
        controller = self._ready(context)
        # A worker's site controller is "site/server"; its site's certificate deploys to it.
        _as_role(context, ("controller",), what, controller.site.partition("/")[0])
        return controller

    def DeployFragment(self, request: pb.DeployFragmentRequest,
                       context: grpc.ServicerContext) -> pb.DeployFragmentResponse:
        controller = self._from_controller(context, "deploying")
        try:
            assignment = assignment_from_proto(request.fragment, controller.site,
                                               allow_code=controller.allow_code)
            pieces = controller.deploy(assignment.fragment, assignment.version, assignment)
        except JetstreamError as e:
            _abort(context, e)
        return pb.DeployFragmentResponse(placements=[placement_to_proto(p) for p in pieces])

    def StopFragment(self, request: pb.StopFragmentRequest,
                     context: grpc.ServicerContext) -> pb.StopFragmentResponse:
        self._from_controller(context, "stopping a query").stop(request.query)
        return pb.StopFragmentResponse()

    def RegisterWorker(self, request: pb.RegisterWorkerRequest,
                       context: grpc.ServicerContext) -> pb.RegisterWorkerResponse:
        controller = self._ready(context)
        _as_role(context, (), "registering a worker", controller.site)
        try:
            if controller.workers is None:
                msg = f"site {controller.site} runs no workers: it has one server"
                raise ControlPlaneError(msg)
            if request.site != controller.site:
                msg = f"this is site {controller.site}, not {request.site}"
                raise ControlPlaneError(msg)
            controller.workers.register(request.server, request.address, request.pid)
        except JetstreamError as e:
            _abort(context, e)
        return pb.RegisterWorkerResponse()

    def ReadCubes(self, request: pb.ReadCubesRequest,
                  context: grpc.ServicerContext) -> pb.ReadCubesResponse:
        try:
            batches = self._from_controller(context, "reading cubes").read_cubes(request)
        except JetstreamError as e:
            _abort(context, e)
        return pb.ReadCubesResponse(batches=batches)

    def SetLevel(self, request: pb.SetLevelRequest,
                 context: grpc.ServicerContext) -> pb.SetLevelResponse:
        try:
            now = self._from_controller(context, "setting a level").set_level(request.query,
                                                                               request.level)
        except JetstreamError as e:
            _abort(context, e)
        return pb.SetLevelResponse(link=now.link, level=now.level, pinned=now.pinned,
                                   levels=now.levels)

