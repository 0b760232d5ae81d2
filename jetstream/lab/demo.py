"""``jetstream demo``: the CDN top-k over live generated logs at every site, shown as it runs.

It starts a :class:`~jetstream.control.launch.LocalCluster` (a controller and one process per
site, each with its own Spark JVM), writes live logs into each site's input folder
(:func:`jetstream.lab.loggen.write_live`), submits the query, and shows the newest complete windows
with their bounds, the wide-area bytes against the raw bytes they replace, and the degradation
level of every link; or, with ``--edge nginx``, starts a real nginx at each site, has wrk
ask it for the rate and rsyslog send its access log to the site (:mod:`jetstream.lab.edge`).
``duration_s`` counts from the first complete window; Ctrl-C (or its end)
stops everything, in an order that lets every stream stop cleanly.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from jetstream.aggtree.loader import load_topology
from jetstream.control.launch import LocalCluster, free_port
from jetstream.control.results_view import MAX_WINDOWS, render_window
from jetstream.dsl import Query, reading
from jetstream.errors import ControlPlaneError
from jetstream.lab.edge import Edge, site_args
from jetstream.lab.loggen import LogSpec, write_live
from jetstream.results import WindowResult

__all__ = ["DemoSummary", "RawLogLedger", "is_complete", "live_demo"]

#: How often the view (and the link levels in it) refreshes.
REFRESH_S = 1.0
#: How long to wait for the first complete window before giving up (a cold start of three
#: JVMs on two cores takes about a minute; this is several times that).
FIRST_WINDOW_TIMEOUT_S = 300.0


def is_complete(result: WindowResult, feed_start_ms: int) -> bool:
    """Whether a window counts: every site reported it, and it lies wholly after the moment
    the log feed began (an earlier window holds only part of its traffic, or only the few
    out-of-order records stamped before the feed began)."""
    return (bool(result.sites_expected) and result.sites_reporting == result.sites_expected
            and result.window_start >= feed_start_ms)


class RawLogLedger:
    """The raw log lines written at the edge sites, by event time, so that the raw bytes set
    against the wide-area bytes are those of the windows shown, and of nothing else.

    ``clock`` is the log writer's clock: its first reading is when the feed began.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamps: list[np.ndarray] = []  # per file: event times of its lines (ms)
        self._sizes: list[np.ndarray] = []  # per file: bytes of each line, with its newline
        self.feed_start_ms: int | None = None

    def clock(self) -> float:
        now = time.time()
        with self._lock:
            if self.feed_start_ms is None:
                self.feed_start_ms = round(now * 1000)
        return now

    def add_file(self, path: Path) -> None:
        lines = path.read_bytes().splitlines(keepends=True)[1:]  # the header is no record
        self.add([int(line[:line.index(b",")]) for line in lines], [len(x) for x in lines])

    def add(self, stamps: list[int], sizes: list[int]) -> None:
        """Lines written: their event times (ms) and their bytes, each with its newline."""
        with self._lock:
            self._stamps.append(np.array(stamps, dtype=np.int64))
            self._sizes.append(np.array(sizes, dtype=np.int64))

    def bytes_between(self, start_ms: int, end_ms: int) -> int:
        """Bytes of the lines written so far whose event time is in ``[start_ms, end_ms)``."""
        with self._lock:
            files = list(zip(self._stamps, self._sizes, strict=True))
        return int(sum(sizes[(stamps >= start_ms) & (stamps < end_ms)].sum()
                       for stamps, sizes in files))


@dataclass
class DemoSummary:
    """What a demo run did, for the closing lines and for tests."""

    windows: dict[tuple[int, int], WindowResult] = field(default_factory=dict)  # complete
    #: Raw bytes of each complete window's records at the edge sites, taken when its first
    #: complete result arrived (records stamped inside it but written later are late: the
    #: stages drop them, and shipping raw logs would not wait for them either).
    raw_by_window: dict[tuple[int, int], int] = field(default_factory=dict)
    not_shown: dict[tuple[int, int], WindowResult] = field(default_factory=dict)
    feed_start_ms: int | None = None
    first_complete_at: float | None = None  # time.monotonic() when the first one arrived
    first_complete_s: float | None = None  # ... and how long after submitting the query
    records: int = 0
    levels: dict[str, str] = field(default_factory=dict)  # link -> level

    @property
    def wan_bytes(self) -> int:
        return sum(r.wan_bytes or 0 for r in self.windows.values())

    @property
    def raw_bytes(self) -> int:
        return sum(self.raw_by_window.values())

    def savings(self) -> str:
        wan, raw, n = self.wan_bytes, self.raw_bytes, len(self.windows)
        ratio = f" ({raw / wan:,.0f}x less)" if wan else ""
        return (f"wide area: {wan:,} B of partials for {raw:,} B of raw logs at the edge "
                f"sites, in the {n} complete window{'' if n == 1 else 's'} shown{ratio}; "
                f"{self.records:,} records generated")


