"""``jetstream bench --load``: latency after close under load, ours against one plain Spark job.

For each rate (records/s at each site) and each number of standing queries, two systems run
one after the other, each alone on the machine, on the same live input (:func:`~jetstream.lab.
loggen.write_live`, the same seed, a file per site every ``chunk_s``, ``keys`` Zipf-distributed
domains):

1. JetStream-py: a :class:`~jetstream.control.launch.LocalCluster` of the topology (every site
   a process with its own Spark JVM), the first ``n`` of :data:`QUERIES` submitted together.
2. The baseline, the ceiling of shipping raw logs: one plain Spark Structured Streaming job in
   a process of its own, reading every site's folder where the files land (no wide area at
   all), with a site's trigger, watermark and Spark settings, each standing query written by
   hand as a streaming query of its own (:mod:`jetstream.lab.plain_spark`), as a Spark user
   runs several.
3. On request (``--systems push``), JetStream-py with the logs pushed: each file, as it
   lands at an edge folder, POSTed to its site's ``--push-http`` as JSON lines by a shipper
   in the bench's process (not counted in the CPU figures), the site's spool writing them into
   its input. Its latency after close counts from the file's landing at the edge, as the
   others' do, so it includes the push and the spool's roll.

Latency after close is measured from outside, as ``jetstream bench --emulate`` measures it
(:func:`~jetstream.lab.latency_bench.window_closes`): when a window's first final result
reached the bench, minus when the last site received the record that moved its watermark past
the window's end. Every revision of every window is kept and scored against ``js.run_local``
over the same files: a result marked final and exact that is unlike it, or a final result
that a later revision changes, fails the run (``jetstream bench --load`` exits 1 and keeps
both in ``unlike.jsonl``); the run counts the windows final at their first publication and
those never final. Besides
the percentiles, each run reports the CPU seconds its processes (and their JVMs) spent per
million records while the logs were written, and the peak of their resident memory summed.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import http.client
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jetstream as js
from jetstream import col
from jetstream.aggtree.loader import load_topology
from jetstream.control.launch import LocalCluster, free_port
from jetstream.dsl import Query, reading
from jetstream.errors import ControlPlaneError, PlanError
from jetstream.lab.latency_bench import (
    BACKHAUL_WATERMARK_MS,
    PERCENTILES,
    Landing,
    Landings,
    percentile,
    seconds_text,
    window_closes,
)
from jetstream.lab.loggen import LogSpec, write_live
from jetstream.local import run_local
from jetstream.results import write_json_lines

__all__ = ["QUERIES", "LoadRun", "run_load"]

Say = Callable[[str], None]
Window = tuple[int, int]

#: Windows ending this soon after the logs start, or this close to their end (nothing
#: closes them), are not counted (the JVMs' first batches).
WARMUP_S, CLOSING_S = 20.0, 10.0
#: How long a run waits, after the logs stop, for the windows on their way; at most, while a
GRACE_S, CATCH_UP_S = 30.0, 300.0  # site still reads files that landed before (behind)
#: The sites' ``--warm-up`` here (see :mod:`jetstream.stage.warm`).
SITE_WARM_UP_S = 30.0


def _queries() -> list[Query]:
    """The standing queries of an operator's dashboard, the CDN top-k first."""
    logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)

    def windowed(stream: js.Stream) -> js.Stream:
        return stream.window(js.tumbling("10s"), watermark="5s", early="2s")

    slo = js.SLO(max_latency="3s", max_error=0.01)
    return [
        js.Query("cdn-topk", windowed(logs.where(col("status") < 500)
                                      .with_column("kb", col("bytes") / 1024))
                 .group_by("domain").agg(requests=js.count(), kb=js.sum("kb"))
                 .top_k(10, by="requests"), slo=slo),
        js.Query("bytes-by-pop", windowed(logs).group_by("pop")
                 .agg(requests=js.count(), bytes=js.sum("bytes")), slo=slo),
        js.Query("status-counts", windowed(logs).group_by("status")
                 .agg(requests=js.count()), slo=slo),
        js.Query("top-errors", windowed(logs.where(col("status") >= 400))
                 .group_by("domain").agg(errors=js.count()).top_k(10, by="errors"), slo=slo),
        js.Query("clients-by-pop", windowed(logs).group_by("pop")
                 .agg(clients=js.approx_count_distinct("client_ip")), slo=slo),
        js.Query("latency-p99", windowed(logs)
                 .agg(p99=js.approx_quantile("latency_ms", 0.99)), slo=slo),
    ]


