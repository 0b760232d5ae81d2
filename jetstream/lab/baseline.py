"""The backhaul baseline: what a user would build instead of JetStream for the CDN top-k.

Every site's raw logs are shipped (gzip) to the root datacenter, where one plain Spark
Structured Streaming job computes the query: requests with ``status < 500``, per 10 s window
and domain, the request count and the kilobytes served, then the 10 busiest domains per window.
It is written by hand, as its user would write it (:mod:`jetstream.lab.plain_spark`, where
the load bench's other standing queries are written the same way: ``watch --queries N``).

Live, over a real network: :func:`ship` (``python -m jetstream.lab.baseline ship``, one
per site) gzips each new log file of a folder and sends it over TCP to a :class:`Receiver` at
the root, which drops it into the inbox that :func:`live_top_domains` watches.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import shutil
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from jetstream.lab.plain_spark import PLAIN_QUERIES, PlainQuery, logs
from jetstream.schema import CDN_LOG_SCHEMA
from jetstream.stage.compile import spark_schema
from jetstream.stage.spark import session_builder, started

#: The CDN top-k, as the backhaul's user writes it.
CDN_TOPK = PLAIN_QUERIES[0]

__all__ = ["BackhaulRun", "Receiver", "live_top_domains", "ship", "ship_gzipped",
           "top_domains"]

Window = tuple[int, int]
Rows = list[dict[str, Any]]


def ship_gzipped(files: list[Path], inbox: Path) -> int:
    """Gzip ``files`` into ``inbox`` (what crosses the wide area); the bytes shipped."""
    inbox.mkdir(parents=True, exist_ok=True)
    shipped = 0
    for i, path in enumerate(files):
        target = inbox / f"{path.parent.name}-{i:05d}-{path.name}.gz"
        with path.open("rb") as raw, gzip.open(target, "wb", compresslevel=6) as packed:
            shutil.copyfileobj(raw, packed)
        shipped += target.stat().st_size
    return shipped


@dataclass(frozen=True)
class BackhaulRun:
    """The plain job's top 10 per window, and how long it took over how many records."""

    windows: dict[Window, Rows]
    seconds: float
    records: int


def _counts(spark: SparkSession, inbox: Path | str) -> DataFrame:
    return CDN_TOPK.counts(logs(spark, str(inbox)))


def _top(rows: Sequence[Any], k: int) -> dict[Window, Rows]:
    return dataclasses.replace(CDN_TOPK, k=k).rows(rows)


def top_domains(spark: SparkSession, inbox: Path, checkpoint: Path, *, k: int = 10
                ) -> BackhaulRun:
    """Run the plain streaming job once over everything in ``inbox`` (``*.csv.gz``)."""
    name = f"backhaul_{time.time_ns()}"
    start = time.perf_counter()
    (_counts(spark, inbox).writeStream.format("memory").queryName(name).outputMode("append")
     .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
     .start().awaitTermination())
    seconds = time.perf_counter() - start
    records = spark.read.schema(spark_schema(CDN_LOG_SCHEMA)).option("header", True) \
        .csv(str(inbox)).count()
    rows = spark.table(name).collect()
    return BackhaulRun(_top(rows, k), seconds, records)


def live_top_domains(spark: SparkSession, inbox: Path | str, checkpoint: Path,
                     on_window: Callable[[Window, Rows], None], *, k: int = 10,
                     trigger_s: float = 1.0) -> StreamingQuery:
    """Start the plain job on ``inbox`` as files arrive; ``on_window`` hears each window's
    top ``k`` once Spark's watermark lets the window out."""
    def emit(batch: DataFrame, batch_id: int) -> None:
        for window, rows in sorted(_top(batch.collect(), k).items()):
            on_window(window, rows)

    if isinstance(inbox, Path):
        inbox.mkdir(parents=True, exist_ok=True)
    return (_counts(spark, inbox).writeStream.outputMode("append").foreachBatch(emit)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=f"{trigger_s:g} seconds").start())


