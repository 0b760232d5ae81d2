"""``jetstream bench --emulate``: result latency over shaped links when they drop tenfold.

Needs root: the sites run in the namespaces of :class:`~jetstream.lab.emulate.WideArea`,
every edge site's link to its parent shaped to ``link``. Two systems, one after the other so
that neither's traffic queues behind the other's on the same link, each on the same live
input (:func:`jetstream.lab.loggen.write_live` with the same seed) and the same links:

1. JetStream-py: a :class:`~jetstream.control.launch.LocalCluster` of the topology.
2. The backhaul: a shipper per site (gzip each new log file, send it over TCP, see
   :mod:`jetstream.lab.baseline`) to a receiver at the host end of the links, where one plain
   Spark Structured Streaming job computes the query, with the Spark settings and the
   micro-batch interval a site's local stage runs with.

Each system runs ``phase_s`` seconds on the shaped links, then every edge link drops to a
tenth for another ``phase_s``. Both latencies of a window are measured from outside, the
same way for both systems, at the bench:

- **after close**: when its result (for JetStream, the first with every site in it) reached
  the bench, minus the moment the window could close — when the last site received the record
  that moves its watermark (largest event time read, less the query's watermark delay) past
  the window's end. A site "receives" a record when the live log file holding it lands in its
  folder (the bench notes the time just after each file's atomic rename); see
  :func:`window_closes`.
- **after window end**: the same arrival minus the window's end (the live logs' event times
  are wall-clock times).

For JetStream the results' own ``latency_s`` (the system's figure for latency after close)
is kept beside them. A window still missing when the phase ends counts with the time it had
waited so far: a lower bound.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jetstream.aggtree.loader import load_topology
from jetstream.aggtree.topology import Topology
from jetstream.control.launch import LocalCluster
from jetstream.dataplane.options import SiteOptions
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError, PlanError
from jetstream.lab.bench import top_k_accuracy
from jetstream.lab.emulate import HOST_ADDRESS, WideArea
from jetstream.lab.loggen import LogSpec, write_live
from jetstream.local import run_local
from jetstream.stage.spark import DEFAULT_SPARK_CONF
from jetstream.units import format_bandwidth, parse_bandwidth

__all__ = ["Landing", "Landings", "LatencyPhase", "WindowLatency", "percentile", "run_latency",
           "seconds_text", "window_closes"]

#: Windows ending this soon after the logs start are not counted: Spark is still warming up.
WARMUP_S = 20.0
#: The sites' ``--warm-up`` here: three JVMs starting on two cores take 9-16 s for their first
#: batch, where a site's default (15 s) allows them a few; in 90 s each runs 110-130.
SITE_WARM_UP_S = 90.0
#: A site's live log files land this often. Not a multiple of the stages' trigger (0.25 s,
#: which Spark times from the epoch, so every site's batches start on the same grid): a file
#: a second would land at one point of that grid for a whole run, wherever the run happened
#: to start, and wait for the next batch the same 0.01-0.16 s in every window of it (runs
#: seven to nine). A slightly longer period lands files at every point of it, as shippers
#: that do not keep time with Spark would.
LIVE_CHUNK_S = 1.03
#: Windows ending this close to the end of the logs are not counted: nothing closes them.
CLOSING_S = 10.0
#: How long a phase waits, after the logs stop, for the windows still on their way.
GRACE_S = 30.0
#: The backhaul's Spark job is written for examples/cdn_topk.py, whose windows wait this long.
BACKHAUL_WATERMARK_MS = 5_000
#: The percentiles reported of each latency (nearest rank).
PERCENTILES = (50, 95, 99)
#: Each latency a window has: report name -> WindowLatency attribute.
MEASURES = (("after_close", "after_close_s"), ("after_end", "after_end_s"),
             ("reported", "reported_s"))

Window = tuple[int, int]
Say = Callable[[str], None]


@dataclass(frozen=True)
class Landing:
    """A live log file as it landed in a site's folder."""

    site: str
    at: float  # wall-clock seconds, just after the file's atomic rename
    max_event_ms: int  # the largest event time in it

    @classmethod
    def of_file(cls, path: Path) -> Landing:
        """A file in ``<site>/``, read back after a run: it landed when it was last written."""
        return cls(path.parent.name, path.stat().st_mtime, _max_event_ms(path))


