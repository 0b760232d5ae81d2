"""One read of a site's folder for every live stage that takes its records from it.

A site runs one Spark Structured Streaming query per source folder (:class:`SourceReader`):
it lists the folder and parses each new file once, and each micro-batch feeds every local
stage attached to it (:class:`~jetstream.stage.job.LocalStage`, one per query and source).
The stages' aggregations run as **one** Spark job a micro-batch, on one plan built once on
the stream: one stage's own steps, or for several the fused plan of them all
(:mod:`jetstream.stage.fused`: the records parsed once, each stage's steps as columns of one
row, one aggregation a batch, each stage's rows split back out). A second query adds its
columns to the plan rather than a stream of its own (a listing, offset and commit logs, a
plan and a job every trigger). Each stage still merges and snapshots on its own; the reader
knows nothing of their semantics. Where a stage cannot be fused (the frequent-items sketch's
second job), each micro-batch plans every stage again on the raw records, packs each stage's
grouped rows into a struct column and puts them together with ``unionByName``; what that
costs is mostly Spark's analysis of each DataFrame step of each stage's plan, every batch
(``docs/benchmarks.md``, "What a six-query micro-batch costs"). If the fused job fails (a
``map`` that raises), the batch's files are read again and each stage planned alone on them,
the failing one detached, and the stream started again without it.
The stream does not list the site's folder itself but a folder of the reader's own, into
which a gate (:mod:`jetstream.stage.gate`) lets the new files, so that files that land
between two windows' hand-ons share a micro-batch, and from which a file leaves once the
micro-batch that read it is committed.

Stages come and go while the reader runs: :meth:`SourceReader.attach` takes effect at the
next micro-batch, :meth:`SourceReader.detach` after the one under way (the stream stopped
and started again between the two on the same checkpoint, where its plan changes). A stage
whose plan or job fails (a ``map`` that raises) is detached and told
(``LocalStage.failure``); the others take the batch on their own. With no stage left the
stream goes on reading, so a stage deployed later starts where the site is by then.

Where a stage joins: a stage with a snapshot of an earlier run of its query at this site goes
on where that left it — micro-batch ids are the reader's, and a batch the snapshot holds is
skipped; the files of the batches it missed while it was away are read again for it, as
long as the reader has them listed. A new stage starts at the reader's current position: it
withholds the windows starting at or before the largest event time the reader had read
(``OpenWindows.joined_ms``), whose earlier records it never saw, so no window it hands on is
short; results show them from the other sites, or the cubes answer for the past.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from jetstream import trace
from jetstream.formats import DEFAULT_FORMAT
from jetstream.schema import Schema
from jetstream.stage.archive import Archive, ReadFiles
from jetstream.stage.batches import (
    FILE_COLUMN,
    Layout,
    batch_counters,
    batch_files,
    gc_paused,
    logged_files,
    not_adaptive,
    read_files,
    read_stream,
    stopped_quietly,
)
from jetstream.stage.fused import FusedPlan, fusable
from jetstream.stage.gate import DEFAULT_HOLD_S, FileGate
from jetstream.stage.job import LocalStage, PlannedBatch

__all__ = ["Position", "SourceReader", "SourceReaders"]

log = logging.getLogger(__name__)

#: How many recent micro-batches' files a reader keeps listed, to read them again for a
#: stage that comes back after missing them (a query's run replaced by a new version).
KEPT_BATCHES = 2_000


@dataclass(frozen=True)
class Position:
    """Where a reader is: its last micro-batch, the largest event time it has read."""

    batch: int = -1  # -1: none yet
    latest: int | None = None


class SourceReader:
    """One streaming query over one folder, serving every stage attached to it."""

    def __init__(self, spark: SparkSession, folder: Path, layout: Layout,
                 event_time: str, checkpoint_dir: Path, trigger_s: float,
                 hold_s: float = DEFAULT_HOLD_S, archive: Archive | None = None) -> None:
        self.spark, self.folder, self.layout = spark, folder, layout
        self.event_time = event_time
        self.checkpoint_dir, self.trigger_s = checkpoint_dir, trigger_s
        #: What the stream reads: the folder's files, let in by the gate (:mod:`.gate`).
        self.gate = FileGate(folder, checkpoint_dir.parent / "live", hold_s, self._due,
                             tend=self._trim, archive=archive, format=layout.format,
                             unreadable=layout.unreadable, set_aside=self._set_aside)
        self._stages: list[LocalStage] = []
        self._lock = threading.Lock()  # the stages, against a micro-batch under way
        self._stream: StreamingQuery | None = None
        self._alone_stage: LocalStage | None = None  # the stage whose plan the stream has
        self._fused: FusedPlan | None = None  # or the stages' fused plan it has
        self._replanning = False  # a restart without a failed stage is under way
        self._changing = threading.Lock()  # attaching and detaching, one at a time
        self._stopping = False
        #: The largest event time a stage of this reader has read (None: none yet).
        self.latest: int | None = None
        self.last_batch = -1  # the last micro-batch run
        self._first_batch = -1  # the first this reader ran (those before: an earlier process)
        self._files: OrderedDict[int, list[str]] = OrderedDict()  # batch -> its files
        self._trimmed = -1  # the files of batches up to this have left the stream's folder
        self._trim_committed()

    # -- stages ---------------------------------------------------------------------------
    @property
    def position(self) -> Position:
        """Where the reader is: the last micro-batch run, the largest event time read (after
        the micro-batch under way, if one is)."""
        with self._lock:
            return Position(self.last_batch, self.latest)

    def attach(self, stage: LocalStage, since: Position | None = None) -> None:
        """Feed ``stage`` from the next micro-batch on, after reading again for it the
        batches since its snapshot's, or for a new stage those since ``since`` (where the
        reader was when the stage was deployed); start the stream if it does not run."""
        since = since or Position()
        with self._changing:
            self._change(lambda: self._stages.append(stage), [*self._stages, stage],
                         adding=stage, since=since)

    def detach(self, stage: LocalStage) -> None:
        """Stop feeding ``stage``, after the micro-batch under way. The stream goes on with
        no stage left (a query deployed next starts where the site is by then)."""
        with self._changing:
            if stage in self._stages:
                self._change(lambda: self._stages.remove(stage),
                             [s for s in self._stages if s is not stage])

    def _change(self, change: Callable[[], None], after: list[LocalStage],
                adding: LocalStage | None = None, since: Position = Position()) -> None:
        """Change the stages (to ``after``); stop the stream first (its batch under way is
        run again by the next) when the stream's plan changes: one stage's, or the fused
        plan of several, is in the stream (each batch arrives prepared for it); stages
        that cannot be fused take the raw records, planned every batch."""
        restart = self._stream is None or not (_raw(self._stages) and _raw(after))
        if restart:
            self._stop_stream()
        with self._lock:
            if adding is not None:
                self._join(adding, since)
            change()
        if restart or not (self._stream and self._stream.isActive):
            self._start()

    def _join(self, stage: LocalStage, since: Position) -> None:
        stage.read_from = (f"{self.gate.live.resolve()}/", f"{self.folder.resolve()}/")
        if stage.windows.done < 0:  # new: it joins where the reader was at its deploy
            stage.windows.done = since.batch
            if since.latest is not None and stage.windows.joined_ms is None:
                stage.windows.joined_ms = since.latest
                log.info("%s joins %s at event time %d: it withholds the windows up to it",
                         stage.name, self.folder, since.latest)
        self._catch_up(stage)

    def _set_aside(self, path: Path, reason: str) -> None:
        """A file of the folder that cannot be read whole: moved to ``rejected`` beside the
        reader's checkpoint, never let in, and counted by every stage on the reader."""
        rejected = self.checkpoint_dir.parent / "rejected"
        rejected.mkdir(exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # gone meanwhile: nothing to keep
            shutil.move(path, rejected / path.name)
        with self._lock:
            for stage in self._stages:
                stage.set_aside(str(rejected / path.name), reason)

    def stop(self) -> None:
        """Stop the stream (the site closes)."""
        with self._changing:
            self._stop_stream()
            self.gate.stop()
            self._stopping = True  # for good

    def _stop_stream(self) -> None:
        with self._lock:
            self._stopping, stream, self._stream = True, self._stream, None
        if stream is not None and stream.isActive:
            stream.stop()  # outside the lock: a batch waiting for it would never end

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def status(self) -> dict[str, Any]:
        """The stream's status (``StreamingQuery.status``; empty when it does not run) and
        how many files wait at the gate (``waitingFiles``)."""
        stream = self._stream
        return {**(stream.status if stream is not None else {}),
                "waitingFiles": self.gate.waiting}

    def _due(self) -> int | None:
        """The event time at which a stage next hands a window on (None: not known)."""
        due = [stage.due_ms() for stage in list(self._stages)]
        return None if not due or None in due else min(d for d in due if d is not None)

    def failure(self) -> str | None:
        """Why the stream stopped, if it failed."""
        stream = self._stream
        if stream is None or stream.isActive:
            return None
        if self._stopping or stream is not self._stream:  # stopped on purpose (a stage
            return None  # came or went) since it was read above: not a failure
        return str(stream.exception() or "the streaming query stopped")

    def _start(self) -> None:
        """The stream, its plan by the stages: one stage's prepared records, or raw ones."""
        with self._lock:
            self._stopping = False
            raw = read_stream(self.spark, self.gate.live, self.layout)
            self._alone_stage = self._stages[0] if len(self._stages) == 1 else None
            self._fused, source = None, raw
            if self._alone_stage is not None:
                source = self._alone_stage.prepare(raw)
            elif len(self._stages) > 1 and not _raw(self._stages):
                try:
                    fused = FusedPlan(self._stages)
                    source, self._fused = fused.prepare(self._stages[0].typed(raw)), fused
                except Exception:  # each batch plans each stage: one that fails is detached
                    log.warning("the stages on %s could not be fused: planned every batch",
                                self.folder, exc_info=True)
            self._replanning = False
            self._stream = (source.writeStream.foreachBatch(self._batch)
                            .option("checkpointLocation", str(self.checkpoint_dir))
                            .trigger(processingTime=f"{int(self.trigger_s * 1000)} "
                                                     "milliseconds").start())
        self.gate.start()
        log.info("reading %s for %d stage%s (checkpoint %s)", self.folder, len(self._stages),
                 "" if len(self._stages) == 1 else "s", self.checkpoint_dir)

    # -- one micro-batch ------------------------------------------------------------------
    def _batch(self, records: DataFrame, batch_id: int) -> None:
        # Quietly stopped around it all: with no stage left the batch's files are listed by
        # a job of their own, which a stop may interrupt as well.
        trace.mark("called", folder=self.folder.name, batch=batch_id)
        self.gate.batch_started()
        with self._lock, stopped_quietly(self):
            stages = [s for s in self._stages if not s.has(batch_id)]
            alone = self._alone_stage
            if stages and alone is not None:  # the records come prepared for it
                self._run(stages, records, batch_id, prepared=True)
            elif stages and self._fused is not None:  # prepared for every stage at once
                self._run_fused(self._fused, stages, records, batch_id)
            elif stages:
                self._run(stages, records, batch_id)
            elif not self._stages:  # for a stage that comes later: where the site is by then
                self._keep_files(batch_id, self._list(records))
            self._read_up_to(*(s.windows.latest for s in stages))
            self.gate.read_up_to(self.latest)
            self.last_batch = max(self.last_batch, batch_id)
            if self._first_batch < 0:
                self._first_batch = batch_id

    def _run_fused(self, plan: FusedPlan, stages: list[LocalStage], records: DataFrame,
                   batch_id: int) -> None:
        """The fused plan's job (:mod:`.fused`), each stage taking its rows; if the job
        fails, each stage alone on the batch's files (``_run``), and the stream started
        again without a stage that failed."""
        began = time.monotonic()
        rows: list[list[tuple[Any, ...]]] | None = None
        with self._batch_of(stages, records):
            started = time.time()
            observed = Observation(f"{self.folder.name}/{id(self)}/{batch_id}/fused")
            counted = records.observe(observed, *batch_counters(F.col("_q") == -1))
            try:
                rows = plan.split(plan.grouped(counted).collect())
            except Exception:
                if self._stopping:
                    raise
                log.warning("the fused job of %d stages on %s failed: running each alone on "
                            "the batch's files", len(plan.stages), self.folder, exc_info=True)
            if rows is not None:
                own = dict(zip(plan.stages, rows, strict=True))
                planned = PlannedBatch(records, counted, observed)
                self._take([(stage, planned, own[stage]) for stage in stages], batch_id,
                           started)
                self._keep_files(batch_id, sorted(observed.get["files"]))
        if rows is not None:
            _done(stages, began)
        elif files := batch_files(self.checkpoint_dir, batch_id):
            self._run(stages, read_files(self.spark, files, self.layout), batch_id)
        else:  # (Spark logs a batch's files before it runs it: never seen)
            msg = (f"{self.folder}: micro-batch {batch_id} failed and Spark's file source log "
                   "names none of its files: its stages cannot be run alone")
            raise RuntimeError(msg)
        if any(stage not in self._stages for stage in plan.stages) and not self._replanning:
            self._replanning = True  # the plan still has a stage that failed: built again
            threading.Thread(target=self._replan, args=(batch_id,), daemon=True,
                             name=f"replan-{self.folder.name}").start()

    def _replan(self, batch_id: int) -> None:
        """Start the stream again on the stages left, once Spark has committed micro-batch
        ``batch_id`` (stopped before, it would run the batch again, and a stage without a
        snapshot would take it twice)."""
        committed = self.checkpoint_dir / "commits" / str(batch_id)
        deadline = time.monotonic() + 30
        while not committed.exists() and time.monotonic() < deadline and not self._stopping:
            time.sleep(0.05)
        with self._changing:
            if self._stopping and self._stream is None:
                return  # stopped for good meanwhile
            self._stop_stream()
            self._start()

    def _read_up_to(self, *latest: int | None) -> None:
        self.latest = max((t for t in (self.latest, *latest) if t is not None), default=None)

    def _run(self, stages: list[LocalStage], records: DataFrame, batch_id: int,
             prepared: bool = False) -> None:
        """Every stage's part of the batch, as one Spark job; if that fails, a job per
        stage, and a stage whose own plan or job fails is detached. ``prepared``: the
        records are the one stage's, prepared (see :meth:`_start`)."""
        began = time.monotonic()
        with self._batch_of(stages, records):
            started = time.time()
            planned = self._plan(stages, records, batch_id, prepared)
            try:
                rows: list[list[Any] | None] = list(self._together(planned))
            except Exception as e:
                if self._stopping:
                    raise
                if len(planned) == 1:
                    self._fail(planned[0][0], e)
                    rows = [None]
                else:
                    log.warning("the job of %d stages on %s failed: running each alone",
                                len(planned), self.folder)
                    # Each planned anew, alone: an observation is spent on the job that
                    # failed, and each needs its own.
                    planned = [again for s, _ in planned
                               for again in self._plan([s], records, batch_id, prepared)]
                    rows = [self._alone(s, plan) for s, plan in planned]
            taken = [(stage, plan, grouped) for (stage, plan), grouped
                     in zip(planned, rows, strict=True) if grouped is not None]
            self._take(taken, batch_id, started)
            # Every stage's counters saw every file of the batch (a record not kept too).
            self._keep_files(batch_id, sorted(taken[0][1].observation.get["files"])
                             if taken else self._list(records))
        _done([stage for stage, _ in planned], began)

    @contextlib.contextmanager
    def _batch_of(self, stages: list[LocalStage], records: DataFrame) -> Iterator[None]:
        """A micro-batch's work: every stage's lock held, adaptive execution off, the
        Python collector paused."""
        with contextlib.ExitStack() as held:
            for stage in stages:
                held.enter_context(stage.lock)
            with not_adaptive(records.sparkSession), gc_paused():
                yield

    def _take(self, taken: Sequence[tuple[LocalStage, PlannedBatch, Sequence[Any]]],
              batch_id: int, started: float) -> None:
        """Each stage takes its grouped rows; one that fails at it is detached."""
        for stage, plan, rows in taken:
            try:
                stage.take(plan, rows, batch_id, started)
            except Exception as e:
                if self._stopping:
                    raise
                self._fail(stage, e)

    def _plan(self, stages: list[LocalStage], records: DataFrame, batch_id: int,
              prepared: bool) -> list[tuple[LocalStage, PlannedBatch]]:
        """Each stage's job; a stage whose plan fails is detached. With several stages each
        groups its rows in one task, without a shuffle: their job is then one Spark stage of
        a task per query, where a shuffle each made it a stage per query and one more
        (a six-query micro-batch took 1.2 s instead of 2.0 s; docs/benchmarks.md). One stage
        alone keeps its shuffle: in one task it gained nothing end to end."""
        planned: list[tuple[LocalStage, PlannedBatch]] = []
        # Raw records: parsed once for all, their counters observed once, on the way of the
        # first stage planned (every stage's job takes part in the one job).
        typed: DataFrame | None = None
        observation: Observation | None = None
        for stage in stages:
            try:
                if prepared:
                    plan = stage.plan(records, batch_id)
                else:
                    typed = stage.typed(records) if typed is None else typed
                    base = typed
                    if not planned:  # (an observation is spent by a stage that failed)
                        observation = Observation(
                            f"{self.folder.name}/{id(self)}/{batch_id}/{stage.name}")
                        base = typed.observe(observation, *stage.record_counters)
                    plan = stage.plan(stage.prepare_typed(base), batch_id,
                                      one_task=len(stages) > 1, observation=observation)
            except Exception as e:
                self._fail(stage, e)
                continue
            planned.append((stage, plan))
        return planned

    def _together(self, planned: list[tuple[LocalStage, PlannedBatch]]) -> list[list[Any]]:
        """Each planned stage's grouped rows, from one Spark job."""
        if len(planned) <= 1:
            return [plan.grouped.collect() for _, plan in planned]
        packed = [_packed(plan.grouped, f"_s{i}") for i, (_, plan) in enumerate(planned)]
        together = functools.reduce(
            lambda a, b: a.unionByName(b, allowMissingColumns=True), packed)
        rows = together.collect()
        at = {name: i for i, name in enumerate(together.columns)}
        return [[row[k] for row in rows if row[k] is not None]
                for k in (at[f"_s{i}"] for i in range(len(planned)))]

    def _alone(self, stage: LocalStage, plan: PlannedBatch) -> list[Any] | None:
        try:
            return plan.grouped.collect()
        except Exception as e:
            if self._stopping:
                raise
            self._fail(stage, e)
            return None

    def _list(self, raw: DataFrame) -> list[str]:
        """The batch's files, by a job of their own; and how far its event times reach."""
        if FILE_COLUMN not in raw.columns:  # prepared for a stage that failed: nothing to learn
            return []
        event = (F.col("_event") if self._fused is not None  # (the fused plan's rows)
                 else F.expr(f"try_cast(`{self.event_time}` AS bigint)"))
        files, latest = raw.agg(F.collect_set(FILE_COLUMN), F.max(event)).collect()[0]
        self._read_up_to(latest)
        return sorted(files)

    def _fail(self, stage: LocalStage, error: Exception) -> None:
        """Detach a stage whose plan or job failed; the others go on."""
        log.warning("%s on %s failed: detached from the reader", stage.name, self.folder)
        stage.failure = error
        with contextlib.suppress(ValueError):
            self._stages.remove(stage)

    # -- coming back ----------------------------------------------------------------------
    def _trim(self) -> None:
        """The files of the micro-batches Spark has committed (its commit log has them)
        leave the folder the stream lists; on the gate's thread."""
        for batch in list(self._files):  # a copy: the stream's thread adds to it
            if batch <= self._trimmed:
                continue
            if not (self.checkpoint_dir / "commits" / str(batch)).exists():
                break
            self.gate.trim(self._files[batch])
            self._trimmed = batch

    def _trim_committed(self) -> None:
        """The files of micro-batches Spark committed in an earlier run that are still in
        ``live`` (the process stopped between the commit and the trim, a SIGKILL say) leave
        it: Spark would not read them again, and the site's folder would keep them for good.
        Which batch read which file is in the file source's own log (``sources/0``: a
        version line, then a JSON object a file, ``path`` and ``batchId``)."""
        live = set(os.listdir(self.gate.live))  # a hidden copy's name is in no entry
        commits = [int(p.name) for p in (self.checkpoint_dir / "commits").glob("[0-9]*")
                   if p.name.isdigit()]
        if not live or not commits:
            return
        committed = max(commits)
        read = [path for path, batch in logged_files(
            self.checkpoint_dir, lambda line: any(name in line for name in live))
                if batch <= committed]
        if read:
            log.info("%s: %d files Spark committed before the site stopped leave %s",
                     self.folder, len(read), self.gate.live)
            self.gate.trim(read)

    def _keep_files(self, batch_id: int, files: list[str]) -> None:
        self._files[batch_id] = files
        while len(self._files) > KEPT_BATCHES:
            self._files.popitem(last=False)

    def _catch_up(self, stage: LocalStage) -> None:
        """Read again, for a stage back from an earlier run, the files of the micro-batches
        it missed; say so where the reader no longer has them listed."""
        missed = range(max(stage.windows.done + 1, self._first_batch), self.last_batch + 1)
        if not missed:
            return
        known = [b for b in missed if b in self._files]
        if len(known) < len(missed):
            log.warning("%s on %s: %d micro-batches since its snapshot are not listed any "
                        "more: their records are missing from its windows", stage.name,
                        self.folder, len(missed) - len(known))
        landed = [self.gate.landed(path) for b in known for path in self._files[b]]
        paths = [str(path) for path in landed if path.exists()]
        if len(paths) < len(landed):
            log.warning("%s on %s: %d files of the micro-batches it missed are gone (pruned "
                        "from the archive, or deleted: --read-files): their records are "
                        "missing from its windows", stage.name, self.folder,
                        len(landed) - len(paths))
        if not paths:
            return
        log.info("%s on %s: reading again the %d files of the %d micro-batches it missed",
                 stage.name, self.folder, len(paths), len(known))
        stage.process_batch(read_files(self.spark, paths, self.layout), self.last_batch)


def _done(stages: list[LocalStage], began: float) -> None:
    """Each stage not failed has done a micro-batch begun at ``began`` (monotonic)."""
    for stage in stages:
        if stage.failure is None:
            stage.batch_done(time.monotonic() - began)


def _raw(stages: list[LocalStage]) -> bool:
    """Whether a stream for ``stages`` takes raw records, each batch planned for them all:
    several stages, one of which cannot be fused."""
    return len(stages) > 1 and any(fusable(stage) is not None for stage in stages)


def _packed(grouped: DataFrame, name: str) -> DataFrame:
    """A stage's grouped rows as one struct column, read by position (its columns are
    named apart: the keys, and the aggregates ``_a0``, ``_a1``, ...)."""
    columns = (F.col("`{}`".format(c.replace("`", "``"))) for c in grouped.columns)
    return grouped.select(F.struct(*columns).alias(name))


class SourceReaders:
    """A site's readers, one per folder and record layout, made when a stage first needs
    one; their checkpoints under ``state_dir``, the files they have all read archived
    under ``state_dir``'s sibling ``archive`` (:mod:`jetstream.stage.archive`)."""

    def __init__(self, state_dir: Path, trigger_s: float, hold_s: float,
                 read_files: ReadFiles) -> None:
        self.state_dir, self.trigger_s, self.hold_s = state_dir, trigger_s, hold_s
        self.read_files = read_files
        self._readers: dict[tuple[Any, ...], SourceReader] = {}
        self._archives: dict[str, Archive] = {}  # one per folder, for all its readers
        self._lock = threading.Lock()

    def behind(self) -> dict[str, tuple[int, float]]:
        """Each folder's files landed and not read yet, and how long ago the oldest landed
        (``FileGate.behind``): how far the site has fallen behind (the worst of a folder's
        readers)."""
        with self._lock:
            readers = list(self._readers.values())
        out: dict[str, tuple[int, float]] = {}
        for reader in readers:
            files, lag_s = reader.gate.behind()
            held = out.get(reader.folder.name, (0, 0.0))
            out[reader.folder.name] = (max(files, held[0]), max(lag_s, held[1]))
        return out

    def position(self, folder: Path, schema: Schema, format: str) -> Position:
        """Where the reader of ``folder`` for records of ``schema`` in files of ``format``
        is (none yet: at the start)."""
        with self._lock:
            reader = self._readers.get(_key(folder, schema, format))
        return reader.position if reader is not None else Position()

    def reader(self, stage: LocalStage, folder: Path) -> SourceReader:
        """The reader of ``folder`` for ``stage``'s records."""
        key = _key(folder, stage.source.schema, stage.layout.format)
        with self._lock:
            if key not in self._readers:
                self._readers[key] = SourceReader(
                    stage.spark, folder, stage.layout, stage.event_time,
                    self.state_dir / f"{folder.name}-{_digest(key)}" / "checkpoint",
                    self.trigger_s, self.hold_s, self._archive(folder))
            return self._readers[key]

    def _archive(self, folder: Path) -> Archive:
        at = str(folder.resolve())
        if at not in self._archives:
            self._archives[at] = Archive(
                folder, self.state_dir.parent / "archive" / f"{folder.name}-{_digest(at)}",
                self.read_files)
        return self._archives[at]

    def stop(self) -> None:
        with self._lock:
            readers = list(self._readers.values())
        for reader in readers:
            reader.stop()


def _digest(key: Any) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:12]


def _key(folder: Path, schema: Schema, format: str) -> tuple[Any, ...]:
    return (str(folder.resolve()), tuple((f.name, f.dtype.value) for f in schema),
            schema.event_time, *(() if format == DEFAULT_FORMAT else (format,)))
