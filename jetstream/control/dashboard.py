"""The live dashboard: a page the global controller serves, and the JSON state it polls.

``/`` is ``dashboard.html`` (plain HTML, SVG and JavaScript: no build step, nothing fetched
from elsewhere); it polls ``/api/state`` every second and draws the topology with each link's
load and level, every query's newest window with its bounds, and wide-area against raw bytes,
latency and degradation levels over time. The page is read-only and shows no secrets; it is
plain HTTP: bind it to a trusted address (``--dashboard-host``), and with a token
(``--http-token``) it asks for it (Basic, the token as the password: a browser asks once).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

import networkx as nx

from jetstream.control.global_controller import GlobalController
from jetstream.metrics import link_name
from jetstream.security import http_authorized

__all__ = ["HISTORY", "Dashboard", "DashboardState", "serve_dashboard"]

log = logging.getLogger(__name__)

#: Samples kept for the charts: ten minutes at one a second.
HISTORY = 600
#: Results per query whose latency the chart shows.
LATENCY_POINTS = 200
#: A link's measured load is its bytes over this many seconds of samples (or all there are):
#: a few windows, since a link carries a burst a window and little in between.
RATE_SPAN_S = 30.0


@dataclass(frozen=True)
class Sample:
    """What the controller knew at one moment, for the charts."""

    t: float  # wall clock, epoch seconds
    wan_bytes: int  # sent over the wide-area links since the dashboard started
    raw_bytes: int  # raw logs landed at the sites other than the root
    link_bytes: dict[str, int]  # "child->parent" -> bytes sent over it since the start
    levels: dict[str, int]  # "child->parent" -> its coarsest level over the queries


class DashboardState:
    """Samples a :class:`GlobalController` for the charts and answers ``/api/state``.

    The sites report what their senders have sent, per query, in their heartbeats; a sender
    replaced by a re-plan or a restart counts from 0 again, so the totals here add up
    differences, taking a smaller count as a fresh one.
    """

    def __init__(self, controller: GlobalController, *, clock: Callable[[], float] = time.time,
                 history: int = HISTORY) -> None:
        self.controller, self.clock = controller, clock
        self.samples: deque[Sample] = deque(maxlen=history)
        self._lock = threading.Lock()
        self._sent: dict[tuple[str, str], int] = {}  # (site, query) -> its last report
        self._link_bytes: dict[str, int] = {}
        self._layout = _layout(controller)

    def sample(self) -> Sample:
        """Take one sample of the controller's state (the sampler thread does, every second)."""
        view = self.controller.view()
        root = view.topology.root
        raw = sum(s.input_bytes for s in view.sites if s.name != root)
        levels: dict[str, int] = {}
        sent: dict[tuple[str, str], tuple[str, int]] = {}
        for site in view.sites:
            for query, report in site.links.items():
                parent = view.parent(query, site.name)
                if parent is None:
                    continue
                link = link_name(site.name, parent)
                levels[link] = max(levels.get(link, 0), report.level_index)
                sent[(site.name, query)] = (link, report.sent_bytes)
        with self._lock:
            for key, (link, count) in sent.items():
                last = self._sent.get(key, 0)
                self._link_bytes[link] = self._link_bytes.get(link, 0) + (
                    count - last if count >= last else count)
                self._sent[key] = count
            sample = Sample(self.clock(), sum(self._link_bytes.values()), raw,
                            dict(self._link_bytes), levels)
            self.samples.append(sample)
        return sample

    def snapshot(self) -> dict[str, Any]:
        """The state the page draws: topology, links, queries with their newest window, and
        the series of the charts."""
        controller = self.controller
        with self._lock:
            samples = list(self.samples)
        rates = _rates(samples)
        view = controller.view()
        sites = [{
            "name": s.name, "kind": s.kind, "registered": s.address is not None,
            "alive": s.alive, "seconds_since_heartbeat": s.seconds_since_heartbeat,
            "input_bytes": s.input_bytes, **self._layout.get(s.name, {"x": 0.5, "y": 0.5}),
            # How far it is behind: the files landed and not read yet, the oldest's age.
            "files_waiting": sum(files for files, _ in s.behind.values()),
            "lag_s": max((lag_s for _, lag_s in s.behind.values()), default=0.0),
        } for s in view.sites]
        reports = {(site.name, query): report for site in view.sites
                   for query, report in site.links.items()}
        load = {link.ends: bytes_per_s for link, bytes_per_s in view.link_load}
        links = []
        for link in view.topology.links:  # a link that is down too, drawn so
            child, parent = self._direction(link.a, link.b)
            name, planned = link_name(child, parent), load.get(link.ends, 0.0)
            measured = rates.get(name)
            # Utilisation is of what the link carries now: its measured bandwidth while it
            # is saturated (see daemons.link_measurements), else its configured one.
            bandwidth = view.measured_bps.get(link.ends)
            capacity = bandwidth or link.bandwidth_bps
            links.append({
                "name": name, "child": child, "parent": parent, "up": link.ends in load,
                "bandwidth_bps": link.bandwidth_bps, "latency_ms": link.latency_ms,
                "measured_bandwidth_bps": bandwidth,
                "planned_bytes_per_s": planned,
                "planned_utilisation": planned * 8 / capacity,
                "measured_bytes_per_s": measured,
                "measured_utilisation": None if measured is None else measured * 8 / capacity,
                "levels": {query: {"level": r.level, "index": r.level_index,
                                   "pinned": r.pinned,
                                   "profile": [dataclasses.asdict(f) for f in r.profile]}
                           for (site, query), r in sorted(reports.items())
                           if site == child and view.parent(query, site) == parent},
            })
        queries = [{"name": q.name, "state": q.state, "detail": q.detail,
                    "replans": q.replans, "parents": q.parents,
                    # Which process runs each piece: the site's own, or a server's worker.
                    "pieces": [{"site": site.name, "piece": p.piece, "server": p.server,
                                "pid": p.pid or None, "address": p.address,
                                "state": p.state or "deployed"}
                               for site in view.sites for p in site.placements
                               if p.query == q.name]} for q in view.queries]
        for query in queries:
            newest = controller.results.newest(str(query["name"]), LATENCY_POINTS * 2)
            latest = max(newest, key=lambda r: (r.window_end, r.revision), default=None)
            query["latest"] = latest.to_dict() if latest else None
            first = {r.window_end: r.latency_s for r in reversed(newest)
                     if r.revision == 0 and r.latency_s is not None}
            query["latency"] = sorted([end, latency] for end, latency in first.items()
                                      )[-LATENCY_POINTS:]
        return _finite({
            "topology": view.topology.name, "root": view.topology.root,
            "now": self.clock(), "sites": sites, "links": links, "queries": queries,
            "series": {
                "t": [s.t for s in samples],
                "wan_bytes": [s.wan_bytes for s in samples],
                "raw_bytes": [s.raw_bytes for s in samples],
                "levels": {link: [s.levels.get(link) for s in samples]
                           for link in sorted({k for s in samples for k in s.levels})},
            },
        })

    def _direction(self, a: str, b: str) -> tuple[str, str]:
        """(child, parent) of a link: partials flow towards the root."""
        depth = {name: spot["depth"] for name, spot in self._layout.items()}
        return (a, b) if depth.get(a, 0) >= depth.get(b, 0) else (b, a)


