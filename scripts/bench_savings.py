#!/usr/bin/env python3
"""The savings table: raw log bytes against aggregated bytes, by window length and grouping.

Usage: python scripts/bench_savings.py [--rate 100] [--hours 1] [--seed 0]

Generates ``--hours`` of one PoP's CDN logs (``jetstream.lab.loggen``, default spec) and, for
windows of 5 s, 1 min, 5 min and 1 h, encodes each window's exact partials -- per domain, or
per full URL, the request count and the bytes served -- as the partial batches a site sends
(``jetstream.dataplane.codec.encode_batch``: columnar JSON, zlib). Prints raw CSV bytes over
partial bytes for each, next to JetStream's published CoralCDN figures.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

import numpy as np

import jetstream as js
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.partials import PartialBatch
from jetstream.lab.loggen import LogSpec, generate, to_csv
from jetstream.rewrite import distributed, partial_aggregate

START_MS = 1_767_225_600_000
WINDOWS = {"5 s": 5_000, "1 min": 60_000, "5 min": 300_000, "1 h": 3_600_000}
#: JetStream (NSDI'14), domain-level aggregation of CoralCDN logs; full URLs: 1.4x to 2.0x.
PUBLISHED = {"5 s": "18x", "1 min": "50x", "5 min": "80x", "1 h": "129x"}


def partial_bytes(columns: Mapping[str, np.ndarray], key: str, window_ms: int) -> int:
    logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
    query = js.Query("savings", logs.window(js.tumbling(f"{window_ms // 1000}s"))
                     .group_by(key).agg(requests=js.count(), bytes=js.sum("bytes")))
    aggregate = partial_aggregate(distributed(query))
    windows = (columns["ts"] - START_MS) // window_ms
    total = 0
    for w in np.unique(windows):
        here = windows == w
        keys, inverse, counts = np.unique(columns[key][here], return_inverse=True,
                                          return_counts=True)
        sums = np.bincount(inverse, weights=columns["bytes"][here]).astype(np.int64)
        rows = tuple({key: k, "requests": int(n), "bytes": [int(n), int(b), []]}
                     for k, n, b in zip(keys.tolist(), counts, sums, strict=True))
        start = START_MS + int(w) * window_ms
        batch = PartialBatch("savings", (start, start + window_ms), "pop", rows)
        total += encode_batch(batch, aggregate).ByteSize()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="records/s (default 100)")
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    spec = LogSpec()
    columns = generate("pop1", START_MS, args.hours * 3600, args.rate, spec, args.seed)
    # Late and out-of-order records are stamped before the start: keep the period whole.
    inside = columns["ts"] >= START_MS
    columns = {name: values[inside] for name, values in columns.items()}
    raw = len(to_csv(columns).encode())
    print(f"one PoP, {len(columns['ts']):,} records over {args.hours:g} h at {args.rate:g}/s, "
          f"{spec.domains} domains (Zipf {spec.zipf}), {spec.urls_per_domain} URLs each; "
          f"raw CSV {raw:,} bytes")
    print("| window | domains: raw / partials | JetStream on CoralCDN (domains) "
          "| full URLs: raw / partials |")
    print("|---|---:|---:|---:|")
    for name, ms in WINDOWS.items():
        by_domain = raw / partial_bytes(columns, "domain", ms)
        by_url = raw / partial_bytes(columns, "url", ms)
        print(f"| {name} | {by_domain:.1f}x | {PUBLISHED[name]} | {by_url:.1f}x |")


if __name__ == "__main__":
    main()
