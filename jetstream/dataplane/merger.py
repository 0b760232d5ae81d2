"""The aggregator: merges the partial batches a site's inputs send, window by window.

A site's inputs are its children in the aggregation tree and, when it has data of its own,
its local stage. A window is ready when every input has either reported it or moved its
watermark past the window's end (it had nothing for it), or when the window's deadline
passes: then it goes out marked incomplete, naming the inputs it lacks. An input's batch
that arrives after its window went out (or a newer revision of one) is merged in, and the
window goes out again as a correction: the receivers (the parent's aggregator, or the root's
results) replace what they had. Merging uses each aggregate's own ``merge`` on fresh
accumulators, so nothing an input sent is changed.

A window that went out complete is kept for ``retain_s`` more seconds, so that an input
coming back after a failure or a partition still corrects it; past that it is forgotten. A
batch for a window that old is merged with what the window held — given back by ``recall``
(the site's inbox, :mod:`jetstream.dataplane.cubes`) — and the window goes out again, corrected;
without it (or when it cannot) the batch is refused (counted in ``too_late``) rather than
merged into a fresh window that would replace the full one with a part of it.

An input may send a window early (``PartialBatch.early``: before its watermark closed it, to
use a thin link while the watermark waits). Such a batch is the input's final word on the
window only once the input's watermark passes the window's end; until then a newer revision
may replace it. A merger whose windows go to a parent (``forward_early``) sends a window whose
inputs have all sent it at once, early itself if some batch of it is not final yet: its own
watermark, reported after, tells the parent when it is. A merger that finishes (the root's)
waits for those watermarks, or the deadline. A window's deadline counts from when an input
first closed it (sent it not early, or moved its watermark past it); a window only ever sent
early waits a deadline more from its first batch (its inputs may have died after sending).

When the inputs are the key partitions of one stream (``key_partitions``: the workers of a
partitioned merge), a window covers a source site only if every partition does: a partition
that is missing, or lacks the site, leaves the site's keys in it incomplete.

Each window that goes out says whether it is final (:mod:`jetstream.finality`): not when it
went out at its deadline without an input (``DEADLINE``), with an input's batch sent early
whose watermark has not passed it (``EARLY``), with an input's own batch provisional
(``INCOMPLETE_INPUT``), or before TPUT's rounds settled its top-k (``UNSETTLED``). A window
that went out provisional goes out again, under the next revision, once it is final, even if
no batch of it changed. An input a re-plan dropped (a site taken for dead) is not waited for,
but a window that lacks it is missing it (``DEADLINE``, not complete) until it comes back and
sends the window or passes it.

Where inputs answer in TPUT's rounds (``rounds``: the final top-k's ranking, at the root), a
window waits until its exact top-k is known (:func:`jetstream.approx.rounds.settled`) or its
deadline passes; :meth:`WindowMerger.asks` says what to ask each input meanwhile. A settled
window goes out exact: the rows every input holds, which include the top-k. An input whose
link has stepped down from the rounds to a degradation level sends its window truncated or
sketched, with bounds, and is not asked: the window waits only for what the inputs still in
rounds can answer, and goes out with bounds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jetstream import finality
from jetstream.approx import rollup
from jetstream.approx.levels import Ranking
from jetstream.approx.rounds import Ask, exact_rows, next_asks, settled
from jetstream.approx.truncate import (
    BoundedPartial,
    Ranges,
    merge_bounded,
    union_ranges,
    with_bounds,
)
from jetstream.dataplane.partials import ENDED, PartialBatch
from jetstream.errors import DataError
from jetstream.operators import WindowAggregate

__all__ = ["RETAIN_S", "MergedWindow", "Recall", "WindowMerger"]

Window = tuple[int, int]

#: Gives back a window the merger has forgotten: the newest batch of each input it merged
#: (from the site's inbox) and the last revision it went out as; None if it cannot.
Recall = Callable[[tuple[int, int]], "tuple[list[PartialBatch], int] | None"]

#: How long a settled window stays, to take corrections from inputs that come back.
RETAIN_S = 600.0
#: How long an input has to answer an ask in TPUT's rounds before it is asked again (its
#: stream may have broken with the ask on it).
ASK_AGAIN_S = 3.0


@dataclass(frozen=True)
class MergedWindow:
    window: Window
    rows: tuple[dict[str, Any], ...]
    origins: frozenset[str]  # the inputs whose batches it merges
    missing: frozenset[str]  # inputs it went out without (at the deadline)
    events: int
    error_bound: float
    covers: frozenset[str] = frozenset()  # the source sites whose records it summarises
    wan_bytes: int = 0
    closed_at_ms: int = 0
    revision: int = 0  # 0 the first time the window goes out, then 1, 2, ... (corrections)
    inputs_complete: bool = True  # whether every batch merged was complete itself
    early: bool = False  # some input's batch of it may still change (see the module)
    #: When an input was truncated (a degraded level): per row, how much of the ranking
    #: value may be missing, and a bound on any key left out (see jetstream.approx.truncate).
    slack: tuple[float, ...] | None = None
    omitted: float = 0.0
    complete_rows: tuple[bool, ...] | None = None  # per row, whether every input kept it
    warnings: tuple[str, ...] = ()  # the inputs' warnings, each once
    cut: float = 0.0  # the keys left out add up to at most this (jetstream.approx.truncate)
    ranges: Ranges | None = None  # each min's, max's and mean's over the rows left out
    rolled_up: bool = False  # its keys are the coarser values (jetstream.approx.rollup)
    #: Why it may still change (:mod:`jetstream.finality`; empty: final).
    provisional: tuple[str, ...] = ()
    #: Inputs that sent nothing for it and whose watermark passed its end: they had nothing.
    passed: frozenset[str] = frozenset()

    @property
    def bounded(self) -> BoundedPartial:
        """The rows with their truncation bounds (exact: zero slack)."""
        return with_bounds(self.rows, self.slack, self.omitted, self.complete_rows, self.cut,
                           self.ranges, self.rolled_up)

    @property
    def final(self) -> bool:
        return not self.provisional

    @property
    def degraded(self) -> bool:
        """Whether a degraded level made some input's part of it (a truncation, a summary
        with an error bound, keys rolled up): a query's own sketches are not degraded."""
        return self.slack is not None or self.rolled_up or self.error_bound > 0

    @property
    def complete(self) -> bool:
        return not self.missing and self.inputs_complete

    @property
    def correction(self) -> bool:
        return self.revision > 0


