#!/usr/bin/env python3
"""Merge throughput of a datacenter with many children: its own process against N workers.

Usage: python scripts/bench_merge.py [--children 120] [--windows 10] [--rows 1000]
                                     [--workers 0,2,3] [--runs 2]

A root datacenter (its site controller, data plane and gRPC server, in this process) runs
the CDN top-k query's final step over ``--children`` children: with 0 workers its own
process merges every partial row; with N it runs N key partitions on N ``jetstream worker``
processes that it starts (the path ``jetstream site`` takes for a datacenter with several
servers). The children's partials (``--rows`` keys each, per window, out of 5,000 Zipf-
distributed domains) are handed to the site's run as its data plane hands them on, and
the clock runs until the last window's result is published; with workers, also as the
children would send them: each batch cut and encoded beforehand (on the children's machines),
each part sent straight to its worker. Prints a Markdown table of
partial rows merged per second (best and median of ``--runs``) for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from jetstream.aggtree.planner import Fragment
from jetstream.aggtree.topology import Server
from jetstream.control.server import start_server
from jetstream.control.servicers import SiteControllerServicer
from jetstream.control.site_controller import SiteController
from jetstream.control.workers import WorkerPool
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.options import Assignment, SiteOptions
from jetstream.dataplane.partials import ENDED, PartialBatch
from jetstream.dataplane.router import split_batch
from jetstream.dataplane.site import SiteRuntime
from jetstream.dataplane.transport import PartialSender
from jetstream.operators import WindowAggregate
from jetstream.queryfile import query_from_source
from jetstream.rewrite import distributed, partial_aggregate
from jetstream.security import Security, make_dev_certs
from jetstream.v1 import control_pb2_grpc as rpc
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as dataplane_rpc

ROOT = Path(__file__).resolve().parent.parent
QUERY = ROOT / "examples" / "cdn_topk.py"
DOMAINS = 5_000
WINDOW_MS = 10_000


def batches(source: str, children: int, windows: int, rows: int, seed: int
            ) -> list[PartialBatch]:
    """Every child's partial of every window, as the site's data plane decodes them."""
    query = distributed(query_from_source(source, "cdn-topk"))
    partial = partial_aggregate(query)
    kb = dict(partial.aggregates)["kb"]
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(DOMAINS)]
    out = []
    for w in range(windows):
        window = (w * WINDOW_MS, (w + 1) * WINDOW_MS)
        for c in range(children):
            keys = set(rng.choices(range(DOMAINS), weights, k=rows * 2))
            chosen = sorted(keys)[:rows]
            out.append(PartialBatch("cdn-topk", window, f"c{c:03d}", tuple(
                {"domain": f"d{d}.example", "requests": rng.randint(1, 50),
                 "kb": kb.add(kb.create(), rng.random() * 100)} for d in chosen),
                events=len(chosen), covers=frozenset({f"c{c:03d}"})))
    return out


def run_once(source: str, inputs: list[PartialBatch], children: int, workers: int,
             security: Security, direct: bool = False) -> float:
    """Seconds from the first batch handed on to the last window's result. ``direct``: the
    children send each worker its part themselves (cut and encoded before the clock runs,
    as children do on their own machines), not through the site's process."""
    site, servers = "dc", [Server(f"dc-{i + 1}", 1, 1.0) for i in range(max(workers, 1))]
    done = threading.Event()

    def published(query: str, results: list, finished: bool) -> None:
        if finished:
            done.set()

    state = Path(tempfile.mkdtemp(prefix="bench-merge-"))
    runtime = SiteRuntime(site, SiteOptions(replay=True, state_dir=state,
                                            connect=security.channel), published)
    servicer = SiteControllerServicer()
    server, port = start_server([
        (rpc.add_SiteControllerServicer_to_server, servicer, "jetstream.v1.SiteController"),
        (dataplane_rpc.add_DataPlaneServicer_to_server, runtime.servicer,
         "jetstream.v1.DataPlane")], 0, security=security)
    address = f"127.0.0.1:{port}"
    pool = None if workers == 0 else WorkerPool(site, servers, address, security=security)
    controller = SiteController(site, servers, runtime, workers=pool, address=address)
    servicer.controller = controller
    try:
        if pool is not None:
            pool.warm_up()
            for s in servers:
                pool.address(s.name)  # started and registered before the clock runs
        names = tuple(f"c{c:03d}" for c in range(children))
        fragment = Fragment("cdn-topk", site, children=names, final=True,
                            partitions=max(workers, 1))
        controller.deploy(fragment, 1, Assignment(fragment, source, 1, covers=names,
                                                  expected=names))
        run = runtime.run("cdn-topk")
        assert run is not None
        if direct:
            assert run.router is not None
            return _direct(run.router.addresses, run.partial, inputs, names, security, done)
        began = time.perf_counter()
        for batch in inputs:
            run.receive(batch)
        for name in names:
            run.progress(name, ENDED, ended=True)
        if not done.wait(600):
            msg = "the merge did not finish within 600 s"
            raise SystemExit(msg)
        return time.perf_counter() - began
    finally:
        controller.close()
        server.stop(None)


def _direct(workers: list[str], partial: WindowAggregate, inputs: list[PartialBatch],
            names: tuple[str, ...], security: Security, done: threading.Event) -> float:
    """The children's side of sending to the workers directly: each batch cut by key and
    encoded as a child's uplink does (compressed, for the wide area) before the clock runs;
    then every part sent to its worker over one connection per worker."""
    known: dict[tuple[Any, ...], int] = {}
    parts = [[encode_batch(part, partial) for part in
              split_batch(batch, partial.keys, len(workers), known)] for batch in inputs]
    senders = [PartialSender(address, connect=security.channel, link="bench")
               for address in workers]
    try:
        began = time.perf_counter()
        for cut in parts:
            for sender, part in zip(senders, cut, strict=True):
                sender.send(part)
        for sequence, name in enumerate(names, start=1):
            for sender in senders:
                sender.send_progress(pb.Progress(query="cdn-topk", origin=name,
                                                 watermark_ms=ENDED, ended=True,
                                                 sequence=sequence))
        if not done.wait(600):
            msg = "the merge did not finish within 600 s"
            raise SystemExit(msg)
        return time.perf_counter() - began
    finally:
        for sender in senders:
            sender.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=120)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--workers", default="0,2,3",
                        help="worker counts to compare, 0 being the site's own process")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    source = QUERY.read_text(encoding="utf-8")
    # Mutual TLS and a token on every hop, as between a site and its workers anywhere.
    tls = make_dev_certs(Path(tempfile.mkdtemp(prefix="bench-merge-tls-")), ["127.0.0.1"],
                         days=1).folder
    security = Security.resolve(tls, env={})
    inputs = batches(source, args.children, args.windows, args.rows, seed=2014)
    total = sum(len(b.rows) for b in inputs)
    print(f"{args.children} children x {args.windows} windows: {total:,} partial rows")
    print("| merged by | rows/s (best) | rows/s (median) | runs |")
    print("|---|---:|---:|---:|")
    for workers in (int(w) for w in args.workers.split(",")):
        for direct in (False, True) if workers else (False,):
            seconds = [run_once(source, inputs, args.children, workers, security, direct)
                       for _ in range(args.runs)]
            who = ("the site's own process" if workers == 0 else
                   f"{workers} workers, " + ("children sending to them directly" if direct
                                             else "through the site's process"))
            print(f"| {who} | {total / min(seconds):,.0f} | "
                  f"{total / statistics.median(seconds):,.0f} | {args.runs} |", flush=True)


if __name__ == "__main__":
    main()
