"""Partial batches: one window's partial aggregates from one origin (:class:`PartialBatch`),
and what a degradation level makes of one (:func:`summarised`). Their wire form is
:mod:`jetstream.dataplane.codec`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jetstream.approx.items import ItemsSketch
from jetstream.approx.truncate import BoundedPartial, Ranges, with_bounds

__all__ = ["ENDED", "PartialBatch", "summarised"]

#: The watermark of an input that has ended, or is idle: it holds back no window.
ENDED = 2**63 - 1


@dataclass(frozen=True)
class PartialBatch:
    """The partial rows (group keys and accumulators) of one window from one origin."""

    query: str
    window: tuple[int, int]
    origin: str
    rows: tuple[Mapping[str, Any], ...]
    partition: int = 0
    attempt: int = 0
    sequence: int = 0
    events: int = 0
    error_bound: float = 0.0
    complete: bool = True
    level: int = 0
    covers: frozenset[str] = frozenset()  # the source sites whose records it summarises
    wan_bytes: int = 0  # wide-area bytes this window cost below its sender
    #: Wall-clock time the window could close everywhere it covers: when the last of its
    #: sites received the record that moved its watermark past the window's end.
    closed_at_ms: int = 0
    revision: int = 0  # a correction of the same window from the same origin counts up
    #: Truncated (degraded) partials: per row, how much of the ranking value may be missing
    #: from it, and a bound on the ranking value of any key left out. None/0: exact.
    slack: tuple[float, ...] | None = None
    omitted: float = 0.0
    #: Per row of a truncated batch, whether every contributor kept the key (then all its
    #: aggregates are exact). None: the rows with no slack.
    complete_rows: tuple[bool, ...] | None = None
    #: At a sketch level, what goes over the wire instead of ``rows`` (which is then empty);
    #: a received one arrives as rows with bounds.
    items: ItemsSketch | None = None
    warnings: tuple[str, ...] = ()  # what links on the way could not do (see WindowResult)
    #: An answer in TPUT's rounds (jetstream.dataplane.asks): its sender holds back rows its parent
    #: may ask for.
    rounds: bool = False
    #: Sent before its sender's watermark closed the window (see jetstream.dataplane.merger): final
    #: only once the sender's watermark passes the window's end.
    early: bool = False
    #: Of a truncated batch: the keys it left out add up to at most this in the ranking
    #: value (see jetstream.approx.truncate).
    cut: float = 0.0
    #: Of a truncated batch: the range of each min, max and average over the rows left out
    #: (None: unknown; see jetstream.approx.truncate).
    ranges: Ranges | None = None
    #: Its rows' keys are the query's coarser values (see jetstream.approx.rollup).
    rolled_up: bool = False

    @property
    def bounded(self) -> BoundedPartial:
        """The rows with their truncation bounds (exact: zero slack)."""
        return with_bounds(self.rows, self.slack, self.omitted, self.complete_rows, self.cut,
                           self.ranges, self.rolled_up)

    @property
    def identity(self) -> tuple[str, int, int, str, int, int]:
        """What a receiver deduplicates on: resending a window's partial changes nothing."""
        return (self.query, self.window[0], self.window[1], self.origin, self.partition,
                self.revision)


def summarised(batch: PartialBatch, summary: BoundedPartial | ItemsSketch,
               level: int) -> PartialBatch:
    """``batch`` carrying ``summary`` (what a degradation level made of its rows) instead."""
    if isinstance(summary, ItemsSketch):
        return dataclasses.replace(batch, rows=(), slack=None, omitted=0.0, cut=0.0,
                                   complete_rows=None, ranges=None,
                                   items=summary, level=level)
    truncated = summary.truncated  # an exact partial goes as plain rows
    return dataclasses.replace(
        batch, rows=summary.rows, slack=summary.slack if truncated else None,
        omitted=summary.omitted, cut=summary.cut if truncated else 0.0,
        complete_rows=summary.complete if truncated else None,
        ranges=summary.ranges if truncated else None, items=None, level=level,
        rolled_up=summary.rolled_up)