#: The queries a load run stands up, in the order they are added (``--queries N``: the first N).
QUERIES: tuple[Query, ...] = tuple(_queries())
#: Where a run's folder keeps each exact result unlike run_local's, beside run_local's rows.
UNLIKE_FILE = "unlike.jsonl"
#: Where a run's folder keeps every result JetStream-py gave, as it came.
RESULTS_FILE = "results.jsonl"


@dataclass(frozen=True)
class Given:
    """One result of a window as it reached the bench (every revision is one)."""

    at: float  # wall-clock seconds
    rows: list[dict[str, Any]]
    exact: bool
    final: bool = True
    revision: int = 0


@dataclass
class QueryFigures:
    """One query's windows in one run."""

    windows: int = 0  # counted (see WARMUP_S and CLOSING_S)
    not_given: int = 0  # counted, but no result at all before the run ended
    not_final: int = 0  # given, but never final before the run ended
    final_at_first: int = 0  # final at their first publication
    unequal: int = 0  # given final and exact, with rows other than run_local's
    changed: int = 0  # given final, then changed by a later revision
    inexact: int = 0  # final, but marked inexact (a sketch's estimate)
    after_close_s: list[float] = field(default_factory=list)  # to the first final result

    def summary(self) -> dict[str, Any]:
        return {"windows": self.windows, "not_given": self.not_given,
                "not_final": self.not_final, "final_at_first": self.final_at_first,
                "unequal": self.unequal, "changed": self.changed, "inexact": self.inexact,
                **{f"p{q}_s": percentile(self.after_close_s, q) for q in PERCENTILES}}


@dataclass
class LoadRun:
    """One system at one rate with some standing queries."""

    system: str
    rate: float
    queries: int
    records: int = 0
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0
    figures: dict[str, QueryFigures] = field(default_factory=dict)
    #: How far each site fell behind at worst (``jetstream status``'s ``behind``): the most
    #: files landed and not read yet, and the longest the oldest of them had waited (s).
    behind: dict[str, tuple[int, float]] = field(default_factory=dict)

    def saw(self, site: str, files: int, lag_s: float) -> None:
        held = self.behind.get(site, (0, 0.0))
        self.behind[site] = (max(held[0], files), max(held[1], lag_s))

    def summary(self) -> dict[str, Any]:
        return {"system": self.system, "rate": self.rate, "queries": self.queries,
                "records": self.records, "cpu_s": round(self.cpu_s, 1),
                "cpu_s_per_million_records": (round(self.cpu_s / self.records * 1e6, 1)
                                              if self.records else None),
                "peak_rss_mb": round(self.peak_rss_mb),
                "behind": {site: {"files": files, "lag_s": round(lag_s, 1)}
                           for site, (files, lag_s) in sorted(self.behind.items())},
                "per_query": {name: f.summary() for name, f in self.figures.items()}}


