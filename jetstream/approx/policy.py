"""Which degradation level a stream ships over one wide-area link, decided from what the link did.

:class:`LinkPolicy` is the per-link feedback loop of JetStream (NSDI'14) and AWStream
(SIGCOMM'18) as pure, clock-injected Python: the sender reports each acknowledged window, the
policy answers with the level to encode the next windows at.

What it measures. A level changes only how many bytes a window weighs, so only the part of a
window's delay that grows with its bytes is the link's, and only that part a coarser level can
cut. The sender reports, for each message, the time the connection spent on it alone (from when
it was handed to gRPC, or the previous ack if that came later, to its ack) less the time the
receiver says in the ack it held the message (from having it whole to acking it: decoding,
merging, writing it down -- its load, not the link's), and the same for near-empty messages
(progress reports): those pay what any message pays whatever its size -- the round trip, both
processes' scheduling on a loaded machine, a receiver slow to get to each message (behind a
batch, a report is timed from the batch's ack: the receiver's delay alone).
The *link time* of a window is its time minus the median of the last ``ROUND_TRIPS``
near-empty ones; the throughput is bytes over link time. A busy sender, a CPU-starved receiver
or a burst of windows from a slow stage delays acks by about the same whatever the bytes, so
it leaves the link time, and the level, alone; a thin link's delay grows with the bytes and
shows.

Where it can still be fooled: what a receiver does before it has a message whole (gRPC reading
and parsing it, a starved machine's wait for a thread) counts as the link's where it grows with
the bytes: a receiver that slow looks like a link that slow, though it must take most of the
budget to move the level. Delays that vary from message to message by more than
``down_fraction`` of the budget, twice running, are taken for the link's. Queueing behind other
traffic on the link delays near-empty messages too and half of it goes into the baseline: right
as far as a coarser level cannot cut it, but two queries thinning one link can partly hide it
from each other (the median, not the maximum, keeps most of it out). A window sent behind others
is timed from the previous ack, so it pays no round trip, and subtracting one makes the link
look a round trip faster. With no near-empty message timed yet, the whole delay is the link's,
as if the baseline were 0.

The policy, in brief. It keeps a smoothed estimate of the link's throughput in bytes/s that
one outlying window does not move. It steps *down* (coarser) when a window at the current level
would take more than ``down_fraction`` (0.8) of the budget to send -- the budget is the window
length, or the SLO's ``max_latency`` if smaller -- or when the backlog behind the acknowledged
window exceeds ``max_backlog_windows`` and grows, or stays put for ``min_interval_s``, *and*
the latest window's link time says the link is too slow for the current level (windows pile up
behind a slow receiver just the same, and a coarser level would not drain them); it then
jumps straight to the most accurate level that fits. It steps *up* (finer) one level at a time,
as a probe, only after ``min_interval_s`` at the current level and only when the finer level
would take less than ``up_fraction`` (0.5) of the budget. It cannot oscillate: no two changes
are closer than ``min_interval_s``, with one exception, a step down because the backlog grew
-- windows at the current level are piling up, so waiting would only add latency, and this may
happen every window, even right after a probe. A backlog of heavier windows sent before a step
down is not blamed on the new level. And a probe lands on a level predicted at under 0.5 of the
budget, so the 0.8 step-down threshold is reached again only if the link itself got slower.

Two more inputs. A window on the link past the step-down threshold with no ack yet caps the
throughput (:meth:`LinkPolicy.observe_unacked`): a drop is met at the next window, not after
the slow ack. A link's profile (:meth:`LinkPolicy.learn`) replaces the levels' guessed bytes
and errors with what they measured on the query's own windows. And :attr:`LinkPolicy.link_bound`
says when the throughput measures the link, for the site to report it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from jetstream.approx.levels import DegradationLevel, checked_levels
from jetstream.approx.robust import RobustAverage
from jetstream.errors import DataError, PlanError

if TYPE_CHECKING:
    from jetstream.dsl import SLO

__all__ = ["LevelChange", "LinkPolicy", "LinkSLO"]

#: A throughput no acknowledged window has confirmed for this many windows is stale.
STALE_WINDOWS = 3
#: How many near-empty round trips the baseline is taken from.
ROUND_TRIPS = 8
#: A window's link time is at least this: below it, clocks and schedulers decide, not the link.
MIN_LINK_S = 1e-3


@dataclass(frozen=True)
class LinkSLO:
    """The parts of a query's SLO one link's policy honours, in plain units.

    ``max_latency_s``: seconds a window may take to cross the link; ``max_error``: the largest
    ``error_bound`` a level may have; ``max_wan_bps``: bits per second the query may use on the
    link (treated as a link that slow). None leaves a bound out.
    """

    max_latency_s: float | None = None
    max_error: float | None = None
    max_wan_bps: float | None = None

    def __post_init__(self) -> None:
        for name, unit in (("max_latency_s", "seconds"), ("max_wan_bps", "bits per second")):
            value = getattr(self, name)
            if value is not None and not (_is_number(value) and 0 < value < math.inf):
                msg = f"link slo: {name} must be a positive number of {unit}, not {value!r}"
                raise PlanError(msg)
        if self.max_error is not None and not (_is_number(self.max_error)
                                               and 0 <= self.max_error < math.inf):
            msg = f"link slo: max_error must be a fraction >= 0, not {self.max_error!r}"
            raise PlanError(msg)

    @classmethod
    def from_slo(cls, slo: SLO) -> LinkSLO:
        """The link's share of a query's :class:`jetstream.SLO` (``max_wan_kbps`` is kbit/s)."""
        ms, kbps = slo.max_latency_ms, slo.max_wan_kbps
        return cls(max_latency_s=None if ms is None else ms / 1000,
                   max_error=slo.max_error,
                   max_wan_bps=None if kbps is None else kbps * 1000)


class LevelChange(NamedTuple):
    """One change of level; ``reason`` starts with ``"backlog grew"``, ``"too slow"``,
    ``"backlog stuck"`` or ``"probe"``."""

    time: float
    from_level: DegradationLevel
    to_level: DegradationLevel
    reason: str


class LinkPolicy:
    """The degradation level of one stream over one link, fed one observation per window.

    Parameters
    ----------
    levels
        The stream's levels, most accurate first: ``index`` counts from 0, ``bytes_per_window``
        does not increase and ``error_bound`` does not decrease along the list.
    window_s
        The window length in seconds: a link that cannot send a window per window falls behind.
    slo
        A :class:`LinkSLO` or a query's :class:`jetstream.SLO`. Levels above ``max_error`` are
        never chosen; ``max_latency`` shrinks the budget below the window length;
        ``max_wan_bps`` caps the throughput the policy plans with.
    lead_s
        How long before its window closes a window's partial sets out (sent early, while the
        watermark waits): it has that much more than ``max_latency`` to arrive (the budget
        stays within the window length).
    min_interval_s
        Least time between two changes of level, except a step down because the backlog grew.
    down_fraction, up_fraction
        Step down when the current level needs more than ``down_fraction`` of the budget;
        step up when the finer level needs less than ``up_fraction`` (the gap is hysteresis).
    max_backlog_windows
        Windows that may wait unacknowledged behind the one just acknowledged before the
        policy calls the link too slow (raise it on links whose round trip exceeds a window).
    start
        The level to start at (the plan's for a link it found too thin for exact partials),
        at most the coarsest the SLO allows.
    clock
        Seconds, monotonic; tests pass a fake one.

    Raises
    ------
    PlanError
        If the levels are empty or out of order, no level meets ``max_error``, or a parameter
        is out of range.
    """

    def __init__(self, levels: Sequence[DegradationLevel], *, window_s: float,
                 slo: LinkSLO | SLO | None = None, lead_s: float = 0.0,
                 min_interval_s: float = 5.0,
                 down_fraction: float = 0.8, up_fraction: float = 0.5,
                 max_backlog_windows: int = 1, start: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._levels = checked_levels(levels)
        if not (_is_number(window_s) and 0 < window_s < math.inf):
            msg = f"link policy: window_s must be a positive number of seconds, not {window_s!r}"
            raise PlanError(msg)
        for name, value in (("lead_s", lead_s), ("min_interval_s", min_interval_s)):
            if not (_is_number(value) and 0 <= value < math.inf):
                msg = f"link policy: {name} must be >= 0 seconds, not {value!r}"
                raise PlanError(msg)
        if not (_is_number(up_fraction) and _is_number(down_fraction)
                and 0 < up_fraction < down_fraction <= 1):
            msg = (f"link policy: need 0 < up_fraction < down_fraction <= 1 (the gap keeps "
                   f"the level from flapping), not {up_fraction!r} and {down_fraction!r}")
            raise PlanError(msg)
        if isinstance(max_backlog_windows, bool) or not isinstance(max_backlog_windows, int) \
                or max_backlog_windows < 0:
            msg = (f"link policy: max_backlog_windows must be an int >= 0, "
                   f"not {max_backlog_windows!r}")
            raise PlanError(msg)
        if slo is not None and not isinstance(slo, LinkSLO) and not hasattr(slo, "max_latency_ms"):
            msg = f"link policy: slo must be a LinkSLO or a jetstream.SLO, not {slo!r}"
            raise PlanError(msg)
        self._slo = slo if slo is None or isinstance(slo, LinkSLO) else LinkSLO.from_slo(slo)
        self.window_s, self.min_interval_s = float(window_s), float(min_interval_s)
        self.down_fraction, self.up_fraction = float(down_fraction), float(up_fraction)
        self.max_backlog_windows = max_backlog_windows
        self._clock = clock

        max_error = self._slo.max_error if self._slo else None
        allowed = [lv for lv in self._levels if max_error is None or lv.error_bound <= max_error]
        if not allowed:
            first = self._levels[0]
            msg = (f"link policy: max_error={max_error:g} allows no level; the most accurate, "
                   f"{first.name!r}, has error_bound {first.error_bound:g}")
            raise PlanError(msg)
        self._max_error = max_error
        self._measured: list[tuple[float, float] | None] = [None] * len(self._levels)
        self._coarsest = allowed[-1].index
        latency = self._slo.max_latency_s if self._slo else None
        self.budget_s = (self.window_s if latency is None
                         else min(self.window_s, latency + float(lead_s)))
        wan_bps = self._slo.max_wan_bps if self._slo else None
        self._rate_cap = math.inf if wan_bps is None else wan_bps / 8

        self._current = min(max(start, 0), self._coarsest)
        self._changed_at: float | None = None
        self._throughput = RobustAverage()
        self._sampled_at: float | None = None  # when the newest throughput sample came
        self._volume = RobustAverage()  # wire bytes of a window per unit of its weight
        self._round_trips: deque[float] = deque(maxlen=ROUND_TRIPS)
        self._last_backlog: int | None = None
        self._waiting: int | None = None  # the backlog behind the last unacked window seen
        self._last_was_evidence = False
        self._backlog_since: tuple[float, int] | None = None  # (time, backlog) it went over
        self._history: list[LevelChange] = []
        self._violation: str | None = None
        self._pinned = False

    # --- what callers read ---------------------------------------------------------------

    @property
    def level(self) -> DegradationLevel:
        """The level to encode the next windows at."""
        return self._levels[self._current]

    @property
    def levels(self) -> tuple[DegradationLevel, ...]:
        return self._levels

    @property
    def coarsest_allowed(self) -> DegradationLevel:
        """The coarsest level whose error bound the SLO's ``max_error`` admits."""
        return self._levels[self._coarsest]

    @property
    def history(self) -> list[LevelChange]:
        """Every change of level so far, oldest first (a copy)."""
        return list(self._history)

    @property
    def violation(self) -> str | None:
        """Why the latency bound cannot be met even at the coarsest allowed level, or None."""
        return self._violation

    @property
    def throughput(self) -> float | None:
        """The smoothed throughput of the link in bytes/s (before the SLO's cap), or None."""
        return self._throughput.value

    @property
    def base_s(self) -> float:
        """What a near-empty message takes on the connection, whatever the link's bandwidth:
        the median of the last ``ROUND_TRIPS`` round trips, 0.0 before the first."""
        return statistics.median(self._round_trips) if self._round_trips else 0.0

    @property
    def recent_throughput(self) -> float | None:
        """:attr:`throughput`, or None if no window with bytes in it was acknowledged in the
        last ``STALE_WINDOWS`` windows: a stalled link's last speed is not its speed now."""
        if (self._sampled_at is None
                or self._clock() - self._sampled_at > STALE_WINDOWS * self.window_s):
            return None
        return self._throughput.value

    @property
    def link_bound(self) -> bool:
        """Whether the link paces the stream, so that :attr:`recent_throughput` measures the
        link: the policy stepped down on its own, or a window at the level in force takes
        over the step-down threshold (at the throughput before the SLO's cap) and no coarser
        level is open (the coarsest ``max_error`` admits, a one-level stream, a pinned one)."""
        if self.recent_throughput is None:
            return False
        if self._current > 0 and not self._pinned:
            return True
        t = self._send_time(self._current, self._throughput.value)
        return t is not None and t > self.down_fraction * self.budget_s

    def send_time_s(self, level: DegradationLevel | int) -> float | None:
        """Predicted link time of a window at ``level``: seconds from starting to send it to
        its ack beyond what a near-empty message takes (:attr:`base_s`), or None before the
        first window with bytes in it."""
        return self._send_time(self._index(level), self._rate())

    @property
    def pinned(self) -> bool:
        """Whether an operator holds the level (see :meth:`pin`)."""
        return self._pinned

    def pin(self, level: DegradationLevel | int | None) -> DegradationLevel:
        """Hold the link at ``level`` until ``pin(None)`` hands the choice back to the policy,
        which goes on measuring the link meanwhile. Returns the level now in force.

        Raises
        ------
        DataError
            If there is no such level, or the SLO's ``max_error`` does not allow it.
        """
        now = self._clock()
        if level is None:
            self._pinned = False
            self._changed_at = now  # the policy decides again after min_interval_s
            return self.level
        index = self._index(level)
        if not self._allowed(index):
            msg = (f"link policy: level {self._levels[index].name!r} is past the SLO's "
                   f"max_error (its error {self._error(index):.3g}); the coarsest it allows "
                   f"is {self.coarsest_allowed.name!r}")
            raise DataError(msg)
        if index != self._current:
            self._change(now, index, "pinned by an operator")
        self._pinned = True
        return self.level

    def learn(self, figures: Sequence[tuple[float, float] | None]) -> DegradationLevel:
        """Take each level's measured ``(bytes per window, error)`` (None: not measured), as
        a link's profile has them (:mod:`jetstream.approx.profile`): from now on a level's
        measured bytes stand for its guess (what the link carries of a window is learnt
        against them: the stream's key dictionary makes it less), and its measured error for
        its nominal one when the SLO's ``max_error`` decides whether it may be chosen. If the
        current level's error no longer fits, the link goes to the nearest finer level whose
        does (not while pinned). Returns the level now in force.

        Raises
        ------
        DataError
            If there is not one entry per level, or a figure is negative or not finite.
        """
        if len(figures) != len(self._levels):
            msg = (f"link policy: a profile needs one entry per level ({len(self._levels)}), "
                   f"not {len(figures)}")
            raise DataError(msg)
        for entry in figures:
            if entry is not None and not all(_is_number(v) and 0 <= v < math.inf
                                              for v in entry):
                msg = f"link policy: a level's bytes and error must be >= 0, not {entry!r}"
                raise DataError(msg)
        if not any(self._measured):  # the volume was learnt against guesses: learn it again
            self._volume = RobustAverage()
        self._measured = [None if e is None else (float(e[0]), float(e[1])) for e in figures]
        self._coarsest = max(i for i in range(len(self._levels)) if self._allowed(i))
        if not self._pinned and not self._allowed(self._current):
            finer = max(i for i in range(self._current) if self._allowed(i))
            self._change(self._clock(), finer,
                         f"profile: {self.level.name!r} would have had error "
                         f"{self._error(self._current):.3g}, over max_error "
                         f"{self._max_error:g}")
        return self.level

    def measured(self, level: DegradationLevel | int) -> tuple[float, float] | None:
        """The level's ``(bytes, error)`` as last learnt (:meth:`learn`), or None."""
        return self._measured[self._index(level)]

    # --- the feedback loop -------------------------------------------------------------------

    def observe_round_trip(self, send_s: float) -> None:
        """Account for a near-empty message acknowledged ``send_s`` seconds after it was sent
        (or after the previous ack): what every window pays besides its bytes' time on the
        link.

        Raises
        ------
        DataError
            If ``send_s`` is negative or not finite.
        """
        if not (_is_number(send_s) and 0 <= send_s < math.inf):
            msg = (f"link policy: a round trip must be a finite number of seconds >= 0, "
                   f"not {send_s!r}")
            raise DataError(msg)
        self._round_trips.append(float(send_s))

    def observe(self, window_bytes: float, send_s: float, backlog_windows: int, *,
                level: DegradationLevel | int | None = None) -> DegradationLevel:
        """Account for one acknowledged window and return the level for the next windows.

        ``window_bytes`` were sent in ``send_s`` seconds (from the start of sending -- once
        the link was free of earlier messages -- to the ack); the link's share of it is what
        exceeds :attr:`base_s`. ``backlog_windows`` wait unacknowledged behind it. ``level``
        is the level the window was encoded at (default: the current one); pass it for
        windows encoded before a change, so that they teach the policy the link's speed but
        not how much the new level weighs, and a backlog of old, heavier windows is not
        blamed on the new level.

        Raises
        ------
        DataError
            If a number is negative, not finite, or ``send_s`` is not positive.
        """
        if not (_is_number(window_bytes) and 0 <= window_bytes < math.inf):
            msg = f"link policy: window_bytes must be a finite number >= 0, not {window_bytes!r}"
            raise DataError(msg)
        if not (_is_number(send_s) and 0 < send_s < math.inf):
            msg = f"link policy: send_s must be a positive number of seconds, not {send_s!r}"
            raise DataError(msg)
        if isinstance(backlog_windows, bool) or not isinstance(backlog_windows, int) \
                or backlog_windows < 0:
            msg = f"link policy: backlog_windows must be an int >= 0, not {backlog_windows!r}"
            raise DataError(msg)
        encoded = self._current if level is None else self._index(level)
        now = self._clock()
        if window_bytes > 0:
            self._throughput.add(window_bytes / max(send_s - self.base_s, MIN_LINK_S))
            self._sampled_at = now
            self._volume.add(window_bytes / self._weight(encoded))

        # Only a window at the current level or coarser says the current level is too heavy.
        evidence = encoded >= self._current
        over = backlog_windows > self.max_backlog_windows
        grew = (evidence and self._last_was_evidence and self._last_backlog is not None
                and backlog_windows > self._last_backlog)
        previous_backlog = self._last_backlog
        self._last_backlog, self._last_was_evidence = backlog_windows, evidence
        if evidence:
            if not over:
                self._backlog_since = None
            elif self._backlog_since is None:
                self._backlog_since = (now, backlog_windows)

        if self._throughput.value is not None and not self._pinned:
            self._decide(now, backlog_windows, previous_backlog, over, grew, evidence)
        self._violation = self._check_violation()
        return self.level

    def observe_unacked(self, window_bytes: float, waited_s: float,
                        backlog_windows: int) -> DegradationLevel:
        """Account for a window the link has been on for ``waited_s`` with no ack yet (timed
        as :meth:`observe` times one), and return the level for the next windows. Once that
        is past the step-down threshold beyond :attr:`base_s`, the link carries at most
        ``window_bytes`` in that time: the throughput is capped there at once (an ack may
        take longer still, and teach the rest), and the policy decides as after an ack. So a
        link that drops tenfold is stepped down while the first slow window is still on its
        way, not after it arrives, and fewer windows set out at a level it cannot carry.

        Raises
        ------
        DataError
            If a number is negative or not finite.
        """
        if not (_is_number(window_bytes) and 0 <= window_bytes < math.inf
                and _is_number(waited_s) and 0 <= waited_s < math.inf):
            msg = (f"link policy: an unacked window needs bytes and seconds >= 0, not "
                   f"{window_bytes!r} and {waited_s!r}")
            raise DataError(msg)
        link_s = waited_s - self.base_s
        previous, self._waiting = self._waiting, backlog_windows
        if window_bytes <= 0 or link_s <= self.down_fraction * self.budget_s:
            return self.level
        now = self._clock()
        self._throughput.cap(window_bytes / link_s)
        self._sampled_at = now
        if self._volume.value is not None and not self._pinned:
            grew = previous is not None and backlog_windows > previous
            self._decide(now, backlog_windows, previous,
                         backlog_windows > self.max_backlog_windows, grew, True)
        self._violation = self._check_violation()
        return self.level

    def _decide(self, now: float, backlog: int, previous: int | None, over: bool, grew: bool,
                evidence: bool) -> None:
        down_at = self.down_fraction * self.budget_s
        # A backlog is the link's only if the latest window says the link is too slow for this
        # level: a slow receiver, or a burst of windows from the stage, piles them up as well.
        latest = self._send_time(self._current, self._cautious_rate())
        link_backlog = over and latest is not None and latest > down_at
        if link_backlog and grew:  # the one change allowed inside min_interval_s
            self._step_down(now, f"backlog grew from {previous} to {backlog} windows")
            return
        if self._changed_at is not None and now - self._changed_at < self.min_interval_s:
            return
        current = self._current
        t = self._send_time(current, self._rate())
        if t is not None and t > down_at:
            self._step_down(now, f"too slow: a window at {self.level.name!r} takes about "
                                 f"{t:.3g}s, over {down_at:.3g}s")
            return
        since = self._backlog_since
        if link_backlog and since is not None and now - since[0] >= self.min_interval_s \
                and backlog >= since[1]:
            self._step_down(now, f"backlog stuck at {backlog} windows for "
                                 f"{now - since[0]:.3g}s")
            return
        if current == 0 or link_backlog or not evidence:
            return
        up = max(i for i in range(current) if self._allowed(i))
        finer = self._send_time(up, self._cautious_rate())
        up_at = self.up_fraction * self.budget_s
        if finer is not None and finer < up_at:
            self._change(now, up, f"probe: a window at {self._levels[up].name!r} should take "
                                  f"about {finer:.3g}s, under {up_at:.3g}s")

    def _step_down(self, now: float, reason: str) -> None:
        """To the most accurate allowed level that fits the pessimistic rate, at least one
        coarser; the coarsest allowed if none fits."""
        if self._current >= self._coarsest:
            return
        rate = self._cautious_rate()
        target = self._coarsest
        for index in range(self._current + 1, self._coarsest + 1):
            if not self._allowed(index):
                continue
            t = self._send_time(index, rate)
            if t is not None and t <= self.down_fraction * self.budget_s:
                target = index
                break
        self._change(now, target, reason)

    def _change(self, now: float, index: int, reason: str) -> None:
        self._history.append(LevelChange(now, self.level, self._levels[index], reason))
        self._current = index
        self._changed_at = now
        self._backlog_since = None

    def _check_violation(self) -> str | None:
        if self._current != self._coarsest:
            return None
        rate = self._rate()
        t = self._send_time(self._current, rate)
        if t is None or t <= self.budget_s:
            return None
        slo = self._slo
        if slo is not None and slo.max_latency_s is not None \
                and self.budget_s < self.window_s:
            bound = f"slo max_latency={slo.max_latency_s:g}s"
        else:
            bound = f"the window length {self.window_s:g}s"
        allowed = ("" if self._coarsest == len(self._levels) - 1 or slo is None
                   else f" that max_error={slo.max_error:g} allows")
        capped = (f" (capped by slo max_wan_bps={self._rate_cap * 8:g})"
                  if rate is not None and rate >= self._rate_cap else "")
        return (f"{bound} cannot be met: a window at {self.level.name!r}, the coarsest level"
                f"{allowed}, takes about {t:.3g}s at {rate:.4g} bytes/s{capped}: "
                f"{t - self.budget_s:.3g}s ({t / self.budget_s:.3g}x) over the "
                f"{self.budget_s:g}s budget")

    # --- estimates ---------------------------------------------------------------------------

    def _rate(self) -> float | None:
        """The smoothed throughput the policy plans with, capped by the SLO."""
        value = self._throughput.value
        return None if value is None else min(value, self._rate_cap)

    def _cautious_rate(self) -> float | None:
        """The lower of the smoothed and the latest throughput: how far to step down, and
        whether to step up, are decided as if the latest window told the truth when it is worse."""
        value, latest = self._throughput.value, self._throughput.latest
        if value is None or latest is None:
            return None
        return min(value, latest, self._rate_cap)

    def _send_time(self, index: int, rate: float | None) -> float | None:
        # Whatever of the round trip the baseline does not hold is folded into the throughput:
        # a finer level is predicted a little slower than it will be, which only makes step
        # ups more careful.
        volume = self._volume.value
        if rate is None or volume is None:
            return None
        return volume * self._weight(index) / rate

    def _weight(self, index: int) -> float:
        """What a window at the level weighs, in the units the volume is learnt in: its
        measured bytes, else its guess (scaled to bytes by the measured levels, if any). The
        volume then turns them into what crosses the link (after the stream's key
        dictionary, which a profile's measurement does not see)."""
        measured = self._measured[index]
        if measured is not None:
            return max(measured[0], 1.0)
        known = [(m[0], lv.bytes_per_window) for m, lv in zip(self._measured, self._levels,
                                                               strict=True) if m is not None]
        scale = sum(b for b, _ in known) / sum(g for _, g in known) if known else 1.0
        return self._levels[index].bytes_per_window * max(scale, 1e-9)

    def _error(self, index: int) -> float:
        """The level's error: as measured, else its nominal one."""
        measured = self._measured[index]
        return self._levels[index].error_bound if measured is None else measured[1]

    def _allowed(self, index: int) -> bool:
        """Whether the SLO's ``max_error`` admits the level (the exact level always)."""
        return index == 0 or self._max_error is None or self._error(index) <= self._max_error

    def _index(self, level: DegradationLevel | int) -> int:
        index = level.index if isinstance(level, DegradationLevel) else level
        if isinstance(index, bool) or not isinstance(index, int) \
                or not 0 <= index < len(self._levels):
            msg = f"link policy: no level {level!r}; levels are 0..{len(self._levels) - 1}"
            raise DataError(msg)
        return index


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
