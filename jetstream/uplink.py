"""A run's link to its parent in the aggregation tree: what a non-root site does with a window.

:class:`Uplink` owns the :class:`~jetstream.transport.PartialSender` to the parent (which, with
a cube store, keeps each batch until it is acked), the link's degradation policy and its
levels (:mod:`jetstream.approx`), and the progress reports that follow the batches. The run
(:class:`~jetstream.runtime.QueryRun`) hands it each merged window and its watermark; a
re-plan that moves the parent gives the run a new uplink, and the old one's unacked batches
go to the new one through the store.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jetstream import metrics
from jetstream.aggregator import MergedWindow
from jetstream.approx.levels import Ranking, degrade, levels_for
from jetstream.approx.policy import LinkPolicy
from jetstream.cubes import CubeStore
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError, DataError
from jetstream.operators import WindowAggregate
from jetstream.partials import PartialBatch, decode_batch, encode_batch, summarised
from jetstream.router import top_k_candidates
from jetstream.transport import PartialSender
from jetstream.v1 import dataplane_pb2 as pb

if TYPE_CHECKING:
    from jetstream.runtime import SiteOptions

__all__ = ["LinkLevel", "Uplink"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkLevel:
    """The degradation level of a site's link to its parent, for one query."""

    link: str  # "site -> parent"
    level: str
    pinned: bool  # held by an operator rather than chosen by the policy
    levels: tuple[str, ...]  # every level of the link, exact first


