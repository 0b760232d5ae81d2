"""The CDN top-k query: the 10 busiest domains every 10 seconds, worldwide."""

import jetstream as js
from jetstream import col

logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)

top_domains = (
    logs.where(col("status") < 500)
    .with_column("kb", col("bytes") / 1024)
    # Wait 5 s for records out of order; send each window on 2 s after its end (the logs are
    # at most 2 s out of order), while it is still open, so that a thin link carries it
    # before it closes (results unchanged).
    .window(js.tumbling("10s"), watermark="5s", early="2s")
    .group_by("domain")
    .agg(requests=js.count(), kb=js.sum("kb"))
    .top_k(10, by="requests")
)

query = js.Query("cdn-topk", top_domains, slo=js.SLO(max_latency="3s", max_error=0.01))
