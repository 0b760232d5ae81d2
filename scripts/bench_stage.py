#!/usr/bin/env python3
"""The local stage's throughput against a plain Spark job, and partial bytes against raw bytes.

Usage: python scripts/bench_stage.py [--events 400000] [--domains 2000]

Writes synthetic CDN logs (Zipf-like domains) to a temporary folder, then, in one run and one
SparkSession (local[2]): (a) the JetStream local stage computes the CDN top-k query's partials;
(b) a plain Spark Structured Streaming job computes the same per-window, per-domain count and
sum over the same files (what a user would run at one site). Prints events/s for both, and the
wide-area bytes of the exact partials per window against the raw CSV bytes they replace.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import jetstream as js
from jetstream.partials import PartialBatch, encode_batch
from jetstream.queryfile import load_query
from jetstream.stage.compile import spark_schema
from jetstream.stage.job import LocalStage

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--domains", type=int, default=2000)
    args = parser.parse_args()
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    query = js.optimize(load_query(ROOT / "examples" / "cdn_topk.py"))
    plan = query.plan()
    partial = plan.op(plan.partial_aggregates()[0])
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        raw_bytes = write_logs(logs, args.events, args.domains)
        windows: dict[tuple[int, int], list] = {}
        stage = LocalStage(spark, query, logs, checkpoint_dir=Path(tmp) / "ck1",
                           quarantine_dir=Path(tmp) / "q",
                           emit=lambda w, rows, n, rev: windows.setdefault(w, []).extend(rows))
        start = time.perf_counter()
        stage.run_available()
        ours = time.perf_counter() - start

        schema = spark_schema(js.CDN_LOG_SCHEMA)
        plain = (spark.readStream.schema(schema).option("header", True).csv(str(logs))
                 .where(F.col("status") < 500)
                 .withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "5 seconds")
                 .groupBy(F.window("t", "10 seconds"), "domain")
                 .agg(F.count(F.lit(1)).alias("requests"), F.sum(F.col("bytes") / 1024)))
        start = time.perf_counter()
        (plain.writeStream.format("memory").queryName("plain").outputMode("append")
         .option("checkpointLocation", str(Path(tmp) / "ck2")).trigger(availableNow=True)
         .start().awaitTermination())
        baseline = time.perf_counter() - start
        partial_bytes = sum(encode_batch(PartialBatch("q", w, "fra", tuple(rows)), partial)
                            .ByteSize() for w, rows in windows.items())
    print(f"events: {args.events}, domains: {args.domains}, windows: {len(windows)}")
    print("| job | seconds | events/s | events/s per core |")
    print("|---|---:|---:|---:|")
    for name, seconds in (("JetStream local stage", ours), ("plain Spark job", baseline)):
        rate = args.events / seconds
        print(f"| {name} | {seconds:.1f} | {rate:,.0f} | {rate / 2:,.0f} |")
    print(f"ratio (ours / plain): {baseline / ours:.2f} of the plain job's throughput")
    print(f"raw CSV bytes: {raw_bytes:,}; exact partials on the wire: {partial_bytes:,} "
          f"({raw_bytes / max(partial_bytes, 1):.1f}x less); per window: "
          f"{partial_bytes / max(len(windows), 1):,.0f} bytes vs "
          f"{raw_bytes / max(len(windows), 1):,.0f}")
    spark.stop()


if __name__ == "__main__":
    main()
