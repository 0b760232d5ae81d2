"""A link's profile: what each level of its ladder would cost and lose on the query's own windows.

The ladder's figures (:mod:`jetstream.approx.levels`) are guesses made before any data: how
much a level weighs against the others, and a nominal error. A :class:`Profile` replaces them
with measurements. Every ``every``-th exact window a sender is about to ship, it encodes the
window at every level as that level would send it, and notes each level's bytes (the encoded
batch, compressed as it goes over the wire, but before the stream's key dictionary, whose
saving depends on what went before: the policy learns it from the acks) and the error bound a
result of it would carry.
The figures of a level are over the last ``keep`` windows it measured: the mean bytes, and
the largest error. The link's policy (:class:`jetstream.approx.policy.LinkPolicy`) then plans
with the bytes, and takes a level only if its measured error fits the SLO's ``max_error``.

The error a level is measured at is this sender's own part of the result's bound:

- Without a top-k (a count or a sum by key, :func:`jetstream.approx.levels.heaviest`): the
  share of the window's total the level leaves out, ``cut / (sum of lb + cut)``
  (:func:`jetstream.approx.truncate.missing_share`). The result's ``error_bound`` is that
  share over the merged partial, and a merge's share is at most its inputs' largest (the
  cuts and the lower bounds add up), so a sender's measurement bounds the result's part of
  it that this link adds.
- With a top-k: what this input can add to the width ``ub - lb`` of a row of the result (its
  largest ``omitted`` or row slack), over its own ``k``-th largest value: an estimate of the
  result's ``(ub - lb) / lb``, whose rows are at least that heavy where the sites' traffic
  is alike.
- A level that sketches distinct counts or quantiles has at least its sketches' a-priori
  error, which is what results report for them.

Measuring costs a sender an encoding of each level of a sampled window (about 90 ms of CPU
for 1,300 keys and four levels: ``scripts/bench_level_errors.py``); :attr:`Profile.cpu_s`
adds it up, so it can be reported beside the load. It holds the site's interpreter while it
runs: at one window in three it added about a second of latency after close at 3,000
records/s a site (0.6-1 s of CPU a measurement on a CDN top-k window of 5,000 keys;
``docs/benchmarks.md``), so a live link also waits ``min_interval_s`` (30 s) between the
windows it measures. It measures on a thread of its own, after the window went
(:mod:`jetstream.dataplane.uplink`), and skips a window while still on the last.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from fractions import Fraction

from jetstream.approx.items import ItemsSketch, from_items
from jetstream.approx.levels import Ladder
from jetstream.approx.truncate import BoundedPartial, bounds, missing_share, round_up
from jetstream.errors import DataError
from jetstream.operators import WindowAggregate

__all__ = ["PROFILE_EVERY", "PROFILE_WINDOWS", "LevelFigures", "Profile", "level_error"]

#: A sender measures one exact window in this many.
PROFILE_EVERY = 3
#: A level's figures are over this many of its latest measured windows.
PROFILE_WINDOWS = 8

#: What a level made of a window, in the wire's bytes: ``(summary, level index) -> bytes``.
Encode = Callable[[BoundedPartial | ItemsSketch, int], int]


@dataclass(frozen=True)
class LevelFigures:
    """One level as measured: ``bytes`` a window weighed on average, the largest ``error``
    bound a window's result would have had, over ``windows`` windows."""

    name: str
    bytes: float
    error: float
    windows: int


