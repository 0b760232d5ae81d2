"""The backhaul baseline: what a user would build instead of JetStream for the CDN top-k.

Every site's raw logs are shipped (gzip) to the root datacenter, where one plain Spark
Structured Streaming job computes the query: requests with ``status < 500``, per 10 s window
and domain, the request count and the kilobytes served, then the 10 busiest domains per window.
It is written by hand, as its user would write it, for ``examples/cdn_topk.py`` only.
"""

from __future__ import annotations

import gzip
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jetstream.schema import CDN_LOG_SCHEMA
from jetstream.stage.compile import spark_schema

__all__ = ["BackhaulRun", "ship_gzipped", "top_domains"]

Window = tuple[int, int]


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

    windows: dict[Window, list[dict[str, Any]]]
    seconds: float
    records: int


def top_domains(spark: SparkSession, inbox: Path, checkpoint: Path, *, k: int = 10
                ) -> BackhaulRun:
    """Run the plain streaming job once over everything in ``inbox`` (``*.csv.gz``)."""
    logs = (spark.readStream.schema(spark_schema(CDN_LOG_SCHEMA)).option("header", True)
            .csv(str(inbox)))
    counts = (logs.where(F.col("status") < 500)
              .withColumn("t", F.timestamp_millis("ts")).withWatermark("t", "5 seconds")
              .groupBy(F.window("t", "10 seconds"), "domain")
              .agg(F.count(F.lit(1)).alias("requests"), F.sum(F.col("bytes") / 1024).alias("kb")))
    name = f"backhaul_{time.time_ns()}"
    start = time.perf_counter()
    (counts.writeStream.format("memory").queryName(name).outputMode("append")
     .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
     .start().awaitTermination())
    seconds = time.perf_counter() - start
    records = spark.read.schema(spark_schema(CDN_LOG_SCHEMA)).option("header", True) \
        .csv(str(inbox)).count()
    rows = spark.sql(f"select unix_millis(window.start) as s, unix_millis(window.end) as e, "
                     f"domain, requests, kb from {name}").collect()
    windows: dict[Window, list[dict[str, Any]]] = {}
    for row in rows:
        window = (int(row.s), int(row.e))
        windows.setdefault(window, []).append(
            {"domain": row.domain, "requests": row.requests, "kb": row.kb})
    top = {w: sorted(found, key=lambda r: (-r["requests"], r["domain"]))[:k]
           for w, found in windows.items()}
    return BackhaulRun(top, seconds, records)
