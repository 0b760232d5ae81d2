"""Starting a gRPC server the way every JetStream process does: health checks, reflection."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

__all__ = ["MAX_MESSAGE_BYTES", "start_server"]

log = logging.getLogger(__name__)

#: Larger messages are refused by gRPC itself, before any of our code sees them.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def start_server(services: Sequence[tuple[Callable[[Any, grpc.Server], None], Any, str]],
                 port: int, host: str = "127.0.0.1") -> tuple[grpc.Server, int]:
    """Serve ``(add_to_server, servicer, full service name)`` triples; the server and its port.

    Every server also answers the standard health check (each service SERVING) and server
    reflection, so ``grpcurl`` and load balancers work against it.
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=[
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
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
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        msg = f"cannot listen on {host}:{port}: is the port taken?"
        raise OSError(msg)
    log.warning("serving %s on %s:%d without TLS (mutual TLS arrives with the security work)",
                ", ".join(n.rsplit(".", 1)[-1] for n in names), host, bound)
    server.start()
    return server, bound
