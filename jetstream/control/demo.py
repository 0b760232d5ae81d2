"""``jetstream demo``: the CDN top-k over live generated logs at every site, shown as it runs.

It starts a :class:`~jetstream.control.launch.LocalCluster` (a controller and one process per
site, each with its own Spark JVM), writes live logs into each site's input folder
(:func:`jetstream.loggen.write_live`), submits the query, and shows the newest windows with
their bounds, the wide-area bytes against the raw bytes they replace, and the degradation
level of every link. Ctrl-C (or the end of ``duration_s``) stops everything.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from jetstream.aggtree.loader import load_topology
from jetstream.control.launch import LocalCluster
from jetstream.control.results_view import MAX_WINDOWS, render_window
from jetstream.errors import ControlPlaneError
from jetstream.loggen import LogSpec, write_live
from jetstream.results import WindowResult

__all__ = ["DemoSummary", "live_demo"]

#: How often the view (and the link levels in it) refreshes.
REFRESH_S = 1.0


@dataclass
class DemoSummary:
    """What a demo run did, for the closing lines and for tests."""

    windows: dict[tuple[int, int], WindowResult] = field(default_factory=dict)
    records: int = 0
    raw_bytes: int = 0  # raw logs written at the sites other than the root
    levels: dict[str, str] = field(default_factory=dict)  # link -> level

    @property
    def wan_bytes(self) -> int:
        return sum(r.wan_bytes or 0 for r in self.windows.values())

    def savings(self) -> str:
        wan = self.wan_bytes
        ratio = f" ({self.raw_bytes / wan:,.0f}x less)" if wan else ""
        return (f"wide area: {wan:,} B of partials for {self.raw_bytes:,} B of raw logs at the "
                f"edge sites{ratio}; {self.records:,} records generated")


def live_demo(topology: Path, query_file: Path, work: Path, *, rate: float,
              duration_s: float | None, spec: LogSpec, seed: int,
              say: Callable[[str], None], console: Console,
              cluster_options: dict[str, Any] | None = None) -> DemoSummary:
    """Run the demo until ``duration_s`` passes (None: until Ctrl-C); what it saw.
    ``cluster_options`` go to the :class:`LocalCluster` (the emulator's namespaces)."""
    layout = load_topology(topology)
    sites, root = [s.name for s in layout.sites if s.sources], layout.root
    inputs = work / "input"
    for site in sites:
        (inputs / site).mkdir(parents=True, exist_ok=True)
    summary = DemoSummary()
    stop = threading.Event()
    with LocalCluster(topology, inputs, idle_timeout_s=30, logs=work / "logs", say=say,
                      **(cluster_options or {})) as cluster:
        def count(chunk: int, records: int) -> None:
            summary.records += records

        def generate() -> None:
            write_live(inputs, sites, rate=rate, spec=spec, seed=seed, stop=stop,
                       on_chunk=count)

        writer = threading.Thread(target=generate, name="loggen", daemon=True)
        writer.start()
        name = cluster.client.submit(query_file).query
        say(f"submitted {name}; writing {rate:g} records/s at each of {', '.join(sites)} "
            f"(files in {inputs}); the first window shows once it closes")
        results = threading.Thread(target=_collect, args=(cluster, name, summary, stop),
                                   name="results", daemon=True)
        results.start()
        started = time.monotonic()
        try:
            with Live(console=console, auto_refresh=False) as live:
                while not stop.is_set():
                    elapsed = time.monotonic() - started
                    if duration_s is not None and elapsed >= duration_s:
                        break
                    cluster.check_alive()
                    summary.levels = _levels(cluster, name, sites, root)
                    summary.raw_bytes = _raw_bytes(inputs, sites, root)
                    live.update(_view(summary, elapsed), refresh=True)
                    stop.wait(REFRESH_S)
        except KeyboardInterrupt:
            say("stopping (Ctrl-C)")
        finally:
            stop.set()
            writer.join(timeout=10)
            summary.raw_bytes = _raw_bytes(inputs, sites, root)
    return summary


def _collect(cluster: LocalCluster, name: str, summary: DemoSummary,
             stop: threading.Event) -> None:
    with contextlib.suppress(ControlPlaneError):
        for result in cluster.client.results(name):
            summary.windows[(result.window_start, result.window_end)] = result
            if stop.is_set():
                return


def _levels(cluster: LocalCluster, name: str, sites: list[str], root: str) -> dict[str, str]:
    levels = {}
    for site in sites:
        if site == root:
            continue
        with contextlib.suppress(ControlPlaneError):
            now = cluster.client.set_level(name, site)
            levels[now.link] = now.level + (" (pinned)" if now.pinned else "")
    return levels


def _raw_bytes(inputs: Path, sites: list[str], root: str) -> int:
    return sum(f.stat().st_size for site in sites if site != root
               for f in (inputs / site).glob("*.csv"))


def _view(summary: DemoSummary, elapsed: float) -> Group:
    shown = [summary.windows[w] for w in sorted(summary.windows)[-MAX_WINDOWS:]]
    parts: list[RenderableType] = [render_window(r) for r in shown] or [
        Text(f"waiting for the first window to close ({elapsed:.0f}s)", style="dim")]
    links = ", ".join(f"{link}: {level}" for link, level in sorted(summary.levels.items()))
    parts.append(Text(summary.savings(), style="bold green"))
    if links:
        parts.append(Text(f"links: {links}"))
    parts.append(Text("Ctrl-C stops the demo", style="dim"))
    return Group(*parts)
