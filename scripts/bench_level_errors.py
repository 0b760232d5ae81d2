#!/usr/bin/env python3
"""Bytes against realised error for every degradation level of every aggregate kind that has
levels, on generated CDN logs; and what measuring a link's profile costs.

Usage: python scripts/bench_level_errors.py [--seconds 120] [--rate 1000] [--domains 2000]

The three sites of ``local-3dc`` (ams the root, sfo and sin its edges) each log ``--rate``
requests a second for ``--seconds`` (``jetstream gen-logs``' generator: Zipf(1.1) domains, a
third of each site's traffic in its own regional order). For each query below and each level
of its ladder, every edge site's exact partial of each 10 s window is summarised at that
level, encoded as it would be sent (compressed, its keys coded by a key dictionary kept
across the windows, as a push stream does), decoded and merged at the root with the root's
own exact partial, and finished as the root finishes it (``RootResults``): the result's
stated ``error_bound``, against its realised error next to the reference executor's answer:

- top-10 domains by requests: the largest relative error of a reported count (its lower
  bound against the truth), and the recall of the true top 10;
- requests and kB by domain (no top-k): the share of the window's requests the result's rows
  leave out (its lower bounds against the total);
- requests and kB by url, declared to roll up to the url's domain: the same share, at the
  result's own keys (a rolled-up result's rows are domains, exact there);
- distinct clients by domain: the largest relative error of a domain's distinct count;
- the 95th percentile of latency by domain: the largest rank error of a domain's value
  (how far, as a share of the domain's values in the window, the value returned ranks from
  the reference executor's).

Each figure is the worst window's; bytes are per window, both edges together. Then, for the
count by domain, what :class:`~jetstream.approx.profile.Profile` costs a sender per window
it measures (CPU time, on the calling thread).
"""

from __future__ import annotations

import argparse
import bisect
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import jetstream as js
from jetstream import col, metrics
from jetstream.approx.levels import heaviest, ladder, ranking
from jetstream.approx.profile import Profile
from jetstream.approx.truncate import exact_partial
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.finish import RootResults
from jetstream.dataplane.keydict import KeyDecoder, KeyEncoder
from jetstream.dataplane.merger import WindowMerger
from jetstream.dataplane.partials import PartialBatch, summarised
from jetstream.events import Rejects, read_streams
from jetstream.lab.loggen import LogSpec, write_logs
from jetstream.local import run_local
from jetstream.results import WindowResult
from jetstream.rewrite import distributed, partial_aggregate, site_part