def window_closes(landings: Iterable[Landing], sites: Sequence[str], ends_ms: Iterable[int],
                  watermark_ms: int) -> dict[int, float]:
    """When each window could close: the latest, over ``sites``, of the moment the site
    received the record that moved its watermark past the window's end.

    A site's watermark is the largest event time it has read less ``watermark_ms``, and a
    window ending at ``end`` is closed once ``end <= watermark`` (the local stage's rule), so
    it closes at a site when the first file holding a record stamped at or after
    ``end + watermark_ms`` lands there.

    Parameters
    ----------
    landings
        The files that landed at any of ``sites``, in any order (others are ignored).
    sites
        The sites whose records every window needs.
    ends_ms
        The windows' ends, epoch milliseconds.
    watermark_ms
        The query's watermark delay.

    Returns
    -------
    dict
        Window end -> wall-clock seconds of its close; a window that some site has not closed
        yet is left out.
    """
    by_site: dict[str, list[Landing]] = {site: [] for site in sites}
    for landing in landings:
        if landing.site in by_site:
            by_site[landing.site].append(landing)
    reach: list[tuple[list[int], list[float]]] = []
    for found in by_site.values():
        found.sort(key=lambda f: f.at)
        # The largest event time read so far never falls, so bisect finds the closing file.
        highest: list[int] = []
        for f in found:
            highest.append(max(f.max_event_ms, highest[-1]) if highest else f.max_event_ms)
        reach.append((highest, [f.at for f in found]))
    closes: dict[int, float] = {}
    for end in ends_ms:
        moments = []
        for highest, times in reach:
            i = bisect.bisect_left(highest, end + watermark_ms)
            if i == len(highest):
                break
            moments.append(times[i])
        else:
            if moments:
                closes[end] = max(moments)
    return closes


@dataclass(frozen=True)
class WindowLatency:
    end_s: float  # the window's end, in seconds since the phase's logs started
    close_s: float | None  # when it could close, likewise (None: some site never closed it)
    after_end_s: float  # result arrival minus window end (a lower bound when not given)
    after_close_s: float | None  # result arrival minus close (likewise; None with close_s)
    given: bool  # False: the result had not arrived when the phase ended
    recall: float | None  # of the true top-10 (None: not given)
    reported_s: float | None = None  # the result's own latency_s (JetStream's; None: none)
    exact: bool | None = None  # the result says it is exact (None: not given, or not said)
    error_bound: float | None = None  # the error the result states (None: none stated)

    @property
    def moment_s(self) -> float:
        """When the window was ready to go: its close, or its end when it never closed."""
        return self.end_s if self.close_s is None else self.close_s


def seconds_text(value: float | None) -> str:
    """A latency as printed: hundredths (the goal is under a second); "-" for none."""
    return "-" if value is None else f"{value:.2f}s"


