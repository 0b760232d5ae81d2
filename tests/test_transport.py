"""Partial batches over real gRPC: acked delivery, exactly once, retries, refusal of garbage."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import jetstream as js
from jetstream.approx.levels import degradation_ladder
from jetstream.approx.policy import LinkPolicy
from jetstream.control.server import start_server
from jetstream.dataplane import servicer
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.cubes import CubeStore
from jetstream.dataplane.partials import PartialBatch
from jetstream.dataplane.servicer import DataPlaneServicer
from jetstream.dataplane.transport import (
    MAX_WINDOW_BYTES,
    MIN_PART_BYTES,
    MIN_WINDOW_BYTES,
    PartialSender,
    _Window,
)
from jetstream.operators import Phase, WindowAggregate
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as rpc

AGGREGATE = WindowAggregate(
    schema=js.Schema.of({"domain": js.DataType.STRING, "n": js.DataType.PARTIAL}),
    keys=("domain",), aggregates=(("n", js.count()),), phase=Phase.PARTIAL)


class Receiver:
    """A DataPlane server; ``delay_s``: it takes that long over each message before acking
    (a busy or CPU-starved receiver); ``batch_delay_s``: that long more over each batch (a
    receiver slow to merge and write down what it is sent)."""

    def __init__(self, port: int = 0, delay_s: float = 0.0, batch_delay_s: float = 0.0
                 ) -> None:
        self.delay_s, self.batch_delay_s = delay_s, batch_delay_s
        self.delivered: list[PartialBatch] = []
        self.arrived = threading.Condition()
        self.progress: list[tuple[str, int, bool]] = []
        self.servicer = DataPlaneServicer(lambda q: AGGREGATE if q == "q" else None,
                                          self._deliver, self._progress)
        self.server, self.port = start_server(
            [(rpc.add_DataPlaneServicer_to_server, self.servicer, "jetstream.v1.DataPlane")],
            port)

    def _deliver(self, batch: PartialBatch) -> None:
        time.sleep(self.delay_s + self.batch_delay_s)
        with self.arrived:
            self.delivered.append(batch)
            self.arrived.notify_all()

    def _progress(self, report: pb.Progress) -> None:
        time.sleep(self.delay_s)
        with self.arrived:
            self.progress.append((report.origin, report.watermark_ms, report.ended))
            self.arrived.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[PartialBatch]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.delivered) >= count, timeout_s), (
                f"{len(self.delivered)} of {count} batches arrived")
            return list(self.delivered)

    def stop(self) -> None:
        self.server.stop(grace=0).wait(5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def message(window: int, origin: str = "sfo", counts: dict[str, int] | None = None,
            **fields: Any) -> Any:
    rows = tuple({"domain": d, "n": n} for d, n in (counts or {"a.com": 1}).items())
    return encode_batch(PartialBatch("q", (window, window + 10), origin, rows, **fields),
                        AGGREGATE)


def sender_to(port: int) -> PartialSender:
    return PartialSender(f"127.0.0.1:{port}", max_backoff_s=0.2)


def test_batches_are_delivered_once_and_acked(receiver: Receiver) -> None:
    sender = sender_to(receiver.port)
    try:
        for w in range(0, 50, 10):
            sender.send(message(w, sequence=w))
        assert sender.flush(10)
        assert [b.window[0] for b in receiver.wait_for(5)] == [0, 10, 20, 30, 40]
        assert sender.bytes_sent > 0 and sender.bytes_sent == receiver.servicer.bytes_received
    finally:
        sender.close()


def test_a_batch_delivered_twice_counts_once(receiver: Receiver) -> None:
    sender = sender_to(receiver.port)
    try:
        sender.send(message(0, sequence=1))
        sender.send(message(0, sequence=2))  # the same window again, e.g. a Spark retry
        assert sender.flush(10)
        assert len(receiver.wait_for(1)) == 1
        time.sleep(0.2)
        assert len(receiver.delivered) == 1 and receiver.servicer.duplicates == 1
    finally:
        sender.close()


def test_a_sender_restarting_mid_window_changes_nothing(receiver: Receiver) -> None:
    first = sender_to(receiver.port)
    first.send(message(0, counts={"a.com": 3}))
    assert first.flush(10)
    first.close()
    again = sender_to(receiver.port)  # restarted: replays the window with a new attempt
    try:
        again.send(message(0, counts={"a.com": 3}, attempt=1))
        again.send(message(10, counts={"b.com": 1}, attempt=1))
        assert again.flush(10)
        assert [(b.window[0], b.attempt) for b in receiver.wait_for(2)] == [(0, 0), (10, 1)]
    finally:
        again.close()


def test_unacked_batches_are_sent_again_after_the_receiver_comes_back() -> None:
    first = Receiver()
    port = first.port
    first.stop()  # the parent is down
    sender = sender_to(port)
    try:
        sender.send(message(0))
        sender.send(message(10))
        assert not sender.flush(0.5) and sender.unacked == 2
        second = Receiver(port)  # it comes back on the same address
        try:
            assert sender.flush(10)
            assert sorted(b.window[0] for b in second.wait_for(2)) == [0, 10]
        finally:
            second.stop()
    finally:
        sender.close()


def test_keys_cross_a_stream_once_and_a_restarted_receiver_gets_them_again() -> None:
    counts = {f"www.domain-{i}.example.com": i + 1 for i in range(200)}
    first = Receiver()
    sender = sender_to(first.port)
    try:
        sender.send(message(0, counts=counts))
        assert sender.flush(10)
        once = sender.bytes_sent
        sender.send(message(10, counts=counts))
        assert sender.flush(10)
        assert sender.bytes_sent - once < once / 2  # the second window's keys are slots
        port = first.port
        first.stop()  # the receiver restarts: its tables are gone, the next stream's are new
        second = Receiver(port)
        try:
            sender.send(message(20, counts=counts))
            assert sender.flush(10)
            [got] = second.wait_for(1)
            assert {r["domain"]: r["n"] for r in got.rows} == counts
        finally:
            second.stop()
        assert all({r["domain"]: r["n"] for r in b.rows} == counts for b in first.delivered)
    finally:
        sender.close()


def test_garbage_is_refused_and_other_senders_go_on(receiver: Receiver) -> None:
    bad, good = sender_to(receiver.port), sender_to(receiver.port)
    try:
        garbage = message(0, origin="evil")
        garbage.payload = b"\x00\x01 not a batch"
        bad.send(garbage)
        good.send(message(0, origin="sfo"))
        assert good.flush(10)
        assert [b.origin for b in receiver.wait_for(1)] == ["sfo"]
        assert not bad.flush(0.5)  # never acked: refused every time it is tried
        assert receiver.servicer.refused["evil"] >= 1
    finally:
        bad.close()
        good.close()


def test_batches_for_an_unknown_query_are_refused(receiver: Receiver) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{receiver.port}")
    wrong = message(0)
    wrong.query = "nope"
    with pytest.raises(grpc.RpcError) as caught:
        list(rpc.DataPlaneStub(channel).Push(iter([pb.PushMessage(batch=wrong)]), timeout=5))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no query named 'nope'" in str(caught.value.details())
    channel.close()


def test_a_batch_for_a_query_stopped_meanwhile_stays_unacked_and_comes_again(
        receiver: Receiver) -> None:
    # The query is known when the batch is read, gone when it is handed on (a run being
    # replaced): the batch must not be acked and lost, but refused and sent again.
    gone = threading.Event()
    gone.set()
    deliver = receiver._deliver

    def replaced_once(batch: PartialBatch) -> None:
        if gone.is_set():
            gone.clear()
            raise LookupError("no query named 'q' runs here")
        deliver(batch)

    receiver.servicer._deliver = replaced_once
    sender = sender_to(receiver.port)
    try:
        sender.send(message(0, sequence=1))
        assert sender.flush(10)
        assert [b.window for b in receiver.wait_for(1)] == [(0, 10)]
        assert receiver.servicer.duplicates == 0
    finally:
        sender.close()


def test_progress_follows_the_batches_it_covers(receiver: Receiver) -> None:
    sender = sender_to(receiver.port)
    try:
        sender.send(message(0))
        sender.send_progress(pb.Progress(query="q", origin="sfo", watermark_ms=10, sequence=1))
        sender.send(message(10))
        sender.send_progress(pb.Progress(query="q", origin="sfo", watermark_ms=20, sequence=2,
                                         ended=True))
        assert sender.flush(10)
        assert [b.window[0] for b in receiver.wait_for(2)] == [0, 10]
        with receiver.arrived:
            assert receiver.arrived.wait_for(lambda: receiver.progress[-1:] == [
                ("sfo", 20, True)], 10)
    finally:
        sender.close()


def test_each_acknowledged_batch_is_timed(receiver: Receiver) -> None:
    timed: list[tuple[int, float, int]] = []
    sender = PartialSender(f"127.0.0.1:{receiver.port}",
                           on_ack=lambda b, s, backlog: timed.append(
                               (b.window_start_ms, s, backlog)))
    try:
        for w in (0, 10, 20):
            sender.send(message(w, sequence=w))
        sender.send_progress(pb.Progress(query="q", origin="sfo", watermark_ms=30, sequence=99))
        assert sender.flush(10)
        assert sorted(w for w, _, _ in timed) == [0, 10, 20]  # batches only, once each
        assert all(0 <= s < 10 and 0 <= backlog <= 2 for _, s, backlog in timed)
    finally:
        sender.close()


def test_a_burst_is_timed_message_by_message_not_from_when_it_was_queued() -> None:
    receiver = Receiver(delay_s=0.3)
    timed: list[tuple[float, int]] = []
    sender = PartialSender(f"127.0.0.1:{receiver.port}",
                           on_ack=lambda b, s, backlog: timed.append((s, backlog)))
    try:
        for w in range(0, 60, 10):  # six windows at once, as a slow stage makes them
            sender.send(message(w, sequence=w))
        assert sender.flush(20)
        # The last waited about 1.8 s from send to ack, but the connection spent 0.3 s on
        # it, all of it the receiver's (which its ack says): timed from send, the burst
        # looked like a link six times thinner than it is.
        assert [backlog for _, backlog in timed] == [5, 4, 3, 2, 1, 0]
        assert all(s < 0.25 for s, _ in timed), timed
    finally:
        sender.close()
        receiver.stop()


def test_a_progress_report_is_a_round_trip_timed_from_the_ack_before_it() -> None:
    receiver = Receiver(delay_s=0.3)
    trips: list[float] = []
    sender = PartialSender(f"127.0.0.1:{receiver.port}", on_round_trip=trips.append)
    try:
        sender.send_progress(pb.Progress(query="q", origin="sfo", watermark_ms=0, sequence=1))
        assert sender.flush(10)
        sender.send(message(0))
        sender.send_progress(pb.Progress(query="q", origin="sfo", watermark_ms=10, sequence=2))
        assert sender.flush(10)
        # Alone, and behind the batch: each took the receiver 0.3 s (its acks say so, and
        # that is not the link's), not the 0.6 s from send to ack that the second waited.
        assert len(trips) == 2 and all(t < 0.25 for t in trips), trips
    finally:
        sender.close()
        receiver.stop()


@pytest.mark.parametrize("slow", [{"delay_s": 0.5}, {"batch_delay_s": 0.45}],
                         ids=["over every message", "over each batch alone"])
def test_a_receiver_slow_to_ack_is_load_and_leaves_a_fast_link_exact(
        slow: dict[str, float]) -> None:
    # The receiver takes a window's time over every message before its ack, or 0.45 s over
    # each batch (its merge, its inbox's fsync) and none over a progress report: the link
    # (loopback) is not what is slow, and fewer bytes would not make the acks come sooner.
    # Timed whole, each window would take 0.9 of its 0.5 s budget or more, and the sender
    # step down; the ack says how long the receiver held the message, and that is not the
    # link's.
    receiver = Receiver(**slow)
    policy = LinkPolicy(degradation_ladder([("exact", 1.0, 0.0), ("top", 0.1, 0.1)]),
                        window_s=0.5, min_interval_s=0.0)
    timed: list[float] = []

    def acked(batch: pb.PartialBatch, seconds: float | None, backlog: int) -> None:
        assert seconds is not None  # one stream: every batch was handed over on it
        timed.append(seconds)
        policy.observe(batch.ByteSize(), max(seconds, 1e-6), backlog, level=batch.level)

    sender = PartialSender(f"127.0.0.1:{receiver.port}", on_ack=acked,
                           on_round_trip=policy.observe_round_trip)
    counts = {f"d{i}.example.com": i for i in range(300)}
    try:
        for w in range(0, 50, 10):  # a live stream: progress between windows, then a window
            sender.send_progress(pb.Progress(query="q", origin="sfo", watermark_ms=w,
                                             sequence=w))
            assert sender.flush(10)
            sender.send(message(w, counts=counts, sequence=w + 1))
            assert sender.flush(10)
        for w in range(50, 80, 10):  # and a burst
            sender.send(message(w, counts=counts, sequence=w + 1))
        assert sender.flush(10)
        assert len(receiver.delivered) == 8 and max(timed) < 0.2, timed
        assert policy.base_s < 0.25
        assert policy.history == [] and policy.level.index == 0, policy.history
        assert sender.rate_bps is None or sender.rate_bps > 1e6
    finally:
        sender.close()
        receiver.stop()


def test_a_sender_whose_store_fails_still_sends(receiver: Receiver, tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    store = CubeStore(tmp_path / "cubes.sqlite")
    sender = PartialSender(f"127.0.0.1:{receiver.port}", store=store, destination="dc")
    try:
        sender.send(message(0))
        assert sender.flush(10) and store.unacked("dc") == []
        store.close()  # e.g. the disk went away
        sender.send(message(10))
        assert sender.flush(10)
        assert [b.window[0] for b in receiver.wait_for(2)] == [0, 10]
        assert "keeping a batch of q failed" in caplog.text
    finally:
        sender.close()


# --- a thin link's queue: the window and parts ------------------------------------------------


class WireRecorder(rpc.DataPlaneServicer):
    """A receiver's servicer that notes each message as it comes off the wire."""

    def __init__(self, inner: DataPlaneServicer) -> None:
        self.inner = inner
        self.messages: list[pb.PushMessage] = []

    def Push(self, request_iterator: Iterator[pb.PushMessage],
             context: grpc.ServicerContext) -> Iterator[pb.Ack]:
        def noted() -> Iterator[pb.PushMessage]:
            for message in request_iterator:
                self.messages.append(message)
                yield message
        return self.inner.Push(noted(), context)


