"""A site's data plane: for each query deployed here, its local stage, merger and sender.

For every fragment a site runs, :class:`SiteRuntime` keeps one :class:`QueryRun`:

- the **local stage** (a Spark Structured Streaming job, :mod:`jetstream.stage.job`) when the
  site holds the query's source, reading the site's input folder;
- a **merger** (:class:`~jetstream.aggregator.WindowMerger`) whose inputs are the site's
  children in the aggregation tree and its own local stage;
- and then either an **uplink** to the parent (:class:`~jetstream.uplink.Uplink`: the sender,
  which with ``SiteOptions.cubes`` keeps what it sends in the site's cube store
  (:mod:`jetstream.cubes`) until acked, across restarts, and the link's degradation levels);
  or, at the root, the **results** (:class:`~jetstream.finish.RootResults`: the final step,
  the reference executor's own operators over the merged partials) published to the global
  controller. The run rolls up what the store keeps. With the cube store, what the merger
  takes in is kept in the store's inbox first (a child's batch before it is acked), and
  merged again by the run that follows a crash.

Progress flows with the data: an input that has closed every window up to its watermark says
so, an idle input (no records for ``idle_s``) closes its open windows and stops holding the
others back, and a finite input that has ended says that too, so the root knows when every
window is final.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import logging
import os
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from jetstream import metrics, trace
from jetstream.aggregator import ENDED, WindowMerger
from jetstream.aggtree.planner import Fragment
from jetstream.approx.levels import ranking
from jetstream.approx.policy import LinkPolicy
from jetstream.asks import ROUND_REVISIONS, AskBoard
from jetstream.cubes import DEFAULT_RETENTION, INBOX, CubeStore
from jetstream.dsl import Query, Stream
from jetstream.errors import ControlPlaneError, DataError, PlanError
from jetstream.finish import Publish, RootResults
from jetstream.operators import WindowAggregate
from jetstream.partials import PartialBatch, decode_batch, encode_batch
from jetstream.planwire import query_from_bytes
from jetstream.results import WindowResult
from jetstream.rewrite import distributed
from jetstream.router import Router, own_rows
from jetstream.stage.archive import ReadFiles
from jetstream.stage.check import check_stage, local_inputs, source_of
from jetstream.stage.gate import DEFAULT_HOLD_S
from jetstream.stage.inputs import StageInput, source_folder
from jetstream.stage.spark import session_builder
from jetstream.stage.warm import WARM_UP_S
from jetstream.transport import Connect, DataPlaneServicer, PartialSender
from jetstream.uplink import LinkLevel, Uplink
from jetstream.v1 import dataplane_pb2 as pb

if TYPE_CHECKING:
    from jetstream.stage.inputs import Readers
    from jetstream.stage.job import StageStats
    from jetstream.stage.reader import SourceReaders

__all__ = ["DEFAULT_DEADLINE_S", "DEFAULT_SPARK_CONF", "REPLAY_SPARK_CONF", "Assignment",
           "LinkState", "QueryRun", "SiteOptions", "SiteRuntime", "distributed", "merge_inputs",
           "partial_aggregate", "site_part"]

log = logging.getLogger(__name__)

#: How long a merger waits for a silent input before a window goes out incomplete, when
#: the query's SLO does not say (``max_latency``).
DEFAULT_DEADLINE_S = 10.0
#: How often a run looks for windows that are ready.
TICK_S = 0.2
#: How long stopping a run waits for its local stage's stream to stop.
STOP_WAIT_S = 60.0
#: How much longer than twice its window deadline a child keeps a window's rows for the
#: parent's asks in TPUT's rounds (the parent's deadline may run a little later).
ROUNDS_MARGIN_S = 10.0
#: How many times a site launches its Spark JVM before it gives up.
SPARK_START_ATTEMPTS = 3
#: How often a run rolls up and expires what the cube store keeps of it.
CUBE_INTERVAL_S = 10.0
_FOREVER_MS = 2**62  # a window end no window reaches


def _checkpoint_file_manager() -> dict[str, str]:
    """Spark's checkpoint file manager on Hadoop's FileSystem API, under the name the
    installed pyspark has it (its package moved in Spark 4.1); none if it has neither."""
    spec = importlib.util.find_spec("pyspark")
    jars = Path(spec.origin).parent / "jars" if spec and spec.origin else None
    for jar in sorted(jars.glob("spark-sql_*.jar")) if jars else ():
        with contextlib.suppress(OSError, zipfile.BadZipFile), zipfile.ZipFile(jar) as z:
            names = set(z.namelist())
            for package in ("checkpointing.", ""):
                name = ("org.apache.spark.sql.execution.streaming."
                        f"{package}FileSystemBasedCheckpointFileManager")
                if f"{name.replace('.', '/')}.class" in names:
                    return {"spark.sql.streaming.checkpointFileManagerClass": name}
    return {}


# A heap that starts small (the JVM's default start is 1/64 of the machine's memory) and
# gives back what it frees (the serial collector), a smaller code cache: the demo's three
# JVMs peaked at 3.0 GB with Spark's defaults, 1.9 GB with these (scripts/demo_memory.py,
# docs/benchmarks.md). (Not smaller thread stacks: -Xss512k overflowed in java.util.regex on
# URLs.)
_JVM = ("-Xms32m -XX:+UseSerialGC -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30 "
        "-XX:ReservedCodeCacheSize=48m")
# A live site's JVM compiles with C1 only: a micro-batch calls thousands of Spark's planning
# methods a few times each, and the optimising compiler (C2) kept compiling them for minutes,
# on cores the other sites share. With C1 only, at 3,000 records/s a site, ours and the
# plain-Spark baseline each spent a sixth less CPU and answered sooner (docs/benchmarks.md,
# "C1 for live sites").
_LIVE_JIT = "-XX:TieredStopAtLevel=1"
# A replay reads a whole input in large batches, whose per-row loops C2 compiles to run about
# twice as fast as C1's code; it takes a method only after far more calls than by default
# (100,000 rather than 5,000; or 12,000 with 120,000 calls and loop iterations together),
# so that the long tail of planning methods stays with C1 ("Eleventh run").
_REPLAY_JIT = ("-XX:Tier4InvocationThreshold=100000 -XX:Tier4MinInvocationThreshold=12000 "
               "-XX:Tier4CompileThreshold=120000")

#: A site's Spark settings where neither its topology (``spark_conf``) nor ``jetstream site
#: --spark-conf`` says otherwise; values are strings, as Spark reads them.
DEFAULT_SPARK_CONF: Mapping[str, str] = MappingProxyType({
    "spark.ui.enabled": "false",  # no web UI: several site JVMs share one machine's ports
    "spark.ui.showConsoleProgress": "false",  # no progress bars in the site's log
    "spark.ui.retainedJobs": "50",  # a stage runs for days: keep few past jobs, not 1,000
    "spark.ui.retainedStages": "50",  # likewise for stages
    "spark.sql.ui.retainedExecutions": "20",  # likewise for SQL executions
    "spark.sql.streaming.numRecentProgressUpdates": "20",  # likewise for batch progress
    # About the cores of a small site: 1 or 2, under local[1] or local[2], measured within
    # noise of each other on 3,000-record micro-batches (docs/benchmarks.md).
    "spark.sql.shuffle.partitions": "2",
    # The whole local stage lives in the driver's JVM; 512m is the least Spark starts with.
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": f"{_JVM} {_LIVE_JIT}",
    "spark.sql.adaptive.enabled": "false",  # micro-batches are tiny; AQE re-plans each one
    # The offset, commit and source logs written through Hadoop's FileSystem rather than its
    # FileContext, whose local rename runs `readlink` in a child process for every file
    # (pyspark ships no native Hadoop library): a live micro-batch's writes of its offset and
    # commit logs took about 70 ms, now about 20 ms (docs/benchmarks.md).
    **_checkpoint_file_manager(),
    # Local files without Hadoop's checksum files: without a native Hadoop library, every file
    # Hadoop creates on the local file system has its mode set by a `chmod` child process
    # (about 5 ms), the checksum file its own. A micro-batch writes three checkpoint files;
    # this takes three `chmod`s off each, about 15 ms (scripts/bench_live_batch.py).
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    # The file source's log keeps an entry for every file a stream ever read (about 150
    # bytes; Spark never drops one) and, every this many micro-batches, writes them all
    # into one file again (Spark's default is 10): after a day at two files a second, 26 MB
    # every ten batches. Every 1,000 batches, a batch's share of the rewriting is a
    # hundredth of that, and a restart reads at most a thousand small files after the last.
    "spark.sql.streaming.fileSource.log.compactInterval": "1000",
})
#: A replaying site's (``SiteOptions.replay``): ``DEFAULT_SPARK_CONF`` with the JVM's
#: compiler set for large batches.
REPLAY_SPARK_CONF: Mapping[str, str] = MappingProxyType(
    {**DEFAULT_SPARK_CONF, "spark.driver.extraJavaOptions": f"{_JVM} {_REPLAY_JIT}"})



@dataclass(frozen=True)
class Assignment:
    """What a site is told to run for one query: its fragment and where things go."""

    fragment: Fragment
    spec: bytes  # the query's plan (a serialized jetstream.v1.QueryPlan)
    version: int = 0
    parent_address: str = ""  # the parent site's gRPC address; empty at the root
    covers: tuple[str, ...] = ()  # the source sites whose records reach the root through here
    expected: tuple[str, ...] = ()  # every source site of the query, alive or not
    #: The workers that merge the fragment's key partitions, in partition order: (the name
    #: their merged windows come back under, address). Set by the site controller when it
    #: runs them (:mod:`jetstream.control.workers`); empty, this process merges everything.
    workers: tuple[tuple[str, str], ...] = ()
    #: After the root failed over: the windows starting at or after this (epoch ms) are sent
    #: to the parent again, and merged again at the root, from the cube store (0: none).
    resend_from_ms: int = 0


@dataclass
class SiteOptions:
    """How a site runs its data plane (``jetstream site`` flags)."""

    input_dir: Path | None = None  # the folder log shippers drop this site's CSV files into
    state_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "jetstream")
    replay: bool = False  # process what the input holds now, then end
    deadline_s: float | None = None  # overrides the SLO's max_latency for window deadlines
    idle_s: float = 5.0  # an input without records this long is idle
    trigger_s: float = 0.25  # micro-batch interval of a live local stage
    #: A new file waits up to this long to share a micro-batch with the next, unless its
    #: records may hand a window on (:mod:`jetstream.stage.gate`); 0: it never waits.
    batch_hold_s: float = DEFAULT_HOLD_S
    #: What becomes of a live input's file once every query here has read it: archived
    #: (kept a while), deleted or kept in place (:mod:`jetstream.stage.archive`).
    read_files: ReadFiles = field(default_factory=ReadFiles)
    #: Before a live stage's stream starts, warm its JVM up on made-up records for at most
    #: this long (:mod:`jetstream.stage.warm`); 0: not at all.
    warm_up_s: float = WARM_UP_S
    level_interval_s: float = 5.0  # a link's degradation level changes at most this often
    #: The local stage's Spark master; None: what the controller says (the topology's).
    #: Given up front, Spark starts before anything else (see ``SiteRuntime.session``).
    spark_master: str | None = None
    #: Spark settings over ``DEFAULT_SPARK_CONF``: ``jetstream site --spark-conf`` over the
    #: topology's ``spark_conf`` for the site. Read once, when Spark starts.
    spark_conf: dict[str, str] = field(default_factory=dict)
    #: Keep the partials the site sends in a cube store, ``state_dir/<site>/cubes.sqlite``:
    #: what the parent has not acked is sent again after a restart, and finished windows roll
    #: up for history. Off, they live in memory only (and two sites never share a file).
    cubes: bool = False
    #: Resolution (ms) -> seconds its windows are kept; see :class:`~jetstream.cubes.CubeStore`.
    retention: Mapping[int, float] = field(default_factory=lambda: dict(DEFAULT_RETENTION))
    #: Whether children may send to this site's workers directly (``DataPlane.Routes``):
    #: not when peers reach the site through an address of another machine (``--advertise``:
    #: a NAT or proxy), which its workers do not have.
    offer_routes: bool = True
    #: A worker's wide-area bytes received so far, per link (its data plane's count): its
    #: progress reports carry them to its site, which counts them in its metrics.
    received: Callable[[], Mapping[str, int]] | None = None
    #: How the site dials its parent's data plane: ``jetstream site`` sets its
    #: ``Security.channel`` (mutual TLS, token); None, plaintext, is for in-process tests.
    connect: Connect | None = None
    #: This data plane is a worker of a site (``jetstream worker``): its parent is its own
    #: site's process, so its links are local hops, never degraded or counted as wide-area.
    worker: bool = False
    #: Added to every revision this data plane sends: a worker started again (its windows
    #: rebuilt from what its site sends it again) must replace what it sent before, so each
    #: start counts from a higher base (``jetstream worker --epoch``).
    revision_base: int = 0


@dataclass(frozen=True)
class LinkState:
    """What a query's sender knows of the site's link to its parent (see
    :meth:`SiteRuntime.links`)."""

    parent: str
    level: str
    level_index: int  # 0 exact, higher coarser
    pinned: bool  # held by an operator rather than chosen by the policy
    sent_bytes: int  # sent for the query, resends included
    throughput: float | None  # bytes/s, the policy's recent throughput (None: none lately)
    rate_bps: float | None = None  # what the link carries, as its acks time it (None: unknown)

    @property
    def saturated(self) -> bool:
        """The policy stepped down on its own: the link could not carry the query's exact
        windows in time, so what it measures is what the link can carry."""
        return self.level_index > 0 and not self.pinned and self.throughput is not None


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
        self.query = distributed(query_from_bytes(assignment.spec, allow_code=True))
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
            link_bps=assignment.fragment.uplink_bps)

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
               events: int, revision: int, received_ms: int, early: bool) -> None:
        if self._inbox is not None and self._inbox.has_sent(INBOX, self.name, window,
                                                            origin, revision):
            return  # a restarted stage hands on again what it had handed on before
        self.receive(PartialBatch(self.name, window, origin, tuple(rows), events=events,
                                  covers=frozenset({self.site}), revision=revision,
                                  closed_at_ms=received_ms, early=early))

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
        :mod:`jetstream.history`), and apply this query's retention, as of ``now_ms`` (event
        time: how far the inputs have got, never past the wall clock)."""
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


