"""TPUT's rounds on the wire (:mod:`jetstream.approx.rounds` has the decisions).

A child whose link runs rounds keeps each window's exact rows in an :class:`Answerer`, sends
the window's top rows, and answers each ask its parent sends down ``DataPlane.Rounds`` with a
new revision of the window's batch. The parent's :class:`AskBoard` holds what its merger asks
of each child until the child's ``Rounds`` stream takes it; a child that reconnects gets a new
stream, and the merger asks again what went unanswered.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from jetstream.approx.levels import Ranking
from jetstream.approx.rounds import Ask, answer, first_answer
from jetstream.approx.truncate import BoundedPartial, Key
from jetstream.dataplane.codec import ask_to_proto
from jetstream.dataplane.partials import PartialBatch
from jetstream.errors import DataError
from jetstream.operators import WindowAggregate
from jetstream.v1 import dataplane_pb2 as pb

__all__ = [
    "KEPT_WINDOWS",
    "ROUND_REVISIONS",
    "Answerer",
    "AskBoard",
]

#: The most windows a child keeps the exact rows of, to answer asks about them (the newest),
#: however recent: a replay hands on many windows at once.
KEPT_WINDOWS = 256
#: Revisions a window's answers may take: the n-th correction of a window (late records)
#: starts its answers at ``n * ROUND_REVISIONS``, above every answer before it.
ROUND_REVISIONS = 100
#: Asks waiting for a child's stream, per child (the oldest go first when there are more).
MAX_WAITING = 1024

Window = tuple[int, int]


@dataclasses.dataclass
class _Kept:
    rows: tuple[dict[str, Any], ...]  # the window's exact rows here
    batch: PartialBatch  # the last answer sent
    sent: frozenset[Key]  # the keys sent so far
    at: float  # when its first answer went


class Answerer:
    """A child's side of the rounds for one query: each window's first answer, and the next
    ones as its parent asks."""

    def __init__(self, aggregate: WindowAggregate, rank: Ranking, keep_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """A window's rows are kept ``keep_s`` after its first answer (past the parent's
        deadline for it, the parent asks no more), and at most ``KEPT_WINDOWS`` windows."""
        self.aggregate, self.rank, self.keep_s, self._clock = aggregate, rank, keep_s, clock
        self._lock = threading.Lock()
        self._kept: collections.OrderedDict[Window, _Kept] = collections.OrderedDict()

    def first(self, batch: PartialBatch) -> PartialBatch:
        """``batch`` (a window's exact rows) as round 1 sends it: the top ``k`` rows, the rest
        held back here; its answers take the revisions after ``batch``'s (leave
        ``ROUND_REVISIONS`` free). A window whose ranking values cannot be bounded (a negative
        sum) goes whole."""
        rows = tuple(dict(row) for row in batch.rows)
        try:
            bounded, sent = first_answer(rows, self.rank.k, self.aggregate, self.rank.by)
        except DataError:
            return batch
        out = _as_batch(batch, bounded, batch.revision)
        now = self._clock()
        with self._lock:
            self._kept[batch.window] = _Kept(rows, out, sent, now)
            while self._kept and (len(self._kept) > KEPT_WINDOWS or next(
                    iter(self._kept.values())).at < now - self.keep_s):
                self._kept.popitem(last=False)
        return out

    def forget(self, window: Window) -> None:
        """A window sent whole since (a correction): no more asks about it are answered."""
        with self._lock:
            self._kept.pop(window, None)

    def keeps(self, window: Window) -> bool:
        with self._lock:
            return window in self._kept

    def answer(self, window: Window, ask: Ask, sequence: int) -> PartialBatch | None:
        """The window's next revision with what ``ask`` adds. None for a window not kept
        here (forgotten, or from before a restart), and when the ask adds nothing to the last
        answer: that one is on its way (the sender resends until acked), and the parent asked
        again only because its ask might have been lost."""
        with self._lock:
            kept = self._kept.get(window)
            if kept is None:
                return None
            bounded, sent = answer(kept.rows, kept.sent, ask, self.aggregate, self.rank.by)
            if sent == kept.sent and bounded.omitted == kept.batch.omitted and (
                    bounded.truncated == kept.batch.rounds):
                return None
            kept.sent = sent
            kept.batch = _as_batch(kept.batch, bounded, kept.batch.revision + 1,
                                   sequence=sequence)
            return kept.batch


def _as_batch(batch: PartialBatch, bounded: BoundedPartial, revision: int,
              sequence: int | None = None) -> PartialBatch:
    cut = bounded.truncated
    return dataclasses.replace(
        batch, rows=bounded.rows, slack=bounded.slack if cut else None,
        omitted=bounded.omitted, complete_rows=bounded.complete if cut else None,
        revision=revision, rounds=cut,
        sequence=batch.sequence if sequence is None else sequence)


class AskBoard:
    """A coordinator's asks, per child, until the child's ``Rounds`` stream takes them."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._waiting: dict[str, collections.deque[pb.RoundAsk]] = {}
        self._streams: dict[str, int] = {}  # child -> the number of its newest stream
        self._closed = False

    def put(self, child: str, window: Window, ask: Ask) -> int:
        """Hold ``ask`` for ``child``; the bytes it takes on the wire."""
        message = ask_to_proto(window, ask)
        with self._changed:
            self._waiting.setdefault(child, collections.deque(maxlen=MAX_WAITING)).append(
                message)
            self._changed.notify_all()
        return message.ByteSize()

    def follow(self, child: str, active: Callable[[], bool]) -> Iterator[pb.RoundAsk]:
        """The asks for ``child`` as they come, while ``active()`` and until a newer stream
        of the same child follows instead."""
        with self._changed:
            stream = self._streams[child] = self._streams.get(child, 0) + 1
        while active():
            with self._changed:
                if self._closed or self._streams[child] != stream:
                    return
                waiting = self._waiting.get(child)
                if not waiting:
                    self._changed.wait(0.5)
                    continue
                ask = waiting.popleft()
            yield ask

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