class Profile:
    """The measured figures of every level of ``ladder`` on one link (see the module docstring).

    ``every`` and ``keep`` as :data:`PROFILE_EVERY` and :data:`PROFILE_WINDOWS`; ``skip``:
    levels not to measure (on a link that runs TPUT's rounds, its exact level ships what the
    parent asks for, which no encoding of the window says).
    """

    def __init__(self, ladder: Ladder, aggregate: WindowAggregate, *,
                 every: int = PROFILE_EVERY, keep: int = PROFILE_WINDOWS,
                 skip: Collection[int] = (), min_interval_s: float = 0.0,
                 clock: Callable[[], float] = time.thread_time,
                 wall: Callable[[], float] = time.monotonic) -> None:
        self.ladder, self.aggregate = ladder, aggregate
        self.every, self._skip, self._clock = every, frozenset(skip), clock
        self.min_interval_s, self._wall = min_interval_s, wall
        self._last: float | None = None  # when the last window to measure was picked
        self._samples: list[deque[tuple[int, float]]] = [deque(maxlen=keep)
                                                          for _ in ladder.levels]
        self._seen = 0
        self._lock = threading.Lock()
        self.cpu_s = 0.0  # spent measuring, on the calling thread's CPU clock
        self.windows = 0  # measured

    def offer(self, window: BoundedPartial, encode: Encode) -> bool:
        """Measure ``window`` (an exact partial about to be sent) if it is the ``every``-th
        offered (:meth:`due`), as :meth:`measure` does; whether it was."""
        return self.due() and self.measure(window, encode)

    def due(self) -> bool:
        """Whether the window now offered is one to measure: one in ``every``, and not
        within ``min_interval_s`` of the last one picked."""
        self._seen += 1
        if len(self.ladder.levels) < 2 or self._seen % self.every:
            return False
        now = self._wall()
        if self._last is not None and now - self._last < self.min_interval_s:
            self._seen -= 1  # the next window is due instead
            return False
        self._last = now
        return True

    def measure(self, window: BoundedPartial, encode: Encode) -> bool:
        """Measure every level on ``window``, ``encode`` weighing a level's summary of it as
        the link would send it; whether it could. A window a level cannot summarise (a
        negative value in a sum it ranks by) teaches nothing."""
        started = self._clock()
        try:
            kth = kth_value(self.ladder, self.aggregate, window)
            measured = [(level.index, self._measure(window, level.index, encode, kth))
                        for level in self.ladder.levels if level.index not in self._skip]
        except DataError:
            return False
        finally:
            self.cpu_s += self._clock() - started
        with self._lock:
            for index, sample in measured:
                self._samples[index].append(sample)
            self.windows += 1
        return True

    def figures(self) -> tuple[LevelFigures, ...]:
        """Each level's figures, most accurate first (``windows`` 0: not measured yet)."""
        with self._lock:  # (a heartbeat reads them while the sender's thread measures)
            return tuple(
                LevelFigures(level.name, sum(b for b, _ in samples) / len(samples),
                             max(e for _, e in samples), len(samples)) if samples
                else LevelFigures(level.name, 0.0, 0.0, 0)
                for level, samples in zip(self.ladder.levels, self._samples, strict=True))

    def measured(self) -> list[tuple[float, float] | None]:
        """Each level's ``(bytes, error)`` as :meth:`LinkPolicy.learn
        <jetstream.approx.policy.LinkPolicy.learn>` takes them (None: not measured yet)."""
        return [(f.bytes, f.error) if f.windows else None for f in self.figures()]

    def _measure(self, window: BoundedPartial, index: int, encode: Encode,
                 kth: float | None) -> tuple[int, float]:
        level = self.ladder.levels[index]
        summary = self.ladder.degrade(window, self.aggregate, level)
        return encode(summary, index), level_error(self.ladder, index, summary,
                                                   self.aggregate, window, kth)


def kth_value(ladder: Ladder, aggregate: WindowAggregate, window: BoundedPartial) -> float | None:
    """A top-k's ``k``-th largest ranking value in ``window`` (None without a top-k)."""
    if ladder.rank is None:
        return None
    top = heapq.nlargest(ladder.rank.k, bounds(window, aggregate, ladder.rank.by).lb)
    return top[-1] if top else 0


def level_error(ladder: Ladder, index: int, summary: BoundedPartial | ItemsSketch,
                aggregate: WindowAggregate, window: BoundedPartial,
                kth: float | None = None) -> float:
    """The error bound level ``index`` of ``ladder`` adds to a result, measured on one
    sender's ``summary`` of its exact partial ``window`` (see the module docstring);
    ``kth``: :func:`kth_value` of ``window``, if known."""
    if index == 0:
        return 0.0
    level = ladder.levels[index]
    floor = level.error_bound if ladder.encodings[index].sketch is not None else 0.0
    bounded = summary if isinstance(summary, BoundedPartial) else from_items(
        summary.serialize(), summary.extra, aggregate, summary.rank)
    if ladder.rank is not None:
        if kth is None:
            kth = kth_value(ladder, aggregate, window)
        assert kth is not None
        spread = max([bounded.omitted, *bounded.slack])
        return max(floor, round_up(Fraction(spread) / max(Fraction(kth), Fraction(1))))
    if ladder.heaviest is not None:
        return max(floor, missing_share(bounded, aggregate, ladder.heaviest.by))
    return floor
