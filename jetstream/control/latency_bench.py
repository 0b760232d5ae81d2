"""``jetstream bench --emulate``: result latency over shaped links when they drop tenfold.

Needs root: the sites run in the namespaces of :class:`~jetstream.control.emulate.WideArea`,
every edge site's link to its parent shaped to ``link``. Two phases, one after the other so
that neither system's traffic queues behind the other's on the same link, each on the same live
input (:func:`jetstream.loggen.write_live` with the same seed) and the same links:

1. JetStream-py: a :class:`~jetstream.control.launch.LocalCluster` of the topology.
2. The backhaul: a shipper per site (gzip each new log file, send it over TCP, see
   :mod:`jetstream.stage.baseline`) to a receiver at the host end of the links, where one plain
   Spark Structured Streaming job with a 1 s trigger computes the query.

``drop_at_s`` into each phase, every edge link drops to a tenth. A window's latency is the
wall-clock time its result (for JetStream: the first with every site in it) reached the bench,
minus the window's end (the live logs' event times are wall-clock times). A window still
missing when the phase ends counts with the time it had waited so far: a lower bound.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jetstream.aggtree.loader import load_topology
from jetstream.control.bench import top_k_accuracy
from jetstream.control.emulate import HOST_ADDRESS, WideArea
from jetstream.control.launch import LocalCluster
from jetstream.errors import ControlPlaneError
from jetstream.local import run_local
from jetstream.loggen import LogSpec, write_live
from jetstream.queryfile import load_query
from jetstream.units import format_bandwidth, parse_bandwidth

__all__ = ["LatencyPhase", "WindowLatency", "run_latency"]

#: Windows ending this soon after the logs start are not counted: Spark is still warming up.
WARMUP_S = 20.0
#: Windows ending this close to the end of the logs are not counted: nothing closes them.
CLOSING_S = 10.0
#: How long a phase waits, after the logs stop, for the windows still on their way.
GRACE_S = 30.0

Window = tuple[int, int]
Say = Callable[[str], None]


@dataclass(frozen=True)
class WindowLatency:
    end_s: float  # the window's end, in seconds since the phase's logs started
    latency_s: float  # result arrival minus window end (a lower bound when not given)
    given: bool  # False: the result had not arrived when the phase ended
    recall: float | None  # of the true top-10 (None: not given)


@dataclass
class LatencyPhase:
    system: str
    drop_at_s: float
    wan_bytes: int = 0
    windows: list[WindowLatency] = field(default_factory=list)

    def percentile(self, q: float) -> float | None:
        """The nearest-rank ``q``-th percentile of the windows' latencies."""
        values = sorted(w.latency_s for w in self.windows)
        if not values:
            return None
        return values[max(0, math.ceil(q / 100 * len(values)) - 1)]

    def summary(self) -> dict[str, Any]:
        before = LatencyPhase(self.system, self.drop_at_s,
                              windows=[w for w in self.windows if w.end_s < self.drop_at_s])
        after = LatencyPhase(self.system, self.drop_at_s,
                             windows=[w for w in self.windows if w.end_s >= self.drop_at_s])
        recalls = [w.recall for w in self.windows if w.recall is not None]
        return {
            "p50_s": self.percentile(50), "p95_s": self.percentile(95),
            "p50_before_drop_s": before.percentile(50), "p95_before_drop_s": before.percentile(95),
            "p50_after_drop_s": after.percentile(50), "p95_after_drop_s": after.percentile(95),
            "windows": len(self.windows),
            "windows_not_given": sum(not w.given for w in self.windows),
            "min_recall": min(recalls, default=None), "wan_bytes": self.wan_bytes,
        }


class _Arrivals:
    """When each window's result first arrived, and its rows."""

    def __init__(self) -> None:
        self.seen: dict[Window, tuple[float, list[dict[str, Any]]]] = {}
        self.lock = threading.Lock()

    def __call__(self, window: Window, rows: list[dict[str, Any]]) -> None:
        with self.lock:
            self.seen.setdefault(window, (time.time(), rows))