class Uplink:
    """The link from ``site`` to ``parent`` (at ``address``) for one query's run.

    ``sequence`` numbers the batches and progress reports (shared with the run, so that a new
    uplink after a re-plan goes on counting); ``store``, the site's cube store, keeps what is
    sent until it is acked. A replay's link has no policy: it stays exact; nor has a worker's
    link to its own site, which also counts no wide-area bytes. With ``top_k_only`` (a worker
    of the root's final step, one of key-disjoint partitions), an exact window goes up as the
    rows that can be in the final top-k: its ``k`` best by the ranking, in the final top-k's
    order, which hold every row of the global top-k that falls in this partition.
    """

    def __init__(self, site: str, parent: str, address: str, *, query: Query,
                 partial: WindowAggregate, ranking: Ranking | None, options: SiteOptions,
                 store: CubeStore | None, run_metrics: metrics.RunMetrics,
                 sequence: Iterator[int], top_k_only: bool = False) -> None:
        self.site, self.parent, self.name = site, parent, query.name
        self.partial, self.ranking, self.replay = partial, ranking, options.replay
        self.store, self.metrics, self._sequence = store, run_metrics, sequence
        self.metrics.link = metrics.link_name(site, parent)
        self._reported: tuple[int | None, bool] = (None, False)
        self.policy: LinkPolicy | None = None
        self._top_k = ranking if top_k_only else None
        self.local = options.worker  # to its own site: no policy, no compression
        self.revision_base = options.revision_base
        if not (options.replay or options.worker):
            # Replay compresses time, so its backlog says nothing about the link.
            plan = query.plan()
            window = plan.window_of(plan.partial_aggregates()[0])
            assert window is not None, "the DSL windows every aggregate"
            self.policy = LinkPolicy(levels_for(ranking), slo=query.slo,
                                     window_s=window.spec.every_ms / 1000,
                                     min_interval_s=options.level_interval_s)
        # Held by query, not by parent: a re-planned parent gets what the last one lacks.
        if store is not None:
            self._check_held(store)
        self.sender = PartialSender(address, on_ack=self._acked, on_round_trip=self._round_trip,
                                    store=store, destination=self.name,
                                    connect=options.connect, link=self.metrics.link,
                                    wide_area=not options.worker)
        self._link_metrics()

    def send(self, merged: MergedWindow) -> int:
        """Send a merged window at the link's level; the rows sent."""
        rows = merged.rows
        if self._top_k is not None and merged.slack is None:
            try:
                rows = top_k_candidates(rows, self.partial, self._top_k)
            except DataError:  # a ranking sum with a negative value: no cut, all rows go
                rows = merged.rows
        batch = self._degraded(PartialBatch(
            self.name, merged.window, self.site, rows, sequence=next(self._sequence),
            events=merged.events, error_bound=merged.error_bound, complete=merged.complete,
            covers=merged.covers, wan_bytes=merged.wan_bytes, closed_at_ms=merged.closed_at_ms,
            revision=merged.revision + self.revision_base, slack=merged.slack,
            omitted=merged.omitted,
            complete_rows=merged.complete_rows, warnings=self._warnings(merged)), merged)
        self.sender.send(encode_batch(batch, self.partial, compress=not self.local))
        return len(batch.rows)

    def report(self, watermark: int | None, finished: bool) -> None:
        """Say how far the run has got (after the batches it covers), when that changed."""
        report = (watermark, finished)
        if report != self._reported and watermark is not None:
            self.sender.send_progress(pb.Progress(
                query=self.name, origin=self.site, watermark_ms=watermark, ended=finished,
                sequence=next(self._sequence)))
            self._reported = report

    def close(self) -> None:
        """Stop sending; what is unacked stays in the store for the next uplink."""
        self.sender.close()

    def set_level(self, level: str) -> LinkLevel:
        """See :meth:`jetstream.runtime.QueryRun.set_level`."""
        link = f"{self.site} -> {self.parent}"
        if self.policy is None:
            msg = (f"{self.name} at {self.site} has no degradable link: a replay keeps "
                   "every link exact")
            raise ControlPlaneError(msg)
        if level:
            names = [lv.name for lv in self.policy.levels]
            chosen: int | None = None
            if level != "auto":
                chosen = int(level) if level.isdigit() else (
                    names.index(level) if level in names else None)
                if chosen is None or chosen >= len(names):
                    msg = (f"{self.name}: link {link} has no level {level!r}; its levels are "
                           f"{', '.join(f'{i} {n!r}' for i, n in enumerate(names))}, or 'auto'")
                    raise ControlPlaneError(msg)
            try:
                self.policy.pin(chosen)
            except DataError as e:
                raise ControlPlaneError(f"{self.name}: {e}") from None
            log.info("%s: link %s %s", self.name, link,
                     "back to the policy" if chosen is None else f"pinned at {level!r}")
            self._link_metrics()
        return LinkLevel(link, self.policy.level.name, self.policy.pinned,
                         tuple(lv.name for lv in self.policy.levels))

    def _degraded(self, batch: PartialBatch, merged: MergedWindow) -> PartialBatch:
        """The batch at the link's current level: truncated to its top keys, or a sketch of
        them, with bounds."""
        if self.policy is None or self.ranking is None:
            return batch
        level = self.policy.level
        return summarised(batch, degrade(merged.bounded, self.partial, self.ranking, level),
                          level.index)

    def _warnings(self, merged: MergedWindow) -> tuple[str, ...]:
        """The inputs' warnings, and this link's if it cannot keep the SLO."""
        violation = self.policy.violation if self.policy is not None else None
        if violation is None:
            return merged.warnings
        return tuple(sorted({*merged.warnings, f"link {self.site} -> {self.parent}: {violation}"}))

    def _check_held(self, store: CubeStore) -> None:
        """Release what the store holds unacked for this query if nobody will take it: a
        replay starts over from scratch, and the parent would refuse forever partials of an
        earlier query of this name that this one cannot read."""
        held = store.unacked(self.name)
        if not held:
            return
        if self.replay:
            store.release(self.name)
            return
        try:
            for batch in held:
                decode_batch(batch, self.partial)
        except DataError as e:
            log.warning("%s at %s: not sending again what an earlier query left: %s",
                        self.name, self.site, e)
            store.release(self.name)
            return
        log.info("%s at %s: sending %d unacknowledged partials again", self.name, self.site,
                 len(held))

    def _link_metrics(self) -> None:
        if self.policy is not None:
            self.metrics.link_state(self.policy.level.index, self.policy.throughput)

    def _acked(self, batch: pb.PartialBatch, seconds: float, backlog: int) -> None:
        if self.policy is None:
            return
        before = self.policy.level
        after = self.policy.observe(batch.ByteSize(), max(seconds, 1e-6), backlog,
                                    level=batch.level)
        self._link_metrics()
        if after != before:
            log.info("%s at %s: link to %s now at level %r (%s)", self.name, self.site,
                     self.parent, after.name,
                     self.policy.history[-1].reason if self.policy.history else "")

    def _round_trip(self, seconds: float) -> None:
        if self.policy is not None:
            self.policy.observe_round_trip(seconds)
