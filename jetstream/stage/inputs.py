"""A query's local stages at a site, each an input of the site's merge.

A site runs one local stage (:class:`~jetstream.stage.job.LocalStage`) per chain of the
query that reads a source it holds (:func:`~jetstream.stage.check.local_inputs`): one for most
queries, one per branch for a ``union``, each with a watermark of its own, as the reference
executor gives each input stream its own. :class:`StageInput` is one of them: a thread that
starts the stage, runs it (live, after a warm-up on made-up records, see
:mod:`jetstream.stage.warm`, closing its windows when its input goes idle; or over what its
folder holds now) and tells the run its windows, its progress and its failure under its
input's name.

Where a source's files are (:func:`source_folder`): in ``<input>/<source>/`` when the site's
input folder has a folder of that name; otherwise, for a query that reads one source at the
site, in the input folder itself. A site whose stages read two sources keeps each in its own
folder (``<input>/cdn_logs/``, ``<input>/origin_logs/``); a source without one has no records
at that site.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from jetstream.dataplane.partials import ENDED
from jetstream.dsl import Query
from jetstream.errors import PlanError
from jetstream.formats import DEFAULT_FORMAT
from jetstream.stage.check import Chain, source_of
from jetstream.stage.warm import warm_up

if TYPE_CHECKING:
    from jetstream.stage.job import LocalStage, StageStats
    from jetstream.stage.reader import Position, SourceReaders

    #: The site's readers (made when first asked for).
    Readers = Callable[[], SourceReaders]

__all__ = ["StageInput", "source_folder"]

log = logging.getLogger(__name__)

#: How often a live stage's input is looked at (idle, stopped).
TICK_S = 0.2
# (input, window, rows, events, revision, received_ms, early, provisional): a window the
# stage hands on (early: before its watermark closed it; provisional: because the input went
# idle, and records for it may come yet).
HandOn = Callable[[str, tuple[int, int], list[dict[str, Any]], int, int, int, bool, bool],
                  None]
# (input, watermark, ended, received_ms): how far the input has got, and when it received
# the records that moved it there.
Progress = Callable[[str, int, bool, int], None]
# (input, the stage's stats so far, seconds the micro-batch took).
OnBatch = Callable[[str, "StageStats", float], None]


def source_folder(input_dir: Path | None, source: str, alone: bool) -> Path | None:
    """The folder a site's stage reads ``source`` from: ``input_dir/<source>`` if there is
    one; else, when the site's stages of the query read no other source (``alone``), the
    input folder itself; None where the site has no records of the source."""
    if input_dir is None:
        return None
    own = input_dir / source
    if own.is_dir():
        return own
    return input_dir if alone and input_dir.is_dir() else None


class StageInput:
    """One local stage of a query at a site, run on a thread of its own."""

    def __init__(self, name: str, query: Query, chain: Chain, folder: Path | None,
                 state: Path, *, replay: bool, trigger_s: float, idle_s: float,
                 hand_on: HandOn, progress: Progress, on_batch: OnBatch,
                 on_failure: Callable[[str], None], warm_up_s: float = 0.0,
                 readers: Readers | None = None) -> None:
        self.name, self.query, self.chain, self.folder = name, query, chain, folder
        self.state, self.replay = state, replay
        self.trigger_s, self.idle_s, self.warm_up_s = trigger_s, idle_s, warm_up_s
        #: True until the stage's stream starts (while Spark starts and the stage warms up),
        #: or until the stage ends without one (a replay, no folder, a failure).
        self.starting = True
        self._hand_on, self._progress, self._on_batch = hand_on, progress, on_batch
        self._on_failure = on_failure
        #: Where a live stage gets its records: the site's reader of its folder
        #: (:mod:`jetstream.stage.reader`); None, a stream of its own.
        self._readers = readers
        self._since: Position | None = None
        self.stage: LocalStage | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def source(self) -> str:
        return source_of(self.chain).name

    def start(self, spark: Callable[[], Any]) -> None:
        if self._readers is not None and self.folder is not None:
            # A live stage joins its reader where the reader is now, at its deploy: what
            # lands while Spark starts or the stage warms up is read again for it.
            source = source_of(self.chain)
            self._since = self._readers().position(self.folder, source.schema,
                                                   source.format or DEFAULT_FORMAT)
        self._thread = threading.Thread(target=self._run, args=(spark,), daemon=True,
                                        name=f"stage-{self.query.name}-{self.name}")
        self._thread.start()

    def stop(self, wait_s: float) -> None:
        """Stop the stream (a micro-batch under way ends first) and wait for the thread."""
        self._stop.set()
        if self.stage is not None:
            self.stage.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def _run(self, spark: Callable[[], Any]) -> None:
        try:
            self._read(spark)
        finally:
            self.starting = False

    def _read(self, spark: Callable[[], Any]) -> None:
        if self.folder is None:
            log.warning("%s has no folder of %s records: %s reads nothing of it there",
                        self.name, self.source, self.query.name)
            # Nothing to wait for here: ended when replaying, idle for good when live.
            self._progress(self.name, ENDED, self.replay, 0)
            return
        from jetstream.stage.job import LocalStage  # Spark loads only where a stage runs

        try:
            self.stage = LocalStage(spark(), self.query, self.folder, chain=self.chain,
                                    checkpoint_dir=self.state / "checkpoint",
                                    quarantine_dir=self.state / "quarantine",
                                    emit=self._emit, on_batch=self._batch,
                                    emit_early=None if self.replay else self._emit_early,
                                    emit_idle=None if self.replay else self._emit_idle,
                                    snapshot=None if self.replay
                                    else self.state / "stage.json")
            if self.replay:
                self.stage.run_available()
                self._progress(self.name, ENDED, True, 0)
                log.info("%s: replayed %s: %s", self.name, self.folder, self.stage.stats)
            else:
                self._run_live(self.stage)
        except Exception as e:  # the stage is lost; the others go on without its records
            message = f"local stage of {self.query.name} at {self.name} failed: {_cause(e)}"
            log.exception(message)
            self._on_failure(message)
            # Results say how many sites they cover, so they show what is missing.
            self._progress(self.name, ENDED, self.replay, 0)

    def _run_live(self, stage: LocalStage) -> None:
        if self.warm_up_s > 0 and not self._stop.is_set():
            warm = warm_up(stage.spark, self.query, self.chain, self.state / "warm-up",
                           seconds=self.warm_up_s, trigger_s=self.trigger_s,
                           stopping=self._stop.is_set)
            if not warm.again:
                log.info("%s: warmed %s up in %.1fs: %d micro-batch%s of made-up records, the "
                         "first %.2fs, the last %.2fs%s", self.name, self.query.name,
                         warm.seconds, warm.batches, "" if warm.batches == 1 else "es",
                         warm.first_s, warm.last_s,
                         f"; stopped by {warm.failure}" if warm.failure else "")
        if self._stop.is_set():  # stopped while Spark started
            return
        if self._readers is None:
            self._watch(stage, _OwnStream(stage.start(self.trigger_s)))
            return
        assert self.folder is not None
        reader = self._readers().reader(stage, self.folder)
        reader.attach(stage, self._since)
        try:
            self._watch(stage, reader)
        finally:
            reader.detach(stage)

    def _watch(self, stage: LocalStage, stream: _Stream) -> None:
        """Until stopped: fail with the stage, close its windows when its input goes idle."""
        self.starting = False
        seen, quiet_since, idle = -1, time.monotonic(), False
        while not self._stop.wait(TICK_S):
            if stage.failure is not None:
                raise stage.failure
            if (failure := stream.failure()) is not None:
                raise PlanError(f"the streaming query stopped: {failure}")
            records, status = stage.stats.records_in, stream.status
            # A micro-batch with records runs: not idle, only slow. (A trigger that only
            # lists the folder is active too, every trigger_s, for longer as the folder
            # grows: counting it, an input went quiet for good and was never taken for idle.)
            # Files that wait to be read (``jetstream.stage.gate``) are not idle either.
            if ((status.get("isTriggerActive") and status.get("isDataAvailable"))
                    or status.get("waitingFiles")):
                quiet_since = time.monotonic()
            if records != seen:
                seen, quiet_since, idle = records, time.monotonic(), False
            elif not idle and time.monotonic() - quiet_since >= self.idle_s:
                # Idle: what is open goes on provisional (records for it may come yet),
                # and holds no window back; final once the watermark passes it.
                stage.flush(idle=True)
                self._progress(self.name, ENDED, False, stage.received_ms)
                idle = True
        stage.stop()


    def _batch(self, stats: StageStats, seconds: float) -> None:
        """After each micro-batch: its windows are in the merge, so its watermark may go
        (before them, the merge would take a window for one this input had nothing in)."""
        self._on_batch(self.name, stats, seconds)
        stage = self.stage
        if not self.replay and stage is not None and stage.watermark is not None:
            self._progress(self.name, stage.watermark, False, stage.received_ms)

    def _emit(self, window: tuple[int, int], rows: list[dict[str, Any]], events: int,
              revision: int, early: bool = False, provisional: bool = False) -> None:
        assert self.stage is not None, "a stage hands on windows only once it runs"
        self._hand_on(self.name, window, rows, events, revision, self.stage.received_ms, early,
                      provisional)

    def _emit_idle(self, window: tuple[int, int], rows: list[dict[str, Any]], events: int,
                   revision: int) -> None:
        self._emit(window, rows, events, revision, provisional=True)

    def _emit_early(self, window: tuple[int, int], rows: list[dict[str, Any]], events: int,
                    revision: int) -> None:
        self._emit(window, rows, events, revision, early=True)


def _cause(error: Exception) -> str:
    """What went wrong, in a line: a Spark job's error carries the Python error that failed
    it (a map's DataError, say) inside a long Java and Python stack trace."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("jetstream.errors.")]
    line = (ours or lines or [type(error).__name__])[-1 if ours else 0]
    return line.removeprefix("jetstream.errors.")[:500]


class _Stream(Protocol):
    @property
    def status(self) -> dict[str, Any]: ...

    def failure(self) -> str | None: ...


class _OwnStream:
    """A stage's stream of its own, as a reader shows its stream."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.stream.status)

    def failure(self) -> str | None:
        return None if self.stream.isActive else str(self.stream.exception())