def live_demo(topology: Path, query: Query, work: Path, *, rate: float,
              duration_s: float | None, spec: LogSpec, seed: int,
              say: Callable[[str], None], console: Console,
              cluster_options: dict[str, Any] | None = None,
              edge: bool = False) -> DemoSummary:
    """Run the demo until ``duration_s`` has passed since the first complete window (None:
    until Ctrl-C); what it saw. ``cluster_options`` go to the :class:`LocalCluster` (the
    emulator's namespaces). With ``edge``, the logs are not generated: each site's nginx
    serves wrk's requests and rsyslog sends its access log to the site
    (:mod:`jetstream.lab.edge`).

    Raises
    ------
    ControlPlaneError
        If a process exits, or no complete window comes within ``FIRST_WINDOW_TIMEOUT_S``.
    """
    layout = load_topology(topology)
    sites, root = [s.name for s in layout.sites if s.sources], layout.root
    inputs = work / "input"
    for site in sites:
        (inputs / site).mkdir(parents=True, exist_ok=True)
    summary = DemoSummary()
    ledger = RawLogLedger()
    stop = threading.Event()
    options = dict(cluster_options or {})
    relp = {site: free_port() for site in sites}
    if edge:
        options["site_args"] = lambda site: site_args(relp[site])
        query = reading(query, {source.name: "json" for source in query.stream.plan.sources()})
    with LocalCluster(topology, inputs, read_files="archive", idle_timeout_s=30,
                      logs=work / "logs", say=say, **options) as cluster, \
            contextlib.ExitStack() as edges:
        def count(chunk: int, records: int) -> None:
            summary.records += records

        def written(path: Path, records: int) -> None:
            if path.parent.name != root:  # the root's own logs never cross the wide area
                ledger.add_file(path)

        def generate() -> None:
            write_live(inputs, sites, rate=rate, spec=spec, seed=seed, stop=stop,
                       clock=ledger.clock, on_chunk=count, on_file=written)

        if edge:
            servers = [edges.enter_context(Edge(site, work / "edge" / site, free_port(),
                                                relp[site])) for site in sites]
            writer = threading.Thread(target=_serve, args=(servers, root, rate, seed, ledger,
                                                           summary, stop),
                                      name="wrk", daemon=True)
            feed = (f"wrk asking the nginx of each of {', '.join(sites)} for about {rate:g} "
                    f"requests/s, rsyslog sending its access log (in {work / 'edge'})")
        else:
            writer = threading.Thread(target=generate, name="loggen", daemon=True)
            feed = f"writing {rate:g} records/s at each of {', '.join(sites)} (files in {inputs})"
        writer.start()
        name = cluster.client.submit(query).query
        say(f"submitted {name}; {feed}")
        results = threading.Thread(target=_collect, args=(cluster, name, summary, ledger),
                                   name="results", daemon=True)
        results.start()
        started = time.monotonic()
        try:
            with Live(console=console, auto_refresh=False) as live:
                while not stop.is_set():
                    now = time.monotonic()
                    first = summary.first_complete_at
                    if first is None and now - started > FIRST_WINDOW_TIMEOUT_S:
                        msg = (f"no complete window within {FIRST_WINDOW_TIMEOUT_S:.0f}s of "
                               f"submitting {name}\n{cluster.tail()}")
                        raise ControlPlaneError(msg)
                    if first is not None and summary.first_complete_s is None:
                        summary.first_complete_s = first - started
                    if first is not None and duration_s is not None \
                            and now - first >= duration_s:
                        break
                    cluster.check_alive()
                    summary.feed_start_ms = ledger.feed_start_ms
                    summary.levels = _levels(cluster, name, sites, root)
                    live.update(_view(summary, now - started, duration_s), refresh=True)
                    stop.wait(REFRESH_S)
        except KeyboardInterrupt:
            say("stopping (Ctrl-C)")
        finally:
            if not console.is_terminal:  # a terminal's Live ends its last line; a file's not
                console.line()
            _wind_down(cluster, name, stop, writer, say)
    return summary