def run_load(topology: Path, work: Path, *, rates: Sequence[float],
             counts: Sequence[int] = (1,), duration_s: float = 120.0, seed: int = 0,
             keys: int = 20_000, chunk_s: float = 0.5, say: Say = lambda line: None,
             systems: Sequence[str] = ("jetstream", "baseline")) -> list[dict[str, Any]]:
    """Every system at every rate with each count of standing queries (see the module's
    docstring); a summary per run, in the order run.

    Raises
    ------
    PlanError
        For a count outside 1..len(QUERIES), a rate or duration that leaves no window to
        count, or an unknown system.
    """
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        msg = (f"load bench: no system named {', '.join(unknown) or 'at all'}; "
               f"choose from {', '.join(SYSTEMS)}")
        raise PlanError(msg)
    if not counts or any(not 1 <= n <= len(QUERIES) for n in counts):
        msg = f"load bench: --queries takes counts from 1 to {len(QUERIES)}, got {list(counts)}"
        raise PlanError(msg)
    if duration_s < WARMUP_S + CLOSING_S + 10 or any(r <= 0 for r in rates) or not rates:
        msg = (f"load bench: --duration must leave a window to count (at least "
               f"{WARMUP_S + CLOSING_S + 10:g} s) and every rate must be above 0")
        raise PlanError(msg)
    sites = [s.name for s in load_topology(topology).sites if s.sources]
    spec = LogSpec(domains=keys)
    reports = []
    for rate in rates:
        for n in counts:
            for system in systems:
                folder = work / f"{system}-{rate:g}-{n}q"
                run = LoadRun(system, rate, n)
                say(f"load, {system}: {rate:g} records/s a site, {n} standing "
                    f"quer{'y' if n == 1 else 'ies'}, {duration_s:g}s of logs")
                arrivals, started, landings = SYSTEMS[system](
                    topology, folder, QUERIES[:n], sites, run,
                    functools.partial(_live_logs, sites=sites, rate=rate, spec=spec,
                                      seed=seed, chunk_s=chunk_s, duration_s=duration_s))
                _score(run, QUERIES[:n], folder / ("edge" if system == "push" else "input"),
                       arrivals, landings, sites, started, duration_s)
                summary = run.summary()
                reports.append(summary)
                for name, figures in summary["per_query"].items():
                    say(f"  {name}: p50/p95/p99 after close "
                        + " / ".join(seconds_text(figures[f"p{q}_s"]) for q in PERCENTILES)
                        + f" over {figures['windows']} windows: {figures['final_at_first']} "
                        f"final at their first publication, {figures['not_final']} never "
                        f"final, {figures['not_given']} not given, {figures['inexact']} "
                        "approximate")
                    if figures["unequal"] or figures["changed"]:
                        say(f"  WRONG: {figures['unequal']} windows final and exact but unlike "
                            f"run_local, {figures['changed']} final ones changed after; the "
                            f"results and run_local's rows: {folder / UNLIKE_FILE}")
                say(f"  CPU {summary['cpu_s_per_million_records']} s per million records, "
                    f"peak memory {summary['peak_rss_mb']:,} MB")
                if summary["behind"]:
                    say("  fell behind at worst: " + ", ".join(
                        f"{site} {b['files']} files, {b['lag_s']:g} s"
                        for site, b in summary["behind"].items()))
    return reports


# -- the two systems -----------------------------------------------------------------------
# Each returns (query -> window -> every result given, in order), when the logs started, and
# the files that landed.
Arrived = dict[str, dict[Window, list[Given]]]
Logs = Callable[..., tuple[float, Landings]]


