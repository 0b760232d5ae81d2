#!/usr/bin/env python3
"""Wide-area bytes per level of the three-level tree (topologies/tree-7.yaml).

Usage: python scripts/bench_tree_bytes.py [--duration 120] [--rate 200]

Generates ``--duration`` seconds of CDN logs at ``--rate`` records/s for each of the four
PoPs, replays them through tree-7 with real processes (four PoPs with Spark, two regions, a
root whose final top-k runs on three workers), then reads every site's Prometheus counter of
wide-area bytes sent per link (``jetstream_wan_sent_bytes_total``: partials and progress,
resends included). Prints a Markdown table for docs/benchmarks.md: bytes on the PoP ->
region links, on the region -> root links, and the raw logs they replace.
"""

from __future__ import annotations

import argparse
import tempfile
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from jetstream.control.launch import LocalCluster, free_port, replay
from jetstream.lab.loggen import LogSpec, write_logs

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "tree-7.yaml"
QUERY = ROOT / "examples" / "cdn_topk.py"
POPS = ("pop1", "pop2", "pop3", "pop4")
START_MS = 1_767_225_600_000


def sent_bytes(port: int) -> dict[str, float]:
    """A site's bytes sent per link, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {sample.labels["link"]: sample.value for family in text_string_to_metric_families(text)
            if family.name == "jetstream_wan_sent_bytes" for sample in family.samples
            if sample.name.endswith("_total")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=200.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-tree-"))
    inputs = work / "input"
    write_logs(inputs, POPS, start_ms=START_MS, duration_s=args.duration, rate=args.rate,
               spec=LogSpec(), seed=7)
    raw = sum(f.stat().st_size for pop in POPS for f in (inputs / pop).glob("*.csv"))
    ports = {name: free_port() for name in (*POPS, "eu", "us", "core")}
    with LocalCluster(TOPOLOGY, inputs, replay=True, window_deadline_s=120,
                      logs=work / "logs", metrics_port=lambda name: ports.get(name, 0)
                      ) as cluster:
        results = replay(cluster, QUERY, timeout_s=900)
        links = {link: value for name in ports for link, value in sent_bytes(ports[name]).items()}
    edge = sum(v for link, v in links.items() if link.startswith("pop"))
    middle = sum(v for link, v in links.items() if link.startswith(("eu", "us")))
    windows = len(results)
    print(f"{len(POPS)} PoPs x {args.duration:.0f} s at {args.rate:.0f} records/s: "
          f"{windows} windows, every one exact: {all(r.exact for r in results)}")
    print("| level | links | wide-area bytes | per window | raw logs / bytes |")
    print("|---|---|---:|---:|---:|")
    for level, total, names in (
            ("PoP -> region", edge, sorted(k for k in links if k.startswith("pop"))),
            ("region -> root", middle, sorted(k for k in links if k.startswith(("eu", "us"))))):
        print(f"| {level} | {', '.join(names)} | {total:,.0f} | {total / windows:,.0f} | "
              f"{raw / total:,.0f}x |")
    print(f"| raw logs at the PoPs | | {raw:,} | {raw / windows:,.0f} | 1x |")


if __name__ == "__main__":
    main()
