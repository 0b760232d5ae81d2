"""The aggregator: merges the partial batches a site's children send, window by window.

A window is ready when every expected child has reported it, or when its deadline passes
(then it goes out marked incomplete, naming the children it lacks). A child's batch that
arrives after its window went out is merged in, and the window goes out again as a
correction: the receivers (the parent's aggregator, or the root's results) replace what they
had. Merging uses each aggregate's own ``merge`` on fresh accumulators, so nothing a child
sent is changed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jetstream.operators import WindowAggregate
from jetstream.partials import PartialBatch

__all__ = ["MergedWindow", "WindowMerger"]

Window = tuple[int, int]


@dataclass(frozen=True)
class MergedWindow:
    window: Window
    rows: tuple[dict[str, Any], ...]
    origins: frozenset[str]
    missing: frozenset[str]
    events: int
    error_bound: float
    correction: bool = False  # this window went out before; this replaces it

    @property
    def complete(self) -> bool:
        return not self.missing


@dataclass
class _Pending:
    first_seen: float
    batches: dict[str, PartialBatch] = field(default_factory=dict)  # origin -> batch
    sent_origins: int = 0  # how many origins the window last went out with; 0: not yet


class WindowMerger:
    """Partial batches of one query from a known set of children, merged per window."""

    def __init__(self, aggregate: WindowAggregate, children: Iterable[str], *,
                 deadline_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.aggregate = aggregate
        self.children = frozenset(children)
        self.deadline_s = deadline_s
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[Window, _Pending] = {}

    def add(self, batch: PartialBatch) -> None:
        """Keep a child's batch; the first batch of an (origin, window) wins."""
        with self._lock:
            pending = self._windows.setdefault(batch.window, _Pending(self._clock()))
            pending.batches.setdefault(batch.origin, batch)

    def ready(self) -> list[MergedWindow]:
        """Every window that can go out now: complete, past its deadline, or corrected."""
        now = self._clock()
        out = []
        with self._lock:
            for window, pending in sorted(self._windows.items()):
                sent = pending.sent_origins > 0
                everyone = self.children <= pending.batches.keys()
                due = now - pending.first_seen >= self.deadline_s
                if (sent and len(pending.batches) > pending.sent_origins) or (
                        not sent and (everyone or due)):
                    out.append(self._merge(window, pending, correction=sent))
        return out

    def _merge(self, window: Window, pending: _Pending, correction: bool) -> MergedWindow:
        aggregates = self.aggregate.aggregates
        groups: dict[tuple[Any, ...], dict[str, Any]] = {}
        for batch in pending.batches.values():
            for row in batch.rows:
                key = tuple(row[k] for k in self.aggregate.keys)
                merged = groups.get(key)
                if merged is None:
                    merged = groups[key] = {k: row[k] for k in self.aggregate.keys} | {
                        name: agg.create() for name, agg in aggregates}
                for name, agg in aggregates:
                    merged[name] = agg.merge(merged[name], row[name])
        pending.sent_origins = len(pending.batches)
        batches = pending.batches.values()
        return MergedWindow(window, tuple(groups.values()), frozenset(pending.batches),
                            self.children - pending.batches.keys(),
                            sum(b.events for b in batches),
                            max((b.error_bound for b in batches), default=0.0), correction)
