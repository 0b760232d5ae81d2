"""Every Prometheus metric a JetStream process exports, defined once, and the ``/metrics`` server.

Names follow the Prometheus conventions: a ``jetstream_`` prefix, base units (seconds, bytes),
``_total`` on counters. Labels are few and bounded: ``site``, ``query``, ``link`` (``"child->
parent"``, the direction bytes flow) and a malformed record's ``reason`` -- never a group key or
a domain. The runtime updates them once per micro-batch, batch or window, never per record.
The metrics live on ``prometheus_client``'s default registry, beside its ``process_*`` and
``python_*`` collectors; a process serves them with :func:`serve_metrics`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import Counter, Gauge, Histogram, make_wsgi_app, start_http_server

from jetstream.security import http_authorized

if TYPE_CHECKING:
    from jetstream.approx.profile import LevelFigures

__all__ = ["BATCH_DURATION", "INPUT_FILES_WAITING", "INPUT_LAG", "LINK_LEVEL",
           "LINK_MEASURED_BANDWIDTH", "LINK_THROUGHPUT",
           "PARTIALS_REFUSED", "RECEIVER_HELD", "RECORDS_IN", "RECORDS_LATE", "RECORDS_MALFORMED",
           "RECORDS_OUT", "REPLANS", "ROOT_FAILOVERS", "UNACKED", "WAN_BYTES_RECEIVED",
           "WAN_BYTES_SENT", "WATERMARK_LAG", "WINDOW_LATENCY", "RunMetrics", "link_name",
           "serve_metrics"]

# -- a site's local stage (per micro-batch) ----------------------------------------------------
RECORDS_IN = Counter(
    "jetstream_records_in_total",
    "Well-formed records the site's local stage read from its input.", ["site", "query"])
RECORDS_MALFORMED = Counter(
    "jetstream_records_malformed_total",
    "Malformed records the local stage quarantined, by reason.", ["site", "query", "reason"])
RECORDS_LATE = Counter(
    "jetstream_records_late_total",
    "Records dropped because the watermark had already closed their window.",
    ["site", "query"])
INPUT_FILES_WAITING = Gauge(
    "jetstream_input_files_waiting",
    "Files landed in a site's input folder and not read yet by its local stage.",
    ["site", "folder"])
INPUT_LAG = Gauge(
    "jetstream_input_lag_seconds",
    "How long ago the oldest file not read yet landed in the site's input folder (0: none): "
    "how far the site's reading is behind.", ["site", "folder"])
BATCH_DURATION = Histogram(
    "jetstream_stage_batch_duration_seconds",
    "Wall time of one Spark micro-batch of the local stage.", ["site", "query"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0))

# -- a site's merger and sender (per window) ---------------------------------------------------
RECORDS_OUT = Counter(
    "jetstream_records_out_total",
    "Rows the site handed on: partial rows sent to its parent, or result rows at the root.",
    ["site", "query"])
WATERMARK_LAG = Gauge(
    "jetstream_watermark_lag_seconds",
    "Wall clock minus the event-time watermark of every input the site merges.",
    ["site", "query"])
WINDOW_LATENCY = Histogram(
    "jetstream_window_result_latency_seconds",
    "At the root: from a window's close at the sites to its result.", ["query"],
    buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0))

# -- wide-area links (per message) -------------------------------------------------------------
WAN_BYTES_SENT = Counter(
    "jetstream_wan_sent_bytes_total",
    "Bytes of partials and progress sent over a wide-area link, resends included.", ["link"])
WAN_BYTES_RECEIVED = Counter(
    "jetstream_wan_received_bytes_total",
    "Bytes of partials and progress received over a wide-area link.", ["link"])
PARTIALS_REFUSED = Counter(
    "jetstream_partials_refused_total",
    "Partial batches a receiver could not decode and refused.", ["link"])
UNACKED = Gauge(
    "jetstream_unacked_messages",
    "Messages sent over a link and not yet acknowledged (the upstream backup).",
    ["link", "query"])
RECEIVER_HELD = Histogram(
    "jetstream_receiver_held_seconds",
    "How long a receiver held a message from a link before acknowledging it (decoding, "
    "merging, writing it down): the receiver's load, which its senders do not take for the "
    "link's.", ["link"], buckets=(0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
LINK_LEVEL = Gauge(
    "jetstream_link_degradation_level",
    "The degradation level a link ships a query's windows at: 0 is exact, higher is coarser.",
    ["link", "query"])
LINK_THROUGHPUT = Gauge(
    "jetstream_link_throughput_bytes_per_second",
    "A link's throughput as its sender measures it from acknowledged windows (smoothed).",
    ["link", "query"])

PROFILE_CPU = Counter(
    "jetstream_link_profile_cpu_seconds_total",
    "CPU time a link's sender spent measuring what each level would send and lose.",
    ["link", "query"])
PROFILE_BYTES = Gauge(
    "jetstream_link_profile_bytes",
    "A window's mean encoded size at a level, measured on the query's own windows.",
    ["link", "query", "level"])
PROFILE_ERROR = Gauge(
    "jetstream_link_profile_error",
    "The largest error bound a window's result would have had at a level, as measured.",
    ["link", "query", "level"])

# -- the global controller ---------------------------------------------------------------------
LINK_MEASURED_BANDWIDTH = Gauge(
    "jetstream_link_measured_bandwidth_bytes_per_second",
    "A saturated link's bandwidth as the site at its child end measures it and reports it in "
    "heartbeats (absent while no query saturates the link).", ["link"])
REPLANS = Counter(
    "jetstream_replans_total",
    "Times the global controller re-planned a query (a site died or came back, a link "
    "moved).", ["query"])
ROOT_FAILOVERS = Counter(
    "jetstream_root_failovers_total",
    "Times the root died and a standby root took its place (topology's standby_roots).")


def link_name(child: str, parent: str) -> str:
    """A link's label: the direction partials flow."""
    return f"{child}->{parent}"


