#!/usr/bin/env python3
"""A soak run of the CDN top-k on local-3dc: live logs at a steady rate, sampled as it goes.

Usage: python scripts/soak.py [--duration 600] [--rate 200] [--sample 30] [--work DIR]

Starts the controller and the three sites as local processes (as ``jetstream demo`` does),
writes ``--rate`` records/s at each site, and every ``--sample`` seconds prints the resident
memory of the site processes and of their Spark JVMs, the partials the sites hold
unacknowledged, the results seen and how far the newest window lags the clock; then a
summary comparing the first and the last third of the run (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from jetstream.lab.soak import Sample, soak
from jetstream.queryfile import load_query

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, metavar="S")
    parser.add_argument("--rate", type=float, default=200.0, metavar="N",
                        help="records per second at each site (default 200)")
    parser.add_argument("--sample", type=float, default=30.0, metavar="S")
    parser.add_argument("--work", type=Path, metavar="DIR",
                        help="where logs and state go (default: a temp folder)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="jetstream-soak-"))
    samples = soak(ROOT / "topologies" / "local-3dc.yaml",
                   load_query(ROOT / "examples" / "cdn_topk.py"),
                   work, duration_s=args.duration, rate=args.rate, sample_s=args.sample,
                   say=lambda line: print(line, file=sys.stderr, flush=True))
    third = max(1, len(samples) // 3)
    first, last = samples[:third], samples[-third:]
    print(f"soak: {args.duration:.0f}s at {args.rate:g} records/s per site, "
          f"{len(samples)} samples, work in {work}")
    print("| | first third | last third |\n|---|---|---|")
    for label, value in (("site processes, MB", lambda s: s.python_mb),
                         ("Spark JVMs, MB", lambda s: s.jvm_mb),
                         ("partials held unacked", lambda s: float(sum(s.held.values()))),
                         ("newest window behind the clock, s",
                          lambda s: s.lag_s if s.lag_s is not None else float("nan"))):
        print(f"| {label} | {_mean(first, value):.1f} | {_mean(last, value):.1f} |")
    print(f"results: {samples[-1].results}")
    return 0


def _mean(samples: list[Sample], value: object) -> float:
    assert callable(value)
    return sum(value(s) for s in samples) / len(samples)


if __name__ == "__main__":
    sys.exit(main())
