"""The site-local cube store on real SQLite files: upstream backup across restarts and kill -9,
rollups against one pass of the reference executor, retention, and senders that restart."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.aggtree.planner import Fragment
from jetstream.control.server import start_server
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.cubes import CubeStore, parse_retention
from jetstream.dataplane.options import Assignment, SiteOptions
from jetstream.dataplane.partials import ENDED, PartialBatch
from jetstream.dataplane.site import SiteRuntime
from jetstream.dataplane.transport import PartialSender
from jetstream.errors import DataError
from jetstream.local import finish_from_partials
from jetstream.operators import WindowAggregate
from jetstream.queryfile import query_from_source
from jetstream.results import WindowResult
from jetstream.rewrite import distributed
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as rpc
from tests.conftest import log, spec_of
from tests.test_transport import AGGREGATE, Receiver, message

ROOT = Path(__file__).resolve().parent.parent
LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
HOUR = 3_600_000
LONG = {5_000: 1e7, 60_000: 1e7, HOUR: 1e7}  # seconds: nothing expires in these tests


def ack(batch: pb.PartialBatch) -> pb.Ack:
    return pb.Ack(query=batch.query, window_start_ms=batch.window_start_ms, origin=batch.origin,
                  partition=batch.partition, sequence=batch.sequence, revision=batch.revision)


def windows_of(batches: list[pb.PartialBatch]) -> list[int]:
    return [b.window_start_ms for b in batches]


# -- upstream backup --------------------------------------------------------------------------

def test_unacked_batches_come_back_in_the_order_kept_until_acked(tmp_path: Path) -> None:
    with CubeStore(tmp_path / "cubes.sqlite") as store:
        sent = [message(w, sequence=i) for i, w in enumerate([30, 0, 20, 10])]
        for batch in sent:
            store.keep(batch, "dc")
        store.keep(message(0, origin="sin"), "other")  # another destination's
        assert store.unacked("dc") == sent
        assert store.acked(ack(sent[1]), "dc") and store.acked(ack(sent[3]), "dc")
        assert not store.acked(ack(sent[1]), "dc")  # acked already
        assert not store.acked(ack(sent[0]), "other")  # not that destination's
        assert windows_of(store.unacked("dc")) == [30, 20]
        assert len(store) == 5  # acked partials stay for history


def test_what_was_kept_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "site" / "cubes.sqlite"  # the folder is made too
    with CubeStore(path) as store:
        for w in (0, 10, 20):
            store.keep(message(w), "dc")
        store.acked(ack(message(10)), "dc")
    with CubeStore(path) as again:
        assert windows_of(again.unacked("dc")) == [0, 20]
        assert [b.window[0] for b in again.windows("q", AGGREGATE, 0, 100)] == [0, 10, 20]


def test_release_stops_holding_but_keeps_for_history(tmp_path: Path) -> None:
    with CubeStore(tmp_path / "c.sqlite") as store:
        store.keep(message(0), "dc")
        assert store.release("dc") == 1 and store.unacked("dc") == []
        assert len(store.windows("q", AGGREGATE, 0, 10)) == 1


CHILD = """
import sys
from jetstream.dataplane.cubes import CubeStore
from jetstream.v1 import dataplane_pb2 as pb
store = CubeStore(sys.argv[1])
for i in range(1_000_000):
    store.keep(pb.PartialBatch(query="q", origin="ams", window_start_ms=10 * i,
                               window_end_ms=10 * i + 10, sequence=i, payload=b"x" * 300), "up")
    print("kept", i, flush=True)
    if i % 3 != 2:
        store.acked(pb.Ack(query="q", origin="ams", window_start_ms=10 * i, sequence=i), "up")
        print("acked", i, flush=True)
