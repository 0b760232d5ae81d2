"""The data-plane transport: partial batches pushed up a wide-area link over gRPC, acked.

:class:`PartialSender` keeps every message until the receiver acknowledges it (upstream
backup): it holds one streaming ``Push`` call to its parent, and when that breaks it
reconnects with exponential backoff and sends again whatever is not acknowledged, in the
order it was first sent. Every byte it sends is counted. Besides partial batches it carries
each origin's progress (its watermark), of which only the newest matters. It times each
message by what the connection spent on it alone, less what the receiver says in its ack it
held the message (its own work: a busy receiver is not a thin link), for the link's
degradation policy. Over
the wide area, each stream codes the batches' group keys with a key dictionary of its own
(:mod:`jetstream.dataplane.keydict`): a key crosses once, then goes as a slot number. Given a
:class:`~jetstream.dataplane.cubes.CubeStore`, it keeps each batch there before sending it and
marks it when acked, so that a sender started on the same store after a restart sends first
what the last one never got acked.

A sender keeps the link's queue short, so that what else crosses the link — heartbeats and
the controller's calls — never waits long behind partials (:class:`_Window`): it keeps
unacknowledged no more than the link carried in :data:`QUEUE_S` by the latest acks, and sends
a message larger than that as acknowledged parts of half the window, each as the window has
room. On a fast
link that bound is far above any batch and changes nothing; on a link of a few kbit/s it
holds the queue to about one part.

The receiving end is :class:`~jetstream.dataplane.servicer.DataPlaneServicer`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import grpc

from jetstream import metrics
from jetstream.dataplane.cubes import CubeStore
from jetstream.dataplane.keydict import KeyEncoder
from jetstream.errors import DataError
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as rpc

__all__ = ["SAME_SITE", "Connect", "PartialSender"]

log = logging.getLogger(__name__)

#: A push stream is re-opened after this long even when healthy, so that every call has a
#: deadline; nothing is lost, the unacknowledged messages are sent again.
STREAM_DEADLINE_S = 3600.0
#: The call metadata of a push between a site's process and its workers: not wide-area bytes.
SAME_SITE = ("jetstream-hop", "same-site")

#: How long the bytes a sender has unacknowledged may take on the link, by its latest acks,
#: beyond the link's delay.
QUEUE_S = 0.5
#: The least part of a message larger than the window (its size on the thinnest link).
MIN_PART_BYTES = 512
#: The least a sender may have unacknowledged, two parts (one crosses while the other's ack
#: comes back: with one, a thin link idled a round trip a part, and a window's partial set
#: out early was still crossing when the window closed), and the most (then a fast link's
#: batches go whole, with no wait between them).
MIN_WINDOW_BYTES = 2 * MIN_PART_BYTES
MAX_WINDOW_BYTES = 4 << 20
#: A message this small times the link's delay (progress reports are).
NEAR_EMPTY_BYTES = 128
#: How much a window may grow by one ack.
GROWTH = 4

AckKey = tuple[object, ...]
#: Opens a channel to an address: a process's ``Security.channel`` (mutual TLS and its token).
Connect = Callable[[str], grpc.Channel]


def _batch_key(query: str, window_start: int, origin: str, partition: int, sequence: int,
               revision: int) -> AckKey:
    return ("batch", query, window_start, origin, partition, sequence, revision)


def _progress_key(query: str, origin: str) -> AckKey:
    return ("progress", query, origin)


def _key(message: pb.PushMessage) -> AckKey:
    if message.HasField("progress"):
        return _progress_key(message.progress.query, message.progress.origin)
    b = message.batch
    return _batch_key(b.query, b.window_start_ms, b.origin, b.partition, b.sequence, b.revision)


class _Window:
    """The bytes a sender has handed to its stream and not yet seen acknowledged, and how many
    it may have (:attr:`size`).

    The receiver acknowledges every message or part, in order, with one ack; the window
    follows each from hand-over to ack, timing what the connection spent on it alone (from
    its hand-over, or the ack before if later), less what the ack says the receiver held it.
    A near-empty message's time is the link's delay whatever its bandwidth (a round trip, a
    busy receiver's wait before it has a message whole): the
    least of the latest few is set aside from the others. The window's size is what the link
    carries in that delay and :data:`QUEUE_S` more, at the rate of the newest ack of at least
    :data:`MIN_PART_BYTES`: those bytes over their time less the delay. It starts from the
    planned bandwidth, or as large as it gets; a slow receiver or a long round trip leaves it
    so.
    """

    def __init__(self, link_bps: float | None) -> None:
        self.size = MAX_WINDOW_BYTES if link_bps is None else _clamp(link_bps / 8 * QUEUE_S)
        self._flight: deque[tuple[int, float]] = deque()  # (bytes, handed at), oldest first
        self._delays: deque[float] = deque(maxlen=16)  # near-empty messages' times
        self._bytes = 0
        self._free_at: float | None = None
        # Bytes/s the link carried, by each of the latest acks of a part (acks that come
        # together time one as instant; a busy receiver, one as slow): their median is the
        # link's.
        self._rates: deque[float] = deque(maxlen=16)
        self._changed = threading.Condition()

    @property
    def rate(self) -> float | None:
        """Bytes/s the link carries, by the latest acks timed (None before one is)."""
        with self._changed:
            return statistics.median_low(self._rates) if self._rates else None

    def reset(self) -> None:
        """A new stream: nothing is on it."""
        with self._changed:
            self._flight.clear()
            self._bytes, self._free_at = 0, None
            self._changed.notify_all()

    def room(self, size: int, stopped: Callable[[], bool]) -> bool:
        """Wait until ``size`` more bytes may go (at once when nothing is unacknowledged), and
        count them handed over; False, and nothing counted, if ``stopped()`` first — its
        stream ended: a :meth:`reset` for the next one must not count it there."""
        with self._changed:
            while self._bytes and self._bytes + size > self.size and not stopped():
                self._changed.wait(0.2)
            if stopped():
                return False
            self._flight.append((size, time.monotonic()))
            self._bytes += size
        return True

    def acked(self, arrived: float, held_s: float = 0.0) -> None:
        """The oldest message in flight was acked at ``arrived``, the receiver having held
        it ``held_s`` of that time (its own work, not the link's)."""
        with self._changed:
            if not self._flight:
                return
            size, handed = self._flight.popleft()
            self._bytes -= size
            started = handed if self._free_at is None else max(handed, self._free_at)
            self._free_at = arrived
            seconds = max(arrived - started - _held(held_s), 0.0)
            if size <= NEAR_EMPTY_BYTES:
                self._delays.append(seconds)
            elif size >= MIN_PART_BYTES and self._delays:
                delay = min(self._delays)
                link_s = seconds - delay
                self._rates.append(size / link_s if link_s > 0 else math.inf)
                carried = (MAX_WINDOW_BYTES if link_s <= 0
                           else size / link_s * (QUEUE_S + delay))
                # Down at once; up at most 4x an ack, so that one quick ack among senders
                # that share the link does not open it wide.
                self.size = _clamp(min(carried, GROWTH * self.size))
            self._changed.notify_all()


def _held(seconds: float) -> float:
    """What a receiver says it held a message: its own work, taken out of the link's time
    (a number that is not one, from a receiver that is wrong, is taken for none)."""
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def _clamp(window: float) -> int:
    return int(min(max(window, MIN_WINDOW_BYTES), MAX_WINDOW_BYTES))


class PartialSender:
    """Sends encoded partial batches and progress to one parent until each is acknowledged."""

    def __init__(self, address: str, *, max_backoff_s: float = 5.0,
                 on_ack: Callable[[pb.PartialBatch, float | None, int], None] | None = None,
                 on_round_trip: Callable[[float], None] | None = None,
                 store: CubeStore | None = None, destination: str = "",
                 connect: Connect | None = None, link: str = "",
                 wide_area: bool = True, link_bps: float | None = None) -> None:
        """``connect`` opens the channel to the parent: the site process passes its
        ``Security.channel``; None, plaintext, is for senders within one test process.
        ``on_ack(batch, seconds, backlog)`` hears of each acknowledged batch (as it last
        crossed the link: its keys coded, so ``ByteSize`` is what it cost): the seconds
        the connection spent on it alone (None if it was handed over on an earlier stream),
        and how many batches are still unacknowledged.
        Those seconds run from when gRPC took the message, or the previous ack if that
        came later, to its ack: a wait in this sender's queue (behind a burst of windows,
        or a reconnection's backoff) and this sender's handling of earlier acks are left
        out. ``on_round_trip(seconds)`` hears the same of each acknowledged progress report:
        what a near-empty message costs, the part of every ack's delay that does not depend
        on its bytes (behind a batch, the receiver's time on it alone).
        ``store``: keep batches there until acked, for ``destination`` (a name that outlives
        this sender), and send first what it holds unacked for it. ``link`` names the link
        in the metrics (``"child->parent"``; default: the address); a sender that is not
        ``wide_area`` (to a worker of its own site) leaves the wide-area byte counts alone.
        ``link_bps``, the link's bandwidth as planned, sizes its window until acks do
        (None: as large as it gets)."""
        if store is not None and not destination:
            msg = f"partial sender to {address}: a store needs a destination name"
            raise DataError(msg)
        self.address, self._connect = address, connect or grpc.insecure_channel
        self._store, self._destination = store, destination
        self._on_ack, self._on_round_trip = on_ack, on_round_trip
        # When gRPC took each message of the current stream. Only the ack-reading thread
        # reads _free_at: when it was last ready for the next ack.
        self._handed: dict[AckKey, float] = {}
        self._wire: dict[AckKey, pb.PartialBatch] = {}  # each unacked batch as last sent
        self._free_at: float | None = None
        self.bytes_sent = 0
        self.batches_sent = 0
        self._labels = (link or address, destination)
        self._bytes_metric = (metrics.WAN_BYTES_SENT.labels(self._labels[0]) if wide_area
                              else None)
        self._metadata = () if wide_area else (SAME_SITE,)
        self._wide_area = wide_area
        self._unacked_metric = metrics.UNACKED.labels(*self._labels)
        self._max_backoff_s = max_backoff_s
        self._unacked: dict[AckKey, pb.PushMessage] = {}
        self._queue: queue.Queue[pb.PushMessage] = queue.Queue()
        self._window = _Window(link_bps)
        self._lock = threading.Condition()
        self._stop = threading.Event()
        if store is not None:  # the first stream sends everything unacked, these first
            for batch in store.unacked(destination):
                self._hold(pb.PushMessage(batch=batch))
        self._thread = threading.Thread(target=self._run, name=f"push-{address}", daemon=True)
        self._thread.start()

    @property
    def rate_bps(self) -> float | None:
        """What the link carries, in bits/s, by the latest acks of parts (see
        :class:`_Window`); None until one is timed."""
        rate = self._window.rate
        return None if rate is None else rate * 8

    def send(self, batch: pb.PartialBatch) -> None:
        if self._store is not None:
            try:
                self._store.keep(batch, self._destination)
            except DataError:  # sent all the same: without a backup beats not at all
                log.exception("push to %s: keeping a batch of %s failed", self.address,
                              batch.query)
        self._put(pb.PushMessage(batch=batch))

    def send_progress(self, progress: pb.Progress) -> None:
        """Report an origin's progress; it replaces any report of it not yet acknowledged."""
        self._put(pb.PushMessage(progress=progress))

    def _put(self, message: pb.PushMessage) -> None:
        with self._lock:  # held and queued at once: a new stream takes both or neither
            self._hold(message)
            self._queue.put(message)

    def _hold(self, message: pb.PushMessage) -> None:
        key = _key(message)
        with self._lock:
            self._unacked.pop(key, None)  # a newer progress report goes after the batches
            self._unacked[key] = message
            self._unacked_metric.set(len(self._unacked))

    def pending(self) -> list[pb.PartialBatch]:
        """The batches not acknowledged yet, in the order they were sent."""
        with self._lock:
            return [m.batch for m in self._unacked.values() if m.HasField("batch")]

    def in_flight(self) -> tuple[int, float, int] | None:
        """The batch the connection is on now: its bytes as it crosses, how long the
        connection has spent on it so far (timed as its ack would time it), and how many
        batches wait unacknowledged behind it; None when no batch is handed over unacked."""
        now = time.monotonic()
        with self._lock:
            handed = [(at, key) for key, at in self._handed.items()
                      if key in self._unacked and self._unacked[key].HasField("batch")]
            if not handed:
                return None
            at, key = min(handed)
            batch = self._wire.get(key) or self._unacked[key].batch
            behind = sum(m.HasField("batch") for m in self._unacked.values()) - 1
        free_at = self._free_at
        started = at if free_at is None else max(at, free_at)
        return batch.ByteSize(), max(now - started, 0.0), behind

    @property
    def unacked(self) -> int:
        with self._lock:
            return len(self._unacked)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every message is acknowledged; whether they all were in time."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._unacked, timeout=timeout_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(KeyError):  # the next sender of the query reports its own
            metrics.UNACKED.remove(*self._labels)

    def _run(self) -> None:
        backoff = 0.1
        with self._connect(self.address) as channel:
            stub = rpc.DataPlaneStub(channel)
            while not self._stop.is_set():
                done = threading.Event()
                with self._lock:  # a new stream: nothing of ours is in flight on it
                    self._handed.clear()
                    self._free_at = None
                self._window.reset()
                try:
                    for ack in stub.Push(self._requests(done), timeout=STREAM_DEADLINE_S,
                                         metadata=self._metadata):
                        self._window.acked(time.monotonic(), ack.held_s)
                        if ack.part:
                            continue
                        self._acked(ack, time.monotonic())
                        self._free_at = time.monotonic()  # our bookkeeping is not the link's
                        backoff = 0.1
                except grpc.RpcError as e:
                    if not self._stop.is_set() and e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                        log.warning("push to %s: %s: %s; retrying in %.1fs", self.address,
                                    e.code().name, e.details(), backoff)
                        self._stop.wait(backoff)
                        backoff = min(backoff * 2, self._max_backoff_s)
                finally:
                    done.set()

    def _requests(self, done: threading.Event) -> Iterator[pb.PushMessage]:
        with self._lock:  # against _put: a message held after this goes to this queue
            pending = list(self._unacked.values())  # a new stream resends what is unacked
            # A queue of this stream's own: the last stream's generator can still be waiting
            # on its queue after its call failed, and would take a message into a dead call.
            waiting: queue.Queue[pb.PushMessage] = queue.Queue()
            self._queue = waiting
        # Each stream starts its key dictionary empty, as the receiver's end of it does.
        keys = KeyEncoder() if self._wide_area else None

        def stopped() -> bool:
            return self._stop.is_set() or done.is_set()

        for message in pending:
            yield from self._pieces(self._coded(message, keys), stopped)
        while not stopped():
            try:
                message = waiting.get(timeout=0.2)
            except queue.Empty:
                continue
            yield from self._pieces(self._coded(message, keys), stopped)

    def _coded(self, message: pb.PushMessage, keys: KeyEncoder | None) -> pb.PushMessage:
        """The message as it crosses: its keys coded with the stream's dictionary (over the
        wide area), noted as what this message cost."""
        if keys is not None and message.HasField("batch"):
            message = pb.PushMessage(batch=keys.encode(message.batch))
            key = _key(message)
            with self._lock:
                if key in self._unacked:
                    self._wire[key] = message.batch
        return message

    def _pieces(self, message: pb.PushMessage,
                stopped: Callable[[], bool]) -> Iterator[pb.PushMessage]:
        """The message for gRPC to take, whole or, larger than the window, in parts, each
        when the window has room; counted, and its hand-over noted, as its first piece goes."""
        size = message.ByteSize()
        window = self._window.size
        if size <= window:
            pieces = [message]
        else:  # two parts a window, so that one crosses while the other's ack comes back
            part = max(window // 2, MIN_PART_BYTES)
            data = message.SerializeToString()
            pieces = [pb.PushMessage(part=pb.Part(data=data[i:i + part],
                                                  last=i + part >= len(data)))
                      for i in range(0, len(data), part)]
        for n, piece in enumerate(pieces):
            if not self._window.room(piece.ByteSize(), stopped):
                return
            if n == 0:
                self._handed_over(message, size)
            yield piece

    def _handed_over(self, message: pb.PushMessage, size: int) -> None:
        self.bytes_sent += size
        self.batches_sent += message.HasField("batch")
        if self._bytes_metric is not None:
            self._bytes_metric.inc(size)
        with self._lock:
            self._handed[_key(message)] = time.monotonic()

    def _acked(self, ack: pb.Ack, arrived: float) -> None:
        if ack.progress:
            key = _progress_key(ack.query, ack.origin)
        else:
            key = _batch_key(ack.query, ack.window_start_ms, ack.origin, ack.partition,
                             ack.sequence, ack.revision)
            self._mark_acked(key, ack)
        with self._lock:
            if ack.progress:
                held = self._unacked.get(key)
                if held is None or held.progress.sequence > ack.sequence:
                    return  # a newer report is still on its way
            message = self._unacked.pop(key, None)
            handed = self._handed.pop(key, None)
            sent = self._wire.pop(key, None)
            backlog = sum(m.HasField("batch") for m in self._unacked.values())
            self._unacked_metric.set(len(self._unacked))
            self._lock.notify_all()
        if message is None:
            return
        seconds = None
        if handed is not None:  # else it was handed over on an earlier stream: time unknown
            # Until the previous ack came, the connection was busy with earlier messages.
            started = handed if self._free_at is None else max(handed, self._free_at)
            seconds = max(arrived - started - _held(ack.held_s), 0.0)
        if ack.progress:
            if self._on_round_trip and seconds is not None:
                self._on_round_trip(seconds)
        elif self._on_ack:
            self._on_ack(message.batch if sent is None else sent, seconds, backlog)

    def _mark_acked(self, key: AckKey, ack: pb.Ack) -> None:
        """Mark an acked batch in the store, before ``flush`` can see it acked."""
        if self._store is None:
            return
        with self._lock:
            held = key in self._unacked
        if held:
            try:
                self._store.acked(ack, self._destination)
            except DataError:  # it is sent again after a restart; receivers drop it then
                log.exception("push to %s: marking an ack failed", self.address)
