#!/usr/bin/env python3
"""How a live stage's micro-batches speed up as its JVM warms: one site's warm-up, timed.

Usage: python scripts/bench_warm_up.py [--seconds 90]

Starts one Spark session with a site's default settings (``DEFAULT_SPARK_CONF``, local[2]) and
warms the CDN top-k query's stage up for ``--seconds`` (``jetstream.stage.warm.warm_up``, as a
site does before its stream starts), then prints each micro-batch's time, from its file
landing to the stage's end of it, and the median of each ten.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

import jetstream as js
from jetstream.queryfile import load_query
from jetstream.stage.check import check_stage
from jetstream.stage.spark import DEFAULT_SPARK_CONF
from jetstream.stage.warm import warm_up

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    args = parser.parse_args()
    builder = SparkSession.builder.master("local[2]").appName("bench-warm-up")
    for key, value in DEFAULT_SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    query = js.optimize(load_query(ROOT / "examples" / "cdn_topk.py"))
    [chain] = check_stage(query)
    with tempfile.TemporaryDirectory() as scratch:
        warm = warm_up(spark, query, chain, Path(scratch) / "warm-up", seconds=args.seconds)
    failed = f"; stopped by {warm.failure}" if warm.failure else ""
    print(f"{warm.batches} micro-batches in {warm.seconds:.1f}s{failed}")
    print("each, s:", " ".join(f"{t:.2f}" for t in warm.times))
    tens = [statistics.median(warm.times[i:i + 10]) for i in range(0, warm.batches, 10)]
    print("median of each ten, s:", " ".join(f"{t:.2f}" for t in tens))


if __name__ == "__main__":
    main()
