#!/usr/bin/env python3
"""The wide-area bytes story of the CDN top-k, by window length: raw logs, the gzip backhaul,
exact partials (plain, then with the key dictionary), TPUT's rounds, and the lower bound.

Usage: python scripts/bench_bytes.py [--rate 1000] [--duration 180] [--windows 5,10,60]

Generates the logs ``jetstream bench`` uses (``--rate`` records/s at each site of local-3dc,
``--duration`` seconds) and, for each window length, computes with the data plane's own code
what the two edge sites (sfo, sin) would send the root (ams) per window:

* raw: their CSV lines of the window; gzip: the same gzipped (what the backhaul ships);
* exact: each site's exact partial (the reference executor's) as the wire encodes it, zlib
  and all; with the dictionary: the same through a key dictionary kept per link;
* TPUT: the rounds played with the sites' ``Answerer`` and the root's ``next_asks`` (the
  root's own exact partial included), every answer coded with the link's dictionary, plus
  the asks sent down;
* lower bound: each edge site's own top k rows a window, coded.

Progress reports and gRPC framing are not counted (``jetstream bench`` counts them, live).
"""

from __future__ import annotations

import argparse
import gzip
import tempfile
from pathlib import Path
from typing import Any

from jetstream.approx.levels import ranking
from jetstream.approx.rounds import next_asks
from jetstream.approx.truncate import BoundedPartial, exact_partial, truncate
from jetstream.dataplane.asks import Answerer
from jetstream.dataplane.codec import ask_to_proto, encode_batch
from jetstream.dataplane.keydict import KeyEncoder
from jetstream.dataplane.partials import PartialBatch
from jetstream.lab.loggen import write_logs
from jetstream.local import run_local
from jetstream.queryfile import load_query
from jetstream.rewrite import distributed, site_part

ROOT = Path(__file__).resolve().parent.parent
SITES, EDGES, HOME = ("ams", "sfo", "sin"), ("sfo", "sin"), "ams"
START_MS = 1_767_225_600_000
# JetStream (NSDI'14) on CoralCDN logs, domain-level aggregation: raw bytes over aggregated.
CORALCDN = {5: "18x", 60: "50x"}


def window_query(window_s: int, tmp: Path) -> Any:
    text = (ROOT / "examples" / "cdn_topk.py").read_text()
    query_file = tmp / f"query-{window_s}.py"
    query_file.write_text(text.replace('js.tumbling("10s")', f'js.tumbling("{window_s}s")'))
    return load_query(query_file)


def raw_by_window(logs: Path, window_ms: int) -> tuple[dict[int, int], dict[int, int]]:
    """Per window start: the edge sites' raw CSV bytes, and the same gzipped per site."""
    raw: dict[int, int] = {}
    packed: dict[int, int] = {}
    for site in EDGES:
        by_window: dict[int, list[str]] = {}
        header = ""
        for path in sorted((logs / site).glob("*.csv")):
            with path.open() as f:
                header = f.readline()
                for line in f:
                    start = int(line.split(",", 1)[0]) // window_ms * window_ms
                    by_window.setdefault(start, []).append(line)
        for start, lines in by_window.items():
            text = (header + "".join(lines)).encode()
            raw[start] = raw.get(start, 0) + len(text)
            packed[start] = packed.get(start, 0) + len(gzip.compress(text, compresslevel=6))
    return raw, packed


def story(window_s: int, logs: Path, tmp: Path) -> dict[str, int]:
    query = distributed(window_query(window_s, tmp))
    rank = ranking(query)
    assert rank is not None
    site_query, partial = site_part(query)
    partials = {site: {(r.window_start, r.window_end): r.rows
                       for r in run_local(site_query, logs / site)} for site in SITES}
    raw, packed = raw_by_window(logs, window_s * 1000)
    windows = sorted({w for site in EDGES for w in partials[site]})
    totals = {"windows": len(windows), "raw": sum(raw.values()), "gzip": sum(packed.values()),
              "exact": 0, "dictionary": 0, "tput": 0, "lower bound": 0, "rounds": 0}
    links = {site: (KeyEncoder(), KeyEncoder(), KeyEncoder()) for site in EDGES}
    for window in windows:
        inputs: dict[str, BoundedPartial] = {
            HOME: exact_partial(partials[HOME].get(window, []))}
        answerers = {}
        for site in EDGES:
            exact_keys, rounds_keys, least_keys = links[site]
            rows = tuple(partials[site].get(window, []))
            batch = PartialBatch(query.name, window, site, rows)
            message = encode_batch(batch, partial)
            totals["exact"] += message.ByteSize()
            totals["dictionary"] += exact_keys.encode(message).ByteSize()
            top = truncate(list(rows), partial, rank.by, rank.k).rows
            totals["lower bound"] += least_keys.encode(encode_batch(
                PartialBatch(query.name, window, site, top), partial)).ByteSize()
            answerer = answerers[site] = Answerer(partial, rank, keep_s=60)
            first = answerer.first(batch)
            totals["tput"] += rounds_keys.encode(encode_batch(first, partial)).ByteSize()
            inputs[site] = first.bounded
        rounds = 1
        while asks := next_asks(inputs, partial, rank.by, rank.k):
            rounds += 1
            for site, ask in asks.items():
                totals["tput"] += ask_to_proto(window, ask).ByteSize()
                answer = answerers[site].answer(window, ask, sequence=rounds)
                assert answer is not None
                totals["tput"] += links[site][1].encode(encode_batch(answer, partial)).ByteSize()
                inputs[site] = answer.bounded
        totals["rounds"] = max(totals["rounds"], rounds)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration", type=float, default=180.0)
    parser.add_argument("--windows", default="5,10,60", help="window lengths in seconds")
    args = parser.parse_args()
    lengths = [int(w) for w in args.windows.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        write_logs(tmp / "logs", SITES, start_ms=START_MS, duration_s=args.duration,
                   rate=args.rate)
        for length in lengths:
            rows.append((length, story(length, tmp / "logs", tmp)))
    print(f"{args.duration:g} s at {args.rate:g} records/s a site (local-3dc); the two edge "
          "sites' bytes to the root, all windows:")
    print("| window | raw | gzip backhaul | exact partials | with the key dictionary | TPUT "
          "(rounds) | lower bound | backhaul / TPUT | TPUT / lower bound | raw / TPUT | "
          "JetStream on CoralCDN (raw / aggregated) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for length, t in rows:
        print(f"| {length} s ({t['windows']} windows) | {t['raw']:,} | {t['gzip']:,} | "
              f"{t['exact']:,} | {t['dictionary']:,} | {t['tput']:,} (up to {t['rounds']}) | "
              f"{t['lower bound']:,} | {t['gzip'] / t['tput']:,.0f}x | "
              f"{t['tput'] / t['lower bound']:.1f}x | {t['raw'] / t['tput']:,.0f}x | "
              f"{CORALCDN.get(length, '')} |")


if __name__ == "__main__":
    main()