def _layout(controller: GlobalController) -> dict[str, dict[str, float]]:
    """Where the page draws each site: the root on top, each site a row per hop below it,
    in breadth-first order so that a site sits under its neighbours."""
    topology = controller.topology
    graph = topology.graph()
    graph.add_nodes_from(s.name for s in topology.sites)
    order = [topology.root, *(b for _, b in nx.bfs_edges(
        graph, topology.root, sort_neighbors=sorted))] if topology.root in graph else []
    order += sorted(set(graph) - set(order))  # not connected to the root: a last row
    depths = nx.single_source_shortest_path_length(graph, topology.root) \
        if topology.root in graph else {}
    deepest = max(depths.values(), default=0) + 1
    rows: dict[int, list[str]] = {}
    for name in order:
        rows.setdefault(depths.get(name, deepest), []).append(name)
    layers = max(rows) + 1
    return {name: {"x": (i + 1) / (len(row) + 1), "y": (depth + 0.5) / layers, "depth": depth}
            for depth, row in rows.items() for i, name in enumerate(row)}


def _rates(samples: list[Sample]) -> dict[str, float]:
    """Each link's bytes/s over the newest ``RATE_SPAN_S`` of samples (or all of them)."""
    if len(samples) < 2:
        return {}
    newest = samples[-1]
    older = next((s for s in reversed(samples) if newest.t - s.t >= RATE_SPAN_S), samples[0])
    span = newest.t - older.t
    if span <= 0:
        return {}
    return {link: (count - older.link_bytes.get(link, 0)) / span
            for link, count in newest.link_bytes.items()}


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None: JSON has no word for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class _Handler(BaseHTTPRequestHandler):
    state: DashboardState  # set on the subclass serve_dashboard makes
    page: bytes
    token: str | None

    def do_GET(self) -> None:
        if self.token is not None and not http_authorized(self.headers.get("Authorization"),
                                                          self.token):
            self.send_response(HTTPStatus.UNAUTHORIZED)
            self.send_header("WWW-Authenticate", 'Basic realm="jetstream dashboard"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(self.page, "text/html; charset=utf-8")
        elif path == "/api/state":
            body = json.dumps(self.state.snapshot(), allow_nan=False).encode()
            self._send(body, "application/json")
        else:
            self.send_error(HTTPStatus.NOT_FOUND, "the dashboard serves / and /api/state")

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy",
                         "default-src 'none'; script-src 'unsafe-inline'; "
                         "style-src 'unsafe-inline'; connect-src 'self'")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard: %s", format % args)


class Dashboard:
    """A running dashboard: its HTTP server and its sampler, each on a daemon thread."""

    def __init__(self, state: DashboardState, server: ThreadingHTTPServer,
                 interval_s: float) -> None:
        self.state, self.server = state, server
        self._stop = threading.Event()
        threading.Thread(target=server.serve_forever, name="dashboard", daemon=True).start()
        threading.Thread(target=self._sample, args=(interval_s,), name="dashboard-sampler",
                         daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def _sample(self, interval_s: float) -> None:
        while True:
            try:
                self.state.sample()
            except Exception:  # a bad sample must not stop the charts for good
                log.exception("dashboard: sampling the controller failed")
            if self._stop.wait(interval_s):
                return

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


def serve_dashboard(controller: GlobalController, port: int, host: str = "127.0.0.1", *,
                    interval_s: float = 1.0, token: str | None = None) -> Dashboard:
    """Serve the dashboard of ``controller`` on ``host:port`` (0: any free port) until
    :meth:`Dashboard.close`; with a ``token``, only to requests that carry it."""
    state = DashboardState(controller)
    page = resources.files("jetstream.control").joinpath("dashboard.html").read_bytes()
    handler = type("DashboardHandler", (_Handler,),
                   {"state": state, "page": page, "token": token})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return Dashboard(state, server, interval_s)
