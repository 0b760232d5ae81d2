#!/usr/bin/env python3
"""A chaos soak: the CDN top-k on a three-level tree under random kills and link cuts.

Usage: python scripts/chaos_soak.py [--duration 1800] [--rate 50] [--every 60]
       [--topology topologies/tree-7.yaml] [--seed 0] [--work DIR]

Starts the controller and every site of the topology as local processes, writes ``--rate``
records/s at each source site, and about every ``--every`` seconds SIGKILLs a site, a worker,
the root or the controller (started again 5-20 s later), or cuts the way into a site for
5-20 s. When the logs stop it waits for every window to settle, then compares each window's
newest result with the reference executor over every log written, and prints the faults,
the windows equal / missing / short / over-counted, and memory over the run (see
docs/benchmarks.md). Exits 1 unless every window equals the reference.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from jetstream.lab.chaos import chaos_soak
from jetstream.queryfile import load_query

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0, metavar="S")
    parser.add_argument("--rate", type=float, default=50.0, metavar="N",
                        help="records per second at each source site (default 50)")
    parser.add_argument("--every", type=float, default=60.0, metavar="S",
                        help="seconds between faults, on average (default 60)")
    parser.add_argument("--topology", type=Path, default=ROOT / "topologies" / "tree-7.yaml")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, metavar="DIR",
                        help="where logs and state go (default: a temp folder)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="jetstream-chaos-"))
    report = chaos_soak(args.topology, load_query(ROOT / "examples" / "cdn_topk.py"), work,
                        duration_s=args.duration, rate=args.rate, every_s=args.every,
                        seed=args.seed,
                        say=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"chaos soak: {args.duration:.0f}s on {args.topology.name} at {args.rate:g} "
          f"records/s per source site, {len(report.faults)} faults, work in {work}")
    kinds = sorted({f.kind for f in report.faults})
    print("faults: " + ", ".join(f"{sum(f.kind == k for f in report.faults)} {k}"
                                 for k in kinds))
    print(f"windows: {report.windows}, equal to run_local {report.equal}, missing "
          f"{len(report.missing)}, short {len(report.short)}, over-counted "
          f"{len(report.over)}, otherwise different {len(report.other)}; given final and "
          f"exact but unlike run_local {len(report.final_unlike)}")
    sixth = max(1, -(-len(report.memory_mb) // 6))
    for i in range(0, len(report.memory_mb), sixth):
        part = report.memory_mb[i:i + sixth]
        print(f"memory, {part[0][0]:5.0f}-{part[-1][0]:5.0f}s: site processes "
              f"{sum(p for _, p, _ in part) / len(part):,.0f} MB, Spark JVMs "
              f"{sum(j for _, _, j in part) / len(part):,.0f} MB (mean of {len(part)} samples)")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
