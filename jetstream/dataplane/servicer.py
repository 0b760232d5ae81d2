"""The data plane's receiving end: the ``DataPlane`` service a site (or a worker) serves.

:class:`DataPlaneServicer` decodes each pushed batch (garbage ends that sender's stream with
INVALID_ARGUMENT and is counted; other streams go on), drops batches it has seen before by
their identity, hands new ones and progress on, and acks each message; it also tells senders
where a query's workers are (``Routes``) and streams TPUT's asks to a child (``Rounds``). The
sending end is :mod:`jetstream.dataplane.transport`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping

import grpc
from google.protobuf.message import DecodeError

from jetstream import metrics
from jetstream.dataplane.codec import decode_batch
from jetstream.dataplane.keydict import KeyDecoder
from jetstream.dataplane.partials import PartialBatch
from jetstream.dataplane.transport import SAME_SITE
from jetstream.errors import DataError
from jetstream.operators import WindowAggregate
from jetstream.security import Identity, peer_identity
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as rpc

__all__ = ["MAX_MESSAGE_BYTES", "DataPlaneServicer"]

log = logging.getLogger(__name__)

#: The largest message a process takes, whole or joined from parts.
MAX_MESSAGE_BYTES = 16 << 20

#: How many delivered batch identities a receiver remembers to drop duplicates by.
SEEN_MAX = 100_000


class DataPlaneServicer(rpc.DataPlaneServicer):
    """Receives partial batches and progress; ``deliver`` gets each new batch exactly once.
    A ``deliver`` that raises ``LookupError`` (no query of that name runs here any more) ends
    the stream with NOT_FOUND and the batch unacked: the sender sends it again later."""

    def __init__(self, aggregate_of: Callable[[str], WindowAggregate | None],
                 deliver: Callable[[PartialBatch], None],
                 progress: Callable[[pb.Progress], None] = lambda p: None,
                 site: str = "",
                 routes: Callable[[str], list[tuple[str, str]]] = lambda query: [],
                 rounds: Callable[[str, str, Callable[[], bool]], Iterator[pb.RoundAsk]]
                 = lambda query, child, active: iter(())) -> None:
        """``site``, the receiving site, names the links in the metrics; ``routes(query)``
        answers ``Routes``: the workers the query's inputs go to (address, epoch), if
        senders should send to them directly; ``rounds(query, child, active)`` answers
        ``Rounds``: what the query's run asks the child in TPUT's rounds, while ``active()``.
        A stream whose sender says it is on the same
        site (a worker and its site's process: :data:`SAME_SITE`) carries no wide-area
        bytes. A ``deliver`` that raises ``DataError`` refuses the batch like garbage."""
        self._aggregate_of, self._deliver, self._progress = aggregate_of, deliver, progress
        self._site, self._routes, self._rounds = site or "?", routes, rounds
        # Wide-area bytes received, per link; and, at a site, what its workers last said they
        # had received: (worker, link) -> bytes.
        self.received_by_link: Counter[str] = Counter()
        self._workers_received: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        # The identities delivered, oldest first; bounded: a duplicate older than SEEN_MAX
        # batches reaches the merger, which keeps one batch per origin and revision anyway.
        self._seen: dict[tuple[str, int, int, str, int, int], None] = {}
        self.refused: Counter[str] = Counter()  # origin -> batches refused
        self.duplicates = 0
        self.bytes_received = 0

    def forget(self, query: str) -> None:
        """Forget the batches of ``query`` delivered so far: a new run of it (a query
        submitted again under its name) has a merger that has seen none of them, and the
        same input makes batches of the same identities."""
        with self._lock:
            for identity in [i for i in self._seen if i[0] == query]:
                del self._seen[identity]

    def Routes(self, request: pb.RoutesRequest,
               context: grpc.ServicerContext) -> pb.RoutesResponse:
        if self._aggregate_of(request.query) is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no query named {request.query!r} runs here")
        routes = self._routes(request.query)
        return pb.RoutesResponse(workers=[a for a, _ in routes], epochs=[e for _, e in routes])

    def Rounds(self, request: pb.RoundsRequest,
               context: grpc.ServicerContext) -> Iterator[pb.RoundAsk]:
        self._check_sender(peer_identity(context), request.origin, context)
        if self._aggregate_of(request.query) is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no query named {request.query!r} runs here")
        yield from self._rounds(request.query, request.origin, context.is_active)

    def Push(self, request_iterator: Iterator[pb.PushMessage],
             context: grpc.ServicerContext) -> Iterator[pb.Ack]:
        local = SAME_SITE in tuple(context.invocation_metadata() or ())
        keys = KeyDecoder()  # the receiving end of this stream's key dictionary
        sender = peer_identity(context)
        for message in self._joined(request_iterator, context):
            if message is None:  # a part, not the last: acknowledged as such
                yield pb.Ack(part=True)
                continue
            whole = time.monotonic()
            size = message.ByteSize()
            self.bytes_received += size
            origin = (message.progress if message.HasField("progress") else message.batch).origin
            self._check_sender(sender, origin, context)
            if not local:
                link = self._link(origin)
                metrics.WAN_BYTES_RECEIVED.labels(link).inc(size)
                with self._lock:
                    self.received_by_link[link] += size
            if message.HasField("progress"):
                report = message.progress
                if local and report.received_bytes:
                    self._count_workers_bytes(report.origin, report.received_bytes)
                if self._aggregate_of(report.query) is None:
                    context.abort(grpc.StatusCode.NOT_FOUND,
                                  f"no query named {report.query!r} runs here")
                self._progress(report)
                yield pb.Ack(query=report.query, origin=report.origin,
                             sequence=report.sequence, progress=True,
                             held_s=self._held(origin, whole, local))
                continue
            batch = self._decode(message.batch, context, local, keys)
            with self._lock:
                new = batch.identity not in self._seen
                self._seen[batch.identity] = None
                if len(self._seen) > SEEN_MAX:
                    del self._seen[next(iter(self._seen))]
                self.duplicates += not new
            if new:
                try:
                    self._deliver(batch)
                except LookupError as e:  # the query stopped (or is being replaced) meanwhile
                    with self._lock:
                        self._seen.pop(batch.identity, None)
                    context.abort(grpc.StatusCode.NOT_FOUND, str(e))
                except DataError as e:
                    with self._lock:
                        self._seen.pop(batch.identity, None)
                    self._refuse(batch.origin, e, context)
            b = message.batch
            yield pb.Ack(query=b.query, window_start_ms=b.window_start_ms, origin=b.origin,
                         partition=b.partition, sequence=b.sequence, revision=b.revision,
                         held_s=self._held(origin, whole, local))

    def _held(self, origin: str, since: float, local: bool) -> float:
        """Seconds since ``since`` (``time.monotonic``), when a message from ``origin`` was
        whole here: the receiver's own time on it, counted by link."""
        held = max(time.monotonic() - since, 0.0)
        if not local:
            metrics.RECEIVER_HELD.labels(self._link(origin)).observe(held)
        return held

    def _joined(self, messages: Iterator[pb.PushMessage],
                context: grpc.ServicerContext) -> Iterator[pb.PushMessage | None]:
        """The stream's messages, those sent in parts joined: None for each part but the
        last, then the message. Parts that do not make one message end the stream."""
        parts: list[bytes] = []
        held = 0
        for message in messages:
            if not message.HasField("part"):
                if parts:
                    self._refuse("", DataError("a message came between the parts of another"),
                                 context)
                yield message
                continue
            parts.append(message.part.data)
            held += len(message.part.data)
            if held > MAX_MESSAGE_BYTES:
                self._refuse("", DataError(f"parts of over {MAX_MESSAGE_BYTES:,} bytes"),
                             context)
            if not message.part.last:
                yield None
                continue
            try:
                whole = pb.PushMessage.FromString(b"".join(parts))
            except DecodeError as e:
                whole = None
                self._refuse("", DataError(f"parts that join into no message: {e}"), context)
            parts, held = [], 0
            if whole is None or whole.WhichOneof("body") not in ("batch", "progress"):
                self._refuse("", DataError("parts that join into no batch or progress"),
                             context)
            yield whole

    def received(self) -> dict[str, int]:
        """Wide-area bytes received so far, per link."""
        with self._lock:
            return dict(self.received_by_link)

    def _count_workers_bytes(self, worker: str, received: Mapping[str, int]) -> None:
        """What a worker of this site says it has received over the wide area (its children
        send to it directly), counted as this site's: the growth since its last report
        (all of it after the worker started again, its count from zero)."""
        for link, total in received.items():
            with self._lock:
                last = self._workers_received.get((worker, link), 0)
                self._workers_received[(worker, link)] = total
            grown = total - last if total >= last else total
            if grown > 0:
                metrics.WAN_BYTES_RECEIVED.labels(link).inc(grown)

    def _check_sender(self, sender: Identity | None, origin: str,
                      context: grpc.ServicerContext) -> None:
        """Refuse, PERMISSION_DENIED, what a peer sends under another site's name: a site
        sends its own partials (and answers its own rounds); its own site's processes (its
        workers, and it to them) may carry anyone's. Whether the origin is an input of the
        query here is the run's to say."""
        if sender is None or sender.role == "any" or (
                sender.role == "site" and sender.name in (origin, self._site)):
            return
        self._refuse(origin, DataError(f"partials of {origin!r} refused: the sender's "
                                       f"certificate is {sender}'s"), context,
                     grpc.StatusCode.PERMISSION_DENIED)

    def _link(self, origin: str) -> str:
        """The link a message came over: every site sends its own partials and progress."""
        return metrics.link_name(origin or "?", self._site)

    def _refuse(self, origin: str, error: DataError, context: grpc.ServicerContext,
                code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        with self._lock:
            self.refused[origin or "?"] += 1
        metrics.PARTIALS_REFUSED.labels(self._link(origin)).inc()
        log.warning("refused: %s", error)
        context.abort(code, str(error))

    def _decode(self, message: pb.PartialBatch, context: grpc.ServicerContext,
                local: bool, keys: KeyDecoder) -> PartialBatch:
        """The batch, or the stream ends: NOT_FOUND for an unknown query, or garbage."""
        aggregate = self._aggregate_of(message.query)
        if aggregate is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"no query named {message.query!r} runs here")
        assert aggregate is not None  # abort raises
        try:
            batch = decode_batch(message, aggregate, keys)
        except DataError as e:
            self._refuse(message.origin, e, context)
            raise AssertionError("abort returns only by raising") from None
        if local:
            return batch
        # The window's wide-area cost so far includes this hop.
        return dataclasses.replace(batch, wan_bytes=batch.wan_bytes + message.ByteSize())
