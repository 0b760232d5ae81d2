"""A partitioned merge's exchange: a site's inputs cut by group key and sent to its workers.

When the plan spreads a site's merge (or the root's final step) over N key partitions, the
site controller starts a worker per partition (:mod:`jetstream.control.workers`), and the
site's run hands every batch its inputs send (its children's, its own local stage's) to a
:class:`Router`: each row goes to the worker of its key's partition (the stable hash of
:func:`~jetstream.operators.hash_partition`), and every worker gets a part of every batch,
empty or not, so that each knows which inputs have reported a window. Each input's progress
goes to every worker. The workers merge their partitions and send the merged windows back to
the site, whose own merger then only puts N key-disjoint parts together.

The router keeps what it sent for ``retain_s`` (as long as a merger takes corrections): a
worker that restarts has lost its windows, and is sent them all again, with every input's
latest progress, as soon as its new address is known (:meth:`Router.move`).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from jetstream.approx.levels import Ranking
from jetstream.approx.truncate import truncate
from jetstream.operators import WindowAggregate, hash_partition
from jetstream.partials import PartialBatch, encode_batch
from jetstream.transport import Connect, PartialSender
from jetstream.v1 import dataplane_pb2 as pb

__all__ = ["Router", "split_batch", "top_k_candidates"]

#: How quickly a sender to a worker on the same site retries a broken connection, at most.
WORKER_BACKOFF_S = 1.0


#: How many keys' partitions a router remembers (keys repeat from child to child and from
#: window to window; hashing each again is most of the cost of cutting a batch).
KNOWN_KEYS = 200_000


def split_batch(batch: PartialBatch, keys: Sequence[str], count: int,
                known: dict[tuple[Any, ...], int] | None = None) -> list[PartialBatch]:
    """``batch`` cut into ``count`` parts by the hash of each row's group key (``known``:
    partitions of keys seen before, filled in as it goes).

    The parts keep the batch's identity and bounds (a truncated row keeps its slack; a key
    left out of the batch is left out of every part, so the bound on it holds for each); the
    batch's records and wide-area bytes are counted in part 0 only, so that the parts add up
    to the batch.
    """
    chosen: list[list[int]] = [[] for _ in range(count)]
    known = {} if known is None else known
    for i, row in enumerate(batch.rows):
        key = tuple(row[k] for k in keys)
        index = known.get(key)
        if index is None:
            if len(known) >= KNOWN_KEYS:
                known.clear()
            index = known[key] = hash_partition(key, count)
        chosen[index].append(i)
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


def top_k_candidates(rows: Sequence[dict[str, Any]], aggregate: WindowAggregate,
                     ranking: Ranking) -> tuple[dict[str, Any], ...]:
    """Of one key partition's exact merged rows, those that can be in the final top-k: the
    ``k`` best in the final top-k's order (by the ranking value, then the group key). Any
    row of the global top-k whose key falls in this partition is among them, so the top-k
    of the partitions' candidates is the top-k of all their rows."""
    return truncate(rows, aggregate, ranking.by, ranking.k).rows


class Router:
    """Sends one query's inputs at a site to the workers of its key partitions.

    ``workers`` are the partitions' addresses, in partition order; ``link`` names the hop in
    the logs (``"site -> worker"``, counted as local, not wide-area, bytes).
    """

    def __init__(self, query: str, aggregate: WindowAggregate, workers: Sequence[str], *,
                 connect: Connect | None, retain_s: float, link: Callable[[int], str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.query, self.aggregate = query, aggregate
        self._connect, self._link, self._clock = connect, link, clock
        self.retain_s = retain_s
        self._lock = threading.Lock()
        self._sequence = itertools.count(1)
        # What went out, in order, for a worker that starts again: (when, the batch).
        self._sent: deque[tuple[float, PartialBatch]] = deque()
        self._progress: dict[str, pb.Progress] = {}  # input -> its latest report
        self._known: dict[tuple[Any, ...], int] = {}  # key -> its partition
        self.addresses = list(workers)
        self._senders = [self._sender(i, a) for i, a in enumerate(self.addresses)]

    @property
    def count(self) -> int:
        return len(self.addresses)

    def _sender(self, index: int, address: str) -> PartialSender:
        return PartialSender(address, connect=self._connect, max_backoff_s=WORKER_BACKOFF_S,
                             link=self._link(index), wide_area=False)

    def send(self, batch: PartialBatch) -> None:
        """Send each worker its part of an input's batch."""
        with self._lock:
            parts = split_batch(batch, self.aggregate.keys, self.count, self._known)
            now = self._clock()
            self._sent.append((now, batch))
            while self._sent and now - self._sent[0][0] > self.retain_s:
                self._sent.popleft()
            for sender, part in zip(self._senders, parts, strict=True):
                sender.send(encode_batch(part, self.aggregate, compress=False))

    def progress(self, origin: str, watermark_ms: int, ended: bool) -> None:
        """Tell every worker how far an input has got."""
        report = pb.Progress(query=self.query, origin=origin, watermark_ms=watermark_ms,
                             ended=ended, sequence=next(self._sequence))
        with self._lock:
            self._progress[origin] = report
            for sender in self._senders:
                sender.send_progress(report)

    def move(self, index: int, address: str) -> None:
        """Partition ``index`` now runs at ``address`` (its worker started again): send it
        everything kept, then every input's latest progress."""
        with self._lock:
            old = self._senders[index]
            self.addresses[index] = address
            self._senders[index] = sender = self._sender(index, address)
            for _, batch in self._sent:
                part = split_batch(batch, self.aggregate.keys, self.count, self._known)[index]
                sender.send(encode_batch(part, self.aggregate, compress=False))
            for report in self._progress.values():
                sender.send_progress(report)
        old.close()

    def close(self) -> None:
        for sender in self._senders:
            sender.close()
