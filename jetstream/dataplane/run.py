"""One query's run at a site: its local stage, its merger, and its uplink or its results (see
:mod:`jetstream.dataplane.site`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from jetstream import metrics, trace
from jetstream.aggtree.planner import Fragment
from jetstream.approx.levels import ranking
from jetstream.approx.policy import LinkPolicy
from jetstream.dataplane.asks import ROUND_REVISIONS, AskBoard
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.cubes import INBOX, CubeStore
from jetstream.dataplane.finish import Publish, RootResults
from jetstream.dataplane.merger import WindowMerger
from jetstream.dataplane.options import DEFAULT_DEADLINE_S, Assignment, SiteOptions
from jetstream.dataplane.partials import ENDED, PartialBatch
from jetstream.dataplane.router import Router, own_rows
from jetstream.dataplane.transport import PartialSender
from jetstream.dataplane.uplink import LinkLevel, Uplink
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError, DataError
from jetstream.planwire import query_from_bytes
from jetstream.rewrite import distributed, partial_aggregate
from jetstream.stage.check import check_stage, local_inputs, source_of
from jetstream.stage.inputs import StageInput, source_folder

if TYPE_CHECKING:
    from jetstream.stage.inputs import Readers
    from jetstream.stage.job import StageStats

__all__ = ["QueryRun", "merge_inputs"]

log = logging.getLogger(__name__)


#: How often a run looks for windows that are ready.
TICK_S = 0.2
#: How long stopping a run waits for its local stage's stream to stop.
STOP_WAIT_S = 60.0
#: How much longer than twice its window deadline a child keeps a window's rows for the
#: parent's asks in TPUT's rounds (the parent's deadline may run a little later).
ROUNDS_MARGIN_S = 10.0
#: How often a run rolls up and expires what the cube store keeps of it.
CUBE_INTERVAL_S = 10.0
_FOREVER_MS = 2**62  # a window end no window reaches


class QueryRun:
    """One query's data plane at one site."""

    def __init__(self, site: str, assignment: Assignment, options: SiteOptions,
                 spark: Callable[[], Any], publish: Publish,
                 store: CubeStore | None = None,
                 on_failure: Callable[[], None] = lambda: None,
                 readers: Readers | None = None) -> None:
        fragment = assignment.fragment
        self._readers = readers
        #: Tells the controller of a failed stage now, before the stage's input ends.
        self.on_failure = on_failure
        self.site, self.assignment, self.options = site, assignment, options
        self.query = distributed(query_from_bytes(assignment.spec,
                                                   allow_code=options.allow_code))
        self.partial = partial_aggregate(self.query)
        self._planned = frozenset(merge_inputs(fragment, self.query))  # whose batches it takes
        slo_deadline = (self.query.slo.max_latency_ms / 1000
                        if self.query.slo and self.query.slo.max_latency_ms else None)
        self.ranking = ranking(self.query)
        # The root coordinates the rounds of the children whose links run TPUT.
        coordinates = fragment.final and not assignment.workers
        # Every run with a parent hands a window on as soon as its inputs have all sent it,
        # early if they did: a worker of the root's final merge too, so that at the close the
        # root hears a watermark rather than waits for the partition's merge.
        forward_early = not fragment.final or options.worker
        self.merger = WindowMerger(self.partial, self._inputs(assignment),
                                   deadline_s=options.deadline_s or slo_deadline
                                   or DEFAULT_DEADLINE_S,
                                   key_partitions=bool(assignment.workers),
                                   rounds=self.ranking if coordinates else None,
                                   recall=self._recall if store is not None
                                   and not options.replay and not assignment.workers
                                   else None, forward_early=forward_early)
        self.asks = AskBoard()  # what the merger asks of each child, until it takes it
        self._asked: set[str] = set()  # the children asked so far
        # A merge spread over workers: the inputs go to them, their partitions come back.
        self.router = None if not assignment.workers else Router(
            fragment.query, self.partial, [address for _, address in assignment.workers],
            connect=options.connect, retain_s=self.merger.retain_s,
            link=lambda i: metrics.link_name(site, self.assignment.workers[i][0]))
        self._known: dict[tuple[Any, ...], int] = {}  # key -> its partition, for own_rows
        self._store = store
        # A replay starts over from its input after a crash: it keeps no inbox.
        self._inbox = None if options.replay else store
        self.metrics = metrics.RunMetrics(site, fragment.query)
        self._sequence = itertools.count(1)  # the batches and reports this run sends
        self.results = RootResults(self.query, self.partial, self.ranking, self.metrics,
                                   publish)
        self.uplink: Uplink | None = None
        self._link(assignment)
        #: The local stages, one per chain of the query reading a source held here.
        self.stages = self._stage_inputs(fragment.sources) if fragment.sources else []
        if self._inbox is not None:
            self._merge_inbox(self._inbox)
        self._stop = threading.Event()
        self.failure: str | None = None
        threading.Thread(target=self._pump, name=f"merge-{fragment.query}", daemon=True).start()
        log.info("%s at %s: version %d merges %s%s; %s", self.name, site, assignment.version,
                 ", ".join(sorted(self.merger.inputs)) or "nothing",
                 " (its key partitions, on workers)" if assignment.workers else "",
                 f"sends to {fragment.parent}" if fragment.parent else "makes the results")
        for stage in self.stages:
            stage.start(spark)

    @property
    def name(self) -> str:
        return self.assignment.fragment.query

    @property
    def starting(self) -> bool:
        """Whether a local stage here has yet to start reading (Spark starts, or it warms up)."""
        return any(stage.starting for stage in self.stages)

    def _inputs(self, assignment: Assignment) -> set[str]:
        """What the merger merges: the fragment's children and local stage, or, when its
        partitions run on workers, what the workers send back."""
        if assignment.workers:
            return {name for name, _ in assignment.workers}
        return set(merge_inputs(assignment.fragment, self.query))

    def _link(self, assignment: Assignment, carried: Sequence[PartialBatch] = ()) -> None:
        """The uplink to the assignment's parent (none at the root); ``carried``: what the
        last uplink kept of what it sent the parent's workers (see ``Uplink.kept``)."""
        parent = assignment.fragment.parent
        self.metrics.link = ""
        self.uplink = None if not (parent and assignment.parent_address) else Uplink(
            self.site, parent, assignment.parent_address, query=self.query,
            partial=self.partial, ranking=self.ranking, options=self.options,
            store=self._store, run_metrics=self.metrics, sequence=self._sequence,
            top_k_only=self.options.worker and assignment.fragment.final,
            retain_s=self.merger.retain_s, carried=carried,
            received=self.options.received, rounds=assignment.fragment.rounds,
            keep_s=2 * self.merger.deadline_s + ROUNDS_MARGIN_S,
            link_bps=assignment.fragment.uplink_bps, start_level=assignment.fragment.level)

    @property
    def sender(self) -> PartialSender | None:
        return self.uplink.sender if self.uplink is not None else None

    @property
    def policy(self) -> LinkPolicy | None:
        return self.uplink.policy if self.uplink is not None else None

    @property
    def store(self) -> CubeStore | None:
        """The cube store that keeps what this run sends (none at the root)."""
        return self.uplink.store if self.uplink is not None else None

    def retarget(self, assignment: Assignment) -> bool:
        """Take a new version of this run's assignment (a re-plan) in place: new inputs, a new
        parent, while the local stage and the windows in flight go on. False if the query or
        this site's part in it changed: then the run must be replaced."""
        before = self.assignment
        if (assignment.spec != before.spec or assignment.fragment.query != self.name
                or bool(assignment.fragment.sources) != bool(before.fragment.sources)
                or [n for n, _ in assignment.workers] != [n for n, _ in before.workers]
                or assignment.fragment.part != before.fragment.part  # other keys: anew
                or assignment.fragment.rounds != before.fragment.rounds
                or assignment.fragment.final != before.fragment.final):  # the root moved
            return False
        self.assignment = assignment
        self._planned = frozenset(merge_inputs(assignment.fragment, self.query))
        self.merger.set_inputs(self._inputs(assignment))
        if self.router is not None:
            for i, ((_, address), (_, was)) in enumerate(zip(assignment.workers,
                                                             before.workers, strict=True)):
                if address != was:  # the partition's worker started again
                    self.router.move(i, address)
        if assignment.parent_address != before.parent_address:
            carried: list[PartialBatch] = []
            if self.uplink is not None:
                carried = self.uplink.kept()
                self.uplink.close()  # what it holds unacked, the store gives the next one
            self.metrics.remove_link()  # the old link's
            self._link(assignment, carried)
            if assignment.fragment.parent != before.fragment.parent:
                self.resend()
        log.info("%s at %s: now version %d (inputs %s, parent %s)", self.name, self.site,
                 assignment.version, ", ".join(sorted(self.merger.inputs)),
                 assignment.fragment.parent or "none")
        return True

    def resend(self) -> None:
        """After the root failed over (``resend_from_ms``), send a new parent again what this
        run sent of the windows since then: the dead root may have merged them without
        publishing, and the new root has not seen them (a repeat is dropped on the way)."""
        since = self.assignment.resend_from_ms
        if not since or self.uplink is None or self._store is None:
            return
        try:
            batches = [decode_batch(m, self.partial)
                       for m in self._store.messages(self.name, since, _FOREVER_MS)]
        except DataError as e:
            log.warning("%s at %s: cannot send again what it kept since the root moved: %s",
                        self.name, self.site, e)
            return
        if batches:
            log.info("%s at %s: sending %s again %d windows since the root moved",
                     self.name, self.site, self.assignment.fragment.parent,
                     len({b.window for b in batches}))
            self.uplink.resend(batches)

    # -- the local stages -------------------------------------------------------------------
    def _stage_inputs(self, sources: Sequence[str]) -> list[StageInput]:
        """A stage per chain of the query that reads a source held here (see
        :mod:`jetstream.stage.inputs`); each is an input of the merge."""
        named = local_inputs(self.site, check_stage(self.query), sources)
        alone = len({source_of(chain).name for _, chain in named}) == 1
        state = self.options.state_dir / self.site / self.name
        if self.options.replay:  # a fresh checkpoint: replay the whole folder every time
            state = state / f"v{self.assignment.version}-{time.time_ns()}"
        return [StageInput(name, self.query, chain,
                           source_folder(self.options.input_dir, source_of(chain).name, alone),
                           state if name == self.site else state / name[len(self.site) + 1:-1],
                           replay=self.options.replay, trigger_s=self.options.trigger_s,
                           warm_up_s=self.options.warm_up_s,
                           idle_s=self.options.idle_s, hand_on=self._local,
                           progress=self.progress, on_batch=self._stage_batch,
                           on_failure=self._stage_failed,
                           readers=None if self.options.replay else self._readers)
                for name, chain in named]

    def _stage_failed(self, message: str) -> None:
        """A stage is lost; the others go on without its records."""
        if self.failure is None:
            self.failure = message
        # The controller hears of it before the input ends here, so a finite run that then
        # finishes is not taken for a whole one.
        self.on_failure()

    def _stage_batch(self, origin: str, stats: StageStats, seconds: float) -> None:
        self.metrics.stage_batch(origin, stats.records_in, stats.late_records, stats.malformed,
                                 seconds)

    def _local(self, origin: str, window: tuple[int, int], rows: list[dict[str, Any]],
               events: int, revision: int, received_ms: int, early: bool,
               provisional: bool = False) -> None:
        if self._inbox is not None and self._inbox.has_sent(INBOX, self.name, window,
                                                            origin, revision):
            return  # a restarted stage hands on again what it had handed on before
        self.receive(PartialBatch(self.name, window, origin, tuple(rows), events=events,
                                  covers=frozenset({self.site}), revision=revision,
                                  closed_at_ms=received_ms, early=early,
                                  complete=not provisional))

    def receive(self, batch: PartialBatch) -> None:
        """Merge a batch: a child's (acked once this returns) or the local stage's. With a
        cube store it goes to the inbox first, durably, so that a restart merges it again
        (the child forgets it once acked; the stage's snapshot, once handed on). With
        workers, an input's batch goes to them, and a worker's merged partition is merged.
        A batch of no input in the plan raises LookupError (the sender tries again later)."""
        trace.mark("receive", query=self.name, site=self.site, origin=batch.origin,
                   end=batch.window[1], early=batch.early)
        if self._from_worker(batch.origin):
            self.merger.add(batch)
            return
        if self.router is not None and batch.origin.startswith(f"{self.site}/"):
            log.info("%s at %s: dropping a batch of %s, a worker it no longer runs on",
                     self.name, self.site, batch.origin)
            return  # a partition this run does not have (a replaced plan's): never an input
        if batch.origin not in self._planned:  # refused; sent again, for a re-plan under way
            msg = (f"{self.name} at {self.site}: {batch.origin!r} is not one of its inputs "
                   f"({', '.join(sorted(self._planned))})")
            raise LookupError(msg)
        # A worker merges its key partition only; raises DataError for a row cut wrongly.
        batch = own_rows(batch, self.partial.keys, self.assignment.fragment.part, self._known)
        if self._inbox is not None:
            self._inbox.receive(encode_batch(batch, self.partial))
        self._take(batch)

    def _take(self, batch: PartialBatch) -> None:
        if self.router is not None:
            self.router.send(batch)
        else:
            self.merger.add(batch)

    def _from_worker(self, origin: str) -> bool:
        return self.router is not None and origin in self.merger.inputs

    def progress(self, origin: str, watermark_ms: int, ended: bool = False,
                 received_ms: int = 0) -> None:
        """How far an input (or, with workers, a worker) has got, and when it received the
        records that moved it there (0: not known)."""
        trace.mark("progress", query=self.name, site=self.site, origin=origin,
                   watermark=watermark_ms)
        if self.router is not None and not self._from_worker(origin):
            self.router.progress(origin, watermark_ms, ended, received_ms)
        else:
            self.merger.progress(origin, watermark_ms, ended, received_ms)

    def _recall(self, window: tuple[int, int]) -> tuple[list[PartialBatch], int] | None:
        """A window the merger forgot, from the inbox: the newest batch of each input it
        merged, and the last revision this site sent it as (-1 at the root: the controller
        numbers what it publishes). None if the inbox holds none of it."""
        store = self._inbox
        if store is None:
            return None
        try:
            kept = [decode_batch(m, self.partial) for m in store.messages(
                self.name, *window, origins=sorted(self.merger.inputs))
                    if (m.window_start_ms, m.window_end_ms) == window]
            sent = store.messages(self.name, *window) if self.uplink is not None else []
        except DataError as e:
            log.warning("%s at %s: cannot recall window %s from the inbox: %s", self.name,
                        self.site, window, e)
            return None
        if not kept:
            return None
        log.info("%s at %s: window %s corrected after the merger forgot it, from the inbox",
                 self.name, self.site, window)
        # What the uplink sent, back to the merger's numbering (TPUT's answers go out at
        # ROUND_REVISIONS per revision).
        per = ROUND_REVISIONS if self.uplink is not None and self.uplink.answerer else 1
        last = max(((m.revision - self.options.revision_base) // per for m in sent
                    if (m.window_start_ms, m.window_end_ms) == window), default=-1)
        return kept, last

    def _merge_inbox(self, store: CubeStore) -> None:
        """After a restart: merge again what the inbox holds of the windows the merger may
        still emit or correct, except those this site has sent on already."""
        again = 0
        for message in store.received(self.name, int(self.merger.retain_s * 1000)):
            if message.origin not in self._planned:  # an earlier plan's input: not now
                continue
            window = (message.window_start_ms, message.window_end_ms)
            if self.store is not None and self.store.has_sent(self.name, self.name, window,
                                                              self.site):
                continue
            try:
                self._take(decode_batch(message, self.partial))
            except DataError as e:  # e.g. an earlier query of the same name left it
                log.warning("%s at %s: not merging again what the inbox holds: %s",
                            self.name, self.site, e)
                continue
            again += 1
        if again:
            log.info("%s at %s: merging again %d partials from the inbox", self.name,
                     self.site, again)

    # -- merging and forwarding ---------------------------------------------------------------
    def _pump(self) -> None:
        """Tick when a batch or a progress report comes in, and at least every TICK_S (a
        window's deadline, a link's level)."""
        tended = time.monotonic()
        event_ms: int | None = None  # how far the inputs have got
        while not self._stop.is_set():
            self.merger.changed.wait(TICK_S)
            self.merger.changed.clear()
            if self._stop.is_set():
                break
            try:
                self.tick()
            except Exception:  # keep merging what arrives; the next tick tries again
                log.exception("%s at %s: forwarding failed", self.name, self.site)
            watermark = self.merger.watermark
            if watermark is not None and watermark != ENDED:
                event_ms = watermark  # the cubes' "now": a replay of old logs keeps its last hour
            if (self._store is not None and event_ms is not None
                    and time.monotonic() - tended >= CUBE_INTERVAL_S):
                tended = time.monotonic()
                try:
                    self.tend_cubes(min(event_ms, time.time_ns() // 1_000_000))
                except DataError:  # history suffers, the data flows on
                    log.exception("%s at %s: rolling up the cubes failed", self.name, self.site)

    def tend_cubes(self, now_ms: int) -> None:
        """Roll up the finished windows of this site's own local stages (the site's history,
        :mod:`jetstream.dataplane.history`), and apply this query's retention, as of ``now_ms``
        (event time: how far the inputs have got, never past the wall clock)."""
        store = self._store
        if store is None:
            return
        if self._inbox is not None and self.stages:
            plan = self.query.plan()
            window = plan.window_of(plan.partial_aggregates()[0])
            assert window is not None, "the DSL windows every aggregate"
            store.roll_up(self.name, self.partial, window.spec, now_ms,
                          origins=[stage.name for stage in self.stages])
        store.expire(now_ms, query=self.name)

    def tick(self) -> None:
        """Send (or, at the root, finish) every ready window, then report progress."""
        # The watermark before the windows: every window it passes is among those ready()
        # hands out next. Read after, it could pass a window that became ready in between,
        # and the parent would take that window for one this site had nothing in.
        watermark, received_ms = self.merger.watermark, self.merger.received_ms
        merged = self.merger.ready()
        finished = self.merger.finished
        if not self._stop.is_set():  # a stopped run's gauges are gone
            self.metrics.watermark(watermark, ended=watermark == ENDED)
        if self.uplink is None:
            expected = self.assignment.expected or self.assignment.covers
            for m in merged:
                trace.mark("publish", query=self.name, site=self.site, end=m.window[1],
                           covers=len(m.covers), expected=len(expected))
            self.results.publish(merged, finished, expected)
            for child, window, ask in self.merger.asks():
                if child not in self._asked:  # once a child: the rounds are under way
                    self._asked.add(child)
                    log.info("%s at %s: asking %s for more of window %s in TPUT rounds",
                             self.name, self.site, child, window)
                self.merger.charge(window, self.asks.put(child, window, ask))
            return
        for m in merged:
            trace.mark("send", query=self.name, site=self.site, end=m.window[1])
            self.metrics.handed_on(self.uplink.send(m))
        self.uplink.report(watermark, finished, received_ms)

    def set_level(self, level: str) -> LinkLevel:
        """Hold the link to the parent at ``level`` (a name or an index), hand it back to the
        policy (``"auto"``), or, with ``""``, only say where it is.

        Raises
        ------
        ControlPlaneError
            If this site sends nowhere (the root), the run replays (its links stay exact), or
            there is no such level or the SLO's ``max_error`` does not allow it.
        """
        if self.uplink is None:
            msg = f"{self.name} at {self.site} has no degradable link: it is the root"
            raise ControlPlaneError(msg)
        return self.uplink.set_level(level)

    def stop(self) -> None:
        """Stop the run; its local stage's stream has stopped when this returns (or after
        STOP_WAIT_S, if Spark is still starting), so Spark may stop after it."""
        self._stop.set()
        self.merger.changed.set()
        self.asks.close()
        for stage in self.stages:
            stage.stop(STOP_WAIT_S)
        if self.uplink is not None:
            self.uplink.close()
        if self.router is not None:
            self.router.close()
        self.metrics.remove()


def merge_inputs(fragment: Fragment, query: Query) -> list[str]:
    """What a site's merge of ``query`` (the optimized query) takes in: its children in the
    tree, and its own local stages (:func:`~jetstream.stage.check.local_inputs`)."""
    own = local_inputs(fragment.site, check_stage(query), fragment.sources)
    return sorted({*fragment.children, *(name for name, _ in own)})