def _serve(edges: list[Edge], root: str, rate: float, seed: int, ledger: RawLogLedger,
           summary: DemoSummary, stop: threading.Event) -> None:
    """wrk at every edge until ``stop``; each second, the lines nginx logged into
    ``ledger`` (the root's not: they never cross the wide area) and ``summary``."""
    ledger.clock()
    loads = [edge.load(seconds=24 * 3600, connections=2, delay_ms=2000 / rate, seed=seed + i)
             for i, edge in enumerate(edges)]
    read = dict.fromkeys((edge.pop for edge in edges), 0)
    try:
        while not stop.wait(REFRESH_S):
            for edge in edges:
                with edge.access_log.open("rb") as fh:
                    fh.seek(read[edge.pop])
                    lines = fh.read().splitlines(keepends=True)
                if lines and not lines[-1].endswith(b"\n"):
                    lines.pop()  # half written: the next round takes it
                read[edge.pop] += sum(map(len, lines))
                summary.records += len(lines)
                if edge.pop != root:
                    ledger.add([int(json.loads(line)["ts"]) for line in lines],
                               [len(line) for line in lines])
    finally:
        for load in loads:
            load.terminate()
            load.wait()


def _wind_down(cluster: LocalCluster, name: str, stop: threading.Event,
               writer: threading.Thread, say: Callable[[str], None]) -> None:
    """Stop in the order that lets every stream end cleanly: no more logs, then the query
    cancelled (each site stops its stream while its Spark still runs), then the processes
    (:meth:`LocalCluster.stop`, on leaving the cluster: SIGTERM, and each site lets a stop
    under way finish before its Spark stops)."""
    stop.set()
    writer.join(timeout=10)
    say(f"stopping: cancelling {name}, then the sites and the controller")
    with contextlib.suppress(ControlPlaneError):
        cluster.client.cancel(name)


def _collect(cluster: LocalCluster, name: str, summary: DemoSummary,
             ledger: RawLogLedger) -> None:
    with contextlib.suppress(ControlPlaneError):
        for result in cluster.client.results(name):
            window = (result.window_start, result.window_end)
            start = ledger.feed_start_ms
            if start is None or not is_complete(result, start):
                summary.not_shown[window] = result
                continue
            if window not in summary.raw_by_window:
                summary.raw_by_window[window] = ledger.bytes_between(*window)
            summary.not_shown.pop(window, None)
            summary.windows[window] = result  # a correction replaces
            if summary.first_complete_at is None:
                summary.first_complete_at = time.monotonic()


def _levels(cluster: LocalCluster, name: str, sites: list[str], root: str) -> dict[str, str]:
    levels = {}
    for site in sites:
        if site == root:
            continue
        with contextlib.suppress(ControlPlaneError):
            now = cluster.client.set_level(name, site)
            levels[now.link] = now.level + (" (pinned)" if now.pinned else "")
    return levels


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S")


def _view(summary: DemoSummary, elapsed: float, duration_s: float | None) -> Group:
    shown = [summary.windows[w] for w in sorted(summary.windows)[-MAX_WINDOWS:]]
    parts: list[RenderableType] = [render_window(r) for r in shown]
    if summary.first_complete_at is None:
        parts.append(Text(_waiting(summary, elapsed), style="dim"))
    else:
        since = time.monotonic() - summary.first_complete_at
        until = ("until Ctrl-C" if duration_s is None
                 else f"for {max(duration_s - since, 0):.0f}s more")
        parts.append(Text(f"{len(summary.windows)} complete windows so far; showing them "
                          f"{until}", style="dim"))
        parts.append(Text(summary.savings(), style="bold green"))
    links = ", ".join(f"{link}: {level}" for link, level in sorted(summary.levels.items()))
    if links:
        parts.append(Text(f"links: {links}"))
    parts.append(Text("Ctrl-C stops the demo", style="dim"))
    return Group(*parts)


def _waiting(summary: DemoSummary, elapsed: float) -> str:
    """What the demo waits for before its first complete window, and what it has seen."""
    line = (f"{elapsed:.0f}s since submitting: waiting for the first complete window "
            "(every site reporting, wholly after the log feed began"
            + (f" at {_time(summary.feed_start_ms)} UTC" if summary.feed_start_ms else "")
            + "); each site's Spark stage runs its first micro-batches slowly")
    seen = [summary.not_shown[w] for w in sorted(summary.not_shown)]
    if seen:
        start = summary.feed_start_ms or 0
        line += "\nnot shown: " + "; ".join(
            f"[{_time(r.window_start)}, {_time(r.window_end)}) from "
            f"{r.sites_reporting}/{r.sites_expected} sites"
            + (" (opens before the feed began)" if r.window_start < start else "")
            for r in seen[-3:])
    return line
