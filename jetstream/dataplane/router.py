"""A partitioned merge's exchange: inputs cut by group key and sent to the key partitions'
workers.

When the plan spreads a site's merge (or the root's final step) over N key partitions, the
site controller starts a worker per partition (:mod:`jetstream.control.workers`). Whatever
sends to that site — each child's uplink, and the site's own run for its local stage and for
batches that still come to it — cuts every batch with a :class:`Router`: each row goes to the
worker of its key's partition (the stable hash of :func:`~jetstream.operators.hash_partition`),
and every worker gets a part of every batch, empty or not, so that each knows which inputs
have reported a window; a sketch (which cannot be cut) goes whole to every worker, each
keeping its own keys. Each input's progress goes to every worker. The workers merge their
partitions and send the merged windows back to the site, whose own merger then only puts N
key-disjoint parts together. A child learns where the workers are from its parent
(``DataPlane.Routes``), and sends through the parent while it does not know.

The router keeps what it sent for ``retain_s`` (as long as a merger takes corrections): a
worker that restarts has lost its windows, and is sent them all again, with every input's
latest progress, as soon as its new address is known (:meth:`Router.move`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jetstream.approx.levels import Ranking
from jetstream.approx.truncate import truncate
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.cubes import CubeStore
from jetstream.dataplane.partials import PartialBatch
from jetstream.dataplane.transport import Connect, PartialSender
from jetstream.errors import DataError
from jetstream.operators import WindowAggregate, hash_partition
from jetstream.v1 import dataplane_pb2 as pb

__all__ = ["Router", "key_partition", "own_rows", "split_batch", "top_k_candidates"]

log = logging.getLogger(__name__)

#: How quickly a sender to a worker on the same site retries a broken connection, at most.
WORKER_BACKOFF_S = 1.0
#: The same for a child's sender to its parent's workers, over the wide area.
WIDE_AREA_BACKOFF_S = 5.0


#: How many keys' partitions a router remembers (keys repeat from child to child and from
#: window to window; hashing each again is most of the cost of cutting a batch).
KNOWN_KEYS = 200_000


def key_partition(row: Mapping[str, Any], keys: Sequence[str], count: int,
                  known: dict[tuple[Any, ...], int]) -> int:
    """The partition of ``row``'s group key among ``count``; ``known`` remembers keys seen."""
    key = tuple(row[k] for k in keys)
    index = known.get(key)
    if index is None:
        if len(known) >= KNOWN_KEYS:
            known.clear()
        index = known[key] = hash_partition(key, count)
    return index


def split_batch(batch: PartialBatch, keys: Sequence[str], count: int,
                known: dict[tuple[Any, ...], int] | None = None) -> list[PartialBatch]:
    """``batch`` cut into ``count`` parts by the hash of each row's group key (``known``:
    partitions of keys seen before, filled in as it goes).

    The parts keep the batch's identity and bounds (a truncated row keeps its slack; a key
    left out of the batch is left out of every part, so the bound on it holds for each); the
    batch's records and wide-area bytes are counted in part 0 only, so that the parts add up
    to the batch. A sketch (``items``) cannot be cut: every part is the whole sketch, and
    each receiver keeps its own partition's keys (see :func:`own_rows`).
    """
    if batch.items is not None:
        return [batch if index == 0 else dataclasses.replace(batch, events=0, wan_bytes=0)
                for index in range(count)]
    chosen: list[list[int]] = [[] for _ in range(count)]
    known = {} if known is None else known
    for i, row in enumerate(batch.rows):
        chosen[key_partition(row, keys, count, known)].append(i)
    parts = []
    for index, rows in enumerate(chosen):
        parts.append(dataclasses.replace(
            batch, rows=tuple(batch.rows[i] for i in rows),
            slack=None if batch.slack is None else tuple(batch.slack[i] for i in rows),
            complete_rows=None if batch.complete_rows is None
            else tuple(batch.complete_rows[i] for i in rows),
            events=batch.events if index == 0 else 0,
            wan_bytes=batch.wan_bytes if index == 0 else 0))
    return parts


def own_rows(batch: PartialBatch, keys: Sequence[str], part: tuple[int, int],
             known: dict[tuple[Any, ...], int]) -> PartialBatch:
    """What a worker of key partition ``part`` (index, count) merges of a batch sent to it:
    a batch with bounds (a sketch's rows, which hold every partition's keys) is cut down to
    its own keys; exact rows must all be its own.

    Raises
    ------
    DataError
        If an exact row belongs to another partition: the sender cut its batch wrongly, and
        merging the row here would split that key's value over two workers.
    """
    index, count = part
    if count <= 1:
        return batch
    mine = [key_partition(row, keys, count, known) == index for row in batch.rows]
    if all(mine):
        return batch
    if batch.slack is None:
        stray = batch.rows[mine.index(False)]
        msg = (f"partial batch from {batch.origin} for {batch.query}: row with key "
               f"{tuple(stray[k] for k in keys)!r} belongs to another key partition than "
               f"{index} of {count}")
        raise DataError(msg)
    kept = [i for i, m in enumerate(mine) if m]
    return dataclasses.replace(
        batch, rows=tuple(batch.rows[i] for i in kept),
        slack=tuple(batch.slack[i] for i in kept),
        complete_rows=None if batch.complete_rows is None
        else tuple(batch.complete_rows[i] for i in kept))