def run_latency(topology: Path, query_file: Path, work: Path, *, duration_s: float,
                rate: float, link: str, drop_at_s: float, seed: int,
                say: Say) -> dict[str, Any]:
    """Both phases (see the module docstring); the report's ``latency`` part. Plots
    ``work/latency.png``."""
    area = WideArea(load_topology(topology))
    edges = [s for s in area.sites.values() if s.parent]
    shaped, dropped = link, format_bandwidth(parse_bandwidth(link, "--link") / 10)

    def shape(bandwidth: str) -> None:
        for site in edges:
            area.set_link(site.name, site.parent or "", bandwidth)

    query = load_query(query_file)
    phases = []
    say(f"latency: namespaces per site, edge links at {shaped}, dropping to {dropped} "
        f"{drop_at_s:g}s into each {duration_s:g}s phase")
    area.up()
    try:
        for system, run_phase in (("jetstream", _jetstream), ("backhaul", _backhaul)):
            shape(shaped)
            folder = work / f"latency-{system}"
            phase = LatencyPhase(system, drop_at_s)
            arrivals = _Arrivals()
            say(f"latency, {system}: starting")
            started = run_phase(area, topology, query_file, folder, arrivals, phase,
                                lambda: _timeline(duration_s, drop_at_s, shape, dropped, say),
                                rate=rate, seed=seed, say=say)
            truth = {(r.window_start, r.window_end): r.rows
                     for r in run_local(query, folder / "input")}
            phase.windows = _latencies(arrivals, truth, started, duration_s)
            phases.append(phase)
            say(f"latency, {system}: p50 {phase.percentile(50)}s, p95 {phase.percentile(95)}s")
    finally:
        area.down()
    _plot(phases, shaped, dropped, work / "latency.png")
    return {"link": shaped, "dropped_to": dropped, "drop_at_s": drop_at_s,
            "duration_s": duration_s, "records_per_s_per_site": rate,
            **{p.system: {**p.summary(), "per_window": [asdict(w) for w in p.windows]}
               for p in phases}}


def _timeline(duration_s: float, drop_at_s: float, shape: Callable[[str], None], dropped: str,
              say: Say) -> None:
    """Sleep through a phase, dropping the links on time."""
    time.sleep(drop_at_s)
    shape(dropped)
    say(f"  links dropped to {dropped}")
    time.sleep(max(0.0, duration_s - drop_at_s))


@contextlib.contextmanager
def _live_logs(inputs: Path, sites: list[str], rate: float, seed: int) -> Iterator[float]:
    """Write live logs while the block runs; yields the wall-clock time they started."""
    stop = threading.Event()
    writer = threading.Thread(target=write_live, args=(inputs, sites), daemon=True,
                              kwargs={"rate": rate, "spec": LogSpec(), "seed": seed,
                                      "stop": stop})
    started = time.time()
    writer.start()
    try:
        yield started
    finally:
        stop.set()
        writer.join(timeout=10)


def _jetstream(area: WideArea, topology: Path, query_file: Path, folder: Path,
               arrivals: _Arrivals, phase: LatencyPhase, timeline: Callable[[], None], *,
               rate: float, seed: int, say: Say) -> float:
    sites = list(area.sites)
    for site in sites:  # a site without its folder at deploy time reads nothing
        (folder / "input" / site).mkdir(parents=True, exist_ok=True)
    with LocalCluster(topology, folder / "input", idle_timeout_s=30, logs=folder / "logs",
                      say=say, host=HOST_ADDRESS,
                      site_host=lambda s: area.sites[s].address,
                      site_prefix=area.prefix) as cluster:
        name = cluster.client.submit(query_file).query
        latest: dict[Window, int] = {}

        def collect() -> None:
            with contextlib.suppress(ControlPlaneError):
                for result in cluster.client.results(name):
                    window = (result.window_start, result.window_end)
                    latest[window] = result.wan_bytes or 0
                    if result.sites_reporting == result.sites_expected:
                        arrivals(window, result.rows)

        threading.Thread(target=collect, daemon=True).start()
        with _live_logs(folder / "input", sites, rate, seed) as started:
            timeline()
        _wait_for(arrivals, started, time.time())
        phase.wan_bytes = sum(latest.values())
    return started


