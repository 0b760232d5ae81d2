"""The CLI's remote calls to the global controller, each with a deadline."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from jetstream.control.codec import result_from_proto
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError
from jetstream.planwire import query_to_proto
from jetstream.queryfile import load_query
from jetstream.results import WindowResult
from jetstream.security import Security
from jetstream.v1 import control_pb2 as pb
from jetstream.v1 import control_pb2_grpc as rpc
from jetstream.v1 import query_pb2

__all__ = ["DEFAULT_CONTROLLER", "ControllerClient"]

#: Where the CLI looks for the global controller unless told otherwise.
DEFAULT_CONTROLLER = os.environ.get("JETSTREAM_CONTROLLER", "127.0.0.1:7070")


class ControllerClient:
    def __init__(self, address: str = DEFAULT_CONTROLLER, timeout_s: float = 10.0, *,
                 security: Security) -> None:
        self.address, self.timeout_s, self.security = address, timeout_s, security
        self._channel = security.channel(address)
        self._stub = rpc.GlobalControllerStub(self._channel)

    def _call(self, method: str, request: object, timeout_s: float | None = None) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _error(self, e: grpc.RpcError) -> ControlPlaneError:
        if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            # A refused TLS handshake looks like this too: say what to check.
            tls = ("" if self.security.insecure else
                   f", with certificates of the CA in {self.security.tls_dir}")
            return ControlPlaneError(f"cannot reach the controller at {self.address} "
                                     f"({e.code().name}); is `jetstream controller` running"
                                     f"{tls}?")
        if e.code() is grpc.StatusCode.UNAUTHENTICATED:
            return ControlPlaneError(f"the controller at {self.address} refused us: "
                                     f"{e.details()}")
        return ControlPlaneError(str(e.details()))

    @staticmethod
    def _spec(query: Query | str | Path) -> query_pb2.QuerySpec:
        """What the controller is sent: the query's plan. A query file is run here, once."""
        if not isinstance(query, Query):
            query = load_query(query)
        plan = query_to_proto(query)
        return query_pb2.QuerySpec(name=query.name, slo=plan.slo, plan=plan)

    def submit(self, query: Query | str | Path, since_ms: int | None = None
               ) -> pb.SubmitQueryResponse:
        """Submit ``query`` (or the query file at that path, run here once); with
        ``since_ms``, its results start with the windows since then, backfilled from the
        sites' cubes (see ``GlobalController.backfill``)."""
        request = pb.SubmitQueryRequest(query=self._spec(query))
        if since_ms is not None:
            request.since_ms = since_ms
        response: pb.SubmitQueryResponse = self._call(
            "SubmitQuery", request, timeout_s=None if since_ms is None else 120.0)
        return response

    def explain(self, query: Query | str | Path) -> str:
        response: pb.ExplainResponse = self._call(
            "Explain", pb.ExplainRequest(query=self._spec(query)))
        return str(response.text)

    def status(self) -> pb.StatusResponse:
        response: pb.StatusResponse = self._call("Status", pb.StatusRequest())
        return response

    def cancel(self, query: str) -> None:
        self._call("CancelQuery", pb.CancelQueryRequest(query=query))

    def history(self, query: Query | str | Path, since_ms: int, until_ms: int
                ) -> pb.HistoryResponse:
        """The results of ``query`` (or the query file at that path, run here once) over the
        windows inside ``[since_ms, until_ms)`` (event time, epoch ms), answered from the
        sites' cubes of a query that ran (see :mod:`jetstream.dataplane.history`); each result has
        ``history`` set (``wire.result_from_proto`` reads them)."""
        response: pb.HistoryResponse = self._call("History", pb.HistoryRequest(
            query=self._spec(query), since_ms=since_ms, until_ms=until_ms), timeout_s=120.0)
        return response

    def set_level(self, query: str, site: str, level: str = "") -> pb.SetLevelResponse:
        response: pb.SetLevelResponse = self._call("SetLevel", pb.SetLevelRequest(
            query=query, site=site, level=level))
        return response

    def results(self, query: str, timeout_s: float | None = None) -> Iterator[WindowResult]:
        """The query's results as they arrive, until it is cancelled or ``timeout_s`` passes."""
        stream = self._stub.StreamResults(pb.StreamResultsRequest(query=query),
                                          timeout=timeout_s or 7 * 24 * 3600.0)
        try:
            for message in stream:
                yield result_from_proto(message)
        except grpc.RpcError as e:
            if e.code() is not grpc.StatusCode.DEADLINE_EXCEEDED or timeout_s is None:
                raise self._error(e) from None