class RunMetrics:
    """The metrics of one query's run at one site (see :class:`jetstream.dataplane.run.QueryRun`).

    ``link`` is the run's link to its parent ("" at the root). :meth:`remove` takes the run's
    gauges away when it stops: a gauge left behind would show its last value forever.
    """

    def __init__(self, site: str, query: str) -> None:
        self.site, self.query, self.link = site, query, ""
        self._profiled: set[str] = set()  # levels with profile gauges
        # What each local stage had counted at its last micro-batch: records, late, malformed.
        self._stage: dict[str, tuple[int, int, Tally[str]]] = {}

    def stage_batch(self, stage: str, records_in: int, late: int, malformed: Tally[str],
                    seconds: float) -> None:
        """After a micro-batch of the local stage ``stage`` (its input's name): the stage's
        running totals, and how long the batch took."""
        labels = self._labels
        records_before, late_before, malformed_before = self._stage.get(stage, (0, 0, Tally()))
        BATCH_DURATION.labels(*labels).observe(seconds)
        RECORDS_IN.labels(*labels).inc(records_in - records_before)
        RECORDS_LATE.labels(*labels).inc(late - late_before)
        for reason, count in (malformed - malformed_before).items():
            RECORDS_MALFORMED.labels(*labels, reason).inc(count)
        self._stage[stage] = (records_in, late, malformed.copy())

    @property
    def late_records(self) -> int:
        """The records the run's local stages dropped as late, as of their last batches."""
        return sum(late for _, late, _ in self._stage.values())

    def handed_on(self, rows: int) -> None:
        RECORDS_OUT.labels(*self._labels).inc(rows)

    def watermark(self, watermark_ms: int | None, *, ended: bool) -> None:
        """The merged watermark; ``ended``: every input is idle or ended, none holds back."""
        if watermark_ms is not None:
            lag = 0.0 if ended else max(0.0, time.time() - watermark_ms / 1000)
            WATERMARK_LAG.labels(*self._labels).set(lag)

    def result(self, latency_s: float) -> None:
        WINDOW_LATENCY.labels(self.query).observe(max(latency_s, 0.0))

    def link_state(self, level: int, throughput: float | None) -> None:
        LINK_LEVEL.labels(self.link, self.query).set(level)
        if throughput is not None:
            LINK_THROUGHPUT.labels(self.link, self.query).set(throughput)

    def profile(self, cpu_s: float, figures: Iterable[LevelFigures]) -> None:
        """A link's profile after a measured window, which took ``cpu_s`` to measure."""
        PROFILE_CPU.labels(self.link, self.query).inc(max(cpu_s, 0.0))
        for f in figures:
            if f.windows:
                PROFILE_BYTES.labels(self.link, self.query, f.name).set(f.bytes)
                PROFILE_ERROR.labels(self.link, self.query, f.name).set(f.error)
                self._profiled.add(f.name)

    def remove_link(self) -> None:
        for gauge in (LINK_LEVEL, LINK_THROUGHPUT, PROFILE_CPU):
            with contextlib.suppress(KeyError):
                gauge.remove(self.link, self.query)
        for level in self._profiled:
            for gauge in (PROFILE_BYTES, PROFILE_ERROR):
                with contextlib.suppress(KeyError):
                    gauge.remove(self.link, self.query, level)
        self._profiled.clear()

    def remove(self) -> None:
        self.remove_link()
        with contextlib.suppress(KeyError):
            WATERMARK_LAG.remove(*self._labels)

    @property
    def _labels(self) -> tuple[str, str]:
        return self.site, self.query


def serve_metrics(port: int, host: str = "127.0.0.1", *, token: str | None = None
                  ) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` on ``host:port`` from a daemon thread; the server and its thread.
    Port 0 takes any free port (``server.server_port`` says which). With a ``token``, a
    scrape must carry it (``Authorization: Bearer TOKEN``, or Basic with it as the password);
    others get 401."""
    if token is None:
        server, thread = start_http_server(port, addr=host)
        return server, thread
    metrics_app = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if http_authorized(environ.get("HTTP_AUTHORIZATION"), token):
            return metrics_app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                            ("WWW-Authenticate", 'Basic realm="jetstream"')])
        return [b"the process's token is required (Authorization: Bearer TOKEN)\n"]

    server = make_server(host, port, app, _ThreadingServer6 if ":" in host else _ThreadingServer,
                         handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass
