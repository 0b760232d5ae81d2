"""Degradation under a thin link: a site's sender to the root over real gRPC, through a link
whose rate is cut 10x mid-run and then restored. The level must step down within a few
windows, every degraded result's bounds must hold, and the level must climb back."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

import jetstream as js
from jetstream.aggtree.planner import Fragment
from jetstream.control.server import start_server
from jetstream.partials import encode_batch
from jetstream.queryfile import query_from_source
from jetstream.results import WindowResult
from jetstream.runtime import ENDED, Assignment, SiteOptions, SiteRuntime
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as rpc
from tests.conftest import log
from tests.test_aggregator import site_batches, split

SOURCE = """
import jetstream as js
logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)
query = js.Query('thin', logs.window(js.tumbling('1s'), watermark='0s').group_by('domain')
                 .agg(requests=js.count()).top_k(5, by='requests'))
"""
WINDOWS = 26
DROP, RESTORE = 4, 14  # the link is 10x thinner for the windows in [DROP, RESTORE)
#: How many windows the level may take to react (acks of slow windows arrive late, and a
#: loaded machine delays them further).
REACTION = 6


class ThrottledLink(rpc.DataPlaneServicer):
    """The root's DataPlane behind a link of ``rate`` bytes/s: each message takes its time."""

    def __init__(self, inner: rpc.DataPlaneServicer, rate: float) -> None:
        self.inner, self.rate = inner, rate

    def Push(self, request_iterator: Iterator[pb.PushMessage],
             context: grpc.ServicerContext) -> Iterator[pb.Ack]:
        def paced() -> Iterator[pb.PushMessage]:
            for message in request_iterator:
                time.sleep(message.ByteSize() / self.rate)
                yield message
        yield from self.inner.Push(paced(), context)


def window_events(w: int, rnd: random.Random) -> list[dict[str, Any]]:
    """One second of Zipf-distributed requests over 600 domains."""
    weights = [1 / (i + 1) ** 1.2 for i in range(600)]
    domains = rnd.choices(range(600), weights, k=3000)
    return [log(w * 1000 + i % 1000, f"d{d}.example.com") for i, d in enumerate(domains)]


def test_a_thin_link_degrades_with_bounds_that_hold_and_recovers() -> None:
    query = query_from_source(SOURCE, "<test>")
    _, site_query, partial = split(query)
    rnd = random.Random(5)
    events = [window_events(w, rnd) for w in range(WINDOWS)]
    batches = [site_batches(site_query, partial, "pop", e)[0] for e in events]

    results: list[WindowResult] = []
    done = threading.Event()

    def publish(name: str, out: list[WindowResult], finished: bool) -> None:
        results.extend(out)
        if finished:
            done.set()

    root = SiteRuntime("dc", SiteOptions(deadline_s=30), publish)
    root.deploy(Assignment(Fragment("thin", "dc", children=("edge",), final=True), SOURCE,
                           covers=("pop",)))
    exact_bytes = max(encode_batch(b, partial).ByteSize() for b in batches)
    link = ThrottledLink(root.servicer, rate=exact_bytes / 0.1)
    server, port = start_server([(rpc.add_DataPlaneServicer_to_server, link,
                                  "jetstream.v1.DataPlane")], 0)
    edge = SiteRuntime("edge", SiteOptions(deadline_s=30, level_interval_s=1.5),
                       lambda *_: None)
    edge.deploy(Assignment(Fragment("thin", "edge", children=("pop",), parent="dc"), SOURCE,
                           parent_address=f"127.0.0.1:{port}", covers=("pop",)))
    run = edge.run("thin")
    assert run is not None and run.policy is not None
    levels = []
    try:
        for w, batch in enumerate(batches):  # one window a second, as a live stream makes them
            # An exact window takes 0.1 s to send, and 2 s (twice the window) while thin.
            link.rate = exact_bytes / (2.0 if DROP <= w < RESTORE else 0.1)
            run.merger.add(batch)
            run.merger.progress("pop", batch.window[1])
            time.sleep(1.0)
            levels.append(run.policy.level.index)
        run.merger.progress("pop", ENDED, ended=True)
        assert done.wait(60), f"{len(results)} results"
    finally:
        edge.close()
        root.close()
        server.stop(grace=0).wait()

    history = [(round(c.time, 1), c.from_level.index, c.to_level.index, c.reason[:40])
               for c in run.policy.history]
    assert max(levels[DROP:DROP + REACTION]) > 0, (levels, history)  # stepped down in time
    assert levels[-1] == 0, (levels, history)  # and climbed back once the link recovered
    latest = {r.window_start: r for r in results}
    assert len(latest) == WINDOWS
    degraded = [r for r in latest.values() if not r.exact]
    assert degraded, history
    for result in latest.values():
        truth = js.run_local(query, events[result.window_start // 1000])[0]
        true_counts = {row["domain"]: row["requests"] for row in truth.rows}
        if result.exact:
            assert result.rows == truth.rows
            continue
        kth = truth.rows[-1]["requests"]
        for row in result.rows:
            counts = _true_count(events[result.window_start // 1000], row["domain"])
            assert row["lb"] <= counts <= row["ub"], row
            if row["guaranteed"]:
                assert counts >= kth, (row, true_counts)
        assert result.error_bound is not None and result.error_bound >= 0


def _true_count(events: list[dict[str, Any]], domain: str) -> int:
    return sum(e["domain"] == domain for e in events)
