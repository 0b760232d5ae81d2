#!/usr/bin/env python3
"""What the merger's inbox costs a site that merges many children: one fsync'd write a batch.

Usage: python scripts/bench_inbox.py [--children 500] [--domains 2000] [--windows 5] [--dir D]

A site that merges writes every batch it takes in to its cube store's inbox before it acks it,
so that a restart merges it again (see ``QueryRun.receive``). This times, side by side in one
run, what a receiver does with each child's CDN top-k partial batch of one window: decode it
and merge it (the work without an inbox), then encode it and write it to the inbox (SQLite in
WAL mode with ``synchronous=FULL``: one fsync a batch) in a store under ``--dir`` (default: a
temporary folder; give a folder on the disk the sites' ``--state-dir`` will use). Prints
milliseconds a batch and a window's total for ``--children`` children, and the ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import jetstream as js
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.cubes import CubeStore
from jetstream.dataplane.merger import WindowMerger
from jetstream.dataplane.partials import PartialBatch
from jetstream.operators import WindowAggregate
from jetstream.rewrite import distributed

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
QUERY = js.Query("cdn-topk", LOGS.window(js.tumbling("10s")).group_by("domain")
                 .agg(requests=js.count(), kb=js.sum(js.col("bytes") / 1024))
                 .top_k(10, by="requests"))
WINDOW_MS = 10_000


def site_rows(domains: int, events: int, seed: int) -> tuple[WindowAggregate, list[dict]]:
    """The partial aggregate of the query and one site's partial rows for one window."""
    plan = distributed(QUERY).plan()
    node = plan.partial_aggregates()[0]
    partial = plan.op(node)
    assert isinstance(partial, WindowAggregate)
    rnd = random.Random(seed)
    weights = [1 / (i + 1) ** 1.1 for i in range(domains)]
    picks = rnd.choices(range(domains), weights, k=events)
    records = [{"ts": 1_000 + i % 9_000, "pop": "edge", "client_ip": "198.51.100.1",
                "domain": f"d{p}.example.com", "url": "/", "status": 200,
                "bytes": 500 + p % 4000, "latency_ms": 10.0, "cache": "HIT"}
               for i, p in enumerate(picks)]
    results = js.run_local(js.Query("site", js.Stream(plan.up_to(node))), records)
    return partial, list(results[0].rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=500)
    parser.add_argument("--domains", type=int, default=2000)
    parser.add_argument("--events", type=int, default=20_000, help="records a child a window")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    partial, rows = site_rows(args.domains, args.events, seed=1)
    children = [f"edge{i}" for i in range(args.children)]
    folder = args.dir or Path(tempfile.mkdtemp(prefix="jetstream-inbox-bench-"))
    store = CubeStore(folder / "inbox-bench.sqlite")
    merger = WindowMerger(partial, children, deadline_s=60.0)
    size = len(encode_batch(PartialBatch(QUERY.name, (0, WINDOW_MS), "edge0", tuple(rows)),
                            partial).SerializeToString())
    print(f"{args.children} children, {len(rows)} partial rows a batch ({size:,} bytes), "
          f"{args.windows} windows; store {store.path}")
    merge_s: list[float] = []
    inbox_s: list[float] = []
    for w in range(args.windows):
        window = (w * WINDOW_MS, (w + 1) * WINDOW_MS)
        wire = [encode_batch(PartialBatch(QUERY.name, window, child, tuple(rows)), partial)
                for child in children]
        started = time.perf_counter()
        batches = [decode_batch(message, partial) for message in wire]
        for batch in batches:
            merger.add(batch)
        merge_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        for batch in batches:
            store.receive(encode_batch(batch, partial))
        inbox_s.append(time.perf_counter() - started)
    merge, inbox = statistics.median(merge_s), statistics.median(inbox_s)
    print(f"decode + merge:  {merge * 1000 / args.children:7.2f} ms a batch, "
          f"{merge:6.2f} s a window (median of {args.windows})")
    print(f"encode + inbox:  {inbox * 1000 / args.children:7.2f} ms a batch, "
          f"{inbox:6.2f} s a window")
    print(f"inbox / merge:   {inbox / merge:7.2f}x; the inbox takes "
          f"{inbox / (WINDOW_MS / 1000):.0%} of a 10 s window")


if __name__ == "__main__":
    main()
