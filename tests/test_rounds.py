"""TPUT's rounds in the data plane's terms: whatever the split of a window's data over the
children, three rounds settle it, and the complete rows give exactly the top-k (every
aggregate of it) that merging everything gives."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.aggtree.planner import Fragment
from jetstream.approx.levels import Ranking, ranking
from jetstream.approx.rounds import Ask, answer, exact_rows, first_answer, next_asks, settled
from jetstream.approx.truncate import (
    BoundedPartial,
    bounds,
    exact_partial,
    merge_bounded,
    top_k_bounds,
    truncate,
)
from jetstream.control.server import start_server
from jetstream.dataplane.asks import KEPT_WINDOWS, Answerer
from jetstream.dataplane.codec import ask_from_proto, ask_to_proto, encode_batch
from jetstream.dataplane.merger import WindowMerger
from jetstream.dataplane.options import Assignment, SiteOptions
from jetstream.dataplane.partials import ENDED, PartialBatch, summarised
from jetstream.dataplane.site import SiteRuntime
from jetstream.dataplane.transport import PartialSender
from jetstream.errors import DataError
from jetstream.operators import Phase, WindowAggregate
from jetstream.queryfile import query_from_source
from jetstream.rewrite import distributed
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as rpc
from tests.conftest import log, spec_of
from tests.test_degradation import root_site
from tests.test_merger import site_batches, split
from tests.tput_reference import tput

AGGREGATE = WindowAggregate(
    schema=js.Schema.of({"domain": js.DataType.STRING, "requests": js.DataType.PARTIAL,
                         "kb": js.DataType.PARTIAL}),
    keys=("domain",), aggregates=(("requests", js.count()), ("kb", js.sum("bytes"))),
    phase=Phase.PARTIAL)
COUNT, KB = (agg for _, agg in AGGREGATE.aggregates)

# A child's window: domain -> the sizes of its requests (a count and a sum rank them).
RECORDS = st.dictionaries(st.sampled_from([f"d{i:02d}" for i in range(30)]),
                          st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0, 40.0]), min_size=1,
                                   max_size=6), max_size=30)


def rows_of(window: dict[str, list[float]]) -> list[dict[str, Any]]:
    out = []
    for domain, sizes in window.items():
        kb = KB.create()
        for size in sizes:
            kb = KB.add(kb, size)
        out.append({"domain": domain, "requests": len(sizes), "kb": kb})
    return out


def top(rows: BoundedPartial, rank: str, k: int) -> list[tuple[Any, ...]]:
    picked = top_k_bounds(rows, AGGREGATE, rank, k).rows
    return [(r["domain"], COUNT.extract(r["requests"]), KB.extract(r["kb"])) for r in picked]


def run_rounds(children: dict[str, list[dict[str, Any]]], local: list[dict[str, Any]],
               rank: str, k: int) -> tuple[BoundedPartial, int]:
    """Every child answers round 1, then whatever is asked, until nothing is: the merge and
    how many rounds it took."""
    sent: dict[str, frozenset[Any]] = {}
    inputs: dict[str, BoundedPartial] = {"root": exact_partial(local)}
    for name, rows in children.items():
        inputs[name], sent[name] = first_answer(rows, k, AGGREGATE, rank)
    rounds = 1
    while asks := next_asks(inputs, AGGREGATE, rank, k):
        rounds += 1
        assert rounds <= 3, asks
        for name, ask in asks.items():
            inputs[name], sent[name] = answer(children[name], sent[name], ask, AGGREGATE, rank)
    return merge_bounded(inputs.values(), AGGREGATE), rounds


@settings(max_examples=300, deadline=None)
@given(st.lists(RECORDS, min_size=1, max_size=5), RECORDS, st.sampled_from(["requests", "kb"]),
       st.integers(1, 8))
def test_three_rounds_give_the_exact_top_k_with_every_aggregate(
        windows: list[dict[str, list[float]]], local: dict[str, list[float]], rank: str,
        k: int) -> None:
    children = {f"c{i}": rows_of(w) for i, w in enumerate(windows)}
    merged, _ = run_rounds(children, rows_of(local), rank, k)
    assert settled(merged, AGGREGATE, rank, k)
    everything = merge_bounded([exact_partial(rows_of(local)),
                                *(exact_partial(r) for r in children.values())], AGGREGATE)
    assert top(exact_partial(exact_rows(merged)), rank, k) == top(everything, rank, k)


@settings(max_examples=200, deadline=None)
@given(st.lists(RECORDS, min_size=2, max_size=4), st.sampled_from(["requests", "kb"]),
       st.integers(1, 6), st.integers(1, 12))
def test_a_window_with_an_input_stepped_down_from_the_rounds_has_bounds_that_hold(
        windows: list[dict[str, list[float]]], rank: str, k: int, keep: int) -> None:
    """One input sends its window truncated (its link stepped down from the rounds), the
    others answer in rounds: the window goes out once they have answered all they are asked
    (no deadline): exact if the rounds settled it all the same, else with bounds (every
    row's, and the one on the keys left out) that hold the true ranking values."""
    rows = {f"c{i}": rows_of(w) for i, w in enumerate(windows)}
    ranked_by = Ranking(k, rank, integral=rank == "requests")
    merger = WindowMerger(AGGREGATE, rows, deadline_s=600, rounds=ranked_by)
    answerers = {name: Answerer(AGGREGATE, ranked_by, keep_s=60) for name in list(rows)[1:]}
    for name, held in rows.items():
        batch = PartialBatch("q", (0, 1), name, tuple(held))
        if name in answerers:
            merger.add(answerers[name].first(batch))
        else:
            merger.add(summarised(batch, truncate(held, AGGREGATE, rank, keep), level=1))
        merger.progress(name, 1)
    sequence = 0
    for _ in range(5):  # three rounds at most, then it goes
        if out := merger.ready():
            break
        for origin, window, ask in merger.asks():
            sequence += 1
            if (got := answerers[origin].answer(window, ask, sequence)) is not None:
                merger.add(got)
    [merged] = out
    truth = merge_bounded([exact_partial(held) for held in rows.values()], AGGREGATE)
    if merged.slack is None:  # settled by the rounds all the same: the exact top-k
        assert top(merged.bounded, rank, k) == top(truth, rank, k)
        return
    value = {row["domain"]: v for row, v in zip(truth.rows, bounds(truth, AGGREGATE, rank).lb,
                                                 strict=True)}
    got = bounds(merged.bounded, AGGREGATE, rank)
    for row, lb, ub in zip(got.rows, got.lb, got.ub, strict=True):
        assert lb <= value[row["domain"]] <= ub, (row, lb, ub)
    left_out = set(value) - {row["domain"] for row in got.rows}
    assert all(value[d] <= merged.omitted for d in left_out), (left_out, merged.omitted)


def counted(counts: dict[str, int]) -> list[dict[str, Any]]:
    """A child's rows from its requests a domain (each of 1 kB)."""
    return [{"domain": domain, "requests": n, "kb": KB.add(KB.create(), float(n))}
            for domain, n in counts.items()]


def shipped(children: dict[str, list[dict[str, Any]]], k: int) -> tuple[BoundedPartial, int]:
    """The rounds run, with how many rows the children sent (each key once a child, the
    empty rows of keys asked for and not held included)."""
    sent: dict[str, frozenset[Any]] = {}
    inputs: dict[str, BoundedPartial] = {}
    for name, rows in children.items():
        inputs[name], sent[name] = first_answer(rows, k, AGGREGATE, "requests")
    rounds = 1
    while asks := next_asks(inputs, AGGREGATE, "requests", k):
        rounds += 1
        assert rounds <= 3, asks
        for name, ask in asks.items():
            inputs[name], sent[name] = answer(children[name], sent[name], ask, AGGREGATE,
                                              "requests")
    return merge_bounded(inputs.values(), AGGREGATE), sum(len(s) for s in sent.values())


COUNTS = st.lists(st.dictionaries(st.sampled_from([f"d{i:02d}" for i in range(24)]),
                                  st.one_of(st.integers(1, 4), st.integers(1, 10**6)),
                                  max_size=16), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(COUNTS, st.one_of(st.integers(1, 3), st.integers(1, 30)))
def test_the_rounds_give_what_the_papers_tput_gives_shipping_no_more(
        children: list[dict[str, int]], k: int) -> None:
    # The oracle: TPUT's three rounds as the paper states them (tests/tput_reference.py).
    reference = tput(children, k)
    merged, rows = shipped({f"c{i}": counted(c) for i, c in enumerate(children)}, k)
    assert settled(merged, AGGREGATE, "requests", k)
    got = [(domain, n) for domain, n, _ in top(exact_partial(exact_rows(merged)),
                                                "requests", k)]
    assert got == list(reference.top)
    assert rows <= sum(reference.shipped) + reference.asked


def skewed_children(n_sites: int = 20, n_keys: int = 2000, requests: int = 20_000,
                    seed: int = 7) -> list[dict[str, int]]:
    """Requests a domain: Zipf(1.1) popularity, each site with its own taste."""
    rng = random.Random(seed)
    domains = [f"domain{i:04d}.com" for i in range(n_keys)]
    popularity = [1 / (rank + 1) ** 1.1 for rank in range(n_keys)]
    sites = []
    for _ in range(n_sites):
        taste = [p * rng.lognormvariate(0, 0.5) for p in popularity]
        sites.append(dict(Counter(rng.choices(domains, weights=taste, k=requests))))
    return sites


@pytest.mark.parametrize(("k", "most"), [(10, 0.05), (50, 0.2)])
def test_the_rounds_ship_far_fewer_rows_than_every_child_sending_everything(
        k: int, most: float) -> None:
    children = skewed_children()
    everything = sum(len(c) for c in children)
    merged, rows = shipped({f"c{i}": counted(c) for i, c in enumerate(children)}, k)
    got = [(domain, n) for domain, n, _ in top(exact_partial(exact_rows(merged)),
                                                "requests", k)]
    assert got == list(tput(children, k).top)
    assert rows / everything < most, (rows, everything)


def test_a_skewed_window_ships_few_rows() -> None:
    # 4 children, 300 domains with Zipf-like counts, each child its own order (regional
    # favourites): the top 5 needs more than one round and a small share of the rows.
    children = {f"c{c}": rows_of({f"d{(i + 3 * c) % 300:03d}": [1.0] * (3000 // (i + 1))
                                  for i in range(300)}) for c in range(4)}
    merged, rounds = run_rounds(children, [], "requests", 5)
    assert 2 <= rounds <= 3, rounds
    assert len(merged.rows) < 40, len(merged.rows)
    everything = merge_bounded([exact_partial(r) for r in children.values()], AGGREGATE)
    assert top(exact_partial(exact_rows(merged)), "requests", 5) == top(everything,
                                                                        "requests", 5)


def test_an_answer_keeps_what_was_sent_and_says_what_it_holds_back() -> None:
    rows = rows_of({"a": [1.0] * 5, "b": [1.0] * 3, "c": [1.0] * 2, "d": [1.0]})
    first, sent = first_answer(rows, 1, AGGREGATE, "requests")
    assert [r["domain"] for r in first.rows] == ["a"] and first.omitted == 3
    more, sent = answer(rows, sent, Ask(threshold=2.0), AGGREGATE, "requests")
    assert [r["domain"] for r in more.rows] == ["a", "b", "c"] and more.omitted == 1
    keyed, sent = answer(rows, sent, Ask(keys=(("z",),)), AGGREGATE, "requests")
    assert [(r["domain"], r["requests"]) for r in keyed.rows] == [
        ("a", 5), ("b", 3), ("c", 2), ("z", 0)]
    assert keyed.truncated and keyed.omitted == 1
    every, _ = answer(rows, sent, Ask(threshold=0.0), AGGREGATE, "requests")
    assert not every.truncated and len(every.rows) == 5


@pytest.mark.parametrize("k", [1, 3])
def test_a_tie_at_the_kth_value_is_fetched_not_guessed(k: int) -> None:
    # "b" and "c" tie overall; only one child sent each of them in round 1.
    children = {"x": rows_of({"a": [1.0] * 9, "b": [1.0] * 4, "c": [1.0] * 2}),
                "y": rows_of({"a": [1.0] * 9, "c": [1.0] * 4, "b": [1.0] * 2})}
    merged, _ = run_rounds(children, [], "requests", k)
    everything = merge_bounded([exact_partial(r) for r in children.values()], AGGREGATE)
    assert top(exact_partial(exact_rows(merged)), "requests", k) == top(everything,
                                                                        "requests", k)


def test_an_unsent_key_that_may_tie_the_kth_and_wins_the_tie_is_fetched() -> None:
    # Round 1 with k = 1: x sends b (5) and holds back a (4); y sends all it has, a (1).
    # a may total 5, as b does, and wins a tie on its key: the window is not settled yet.
    children = {"x": rows_of({"b": [1.0] * 5, "a": [1.0] * 4}), "y": rows_of({"a": [1.0]})}
    inputs = {name: first_answer(rows, 1, AGGREGATE, "requests")[0]
              for name, rows in children.items()}
    assert not settled(merge_bounded(inputs.values(), AGGREGATE), AGGREGATE, "requests", 1)
    merged, rounds = run_rounds(children, [], "requests", 1)
    assert rounds == 2
    assert top(exact_partial(exact_rows(merged)), "requests", 1) == [("a", 5, 5.0)]


# --- over real gRPC: two edge sites answer the root's rounds ----------------------------------

SOURCE = """
import jetstream as js
logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)
query = js.Query('q', logs.window(js.tumbling('1s'), watermark='0s').group_by('domain')
                 .agg(requests=js.count(), kb=js.sum('bytes')).top_k(5, by='requests'))
"""


def edge_events(edge: int, window: int, rnd: random.Random) -> list[dict[str, Any]]:
    """A second of Zipf-distributed requests over 400 domains, in the edge's own order."""
    weights = [1 / (i + 1) ** 1.1 for i in range(400)]
    picks = rnd.choices(range(400), weights, k=2000)
    return [log(window * 1000 + i % 1000, f"d{(p + 7 * edge) % 400}.example.com",
                bytes=rnd.randint(100, 90_000)) for i, p in enumerate(picks)]


def through_rounds(events: dict[int, list[list[dict[str, Any]]]], cut: bool = False,
                   pins: dict[int, str] | None = None, deadline_s: float = 30.0
                   ) -> tuple[list[Any], int, int]:
    """Two edges (1 and 2) send ``events`` (by edge, a list a window) to a root over real
    gRPC, on links that run TPUT's rounds, each pinned at a level by ``pins`` (none: the
    rounds): the results, the bytes the edges sent, and what exact partials would have
    taken. With ``cut``, the root's server goes away after two windows and comes back on the
    same port: pushes and rounds streams reconnect, unanswered asks are asked again."""
    query = query_from_source(SOURCE, "<test>")
    _, site_query, partial = split(query)
    windows = len(events[1])
    root, results, done = root_site(SOURCE, "q", ("e1", "e2"), ("p1", "p2"),
                                    deadline_s=deadline_s)
    server, port = start_server([(rpc.add_DataPlaneServicer_to_server, root.servicer,
                                  "jetstream.v1.DataPlane")], 0)
    edges = {}
    exact_bytes = 0
    try:
        for e in (1, 2):
            edge = edges[e] = SiteRuntime(f"e{e}", SiteOptions(deadline_s=30),
                                          lambda *_: None)
            edge.deploy(Assignment(Fragment("q", f"e{e}", children=(f"p{e}",), parent="dc",
                                            rounds=True), spec_of(SOURCE),
                                   parent_address=f"127.0.0.1:{port}", covers=(f"p{e}",)))
            if pins and e in pins:
                assert edge.set_level("q", pins[e]).pinned
        for w in range(windows):
            if cut and w == 2:
                deadline = time.monotonic() + 30
                while len(results) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)
                server.stop(grace=0).wait(5)
                server, _ = start_server([(rpc.add_DataPlaneServicer_to_server,
                                           root.servicer, "jetstream.v1.DataPlane")], port)
            for e, edge in edges.items():
                [batch] = site_batches(site_query, partial, f"p{e}", events[e][w])
                exact_bytes += encode_batch(batch, partial).ByteSize()
                run = edge.run("q")
                assert run is not None
                run.merger.add(batch)
                run.merger.progress(f"p{e}", batch.window[1])
        for e, edge in edges.items():
            run = edge.run("q")
            assert run is not None
            run.merger.progress(f"p{e}", ENDED, ended=True)
        assert done.wait(60), f"{len(results)} results"
        sent = sum(edge.run("q").sender.bytes_sent for edge in edges.values())  # type: ignore[union-attr]
    finally:
        for edge in edges.values():
            edge.close()
        root.close()
        server.stop(grace=0).wait(5)
    return results, sent, exact_bytes


@pytest.mark.parametrize("cut", [False, True], ids=["steady", "connections-cut"])
def test_edges_answering_rounds_give_the_exact_results_for_a_fraction_of_the_bytes(
        cut: bool) -> None:
    query = query_from_source(SOURCE, "<test>")
    rnd = random.Random(3)
    windows = 4
    events = {e: [edge_events(e, w, rnd) for w in range(windows)] for e in (1, 2)}
    results, sent, exact_bytes = through_rounds(events, cut)
    # Each window went out once, exact: held until its rounds settled it.
    latest = {r.window_start: r for r in results}
    assert sorted(latest) == [w * 1000 for w in range(windows)] and len(results) == windows
    for w, result in latest.items():
        truth = js.run_local(query, events[1][w // 1000] + events[2][w // 1000])[0]
        assert result.exact and result.rows == truth.rows, (w, result.rows, truth.rows)
    assert sent < exact_bytes / 3, (sent, exact_bytes)


@pytest.mark.parametrize("pins", [{1: "top 10"}, {1: "top 40", 2: "sketch of 12"}],
                         ids=["one-truncated", "truncated-and-sketched"])
def test_a_link_of_rounds_stepped_down_sends_bounds_and_its_windows_wait_for_no_deadline(
        pins: dict[int, str]) -> None:
    """The rounds are a link's top rung: pinned below them, an edge sends its windows
    truncated or sketched and is never asked; each window goes out as soon as the edges
    still in rounds have answered (the root's deadline is ten minutes), marked inexact, with
    bounds that hold every domain's true count."""
    query = query_from_source(SOURCE, "<test>")
    rnd = random.Random(5)
    windows = 3
    events = {e: [edge_events(e, w, rnd) for w in range(windows)] for e in (1, 2)}
    results, _, _ = through_rounds(events, pins=pins, deadline_s=600)
    latest = {r.window_start: r for r in results}
    assert sorted(latest) == [w * 1000 for w in range(windows)]
    for w, result in latest.items():
        counts = Counter(r["domain"] for r in events[1][w // 1000] + events[2][w // 1000])
        assert not result.exact and result.error_bound is not None, result
        assert len(result.rows) == 5
        for row in result.rows:
            assert row["lb"] <= counts[row["domain"]] <= row["ub"], row
        truth = js.run_local(query, events[1][w // 1000] + events[2][w // 1000])[0]
        top = [r["domain"] for r in truth.rows]
        assert any(r["domain"] in top for r in result.rows)


def test_a_child_that_stops_answering_leaves_a_window_with_bounds_never_called_exact() -> None:
    query = query_from_source(SOURCE, "<test>")
    _, site_query, partial = split(query)
    rnd = random.Random(4)
    events = {e: edge_events(e, 0, rnd) for e in (1, 2)}
    root, results, _ = root_site(SOURCE, "q", ("e1", "e2"), ("p1", "p2"), deadline_s=1.5)
    server, port = start_server([(rpc.add_DataPlaneServicer_to_server, root.servicer,
                                  "jetstream.v1.DataPlane")], 0)
    rank = ranking(distributed(query))
    assert rank is not None
    senders = []
    try:
        for e in (1, 2):  # each sends round 1, and then never answers an ask
            [batch] = site_batches(site_query, partial, f"e{e}", events[e])
            sender = PartialSender(f"127.0.0.1:{port}")
            senders.append(sender)
            sender.send(encode_batch(Answerer(partial, rank, keep_s=60).first(batch), partial))
            sender.send_progress(pb.Progress(query="q", origin=f"e{e}", watermark_ms=ENDED,
                                             ended=True, sequence=1))
        deadline = time.monotonic() + 20
        while not results and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for sender in senders:
            sender.close()
        root.close()
        server.stop(grace=0).wait(5)
    [result] = results
    assert not result.exact and result.error_bound is not None
    counts: dict[str, int] = {}
    for record in events[1] + events[2]:
        counts[record["domain"]] = counts.get(record["domain"], 0) + 1
    for row in result.rows:
        assert row["lb"] <= counts[row["domain"]] <= row["ub"], row


def test_a_child_keeps_a_windows_rows_for_asks_as_long_as_it_was_told() -> None:
    now = [0.0]
    rank = Ranking(k=1, by="requests")
    answerer = Answerer(AGGREGATE, rank, keep_s=30, clock=lambda: now[0])
    for w in range(300):  # a replay hands on many windows at once: all are kept
        answerer.first(PartialBatch("q", (w, w + 1), "e", tuple(rows_of({"a": [1.0], "b": [2.0]}))))
    assert answerer.answer((0, 1), Ask(threshold=0.0), 1) is None  # over KEPT_WINDOWS
    assert answerer.answer((299 - KEPT_WINDOWS + 1, 300 - KEPT_WINDOWS + 1),
                           Ask(threshold=0.0), 1) is not None
    now[0] = 31.0  # past keep_s: the next window's first answer lets the old ones go
    answerer.first(PartialBatch("q", (500, 501), "e",
                                tuple(rows_of({"a": [1.0], "b": [2.0, 2.0]}))))
    assert answerer.answer((299, 300), Ask(threshold=0.0), 2) is None
    got = answerer.answer((500, 501), Ask(threshold=0.0), 2)
    assert got is not None and not got.rounds and sorted(r["domain"] for r in got.rows) == [
        "a", "b"]
    # Asked again (its ask may have been lost): nothing new, the last answer is on its way.
    assert answerer.answer((500, 501), Ask(threshold=0.0), 3) is None
    assert answerer.keeps((500, 501))


def test_a_window_costs_every_revision_sent_for_it_and_the_asks() -> None:
    merger = WindowMerger(AGGREGATE, ["e"], deadline_s=60)
    rows = tuple(rows_of({"a": [1.0]}))
    merger.add(PartialBatch("q", (0, 10), "e", rows, wan_bytes=300))
    merger.charge((0, 10), 25)  # an ask sent down about it
    merger.add(PartialBatch("q", (0, 10), "e", rows, wan_bytes=120, revision=1))
    merger.add(PartialBatch("q", (0, 10), "e", rows, wan_bytes=300))  # the first, resent late
    [merged] = merger.ready()
    assert merged.wan_bytes == 300 + 25 + 120 + 300


def test_an_ask_a_child_cannot_read_is_refused_and_the_next_is_answered() -> None:
    answerer = Answerer(AGGREGATE, Ranking(k=1, by="requests"), keep_s=30)
    answerer.first(PartialBatch("q", (0, 1), "e", tuple(rows_of({"a": [1.0], "b": [2.0] * 2}))))
    for bad in (pb.RoundAsk(window_start_ms=0, window_end_ms=1, keys="[1, 2]"),
                pb.RoundAsk(window_start_ms=0, window_end_ms=1, keys="{"),
                pb.RoundAsk(window_start_ms=0, window_end_ms=1, by_threshold=True,
                            threshold=float("nan"))):
        with pytest.raises(DataError):
            ask_from_proto(bad)
    window, ask = ask_from_proto(pb.RoundAsk(window_start_ms=0, window_end_ms=1,
                                             keys='[["a", "b"]]'))  # two values, one key column
    with pytest.raises(ValueError):
        answerer.answer(window, ask, 1)
    window, ask = ask_from_proto(ask_to_proto((0, 1), Ask(keys=(("a",),))))
    got = answerer.answer(window, ask, 2)
    assert got is not None and sorted(r["domain"] for r in got.rows) == ["a", "b"]
