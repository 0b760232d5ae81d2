#!/usr/bin/env python3
"""Planning time and tree depth of the CDN top-k query on generated topologies.

Usage: python scripts/bench_planner.py [--repeat 3]

Prints a Markdown table for docs/benchmarks.md: for each size, the best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from jetstream.aggtree.generate import generate_topology
from jetstream.aggtree.planner import plan_query
from jetstream.queryfile import load_query

ROOT = Path(__file__).resolve().parent.parent
SIZES = [(45, 4, 2), (190, 8, 2), (480, 16, 3), (950, 40, 5)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    query = load_query(ROOT / "examples" / "cdn_topk.py")
    print("| sites | PoPs | planning time (s) | tree depth | WAN / raw bytes |")
    print("|---:|---:|---:|---:|---:|")
    for pops, regions, continents in SIZES:
        topology = generate_topology(pops, regions, continents, seed=2014)
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            plan = plan_query(query, topology)
            best = min(best, time.perf_counter() - start)
        ratio = plan.wan_bytes_per_s / plan.raw_bytes_per_s
        print(f"| {len(topology.sites)} | {pops} | {best:.2f} | {plan.depth()} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
