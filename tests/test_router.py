"""A partitioned merge: inputs cut by key (``split_batch``), merged per partition, put back
together (``WindowMerger(key_partitions=True)``) equals the reference executor; the router
sends each worker its part over gRPC and a worker that starts again gets everything back."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream import metrics
from jetstream.approx.items import to_items
from jetstream.approx.levels import Ranking, ranking
from jetstream.approx.truncate import exact_partial
from jetstream.control.server import start_server
from jetstream.dataplane import uplink as uplink_module
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.cubes import CubeStore
from jetstream.dataplane.merger import MergedWindow, WindowMerger
from jetstream.dataplane.options import SiteOptions
from jetstream.dataplane.partials import ENDED, PartialBatch
from jetstream.dataplane.router import Router, own_rows, split_batch, top_k_candidates
from jetstream.dataplane.servicer import DataPlaneServicer
from jetstream.dataplane.transport import PartialSender
from jetstream.dataplane.uplink import Uplink
from jetstream.operators import WindowAggregate
from jetstream.v1 import dataplane_pb2_grpc as rpc
from tests.conftest import log
from tests.test_merger import (
    EVENTS,
    QUERIES,
    SITES,
    assert_reference_results,
    deliver,
    early_messages,
    site_batches,
    split,
)


def _partitioned(partial: WindowAggregate, sent: dict[str, list[PartialBatch]], count: int,
                 trim: js.Query | None = None) -> WindowMerger:
    """What a site with ``count`` workers merges: every input's batches cut by key, merged per
    partition (each partition's windows cut to its top-k candidates given ``trim``), and the
    partitions' windows put together."""
    workers = [WindowMerger(partial, SITES, deadline_s=60, clock=lambda: 0.0)
               for _ in range(count)]
    for site, batches in sent.items():
        for batch in batches:
            for worker, part in zip(workers, split_batch(batch, partial.keys, count),
                                    strict=True):
                worker.add(part)
        for worker in workers:
            worker.progress(site, 0, ended=True)
    rank = ranking(trim) if trim is not None else None
    site = WindowMerger(partial, [f"w{i}" for i in range(count)], deadline_s=60,
                        clock=lambda: 0.0, key_partitions=True)
    for i, worker in enumerate(workers):
        for m in worker.ready():
            site.add(_sent_on(m, f"w{i}", partial, rank))
        site.progress(f"w{i}", 0, ended=True)
    return site


def _sent_on(m: MergedWindow, origin: str, partial: WindowAggregate,
             rank: Ranking | None) -> PartialBatch:
    """What a worker sends its site of a merged window: its top-k candidates given a
    ranking, else every row."""
    rows = top_k_candidates(m.rows, partial, rank) if rank is not None else m.rows
    return PartialBatch("q", m.window, origin, rows, events=m.events, covers=m.covers,
                        revision=m.revision, early=m.early)


@settings(max_examples=60, deadline=None)
@given(EVENTS, st.sampled_from(range(len(QUERIES))), st.integers(1, 4))
def test_a_merge_over_key_partitions_gives_the_reference_results(
        events: list[dict[str, Any]], which: int, count: int) -> None:
    query = js.Query("q", QUERIES[which])
    optimized, site_query, partial = split(query)
    sent = {site: site_batches(site_query, partial, site, [e for e in events if e["pop"] == site])
            for site in SITES}
    # Query 0 ends in a top-k by a count: its partitions send only their top-k candidates.
    merger = _partitioned(partial, sent, count, trim=optimized if which == 0 else None)
    merged = merger.ready()
    assert merger.finished
    sites_with_data = {e["pop"] for e in events}
    for m in merged:
        assert m.complete and not m.correction
        assert m.covers >= {s for s in sites_with_data if any(
            b.window == m.window for b in sent[s])}
        assert m.events == sum(b.events for s in SITES for b in sent[s] if b.window == m.window)
    assert_reference_results(query, optimized, merged, events)


@settings(max_examples=60, deadline=None)
@given(EVENTS, st.sampled_from(range(len(QUERIES))), st.integers(1, 3),
       st.randoms(use_true_random=False))
def test_workers_that_send_windows_early_give_the_reference_results(
        events: list[dict[str, Any]], which: int, count: int, rng: Any) -> None:
    """The sites send each window early, then whole if records came after, then that they
    ended; each worker of the site's final merge sends its partition of a window (its top-k
    candidates, for query 0) as soon as every site has sent it, early, and its watermark
    after. Whatever the order, the site puts out each window once, after every watermark
    passed it, equal to the reference."""
    query = js.Query("q", QUERIES[which])
    optimized, site_query, partial = split(query)
    rank = ranking(optimized) if which == 0 else None
    workers = [WindowMerger(partial, SITES, deadline_s=60, clock=lambda: 0.0,
                            forward_early=True) for _ in range(count)]
    site = WindowMerger(partial, [f"w{i}" for i in range(count)], deadline_s=60,
                        clock=lambda: 0.0, key_partitions=True)

    def tick(i: int) -> None:
        watermark = workers[i].watermark
        for m in workers[i].ready():
            site.add(_sent_on(m, f"w{i}", partial, rank))
        if watermark is not None:
            site.progress(f"w{i}", watermark, ended=watermark == ENDED)

    merged: list[MergedWindow] = []
    queues = {s: list(msgs) for s, msgs in early_messages(site_query, partial, events,
                                                           rng).items()}
    while any(queues.values()):
        message = queues[rng.choice([s for s, q in queues.items() if q])].pop(0)
        parts = (split_batch(message, partial.keys, count)
                 if isinstance(message, PartialBatch) else [message] * count)
        for i, (worker, part) in enumerate(zip(workers, parts, strict=True)):
            deliver(worker, part)
            if rng.random() < 0.5:
                tick(i)
        for window in site.ready():
            assert not window.correction, "a window went out before it was final"
            merged.append(window)
    for i in range(count):
        tick(i)
    merged += site.ready()
    assert site.finished
    assert all(m.complete and not m.correction for m in merged)
    assert_reference_results(query, optimized, merged, events)


def test_a_batch_splits_into_disjoint_parts_that_keep_its_bounds_and_count_it_once() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    [batch] = site_batches(site_query, partial, "ams",
                           [log(1_000, f"d{i}.com") for i in range(40)])
    bounded = PartialBatch("q", batch.window, "ams", batch.rows, events=40, wan_bytes=900,
                           slack=tuple(float(i) for i in range(len(batch.rows))), omitted=7.0,
                           complete_rows=tuple(i % 2 == 0 for i in range(len(batch.rows))))
    parts = split_batch(bounded, partial.keys, 3)
    assert sorted(r["domain"] for p in parts for r in p.rows) == sorted(
        r["domain"] for r in batch.rows)
    assert all(p.rows for p in parts)  # 40 keys over 3 partitions: none empty
    for part in parts:
        for row, slack, whole in zip(part.rows, part.slack or (), part.complete_rows or (),
                                     strict=True):
            i = batch.rows.index(row)
            assert (slack, whole) == (float(i), i % 2 == 0)
        assert part.omitted == 7.0 and part.identity == bounded.identity
    assert [(p.events, p.wan_bytes) for p in parts] == [(40, 900), (0, 0), (0, 0)]


def test_a_window_covers_a_site_only_if_every_partition_does() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    [batch] = site_batches(site_query, partial, "ams", [log(1_000, "a.com")])
    merger = WindowMerger(partial, ["w0", "w1"], deadline_s=5, clock=lambda: 10.0,
                          key_partitions=True)
    merger.add(PartialBatch("q", batch.window, "w0", batch.rows,
                            covers=frozenset({"ams", "sfo"})))
    merger.add(PartialBatch("q", batch.window, "w1", (), covers=frozenset({"ams"})))
    [both] = merger.ready()
    assert both.covers == {"ams"}  # w1 lacks sfo's part
    lone = WindowMerger(partial, ["w0", "w1"], deadline_s=0, clock=lambda: 10.0,
                        key_partitions=True)
    lone.add(PartialBatch("q", batch.window, "w0", batch.rows, covers=frozenset({"ams"})))
    [partial_window] = lone.ready()  # past its deadline without w1
    assert partial_window.missing == {"w1"} and partial_window.covers == frozenset()


def test_truncated_partitions_keep_their_own_bounds_when_put_together() -> None:
    """A key is in one partition only: its slack is that partition's, and a key in no row
    is bounded by the largest partition's omitted, not by their sum."""
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    [batch] = site_batches(site_query, partial, "ams",
                           [log(1_000, f"d{i}.com") for i in range(12)])
    parts = split_batch(batch, partial.keys, 2)
    merger = WindowMerger(partial, ["w0", "w1"], deadline_s=5, clock=lambda: 0.0,
                          key_partitions=True)
    for i, (part, omitted) in enumerate(zip(parts, (5.0, 7.0), strict=True)):
        merger.add(dataclasses.replace(part, origin=f"w{i}", slack=(1.0,) * len(part.rows),
                                       omitted=omitted,
                                       complete_rows=(False,) * len(part.rows)))
    [merged] = merger.ready()
    assert merged.omitted == 7.0
    assert sorted(r["domain"] for r in merged.rows) == sorted(r["domain"] for r in batch.rows)
    assert merged.slack == (1.0,) * len(batch.rows)


class _Worker:
    """A real data-plane server on a free port, keeping what it is sent; given ``part``
    (index, count), it keeps only its key partition's rows, as a worker's run does; it
    runs the query once ``ready`` is set (until then it answers NOT_FOUND)."""

    def __init__(self, partial: WindowAggregate, part: tuple[int, int] = (0, 1),
                 ready: threading.Event | None = None,
                 routes: list[str] | None = None) -> None:
        self.batches: list[PartialBatch] = []
        self.progress: dict[str, int] = {}
        self.reports: list[tuple[int, bool]] = []  # every progress report, in order
        known: dict[tuple[Any, ...], int] = {}

        def deliver(batch: PartialBatch) -> None:
            self.batches.append(own_rows(batch, partial.keys, part, known))

        def progress(report: Any) -> None:
            self.progress[report.origin] = report.watermark_ms
            self.reports.append((report.watermark_ms, report.ended))

        self.servicer = DataPlaneServicer(
            lambda q: partial if ready is None or ready.is_set() else None, deliver, progress,
            routes=lambda q: [(a, "e1") for a in routes or ()])
        self.server, port = start_server([(rpc.add_DataPlaneServicer_to_server, self.servicer,
                                           "jetstream.v1.DataPlane")], 0)
        self.address = f"127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.stop(None)


def _wait(what: str, check: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_router_sends_each_worker_its_part_and_a_restarted_one_everything_again() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    batches = site_batches(site_query, partial, "sfo",
                           [log(t * 1_000, f"d{t % 9}.com") for t in range(30)])
    workers = [_Worker(partial), _Worker(partial)]
    router = Router("q", partial, [w.address for w in workers], connect=None, retain_s=600,
                    link=lambda i: f"ams->ams/w{i}")
    try:
        for batch in batches:
            router.send(batch)
        router.progress("sfo", 25_000, ended=False)
        for i, worker in enumerate(workers):
            _wait(f"worker {i} got every part", lambda w=worker: len(w.batches) == len(
                batches) and w.progress.get("sfo") == 25_000)
        got = {i: {r["domain"] for b in w.batches for r in b.rows} for i, w in enumerate(workers)}
        assert got[0] | got[1] == {r["domain"] for b in batches for r in b.rows}
        assert not got[0] & got[1]
        workers[1].stop()  # the worker dies with what it had; a new one starts elsewhere
        again = _Worker(partial)
        router.move(1, again.address)
        _wait("the new worker got it all again", lambda: len(again.batches) == len(batches)
              and again.progress.get("sfo") == 25_000)
        assert {r["domain"] for b in again.batches for r in b.rows} == got[1]
        assert router.addresses == [workers[0].address, again.address]
        again.stop()
    finally:
        router.close()
        workers[0].stop()


def test_a_refused_part_is_sent_again_until_a_worker_takes_it() -> None:
    """A worker that does not run the query yet (NOT_FOUND) gets the part once it does."""
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    [batch] = site_batches(site_query, partial, "sfo", [log(1_000, "a.com")])
    ready = threading.Event()
    got: list[PartialBatch] = []
    servicer = DataPlaneServicer(lambda q: partial if ready.is_set() else None, got.append)
    server, port = start_server([(rpc.add_DataPlaneServicer_to_server, servicer,
                                  "jetstream.v1.DataPlane")], 0)
    router = Router("q", partial, [f"127.0.0.1:{port}"], connect=None, retain_s=600,
                    link=lambda i: "ams->ams/w0")
    try:
        router.send(batch)
        time.sleep(0.5)
        assert got == []
        ready.set()
        _wait("the part arrived once the worker ran the query", lambda: len(got) == 1)
        assert got[0].rows == batch.rows
    finally:
        router.close()
        server.stop(None)



def test_a_restarted_worker_sends_revisions_that_replace_the_dead_ones() -> None:
    """A worker started again counts its revisions from a higher base (its epoch), so what it
    rebuilds replaces what the dead one sent, at the site's servicer and merger alike."""
    import itertools

    from jetstream import metrics
    from jetstream.dataplane.merger import MergedWindow
    from jetstream.dataplane.options import SiteOptions
    from jetstream.dataplane.uplink import Uplink

    query = js.Query("q", QUERIES[0])
    optimized, site_query, partial = split(query)
    [batch] = site_batches(site_query, partial, "ams", [log(1_000, "a.com"), log(2_000, "b.com")])
    site = _Worker(partial)  # the site's data plane, where workers send their partitions
    got: list[int] = []
    try:
        for epoch in (0, 1):
            options = SiteOptions(worker=True, revision_base=epoch * 1_000_000)
            link = Uplink("dc/s1", "dc", site.address, query=optimized, partial=partial,
                          ranking=ranking(optimized), options=options, store=None,
                          run_metrics=metrics.RunMetrics("dc/s1", "q"),
                          sequence=itertools.count(1), top_k_only=True)
            link.send(MergedWindow(batch.window, batch.rows, frozenset({"ams"}), frozenset(),
                                   events=2, error_bound=0.0, covers=frozenset({"ams"})))
            _wait("the partition arrived", lambda n=epoch + 1: len(site.batches) == n)
            link.close()
            got.append(site.batches[-1].revision)
        assert got == [0, 1_000_000]  # a new identity, and a newer revision for the merger
        assert all(len(b.rows) == 2 for b in site.batches)  # both within the top 2
    finally:
        site.stop()


def test_a_child_hears_of_a_batch_once_every_worker_has_acked_its_part(tmp_path: Path) -> None:
    """Sent to its parent's workers over the wide area, a batch stays in the child's store
    until every part is acked, and the link's policy hears of it once: all the parts' bytes,
    the slowest part's time."""
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    batches = site_batches(site_query, partial, "sfo",
                           [log(t * 1_000, f"d{t % 9}.com") for t in range(30)])
    late = threading.Event()
    workers = [_Worker(partial, (0, 2)), _Worker(partial, (1, 2), ready=late)]
    store = CubeStore(tmp_path / "cubes.sqlite")
    acks: list[tuple[int, float | None, int, int]] = []
    router = Router("q", partial, [w.address for w in workers], connect=None, retain_s=600,
                    link=lambda i: "sfo->ams", wide_area=True,
                    on_ack=lambda *ack: acks.append(ack), store=store, destination="q")
    try:
        for batch in batches:
            router.send(batch)
        _wait("worker 0 took its parts", lambda: len(workers[0].batches) == len(batches))
        assert acks == [] and len(store.unacked("q")) == len(batches)
        assert len(router.unacked()) == len(batches)
        moved = _Worker(partial, (0, 2))  # worker 0 starts again: acks its parts again
        router.move(0, moved.address)
        _wait("the new worker 0 took the parts", lambda: len(moved.batches) == len(batches))
        time.sleep(0.3)
        assert acks == [] and len(router.unacked()) == len(batches)  # worker 1 has not
        moved.stop()
        late.set()  # worker 1 runs the query now: its parts go through
        _wait("every batch acked", lambda: len(acks) == len(batches))
        assert store.unacked("q") == [] and router.unacked() == []
        assert all(size > 0 and seconds is not None and level == 0
                   for size, seconds, _, level in acks)
        kept = {(r["domain"]) for w in workers for b in w.batches for r in b.rows}
        assert kept == {r["domain"] for b in batches for r in b.rows}
        assert sum(b.wan_bytes > 0 for w in workers for b in w.batches) == 2 * len(batches)
    finally:
        router.close()
        for worker in workers:
            worker.stop()
        store.close()


def test_a_sketch_goes_whole_to_every_worker_and_each_keeps_its_own_keys() -> None:
    optimized, site_query, partial = split(js.Query("q", QUERIES[0]))
    [batch] = site_batches(site_query, partial, "sfo",
                           [log(1_000, f"d{i % 12}.com") for i in range(60)])
    rank = ranking(optimized)
    assert rank is not None
    sketched = dataclasses.replace(batch, rows=(), items=to_items(
        exact_partial(batch.rows), partial, rank.by, 4), level=4, events=60)
    workers = [_Worker(partial, (i, 3)) for i in range(3)]
    router = Router("q", partial, [w.address for w in workers], connect=None, retain_s=600,
                    link=lambda i: "sfo->ams", wide_area=True)
    try:
        router.send(sketched)
        _wait("each worker took the sketch", lambda: all(len(w.batches) == 1 for w in workers))
        keys = [{r["domain"] for r in w.batches[0].rows} for w in workers]
        assert set().union(*keys) == {r["domain"] for r in batch.rows}
        assert sum(map(len, keys)) == len(batch.rows)  # disjoint
        assert [w.batches[0].events for w in workers] == [60, 0, 0]  # counted once
        assert all(w.batches[0].slack is not None for w in workers)  # bounds, as sketched
    finally:
        router.close()
        for worker in workers:
            worker.stop()


def test_a_worker_refuses_exact_rows_of_another_partition_and_takes_the_others_parts(
) -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    [batch] = site_batches(site_query, partial, "sfo",
                           [log(1_000, f"d{i}.com") for i in range(20)])
    worker = _Worker(partial, (0, 2))
    wrong = PartialSender(worker.address)  # the whole batch, not cut: half is not its
    right = PartialSender(worker.address)
    try:
        wrong.send(encode_batch(batch, partial))
        right.send(encode_batch(dataclasses.replace(
            split_batch(batch, partial.keys, 2)[0], origin="sin"), partial))
        _wait("the right part arrived", lambda: [b.origin for b in worker.batches] == ["sin"])
        _wait("the wrong batch was refused", lambda: worker.servicer.refused["sfo"] >= 1)
        assert not wrong.flush(0.5)  # never acked: the sender's stream is refused
        assert right.flush(5)
    finally:
        wrong.close()
        right.close()
        worker.stop()


@pytest.mark.parametrize("stream", QUERIES[:2], ids=["tumbling", "sliding"])
def test_an_uplink_reports_progress_only_past_a_window_end(stream: js.Stream) -> None:
    """A report each micro-batch would queue on a thin link ahead of the one that closes a
    window: the parent hears of the watermark when it passes a window's end (a tumbling
    window's, or a sliding one's every ``every``), the first time, and when the run ends."""
    query = js.Query("q", stream)
    _, _, partial = split(query)
    parent = _Worker(partial)
    link = Uplink("sfo", "ams", parent.address, query=query, partial=partial, ranking=None,
                  options=SiteOptions(replay=True), store=None,
                  run_metrics=metrics.RunMetrics("sfo", "q"), sequence=itertools.count(1))
    spec = query.stream.window_op.spec  # type: ignore[union-attr]
    end, every = 100 * spec.size_ms, spec.every_ms
    # (watermark, finished, whether it goes): the sender keeps only the newest report not
    # acked yet, so each that goes is waited for before the next is made.
    steps = [(end + 1, False, True), (end + every - 1, False, False),
             (end + every, False, True), (end + every + 1, False, False),
             (end + 3 * every + 5, False, True), (end + 3 * every + 5, True, True)]
    try:
        for watermark, finished, goes in steps:
            link.report(watermark, finished)
            if goes:
                _wait(f"{watermark} reported",
                      lambda w=watermark, f=finished: (w, f) in parent.reports)
        assert parent.reports == [(w, f) for w, f, goes in steps if goes]
    finally:
        link.close()
        parent.stop()


def test_an_uplink_sends_to_the_workers_its_parent_names_and_follows_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent names its workers (``Routes``): the child cuts its windows and sends each
    worker its part; a worker started again elsewhere gets what it lost; a parent that names
    none gets the windows itself again."""
    monkeypatch.setattr(uplink_module, "ROUTES_POLL_S", 0.1)
    query = js.Query("q", QUERIES[0])
    _, site_query, partial = split(query)
    batches = site_batches(site_query, partial, "sfo",
                           [log(t * 1_000, f"d{t % 9}.com") for t in range(35)])
    routes: list[str] = []
    parent = _Worker(partial, routes=routes)
    workers = [_Worker(partial, (0, 2)), _Worker(partial, (1, 2))]
    link = Uplink("sfo", "ams", parent.address, query=query, partial=partial, ranking=None,
                  options=SiteOptions(replay=True), store=None,
                  run_metrics=metrics.RunMetrics("sfo", "q"), sequence=itertools.count(1))

    def window(i: int) -> MergedWindow:
        b = batches[i]
        return MergedWindow(b.window, b.rows, frozenset({"sfo"}), frozenset(), b.events, 0.0,
                            covers=frozenset({"sfo"}))

    try:
        link.send(window(0))
        _wait("the parent got the first window", lambda: len(parent.batches) == 1)
        routes += [w.address for w in workers]
        _wait("the uplink follows the workers", lambda: link.router is not None)
        link.send(window(1))
        link.report(batches[1].window[1], False)
        # Each worker gets its part of the first window too (the parent might not have
        # passed it on before the progress that now goes to the workers directly).
        for i, worker in enumerate(workers):
            _wait(f"worker {i} got its parts", lambda w=worker: len(w.batches) == 2
                  and w.progress.get("sfo") == batches[1].window[1])
            assert [b.window for b in worker.batches] == [batches[0].window, batches[1].window]
        assert len(parent.batches) == 1
        again = _Worker(partial, (1, 2))
        routes[1] = again.address  # worker 1 started again elsewhere
        _wait("the new worker got what the old one had", lambda: len(again.batches) == 2
              and again.progress.get("sfo") == batches[1].window[1])
        assert [b.rows for b in again.batches] == [b.rows for b in workers[1].batches]
        routes.clear()
        _wait("the uplink sends to the parent again", lambda: link.router is None)
        link.send(window(2))
        _wait("the parent got the third window", lambda: len(parent.batches) == 2)
        again.stop()
    finally:
        link.close()
        for worker in (parent, *workers):
            worker.stop()


def test_a_new_uplink_sends_the_new_workers_what_the_last_one_had_sent_the_old_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent started again at a new address (a new uplink, new workers): what its old
    workers had acked is gone with them, and the new ones get it from the child again."""
    monkeypatch.setattr(uplink_module, "ROUTES_POLL_S", 0.1)
    query = js.Query("q", QUERIES[0])
    _, site_query, partial = split(query)
    batches = site_batches(site_query, partial, "sfo",
                           [log(t * 1_000, f"d{t % 9}.com") for t in range(25)])
    old = [_Worker(partial, (i, 2)) for i in range(2)]
    new = [_Worker(partial, (i, 2)) for i in range(2)]
    parents = [_Worker(partial, routes=[w.address for w in ws]) for ws in (old, new)]

    def uplink(parent: _Worker, carried: list[PartialBatch]) -> Uplink:
        return Uplink("sfo", "ams", parent.address, query=query, partial=partial,
                      ranking=None, options=SiteOptions(replay=True), store=None,
                      run_metrics=metrics.RunMetrics("sfo", "q"),
                      sequence=itertools.count(1), carried=carried)

    first = uplink(parents[0], [])
    second = None
    try:
        _wait("the first uplink follows the old workers", lambda: first.router is not None)
        for b in batches:
            first.send(MergedWindow(b.window, tuple(dict(r) for r in b.rows), frozenset({"sfo"}),
                                    frozenset(), b.events, 0.0, covers=frozenset({"sfo"})))
        _wait("the old workers took it all", lambda: all(
            len(w.batches) == len(batches) for w in old))
        kept = first.kept()
        first.close()
        second = uplink(parents[1], kept)
        _wait("the new workers got it all again", lambda: all(
            len(w.batches) == len(batches) for w in new))
        assert [[b.rows for b in w.batches] for w in new] == [
            [b.rows for b in w.batches] for w in old]
    finally:
        if second is not None:
            second.close()
        for worker in (*old, *new, *parents):
            worker.stop()
