"""A soak run: the CDN top-k over live logs at a steady rate for a while, sampled as it goes.

It shows what a long run would show sooner: whether memory stays flat (resident memory of
every site process and of its Spark JVM), whether a backlog grows (partials a site holds
unacknowledged in its cube store; the lag of the newest result behind the clock), and
whether results keep coming. ``scripts/soak.py`` runs it and prints a table;
``tests/test_soak.py`` runs a short one and checks it.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jetstream.aggtree.loader import load_topology
from jetstream.control.launch import LocalCluster
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError
from jetstream.lab.loggen import LogSpec, write_live
from jetstream.results import WindowResult

__all__ = ["Sample", "jvm_pids", "process_memory", "soak"]


@dataclass(frozen=True)
class Sample:
    """The state of a soaking cluster at ``t_s`` seconds after the query was submitted."""

    t_s: float
    rss_mb: dict[str, float]  # "ams" (the site process), "ams jvm" (its Spark JVM), ...
    held: dict[str, int]  # site -> partials kept unacknowledged for its parent
    results: int  # window results seen so far, corrections included
    lag_s: float | None  # wall clock minus the end of the newest window seen

    @property
    def python_mb(self) -> float:
        return sum(mb for name, mb in self.rss_mb.items() if not name.endswith(" jvm"))

    @property
    def jvm_mb(self) -> float:
        return sum(mb for name, mb in self.rss_mb.items() if name.endswith(" jvm"))


def soak(topology: Path, query: Query, work: Path, *, duration_s: float, rate: float,
         sample_s: float = 10.0, seed: int = 0,
         say: Callable[[str], None] = lambda line: None) -> list[Sample]:
    """Run ``query`` over live logs at ``rate`` records/s per source site for
    ``duration_s``; a sample every ``sample_s``."""
    layout = load_topology(topology)
    sites = [s.name for s in layout.sites]
    sources = [s.name for s in layout.sites if s.sources]
    inputs = work / "input"
    stop = threading.Event()
    seen: list[WindowResult] = []
    samples: list[Sample] = []
    with LocalCluster(topology, inputs, idle_timeout_s=30, logs=work / "logs",
                      say=say) as cluster:
        writer = threading.Thread(target=write_live, args=(inputs, sources), daemon=True,
                                  kwargs={"rate": rate, "spec": LogSpec(), "seed": seed,
                                          "stop": stop}, name="loggen")
        writer.start()
        name = cluster.client.submit(query).query

        def follow() -> None:
            with contextlib.suppress(ControlPlaneError):  # ends when the cluster stops
                for result in cluster.client.results(name):
                    seen.append(result)

        threading.Thread(target=follow, name="results", daemon=True).start()
        started = time.monotonic()
        try:
            while time.monotonic() - started < duration_s:
                stop.wait(sample_s)
                cluster.check_alive()
                newest = max((r.window_end for r in list(seen)), default=None)
                sample = Sample(
                    round(time.monotonic() - started, 1), process_memory(cluster, sites),
                    {site: _held(work / "logs" / "state" / site / "cubes.sqlite")
                     for site in sites}, len(seen),
                    None if newest is None else time.time() - newest / 1000)
                samples.append(sample)
                say(f"{sample.t_s:5.0f}s  python {sample.python_mb:6.0f} MB  jvm "
                    f"{sample.jvm_mb:6.0f} MB  held {sum(sample.held.values()):3d}  "
                    f"results {sample.results:4d}  lag "
                    f"{'-' if sample.lag_s is None else f'{sample.lag_s:.1f}s'}")
        finally:
            stop.set()
            writer.join(timeout=10)
    return samples


def process_memory(cluster: LocalCluster, sites: list[str]) -> dict[str, float]:
    """Resident MB of each site process and of its JVM (the java process it started)."""
    children = _children()
    memory = {}
    for site in sites:
        memory[site] = _rss_mb(cluster.processes[site].pid)
        memory[f"{site} jvm"] = sum(_rss_mb(c) for c in jvm_pids(cluster, site, children))
    return memory


def jvm_pids(cluster: LocalCluster, site: str,
             children: dict[int, list[int]] | None = None) -> list[int]:
    """The java processes a site's process started (its Spark JVM)."""
    if children is None:
        children = _children()
    below, family = [cluster.processes[site].pid], []
    while below:  # spark-submit's scripts may stand between the site and its JVM
        family += (grandchildren := [c for p in below for c in children.get(p, [])])
        below = grandchildren
    return [c for c in family if _command(c) == "java"]


def _children() -> dict[int, list[int]]:
    """Each process's children, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return children


def _rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip()
    return ""


def _held(path: Path) -> int:
    """Partials the cube store at ``path`` holds for a parent that has not acked them."""
    if not path.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True,
                                                timeout=5)) as db:
            return int(db.execute("SELECT COUNT(*) FROM partials WHERE held = 1").fetchone()[0])
    except sqlite3.Error:
        return 0
