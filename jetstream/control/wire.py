"""Conversions between control-plane objects and their ``jetstream.v1`` messages."""

from __future__ import annotations

from dataclasses import dataclass

from jetstream.aggtree.planner import Fragment
from jetstream.aggtree.topology import Server
from jetstream.dataplane.options import Assignment
from jetstream.errors import ControlPlaneError
from jetstream.planwire import query_from_bytes
from jetstream.v1 import control_pb2 as pb
from jetstream.v1 import query_pb2

__all__ = ["Piece", "assignment_from_proto", "fragment_from_proto", "fragment_to_proto",
           "placement_to_proto", "server_from_proto", "server_to_proto"]


@dataclass(frozen=True)
class Piece:
    """A part of a site's fragment of a query, placed on one of its servers (what
    ``DeployFragment`` answers, and the site's heartbeat reports)."""

    query: str
    name: str  # "local stage", "merge 1/2", "final 2/4"
    server: str
    pid: int = 0  # the process that runs it: the site's own, or its server's worker
    address: str = ""  # that process's gRPC address
    #: Or "starting": a worker not registered yet, a local stage whose Spark starts or warms
    #: up; "restarting": a worker started again.
    state: str = "running"
    on_worker: bool = False


def fragment_to_proto(fragment: Fragment, spec: bytes, version: int,
                      parent_address: str = "", covers: tuple[str, ...] = (),
                      expected: tuple[str, ...] = (), resend_from_ms: int = 0) -> pb.Fragment:
    return pb.Fragment(query=fragment.query,
                       spec=query_pb2.QuerySpec(name=fragment.query,
                                                plan=query_pb2.QueryPlan.FromString(spec)),
                       sources=fragment.sources, children=fragment.children,
                       parent=fragment.parent or "", parent_address=parent_address,
                       partitions=fragment.partitions, final=fragment.final, version=version,
                       covers=covers, expected=expected, part=fragment.part[0],
                       parts=fragment.part[1], rounds=fragment.rounds,
                       uplink_bps=fragment.uplink_bps or 0.0, resend_from_ms=resend_from_ms)


def fragment_from_proto(msg: pb.Fragment, site: str) -> Fragment:
    parts = max(msg.parts, 1)
    if not 0 <= msg.part < parts:
        why = f"fragment of {msg.query} for {site}: key partition {msg.part} of {parts}"
        raise ControlPlaneError(why)
    return Fragment(query=msg.query, site=site, sources=tuple(msg.sources),
                    children=tuple(msg.children), parent=msg.parent or None,
                    partitions=max(msg.partitions, 1), final=msg.final, part=(msg.part, parts),
                    rounds=msg.rounds, uplink_bps=msg.uplink_bps or None)


def assignment_from_proto(msg: pb.Fragment, site: str) -> Assignment:
    """What a site is told to run; its plan is read now, so a site refuses a plan it cannot
    read (another format version, say) when it is deployed, with a PlanError that says why.
    A site runs the code a plan carries: its controller allowed it."""
    spec = msg.spec.plan.SerializeToString(deterministic=True)
    query_from_bytes(spec, allow_code=True)
    return Assignment(fragment_from_proto(msg, site), spec, msg.version,
                      msg.parent_address, tuple(msg.covers), tuple(msg.expected),
                      resend_from_ms=msg.resend_from_ms)


def placement_to_proto(piece: Piece) -> pb.Placement:
    return pb.Placement(query=piece.query, piece=piece.name, server=piece.server,
                        pid=piece.pid, address=piece.address, state=piece.state)


def server_to_proto(server: Server) -> pb.Server:
    return pb.Server(name=server.name, cores=server.cores, memory_gb=server.memory_gb)


def server_from_proto(msg: pb.Server) -> Server:
    return Server(msg.name, msg.cores, msg.memory_gb)