SITES = ("ams", "sfo", "sin")
ROOT, EDGES = "ams", ("sfo", "sin")
LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
BY_DOMAIN = LOGS.window(js.tumbling("10s"), watermark="5s").group_by("domain")
QUERIES = {
    "top-10 by requests": js.Query("top", BY_DOMAIN.agg(requests=js.count())
                                   .top_k(10, by="requests")),
    "requests, kB by domain": js.Query("counts", BY_DOMAIN.agg(
        requests=js.count(), kb=js.sum(col("bytes") / 1024))),
    "distinct clients by domain": js.Query("clients", BY_DOMAIN.agg(
        clients=js.count_distinct("client_ip"))),
    "p95 latency by domain": js.Query("p95", BY_DOMAIN.agg(
        p95=js.quantile("latency_ms", 0.95))),
    "requests, kB by url, rolls up to its domain": js.Query(
        "urls", LOGS.window(js.tumbling("10s"), watermark="5s")
        .group_by("url", rollup={"url": col("url").url_domain()})
        .agg(requests=js.count(), kb=js.sum(col("bytes") / 1024))),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--domains", type=int, default=2000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jetstream-level-errors-"))
    write_logs(work, list(SITES), start_ms=0, duration_s=args.seconds, rate=args.rate,
               spec=LogSpec(domains=args.domains), seed=7)
    print(f"{args.seconds:g} s of logs at {args.rate:g} records/s at each of {', '.join(SITES)} "
          f"({args.domains} domains); 10 s windows, the worst window's figures\n")
    print("| query | level | bytes per window | vs exact | stated bound | realised error | "
          "recall |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for title, query in QUERIES.items():
        for row in levels_of(query, work):
            print(f"| {title} | {row['level']} | {row['bytes']:,.0f} | {row['share']:.3f} | "
                  f"{row['stated']:.4f} | {row['realised']:.4f} | {row['recall']} |")
    profile_cost(QUERIES["requests, kB by domain"], work)


def site_partials(query: js.Query, work: Path) -> dict[str, dict[tuple[int, int], list[Any]]]:
    site_query, _ = site_part(distributed(query))
    return {site: {(r.window_start, r.window_end): r.rows for r in run_local(site_query,
                                                                            work / site)}
            for site in SITES}


def levels_of(query: js.Query, work: Path) -> list[dict[str, Any]]:
    optimized = distributed(query)
    partial = partial_aggregate(optimized)
    rank = ranking(optimized)
    steps = ladder(rank, partial, heaviest(optimized))
    partials = site_partials(query, work)
    events = {site: list(_events(work / site)) for site in SITES}
    truth = {(r.window_start, r.window_end): r for r in run_local(query, work)}
    counts = {(r.window_start, r.window_end): {row["domain"]: row["requests"] for row in r.rows}
              for r in run_local(QUERIES["requests, kB by domain"], work)}
    windows = sorted(set(partials[ROOT]) & set(partials[EDGES[0]]) & set(partials[EDGES[1]]))
    windows = windows[1:-1]  # whole windows only
    rows = []
    exact_bytes = None
    for level in steps.levels:
        coders = {edge: (KeyEncoder(), KeyDecoder()) for edge in EDGES}
        size = stated = realised = 0.0
        recall = 1.0
        for window in windows:
            merger = WindowMerger(partial, [ROOT, *EDGES], deadline_s=0)
            merger.add(PartialBatch(query.name, window, ROOT, tuple(partials[ROOT][window])))
            for edge in EDGES:
                summary = steps.degrade(exact_partial(partials[edge][window]), partial, level)
                message = encode_batch(summarised(
                    PartialBatch(query.name, window, edge, ()), summary, level.index), partial)
                coder, decoder = coders[edge]
                message = coder.encode(message)
                size += message.ByteSize()
                merger.add(decode_batch(message, partial, decoder))
            (merged,) = merger.ready()
            result = _finished(optimized, partial, rank, merged)
            stated = max(stated, result.error_bound or 0.0)
            error, found = _realised(query.name, result, truth[window], events, window,
                                     counts[window])
            realised, recall = max(realised, error), min(recall, found)
        per_window = size / len(windows)
        exact_bytes = exact_bytes or per_window
        rows.append({"level": level.name, "bytes": per_window, "share": per_window / exact_bytes,
                     "stated": stated, "realised": realised,
                     "recall": f"{recall:.2f}" if rank is not None else "-"})
    return rows


def _finished(query: js.Query, partial: Any, rank: Any, merged: Any) -> WindowResult:
    """The result the root makes of a merged window."""
    published: list[WindowResult] = []
    RootResults(query, partial, rank, metrics.RunMetrics(ROOT, query.name),
                lambda _, out, __: published.extend(out)).publish([merged], False, SITES)
    (result,) = published
    return result


def _realised(name: str, got: WindowResult, want: WindowResult,
              events: dict[str, list[dict[str, Any]]], window: tuple[int, int],
              counts: dict[str, int]) -> tuple[float, float]:
    """The realised error of ``got`` against ``want`` (see the module docstring; ``counts``:
    each domain's true requests in the window), and the recall of a top-k."""
    if name == "top":
        truth = {row["domain"]: row for row in want.rows}
        worst = max(abs(row.get("lb", row["requests"]) - counts[row["domain"]])
                    / counts[row["domain"]] for row in got.rows)
        recall = len({r["domain"] for r in got.rows} & set(truth)) / len(truth)
        return worst, recall
    if name in ("counts", "urls"):  # (urls: at the result's own keys, rolled up or not)
        total = sum(row["requests"] for row in want.rows)
        held = sum(row.get("lb", row["requests"]) for row in got.rows)
        return (total - held) / total, 1.0
    truth = {row["domain"]: row for row in want.rows}
    if name == "clients":
        return max(abs(row["clients"] - truth[row["domain"]]["clients"])
                   / truth[row["domain"]]["clients"] for row in got.rows), 1.0
    values: dict[str, list[float]] = defaultdict(list)
    for site_events in events.values():
        for e in site_events:
            if window[0] <= e["ts"] < window[1]:
                values[e["domain"]].append(e["latency_ms"])
    worst = 0.0
    for row in got.rows:
        ordered = sorted(values[row["domain"]])

        def ranks(value: float, ordered: list[float] = ordered) -> tuple[float, float]:
            n = len(ordered)
            return bisect.bisect_left(ordered, value) / n, bisect.bisect_right(ordered, value) / n

        (lo, hi), (want_lo, want_hi) = ranks(row["p95"]), ranks(truth[row["domain"]]["p95"])
        worst = max(worst, max(0.0, lo - want_hi, want_lo - hi))
    return worst, 1.0


def _events(folder: Path) -> list[dict[str, Any]]:
    return [e for stream in read_streams(folder, js.CDN_LOG_SCHEMA, Rejects())
            for _, e in stream]


def profile_cost(query: js.Query, work: Path) -> None:
    optimized = distributed(query)
    partial = partial_aggregate(optimized)
    steps = ladder(None, partial, heaviest(optimized))
    profile = Profile(steps, partial, every=1)
    windows = site_partials(query, work)["sfo"]
    template = PartialBatch(query.name, (0, 1), "sfo", ())
    spent = []
    for rows in windows.values():
        started = time.thread_time()
        profile.offer(exact_partial(rows), lambda summary, index: encode_batch(
            summarised(template, summary, index), partial).ByteSize())
        spent.append((len(rows), time.thread_time() - started))
    keys = sum(n for n, _ in spent) / len(spent)
    print(f"\nprofile of '{query.name}' at sfo: {sum(s for _, s in spent) / len(spent) * 1000:.1f}"
          f" ms of CPU per measured window ({keys:.0f} keys a window, every level)")
    for figures in profile.figures():
        print(f"  {figures.name}: {figures.bytes:,.0f} B, error {figures.error:.3f}")


if __name__ == "__main__":
    main()