class Receiver(socketserver.ThreadingTCPServer):
    """The root's end of the backhaul: each file a shipper sends lands whole in ``inbox``.

    The stream is a header line ``SITE NAME SIZE`` then SIZE bytes, per file. ``received``
    counts the bytes received per site.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], inbox: Path) -> None:
        self.inbox, self.staging = inbox, inbox.parent / f".{inbox.name}-staging"
        self.inbox.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)
        self.received: dict[str, int] = {}
        self._lock = threading.Lock()
        super().__init__(address, _Arrivals)

    def land(self, site: str, name: str, data: bytes) -> None:
        name = f"{site}-{name}"
        if "/" in name or name.startswith("."):
            return
        staged = self.staging / name
        staged.write_bytes(data)
        staged.rename(self.inbox / name)  # whole files only, as Spark's file source needs
        with self._lock:
            self.received[site] = self.received.get(site, 0) + len(data)


class _Arrivals(socketserver.StreamRequestHandler):
    server: Receiver

    def handle(self) -> None:
        while header := self.rfile.readline():
            site, name, size = header.decode().split()
            data = self.rfile.read(int(size))
            if len(data) < int(size):
                return
            self.server.land(site, name, data)


def ship(folder: Path, site: str, to: tuple[str, int], *, poll_s: float = 0.2,
         stop: threading.Event | None = None) -> None:
    """Send every ``*.csv`` that appears in ``folder``, gzipped, in name order, to a
    :class:`Receiver` at ``to``, until ``stop`` is set (or forever)."""
    stop = stop or threading.Event()
    sent: set[str] = set()
    with _connect(to, stop) as conn:
        while not stop.is_set():
            fresh = sorted(p for p in folder.glob("*.csv") if p.name not in sent)
            for path in fresh:
                packed = gzip.compress(path.read_bytes(), compresslevel=6)
                conn.sendall(f"{site} {path.name}.gz {len(packed)}\n".encode() + packed)
                sent.add(path.name)
            if not fresh:
                stop.wait(poll_s)


def _connect(to: tuple[str, int], stop: threading.Event) -> socket.socket:
    while True:
        try:
            return socket.create_connection(to, timeout=None)
        except OSError:
            if stop.wait(0.5):
                raise


def watch(folder: str, checkpoint: Path, out: Path, *, master: str, conf: dict[str, str],
          trigger_s: float, queries: int = 1) -> None:
    """Run the first ``queries`` of the load bench's standing queries in plain Spark
    (:mod:`jetstream.lab.plain_spark`: one streaming query each, as a Spark user runs them)
    live on ``folder`` (a path or a glob, such as every site's folder) until killed,
    appending each window's rows to ``out`` as a JSON line (``query``, ``start``, ``end``,
    ``rows``, ``exact``); ``out`` is created first."""
    spark = started(session_builder(master, "jetstream-baseline", conf), "the baseline")
    spark.sparkContext.setLogLevel("ERROR")
    lock = threading.Lock()
    with out.open("a") as lines:
        def emitter(query: PlainQuery) -> Callable[[DataFrame, int], None]:
            def emit(batch: DataFrame, batch_id: int) -> None:
                for window, rows in sorted(query.rows(batch.collect()).items()):
                    line = {"query": query.name, "start": window[0], "end": window[1],
                            "rows": rows, "exact": query.exact}
                    with lock:
                        lines.write(json.dumps(line) + "\n")
                        lines.flush()
            return emit

        streams = [query.counts(logs(spark, folder)).writeStream.outputMode("append")
                   .foreachBatch(emitter(query))
                   .option("checkpointLocation", str(checkpoint / query.name))
                   .trigger(processingTime=f"{trigger_s:g} seconds").start()
                   for query in PLAIN_QUERIES[:queries]]
        for stream in streams:
            stream.awaitTermination()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jetstream.lab.baseline",
        description="ship: the backhaul baseline's shipper for one site; watch: the plain "
        "Spark job, live on a folder (see the module)")
    parser.add_argument("action", choices=["ship", "watch"])
    parser.add_argument("--folder", required=True,
                        help="ship: the site's log folder; watch: the folder (or glob) to read")
    parser.add_argument("--site", help="ship: the site's name")
    parser.add_argument("--to", metavar="HOST:PORT", help="ship: the receiver")
    parser.add_argument("--checkpoint", type=Path, help="watch: the stream's checkpoint")
    parser.add_argument("--out", type=Path, help="watch: the JSON lines of windows")
    parser.add_argument("--master", default="local[2]", help="watch: the Spark master")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="watch: a Spark setting; repeatable")
    parser.add_argument("--trigger", type=float, default=0.25, metavar="S",
                        help="watch: the micro-batch interval (default: 0.25)")
    parser.add_argument("--queries", type=int, default=1, metavar="N",
                        choices=range(1, len(PLAIN_QUERIES) + 1),
                        help="watch: how many of the load bench's standing queries to run, "
                        "each a streaming query of its own (default: 1, the CDN top-k)")
    args = parser.parse_args(argv)
    if args.action == "ship":
        if not (args.site and args.to):
            parser.error("ship needs --site and --to")
        host, port = args.to.rsplit(":", 1)
        ship(Path(args.folder), args.site, (host, int(port)))
        return
    if not (args.checkpoint and args.out) or any("=" not in c for c in args.conf):
        parser.error("watch needs --checkpoint and --out, and each --conf as KEY=VALUE")
    watch(args.folder, args.checkpoint, args.out, master=args.master,
          conf=dict(c.split("=", 1) for c in args.conf), trigger_s=args.trigger,
          queries=args.queries)


if __name__ == "__main__":
    main()