"""


@pytest.mark.parametrize("after", [57, 400])
def test_a_store_killed_mid_write_keeps_everything_it_committed(tmp_path: Path,
                                                               after: int) -> None:
    path = tmp_path / "cubes.sqlite"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    said = [child.stdout.readline() for _ in range(after)]
    os.kill(child.pid, signal.SIGKILL)  # while it writes on
    # What it printed was committed before; a line the kill cut short says nothing.
    said += [line for line in child.stdout.read().splitlines(keepends=True)
             if line.endswith("\n")]
    assert child.wait(10) == -signal.SIGKILL
    kept = {int(line.split()[1]) for line in said if line.startswith("kept")}
    acked = {int(line.split()[1]) for line in said if line.startswith("acked")}
    with CubeStore(path) as store:  # opens: the last commit stands, the rest rolled back
        held = {b.sequence for b in store.unacked("up")}
        assert kept - acked - {max(kept)} <= held  # the last may have been acked unsaid
        assert not held & acked
    with sqlite3.connect(path) as db:  # and the plain sqlite3 CLI's view agrees
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = dict(db.execute("SELECT sequence, held FROM partials").fetchall())
    assert kept <= rows.keys() <= kept | {max(kept) + 1}
    assert all(rows[i] == 0 for i in acked)


def test_threads_share_a_store(tmp_path: Path) -> None:
    with CubeStore(tmp_path / "c.sqlite") as store:
        def work(origin: str) -> None:
            for w in range(0, 200, 10):
                batch = message(w, origin=origin)
                store.keep(batch, "dc")
                if w % 20:
                    store.acked(ack(batch), "dc")

        threads = [threading.Thread(target=work, args=(f"s{i}",)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(store) == 6 * 20 and len(store.unacked("dc")) == 6 * 10


def test_misuse_and_bad_files_are_data_errors(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database, not at all" * 100)
    with pytest.raises(DataError, match=r"garbage\.sqlite: file is not a database"):
        CubeStore(garbage)
    with pytest.raises(DataError, match="retention of 10000 ms windows must be a positive"):
        CubeStore(tmp_path / "c.sqlite", retention={10_000: -1})
    with pytest.raises(DataError, match="retention is empty"):
        CubeStore(tmp_path / "c.sqlite", retention={})
    with CubeStore(tmp_path / "c.sqlite") as store:
        with pytest.raises(DataError, match="kept for no destination"):
            store.keep(message(0), "")
        with pytest.raises(DataError, match="has no query, origin or window"):
            store.keep(pb.PartialBatch(query="q", origin="ams"), "dc")
        bad = message(0)
        bad.payload = b"\x00 garbage"
        store.keep(bad, "dc")  # kept as it was sent: the receiver is the one to refuse it
        with pytest.raises(DataError, match="unreadable payload"):
            store.windows("q", AGGREGATE, 0, 10)
    with pytest.raises(DataError, match="partial sender to x:1: a store needs a destination"):
        PartialSender("x:1", store=CubeStore(tmp_path / "c.sqlite"))


def test_retention_is_written_as_durations() -> None:
    assert parse_retention("10s=1h, 1m=1d,1h=30d") == {
        10_000: 3600.0, 60_000: 86_400.0, HOUR: 30 * 86_400.0}
    with pytest.raises(DataError, match=r"retention '10s': .* write RESOLUTION=DURATION"):
        parse_retention("10s")
    with pytest.raises(DataError, match="retention '10=1h'"):
        parse_retention("10=1h")


# -- retention ----------------------------------------------------------------------------

def test_each_resolution_is_kept_for_its_own_time(tmp_path: Path) -> None:
    retention = {10_000: 60.0, HOUR: 3600.0}
    with CubeStore(tmp_path / "c.sqlite", retention=retention) as store:
        store.keep(message(0, sequence=1), "dc")  # a 10 ms window: as the finest, 60 s
        big = encode_batch(PartialBatch("q", (0, HOUR), "ams", ()), AGGREGATE)
        store.keep(big, "dc")  # a 1 h window: an hour
        store.keep(message(20, sequence=2), "dc")
        store.acked(ack(big), "dc")
        store.acked(ack(message(0, sequence=1)), "dc")
        assert store.expire(60_009) == 0  # the 10 ms window ended at 10: kept up to 60_010
        assert store.expire(60_011) == 1
        assert store.expire(2 * HOUR) == 0 and store.expire(2 * HOUR + 1) == 1
        assert windows_of(store.unacked("dc")) == [20]  # unacked: kept, however old


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.booleans()), max_size=60),
       st.integers(1, 30), st.integers(0, 20_000))
def test_expire_never_drops_an_unacked_partial_and_bounds_the_rest(
        kept: list[tuple[int, bool]], max_rows: int, now_ms: int) -> None:
    with tempfile.TemporaryDirectory() as folder, CubeStore(
            Path(folder) / "c.sqlite", retention={10: 1.0}, max_rows=max_rows) as store:
        for i, (start, held) in enumerate(kept):
            batch = message(start, sequence=i)
            store.keep(batch, "dc")
            if not held:
                store.acked(ack(batch), "dc")
        unacked = {b.sequence for b in store.unacked("dc")}
        store.expire(now_ms)
        assert {b.sequence for b in store.unacked("dc")} == unacked
        assert len(store) <= max(max_rows, len(unacked))
        with sqlite3.connect(store.path) as db:
            left = dict(db.execute("SELECT sequence, window_end FROM partials").fetchall())
        acked_left = [end for i, end in left.items() if i not in unacked]
        assert all(end >= now_ms - 1000 for end in acked_left)  # retention: one second
        gone = set(range(len(kept))) - left.keys()
        if acked_left:  # the oldest went first
            assert all(kept[i][0] + 10 <= min(acked_left) for i in gone)


# -- rollups --------------------------------------------------------------------------------

def query_over(window: js.windows.WindowSpec) -> js.Query:
    return js.Query("q", LOGS.window(window, watermark="1s").group_by("domain").agg(
        n=js.count(), bytes=js.sum("bytes"), mean=js.avg("latency_ms"),
        fastest=js.min("latency_ms"), biggest=js.max("bytes"),
        users=js.count_distinct("client_ip"), p50=js.quantile("latency_ms", 0.5)))


def site_part(query: js.Query) -> tuple[js.Query, js.Query, WindowAggregate]:
    """The query as sites run it, the part up to its partial aggregate, and that partial."""
    optimized = distributed(query)
    plan = optimized.plan()
    node = plan.partial_aggregates()[0]
    partial = plan.op(node)
    assert isinstance(partial, WindowAggregate)
    return optimized, js.Query("site", js.Stream(plan.up_to(node))), partial


def partials(site: js.Query, partial: WindowAggregate, events: list[dict[str, Any]],
             revision: int) -> dict[tuple[int, int], pb.PartialBatch]:
    """What a site sends for ``events``: per window, its partial rows on the wire."""
    return {(r.window_start, r.window_end): encode_batch(PartialBatch(
        "q", (r.window_start, r.window_end), "ams", tuple(r.rows), events=len(r.rows),
        revision=revision, sequence=revision), partial) for r in js.run_local(site, events)}


def rows(results: list[WindowResult]) -> list[tuple[int, int, list[Any]]]:
    return [(r.window_start, r.window_end, sorted(map(repr, r.rows))) for r in results]


EVENTS = st.lists(st.builds(
    lambda ts, d, b, early: (log(ts, d, bytes=b, client_ip=f"10.0.0.{b % 5}",
                                 latency_ms=float(b % 89)), early),
    st.integers(0, 2 * HOUR - 1), st.sampled_from(["a.com", "b.com", "c.com"]),
    st.integers(0, 5000), st.booleans()), max_size=50)


@settings(max_examples=40, deadline=None)
@given(EVENTS, st.sampled_from([js.tumbling("5s"), js.tumbling("20s"), js.tumbling("1m"),
                                js.sliding("20s", every="10s")]), st.booleans())
def test_rollups_equal_one_pass_over_the_raw_events(
        drawn: list[tuple[dict[str, Any], bool]], window: js.windows.WindowSpec,
        roll_early: bool) -> None:
    """Each fine window goes out first with some of its events (revision 0), then, corrected,
    with all of them (revision 1); rollups merged before the corrections are merged again."""
    events = sorted((e for e, _ in drawn), key=lambda e: e["ts"])
    early = [e for e, first in sorted(drawn, key=lambda d: d[0]["ts"]) if first]
    optimized, site, partial = site_part(query_over(window))
    now = 2 * HOUR + 60_000
    with tempfile.TemporaryDirectory() as folder, CubeStore(
            Path(folder) / "c.sqlite", retention=LONG) as store:
        first = partials(site, partial, early, 0)
        for batch in first.values():
            store.keep(batch, "dc")
        if roll_early:
            store.roll_up("q", partial, window, now)
        for w, batch in partials(site, partial, events, 1).items():
            if w not in first:
                batch.revision = 0
            store.keep(batch, "dc")
        store.roll_up("q", partial, window, now)
        assert store.roll_up("q", partial, window, now) == 0  # nothing changed since
        fine = store.windows("q", partial, -HOUR, now)  # a sliding window may start before 0
        assert rows(finish_from_partials(optimized, {b.window: list(b.rows) for b in fine})) \
            == rows(js.run_local(query_over(window), events))
        for level, spec in [(60_000, js.tumbling("1m")), (HOUR, js.tumbling("1h"))]:
            coarse = store.windows("q", partial, 0, now, level)
            assert all(b.window[1] - b.window[0] == level for b in coarse)
            got = finish_from_partials(optimized, {b.window: list(b.rows) for b in coarse})
            assert rows(got) == rows(js.run_local(query_over(spec), events))


def test_rollups_wait_for_their_end_and_stop_once_their_windows_may_be_gone(
        tmp_path: Path) -> None:
    _, site, partial = site_part(query_over(js.tumbling("10s")))
    window = js.tumbling("10s")
    with CubeStore(tmp_path / "c.sqlite", retention={10_000: 120.0, 60_000: 1e6}) as store:
        for batch in partials(site, partial, [log(1_000), log(61_000)], 0).values():
            store.keep(batch, "dc")
        assert store.roll_up("q", partial, window, 59_999) == 0  # [0, 1m) has not ended
        assert store.roll_up("q", partial, window, 60_000) == 1
        assert store.roll_up("q", partial, window, 600_000) == 0  # [1m, 2m) is too old now
        assert [b.window for b in store.windows("q", partial, 0, HOUR, 60_000)] == [
            (0, 60_000)]


def test_sliding_windows_that_do_not_tile_are_not_rolled_up(tmp_path: Path) -> None:
    window = js.sliding("15s", every="10s")
    _, site, partial = site_part(query_over(window))
    with CubeStore(tmp_path / "c.sqlite", retention=LONG) as store:
        for batch in partials(site, partial, [log(1_000)], 0).values():
            store.keep(batch, "dc")
        assert store.roll_up("q", partial, window, HOUR) == 0
        assert store.windows("q", partial, 0, HOUR, 60_000) == []


# -- senders on a store, over real gRPC -----------------------------------------------------

def test_a_sender_restarted_on_the_store_sends_what_was_never_acked(tmp_path: Path) -> None:
    path = tmp_path / "cubes.sqlite"
    first = Receiver()
    port = first.port
    store = CubeStore(path)
    sender = PartialSender(f"127.0.0.1:{port}", max_backoff_s=0.2, store=store,
                           destination="dc")
    sender.send(message(0))
    sender.send(message(10))
    assert sender.flush(10) and store.unacked("dc") == []
    first.stop()  # the parent goes down; the site goes on, then dies
    sender.send(message(20))
    sender.send(message(30, counts={"b.com": 2}))
    assert not sender.flush(0.5)
    sender.close()
    store.close()
    # Acked by the parent, but the site died before it marked the ack: sent again.
    with CubeStore(path) as crashed:
        crashed.keep(message(10), "dc")
    second = Receiver(port)  # the parent comes back
    again = CubeStore(path)
    restarted = PartialSender(f"127.0.0.1:{port}", max_backoff_s=0.2, store=again,
                              destination="dc")
    try:
        restarted.send(message(40))
        assert restarted.flush(10)
        assert [b.window[0] for b in second.wait_for(4)] == [20, 30, 10, 40]
        assert again.unacked("dc") == []
        assert [b.window[0] for b in first.delivered] == [0, 10]
        # The same parent (not restarted) would have dropped window 10 as a duplicate:
        restarted.send(message(10))
        assert restarted.flush(10)
        time.sleep(0.2)
        assert len(second.delivered) == 4 and second.servicer.duplicates == 1
    finally:
        restarted.close()
        again.close()
        second.stop()


HEADER = "import jetstream as js\nlogs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)\n"
SOURCE = (f"{HEADER}query = js.Query('q', logs.window(js.tumbling('10s'), watermark='5s')"
          ".group_by('domain').agg(n=js.count(), bytes=js.sum('bytes')))\n")


class Published:
    """What a root publishes, and whether it has said it is finished."""

    def __init__(self) -> None:
        self.results: list[WindowResult] = []
        self.finished = threading.Event()

    def __call__(self, name: str, out: list[WindowResult], done: bool) -> None:
        self.results.extend(out)
        if done:
            self.finished.set()


def test_a_restarted_site_sends_what_its_parent_never_acked(tmp_path: Path) -> None:
    """An edge site sends its windows while the root is down and dies; restarted on the same
    state folder it sends them to the root, which sees each once and equals the reference."""
    events = [log(1_000 * i, f"d{i % 3}.com", bytes=10 * i) for i in range(45)]
    query = query_from_source(SOURCE, "<test>")
    _, site, _ = site_part(query)
    batches = [PartialBatch("q", (r.window_start, r.window_end), "pop", tuple(r.rows),
                            covers=frozenset({"pop"})) for r in js.run_local(site, events)]
    down = Receiver()
    port = down.port
    down.stop()
    options = SiteOptions(cubes=True, state_dir=tmp_path, deadline_s=30)
    edge = Assignment(Fragment("q", "edge", children=("pop",), parent="dc"), spec_of(SOURCE),
                      parent_address=f"127.0.0.1:{port}", covers=("pop",))
    first = SiteRuntime("edge", options, lambda *_: None)
    try:
        first.deploy(edge)
        run = first.run("q")
        assert run is not None and run.store is not None
        for batch in batches:
            run.merger.add(batch)
        run.merger.progress("pop", ENDED, ended=True)
        deadline = time.monotonic() + 10
        while len(run.store.unacked("q")) < len(batches) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(run.store.unacked("q")) == len(batches) >= 4
    finally:
        first.close()

    published = Published()
    results, finished = published.results, published.finished

    root = SiteRuntime("dc", SiteOptions(deadline_s=30), published)
    root.deploy(Assignment(Fragment("q", "dc", children=("edge",), final=True), spec_of(SOURCE),
                           covers=("pop",)))
    server, _ = start_server([(rpc.add_DataPlaneServicer_to_server, root.servicer,
                               "jetstream.v1.DataPlane")], port)
    second = SiteRuntime("edge", options, lambda *_: None)
    try:
        second.deploy(edge)
        run = second.run("q")
        assert run is not None and run.sender is not None and run.store is not None
        run.merger.progress("pop", ENDED, ended=True)  # its input came back, and ended
        assert finished.wait(30), results
        assert run.sender.flush(10) and run.store.unacked("q") == []
        assert rows(results) == rows(js.run_local(query, events))
        assert root.servicer.duplicates == 0 and all(r.revision == 0 for r in results)
    finally:
        second.close()
        root.close()
        server.stop(grace=0).wait(5)


def test_a_replay_of_old_logs_keeps_what_it_sent_for_its_retention(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention counts in event time: a site replaying logs from 1970 keeps the windows it
    sent (acked) within an hour of its newest, so a root that takes over can have them sent
    again; the wall clock would have expired them at the first tending."""
    monkeypatch.setattr("jetstream.dataplane.run.CUBE_INTERVAL_S", 0.05)
    events = [log(1_000 * i, f"d{i % 3}.com", bytes=10 * i) for i in range(45)]
    query = query_from_source(SOURCE, "<test>")
    _, site, _ = site_part(query)
    batches = [PartialBatch("q", (r.window_start, r.window_end), "pop", tuple(r.rows),
                            covers=frozenset({"pop"})) for r in js.run_local(site, events)]
    root = SiteRuntime("dc", SiteOptions(deadline_s=30), Published())
    root.deploy(Assignment(Fragment("q", "dc", children=("edge",), final=True), spec_of(SOURCE),
                           covers=("pop",)))
    server, port = start_server([(rpc.add_DataPlaneServicer_to_server, root.servicer,
                                  "jetstream.v1.DataPlane")], 0)
    runtime = SiteRuntime("edge", SiteOptions(cubes=True, state_dir=tmp_path, deadline_s=30),
                          lambda *_: None)
    try:
        runtime.deploy(Assignment(Fragment("q", "edge", children=("pop",), parent="dc"),
                                  spec_of(SOURCE), parent_address=f"127.0.0.1:{port}",
                                  covers=("pop",)))
        run = runtime.run("q")
        assert run is not None and run.store is not None and run.sender is not None
        store = run.store
        for batch in batches:
            run.merger.add(batch)
        run.merger.progress("pop", 40_000)  # not ended: the run goes on tending its cubes
        wait_until(lambda: len(store.messages("q", 0, HOUR)) == len(batches) == 5)
        assert run.sender.flush(10) and store.unacked("q") == []
        time.sleep(0.5)  # tended ten times over
        assert [b.window_start_ms for b in store.messages("q", 0, HOUR)] == [
        0, 10_000, 20_000, 30_000, 40_000]
        run.merger.progress("pop", 4 * HOUR)  # an hour and more later, in event time
        wait_until(lambda: store.messages("q", 0, HOUR) == [])
    finally:
        runtime.close()
        server.stop(grace=0).wait(5)
        root.close()