def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile of ``values``; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class LatencyPhase:
    """One system's windows over a run on the shaped links, split where the links dropped."""

    system: str
    drop_at_s: float
    wan_bytes: int = 0
    windows: list[WindowLatency] = field(default_factory=list)
    recover_at_s: float | None = None  # when the links came back (None: they did not)

    def parts(self) -> dict[str, list[WindowLatency]]:
        """Every counted window, those that closed before the links dropped, those while they
        were down, and (if they came back) those after."""
        back = math.inf if self.recover_at_s is None else self.recover_at_s
        parts = {"all": self.windows,
                 "before_drop": [w for w in self.windows if w.moment_s < self.drop_at_s],
                 "after_drop": [w for w in self.windows
                                if self.drop_at_s <= w.moment_s < back]}
        if self.recover_at_s is not None:
            parts["after_recovery"] = [w for w in self.windows if w.moment_s >= back]
        return parts

    def summary(self) -> dict[str, Any]:
        """Per latency (after close, after window end, and the results' own when they carry
        one) and per part: how many windows, and the percentiles in seconds."""
        figures: dict[str, Any] = {}
        for measure, attribute in MEASURES:
            if all(getattr(w, attribute) is None for w in self.windows):
                continue  # the backhaul's results carry no latency of their own
            figures[measure] = {}
            for part, windows in self.parts().items():
                values = [v for w in windows if (v := getattr(w, attribute)) is not None]
                figures[measure][part] = {"windows": len(values), **{
                    f"p{q}_s": percentile(values, q) for q in PERCENTILES}}
        recalls = [w.recall for w in self.windows if w.recall is not None]
        return {
            **figures,
            **{f"windows_{part}": len(windows) for part, windows in self.parts().items()},
            "windows_not_given": sum(not w.given for w in self.windows),
            "windows_not_closed": sum(w.close_s is None for w in self.windows),
            # None where the system's results do not say (the backhaul's).
            "windows_inexact": (sum(w.exact is False for w in self.windows)
                                if any(w.exact is not None for w in self.windows) else None),
            "min_recall": min(recalls, default=None), "wan_bytes": self.wan_bytes,
            **{f"max_error_bound_{part}": max(
                (w.error_bound for w in windows if w.error_bound is not None), default=None)
               for part, windows in self.parts().items()},
        }


@dataclass(frozen=True)
class _Arrival:
    at: float  # wall-clock seconds at the bench
    rows: list[dict[str, Any]]
    reported_s: float | None
    exact: bool | None
    error_bound: float | None = None


class _Arrivals:
    """When each window's result first arrived, and what it held."""

    def __init__(self) -> None:
        self.seen: dict[Window, _Arrival] = {}
        self.lock = threading.Lock()

    def __call__(self, window: Window, rows: list[dict[str, Any]],
                 reported_s: float | None = None, exact: bool | None = None,
                 error_bound: float | None = None) -> None:
        at = time.time()
        with self.lock:
            self.seen.setdefault(window, _Arrival(at, rows, reported_s, exact, error_bound))


class Landings:
    """The live log files as they land (``write_live``'s ``on_file``): when, and which."""

    def __init__(self) -> None:
        self.noted: list[tuple[float, Path]] = []
        self.lock = threading.Lock()

    def __call__(self, path: Path, records: int) -> None:
        at = time.time()  # write_live calls back just after the rename: the file landed now
        if records:
            with self.lock:
                self.noted.append((at, path))

    def read(self) -> list[Landing]:
        """Each noted file with its largest event time, read back after the phase (reading
        while the logs are written would hold the writer up, and late the next site's file)."""
        with self.lock:
            noted = list(self.noted)
        return [Landing(path.parent.name, at, _max_event_ms(path)) for at, path in noted]


def _max_event_ms(path: Path) -> int:
    with path.open() as lines:
        column = next(lines).rstrip("\n").split(",").index("ts")
        # Generated cells are never quoted (loggen checks names), so a comma splits cells.
        return max(int(line.split(",", column + 1)[column]) for line in lines)


#: The systems the latency bench runs, in order, and their names on the plot.
SYSTEMS = {"jetstream": "JetStream-py",
           "fixed": "JetStream-py without profiles (nominal ladder)",
           "backhaul": "backhaul (gzip) + Spark job"}
#: What a run measures unless told: JetStream-py as it ships, and the backhaul.
DEFAULT_SYSTEMS = ("jetstream", "backhaul")


