"""A chaos soak: live load on a tree of sites while its processes are killed and its links cut,
then every window checked against the reference executor.

The controller and every site of a topology (by default ``tree-7``: PoPs under regions under a
root with three workers) run as local processes, live logs arrive at every source site, and
every ``every_s`` (on average) one fault strikes, chosen at random: a SIGKILL of a site, of a
worker of a site, of the root or of the global controller (each started again after a few
seconds; a worker is started again by its site), or a cut of the link in front of a site (a
TCP proxy that everyone who dials the site goes through, healed after a few seconds). After
``duration_s`` the logs stop; once every window has settled (or ``grace_s`` has passed) each
window's newest result is compared with :func:`jetstream.local.run_local` over every log
written: equal, missing, short (records lost) or over (records counted twice). Memory is
sampled as :mod:`jetstream.lab.soak` does. ``scripts/chaos_soak.py`` runs it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jetstream.aggtree.loader import load_topology
from jetstream.control.launch import LocalCluster, free_port
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError
from jetstream.lab.loggen import LogSpec, write_live
from jetstream.lab.soak import process_memory
from jetstream.local import run_local
from jetstream.results import WindowResult

__all__ = ["FAULTS", "ChaosReport", "Fault", "Link", "chaos_soak"]

#: The kinds of fault, each chosen as often.
FAULTS = ("site", "worker", "root", "controller", "link")
Window = tuple[int, int]
Say = Callable[[str], None]


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds into the run
    kind: str  # one of FAULTS
    target: str  # the site, "site/server" for a worker, or "controller"
    down_s: float  # until it was started again (or healed); 0 for a worker: its site does


@dataclass
class ChaosReport:
    faults: list[Fault] = field(default_factory=list)
    windows: int = 0  # windows of the reference
    equal: int = 0  # whose newest result equals the reference's, covering every site
    missing: list[Window] = field(default_factory=list)  # no result at all
    short: list[Window] = field(default_factory=list)  # some count below the reference's
    over: list[Window] = field(default_factory=list)  # some count above: counted twice
    other: list[Window] = field(default_factory=list)  # different otherwise, or incomplete
    #: Given final and exact at some revision, yet unlike the reference: the worst bug.
    final_unlike: list[Window] = field(default_factory=list)
    memory_mb: list[tuple[float, float, float]] = field(default_factory=list)  # t, python, jvm

    @property
    def ok(self) -> bool:
        return self.equal == self.windows and not self.final_unlike


class Link:
    """A TCP forwarder to a site's port, the way to it for everyone who dials it. Cut, it
    drops every connection and refuses new ones, as a partition would; healed, it forwards
    again."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                if self._cut.is_set():
                    raise OSError("cut")
                far = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                far.settimeout(None)
            except OSError:
                near.close()
                continue
            with self._lock:
                self._open |= {near, far}
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for end in self._open:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
            self._open.clear()

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self.cut()
        self._listener.close()


def chaos_soak(topology: Path, query: Query, work: Path, *, duration_s: float, rate: float,
               every_s: float = 60.0, down_s: tuple[float, float] = (5.0, 20.0),
               grace_s: float = 300.0, seed: int = 0, say: Say = lambda line: None
               ) -> ChaosReport:
    """Run ``query`` over live logs at ``rate`` records/s per source site for ``duration_s``
    with a fault every ``every_s`` on average (each down for a time drawn from ``down_s``),
    then check every window (see the module docstring)."""
    chance = random.Random(seed)
    layout = load_topology(topology)
    sites = [s.name for s in layout.sites]
    sources = [s.name for s in layout.sites if s.sources]
    links = {site: Link(free_port()) for site in sites}  # the way to each site
    inputs = work / "input"
    report = ChaosReport()
    seen: list[WindowResult] = []
    stop, done = threading.Event(), threading.Event()

    def through_link(site: str) -> list[str]:
        link = links[site]
        return ["--port", str(link.target), "--advertise", f"127.0.0.1:{link.port}"]

    try:
        with LocalCluster(topology, inputs, idle_timeout_s=30, logs=work / "logs", say=say,
                          site_args=through_link) as cluster:
            name = cluster.client.submit(query).query
            threading.Thread(target=_follow, args=(cluster, name, seen, done), daemon=True,
                             name="results").start()
            # The generator's late records (0.1%, 30 s behind): a site judges each file
            # against the files before it, as the reference does, however late a restarted
            # stage reads them (docs/dsl.md, "Late records").
            spec = LogSpec()
            writer = threading.Thread(target=write_live, args=(inputs, sources), daemon=True,
                                      kwargs={"rate": rate, "spec": spec, "seed": seed,
                                              "stop": stop}, name="loggen")
            writer.start()
            started = time.monotonic()
            next_fault = started + chance.expovariate(1 / every_s)
            while (now := time.monotonic()) - started < duration_s:
                time.sleep(min(5.0, max(0.0, next_fault - now)))
                cluster.check_alive()
                report.memory_mb.append(_sample(cluster, sites, now - started))
                if time.monotonic() >= next_fault:
                    fault = _strike(cluster, links, layout.root, sites, chance, down_s,
                                    time.monotonic() - started)
                    if fault is not None:
                        report.faults.append(fault)
                        say(f"{fault.at_s:6.0f}s  {fault.kind} {fault.target} "
                            f"(down {fault.down_s:.0f}s)")
                    next_fault = time.monotonic() + chance.expovariate(1 / every_s)
            stop.set()
            writer.join(timeout=10)
            want = run_local(query, inputs)
            say(f"logs stopped after {duration_s:.0f}s; waiting for {len(want)} windows to "
                "settle")
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and not _settled(seen, want):
                time.sleep(2.0)
            cluster.check_alive()
    finally:
        stop.set()
        done.set()
        for link in links.values():
            link.close()
    _judge(report, seen, want)
    return report


