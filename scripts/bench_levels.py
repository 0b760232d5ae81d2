#!/usr/bin/env python3
"""Wide-area bytes and top-10 accuracy of every degradation level, and of TPUT, on CDN-like data.

Usage: python scripts/bench_levels.py [--sites 8] [--domains 5000] [--events 20000] [--windows 5]

Each site sees ``--events`` requests a window over ``--domains`` domains: half of them follow
one worldwide Zipf(1.1) popularity, half the site's own regional Zipf(1.1) order. For every
level of the CDN top-k query (exact, then truncation to 32k/8k/2k keys, then frequent-items
sketches), every site's window is encoded as the partial batch it would send and decoded as its
parent would; the root merges them and reports the top 10 with bounds. Prints bytes per window
(all sites) and the accuracy against the exact answer: recall of the top 10, the largest
relative error of a reported count (lower bound against the truth), the largest stated bound,
and how many rows were guaranteed. TPUT's line counts the rows its rounds ship and the keys
they ask for (``jetstream.approx.rounds``, as links run them), at 16 bytes each, against the
exact partials.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from typing import Any

import jetstream as js
from jetstream.approx.levels import Ranking, ranking
from jetstream.approx.rounds import answer, exact_rows, first_answer, next_asks
from jetstream.approx.truncate import BoundedPartial, exact_partial, merge_bounded, top_k_bounds
from jetstream.lab.bench import through_levels
from jetstream.operators import WindowAggregate

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
QUERY = js.optimize(js.Query("cdn-topk", LOGS.window(js.tumbling("10s")).group_by("domain")
                             .agg(requests=js.count()).top_k(10, by="requests")))
PAIR_BYTES = 16


def site_counts(rnd: random.Random, sites: int, domains: int, events: int
                ) -> list[Counter[str]]:
    base = [1 / (i + 1) ** 1.1 for i in range(domains)]
    out = []
    for _ in range(sites):
        regional = list(range(domains))
        rnd.shuffle(regional)
        weights = list(base)  # the worldwide order is the domains' numbering
        for popularity, domain in enumerate(regional):
            weights[domain] += base[popularity]
        picks = rnd.choices(range(domains), weights, k=events)
        out.append(Counter(f"d{p}.example.com" for p in picks))
    return out


def tput(partial: WindowAggregate, rank: Ranking, children: list[list[dict[str, Any]]]
         ) -> tuple[list[str], int]:
    """TPUT's rounds over the children's rows: the top-k's keys, and how many rows and asked
    keys crossed the links."""
    inputs: dict[int, BoundedPartial] = {}
    sent: dict[int, frozenset[Any]] = {}
    for i, rows in enumerate(children):
        inputs[i], sent[i] = first_answer(rows, rank.k, partial, rank.by)
    asked = 0
    while asks := next_asks(inputs, partial, rank.by, rank.k):
        for i, ask in asks.items():
            asked += len(ask.keys)
            inputs[i], sent[i] = answer(children[i], sent[i], ask, partial, rank.by)
    exact = exact_partial(exact_rows(merge_bounded(inputs.values(), partial)))
    top = top_k_bounds(exact, partial, rank.by, rank.k)
    return [row["domain"] for row in top.rows], sum(map(len, sent.values())) + asked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=8)
    parser.add_argument("--domains", type=int, default=5000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args()
    plan = QUERY.plan()
    partial = plan.op(plan.partial_aggregates()[0])
    assert isinstance(partial, WindowAggregate)
    rank = ranking(QUERY)
    assert rank is not None
    count = dict(partial.aggregates)["requests"]
    rnd = random.Random(11)
    totals: dict[str, list[Any]] = {}
    tput_bytes = exact_bytes = 0
    for _ in range(args.windows):
        sites = site_counts(rnd, args.sites, args.domains, args.events)
        truth = Counter[str]()
        for c in sites:
            truth.update(c)
        true_top = sorted(truth.items(), key=lambda kv: (-kv[1], kv[0]))[:rank.k]
        kth = true_top[-1][1]
        rows = [[{"domain": d, "requests": n} for d, n in c.items()] for c in sites]
        for level, size, top in through_levels(partial, rank, rows):
            got = [row["domain"] for row in top.rows]
            recall = len(set(got) & {d for d, _ in true_top}) / rank.k
            error = max(abs(truth[d] - count.extract(row["requests"])) / truth[d]
                        for d, row in zip(got, top.rows, strict=True))
            sure = sum(top.guaranteed)
            assert all(truth[d] >= kth for d, g in zip(got, top.guaranteed, strict=True) if g)
            entry = totals.setdefault(level.name, [0, 0.0, 0.0, 0.0, 0])
            entry[0] += size
            entry[1] = min(entry[1] or 1.0, recall)
            entry[2] = max(entry[2], error)
            entry[3] = max(entry[3], top.error_bound)
            entry[4] += sure
            if level.index == 0:
                exact_bytes += size
        top, shipped = tput(partial, rank, rows)
        assert top == [d for d, _ in true_top]
        tput_bytes += shipped * PAIR_BYTES
    n = args.windows
    print(f"sites: {args.sites}, domains: {args.domains}, requests per site and window: "
          f"{args.events}, windows: {n}")
    print("| level | bytes per window | vs exact | top-10 recall (worst window) | "
          "max relative count error | max stated bound | guaranteed rows per window |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (size, recall, error, bound, sure) in totals.items():
        print(f"| {name} | {size / n:,.0f} | {size / exact_bytes:.3f} | {recall:.2f} | "
              f"{error:.4f} | {bound:.4f} | {sure / n:.1f} |")
    print(f"| TPUT (exact, 3 rounds) | {tput_bytes / n:,.0f} | {tput_bytes / exact_bytes:.3f} "
          f"| 1.00 | 0 | 0 | 10 |")


if __name__ == "__main__":
    main()