def run_latency(topology: Path, query: Query, work: Path, *, phase_s: float,
                rate: float, link: str, seed: int, say: Say,
                systems: Sequence[str] = DEFAULT_SYSTEMS,
                recover: bool = False) -> dict[str, Any]:
    """Each of ``systems`` (see the module docstring and :data:`SYSTEMS`), ``phase_s`` on
    ``link`` then ``phase_s`` on a tenth of it (and, with ``recover``, ``phase_s`` on
    ``link`` again); the report's ``latency`` part. Plots ``work/latency.png``."""
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        msg = (f"latency bench: no system named {', '.join(unknown) or 'at all'}; "
               f"choose from {', '.join(SYSTEMS)}")
        raise PlanError(msg)
    layout = load_topology(topology)
    area = WideArea(layout)
    edges = [s for s in area.sites.values() if s.parent]
    shaped, dropped = link, format_bandwidth(parse_bandwidth(link, "--link") / 10)
    duration_s = (3 if recover else 2) * phase_s

    def shape(bandwidth: str) -> None:
        for site in edges:
            area.set_link(site.name, site.parent or "", bandwidth)

    window = query.stream.window_op
    if window is None or window.watermark_ms != BACKHAUL_WATERMARK_MS:
        msg = (f"latency bench: the backhaul's Spark job waits {BACKHAUL_WATERMARK_MS} ms for "
               f"late records; query {query.name} must have the same watermark "
               "(the bench runs examples/cdn_topk.py)")
        raise PlanError(msg)
    master, spark_conf = _backhaul_spark(layout)
    phases = []
    say(f"latency: namespaces per site, edge links at {shaped} for {phase_s:g}s, then "
        f"{dropped} for {phase_s:g}s{f', then {shaped} again' if recover else ''}, per system")
    area.up()
    try:
        backhaul = functools.partial(_backhaul, spark=(master, spark_conf))
        runs: dict[str, Callable[..., float]] = {
            "jetstream": _jetstream, "backhaul": backhaul,
            "fixed": functools.partial(_jetstream, site_flags=("--no-profile",))}
        for system, run_phase in ((s, runs[s]) for s in SYSTEMS if s in systems):
            shape(shaped)
            folder = work / f"latency-{system}"
            phase = LatencyPhase(system, drop_at_s=phase_s,
                                 recover_at_s=2 * phase_s if recover else None)
            arrivals, landings = _Arrivals(), Landings()
            say(f"latency, {system}: starting")
            started = run_phase(area, topology, query, folder, arrivals, landings, phase,
                                lambda: _timeline(phase_s, shape, dropped, say,
                                                  shaped if recover else None),
                                rate=rate, seed=seed, say=say)
            truth = {(r.window_start, r.window_end): r.rows
                     for r in run_local(query, folder / "input")}
            closes = window_closes(landings.read(), list(area.sites),
                                   (end for _, end in truth), window.watermark_ms)
            phase.windows = _latencies(arrivals, truth, closes, started, duration_s)
            phases.append(phase)
            after_close = phase.summary()["after_close"]["all"]
            say(f"latency after close, {system}: p50 {after_close['p50_s'] or math.nan:.2f}s, "
                f"p95 {after_close['p95_s'] or math.nan:.2f}s over {after_close['windows']} "
                "windows")
    finally:
        area.down()
    _plot(phases, shaped, dropped, work / "latency.png")
    return {"link": shaped, "dropped_to": dropped, "phase_s": phase_s, "drop_at_s": phase_s,
            "recover_at_s": 2 * phase_s if recover else None, "duration_s": duration_s,
            "records_per_s_per_site": rate,
            "watermark_s": window.watermark_ms / 1000,
            "backhaul_spark": {"master": master, "conf": spark_conf,
                               "trigger_s": SiteOptions.trigger_s},
            **{p.system: {**p.summary(), "per_window": [asdict(w) for w in p.windows]}
               for p in phases}}


