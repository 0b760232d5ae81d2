#!/usr/bin/env python3
"""What time coarsening would save on a link: several windows' partials in one message, or
merged into one coarser window, against one message a window, on generated CDN logs.

Usage: python scripts/bench_time_coarsening.py [--seconds 120] [--rate 1000] [--domains 2000]

sfo's exact partial of each 10 s window (``jetstream gen-logs``' generator, as
``scripts/bench_level_errors.py``) is summarised at each level of the query's ladder and
encoded as it is sent: key columns coded by a dictionary kept across the windows, as a push
stream's are, then compressed. Per window, in bytes:

- **one a message**: as a link sends them now (each message's payload compressed alone,
  plus its envelope: the message's other fields);
- **n together**: ``n`` consecutive windows in one message: their coded payloads compressed
  as one, one envelope (each window keeps its own rows, so its result is as exact as now,
  only later);
- **n merged**: the ``n`` windows merged into one window of ``n`` times the length, then
  summarised at the level (a coarser result: one window's rows for all ``n``).
"""

from __future__ import annotations

import argparse
import tempfile
import zlib
from pathlib import Path
from typing import Any

import jetstream as js
from jetstream import col
from jetstream.approx.levels import heaviest, ladder, ranking
from jetstream.approx.truncate import exact_partial, merge_bounded
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.keydict import KeyEncoder
from jetstream.dataplane.partials import PartialBatch, summarised
from jetstream.lab.loggen import LogSpec, write_logs
from jetstream.local import run_local
from jetstream.rewrite import distributed, partial_aggregate, site_part

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
BY_DOMAIN = LOGS.window(js.tumbling("10s"), watermark="5s").group_by("domain")
QUERIES = {
    "top-10 by requests": js.Query("top", BY_DOMAIN.agg(requests=js.count())
                                   .top_k(10, by="requests")),
    "requests, kB by domain": js.Query("counts", BY_DOMAIN.agg(
        requests=js.count(), kb=js.sum(col("bytes") / 1024))),
}
GROUPS = (2, 3, 6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--domains", type=int, default=2000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jetstream-time-coarsening-"))
    write_logs(work, ["sfo"], start_ms=0, duration_s=args.seconds, rate=args.rate,
               spec=LogSpec(domains=args.domains), seed=7)
    print(f"{args.seconds:g} s of logs at {args.rate:g} records/s at sfo ({args.domains} "
          "domains), 10 s windows; bytes per window\n")
    together = " | ".join(f"{n} together" for n in GROUPS)
    merged = " | ".join(f"{n} merged" for n in GROUPS)
    print(f"| query | level | one a message | {together} | {merged} |")
    print("|---|---|---:|" + "---:|" * (2 * len(GROUPS)))
    for title, query in QUERIES.items():
        for name, figures in levels_of(query, work):
            cells = " | ".join(f"{b:,.0f} ({b / figures[0]:.2f})" for b in figures[1:])
            print(f"| {title} | {name} | {figures[0]:,.0f} | {cells} |")


def levels_of(query: js.Query, work: Path) -> list[tuple[str, list[float]]]:
    optimized = distributed(query)
    partial = partial_aggregate(optimized)
    steps = ladder(ranking(optimized), partial, heaviest(optimized))
    site_query, _ = site_part(optimized)
    windows = [r.rows for r in sorted(run_local(site_query, work / "sfo"),
                                      key=lambda r: r.window_start)][1:-1]  # whole ones
    out = []
    for level in steps.levels:
        coded = _coded(query.name, [steps.degrade(exact_partial(rows), partial, level)
                                    for rows in windows], partial, level.index)
        figures = [sum(len(zlib.compress(p, 6)) + e for p, e in coded) / len(coded)]
        for n in GROUPS:
            groups = [coded[i:i + n] for i in range(0, len(coded) - n + 1, n)]
            figures.append(sum(len(zlib.compress(b"".join(p for p, _ in g), 6)) + g[0][1]
                               for g in groups) / (n * len(groups)))
        for n in GROUPS:
            groups = [windows[i:i + n] for i in range(0, len(windows) - n + 1, n)]
            merged = [steps.degrade(merge_bounded([exact_partial(w) for w in g], partial),
                                    partial, level) for g in groups]
            figures.append(sum(len(zlib.compress(p, 6)) + e for p, e in _coded(
                query.name, merged, partial, level.index)) / (n * len(groups)))
        out.append((level.name, figures))
    return out


def _coded(name: str, summaries: list[Any], partial: Any, level: int) -> list[tuple[bytes, int]]:
    """Each summary's payload with its keys coded by one dictionary kept across them, not
    compressed, and its message's envelope (the bytes besides the payload)."""
    coder = KeyEncoder()
    out = []
    for i, summary in enumerate(summaries):
        message = coder.encode(encode_batch(summarised(
            PartialBatch(name, (i * 10_000, (i + 1) * 10_000), "sfo", ()), summary, level),
            partial, compress=False))
        out.append((message.payload, message.ByteSize() - len(message.payload)))
    return out


if __name__ == "__main__":
    main()