def test_a_message_larger_than_a_thin_links_window_goes_in_parts_and_arrives_whole() -> None:
    receiver = Receiver()
    receiver.server.stop(grace=0).wait(5)
    recorder = WireRecorder(receiver.servicer)
    receiver.server, receiver.port = start_server(
        [(rpc.add_DataPlaneServicer_to_server, recorder, "jetstream.v1.DataPlane")], 0)
    # 8 kbit/s planned: 500 B in half a second, so the window starts at its least, 1 kB.
    sender = PartialSender(f"127.0.0.1:{receiver.port}", link_bps=8_000)
    counts = {f"site{i}.example.com": i for i in range(300)}
    try:
        sender.send(message(0, counts=counts, sequence=1))
        sender.send(message(10, sequence=2))  # small: whole
        assert sender.flush(10)
        big, small = receiver.wait_for(2)
        assert {r["domain"]: r["n"] for r in big.rows} == counts
        assert small.rows == ({"domain": "a.com", "n": 1},)
        parts = [m.part for m in recorder.messages if m.HasField("part")]
        assert len(parts) >= 4 and parts[-1].last and not any(p.last for p in parts[:-1])
        assert all(len(p.data) <= MIN_PART_BYTES for p in parts)
        assert recorder.messages[-1].HasField("batch")
        # Both ends count the messages as they are, not their parts' framing.
        assert sender.bytes_sent == receiver.servicer.bytes_received
    finally:
        sender.close()
        receiver.stop()