def _backhaul_spark(layout: Topology) -> tuple[str, dict[str, str]]:
    """The Spark master and settings of the backhaul's job: those the root site's local stage
    runs with (it runs in the root's datacenter), so that neither side is tuned apart."""
    root = layout.site(layout.root)
    return root.master, {**DEFAULT_SPARK_CONF, **dict(root.spark_conf)}


def _timeline(phase_s: float, shape: Callable[[str], None], dropped: str, say: Say,
              back: str | None = None) -> None:
    """Sleep through a run, dropping the links on time (and bringing them ``back``)."""
    time.sleep(phase_s)
    shape(dropped)
    say(f"  links dropped to {dropped}")
    time.sleep(phase_s)
    if back is not None:
        shape(back)
        say(f"  links back at {back}")
        time.sleep(phase_s)


@contextlib.contextmanager
def _live_logs(inputs: Path, sites: list[str], rate: float, seed: int,
               landings: Landings) -> Iterator[float]:
    """Write live logs while the block runs; yields the wall-clock time they started."""
    stop = threading.Event()
    writer = threading.Thread(target=write_live, args=(inputs, sites), daemon=True,
                              kwargs={"rate": rate, "spec": LogSpec(), "seed": seed,
                                      "chunk_s": LIVE_CHUNK_S,
                                      "stop": stop, "on_file": landings})
    started = time.time()
    writer.start()
    try:
        yield started
    finally:
        stop.set()
        writer.join(timeout=10)


def _jetstream(area: WideArea, topology: Path, query: Query, folder: Path,
               arrivals: _Arrivals, landings: Landings, phase: LatencyPhase,
               timeline: Callable[[], None], *, rate: float, seed: int, say: Say,
               site_flags: Sequence[str] = ()) -> float:
    sites = list(area.sites)
    for site in sites:  # a site without its folder at deploy time reads nothing
        (folder / "input" / site).mkdir(parents=True, exist_ok=True)
    # The backhaul's job runs in this process's JVM, warm from the replay part: the sites'
    # stages warm up for as long as they get faster, and the logs begin once all of them read.
    with LocalCluster(topology, folder / "input", idle_timeout_s=30, logs=folder / "logs",
                      say=say, host=HOST_ADDRESS,
                      site_host=lambda s: area.sites[s].address,
                      site_prefix=area.prefix,
                      site_args=lambda s: ["--warm-up", f"{SITE_WARM_UP_S:g}",
                                           *site_flags]) as cluster:
        name = cluster.client.submit(query).query
        waited = cluster.wait_for_stages(name)
        say(f"  the sites' local stages read their logs {waited:.0f}s after submitting")
        latest: dict[Window, int] = {}

        def collect() -> None:
            with contextlib.suppress(ControlPlaneError):
                for result in cluster.client.results(name):
                    window = (result.window_start, result.window_end)
                    latest[window] = result.wan_bytes or 0
                    if result.sites_reporting == result.sites_expected:
                        arrivals(window, result.rows, result.latency_s, result.exact,
                                 result.error_bound)

        threading.Thread(target=collect, daemon=True).start()
        with _live_logs(folder / "input", sites, rate, seed, landings) as started:
            timeline()
        _wait_for(arrivals, started, time.time())
        phase.wan_bytes = sum(latest.values())
    return started