def _backhaul(area: WideArea, topology: Path, query_file: Path, folder: Path,
              arrivals: _Arrivals, phase: LatencyPhase, timeline: Callable[[], None], *,
              rate: float, seed: int, say: Say) -> float:
    from pyspark.sql import SparkSession

    from jetstream.stage.baseline import Receiver, live_top_domains

    spark = (SparkSession.builder.master("local[2]").appName("jetstream-bench-backhaul")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    receiver = Receiver((HOST_ADDRESS, 0), folder / "inbox")
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    job = live_top_domains(spark, folder / "inbox", folder / "checkpoint", arrivals)
    to = f"{HOST_ADDRESS}:{receiver.server_address[1]}"
    shippers = []
    try:
        for site in area.sites:
            (folder / "input" / site).mkdir(parents=True, exist_ok=True)
            shippers.append(subprocess.Popen(
                [*area.prefix(site), sys.executable, "-m", "jetstream.stage.baseline", "ship",
                 "--folder", str(folder / "input" / site), "--site", site, "--to", to]))
        with _live_logs(folder / "input", list(area.sites), rate, seed) as started:
            timeline()
        _wait_for(arrivals, started, time.time())
    finally:
        for shipper in shippers:
            shipper.terminate()
            shipper.wait(timeout=10)
        job.stop()
        spark.stop()
        receiver.shutdown()
        receiver.server_close()
    phase.wan_bytes = sum(n for site, n in receiver.received.items()
                          if area.sites[site].parent is not None)
    return started


def _wait_for(arrivals: _Arrivals, started: float, stopped: float) -> None:
    """Until every counted window that closed before the logs stopped has a result, or
    ``GRACE_S`` passes."""
    deadline = time.time() + GRACE_S
    while time.time() < deadline:
        with arrivals.lock:
            done = max((w[1] for w in arrivals.seen), default=0) / 1000
        if done >= stopped - 10:  # the last whole window
            return
        time.sleep(1)


def _latencies(arrivals: _Arrivals, truth: dict[Window, list[dict[str, Any]]],
               started: float, duration_s: float) -> list[WindowLatency]:
    ended = time.time()
    out = []
    for window in sorted(truth):
        end = window[1] / 1000
        # The last windows close only when later records move the watermark: none come.
        if end - started < WARMUP_S or end > started + duration_s - CLOSING_S:
            continue
        arrival = arrivals.seen.get(window)
        if arrival is None:
            out.append(WindowLatency(end - started, ended - end, False, None))
        else:
            out.append(WindowLatency(end - started, arrival[0] - end, True,
                                     top_k_accuracy(truth[window], arrival[1])[0]))
    return out


def _plot(phases: list[LatencyPhase], shaped: str, dropped: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for phase, label in zip(phases, ("JetStream-py", "backhaul (gzip) + Spark job"),
                            strict=True):
        given = [w for w in phase.windows if w.given]
        line = ax.plot([w.end_s for w in given], [w.latency_s for w in given], marker="o",
                       label=label)[0]
        for w in given:
            if w.recall is not None and w.recall < 1:
                ax.annotate(f"recall {w.recall:.1f}", (w.end_s, w.latency_s),
                            textcoords="offset points", xytext=(0, 8), ha="center",
                            fontsize="x-small", color="red")
        missing = [w for w in phase.windows if not w.given]
        if missing:
            ax.plot([w.end_s for w in missing], [w.latency_s for w in missing], marker="^",
                    linestyle="none", color=line.get_color(), markerfacecolor="none",
                    label=f"{label}: not given yet (at least)")
    drop = phases[0].drop_at_s
    ax.axvline(drop, color="red", linestyle="--", label=f"links drop {shaped} -> {dropped}")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("window end (s since the logs started)")
    ax.set_ylabel("result latency after the window ends (s)")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