class SiteRuntime:
    """Every query's data plane at one site, and the site's DataPlane servicer."""

    def __init__(self, site: str, options: SiteOptions, publish: Publish) -> None:
        self.site, self.options, self.publish = site, options, publish
        #: Reports the runs' failures (:meth:`failures`) to the controller now; the site's
        #: daemon sets it to a heartbeat sent at once.
        self.on_failure: Callable[[], None] = lambda: None
        # Three locks, so that nothing a heartbeat or the data plane needs waits for Spark:
        # _lock guards only the dict of runs (held for a lookup, never across a call);
        # _changing puts deploys and stops in order (a stop may wait for Spark to stop a
        # stream, and a run that replaces another must not start on the same checkpoint
        # before); _spark_lock is held while the JVM starts (10-40 s).
        self._lock = threading.Lock()
        self._changing = threading.Lock()
        self._spark_lock = threading.Lock()
        self._runs: dict[str, QueryRun] = {}
        self._spark: Any = None
        self._readers: Any = None  # the site's SourceReaders, made with the first reader
        self._cubes: CubeStore | None = None
        # A worker ("site/server") names the links it receives over by its site.
        self.servicer = DataPlaneServicer(self._aggregate_of, self._deliver, self._progress,
                                          site=site.partition("/")[0], routes=self._routes,
                                          rounds=self._rounds)

    def deploy(self, assignment: Assignment) -> None:
        """Start a query's run here; a new version of a running one is taken in place when
        it can be (see :meth:`QueryRun.retarget`), else it replaces the old run.

        Raises
        ------
        ControlPlaneError
            If the fragment has a parent but no address for it: it would act as the root and
            publish partial windows as results. The global controller deploys a fragment
            only once its parent's address is known; this check is the site guarding itself
            against any controller that does not.
        """
        fragment = assignment.fragment
        if fragment.parent and not assignment.parent_address:
            msg = (f"{fragment.query} at {self.site}: no address for its parent "
                   f"{fragment.parent}")
            raise ControlPlaneError(msg)
        name = fragment.query
        with self._changing:
            old = self.run(name)
            if old is not None:
                if old.assignment == assignment or old.retarget(assignment):
                    return
                # Until the new run is in, the data plane answers NOT_FOUND for the query
                # and senders send again: better than waiting for the old stream to stop.
                with self._lock:
                    del self._runs[name]
                old.stop()
            run = QueryRun(self.site, assignment, self.options, self.session, self._published,
                           self._store(), on_failure=lambda: self.on_failure(),
                           readers=self.readers)
            if old is not None and old.assignment.fragment.parent != fragment.parent:
                run.resend()
            with self._lock:
                self._runs[name] = run

    def cube_store(self) -> CubeStore | None:
        """The site's cube store (``SiteOptions.cubes``), opened if need be; None without."""
        if self._cubes is not None:
            return self._cubes
        with self._changing:  # as a deploy opens it
            return self._store()

    def _store(self) -> CubeStore | None:
        """The site's cube store, opened when the first run needs it (with ``cubes``)."""
        if self.options.cubes and self._cubes is None:
            self._cubes = CubeStore(self.options.state_dir / self.site / "cubes.sqlite",
                                    retention=self.options.retention)
        return self._cubes

    def _published(self, query: str, results: list[WindowResult], finished: bool) -> None:
        self.publish(query, results, finished)

    def stop(self, query: str) -> None:
        with self._changing:  # a deploy of the query waits until its old stream has stopped
            with self._lock:
                run = self._runs.pop(query, None)
            if run is not None:
                run.stop()

    def readers(self) -> SourceReaders:
        """The site's readers, one per folder, which every live local stage reading that
        folder attaches to (:mod:`jetstream.stage.reader`)."""
        from jetstream.stage.reader import SourceReaders  # Spark loads only where a stage runs

        with self._lock:
            if self._readers is None:
                self._readers = SourceReaders(self.options.state_dir / self.site / "readers",
                                              self.options.trigger_s,
                                              self.options.batch_hold_s,
                                              self.options.read_files)
            readers: SourceReaders = self._readers
        return readers

    def close(self) -> None:
        for query in list(self._runs):
            self.stop(query)
        if self._readers is not None:
            self._readers.stop()
        if self._cubes is not None:
            self._cubes.close()
        if self._spark is not None:
            self._spark.stop()

    def set_level(self, query: str, level: str) -> LinkLevel:
        """See :meth:`QueryRun.set_level`; also refuses a query that does not run here."""
        run = self.run(query)
        if run is None:
            msg = f"{query} does not run at {self.site}"
            raise ControlPlaneError(msg)
        return run.set_level(level)

    def run(self, query: str) -> QueryRun | None:
        with self._lock:
            return self._runs.get(query)

    def starting(self) -> set[str]:
        """The queries with a local stage here that does not read yet (Spark starts, or the
        stage warms up)."""
        with self._lock:
            runs = list(self._runs.values())
        return {run.name for run in runs if run.starting}

    def failures(self) -> dict[str, str]:
        """The queries whose local stage failed here, and why."""
        with self._lock:
            runs = list(self._runs.values())
        return {run.name: run.failure for run in runs if run.failure}

    def links(self) -> dict[str, LinkState]:
        """Each running query's link to its parent (none at the root)."""
        with self._lock:
            runs = list(self._runs.values())
        return {run.name: LinkState(
            run.assignment.fragment.parent or "",
            run.policy.level.name if run.policy else "exact",
            run.policy.level.index if run.policy else 0,
            bool(run.policy and run.policy.pinned), run.uplink.bytes_sent,
            run.policy.recent_throughput if run.policy else None, run.uplink.rate_bps)
            for run in runs if run.uplink is not None}

    def session(self) -> Any:
        """The site's one SparkSession, started when the first local stage needs it (or by
        :meth:`warm_up`), with ``DEFAULT_SPARK_CONF`` (``REPLAY_SPARK_CONF`` for a replay) under
        ``SiteOptions.spark_conf``.

        Starting it forks the JVM; a process whose gRPC threads are busy can fork badly
        (gRPC skips its fork handlers then), so a site that knows its master starts Spark
        before it starts gRPC. Only the threads that need Spark wait while it starts: the
        runs, heartbeats and deploys take other locks.
        """
        with self._spark_lock:
            if self._spark is None:
                master = self.options.spark_master or "local[1]"
                base = REPLAY_SPARK_CONF if self.options.replay else DEFAULT_SPARK_CONF
                conf = {**base, **self.options.spark_conf}
                log.info("site %s: starting Spark (%s)", self.site, master)
                # The JVM inherits this: glibc's default of an arena per thread makes a JVM
                # of a hundred threads hold hundreds of MB it does not use.
                os.environ.setdefault("MALLOC_ARENA_MAX", "2")
                # Python UDFs (a query's map) run in workers of this very Python, which has
                # jetstream and the packages the site has.
                os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
                builder = session_builder(master, f"jetstream-{self.site}", conf)
                self._spark = _started(builder, self.site)
                self._spark.sparkContext.setLogLevel("ERROR")
            return self._spark

    def warm_up(self) -> None:
        """Start Spark on a thread of its own, so that the JVM is up when the first local
        stage needs it; a failure is logged, and the stage that needs Spark tries again."""
        def start() -> None:
            try:
                self.session()
            except Exception:
                log.exception("site %s: starting Spark ahead of the first stage failed",
                              self.site)

        threading.Thread(target=start, name="spark-warm-up", daemon=True).start()

    # -- the DataPlane servicer's callbacks -----------------------------------------------------
    def _aggregate_of(self, query: str) -> WindowAggregate | None:
        run = self.run(query)
        return run.partial if run is not None else None

    def _deliver(self, batch: PartialBatch) -> None:
        run = self.run(batch.query)
        if run is None:  # stopped, or being replaced, since the servicer looked it up
            msg = f"no query named {batch.query!r} runs here"
            raise LookupError(msg)
        run.receive(batch)

    def _routes(self, query: str) -> list[tuple[str, str]]:
        """Where senders send ``query``'s inputs directly: its workers (address, epoch), if
        it has any and peers can reach them (``SiteOptions.offer_routes``)."""
        run = self.run(query)
        if run is None or run.router is None or not self.options.offer_routes:
            return []
        return run.router.routes()

    def _rounds(self, query: str, child: str, active: Callable[[], bool]
                ) -> Iterator[pb.RoundAsk]:
        """What the query's run here asks ``child`` in TPUT's rounds, as it asks it."""
        run = self.run(query)
        return iter(()) if run is None else run.asks.follow(child, active)

    def _progress(self, report: pb.Progress) -> None:
        run = self.run(report.query)
        if run is not None:
            run.progress(report.origin, report.watermark_ms, report.ended, report.received_ms)