def _backhaul(area: WideArea, topology: Path, query: Query, folder: Path,
              arrivals: _Arrivals, landings: Landings, phase: LatencyPhase,
              timeline: Callable[[], None], *, rate: float, seed: int,
              spark: tuple[str, dict[str, str]], say: Say) -> float:
    from jetstream.lab.baseline import Receiver, live_top_domains
    from jetstream.stage.spark import session_builder
    from jetstream.stage.spark import started as launched

    master, conf = spark
    # spark.driver.memory only counts when this starts the JVM; after `bench` ran its own
    # Spark, the JVM has the heap of the root's settings already.
    session = launched(session_builder(master, "jetstream-bench-backhaul", conf),
                       "the bench's backhaul")
    session.sparkContext.setLogLevel("ERROR")
    receiver = Receiver((HOST_ADDRESS, 0), folder / "inbox")
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    # The sites' own micro-batch interval: a user after answers within a second of close
    # would not leave the plain job at a slower one than ours.
    job = live_top_domains(session, folder / "inbox", folder / "checkpoint", arrivals,
                           trigger_s=SiteOptions.trigger_s)
    to = f"{HOST_ADDRESS}:{receiver.server_address[1]}"
    shippers = []
    try:
        for site in area.sites:
            (folder / "input" / site).mkdir(parents=True, exist_ok=True)
            shippers.append(subprocess.Popen(
                [*area.prefix(site), sys.executable, "-m", "jetstream.lab.baseline", "ship",
                 "--folder", str(folder / "input" / site), "--site", site, "--to", to]))
        with _live_logs(folder / "input", list(area.sites), rate, seed, landings) as started:
            timeline()
        _wait_for(arrivals, started, time.time())
    finally:
        for shipper in shippers:
            shipper.terminate()
            shipper.wait(timeout=10)
        job.stop()
        session.stop()
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
        if done >= stopped - CLOSING_S:  # the last whole window
            return
        time.sleep(1)


def _latencies(arrivals: _Arrivals, truth: dict[Window, list[dict[str, Any]]],
               closes: dict[int, float], started: float, duration_s: float
               ) -> list[WindowLatency]:
    ended = time.time()
    out = []
    for window in sorted(truth):
        end = window[1] / 1000
        # The last windows close only when later records move the watermark: none come.
        if end - started < WARMUP_S or end > started + duration_s - CLOSING_S:
            continue
        close = closes.get(window[1])
        arrival = arrivals.seen.get(window)
        at = ended if arrival is None else arrival.at
        out.append(WindowLatency(
            end - started, None if close is None else close - started, at - end,
            None if close is None else at - close, arrival is not None,
            None if arrival is None else top_k_accuracy(truth[window], arrival.rows)[0],
            None if arrival is None else arrival.reported_s,
            None if arrival is None else arrival.exact,
            None if arrival is None else arrival.error_bound))
    return out


def _plot(phases: list[LatencyPhase], shaped: str, dropped: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for phase in phases:
        label = SYSTEMS[phase.system]
        given = [(w.moment_s, v, w.recall) for w in phase.windows
                 if w.given and (v := w.after_close_s) is not None]
        line = ax.plot([x for x, _, _ in given], [y for _, y, _ in given], marker="o",
                       markersize=3, label=f"{label}: after close")[0]
        reported = [(w.moment_s, v) for w in phase.windows if (v := w.reported_s) is not None]
        if reported:
            ax.plot(*zip(*reported, strict=True), marker="x", markersize=3, linestyle="none",
                    color=line.get_color(), alpha=0.5,
                    label=f"{label}: its results' own latency_s")
        for x, y, recall in given:
            if recall is not None and recall < 1:
                ax.annotate(f"recall {recall:.1f}", (x, y), textcoords="offset points",
                            xytext=(0, 8), ha="center", fontsize="x-small", color="red")
        missing = [(w.moment_s, v) for w in phase.windows
                   if not w.given and (v := w.after_close_s) is not None]
        if missing:
            ax.plot(*zip(*missing, strict=True), marker="^", linestyle="none",
                    color=line.get_color(), markerfacecolor="none",
                    label=f"{label}: not given yet (at least)")
    drop = phases[0].drop_at_s
    ax.axvline(drop, color="red", linestyle="--", label=f"links drop {shaped} -> {dropped}")
    back = phases[0].recover_at_s
    if back is not None:
        ax.axvline(back, color="green", linestyle="--", label=f"links back at {shaped}")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("when the window could close (s since the logs started)")
    ax.set_ylabel("result latency after the window could close (s)")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
