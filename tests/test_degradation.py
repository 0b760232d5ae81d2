"""Degradation under a thin link: a site's sender to the root over real gRPC, through a link
whose rate is cut 10x mid-run and then restored. The level must step down within a few
windows, every degraded result's bounds must hold, and the level must climb back."""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import jetstream as js
from jetstream.aggtree.planner import Fragment
from jetstream.approx.policy import LinkPolicy
from jetstream.control.daemons import link_measurements
from jetstream.control.server import start_server
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.keydict import KeyEncoder
from jetstream.dataplane.options import Assignment, SiteOptions
from jetstream.dataplane.partials import ENDED
from jetstream.dataplane.site import SiteRuntime
from jetstream.queryfile import query_from_source
from jetstream.results import WindowResult
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as rpc
from tests.conftest import log, spec_of
from tests.test_merger import site_batches, split

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


class BusyReceiver(rpc.DataPlaneServicer):
    """The root's DataPlane on a fast link, slow to get to each message: ``delay_s`` whatever
    its size, as a CPU-starved process is."""

    def __init__(self, inner: rpc.DataPlaneServicer, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def Push(self, request_iterator: Iterator[pb.PushMessage],
             context: grpc.ServicerContext) -> Iterator[pb.Ack]:
        def late() -> Iterator[pb.PushMessage]:
            for message in request_iterator:
                time.sleep(self.delay_s)
                yield message
        yield from self.inner.Push(late(), context)



def root_site(source: str, query: str = "thin", children: tuple[str, ...] = ("edge",),
              covers: tuple[str, ...] = ("pop",), deadline_s: float = 30.0
              ) -> tuple[SiteRuntime, list[WindowResult], threading.Event]:
    """The root "dc" of ``query`` (``source``) merging ``children``: its runtime, the results
    it publishes, and an event set once they are final."""
    results: list[WindowResult] = []
    done = threading.Event()

    def publish(name: str, out: list[WindowResult], finished: bool) -> None:
        results.extend(out)
        if finished:
            done.set()

    root = SiteRuntime("dc", SiteOptions(deadline_s=deadline_s), publish)
    root.deploy(Assignment(Fragment(query, "dc", children=children, final=True), spec_of(source),
                           covers=covers))
    return root, results, done

def window_events(w: int, rnd: random.Random) -> list[dict[str, Any]]:
    """One second of Zipf-distributed requests over 600 domains."""
    weights = [1 / (i + 1) ** 1.2 for i in range(600)]
    domains = rnd.choices(range(600), weights, k=3000)
    return [log(w * 1000 + i % 1000, f"d{d}.example.com") for i, d in enumerate(domains)]


def through_thin_link(source: str, events: list[list[dict[str, Any]]], thin: range,
                      pin: str = "", measured: list[tuple[float, float | None]] | None = None,
                      thin_s: float = 2.0) -> tuple[list[WindowResult], list[int], LinkPolicy]:
    """Send each window's events from an edge site to the root, one window a second, over a
    link on which an exact window takes 0.1 s, and ``thin_s`` for the windows in ``thin``:
    the results, and the level the edge chose after each window. ``pin``: an operator holds
    the link at that level. ``measured`` gets, after each window, the link's rate in bit/s
    and what the edge's heartbeat would say it measured (None: nothing)."""
    query = query_from_source(source, "<test>")
    _, site_query, partial = split(query)
    batches = [site_batches(site_query, partial, "pop", e)[0] for e in events]
    root, results, done = root_site(source)
    # What an exact window costs on the link once its keys are in the stream's dictionary.
    keys = KeyEncoder()
    exact_bytes = max([keys.encode(encode_batch(b, partial)).ByteSize() for b in batches][1:])
    link = ThrottledLink(root.servicer, rate=exact_bytes / 0.1)
    server, port = start_server([(rpc.add_DataPlaneServicer_to_server, link,
                                  "jetstream.v1.DataPlane")], 0)
    # (A profile on one window in three, not one in 30 s: the windows come a second apart.)
    edge = SiteRuntime("edge", SiteOptions(deadline_s=30, level_interval_s=1.5,
                                           profile_interval_s=0),
                       lambda *_: None)
    edge.deploy(Assignment(Fragment("thin", "edge", children=("pop",), parent="dc"),
                           spec_of(source),
                           parent_address=f"127.0.0.1:{port}", covers=("pop",)))
    run = edge.run("thin")
    assert run is not None and run.policy is not None
    if pin:
        edge.set_level("thin", pin)
    levels = []
    try:
        for w, batch in enumerate(batches):  # one window a second, as a live stream makes them
            link.rate = exact_bytes / (thin_s if w in thin else 0.1)
            run.merger.add(batch)
            run.merger.progress("pop", batch.window[1])
            time.sleep(1.0)
            levels.append(run.policy.level.index)
            if measured is not None:
                said = {m.peer: m.bandwidth_bps for m in link_measurements(edge.links())}
                measured.append((link.rate * 8, said.get("dc")))
        run.merger.progress("pop", ENDED, ended=True)
        assert done.wait(90), f"{len(results)} results"
    finally:
        edge.close()
        root.close()
        server.stop(grace=0).wait(5)
    return results, levels, run.policy


def test_a_thin_link_degrades_with_bounds_that_hold_and_recovers() -> None:
    query = query_from_source(SOURCE, "<test>")
    rnd = random.Random(5)
    events = [window_events(w, rnd) for w in range(WINDOWS)]

    measured: list[tuple[float, float | None]] = []
    results, levels, policy = through_thin_link(SOURCE, events, range(DROP, RESTORE),
                                                measured=measured)

    history = [(round(c.time, 1), c.from_level.index, c.to_level.index, c.reason[:40])
               for c in policy.history]
    assert max(levels[DROP:DROP + REACTION]) > 0, (levels, history)  # stepped down in time
    assert levels[-1] == 0, (levels, history)  # and climbed back once the link recovered
    # The heartbeat measures the link only while the policy has stepped down on it: then
    # what the sender gets through is what the link carries (within the round trips and
    # the smoothing), and a link that carries everything is not measured at all.
    said = [(rate, bps) for rate, bps in measured if bps is not None]
    assert measured[-1][1] is None  # back to exact: no longer measured
    thin_rate = min(rate for rate, _ in measured)
    # Below the link's rate by the round trips, not above it by the fast link's past.
    while_thin = [bps for rate, bps in said if rate == thin_rate]
    assert while_thin, (said, thin_rate)
    assert all(thin_rate / 3 < bps <= thin_rate * 1.1 for bps in while_thin), (said, thin_rate)
    # Restored, the link is measured at its new speed until the policy is back at exact.
    assert max(bps for rate, bps in said if rate != thin_rate) > 3 * thin_rate, said
    latest = {r.window_start: r for r in results}
    assert len(latest) == WINDOWS
    degraded = [r for r in latest.values() if not r.exact]
    assert degraded, history
    # Exact all along, the thin windows would queue up: 1 s more latency each, 10 s by the
    # end. Degraded, the windows after the reaction keep up with the stream.
    settled = [latest[w * 1000].latency_s or 0.0 for w in range(DROP + REACTION, RESTORE)]
    assert max(settled) < 5.0, (settled, history)
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


HOLISTIC = """
import jetstream as js
logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)
query = js.Query('thin', logs.window(js.tumbling('1s'), watermark='0s')
                 .agg(clients=js.count_distinct('client_ip'), p90=js.quantile('latency_ms', 0.9)))
"""


def test_a_link_too_thin_for_a_query_that_may_not_degrade_is_measured_all_the_same() -> None:
    """A query whose SLO allows exact results only cannot step down, so its windows queue up
    on a thin link; the link is what paces them, and the site's heartbeat says what it
    carries, as it does for a query that stepped down: the controller can plan the tree
    around the link whatever the query. A link that carries everything is not measured."""
    source = SOURCE.replace("top_k(5, by='requests'))",
                            "top_k(5, by='requests'), slo=js.SLO(max_error=0))")
    query = query_from_source(source, "<test>")
    rnd = random.Random(7)
    events = [window_events(w, rnd) for w in range(16)]
    measured: list[tuple[float, float | None]] = []
    results, levels, policy = through_thin_link(source, events, range(3, 8), measured=measured,
                                                thin_s=1.5)

    assert set(levels) == {0} and policy.history == []  # never degraded
    fast_rate = measured[0][0]
    assert all(bps is None for _, bps in measured[:3]), measured  # room to spare: unmeasured
    thin_rate = min(rate for rate, _ in measured)
    while_thin = [bps for rate, bps in measured[4:8] if rate == thin_rate and bps is not None]
    assert while_thin, measured
    assert all(thin_rate / 3 < bps <= thin_rate * 1.1 for bps in while_thin), measured
    assert measured[-1] == (fast_rate, None), measured  # drained and fast again: unmeasured
    latest = {r.window_start: r for r in results}
    assert sorted(latest) == [w * 1000 for w in range(16)]
    for result in latest.values():
        assert result.exact
        assert result.rows == js.run_local(query, events[result.window_start // 1000])[0].rows


def test_a_thin_link_steps_distinct_counts_and_quantiles_down_to_sketches() -> None:
    """An exact distinct count and quantile carry every value; on a thin link they go as HLL
    and KLL sketches, and each result says so and keeps within its bound."""
    query = query_from_source(HOLISTIC, "<test>")
    rnd = random.Random(11)
    events = [[log(w * 1000 + i % 1000, client_ip=f"10.{rnd.randrange(4)}.{rnd.randrange(256)}"
                   f".{rnd.randrange(256)}", latency_ms=round(rnd.expovariate(1 / 40), 2))
               for i in range(3000)] for w in range(12)]
    results, levels, policy = through_thin_link(HOLISTIC, events, range(2, 12))
    history = [(c.from_level.name, c.to_level.name, c.reason[:40]) for c in policy.history]
    assert max(levels[2:2 + REACTION]) > 0, (levels, history)
    assert policy.levels[1].name == "HLL 2^12, KLL k=200"
    latest = {r.window_start: r for r in results}
    assert len(latest) == len(events)
    assert any(not r.exact for r in latest.values()), history
    for start, result in latest.items():
        (truth,) = js.run_local(query, events[start // 1000])
        if result.exact:
            assert result.rows == truth.rows
            continue
        (row,), (want,), bound = result.rows, truth.rows, result.error_bound
        assert 0 < bound < 0.1
        assert abs(row["clients"] - want["clients"]) <= bound * row["clients"] + 1, (row, want)
        latencies = [e["latency_ms"] for e in events[start // 1000]]
        below, at_most = sum(x < row["p90"] for x in latencies), sum(
            x <= row["p90"] for x in latencies)
        assert at_most / len(latencies) >= 0.9 - bound and below / len(latencies) <= 0.9 + bound


def test_a_busy_receiver_and_bursts_of_windows_leave_a_fast_link_exact() -> None:
    # Loopback, but the root takes a quarter of a window over every message, and the edge's
    # stage hands on three windows at once: acks come late and windows wait unacknowledged,
    # yet fewer bytes would change neither. (The edge stepped down here before: "backlog
    # grew from 0 to 2 windows".)
    query = query_from_source(SOURCE, "<test>")
    _, site_query, partial = split(query)
    rnd = random.Random(8)
    events = [window_events(w, rnd) for w in range(12)]
    batches = [site_batches(site_query, partial, "pop", e)[0] for e in events]
    root, results, done = root_site(SOURCE)
    server, port = start_server([(rpc.add_DataPlaneServicer_to_server,
                                  BusyReceiver(root.servicer, 0.25), "jetstream.v1.DataPlane")],
                                0)
    edge = SiteRuntime("edge", SiteOptions(deadline_s=30, level_interval_s=1.5),
                       lambda *_: None)
    edge.deploy(Assignment(Fragment("thin", "edge", children=("pop",), parent="dc"),
                           spec_of(SOURCE),
                           parent_address=f"127.0.0.1:{port}", covers=("pop",)))
    run = edge.run("thin")
    assert run is not None and run.policy is not None
    try:
        for first in range(0, len(batches), 3):
            for batch in batches[first:first + 3]:
                run.merger.add(batch)
            run.merger.progress("pop", batches[first + 2].window[1])
            time.sleep(3.0)
        run.merger.progress("pop", ENDED, ended=True)
        assert done.wait(60), f"{len(results)} results"
    finally:
        edge.close()
        root.close()
        server.stop(grace=0).wait(5)

    assert run.policy.history == [] and run.policy.level.index == 0, run.policy.history
    assert run.policy.base_s >= 0.2  # the receiver's delay, measured and set aside
    latest = {r.window_start: r for r in results}
    assert len(latest) == len(batches)
    for result in latest.values():
        assert result.exact
        assert result.rows == js.run_local(query, events[result.window_start // 1000])[0].rows


def test_a_link_that_cannot_meet_the_slo_within_max_error_says_so_in_the_results() -> None:
    exact_only = SOURCE.replace(".top_k(5, by='requests'))",
                                ".top_k(5, by='requests'), slo=js.SLO(max_error=0.0))")
    assert exact_only != SOURCE
    rnd = random.Random(6)
    events = [window_events(w, rnd) for w in range(10)]
    results, levels, policy = through_thin_link(exact_only, events, range(2, 10))

    assert set(levels) == {0}  # max_error 0: nothing but exact, however thin the link
    assert policy.violation is not None
    warned = [r for r in results if r.warnings]
    assert warned, [r.latency_s for r in results]
    assert all(r.exact for r in results)
    (warning,) = warned[-1].warnings
    assert warning.startswith("link edge -> dc: the window length 1s cannot be met"), warning
    assert "coarsest level that max_error=0 allows" in warning


def test_an_operator_pins_the_level_of_a_running_link() -> None:
    rnd = random.Random(7)
    events = [window_events(w, rnd) for w in range(3)]
    results, levels, policy = through_thin_link(SOURCE, events, range(0), pin="top 10")
    assert set(levels) == {3} and policy.pinned  # a fast link, and yet held at 'top 10'
    for result in results:
        assert not result.exact and len(result.rows) == 5
        for row in result.rows:
            assert row["lb"] <= _true_count(events[result.window_start // 1000],
                                            row["domain"]) <= row["ub"]


COUNTS = """
import jetstream as js
logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)
query = js.Query('thin', logs.window(js.tumbling('1s'), watermark='0s').group_by('domain')
                 .agg(requests=js.count(), kb=js.sum('bytes')))
"""


COUNTS_AND_LATENCIES = COUNTS.replace(
    "kb=js.sum('bytes')))", "kb=js.sum('bytes'), ms=js.avg('latency_ms'), "
    "fastest=js.min('latency_ms'), slowest=js.max('latency_ms')))")


def test_a_count_without_a_top_k_held_at_its_heaviest_keys_bounds_rows_and_what_is_left_out(
        ) -> None:
    """A count by domain (no top-k) over real gRPC, the link held at its heaviest 64
    keys of some 600 a window: every result says it is inexact, each row's count lies in
    its [lb, ub], and the error bound covers the share of the window's requests that the
    domains left out hold. The row's average, min and max latency lie in bounds of their
    own."""
    assert COUNTS_AND_LATENCIES != COUNTS
    rnd = random.Random(8)
    events = [window_events(w, rnd) for w in range(3)]
    for window in events:
        for event in window:
            event["latency_ms"] = round(rnd.lognormvariate(3, 1), 1)
    results, levels, policy = through_thin_link(COUNTS_AND_LATENCIES, events, range(0),
                                                pin="heaviest 64")
    assert policy.pinned and set(levels) == {3}
    assert sorted(r.window_start for r in results) == [0, 1000, 2000]
    for result in results:
        window = events[result.window_start // 1000]
        assert not result.exact and result.error_bound is not None
        counts = Counter(e["domain"] for e in window)
        shown = {row["domain"] for row in result.rows}
        assert 64 <= len(shown) < len(counts)
        for row in result.rows:
            assert row["lb"] <= counts[row["domain"]] <= row["ub"], row
        left_out = sum(n for domain, n in counts.items() if domain not in shown)
        assert 0 < left_out / len(window) <= result.error_bound
        latencies: dict[str, list[float]] = {}
        for event in window:
            latencies.setdefault(event["domain"], []).append(event["latency_ms"])
        for row in result.rows:
            ms = latencies[row["domain"]]
            true = {"ms": math.fsum(ms) / len(ms), "fastest": min(ms), "slowest": max(ms)}
            assert {b["aggregate"] for b in row["bounds"]} == set(true)
            for bound in row["bounds"]:
                value = true[bound["aggregate"]]
                assert bound["lb"] <= value <= bound["ub"], (row, bound, value)
                if row["complete"]:  # (one sender: each row it kept is whole)
                    assert bound["lb"] == bound["ub"] == row[bound["aggregate"]] or (
                        bound["aggregate"] == "ms")


def test_the_profile_lets_the_policy_choose_a_level_by_its_measured_error() -> None:
    """A count by domain with max_error 0.25, on a link so thin that only its heaviest 64
    keys fit: their nominal error (0.3) is past max_error, but measured on these windows
    (Zipf over 600 domains) they leave out about a fifth of the requests, so the policy goes
    there once its profile says so, and every result's error_bound stays within max_error."""
    bounded = COUNTS.replace("kb=js.sum('bytes')))", "kb=js.sum('bytes')), "
                             "slo=js.SLO(max_error=0.25))")
    assert bounded != COUNTS
    rnd = random.Random(9)
    events = [window_events(w, rnd) for w in range(16)]
    results, levels, policy = through_thin_link(bounded, events, range(2, 16), thin_s=4.0)

    history = [(c.from_level.name, c.to_level.name, c.reason[:60]) for c in policy.history]
    assert policy.levels[3].name == "heaviest 64" and policy.levels[3].error_bound > 0.25
    _, error_64 = policy.measured(3) or (None, None)
    assert error_64 is not None and 0.1 < error_64 <= 0.25, policy.measured(3)
    assert 3 in levels, (levels, history)
    for result in results:
        assert result.error_bound is None or result.error_bound <= 0.25, result
        window = events[result.window_start // 1000]
        counts = Counter(e["domain"] for e in window)
        for row in result.rows:
            assert row.get("lb", row["requests"]) <= counts[row["domain"]] <= row.get(
                "ub", row["requests"]), row


def test_pinning_refuses_what_the_link_does_not_have() -> None:
    edge = SiteRuntime("edge", SiteOptions(), lambda *_: None)
    root = SiteRuntime("dc", SiteOptions(), lambda *_: None)
    try:
        edge.deploy(Assignment(Fragment("thin", "edge", children=("pop",), parent="dc"),
                               spec_of(SOURCE), parent_address="127.0.0.1:1", covers=("pop",)))
        root.deploy(Assignment(Fragment("thin", "dc", children=("edge",), final=True),
                               spec_of(SOURCE),
                               covers=("pop",)))
        now = edge.set_level("thin", "")
        assert (now.link, now.level, now.pinned) == ("edge -> dc", "exact", False)
        assert now.levels[:3] == ("exact", "top 160", "top 40")
        for level, words in [("top 7", "no level 'top 7'; its levels are 0 'exact'"),
                             ("99", "no level '99'")]:
            with pytest.raises(js.ControlPlaneError, match=words):
                edge.set_level("thin", level)
        with pytest.raises(js.ControlPlaneError, match="thin at dc has no degradable link: "
                                                       "it is the root"):
            root.set_level("thin", "auto")
        with pytest.raises(js.ControlPlaneError, match="other does not run at edge"):
            edge.set_level("other", "auto")
    finally:
        edge.close()
        root.close()


def _true_count(events: list[dict[str, Any]], domain: str) -> int:
    return sum(e["domain"] == domain for e in events)


ROLLED_UP = """
import jetstream as js
from jetstream import col
logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)
query = js.Query('thin', logs.window(js.tumbling('1s'), watermark='0s')
                 .group_by('url', rollup={'url': col('url').url_domain()})
                 .agg(requests=js.count(), kb=js.sum('bytes'), slowest=js.max('latency_ms'),
                      users=js.count_distinct('client_ip')))
"""


def test_a_link_held_at_its_roll_up_sends_each_domain_once_and_the_root_reports_it_exact(
        ) -> None:
    """A count by url whose group_by declares url -> its domain, over real gRPC, the link
    pinned at 'rolled up': every result says it is rolled up (and so not exact), and its
    rows equal what js.run_local gives for the query grouped by each url's domain."""
    rnd = random.Random(11)
    events = [window_events(w, rnd) for w in range(3)]
    for window in events:
        for event in window:
            event["url"] = f"http://{event['domain']}/p{rnd.randrange(20)}.png"
            event["client_ip"] = f"10.0.0.{rnd.randrange(50)}"
            event["latency_ms"] = float(rnd.randrange(1, 900))
    results, levels, policy = through_thin_link(ROLLED_UP, events, range(0), pin="rolled up")
    assert policy.pinned and set(levels) == {1}
    coarse = query_from_source(ROLLED_UP.replace(
        "logs.window(", "logs.with_column('url', col('url').url_domain()).window("), "<test>")
    want = {r.window_start: r.rows for r in js.run_local(coarse, [e for w in events for e in w])}
    assert sorted(r.window_start for r in results) == sorted(want) == [0, 1000, 2000]
    for result in results:
        assert result.rolled_up == {"url": "url.url_domain()"} and not result.exact
        assert result.error_bound == 0.0
        assert sorted(result.rows, key=lambda r: r["url"]) == sorted(
            want[result.window_start], key=lambda r: r["url"])