def test_a_restarted_root_merges_again_what_it_had_acked(tmp_path: Path) -> None:
    """The root acks an edge's windows, keeps them in its inbox and dies before any window
    is final (its other child, quiet, has not said how far it got); restarted on the same
    state folder it merges them again and the final results equal the reference, though the
    edge sends nothing twice."""
    events = [log(1_000 * i, f"d{i % 3}.com", bytes=10 * i) for i in range(45)]
    query = query_from_source(SOURCE, "<test>")
    _, site, partial = site_part(query)
    batches = [encode_batch(PartialBatch("q", (r.window_start, r.window_end), "edge",
                                         tuple(r.rows), covers=frozenset({"edge"}), sequence=i),
                            partial) for i, r in enumerate(js.run_local(site, events))]
    options = SiteOptions(cubes=True, state_dir=tmp_path, deadline_s=60)
    fragment = Fragment("q", "dc", children=("edge", "quiet"), final=True)
    published = Published()
    results, finished = published.results, published.finished

    first = SiteRuntime("dc", options, published)
    first.deploy(Assignment(fragment, spec_of(SOURCE), covers=("edge",)))
    server, port = start_server([(rpc.add_DataPlaneServicer_to_server, first.servicer,
                                  "jetstream.v1.DataPlane")], 0)
    edge = PartialSender(f"127.0.0.1:{port}", max_backoff_s=0.2)
    try:
        for batch in batches:
            edge.send(batch)
        assert edge.flush(10) and len(batches) >= 4  # all acked: the edge holds nothing now
    finally:
        server.stop(grace=0).wait(5)
        first.close()
    assert results == []  # no window was final: quiet never said how far it had got

    second = SiteRuntime("dc", options, published)
    second.deploy(Assignment(fragment, spec_of(SOURCE), covers=("edge",)))
    server, _ = start_server([(rpc.add_DataPlaneServicer_to_server, second.servicer,
                               "jetstream.v1.DataPlane")], port)
    try:
        for origin in ("edge", "quiet"):
            edge.send_progress(pb.Progress(query="q", origin=origin, watermark_ms=ENDED,
                                           ended=True, sequence=len(batches)))
        assert finished.wait(30), results
        assert rows(results) == rows(js.run_local(query, events))
        assert second.servicer.duplicates == 0 and len(second.servicer.refused) == 0
    finally:
        edge.close()
        server.stop(grace=0).wait(5)
        second.close()


