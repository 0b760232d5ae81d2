#!/usr/bin/env python3
"""What a question about the past costs on the wide area: a history query answered from the
sites' cubes, against shipping that period's raw logs (plain and gzipped).

Usage: python scripts/bench_history.py [--rate 200] [--minutes 5]

Writes ``--minutes`` of CDN logs ending now (``--rate`` records/s at each site of
local-3dc), runs the CDN top-k (examples/cdn_topk.py) live over them on real processes (the
controller and three sites, each with its Spark stage and cube store), waits until every
window is in and the sites have rolled their windows up, then asks the past from the cubes:
the top 10 of each minute (examples/cdn_minutes.py) and of each 10 s (the same at 10 s),
over the whole period, and checks each answer against the reference executor over the same
logs. It prints the bytes the sites sent for each (the ReadCubes answers, as the controller
received them), against the period's raw CSV lines and their gzip (what the backhaul would
ship: every site's, ams's own included, as the cubes are every site's).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from pathlib import Path

import jetstream as js
from jetstream.control.codec import result_from_proto
from jetstream.control.launch import LocalCluster
from jetstream.lab.loggen import LogSpec, write_logs
from jetstream.queryfile import load_query

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "local-3dc.yaml"
SITES = ("ams", "sfo", "sin")
MINUTE = 60_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="records/s at each site")
    parser.add_argument("--minutes", type=int, default=5, help="minutes of logs")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="jetstream-history-"))
    now = time.time_ns() // 1_000_000
    start = now - now % MINUTE - args.minutes * MINUTE
    # In event-time order, none late: the live stages read each site's file in one
    # micro-batch, where nothing is late, and the reference reads it record by record.
    write_logs(folder / "input", SITES, start_ms=start, duration_s=args.minutes * 60,
               rate=args.rate, spec=LogSpec(out_of_order_s=0.0, late_fraction=0.0))
    raw = sum(p.stat().st_size for p in (folder / "input").rglob("*.csv"))
    zipped = sum(len(gzip.compress(p.read_bytes(), 6))
                 for p in (folder / "input").rglob("*.csv"))
    stored = ROOT / "examples" / "cdn_topk.py"
    live = js.run_local(load_query(stored), folder / "input")
    print(f"{args.minutes} min of logs at {args.rate:g} records/s a site: {raw:,} bytes raw, "
          f"{zipped:,} gzipped", flush=True)
    with LocalCluster(TOPOLOGY, folder / "input", idle_timeout_s=2,
                      logs=folder / "logs") as cluster:
        cluster.client.submit(stored)
        seen = set()
        for result in cluster.client.results("cdn-topk", timeout_s=600):
            seen.add(result.window_start)
            if len(seen) >= len(live):
                break
        time.sleep(12)  # one more round of rollups at every site (every 10 s)
        minutes = ROOT / "examples" / "cdn_minutes.py"
        tens = folder / "cdn_tens.py"
        tens.write_text(minutes.read_text().replace('tumbling("1m")', 'tumbling("10s")')
                        .replace('"cdn-minutes"', '"cdn-tens"'))
        for path in (minutes, tens):
            response = cluster.client.history(path, start, now)
            got = [result_from_proto(r) for r in response.results]
            want = js.run_local(load_query(path), folder / "input")
            same = [(r.window_start, r.rows) for r in got] == [
                (r.window_start, r.rows) for r in want]
            print(f"{path.name}: {len(got)} windows from the "
                  f"{response.resolution_ms // 1000} s cubes of {response.stored}: "
                  f"{response.bytes:,} bytes ({response.bytes / zipped:.1%} of gzip, "
                  f"{response.bytes / raw:.2%} of raw); equal to the reference: {same}",
                  flush=True)
            if not same:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