def _jetstream(topology: Path, folder: Path, queries: Sequence[Query], sites: list[str],
               run: LoadRun, logs: Logs, *, push: bool = False,
               ) -> tuple[Arrived, float, list[Landing]]:
    inputs = folder / "input"
    for site in sites:  # a site without its folder at deploy time reads nothing
        (inputs / site).mkdir(parents=True, exist_ok=True)
    arrived: Arrived = {q.name: {} for q in queries}
    lock = threading.Lock()
    ports = {site: free_port() for site in sites}
    pushing = ["--push-http", "127.0.0.1:{port}", "--push-roll", f"{PUSH_ROLL_S:g}"]
    with LocalCluster(topology, inputs, idle_timeout_s=30, logs=folder / "logs",
                      site_args=lambda s: ["--warm-up", f"{SITE_WARM_UP_S:g}", *(
                          [a.format(port=ports[s]) for a in pushing] if push else [])],
                      ) as cluster:
        for query in queries:
            cluster.client.submit(reading(query, {"cdn_logs": "json"}) if push else query)
        for query in queries:
            cluster.wait_for_stages(query.name)

        received = (folder / RESULTS_FILE).open("a", encoding="utf-8")

        def collect(name: str) -> None:
            with contextlib.suppress(ControlPlaneError):
                for result in cluster.client.results(name):
                    with lock:
                        if not received.closed:  # (the run over, its streams end)
                            write_json_lines([result], received)
                    window = (result.window_start, result.window_end)
                    given = Given(time.time(), result.rows, result.exact, result.final,
                                  result.revision)
                    with lock:
                        arrived[name].setdefault(window, []).append(given)

        for query in queries:
            threading.Thread(target=collect, args=(query.name,), daemon=True).start()
        watching, waiting = threading.Event(), dict[str, int]()  # files not read yet, a site

        def watch() -> None:  # how far each site falls behind, as status says
            while not watching.wait(2.0):
                with contextlib.suppress(ControlPlaneError):
                    for site in cluster.client.status().sites:
                        waiting[site.name] = sum(lag.files_waiting for lag in site.behind)
                        for lag in site.behind:
                            run.saw(site.name, lag.files_waiting, lag.lag_s)

        threading.Thread(target=watch, daemon=True).start()
        pids = lambda: [p.pid for p in cluster.processes.values()]  # noqa: E731
        try:
            with _Usage(pids, run):
                if push:
                    with _Shipper(ports) as shipper:
                        started, landings = logs(folder / "edge", shipper.ship)
                else:
                    started, landings = logs(inputs)
            _wait_for(arrived, lock, time.time(), lambda: any(waiting.values()))
        finally:  # (a run that raises keeps what it was given, and the file is whole)
            watching.set()
            with lock:
                received.close()
    return arrived, started, landings.read()


class _Shipper:
    """What a log shipper with an HTTP sink does at each edge: each file as it lands, its
    lines as JSON objects (every value as its text, as the sites read a CSV cell), POSTed to
    its site's ``--push-http`` with the file's name as the idempotency key, again until a
    200; a thread per site."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports = ports
        self.queues: dict[str, queue.Queue[Path | None]] = {s: queue.Queue() for s in ports}
        self.threads = [threading.Thread(target=self._run, args=(site,), daemon=True)
                        for site in ports]

    def __enter__(self) -> _Shipper:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for waiting in self.queues.values():
            waiting.put(None)
        for thread in self.threads:
            thread.join(60)

    def ship(self, path: Path, records: int) -> None:
        if records:
            self.queues[path.parent.name].put(path)

    def _run(self, site: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[site], timeout=60)
        while (path := self.queues[site].get()) is not None:
            with path.open(newline="") as rows:
                body = "".join(json.dumps(row) + "\n" for row in csv.DictReader(rows)).encode()
            while True:
                try:
                    conn.request("POST", "/", body, {"Idempotency-Key": path.name})
                    answer = conn.getresponse()
                    answer.read()
                    if answer.status == 200:
                        break
                except (OSError, http.client.HTTPException):
                    conn.close()
                time.sleep(0.1)
        conn.close()


def _baseline(topology: Path, folder: Path, queries: Sequence[Query], sites: list[str],
              run: LoadRun, logs: Logs) -> tuple[Arrived, float, list[Landing]]:
    from jetstream.lab.latency_bench import _backhaul_spark

    inputs = folder / "input"
    for site in sites:
        (inputs / site).mkdir(parents=True, exist_ok=True)
    master, conf = _backhaul_spark(load_topology(topology))
    out = folder / "windows.jsonl"
    job = subprocess.Popen(
        [sys.executable, "-m", "jetstream.lab.baseline", "watch", "--folder",
         str(inputs / "*"), "--checkpoint", str(folder / "checkpoint"), "--out", str(out),
         "--master", master, "--queries", str(len(queries)),
         *(f"--conf={k}={v}" for k, v in conf.items())],
        stdout=(folder / "baseline.log").open("ab"), stderr=subprocess.STDOUT)
    arrived: Arrived = {query.name: {} for query in queries}
    lock = threading.Lock()
    try:
        _wait_for_file(out, job)
        stop = threading.Event()
        follower = threading.Thread(target=_follow, args=(out, arrived, lock, stop),
                                    daemon=True)
        follower.start()
        with _Usage(lambda: [job.pid], run):
            started, landings = logs(inputs)
        _wait_for(arrived, lock, time.time(), lambda: False)  # (its lag is not watched)
        stop.set()
        follower.join(5)
    finally:
        job.terminate()
        job.wait(timeout=30)
    return arrived, started, landings.read()


def _wait_for_file(path: Path, job: subprocess.Popen[bytes], timeout_s: float = 180) -> None:
    """Until the baseline job says it reads (it creates its output file then)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if job.poll() is not None or time.monotonic() > deadline:
            msg = f"load bench: the baseline's Spark job did not start (see {path.parent})"
            raise ControlPlaneError(msg)
        time.sleep(0.2)