def test_a_root_corrects_a_window_it_has_forgotten_from_its_inbox(tmp_path: Path) -> None:
    """Past the merger's retention a window is forgotten; an edge's correction of it (its
    late records, a new revision) is merged with what the root's inbox kept of the window,
    and the window is published again, whole: corrections beyond 10 minutes."""
    events = [log(1_000 * i, f"d{i % 3}.com", bytes=10 * i) for i in range(10)]
    late = log(5_500, "late.com", bytes=7)
    query = query_from_source(SOURCE, "<test>")
    _, site, _ = site_part(query)

    def batch(origin: str, rows: list[dict[str, Any]], revision: int) -> PartialBatch:
        (result,) = js.run_local(site, rows)
        return PartialBatch("q", (result.window_start, result.window_end), origin,
                            tuple(result.rows), covers=frozenset({origin}), revision=revision)

    published = Published()
    root = SiteRuntime("dc", SiteOptions(cubes=True, state_dir=tmp_path, deadline_s=60),
                       published)
    try:
        root.deploy(Assignment(Fragment("q", "dc", children=("a", "b"), final=True),
                               spec_of(SOURCE), covers=("a", "b")))
        run = root.run("q")
        assert run is not None
        run.merger.retain_s = 0.2
        run.receive(batch("a", events[:5], 0))
        run.receive(batch("b", events[5:], 0))
        for origin in ("a", "b"):
            run.progress(origin, ENDED, ended=True)
        wait_until(lambda: len(published.results) == 1)
        wait_until(lambda: not run.merger._windows)  # forgotten
        run.receive(batch("b", [*events[5:], late], 1))
        wait_until(lambda: len(published.results) == 2)
    finally:
        root.close()
    first, fixed = published.results
    assert rows([fixed]) == rows(js.run_local(query, [*events, late]))
    assert rows([first]) == rows(js.run_local(query, events))
    assert run.merger.too_late == 0


def wait_until(holds: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not holds():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