@dataclass
class _Pending:
    first_seen: float
    #: When an input first closed the window (a batch not sent early, or its watermark past
    #: the window): the deadline counts from then. A window only sent early so far (inputs
    #: that may have died since) waits a deadline more from ``first_seen``.
    closing: float | None = None
    batches: dict[str, PartialBatch] = field(default_factory=dict)  # origin -> newest batch
    sent: frozenset[tuple[str, int]] | None = None  # (origin, revision) merged last time
    final: bool = False  # whether it went out final last time
    revision: int = -1
    settled: float | None = None  # when it was last seen settled
    asked: dict[str, tuple[int, float]] = field(default_factory=dict)  # input -> (revision, when)
    #: Wide-area bytes the window cost besides its batches': revisions replaced since, asks.
    spent: int = 0
    #: Per input whose batch came early: when its watermark passed the window (wall-clock
    #: ms its records for that arrived, as its progress said).
    closed: dict[str, int] = field(default_factory=dict)


class WindowMerger:
    """Partial batches of one query from a known set of inputs, merged per window."""

    def __init__(self, aggregate: WindowAggregate, inputs: Iterable[str], *,
                 deadline_s: float, clock: Callable[[], float] = time.monotonic,
                 retain_s: float = RETAIN_S, key_partitions: bool = False,
                 rounds: Ranking | None = None, recall: Recall | None = None,
                 forward_early: bool = False) -> None:
        self.aggregate, self.key_partitions, self.rounds = aggregate, key_partitions, rounds
        #: Windows go to a parent: send one early rather than wait for an early input's
        #: watermark (see the module).
        self.forward_early = forward_early
        #: Gives back a forgotten window (see :data:`Recall`): a batch for it corrects it.
        self.recall = recall
        self.inputs = frozenset(inputs)
        self.deadline_s, self.retain_s = deadline_s, retain_s
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[Window, _Pending] = {}
        self._watermarks: dict[str, int] = {}
        self._received: dict[str, int] = {}  # input -> its latest progress's received_ms
        self._ended: set[str] = set()
        #: Inputs a re-plan dropped (a site taken for dead): a window that lacks one is not
        #: final, though nobody waits for it (see :meth:`_absent`).
        self._departed: set[str] = set()
        self._forgotten_end: int | None = None  # the latest end of a forgotten window
        self.too_late = 0  # batches refused: their window was forgotten
        #: Set whenever a batch or a progress report comes in: a window may be ready now.
        self.changed = threading.Event()

    def set_inputs(self, inputs: Iterable[str]) -> None:
        """Merge from ``inputs`` from now on (a re-plan): windows waiting for an input that
        left stop waiting; an input that joins corrects the windows it has data for."""
        with self._lock:
            new = frozenset(inputs)
            if not self.key_partitions:  # (a partition's worker left: the run is replaced)
                self._departed = (self._departed | (self.inputs - new)) - new
            self.inputs = new

    def add(self, batch: PartialBatch) -> None:
        """Keep an input's batch; of several for one (origin, window), the newest revision."""
        with self._lock:
            if batch.window not in self._windows and self._forgotten_end is not None \
                    and batch.window[1] <= self._forgotten_end:
                earlier = self.recall(batch.window) if self.recall is not None else None
                if earlier is None:
                    self.too_late += 1
                    return
                batches, revision = earlier  # what the window merged, and its last revision
                pending = self._windows[batch.window] = _Pending(self._clock())
                pending.batches = {b.origin: b for b in batches}
                pending.revision = revision
            pending = self._windows.setdefault(batch.window, _Pending(self._clock()))
            if not batch.early and pending.closing is None:
                pending.closing = self._clock()
            held = pending.batches.get(batch.origin)
            if held is None or batch.revision > held.revision:
                pending.batches[batch.origin] = batch
                pending.spent += held.wan_bytes if held is not None else 0
            elif batch.identity != held.identity:  # an older revision, come late: it cost too
                pending.spent += batch.wan_bytes
        self.changed.set()

    def progress(self, origin: str, watermark_ms: int, ended: bool = False,
                 received_ms: int = 0) -> None:
        """An input has sent every window ending at or before ``watermark_ms``; it had
        received the records that moved it there at ``received_ms`` (0: not known, now)."""
        received_ms = received_ms or time.time_ns() // 1_000_000
        with self._lock:
            before = self._watermarks.get(origin, -ENDED)
            self._watermarks[origin] = watermark = ENDED if ended else watermark_ms
            self._received[origin] = received_ms
            if ended:
                self._ended.add(origin)
            for window, pending in self._windows.items():
                if not before < window[1] <= watermark:
                    continue
                if pending.closing is None:
                    pending.closing = self._clock()
                batch = pending.batches.get(origin)
                if batch is not None and batch.early:
                    pending.closed[origin] = received_ms
        self.changed.set()

    @property
    def received_ms(self) -> int:
        """When the inputs had the records that moved :attr:`watermark` (the latest of
        their latest reports: an upper bound)."""
        with self._lock:
            return max((self._received.get(i, 0) for i in self.inputs), default=0)

    @property
    def watermark(self) -> int | None:
        """How far every input has got (None until each has said): what to report upward."""
        with self._lock:
            if not self.inputs <= self._watermarks.keys():
                return None
            return min(self._watermarks[i] for i in self.inputs)

    @property
    def finished(self) -> bool:
        """Every input has ended and every window has gone out with all of them."""
        with self._lock:
            return self.inputs <= self._ended and all(
                p.sent == self._versions(p) for p in self._windows.values())

    def ready(self) -> list[MergedWindow]:
        """Every window that can go out now: complete, past its deadline, or corrected."""
        now = self._clock()
        out = []
        with self._lock:
            for window, pending in sorted(self._windows.items()):
                waiting = self._waiting_for(window, pending)
                missing = waiting | self._absent(window, pending)
                unsure = not self.forward_early and self._early(window, pending)
                late = now - (pending.first_seen + self.deadline_s if pending.closing is None
                              else pending.closing) >= self.deadline_s
                if pending.sent is None:
                    go = (not waiting and not unsure and self._settled(pending)) or late
                else:
                    go = ((self._versions(pending) != pending.sent and (not unsure or late))
                          or (not pending.final and not self._reasons(window, pending, missing)))
                if go:
                    out.append(self._merge(window, pending, missing))
            self._forget_settled()
        return out

    def asks(self) -> list[tuple[str, Window, Ask]]:
        """What to ask which input about which window next, in TPUT's rounds: for every
        window that has a batch from each input and whose top-k is not known yet. An ask
        its input has not answered goes again after ``ASK_AGAIN_S``."""
        if self.rounds is None:
            return []
        now, out = self._clock(), []
        with self._lock:
            for window, pending in self._windows.items():
                if self._settled(pending) or self._waiting_for(window, pending):
                    continue
                try:
                    wanted = next_asks(self._bounded_inputs(pending), self.aggregate,
                                       self.rounds.by, self.rounds.k)
                except DataError:  # a negative ranking sum: the deadline sends it as it is
                    continue
                for origin, ask in wanted.items():
                    batch = pending.batches[origin]
                    last = pending.asked.get(origin)
                    if not batch.rounds or (last is not None and last[0] == batch.revision
                                            and now - last[1] < ASK_AGAIN_S):
                        continue
                    pending.asked[origin] = (batch.revision, now)
                    out.append((origin, window, ask))
        return out

    def charge(self, window: Window, size: int) -> None:
        """Count ``size`` more wide-area bytes against ``window`` (an ask sent about it)."""
        with self._lock:
            pending = self._windows.get(window)
            if pending is not None:
                pending.spent += size

    def _settled(self, pending: _Pending) -> bool:
        """Whether nothing is left to ask about the window: its inputs do not answer in
        rounds, its exact top-k is known, or what blocks it is held by inputs that do not
        answer (a link stepped down from the rounds to a degradation level sends its
        window truncated or sketched, with bounds, and is never asked)."""
        if not self._in_rounds(pending):
            return True
        assert self.rounds is not None
        try:  # nothing is asked of a settled window (its exact top-k is known)
            wanted = next_asks(self._bounded_inputs(pending), self.aggregate,
                               self.rounds.by, self.rounds.k)
        except DataError:
            return True
        return not any(pending.batches[origin].rounds for origin in wanted)

    def _exact(self, pending: _Pending) -> bool:
        """Whether the window's exact top-k is known (its inputs in rounds settled it)."""
        return self._known(pending) is not False

    def _known(self, pending: _Pending) -> bool | None:
        """Whether the inputs in rounds settled the window's exact top-k; None: the rounds
        cannot tell (a negative ranking value), the rows are what the inputs sent."""
        assert self.rounds is not None
        try:
            return settled(merge_bounded(self._bounded_inputs(pending).values(),
                                         self.aggregate),
                           self.aggregate, self.rounds.by, self.rounds.k)
        except DataError:
            return None

    def _reasons(self, window: Window, pending: _Pending, missing: frozenset[str]
                 ) -> list[str]:
        """Why the window would go out provisional now (:mod:`jetstream.finality`)."""
        reasons = []
        if missing:
            reasons.append(finality.DEADLINE)
        if not self.forward_early and self._early(window, pending):
            reasons.append(finality.EARLY)
        if not all(b.complete for b in pending.batches.values()):
            reasons.append(finality.INCOMPLETE_INPUT)
        if self._in_rounds(pending) and not self._known(pending):
            reasons.append(finality.UNSETTLED)
        return finality.provisional(reasons)

    def _in_rounds(self, pending: _Pending) -> bool:
        """Whether some input of the window answers in rounds (and this merger asks)."""
        return self.rounds is not None and any(b.rounds for b in pending.batches.values())

    @staticmethod
    def _bounded_inputs(pending: _Pending) -> dict[str, BoundedPartial]:
        return {origin: b.bounded for origin, b in pending.batches.items()}

    def _waiting_for(self, window: Window, pending: _Pending) -> frozenset[str]:
        return frozenset(i for i in self.inputs - pending.batches.keys()
                         if self._watermarks.get(i, -ENDED) < window[1])

    def _absent(self, window: Window, pending: _Pending) -> frozenset[str]:
        """The inputs a re-plan dropped that the window lacks: no batch of theirs, no other
        input's batch covering them, and their watermark short of its end. Nobody waits for
        them, but the window is not final (nor complete) without them."""
        if not self._departed:
            return frozenset()
        covered = frozenset().union(*(b.covers or {b.origin} for b in pending.batches.values()))
        return frozenset(i for i in self._departed - pending.batches.keys() - covered
                         if self._watermarks.get(i, -ENDED) < window[1])

    def _early(self, window: Window, pending: _Pending) -> bool:
        """Whether some input's batch of the window was sent early and that input's
        watermark has not passed the window yet (an input no longer planned: final)."""
        return any(batch.early and origin in self.inputs
                   and self._watermarks.get(origin, -ENDED) < window[1]
                   for origin, batch in pending.batches.items())

    @staticmethod
    def _versions(pending: _Pending) -> frozenset[tuple[str, int]]:
        return frozenset((o, b.revision) for o, b in pending.batches.items())

    def _forget_settled(self) -> None:
        """Drop windows that went out complete, that no input can still change, and that
        have stayed so for ``retain_s``."""
        now = self._clock()
        for window, pending in list(self._windows.items()):
            if not (pending.sent is not None and self._versions(pending) == pending.sent
                    and all(b.complete for b in pending.batches.values())
                    and all(self._watermarks.get(i, -ENDED) >= window[1]
                            for i in self.inputs)):
                pending.settled = None
                continue
            if pending.settled is None:
                pending.settled = now
            if now - pending.settled >= self.retain_s:
                del self._windows[window]
                self._forgotten_end = max(self._forgotten_end or window[1], window[1])

    def _merge(self, window: Window, pending: _Pending, missing: frozenset[str]
               ) -> MergedWindow:
        batches = list(pending.batches.values())
        pending.sent, pending.revision = self._versions(pending), pending.revision + 1
        provisional = self._reasons(window, pending, missing)
        pending.final = not provisional
        slack: tuple[float, ...] | None = None
        omitted, complete, cut, ranges, rolled_up = 0.0, None, 0.0, None, False
        if any(b.slack is not None or b.rolled_up for b in batches):
            bounded = [b.bounded for b in batches]
            merged = (_disjoint(bounded) if self.key_partitions
                      else rollup.merged(bounded, self.aggregate))
            rows, rolled_up = merged.rows, merged.rolled_up
            if merged.truncated:
                slack, omitted, complete = merged.slack, merged.omitted, merged.complete
                cut, ranges = merged.cut, merged.ranges
            if self._in_rounds(pending) and self._exact(pending):
                rows, slack, omitted, complete, cut, ranges = (exact_rows(merged), None, 0.0,
                                                               None, 0.0, None)
        else:
            rows = self._merge_rows(batches)
        covered = [b.covers or frozenset({b.origin}) for b in batches]
        if not self.key_partitions:
            covers = frozenset().union(*covered)
        elif self.inputs <= pending.batches.keys():
            covers = frozenset.intersection(*covered)
        else:  # a partition is missing: no site's keys are all there
            covers = frozenset()
        return MergedWindow(
            window, rows, frozenset(pending.batches), missing,
            events=sum(b.events for b in batches),
            error_bound=max((b.error_bound for b in batches), default=0.0),
            covers=covers,
            wan_bytes=sum(b.wan_bytes for b in batches) + pending.spent,
            closed_at_ms=max((pending.closed.get(b.origin, b.closed_at_ms) if b.early
                              else b.closed_at_ms for b in batches), default=0),
            revision=pending.revision, inputs_complete=all(b.complete for b in batches),
            early=self._early(window, pending),
            slack=slack, omitted=omitted, complete_rows=complete, cut=cut, ranges=ranges,
            rolled_up=rolled_up, warnings=tuple(sorted({w for b in batches for w in b.warnings})),
            provisional=tuple(provisional),
            passed=frozenset(i for i in self.inputs - pending.batches.keys()
                             if self._watermarks.get(i, -ENDED) >= window[1]))

    def _merge_rows(self, batches: list[PartialBatch]) -> tuple[dict[str, Any], ...]:
        aggregates = self.aggregate.aggregates
        groups: dict[tuple[Any, ...], dict[str, Any]] = {}
        for batch in batches:
            for row in batch.rows:
                key = tuple(row[k] for k in self.aggregate.keys)
                merged = groups.get(key)
                if merged is None:
                    merged = groups[key] = {k: row[k] for k in self.aggregate.keys} | {
                        name: agg.create() for name, agg in aggregates}
                for name, agg in aggregates:
                    merged[name] = agg.merge(merged[name], row[name])
        return tuple(groups.values())


def _disjoint(parts: list[BoundedPartial]) -> BoundedPartial:
    """Key partitions' bounded partials put together: each key is in one partition only, so
    its row and slack are that partition's, and a key in no row is bounded by its own
    partition's ``omitted``, at most the largest (merging them as if they could share keys
    would add up every partition's)."""
    return BoundedPartial(tuple(row for p in parts for row in p.rows),
                          tuple(s for p in parts for s in p.slack),
                          max((p.omitted for p in parts), default=0.0),
                          tuple(c for p in parts for c in p.complete),
                          any(p.truncated for p in parts), sum(p.cut for p in parts),
                          union_ranges(p.ranges for p in parts))