def _acked_after(window: _Window, size: int, seconds: float, at: float) -> float:
    """Hand ``size`` bytes to ``window`` and ack them ``seconds`` after ``at`` (the ack
    before): the new ack's time."""
    assert window.room(size, lambda: False)
    window.acked(at + seconds)
    return at + seconds


def test_a_window_is_what_the_link_carries_in_its_delay_and_half_a_second_more(
        ) -> None:
    assert _Window(None).size == MAX_WINDOW_BYTES
    assert _Window(4_000).size == MIN_WINDOW_BYTES  # 250 B: no less than the least
    assert _Window(800_000).size == 50_000  # 100 kB/s for half a second
    assert _Window(1e10).size == MAX_WINDOW_BYTES

    # A busy receiver: 0.25 s over a near-empty message, 0.26 s over 4 kB. Its delay is set
    # aside, and the link is fast: the window stays large.
    busy = _Window(None)
    t = _acked_after(busy, 50, 0.25, time.monotonic())
    _acked_after(busy, 4_000, 0.26, t)
    assert busy.size >= 100_000
    # A thin link: 0.1 s for a near-empty message, 8.1 s for 4 kB: 500 B/s.
    thin = _Window(None)
    t = _acked_after(thin, 50, 0.1, time.monotonic())
    _acked_after(thin, 4_000, 8.1, t)
    assert thin.size == MIN_WINDOW_BYTES
    # A long round trip: 0.5 s for a near-empty message, 4.5 s for 40 kB: 10 kB/s, and the
    # window holds what crosses in the round trip too (else the link idles during it).
    far = _Window(None)
    t = _acked_after(far, 50, 0.5, time.monotonic())
    _acked_after(far, 40_000, 4.5, t)
    assert abs(far.size - 10_000) <= 1
    # Until a near-empty message has timed the delay, nothing is measured.
    unknown = _Window(None)
    _acked_after(unknown, 4_000, 8.1, time.monotonic())
    assert unknown.size == MAX_WINDOW_BYTES


