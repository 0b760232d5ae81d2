"""The control plane's wire form: fragments and what a site placed, servers, the
controller's status, and window results, to their ``jetstream.v1`` messages and back.
(A result's rows are records: :mod:`jetstream.planwire` encodes those, as it does a plan's.)"""

from __future__ import annotations

import math
from collections.abc import Mapping

from jetstream.aggtree.planner import Fragment
from jetstream.aggtree.topology import Server
from jetstream.approx.profile import LevelFigures
from jetstream.control.state import ControllerView, LinkReport, Piece
from jetstream.dataplane.options import Assignment
from jetstream.errors import ControlPlaneError, DataError
from jetstream.planwire import query_from_bytes, record_from_proto, record_to_proto
from jetstream.results import WindowResult
from jetstream.v1 import control_pb2 as pb
from jetstream.v1 import query_pb2

__all__ = ["assignment_from_proto", "fragment_from_proto", "fragment_to_proto",
           "placement_to_proto", "result_from_proto", "result_to_proto", "server_from_proto",
           "server_to_proto", "status_to_proto"]


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
                       uplink_bps=fragment.uplink_bps or 0.0, resend_from_ms=resend_from_ms,
                       level=fragment.level)


def fragment_from_proto(msg: pb.Fragment, site: str) -> Fragment:
    parts = max(msg.parts, 1)
    if not 0 <= msg.part < parts:
        why = f"fragment of {msg.query} for {site}: key partition {msg.part} of {parts}"
        raise ControlPlaneError(why)
    return Fragment(query=msg.query, site=site, sources=tuple(msg.sources),
                    children=tuple(msg.children), parent=msg.parent or None,
                    partitions=max(msg.partitions, 1), final=msg.final, part=(msg.part, parts),
                    rounds=msg.rounds, uplink_bps=msg.uplink_bps or None, level=max(msg.level, 0))


def assignment_from_proto(msg: pb.Fragment, site: str, *, allow_code: bool) -> Assignment:
    """What a site is told to run; its plan is read now, so a site refuses a plan it cannot
    read (another format version, say), or one with a ``map`` unless it ``allow_code``, when
    it is deployed, with a PlanError that says why."""
    spec = msg.spec.plan.SerializeToString(deterministic=True)
    query_from_bytes(spec, allow_code=allow_code)
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


def link_report_to_proto(query: str, report: LinkReport) -> pb.LinkReport:
    return pb.LinkReport(query=query, level=report.level, level_index=report.level_index,
                         pinned=report.pinned, sent_bytes=report.sent_bytes,
                         profile=[pb.LevelProfile(level=f.name, bytes=f.bytes, error=f.error,
                                                  windows=f.windows) for f in report.profile])


def link_report_from_proto(msg: pb.LinkReport) -> LinkReport:
    """A heartbeat's report of one query's link (its figures as sent: a level's are >= 0)."""
    return LinkReport(msg.level, msg.level_index, msg.pinned, msg.sent_bytes,
                      tuple(LevelFigures(f.level, max(f.bytes, 0.0), max(f.error, 0.0),
                                         max(f.windows, 0)) for f in msg.profile))


def behind_to_proto(behind: Mapping[str, tuple[int, float]]) -> list[pb.InputLag]:
    """How far a site is behind each input folder (``SourceReaders.behind``)."""
    return [pb.InputLag(folder=folder, files_waiting=files, lag_s=lag_s)
            for folder, (files, lag_s) in sorted(behind.items())]


def status_to_proto(view: ControllerView) -> pb.StatusResponse:
    """The controller's view: sites, queries with their trees, and planned link load."""
    sites = [pb.SiteStatus(
        name=s.name, kind=s.kind, address=s.address or "", alive=s.alive,
        seconds_since_heartbeat=-1.0 if s.seconds_since_heartbeat is None
        else s.seconds_since_heartbeat,
        placements=[pb.Placement(query=p.query, piece=p.piece, server=p.server, pid=p.pid,
                                 address=p.address, state=p.state) for p in s.placements],
        links=[link_report_to_proto(query, s.links[query]) for query in sorted(s.links)],
        behind=behind_to_proto(s.behind))
        for s in view.sites]
    queries = [pb.QueryStatus(
        name=q.name, state=q.state, detail=q.detail, replans=q.replans,
        plan=q.plan.render() if q.plan else "", parents=q.parents, failures=q.failures,
        late_records=q.late_records)
        for q in view.queries]
    links = [pb.LinkStatus(a=link.a, b=link.b, bandwidth_bps=link.bandwidth_bps,
                           planned_bytes_per_s=load, utilisation=load * 8 / link.bandwidth_bps)
             for link, load in view.link_load]
    return pb.StatusResponse(topology=view.topology.name, root=view.topology.root,
                             sites=sites, queries=queries, links=links)


def result_to_proto(result: WindowResult) -> query_pb2.WindowResult:
    msg = query_pb2.WindowResult(query=result.query, window_start_ms=result.window_start,
                          window_end_ms=result.window_end, exact=result.exact,
                          rows=[record_to_proto(r) for r in result.rows],
                          sites_reporting=result.sites_reporting or 0,
                          sites_expected=result.sites_expected or 0,
                          latency_s=result.latency_s or 0.0, wan_bytes=result.wan_bytes or 0,
                          revision=result.revision, warnings=result.warnings,
                          missing_sites=result.missing_sites, history=result.history,
                          rolled_up=result.rolled_up, final=result.final,
                          provisional=result.provisional,
                          columns=list(dict.fromkeys(c for row in result.rows for c in row)))
    if result.error_bound is not None:
        msg.error_bound = result.error_bound
    return msg


def result_from_proto(msg: query_pb2.WindowResult) -> WindowResult:
    """The result in ``msg``; raises DataError if it cannot be one (see ``_check_result``)."""
    _check_result(msg)
    return WindowResult(query=msg.query, window_start=msg.window_start_ms,
                        window_end=msg.window_end_ms,
                        rows=[record_from_proto(r, tuple(msg.columns)) for r in msg.rows],
                        exact=msg.exact,
                        error_bound=msg.error_bound if msg.HasField("error_bound") else None,
                        sites_reporting=msg.sites_reporting if msg.sites_expected else None,
                        sites_expected=msg.sites_expected or None,
                        latency_s=msg.latency_s if msg.sites_expected else None,
                        wan_bytes=msg.wan_bytes if msg.sites_expected else None,
                        revision=msg.revision, warnings=list(msg.warnings),
                        missing_sites=list(msg.missing_sites), history=msg.history,
                        rolled_up=dict(msg.rolled_up), final=msg.final,
                        provisional=list(msg.provisional))


def _check_result(msg: query_pb2.WindowResult) -> None:
    """Refuse an empty window, a NaN or negative error bound, negative counts, or a latency
    that is not finite (it may be negative: site clocks differ)."""
    checks = (
        (f"window [{msg.window_start_ms}, {msg.window_end_ms}) is empty",
         msg.window_end_ms <= msg.window_start_ms),
        (f"error_bound {msg.error_bound!r} is not a finite non-negative number",
         msg.HasField("error_bound") and not 0 <= msg.error_bound < math.inf),
        ("sites_reporting, sites_expected, wan_bytes and revision cannot be negative",
         min(msg.sites_reporting, msg.sites_expected, msg.wan_bytes, msg.revision) < 0),
        (f"latency_s {msg.latency_s!r} is not finite", not math.isfinite(msg.latency_s)))
    for problem, bad in checks:
        if bad:
            text = f"window result of {msg.query or '?'} at {msg.window_start_ms}: {problem}"
            raise DataError(text)
