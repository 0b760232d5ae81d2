"""A run's link to its parent in the aggregation tree: what a non-root site does with a window.

:class:`Uplink` owns the :class:`~jetstream.dataplane.transport.PartialSender` to the parent
(which, with a cube store, keeps each batch until it is acked), the link's degradation policy
and its levels (:mod:`jetstream.approx`), and the progress reports that follow the batches.
When the parent's merge runs on key-partitioned workers, it asks the parent where they are and
sends each its part through a :class:`~jetstream.dataplane.router.Router` instead (see that
module). The run (:class:`~jetstream.dataplane.run.QueryRun`) hands it each merged window and
its watermark; a re-plan that moves the parent gives the run a new uplink, and the old one's
unacked batches go to the new one through the store. On a link that runs TPUT's rounds
(``rounds``), it sends each window's top rows and answers what the parent asks for next
(:mod:`jetstream.dataplane.asks`) while the link is at its top rung; when its policy (or an
operator) steps it down, its windows go truncated or sketched like any link's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from jetstream import metrics
from jetstream.approx.levels import DegradationLevel, Ranking, heaviest, ladder
from jetstream.approx.policy import LinkPolicy
from jetstream.approx.profile import Profile
from jetstream.dataplane.asks import ROUND_REVISIONS, Answerer
from jetstream.dataplane.codec import ask_from_proto, decode_batch, encode_batch
from jetstream.dataplane.cubes import CubeStore
from jetstream.dataplane.merger import MergedWindow
from jetstream.dataplane.options import SiteOptions
from jetstream.dataplane.partials import PartialBatch, summarised
from jetstream.dataplane.router import Router, top_k_candidates
from jetstream.dataplane.transport import STREAM_DEADLINE_S, PartialSender
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError, DataError
from jetstream.operators import WindowAggregate
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as dataplane_rpc

__all__ = ["LinkLevel", "Uplink"]

log = logging.getLogger(__name__)

#: How often an uplink asks its parent where the parent's workers are.
ROUTES_POLL_S = 2.0
#: When the parent names its workers, what the uplink sent the parent itself in this many
#: seconds before goes to the workers again: a batch the parent had not passed on yet must
#: reach them before the progress the uplink now sends them directly.
RESEND_S = 60.0


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
    order, which hold every row of the global top-k that falls in this partition. With
    ``rounds``, each window's rows are kept ``keep_s`` for the parent's asks. ``link_bps``,
    the link's bandwidth in the plan, is where its sender starts (see
    jetstream.dataplane.transport); ``start_level``, the plan's level for a link too thin for
    exact partials, where its policy starts.
    """

    def __init__(self, site: str, parent: str, address: str, *, query: Query,
                 partial: WindowAggregate, ranking: Ranking | None, options: SiteOptions,
                 store: CubeStore | None, run_metrics: metrics.RunMetrics,
                 sequence: Iterator[int], top_k_only: bool = False,
                 retain_s: float = 600.0, carried: Sequence[PartialBatch] = (),
                 received: Callable[[], Mapping[str, int]] | None = None,
                 rounds: bool = False, keep_s: float = 120.0,
                 link_bps: float | None = None, start_level: int = 0) -> None:
        self.site, self.parent, self.name = site, parent, query.name
        self.partial, self.ranking, self.replay = partial, ranking, options.replay
        self.store, self.metrics, self._sequence = store, run_metrics, sequence
        self.metrics.link = metrics.link_name(site, parent)
        # The last progress reported: (watermark, finished, received_ms).
        self._reported: tuple[int | None, bool, int] = (None, False, 0)
        window = query.stream.window_op
        assert window is not None, "the DSL windows every aggregate"
        self._windows = window.spec
        self._measuring = threading.Lock()  # the policy hears one ack at a time
        self.policy: LinkPolicy | None = None
        self._top_k = ranking if top_k_only else None
        # The link's levels, and what each sends.
        self.ladder = ladder(ranking, partial, heaviest(query))
        self.local = options.worker  # to its own site: no policy, no compression
        self.revision_base = options.revision_base
        if not (options.replay or options.worker):
            # Replay compresses time, so its backlog says nothing about the link.
            # Windows set out early, this long before they close (jetstream.stage.bookkeeping).
            lead_s = (window.watermark_ms - window.early_after_ms) / 1000
            self.policy = LinkPolicy(self.ladder.levels, slo=query.slo,
                                     window_s=window.spec.every_ms / 1000, lead_s=lead_s,
                                     min_interval_s=options.level_interval_s,
                                     start=start_level)
        # What each level would send and lose, measured on this link's own windows.
        self.profile = Profile(self.ladder, partial, skip={0} if rounds and ranking else (),
                               min_interval_s=options.profile_interval_s) \
            if (self.policy is not None and options.profile
                and len(self.ladder.levels) > 1) else None
        if self.policy is not None and self.policy.level.index:
            log.info("%s at %s: link to %s starts at level %r, as planned (too thin for exact "
                     "partials within the SLO)", self.name, site, parent, self.policy.level.name)
        # Held by query, not by parent: a re-planned parent gets what the last one lacks.
        if store is not None:
            self._check_held(store)
        self.address, self._connect, self.retain_s = address, options.connect, retain_s
        self._link_bps = link_bps
        self.sender = PartialSender(
            address, on_ack=lambda b, seconds, backlog: self._acked(
                b.ByteSize(), seconds, backlog, b.level),
            on_round_trip=self._round_trip, store=store, destination=self.name,
            connect=options.connect, link=self.metrics.link, wide_area=not options.worker,
            link_bps=link_bps)
        # The parent's workers, once it names them (see jetstream.dataplane.router): sent to
        # directly.
        self.router: Router | None = None
        self._routes: list[tuple[str, str]] = []  # its workers as the parent named them
        # What went to the parent itself lately: sent again to its workers when it names them.
        self._via_parent: deque[tuple[float, PartialBatch]] = deque()
        # What the last uplink had sent the parent's workers: the parent started again (at a
        # new address) lost it with them, so its new workers get it again.
        self._carried = list(carried)
        self._received = received
        self._lock = threading.Lock()  # the router against the route watcher's changes
        self._routers_bytes = 0  # what routers replaced since sent
        self._closed = threading.Event()
        # The windows the profile measures, one at a time, on a thread of their own.
        self._to_measure: queue.Queue[tuple[PartialBatch, MergedWindow]] = queue.Queue(1)
        if self.profile is not None:
            threading.Thread(target=self._measuring_loop, daemon=True,
                             name=f"profile-{self.name}").start()
        # TPUT's rounds: the parent coordinates them itself, so its workers are never named.
        self.answerer = Answerer(partial, ranking, keep_s=keep_s) if rounds and ranking \
            else None
        self._asks_call: Any = None
        self._answered = False  # said in the log once
        if self.answerer is not None:
            threading.Thread(target=self._watch_asks, daemon=True,
                             name=f"asks-{self.name}").start()
        elif not options.worker:
            threading.Thread(target=self._watch_routes, daemon=True,
                             name=f"routes-{self.name}").start()
        self._link_metrics()

    @property
    def bytes_sent(self) -> int:
        """Bytes sent up the link, to the parent and to its workers (read without waiting)."""
        router = self.router
        return (self.sender.bytes_sent + self._routers_bytes
                + (router.bytes_sent if router is not None else 0))

    @property
    def rate_bps(self) -> float | None:
        """What the link carries, in bits/s, as its acks time it (None until one is)."""
        router = self.router
        return self.sender.rate_bps if router is None else router.rate_bps

    def send(self, merged: MergedWindow) -> int:
        """Send a merged window at the link's level; the rows sent."""
        self._check_in_flight()
        rows = merged.rows
        if self._top_k is not None and merged.slack is None:
            try:
                rows = top_k_candidates(rows, self.partial, self._top_k)
            except DataError:  # a ranking sum with a negative value: no cut, all rows go
                rows = merged.rows
        batch = PartialBatch(
            self.name, merged.window, self.site, rows, sequence=next(self._sequence),
            events=merged.events, error_bound=merged.error_bound, complete=merged.complete,
            covers=merged.covers, wan_bytes=merged.wan_bytes, closed_at_ms=merged.closed_at_ms,
            revision=merged.revision + self.revision_base, slack=merged.slack,
            omitted=merged.omitted, cut=merged.cut, ranges=merged.ranges,
            complete_rows=merged.complete_rows, warnings=self._warnings(merged),
            early=merged.early, rolled_up=merged.rolled_up)
        exact = batch
        if self.answerer is not None:  # its answers count revisions apart: so does all
            batch = dataclasses.replace(batch, revision=self.revision_base
                                        + merged.revision * ROUND_REVISIONS)
        if self.answerer is not None and merged.slack is None and self._in_rounds:
            # Exact here, the link at its top rung: its rows go as the parent asks for them.
            if merged.revision == 0:
                batch = self.answerer.first(batch)
            else:  # a correction (late records) goes whole
                self.answerer.forget(merged.window)
        else:
            batch = self._degraded(batch, merged)
        with self._lock:
            self._push(batch)
        if (self.profile is not None and merged.slack is None and not merged.rolled_up
                and merged.revision == 0 and self.profile.due()):  # (not a correction)
            with contextlib.suppress(queue.Full):  # still on the last one: skip this one
                self._to_measure.put_nowait((exact, merged))
        return len(batch.rows)

    def _measuring_loop(self) -> None:
        """Measure the windows ``send`` picked, off the way windows go: a window's levels
        cost a tenth of a second or more of CPU (seconds for tens of thousands of keys),
        which the micro-batch that handed it on would otherwise wait for."""
        while not self._closed.is_set():
            try:
                exact, merged = self._to_measure.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                self._measure(exact, merged)
            except Exception:  # the link goes on with the profile it has
                log.exception("%s at %s: measuring window %s's levels failed", self.name,
                              self.site, merged.window)

    def _measure(self, exact: PartialBatch, merged: MergedWindow) -> None:
        """Measure each level on this window, and have the policy plan by what the
        profile says."""
        assert self.profile is not None and self.policy is not None
        spent = self.profile.cpu_s
        if not self.profile.measure(merged.bounded, lambda summary, index: encode_batch(
                summarised(exact, summary, index), self.partial).ByteSize()):
            return
        self.metrics.profile(self.profile.cpu_s - spent, self.profile.figures())
        with self._measuring:
            before = self.policy.level
            after = self.policy.learn(self.profile.measured())
            self._link_metrics()
        self._said(before, after)

    def resend(self, batches: Sequence[PartialBatch]) -> None:
        """Send ``batches`` (sent before, to another parent) as they were."""
        with self._lock:
            for batch in batches:
                self._push(batch)

    def _push(self, batch: PartialBatch) -> None:
        """Send ``batch`` the current way: to the parent's workers, or to the parent,
        keeping it a while for its workers (under ``_lock``)."""
        if self.router is not None:
            self.router.send(batch)
            return
        self.sender.send(encode_batch(batch, self.partial, compress=not self.local))
        if not self.local:
            now = time.monotonic()
            self._via_parent.append((now, batch))
            while self._via_parent[0][0] < now - RESEND_S:
                self._via_parent.popleft()

    def _progress(self) -> None:
        """Tell the current way how far this site has got, as last reported (under
        ``_lock``)."""
        watermark, finished, received_ms = self._reported
        if watermark is None:
            return
        if self.router is not None:
            self.router.progress(self.site, watermark, finished, received_ms)
        else:
            self.sender.send_progress(pb.Progress(
                query=self.name, origin=self.site, watermark_ms=watermark, ended=finished,
                sequence=next(self._sequence),
                received_bytes=self._received() if self._received else None,
                received_ms=received_ms))

    def report(self, watermark: int | None, finished: bool, received_ms: int = 0) -> None:
        """Say how far the run has got (after the batches it covers) when that passes a
        window's end, or it finishes; ``received_ms``: when its inputs had the records that
        moved it there. Only a window's end matters to the parent: on a thin link, a report
        each micro-batch would queue ahead of the one that closes a window."""
        if watermark is None:
            return
        last, was_finished, _ = self._reported
        if last is None or finished != was_finished or (
                self._windows.last_end(watermark) != self._windows.last_end(last)):
            with self._lock:
                self._reported = (watermark, finished, received_ms)
                self._progress()

    def close(self) -> None:
        """Stop sending; what is unacked stays in the store for the next uplink."""
        self._closed.set()
        call = self._asks_call
        if call is not None:
            call.cancel()
        with self._lock:
            router, self.router = self.router, None
        if router is not None:
            router.close()
        self.sender.close()

    # -- TPUT's rounds -------------------------------------------------------------------------
    def _watch_asks(self) -> None:
        """Follow the parent's asks (``DataPlane.Rounds``) and answer each, reconnecting
        with backoff while the parent is away."""
        backoff = 0.2
        with (self._connect or grpc.insecure_channel)(self.address) as channel:
            stub = dataplane_rpc.DataPlaneStub(channel)
            while not self._closed.is_set():
                try:
                    call = self._asks_call = stub.Rounds(
                        pb.RoundsRequest(query=self.name, origin=self.site),
                        timeout=STREAM_DEADLINE_S)
                    if self._closed.is_set():
                        call.cancel()
                    for message in call:
                        self._answer(message)
                        backoff = 0.2
                except grpc.RpcError as e:
                    if self._closed.is_set():
                        return
                    log.debug("%s at %s: asks from %s: %s", self.name, self.site,
                              self.parent, e.code().name)
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _answer(self, message: pb.RoundAsk) -> None:
        assert self.answerer is not None
        try:
            window, ask = ask_from_proto(message)
        except DataError as e:
            log.warning("%s at %s: refusing an ask from %s: %s", self.name, self.site,
                        self.parent, e)
            return
        try:
            batch = self.answerer.answer(window, ask, next(self._sequence))
        except (DataError, TypeError, ValueError) as e:  # e.g. keys of the wrong shape
            log.warning("%s at %s: refusing an ask from %s about window %s: %s", self.name,
                        self.site, self.parent, window, e)
            return
        if batch is None:
            if not self.answerer.keeps(window):  # the window's deadline tells the parent
                log.info("%s at %s: asked about window %s, which it no longer keeps",
                         self.name, self.site, window)
            return  # (or nothing new: the last answer is on its way)
        if not self._answered:
            self._answered = True
            log.info("%s at %s: answering %s's TPUT rounds (first: window %s, %d rows)",
                     self.name, self.site, self.parent, window, len(batch.rows))
        with self._lock:
            self.sender.send(encode_batch(batch, self.partial))

    # -- the parent's workers ----------------------------------------------------------------
    def _watch_routes(self) -> None:
        """Ask the parent where its workers are, every ``ROUTES_POLL_S``, and follow."""
        with (self._connect or grpc.insecure_channel)(self.address) as channel:
            stub = dataplane_rpc.DataPlaneStub(channel)
            wait = 0.0  # the first answer comes before the first window, as a rule
            while not self._closed.wait(wait):
                wait = ROUTES_POLL_S
                try:
                    answer = stub.Routes(pb.RoutesRequest(query=self.name),
                                         timeout=ROUTES_POLL_S)
                except grpc.RpcError as e:
                    # Down, too old to say, or not running the query yet (a restart or a
                    # re-plan under way): the way stays as it was.
                    log.debug("%s at %s: asking %s for routes: %s", self.name, self.site,
                              self.parent, e.code().name)
                    continue
                if len(answer.epochs) != len(answer.workers):
                    continue
                try:
                    self._route(list(zip(answer.workers, answer.epochs, strict=True)))
                except Exception:  # the watcher goes on: the next answer may do
                    log.exception("%s at %s: following %s's workers failed", self.name,
                                  self.site, self.parent)

    def _route(self, routes: list[tuple[str, str]]) -> None:
        """Send to the workers of ``routes`` (address, epoch) from now on (to the parent
        itself if there are none)."""
        workers = [address for address, _ in routes]
        with self._lock:
            if self._closed.is_set():
                return
            router = self.router
            if router is not None and workers and len(workers) == router.count:
                for i, (route, was) in enumerate(zip(routes, self._routes, strict=True)):
                    if route != was:  # that worker started again: it gets what it lost
                        router.move(i, route[0])
                self._routes = routes
                return
            if router is None and not workers:
                self._carried = []  # a parent without workers: nothing of theirs to give
                return
            self.router = None if not workers else Router(
                self.name, self.partial, workers, connect=self._connect,
                retain_s=self.retain_s, link=lambda i: self.metrics.link, wide_area=True,
                on_ack=self._acked, on_round_trip=self._round_trip, store=self.store,
                destination=self.name, link_bps=self._link_bps)
            self._routes = routes
            # What the old way may not have delivered goes the new way too (the workers drop
            # what they have): the parent may not have passed a batch on to its workers yet
            # (or not even have it), and progress sent to them directly must not overtake it.
            if router is None:
                again = (self._carried + [batch for _, batch in self._via_parent]
                         + self._pending())
                self._via_parent.clear()
                self._carried = []
            else:
                again = router.unacked()
                self._routers_bytes += router.bytes_sent
            if again:
                log.info("%s at %s: sending %d batches again the new way", self.name,
                         self.site, len(again))
            for batch in again:
                self._push(batch)
            self._progress()  # the new way hears how far this site has got
        if router is not None:
            router.close()
        log.info("%s at %s: sending to %s", self.name, self.site,
                 f"{self.parent}'s {len(workers)} workers directly" if workers else self.parent)

    def kept(self) -> list[PartialBatch]:
        """What this uplink keeps of what it sent its parent's workers (the last
        ``retain_s``, and what they have not all acked), for the next uplink: if the parent
        started again at a new address, its workers lost it."""
        with self._lock:
            batches = list(self._carried)
            if self.router is not None:
                batches += self.router.kept()
        return list({(b.window, b.origin, b.revision, b.sequence): b for b in batches}.values())

    def _pending(self) -> list[PartialBatch]:
        """What the sender to the parent holds unacked (e.g. what the store gave it at the
        start), decoded; what does not decode stays with the parent's sender."""
        out = []
        for message in self.sender.pending():
            try:
                out.append(decode_batch(message, self.partial))
            except DataError as e:
                log.warning("%s at %s: not sending a held batch to the workers: %s",
                            self.name, self.site, e)
        return out

    @property
    def _in_rounds(self) -> bool:
        """Whether the link answers TPUT's rounds now: it has them, at its top rung."""
        return self.answerer is not None and (self.policy is None or self.policy.level.index == 0)

    def set_level(self, level: str) -> LinkLevel:
        """See :meth:`jetstream.dataplane.run.QueryRun.set_level`. On a link that runs TPUT's
        rounds, the exact level is the rounds; below it, its windows go truncated or
        sketched, and the parent does not ask."""
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
        """The batch at the link's current level: its distinct counts and quantiles as
        sketches, truncated to its top keys, or a sketch of them, with bounds."""
        if self.policy is None or self.policy.level.index == 0:
            return batch
        level = self.policy.level
        try:
            summary = self.ladder.degrade(merged.bounded, self.partial, level)
        except DataError as e:  # a negative value in a sum it truncates by: no bound holds
            log.warning("%s at %s: window %s goes exact, not at level %r: %s", self.name,
                        self.site, merged.window, level.name, e)
            return batch
        return summarised(batch, summary, level.index)

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

    def _acked(self, size: int, seconds: float | None, backlog: int, level: int) -> None:
        """A batch of ``size`` bytes sent at ``level`` was acked after ``seconds`` on the
        link (None: not known)."""
        if self.policy is None or seconds is None:
            return
        with self._measuring:  # the parent's sender and the router's both call this
            before = self.policy.level
            after = self.policy.observe(size, max(seconds, 1e-6), backlog, level=level)
            self._link_metrics()
        self._said(before, after)

    def _check_in_flight(self) -> None:
        """Before a window is encoded: tell the policy how long the link has been on the
        batch it carries now, so that a link that dropped is stepped down before its slow
        ack comes back (with a router, the workers' links are timed by their acks alone)."""
        if self.policy is None or self.router is not None:
            return
        flight = self.sender.in_flight()
        if flight is None:
            return
        with self._measuring:
            before = self.policy.level
            after = self.policy.observe_unacked(*flight)
            self._link_metrics()
        self._said(before, after)

    def _said(self, before: DegradationLevel, after: DegradationLevel) -> None:
        """Log a change of the link's level, and why."""
        if after != before and self.policy is not None:
            log.info("%s at %s: link to %s now at level %r (%s)", self.name, self.site,
                     self.parent, after.name,
                     self.policy.history[-1].reason if self.policy.history else "")

    def _round_trip(self, seconds: float) -> None:
        if self.policy is not None:
            with self._measuring:
                self.policy.observe_round_trip(seconds)