def test_a_links_rate_is_the_median_of_its_latest_acks() -> None:
    window = _Window(None)
    assert window.rate is None  # nothing timed yet
    t = _acked_after(window, 50, 0.1, time.monotonic())
    assert window.rate is None  # a near-empty message times the delay, not the rate
    for _ in range(3):
        t = _acked_after(window, 2_500, 1.1, t)  # 2.5 kB in a second past the delay
    assert window.rate == pytest.approx(2_500, rel=1e-4)
    # A slow ack (a busy receiver, a loaded machine) does not make the link thinner, nor
    # one that came with the ack before (no longer than the delay) make it instant.
    t = _acked_after(window, 1_000, 2.1, t)
    t = _acked_after(window, 1_000, 0.05, t)
    assert window.rate == pytest.approx(2_500, rel=1e-4)
    # Only the latest count: a link that dropped is timed at its new rate.
    for _ in range(16):
        t = _acked_after(window, 600, 2.1, t)
    assert window.rate == pytest.approx(300, rel=1e-4)
    # A fast link carries its parts at once.
    fast = _Window(None)
    t = _acked_after(fast, 50, 0.1, time.monotonic())
    _acked_after(fast, 2_500, 0.05, t)
    assert fast.rate == math.inf


def test_a_full_window_holds_the_next_message_until_an_ack() -> None:
    window = _Window(4_000)
    assert window.room(MIN_PART_BYTES, lambda: False)
    assert window.room(MIN_PART_BYTES, lambda: False)  # two parts go before an ack
    window.acked(time.monotonic())
    waited: list[bool] = []
    stop = threading.Event()
    waiter = threading.Thread(target=lambda: waited.append(window.room(600, stop.is_set)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # 1,112 B would not fit in 1,024
    window.acked(time.monotonic())
    waiter.join(5)
    assert waited == [True]
    # Given up when its stream ends.
    waiter = threading.Thread(target=lambda: waited.append(window.room(600, stop.is_set)))
    waiter.start()
    stop.set()
    waiter.join(5)
    assert waited == [True, False]


@pytest.mark.parametrize("stream, refusal", [
    ([pb.PushMessage(part=pb.Part(data=b"\xff\xfe not a message", last=True))],
     "join into no message"),
    ([pb.PushMessage(part=pb.Part(data=b"", last=True))], "no batch or progress"),
    ([pb.PushMessage(part=pb.Part(data=b"\x0a\x02", last=False)),
      pb.PushMessage(progress=pb.Progress(query="q", origin="x"))], "between the parts"),
    ([pb.PushMessage(part=pb.Part(data=b"x" * 600, last=False)),
      pb.PushMessage(part=pb.Part(data=b"x" * 600, last=True))], "parts of over 1,000 bytes"),
])
def test_parts_that_make_no_message_are_refused_and_other_senders_go_on(
        receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
        stream: list[pb.PushMessage], refusal: str) -> None:
    monkeypatch.setattr(servicer, "MAX_MESSAGE_BYTES", 1_000)
    good = sender_to(receiver.port)
    try:
        stub = rpc.DataPlaneStub(grpc.insecure_channel(f"127.0.0.1:{receiver.port}"))
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Push(iter(stream), timeout=10))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert refusal in str(refused.value.details())
        good.send(message(0))
        assert good.flush(10)
        assert [b.origin for b in receiver.wait_for(1)] == ["sfo"]
    finally:
        good.close()


class BreaksOnce(rpc.DataPlaneServicer):
    """A receiver whose first stream breaks after the first message or part."""

    def __init__(self, inner: DataPlaneServicer) -> None:
        self.inner, self.broken = inner, False

    def Push(self, request_iterator: Iterator[pb.PushMessage],
             context: grpc.ServicerContext) -> Iterator[pb.Ack]:
        if not self.broken:
            self.broken = True
            next(request_iterator)
            context.abort(grpc.StatusCode.UNAVAILABLE, "the link broke")
        yield from self.inner.Push(request_iterator, context)


def test_a_stream_that_breaks_between_parts_leaves_the_next_one_free() -> None:
    # The sender waits for the first part's ack when the stream breaks: the next stream must
    # not start with that wait's piece counted on it (it would wait for an ack never coming).
    receiver = Receiver()
    receiver.server.stop(grace=0).wait(5)
    receiver.server, receiver.port = start_server(
        [(rpc.add_DataPlaneServicer_to_server, BreaksOnce(receiver.servicer),
          "jetstream.v1.DataPlane")], 0)
    sender = PartialSender(f"127.0.0.1:{receiver.port}", link_bps=8_000, max_backoff_s=0.2)
    counts = {f"site{i}.example.com": i for i in range(300)}
    try:
        sender.send(message(0, counts=counts, sequence=1))
        assert sender.flush(15)
        (batch,) = receiver.wait_for(1)
        assert {r["domain"]: r["n"] for r in batch.rows} == counts
    finally:
        sender.close()
        receiver.stop()


def test_a_message_sent_while_the_stream_reconnects_goes_on_the_new_stream() -> None:
    # The failed stream's generator can still be waiting for a message when the next stream
    # takes its list of unacked ones: a message sent then must go out on the new stream,
    # not into the dead call. (With one queue for both, either took it, half the time.)
    parked = threading.Event()

    def park(address: str) -> Any:  # the sender's own thread waits: the test runs the streams
        parked.wait()
        return grpc.insecure_channel(address)

    sender = PartialSender("127.0.0.1:1", connect=park)

    def stream(done: threading.Event, got: list[pb.PushMessage]) -> None:
        got.extend(sender._requests(done))  # what gRPC would take into the call

    try:
        for n in range(20):
            old_done, new_done = threading.Event(), threading.Event()
            old_got: list[pb.PushMessage] = []
            new_got: list[pb.PushMessage] = []
            old = threading.Thread(target=stream, args=(old_done, old_got))
            old.start()
            time.sleep(0.05)  # the old stream waits on its queue
            old_done.set()  # its call failed; its generator has not seen it yet
            new = threading.Thread(target=stream, args=(new_done, new_got))
            new.start()
            time.sleep(0.05)  # the new stream has taken its list (of what is unacked)
            sender.send_progress(pb.Progress(query="q", origin="o", watermark_ms=n,
                                             sequence=n + 1))
            time.sleep(0.3)
            new_done.set()
            old.join(2)
            new.join(2)
            assert [m.progress.watermark_ms for m in new_got][-1:] == [n], n
            assert not any(m.progress.watermark_ms == n for m in old_got), n
    finally:
        parked.set()
        sender.close()


def test_many_open_streams_leave_room_for_more_and_for_other_calls(
        receiver: Receiver) -> None:
    # Every sender of every query holds a stream open, and a thread of the receiver's server
    # with it: a root of six queries on local-3dc had more than the 16 threads a server
    # had, and a deploy queued behind them until its deadline.
    senders = [sender_to(receiver.port) for _ in range(40)]
    try:
        for i, sender in enumerate(senders):
            sender.send(message(10 * i, origin=f"site{i}", sequence=i))
            assert sender.flush(10), f"stream {i} of {len(senders)} was not served"
        channel = grpc.insecure_channel(f"127.0.0.1:{receiver.port}")
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        channel.close()
    finally:
        for sender in senders:
            sender.close()
