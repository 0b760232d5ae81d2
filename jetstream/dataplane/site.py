"""A site's data plane: for each query deployed here, its local stage, merger and sender.

For every fragment a site runs, :class:`SiteRuntime` keeps one :class:`QueryRun`:

- the **local stage** (a Spark Structured Streaming job, :mod:`jetstream.stage.job`) when the
  site holds the query's source, reading the site's input folder;
- a **merger** (:class:`~jetstream.dataplane.merger.WindowMerger`) whose inputs are the site's
  children in the aggregation tree and its own local stage;
- and then either an **uplink** to the parent (:class:`~jetstream.dataplane.uplink.Uplink`:
  the sender, which with ``SiteOptions.cubes`` keeps what it sends in the site's cube store
  (:mod:`jetstream.dataplane.cubes`) until acked, across restarts, and the link's degradation
  levels); or, at the root, the **results** (:class:`~jetstream.dataplane.finish.RootResults`:
  the final step, the reference executor's own operators over the merged partials) published
  to the global controller. The run rolls up what the store keeps. With the cube store, what
  the merger takes in is kept in the store's inbox first (a child's batch before it is acked),
  and merged again by the run that follows a crash.

Progress flows with the data: an input that has closed every window up to its watermark says
so, an idle input (no records for ``idle_s``) closes its open windows and stops holding the
others back, and a finite input that has ended says that too, so the root knows when every
window is final.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from jetstream.dataplane.cubes import CubeStore
from jetstream.dataplane.finish import Publish
from jetstream.dataplane.options import Assignment, LinkState, SiteOptions
from jetstream.dataplane.partials import PartialBatch
from jetstream.dataplane.run import QueryRun
from jetstream.dataplane.servicer import DataPlaneServicer
from jetstream.dataplane.uplink import LinkLevel
from jetstream.errors import ControlPlaneError
from jetstream.operators import WindowAggregate
from jetstream.results import WindowResult
from jetstream.stage.spark import (
    DEFAULT_SPARK_CONF,
    REPLAY_SPARK_CONF,
    session_builder,
    started,
    stop_quietly,
)
from jetstream.v1 import dataplane_pb2 as pb

if TYPE_CHECKING:
    from jetstream.stage.reader import SourceReaders

__all__ = ["SiteRuntime"]

log = logging.getLogger(__name__)


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
            if old is None:  # a new run of the query: what an earlier one received is gone
                self.servicer.forget(name)
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

    def behind(self) -> dict[str, tuple[int, float]]:
        """Each input folder's files landed and not read yet, and how long ago the oldest
        landed (seconds): how far the site has fallen behind. Empty before a stage reads."""
        with self._lock:
            readers = self._readers
        return {} if readers is None else readers.behind()

    def close(self) -> None:
        for query in list(self._runs):
            self.stop(query)
        if self._readers is not None:
            self._readers.stop()
        if self._cubes is not None:
            self._cubes.close()
        if self._spark is not None:
            stop_quietly(self._spark)

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

    def late_records(self) -> dict[str, int]:
        """Each running query's records its local stages here dropped as late."""
        with self._lock:
            runs = list(self._runs.values())
        return {run.name: run.metrics.late_records for run in runs}

    def links(self) -> dict[str, LinkState]:
        """Each running query's link to its parent (none at the root)."""
        with self._lock:
            runs = list(self._runs.values())
        return {run.name: LinkState(
            run.assignment.fragment.parent or "",
            run.policy.level.name if run.policy else "exact",
            run.policy.level.index if run.policy else 0,
            bool(run.policy and run.policy.pinned), run.uplink.bytes_sent,
            run.policy.recent_throughput if run.policy else None, run.uplink.rate_bps,
            run.uplink.profile.figures() if run.uplink.profile else (),
            bool(run.policy and run.policy.link_bound))
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
                self._spark = started(builder, f"site {self.site}")
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