def _follow(path: Path, into: Arrived, lock: threading.Lock, stop: threading.Event) -> None:
    """Each window the baseline writes, noted by query when its line appears."""
    import json

    with path.open() as lines:
        while not stop.is_set():
            line = lines.readline()
            if not line.endswith("\n"):
                time.sleep(0.02)
                if line:
                    lines.seek(lines.tell() - len(line.encode()))
                continue
            at = time.time()
            window = json.loads(line)
            with lock:
                into[window["query"]].setdefault((window["start"], window["end"]), []).append(
                    Given(at, window["rows"], window["exact"]))


# -- the live input, and what it cost -------------------------------------------------------
def _live_logs(inputs: Path, then: Callable[[Path, int], None] | None = None, *,
               sites: list[str], rate: float, spec: LogSpec, seed: int, chunk_s: float,
               duration_s: float) -> tuple[float, Landings]:
    """Write live logs for ``duration_s`` (each file handed to ``then`` as well, once
    landed); when they started, and the files as they landed."""
    stop, landings = threading.Event(), Landings()

    def landed(path: Path, records: int) -> None:
        landings(path, records)
        if then is not None:
            then(path, records)

    writer = threading.Thread(target=write_live, args=(inputs, sites), daemon=True,
                              kwargs={"rate": rate, "spec": spec, "seed": seed,
                                      "chunk_s": chunk_s, "stop": stop,
                                      "on_file": landed})
    started = time.time()
    writer.start()
    stop.wait(duration_s)
    stop.set()
    writer.join(timeout=10)
    return started, landings


class _Usage:
    """The CPU seconds and the peak resident memory of some processes and every process they
    started (Spark's JVMs), while the block runs, sampled every second."""

    def __init__(self, roots: Callable[[], list[int]], run: LoadRun) -> None:
        self.roots, self.run = roots, run
        self._stop = threading.Event()
        self._cpu: dict[int, float] = {}
        self._first: dict[int, float] = {}

    def __enter__(self) -> _Usage:
        self._sample()
        self._first = dict(self._cpu)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sample()
        self.run.cpu_s = sum(cpu - self._first.get(pid, 0.0) for pid, cpu in self._cpu.items())

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            self._sample()

    def _sample(self) -> None:
        rss = 0
        for pid in _descendants(self.roots()):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                tick = os.sysconf("SC_CLK_TCK")
                self._cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
                rss += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        self.run.peak_rss_mb = max(self.run.peak_rss_mb, rss / 2**20)


def _descendants(roots: list[int]) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = set(roots), list(roots)
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.add(child)
                frontier.append(child)
    return sorted(found)