def _strike(cluster: LocalCluster, links: dict[str, Link], root: str, sites: list[str],
            chance: random.Random, down_s: tuple[float, float], at_s: float) -> Fault | None:
    """One fault, chosen at random; it blocks while the target is down."""
    kind = chance.choice(FAULTS)
    down = chance.uniform(*down_s)
    if kind == "worker":
        workers = _workers(cluster)
        if not workers:
            return None
        target, pid = chance.choice(sorted(workers.items()))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return Fault(at_s, kind, target, 0.0)
    if kind == "link":
        target = chance.choice(sites)
        links[target].cut()
        time.sleep(down)
        links[target].heal()
        return Fault(at_s, kind, target, down)
    if kind in ("root", "controller"):
        target = root if kind == "root" else "controller"
    else:
        target = chance.choice([s for s in sites if s != root])
    cluster.kill(target)
    time.sleep(down)
    cluster.restart(target)
    return Fault(at_s, kind, target, down)


def _workers(cluster: LocalCluster) -> dict[str, int]:
    """Each running worker ("site/server") and its process id, as the controller knows."""
    with contextlib.suppress(ControlPlaneError):
        return {f"{site.name}/{p.server}": p.pid for site in cluster.client.status().sites
                for p in site.placements if p.pid and p.pid not in {
                    process.pid for process in cluster.processes.values()}}
    return {}


def _follow(cluster: LocalCluster, name: str, seen: list[WindowResult],
            done: threading.Event) -> None:
    """Every result, reconnecting while the controller is away, until ``done``."""
    while not done.is_set():
        with contextlib.suppress(ControlPlaneError):
            for result in cluster.client.results(name, timeout_s=600):
                seen.append(result)
        done.wait(1.0)


def _sample(cluster: LocalCluster, sites: list[str], t_s: float) -> tuple[float, float, float]:
    memory = process_memory(cluster, sites)
    python = sum(mb for n, mb in memory.items() if not n.endswith(" jvm"))
    jvm = sum(mb for n, mb in memory.items() if n.endswith(" jvm"))
    return round(t_s, 1), round(python), round(jvm)


def _newest(seen: list[WindowResult]) -> dict[Window, WindowResult]:
    newest: dict[Window, WindowResult] = {}
    for result in list(seen):
        window = (result.window_start, result.window_end)
        if window not in newest or result.revision >= newest[window].revision:
            newest[window] = result
    return newest


def _settled(seen: list[WindowResult], want: list[WindowResult]) -> bool:
    newest = _newest(seen)
    return all((got := newest.get((w.window_start, w.window_end))) is not None
               and not got.missing_sites and got.rows == w.rows for w in want)


def _judge(report: ChaosReport, seen: list[WindowResult], want: list[WindowResult]) -> None:
    newest = _newest(seen)
    report.windows = len(want)
    rows = {(w.window_start, w.window_end): w.rows for w in want}
    report.final_unlike = sorted({(r.window_start, r.window_end) for r in list(seen)
                                  if r.final and r.exact
                                  and r.rows != rows.get((r.window_start, r.window_end), [])})
    for w in want:
        window = (w.window_start, w.window_end)
        got = newest.get(window)
        if got is None:
            report.missing.append(window)
        elif got.rows == w.rows and not got.missing_sites:
            report.equal += 1
        else:  # by the first key's counts: the CDN query's requests per domain
            counts = {r.get("domain"): r.get("requests", 0) for r in got.rows}
            truth = {r.get("domain"): r.get("requests", 0) for r in w.rows}
            if any(counts.get(k, 0) > v for k, v in truth.items()):
                report.over.append(window)
            elif any(counts.get(k, 0) < v for k, v in truth.items()):
                report.short.append(window)
            else:
                report.other.append(window)


