#!/usr/bin/env python3
"""The local stage's throughput against a plain Spark job, and partial bytes against raw bytes.

Usage: python scripts/bench_stage.py [--events 200000] [--domains 2000] [--runs 3]
                                     [--sum-latency] [--conf KEY=VALUE ...]

Writes synthetic CDN logs (Zipf-like domains) to a temporary folder, then, in one run and one
SparkSession (local[2], a replaying site's Spark settings): (a) the JetStream local stage
computes the CDN top-k query's partials; (b) a plain Spark Structured Streaming job computes the
same per-window, per-domain count and sum over the same files (what a user would run at one
site). One warm-up run of each, then ``--runs`` runs of each, alternating which goes first.
Prints events/s for both, their ratio (min/median/max), the Spark jobs per micro-batch of ours,
and the wide-area bytes of the exact partials per window against the raw CSV bytes they replace.

The query's sum is ``bytes / 1024`` (an integer scaled by a power of two, which the stage sums
as an integer); ``--sum-latency`` sums ``latency_ms`` instead, a double column, which the
stage sums exactly in bands of exponents (see ``jetstream.stage.forms``), in both jobs.
``--conf`` overrides one of the site's Spark settings for both jobs (e.g. the JVM's options).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import jetstream as js
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.partials import PartialBatch
from jetstream.operators import WindowAggregate
from jetstream.queryfile import load_query
from jetstream.stage.compile import spark_schema
from jetstream.stage.job import LocalStage
from jetstream.stage.spark import REPLAY_SPARK_CONF

ROOT = Path(__file__).resolve().parent.parent
HEADER = "ts,pop,client_ip,domain,url,status,bytes,latency_ms,cache\n"


def write_logs(folder: Path, events: int, domains: int, seed: int = 7) -> int:
    rnd = random.Random(seed)
    weights = [1 / (i + 1) ** 1.1 for i in range(domains)]
    names = [f"site{i}.example.com" for i in range(domains)]
    chosen = rnd.choices(names, weights, k=events)
    folder.mkdir(parents=True)
    size = 0
    per_file = 50_000
    for part in range(0, events, per_file):
        lines = [HEADER]
        for i in range(part, min(part + per_file, events)):
            d = chosen[i]
            status, nbytes = 200 if i % 20 else 404, (i * 7919) % 500_000
            lines.append(f"{1_767_225_600_000 + i * 2},fra,198.51.100.{i % 250},{d},"
                         f"http://{d}/a/{i % 40}.js,{status},{nbytes},{(i % 997) / 10},HIT\n")
        text = "".join(lines)
        (folder / f"part-{part // per_file:04d}.csv").write_text(text)
        size += len(text)
    return size


def run_ours(spark: SparkSession, query: js.Query, logs: Path, work: Path) -> tuple[float, Any]:
    """Seconds our local stage takes over ``logs``, and what it handed on."""
    windows: dict[tuple[int, int], list[Any]] = {}
    stage = LocalStage(spark, query, logs, checkpoint_dir=work / "checkpoint",
                       quarantine_dir=work / "quarantine",
                       emit=lambda w, rows, n, rev: windows.__setitem__(w, rows))
    start = time.perf_counter()
    stats = stage.run_available()
    return time.perf_counter() - start, (windows, stats)


def cdn_query(sum_latency: bool) -> js.Query:
    """The CDN top-k query (``examples/cdn_topk.py``), or with ``sum_latency`` the same
    summing ``latency_ms``."""
    if not sum_latency:
        return load_query(ROOT / "examples" / "cdn_topk.py")
    logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
    return js.Query("cdn-latency", logs.where(js.col("status") < 500)
                    .window(js.tumbling("10s"), watermark="5s").group_by("domain")
                    .agg(requests=js.count(), ms=js.sum("latency_ms"))
                    .top_k(10, by="requests"))


def run_plain(spark: SparkSession, logs: Path, work: Path, name: str,
              summed: Any) -> float:
    """Seconds a plain Structured Streaming job takes for the same windowed count and sum."""
    plain = (spark.readStream.schema(spark_schema(js.CDN_LOG_SCHEMA)).option("header", True)
             .csv(str(logs))
             .where(F.col("status") < 500)
             .withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "5 seconds")
             .groupBy(F.window("t", "10 seconds"), "domain")
             .agg(F.count(F.lit(1)).alias("requests"), F.sum(summed)))
    start = time.perf_counter()
    (plain.writeStream.format("memory").queryName(name).outputMode("append")
     .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True)
     .start().awaitTermination())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--domains", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3,
                        help="measured runs of each job, after one warm-up run of each")
    parser.add_argument("--sum-latency", action="store_true",
                        help="sum latency_ms, a double column, instead of bytes / 1024")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting instead of the site's default, for both jobs")
    args = parser.parse_args()
    for kv in args.conf:
        if "=" not in kv:
            parser.error(f"--conf takes KEY=VALUE, not {kv!r}")
    builder = SparkSession.builder.master("local[2]")
    conf = dict(REPLAY_SPARK_CONF) | dict(kv.split("=", 1) for kv in args.conf)
    for key, value in conf.items():  # what a site runs with
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    query = js.optimize(cdn_query(args.sum_latency))
    summed = F.col("latency_ms") if args.sum_latency else F.col("bytes") / 1024
    plan = query.plan()
    partial = plan.op(plan.partial_aggregates()[0])
    assert isinstance(partial, WindowAggregate)
    ratios, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        raw_bytes = write_logs(logs, args.events, args.domains)
        for run in range(args.runs + 1):  # run 0 warms both up and is not counted
            # Alternate which job goes first, so neither always pays for the other's garbage.
            order = ("ours", "plain") if run % 2 else ("plain", "ours")
            seconds = {}
            for job in order:
                work = Path(tmp) / f"{job}-{run}"
                if job == "ours":
                    seconds[job], (windows, stats) = run_ours(spark, query, logs, work)
                else:
                    seconds[job] = run_plain(spark, logs, work, f"plain{run}", summed)
            if run == 0:
                continue
            ratio = seconds["plain"] / seconds["ours"]
            ratios.append(ratio)
            rows.append((run, seconds["ours"], seconds["plain"], ratio, stats.jobs,
                         stats.batches))
        partial_bytes = sum(encode_batch(PartialBatch("q", w, "fra", tuple(r)), partial)
                            .ByteSize() for w, r in windows.items())
    print(f"events: {args.events}, domains: {args.domains}, windows: {len(windows)}, "
          f"sum of {'latency_ms' if args.sum_latency else 'bytes / 1024'}")
    print("| run | JetStream local stage (s) | plain Spark job (s) | ours, events/s | "
          "plain, events/s | ours / plain | Spark jobs / micro-batch (ours) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for run, ours, plain, ratio, jobs, batches in rows:
        print(f"| {run} | {ours:.2f} | {plain:.2f} | {args.events / ours:,.0f} | "
              f"{args.events / plain:,.0f} | {ratio:.2f} | {jobs / max(batches, 1):g} |")
    print(f"throughput ratio (ours / plain) over {len(ratios)} runs: min {min(ratios):.2f}, "
          f"median {statistics.median(ratios):.2f}, max {max(ratios):.2f}")
    print(f"raw CSV bytes: {raw_bytes:,}; exact partials on the wire: {partial_bytes:,} "
          f"({raw_bytes / max(partial_bytes, 1):.1f}x less); per window: "
          f"{partial_bytes / max(len(windows), 1):,.0f} bytes vs "
          f"{raw_bytes / max(len(windows), 1):,.0f}")
    spark.stop()


if __name__ == "__main__":
    main()