# -- scoring -------------------------------------------------------------------------------
def _wait_for(arrived: Arrived, lock: threading.Lock, stopped: float,
              behind: Callable[[], bool]) -> None:
    """Until every query has the last counted window final, or ``GRACE_S`` passes with no
    site ``behind`` (catching up), or ``CATCH_UP_S``."""
    deadline, limit = time.time() + GRACE_S, time.time() + CATCH_UP_S
    while time.time() < limit and (time.time() < deadline or behind()):
        with lock:
            done = min((max((w[1] for w, given in seen.items() if any(g.final for g in given)),
                            default=0) for seen in arrived.values()), default=0) / 1000
        if done >= stopped - CLOSING_S:
            return
        time.sleep(1)


def _score(run: LoadRun, queries: Sequence[Query], inputs: Path, arrived: Arrived,
           landings: list[Landing], sites: list[str], started: float,
           duration_s: float) -> None:
    """``run``'s figures: its results against run_local over the logs written in
    ``inputs``."""
    ended = time.time()
    folder = inputs.parent
    unlike = []
    run.records = sum(1 for site in sites for f in (inputs / site).glob("*.csv")
                      for _ in f.open()) - sum(1 for site in sites
                                               for _ in (inputs / site).glob("*.csv"))
    for query in queries:
        if query.name not in arrived:
            continue
        window_op = query.stream.window_op
        assert window_op is not None
        truth = {(r.window_start, r.window_end): r.rows for r in run_local(query, inputs)}
        closes = window_closes(landings, sites, (end for _, end in truth),
                               window_op.watermark_ms)
        figures = run.figures[query.name] = QueryFigures()
        for window, rows in sorted(truth.items()):
            end = window[1] / 1000
            if end - started < WARMUP_S or end > started + duration_s - CLOSING_S:
                continue
            figures.windows += 1
            close = closes.get(window[1])
            given = arrived[query.name].get(window, [])
            final = next((g for g in given if g.final), None)
            if not given or final is None:
                figures.not_given += not given
                figures.not_final += bool(given)
                if close is not None:
                    figures.after_close_s.append(ended - close)
                continue
            figures.final_at_first += given[0].final
            if not final.exact:  # an approximate result is within its bound, not equal
                figures.inexact += 1
            elif not _same_rows(final.rows, rows):
                figures.unequal += 1
                unlike.append({"query": query.name, "window": list(window), "why": "unlike",
                               "given": final.rows, "run_local": rows})
            after = [g for g in given[given.index(final) + 1:]
                     if not _same_rows(g.rows, final.rows)]
            if after:
                figures.changed += 1
                unlike.append({"query": query.name, "window": list(window), "why": "changed",
                               "given": final.rows, "then": [g.rows for g in after],
                               "run_local": rows})
            if close is not None:
                figures.after_close_s.append(final.at - close)
    if unlike:
        with (folder / UNLIKE_FILE).open("w") as out:
            for line in unlike:
                out.write(json.dumps(line, default=str) + "\n")


def _same_rows(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> bool:
    """The same rows, in the same order; floats within a relative 1e-9 (the baseline sums
    doubles in Spark's order)."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if set(g) - {"lb", "ub"} != set(w) - {"lb", "ub"}:
            return False
        for name, value in w.items():
            other = g.get(name)
            if isinstance(value, float) and isinstance(other, int | float):
                if not math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-9):
                    return False
            elif other != value:
                return False
    return True


#: The systems a load run can measure (``--systems``): JetStream-py reading the files where
#: they land, the same with the logs pushed to each site over HTTP, and the plain Spark job.
SYSTEMS: dict[str, Callable[..., tuple[Arrived, float, list[Landing]]]] = {
    "jetstream": _jetstream, "push": functools.partial(_jetstream, push=True),
    "baseline": _baseline}
#: The push spool's roll interval in the ``push`` runs.
PUSH_ROLL_S = 0.2

assert BACKHAUL_WATERMARK_MS == 5_000  # the baseline's job, as QUERIES[0] waits
