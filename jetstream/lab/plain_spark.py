"""The load bench's six standing queries as a Spark user writes them: by hand, one Structured
Streaming query each, every one reading the folder for itself.

These are :data:`jetstream.lab.load_bench.QUERIES` in plain PySpark, what the baseline of
``jetstream bench --load`` runs (``python -m jetstream.lab.baseline watch --queries N``): the
same 10 s tumbling windows on the records' ``ts`` with a 5 s watermark, Spark's append mode
(a window comes out once the watermark passes its end), the top-k ranked in Python per window
as a dashboard's user does. Two of them use Spark's own sketches (``approx_count_distinct``,
``percentile_approx``), not DataSketches': their windows are not compared with ``run_local``
(``exact`` False).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from jetstream.schema import CDN_LOG_SCHEMA
from jetstream.stage.compile import spark_schema

__all__ = ["PLAIN_QUERIES", "PlainQuery", "logs"]

Window = tuple[int, int]
Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class PlainQuery:
    """One query: its name (as in ``QUERIES``), its group keys and aggregates over the
    watermarked logs (``where`` first, if any), and the top ``k`` by ``by`` (0: every row)."""

    name: str
    keys: tuple[str, ...]
    aggregates: Callable[[], list[Column]]
    where: Callable[[], Column] | None = None
    k: int = 0
    by: str = ""
    exact: bool = True

    def counts(self, logs: DataFrame) -> DataFrame:
        """The streaming aggregation: a row per window and key, the window as ``s`` and ``e``
        (epoch ms)."""
        if self.where is not None:
            logs = logs.where(self.where())
        grouped = logs.groupBy(F.window("t", "10 seconds"), *self.keys).agg(*self.aggregates())
        return grouped.select(F.unix_millis(F.col("window.start")).alias("s"),
                              F.unix_millis(F.col("window.end")).alias("e"), *self.keys,
                              *(c for c in grouped.columns if c not in ("window", *self.keys)))

    def rows(self, collected: Sequence[Any]) -> dict[Window, Rows]:
        """A micro-batch's rows as each window's result rows: ranked and cut to ``k``, or in
        key order (as ``run_local`` gives them)."""
        windows: dict[Window, Rows] = {}
        for row in collected:
            values = row.asDict()
            window = (int(values.pop("s")), int(values.pop("e")))
            windows.setdefault(window, []).append(values)
        for window, found in windows.items():
            found.sort(key=lambda r: tuple(r[key] for key in self.keys))
            if self.k:
                windows[window] = sorted(found, key=lambda r: -r[self.by])[:self.k]
        return windows


def logs(spark: SparkSession, folder: str, **options: Any) -> DataFrame:
    """The CDN logs landing in ``folder`` (a path or a glob; CSV with a header, gzipped or
    not), their event time ``t`` watermarked 5 s behind; ``options`` of the file source."""
    return (spark.readStream.schema(spark_schema(CDN_LOG_SCHEMA)).option("header", True)
            .options(**options).csv(folder).withColumn("t", F.timestamp_millis("ts"))
            .withWatermark("t", "5 seconds"))


def _requests() -> Column:
    return F.count(F.lit(1)).alias("requests")


#: ``QUERIES`` in order (the first N run with ``--queries N``).
PLAIN_QUERIES: tuple[PlainQuery, ...] = (
    PlainQuery("cdn-topk", ("domain",),
               lambda: [_requests(), F.sum(F.col("bytes") / 1024).alias("kb")],
               where=lambda: F.col("status") < 500, k=10, by="requests"),
    PlainQuery("bytes-by-pop", ("pop",),
               lambda: [_requests(), F.sum("bytes").alias("bytes")]),
    PlainQuery("status-counts", ("status",), lambda: [_requests()]),
    PlainQuery("top-errors", ("domain",), lambda: [F.count(F.lit(1)).alias("errors")],
               where=lambda: F.col("status") >= 400, k=10, by="errors"),
    PlainQuery("clients-by-pop", ("pop",),
               lambda: [F.approx_count_distinct("client_ip").alias("clients")], exact=False),
    PlainQuery("latency-p99", (),
               lambda: [F.percentile_approx("latency_ms", 0.99).alias("p99")], exact=False),
)