def top_k_candidates(rows: Sequence[dict[str, Any]], aggregate: WindowAggregate,
                     ranking: Ranking) -> tuple[dict[str, Any], ...]:
    """Of one key partition's exact merged rows, those that can be in the final top-k: the
    ``k`` best in the final top-k's order (by the ranking value, then the group key). Any
    row of the global top-k whose key falls in this partition is among them, so the top-k
    of the partitions' candidates is the top-k of all their rows."""
    return truncate(rows, aggregate, ranking.by, ranking.k).rows


@dataclass
class _Waiting:
    """A batch some worker has not acked its part of yet."""

    batch: PartialBatch
    workers: set[int]  # the partitions whose worker has not acked
    size: int = 0  # bytes of the parts acked so far
    seconds: float | None = None  # the slowest part's time on the link, where known


class Router:
    """Sends one query's batches to the workers of its key partitions.

    ``workers`` are the partitions' addresses, in partition order; ``link`` names the hop in
    the metrics. Within a site (``wide_area`` False: the site's run to its workers) the
    parts go uncompressed and count no wide-area bytes. A child's uplink sends over its
    wide-area link: compressed, each batch ``store``-kept for ``destination`` until every
    worker has acked its part, and ``on_ack(bytes, seconds, backlog, level)`` hears of each
    batch once all its parts are acked (the sum of their bytes, the slowest part's seconds,
    the batches still waiting), one call at a time, as from one sender: the link's policy
    measures the link, not the number of workers.
    """

    def __init__(self, query: str, aggregate: WindowAggregate, workers: Sequence[str], *,
                 connect: Connect | None, retain_s: float, link: Callable[[int], str],
                 wide_area: bool = False,
                 on_ack: Callable[[int, float | None, int, int], None] | None = None,
                 on_round_trip: Callable[[float], None] | None = None,
                 store: CubeStore | None = None, destination: str = "",
                 clock: Callable[[], float] = time.monotonic,
                 link_bps: float | None = None) -> None:
        self.query, self.aggregate = query, aggregate
        # The workers share the link: each sender starts from its share
        # (jetstream.dataplane.transport).
        self._link_bps = None if link_bps is None else link_bps / max(len(workers), 1)
        self._connect, self._link, self._clock = connect, link, clock
        self._wide_area, self._on_ack, self._on_round_trip = wide_area, on_ack, on_round_trip
        self._store, self._destination = store, destination
        self.retain_s = retain_s
        self._lock = threading.Lock()
        self._callbacks = threading.Lock()  # one ack or round trip at a time for the policy
        self._sequence = itertools.count(1)
        # What went out, in order, for a worker that starts again: (when, the batch).
        self._sent: deque[tuple[float, PartialBatch]] = deque()
        self._progress: dict[str, pb.Progress] = {}  # input -> its latest report
        self._known: dict[tuple[Any, ...], int] = {}  # key -> its partition
        # The batches not every worker has acked its part of, oldest first, however old.
        self._waiting: dict[tuple[int, str, int, int], _Waiting] = {}
        self.addresses = list(workers)
        # Changes when a partition's worker starts again (as the router does with its site).
        self.epochs = [secrets.token_hex(4)] * len(self.addresses)
        self._generation = [0] * len(self.addresses)  # which sender of a partition is current
        self._senders = [self._sender(i, a) for i, a in enumerate(self.addresses)]

    @property
    def count(self) -> int:
        return len(self.addresses)

    @property
    def bytes_sent(self) -> int:
        return sum(sender.bytes_sent for sender in list(self._senders))

    @property
    def rate_bps(self) -> float | None:
        """What the link carries, by its senders' acks: the sum, as a batch's parts cross it
        side by side (None until an ack is timed)."""
        rates = [rate for sender in list(self._senders) if (rate := sender.rate_bps)]
        return sum(rates) if rates else None

    def routes(self) -> list[tuple[str, str]]:
        """Each partition's worker: (address, epoch)."""
        with self._lock:
            return list(zip(self.addresses, self.epochs, strict=True))

    def _sender(self, index: int, address: str) -> PartialSender:
        return PartialSender(
            address, connect=self._connect,
            max_backoff_s=WIDE_AREA_BACKOFF_S if self._wide_area else WORKER_BACKOFF_S,
            link=self._link(index), destination=f"{self.query} part {index + 1}",
            wide_area=self._wide_area,
            on_ack=functools.partial(self._part_acked, index, self._generation[index]),
            on_round_trip=self._round_trip, link_bps=self._link_bps)

    def send(self, batch: PartialBatch) -> None:
        """Send each worker its part of a batch."""
        with self._lock:
            parts = split_batch(batch, self.aggregate.keys, self.count, self._known)
            now = self._clock()
            self._sent.append((now, batch))
            while self._sent and now - self._sent[0][0] > self.retain_s:
                self._sent.popleft()
            encoded = [encode_batch(part, self.aggregate, compress=self._wide_area)
                       for part in parts]
            if self._store is not None:
                self._keep(batch)
            self._waiting[_batch_key(batch)] = _Waiting(batch, set(range(self.count)))
            for sender, part in zip(self._senders, encoded, strict=True):
                sender.send(part)

    def progress(self, origin: str, watermark_ms: int, ended: bool, received_ms: int = 0
                 ) -> None:
        """Tell every worker how far an input has got (see ``Progress.received_ms``)."""
        report = pb.Progress(query=self.query, origin=origin, watermark_ms=watermark_ms,
                             ended=ended, sequence=next(self._sequence),
                             received_ms=received_ms)
        with self._lock:
            self._progress[report.origin] = report
            for sender in self._senders:
                sender.send_progress(report)

    def move(self, index: int, address: str) -> None:
        """Partition ``index`` now runs at ``address`` (its worker started again): send it
        everything kept, and every batch it has not acked, then every input's latest
        progress."""
        with self._lock:
            old = self._senders[index]
            self.addresses[index] = address
            self.epochs[index] = secrets.token_hex(4)
            self._generation[index] += 1
            self._senders[index] = sender = self._sender(index, address)
            kept = {_batch_key(b): b for _, b in self._sent}
            kept.update((k, w.batch) for k, w in self._waiting.items() if index in w.workers)
            for batch in kept.values():
                part = split_batch(batch, self.aggregate.keys, self.count, self._known)[index]
                sender.send(encode_batch(part, self.aggregate, compress=self._wide_area))
            for report in self._progress.values():
                sender.send_progress(report)
        threading.Thread(target=old.close, daemon=True, name="close-sender").start()

    def kept(self) -> list[PartialBatch]:
        """The batches sent in the last ``retain_s``, and those some worker has not acked."""
        with self._lock:
            kept = {_batch_key(b): b for _, b in self._sent}
            kept.update((k, w.batch) for k, w in self._waiting.items())
        return list(kept.values())

    def unacked(self) -> list[PartialBatch]:
        """The batches some worker has not acked its part of, oldest first."""
        with self._lock:
            return [w.batch for w in self._waiting.values()]

    def close(self) -> None:
        for sender in self._senders:
            sender.close()

    def _keep(self, batch: PartialBatch) -> None:
        assert self._store is not None
        try:
            self._store.keep(encode_batch(batch, self.aggregate), self._destination)
        except DataError:  # sent all the same: without a backup beats not at all
            log.exception("%s: keeping a batch for %s failed", self.query, self._destination)

    def _round_trip(self, seconds: float) -> None:
        if self._on_round_trip is not None:
            with self._callbacks:
                self._on_round_trip(seconds)

    def _part_acked(self, index: int, generation: int, part: pb.PartialBatch,
                    seconds: float | None, backlog: int) -> None:
        key = (part.window_start_ms, part.origin, part.revision, part.sequence)
        with self._lock:
            waiting = self._waiting.get(key)
            if (waiting is None or index not in waiting.workers
                    or generation != self._generation[index]):
                return  # acked before, or by a worker's sender that was replaced since
            waiting.workers.discard(index)
            waiting.size += part.ByteSize()
            if seconds is not None:  # (unknown for a part handed over on an earlier stream)
                waiting.seconds = seconds if waiting.seconds is None else max(
                    waiting.seconds, seconds)
            if waiting.workers:
                return
            del self._waiting[key]
            backlog = len(self._waiting)
        if self._store is not None:
            try:
                self._store.acked(pb.Ack(query=part.query, window_start_ms=part.window_start_ms,
                                         origin=part.origin, partition=part.partition,
                                         sequence=part.sequence, revision=part.revision),
                                  self._destination)
            except DataError:  # sent again after a restart; receivers drop it then
                log.exception("%s: marking an ack for %s failed", self.query,
                              self._destination)
        if self._on_ack is not None:
            with self._callbacks:
                self._on_ack(waiting.size, waiting.seconds, backlog, part.level)


def _batch_key(batch: PartialBatch) -> tuple[int, str, int, int]:
    return (batch.window[0], batch.origin, batch.revision, batch.sequence)
