"""The CDN query per minute: the busiest domains of each minute, worldwide.

Its steps before the window are those of cdn_topk.py, its key and aggregate among that query's,
and a minute is six of its 10 s windows: so while (or after) cdn_topk.py runs, the past is
answered from the cubes its sites keep, without reading a log again:

    jetstream history --query examples/cdn_minutes.py --since 1h
"""

import jetstream as js
from jetstream import col

logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)

per_minute = (
    logs.where(col("status") < 500)
    .with_column("kb", col("bytes") / 1024)
    .window(js.tumbling("1m"))
    .group_by("domain")
    .agg(requests=js.count())
    .top_k(10, by="requests")
)

query = js.Query("cdn-minutes", per_minute)
