#!/usr/bin/env python3
"""zlib against zstandard and lz4 on the payloads a site sends: ratio and time per payload.

Usage: python scripts/bench_compression.py [--rate 1000] [--duration 120] [--window 10]
       [--repeat 20]

Generates the CDN logs ``jetstream bench`` uses (``--rate`` records/s at each edge PoP of
local-3dc, ``--duration`` seconds), computes each edge site's exact partials of the CDN top-k
query per window with the reference executor (windows of ``--window`` seconds), encodes each
as the wire's uncompressed payload, and compresses every payload with each codec and level
installed (zstandard and lz4 are optional packages: a missing one is skipped and said). Prints
per codec: the total bytes against the raw payloads, and the median time to compress and to
decompress one payload (each timed ``--repeat`` times). With zstandard, also zstd with the
link's previous payload as a raw-content dictionary (what a per-link dictionary kept at both
ends could give: a window's keys are mostly the last window's), against zlib 6 on the same
payloads (each link's first payload has no previous one and is left out).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.partials import PartialBatch
from jetstream.lab.loggen import write_logs
from jetstream.local import run_local
from jetstream.operators import WindowAggregate
from jetstream.queryfile import load_query
from jetstream.rewrite import distributed, site_part

ROOT = Path(__file__).resolve().parent.parent
EDGES = ("sfo", "sin")
START_MS = 1_767_225_600_000

Codec = tuple[str, Callable[[bytes], bytes], Callable[[bytes], bytes]]


def codecs() -> tuple[list[Codec], list[str]]:
    """Each installed codec at a few levels, and the names of those not installed."""
    found: list[Codec] = [(f"zlib {level}", functools.partial(zlib.compress, level=level),
                           zlib.decompress) for level in (1, 6, 9)]
    missing = []
    try:
        zstd: Any = importlib.import_module("zstandard")
        for level in (1, 3, 9, 19):
            found.append((f"zstd {level}", zstd.ZstdCompressor(level=level).compress,
                          zstd.ZstdDecompressor().decompress))
    except ImportError:
        missing.append("zstandard")
    try:
        lz4: Any = importlib.import_module("lz4.frame")
        found.append(("lz4", lz4.compress, lz4.decompress))
        found.append(("lz4 hc 9", lambda b: lz4.compress(b, compression_level=9),
                      lz4.decompress))
    except ImportError:
        missing.append("lz4")
    return found, missing


def payloads(rate: float, duration_s: float, window_s: int) -> dict[str, list[bytes]]:
    """Each edge site's exact partial of each window, in window order, as the wire's payload
    before compression."""
    text = (ROOT / "examples" / "cdn_topk.py").read_text()
    text = text.replace('js.tumbling("10s")', f'js.tumbling("{window_s}s")')
    with tempfile.TemporaryDirectory() as tmp:
        query_file = Path(tmp) / "query.py"
        query_file.write_text(text)
        query = load_query(query_file)
        site_query, partial = site_part(distributed(query))
        assert isinstance(partial, WindowAggregate)
        write_logs(Path(tmp) / "logs", EDGES, start_ms=START_MS, duration_s=duration_s,
                   rate=rate)
        out: dict[str, list[bytes]] = {}
        for site in EDGES:
            for result in run_local(site_query, Path(tmp) / "logs" / site):
                batch = PartialBatch(query.name, (result.window_start, result.window_end),
                                     site, tuple(result.rows))
                out.setdefault(site, []).append(
                    encode_batch(batch, partial, compress=False).payload)
    return out


def with_previous(links: dict[str, list[bytes]]) -> None:
    """zstd with each link's previous payload as its dictionary, against zlib 6."""
    zstd: Any = importlib.import_module("zstandard")
    for level in (3, 9, 19):
        ours = zlib_bytes = 0
        seconds = []
        for sent in links.values():
            for before, payload in itertools.pairwise(sent):
                dictionary = zstd.ZstdCompressionDict(before,
                                                      dict_type=zstd.DICT_TYPE_RAWCONTENT)
                start = time.perf_counter()
                blob = zstd.ZstdCompressor(level=level, dict_data=dictionary).compress(payload)
                seconds.append(time.perf_counter() - start)
                assert zstd.ZstdDecompressor(dict_data=dictionary).decompress(blob) == payload
                ours += len(blob)
                zlib_bytes += len(zlib.compress(payload, 6))
        print(f"| zstd {level}, the previous payload as dictionary | {ours:,} | "
              f"{zlib_bytes / ours:.2f}x less than zlib 6 ({zlib_bytes:,}) | "
              f"{statistics.median(seconds) * 1e3:.2f} ms | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--window", type=int, default=10, help="window length in seconds")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    found, missing = codecs()
    links = payloads(args.rate, args.duration, args.window)
    raw = [payload for sent in links.values() for payload in sent]
    sizes = sorted(len(p) for p in raw)
    print(f"{len(raw)} payloads ({args.window} s windows, {args.rate:g} records/s a site): "
          f"{sum(sizes):,} bytes raw, median {statistics.median(sizes):,.0f} bytes")
    if missing:
        print(f"not installed, skipped: {', '.join(missing)} (pip install {' '.join(missing)})")
    print("| codec | bytes | vs raw | compress, median per payload | decompress, median |")
    print("|---|---:|---:|---:|---:|")
    for name, compress, decompress in found:
        packed = [compress(p) for p in raw]
        assert all(decompress(c) == p for c, p in zip(packed, raw, strict=True))
        squeeze, expand = [], []
        for payload, blob in zip(raw, packed, strict=True):
            start = time.perf_counter()
            for _ in range(args.repeat):
                compress(payload)
            squeeze.append((time.perf_counter() - start) / args.repeat)
            start = time.perf_counter()
            for _ in range(args.repeat):
                decompress(blob)
            expand.append((time.perf_counter() - start) / args.repeat)
        total = sum(len(c) for c in packed)
        print(f"| {name} | {total:,} | {sum(sizes) / total:.2f}x | "
              f"{statistics.median(squeeze) * 1e3:.2f} ms | "
              f"{statistics.median(expand) * 1e3:.2f} ms |")
    if "zstandard" not in missing:
        with_previous(links)


if __name__ == "__main__":
    main()