def _started(builder: Any, site: str) -> Any:
    """The builder's session, its JVM launched again if the launch fails: a JVM forked while
    gRPC's threads run can exit before it reports its port (``JAVA_GATEWAY_EXITED``, seen
    once in a bench run), and a site that gives up on Spark reads nothing."""
    for attempt in range(1, SPARK_START_ATTEMPTS + 1):
        try:
            return builder.getOrCreate()
        except Exception as e:
            if attempt == SPARK_START_ATTEMPTS:
                raise
            log.warning("site %s: Spark's JVM did not start (%s): launching it again (%d "
                        "of %d)", site, str(e).strip().splitlines()[0][:300], attempt + 1,
                        SPARK_START_ATTEMPTS)
            time.sleep(attempt)
    raise AssertionError("unreachable")


def partial_aggregate(query: Query) -> WindowAggregate:
    """The partial aggregate of an optimized query: what sites send each other."""
    plan = query.plan()
    partials = plan.partial_aggregates()
    if not partials:
        msg = (f"query {query.name}: only windowed aggregates run across sites; add "
               ".window(...).group_by(...).agg(...) or run it with `jetstream local`")
        raise PlanError(msg)
    op = plan.op(partials[0])  # a source read twice has one partial per branch, all alike
    assert isinstance(op, WindowAggregate)
    return op


def merge_inputs(fragment: Fragment, query: Query) -> list[str]:
    """What a site's merge of ``query`` (the optimized query) takes in: its children in the
    tree, and its own local stages (:func:`~jetstream.stage.check.local_inputs`)."""
    own = local_inputs(fragment.site, check_stage(query), fragment.sources)
    return sorted({*fragment.children, *(name for name, _ in own)})


def site_part(query: Query) -> tuple[Query, WindowAggregate]:
    """What each site computes of an optimized query: the query up to its partial aggregate
    (its results are the partial rows a site sends), and that aggregate."""
    partial = partial_aggregate(query)
    plan = query.plan()
    site = Query(f"{query.name}/site", Stream(plan.up_to(plan.partial_aggregates()[0])))
    return site, partial
