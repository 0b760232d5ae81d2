"""Starting a gRPC server the way every JetStream process does: health checks, reflection."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from jetstream.dataplane.servicer import MAX_MESSAGE_BYTES
from jetstream.security import Security

__all__ = ["MAX_MESSAGE_BYTES", "SERVER_THREADS", "start_server"]

log = logging.getLogger(__name__)

#: The calls a server runs at once, each on a thread of its own (made as they are needed).
#: A streaming call holds its thread for as long as it is open, and the data plane's are
#: open for a query's life: a ``Push`` from every sender of every query, ``Rounds`` for
#: TPUT's asks. With 16 threads, a root of six standing queries on ``local-3dc`` had none
#: left, and a deploy waited 30 s in the queue until its deadline (its query's stage then
#: started a minute late, warming up while the others ran: docs/benchmarks.md). Beyond
#: this many, a call is refused at once (``RESOURCE_EXHAUSTED``) rather than
#: queued behind streams that do not end.
SERVER_THREADS = 1024


def start_server(services: Sequence[tuple[Callable[[Any, grpc.Server], None], Any, str]],
                 port: int, host: str = "127.0.0.1", *,
                 security: Security | None = None) -> tuple[grpc.Server, int]:
    """Serve ``(add_to_server, servicer, full service name)`` triples; the server and its port.

    Every server also answers the standard health check (each service SERVING) and server
    reflection, so ``grpcurl`` and load balancers work against it. ``security`` decides who
    may connect (mutual TLS) and call (the token); the health check and reflection are
    guarded like every other service. None is plaintext, for servers inside one test
    process, and is logged as loudly as ``--insecure``; every daemon passes its own.
    """
    security = security or Security.plaintext()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=SERVER_THREADS),
                         maximum_concurrent_rpcs=SERVER_THREADS, options=[
        # Larger messages are refused by gRPC itself, before any of our code sees them.
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)],
        interceptors=security.interceptors())
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = []
    for add, servicer, name in services:
        add(servicer, server)
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        names.append(name)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    credentials = security.server_credentials()
    address = f"{host}:{port}"
    bound = (server.add_insecure_port(address) if credentials is None
             else server.add_secure_port(address, credentials))
    if bound == 0:
        msg = f"cannot listen on {host}:{port}: is the port taken?"
        raise OSError(msg)
    served = ", ".join(n.rsplit(".", 1)[-1] for n in names)
    if credentials is None:
        log.warning("INSECURE: serving %s on %s:%d without TLS or authentication (--insecure): "
                    "anyone who can reach port %d can submit, cancel and read queries, "
                    "deploy work and inject partials", served, host, bound, bound)
    else:
        log.info("serving %s on %s:%d with %s", served, host, bound, security.describe())
    server.start()
    return server, bound
