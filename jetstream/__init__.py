"""JetStream-py: write a streaming query once, run it over many sites and thin wide-area links.

The user-facing DSL::

    import jetstream as js
    from jetstream import col

    logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
    q = (logs.where(col("status") < 500)
             .window(js.tumbling("10s"), watermark="5s")
             .group_by("domain")
             .agg(requests=js.count())
             .top_k(10, by="requests"))
    results = js.run_local(js.Query("cdn-topk", q), "logs/")
"""

from __future__ import annotations

from jetstream.aggregates import Aggregate, AggregateKind
from jetstream.dsl import SLO, GroupedStream, Query, Stream, source
from jetstream.errors import (
    ControlPlaneError,
    DataError,
    JetstreamError,
    PlacementError,
    PlanError,
    RewriteError,
)
from jetstream.expr import Expr, Monotonicity, col, lit
from jetstream.functions import (
    approx_count_distinct,
    approx_quantile,
    avg,
    count,
    count_distinct,
    max,
    min,
    quantile,
    sum,
    top_k,
)
from jetstream.local import LocalRun, RunStats, run_local
from jetstream.plan import LogicalPlan
from jetstream.results import WindowResult
from jetstream.rewrite import explain, optimize
from jetstream.schema import CDN_LOG_SCHEMA, DataType, Field, Schema
from jetstream.tables import Table, table
from jetstream.windows import sliding, tumbling

__version__ = "0.1.0"

__all__ = [
    "CDN_LOG_SCHEMA",
    "SLO",
    "Aggregate",
    "AggregateKind",
    "ControlPlaneError",
    "DataError",
    "DataType",
    "Expr",
    "Field",
    "GroupedStream",
    "JetstreamError",
    "LocalRun",
    "LogicalPlan",
    "Monotonicity",
    "PlacementError",
    "PlanError",
    "Query",
    "RewriteError",
    "RunStats",
    "Schema",
    "Stream",
    "Table",
    "WindowResult",
    "approx_count_distinct",
    "approx_quantile",
    "avg",
    "col",
    "count",
    "count_distinct",
    "explain",
    "lit",
    "max",
    "min",
    "optimize",
    "quantile",
    "run_local",
    "sliding",
    "source",
    "sum",
    "table",
    "top_k",
    "tumbling",
]
