#!/usr/bin/env python3
"""Where the local stage's Spark job spends its time, against a plain Spark job's.

Usage: python scripts/bench_stage_parts.py [--events 200000] [--domains 2000] [--runs 7]

Writes the same synthetic CDN logs as ``bench_stage.py`` and, in one SparkSession (a
replaying site's Spark settings), runs each of these as one batch job over them, ``--runs`` times in
turn, and prints the median and the minimum of each (the first two runs warm up and are not
counted):

- ``plain``: the plain job's query (typed CSV, a window, count and a float sum), collected;
- ``stage``: the stage's micro-batch job (text CSV parsed and checked, windows, the exact
  partial aggregates, the counters ``observe`` collects), collected;
- ``stage, plain aggregates``: the stage's parsed and windowed records, grouped by window
  and domain with the plain job's count and float sum;
- ``read as text`` and ``read typed``: the CSV alone, counted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_stage import write_logs
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

import jetstream as js
from jetstream.queryfile import load_query
from jetstream.stage.compile import spark_schema
from jetstream.stage.job import LocalStage
from jetstream.stage.spark import REPLAY_SPARK_CONF

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 2


def jobs(spark: SparkSession, logs: Path, work: Path) -> dict[str, Callable[[], Any]]:
    query = js.optimize(load_query(ROOT / "examples" / "cdn_topk.py"))
    stage = LocalStage(spark, query, logs, checkpoint_dir=work / "checkpoint",
                       quarantine_dir=work / "quarantine", emit=lambda *_: None)
    compiled = stage._compiled  # the stage's own columns: this script looks inside it

    def text() -> DataFrame:
        return (spark.read.schema(stage.text_schema).option("header", True)
                .option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", "_corrupt")
                .csv(str(logs)))

    def typed() -> DataFrame:
        return spark.read.schema(spark_schema(js.CDN_LOG_SCHEMA)).option("header", True) \
            .csv(str(logs))

    def plain() -> Any:
        return (typed().where(F.col("status") < 500)
                .groupBy(F.window(F.timestamp_millis("ts"), "10 seconds"), "domain")
                .agg(F.count(F.lit(1)), F.sum(F.col("bytes") / 1024)).collect())

    def stage_job(aggregates: list[Any]) -> Any:
        observation = Observation()
        prepared = stage._prepare(text()).observe(observation, *compiled.counters)
        rows = prepared.groupBy(*compiled.keys).agg(*aggregates).collect()
        return rows, observation.get

    def plain_aggregates() -> Any:
        return (stage._prepare(text()).groupBy("_start", "_end", "domain")
                .agg(F.count(F.lit(1)), F.sum("_in1")).collect())

    return {
        "plain": plain,
        "stage": lambda: stage_job(compiled.aggregates),
        "stage, plain aggregates": plain_aggregates,
        "read as text": lambda: text().agg(F.count(F.lit(1)), F.max("domain")).collect(),
        "read typed": lambda: typed().agg(F.count(F.lit(1)), F.max("domain")).collect(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--domains", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    if args.runs <= WARM_UP:
        parser.error(f"--runs must be above {WARM_UP} (the warm-up runs)")
    builder = SparkSession.builder.master("local[2]").config("spark.ui.showConsoleProgress",
                                                              "false")
    for key, value in REPLAY_SPARK_CONF.items():  # what a replaying site runs with
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        write_logs(logs, args.events, args.domains)
        timed = jobs(spark, logs, Path(tmp))
        seconds: dict[str, list[float]] = {name: [] for name in timed}
        for _ in range(args.runs):
            for name, job in timed.items():
                start = time.perf_counter()
                job()
                seconds[name].append(time.perf_counter() - start)
    print(f"events: {args.events}, domains: {args.domains}, runs: {args.runs} "
          f"(the first {WARM_UP} not counted)")
    print("| job | median (ms) | min (ms) |")
    print("|---|---:|---:|")
    for name, times in seconds.items():
        counted = times[WARM_UP:]
        print(f"| {name} | {statistics.median(counted) * 1000:,.0f} | "
              f"{min(counted) * 1000:,.0f} |")
    spark.stop()


if __name__ == "__main__":
    main()
