"""When a reader's stream sees a live folder's new files: a micro-batch's fixed cost, held down.

A Spark micro-batch of a few hundred records costs about what one of tens of thousands costs
(``docs/benchmarks.md``, "Under load"): listing, planning, the offset and commit logs, a job
and its call into Python. A site that ran one for every file its shippers drop (every 0.5 s,
say) spent its cores on that fixed work, three sites on one machine more than its two cores.
Yet only some micro-batches are on a result's way: those that hand a window on, once the
event time read passes its end (by its watermark delay, or by the early hand-on's share of
it). The rest only need to run before then.

So a reader's stream does not list the site's folder: it lists a folder of its own
(``live/`` beside its checkpoint), and a :class:`FileGate` lets each new file of the site's
folder into it (a hard link, so nothing is copied; a copy where the two are on different file
systems) when one of these holds:

- a file has waited ``hold_s`` (the reader's ``--batch-hold``, 8 s by default; 0: every
  file at once, as a stream on the folder itself);
- the newest waiting file may hold event times that reach when a stage next hands a window
  on (:meth:`~jetstream.stage.job.LocalStage.due_ms`, the *due point*): its modification
  time, less how far the event times read have trailed the files' modification times (the
  least such lag of the recent micro-batches), reaches it;
- once for each due point, a *lead* ahead of it: the newest waiting file's event times may
  reach within the lead of it. The lead is one and a half times as long as the recent
  micro-batches took from a file's going in to their end (the longest of the last few), at
  least ``hold_s / 4`` and at most ``hold_s``: what waited is read before the window's last
  records land, so the micro-batch that hands it on holds little else and waits for none;
- nothing is known yet (no stage, or no record read): a file goes in at once.

The second and third let files in once a due point: the files that land after either wait (by
the hold) until a micro-batch has read the one that reaches it and the stage's next due point
is known (if the due point is still the same then, the lag was misjudged and the next file
that may reach it goes in at once). When micro-batches outlast the hold (the lead would be
longer), every file within the lead goes in as it lands: one that waited would only make the
micro-batch that hands the window on longer. Before, every file within the lead went in as it
landed, so the file that hands a window on often found the micro-batch of the file before
still running, and a window's closing took two micro-batches' time (``docs/benchmarks.md``,
"One let-in a due point"). A window's last records therefore reach Spark as soon as they
land, with no micro-batch under way, and the records before go in batches of ``hold_s``.
Where the lag misleads (a clock ahead of the site's, logs replayed faster than they were
written), a window waits at most ``hold_s`` longer. Files go in in landing order
(:func:`jetstream.formats.landing_key`: modification time, then name), the order in which
the lateness rule judges them (``docs/dsl.md``, "Late records"), and are never dropped, so
every result is what a stream on the folder itself gives. A file that lands behind one let in
already (an older modification time: a shipper that kept the time it wrote it, a rename the
listing saw late) is stamped with a modification time just after that one's before it goes
in, so that the order the site read its files in is the order their times say, for the
reference executor too; the newest let in is kept in ``live.last`` across restarts.
What becomes of a site's file once its reader has read it (archived, deleted or kept) is the
:class:`~jetstream.stage.archive.Archive`'s to say. At most ``MAX_UNREAD`` files (240) wait
in ``live`` for a micro-batch: a site started on a folder that holds a backlog reads it in
micro-batches of about that many, not in one.

Once Spark has committed the micro-batch that read a file (its commit log says so), the
file leaves ``live`` (:meth:`FileGate.trim`, from the reader), so the stream's listing, every
trigger, is of the files not read yet rather than of every file the site ever had. The names
let in are kept in ``live.names``, so a site started again lets none in twice; a stage that
reads a batch again reads its files from the site's folder or its archive
(:meth:`FileGate.landed`). When a gate starts, the names of files gone from both folders
leave ``live.names``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from jetstream import trace
from jetstream.formats import DEFAULT_FORMAT, file_name, is_input, landing_key
from jetstream.stage.archive import Archive

__all__ = ["DEFAULT_HOLD_S", "FileGate"]

log = logging.getLogger(__name__)

#: How long a new file waits at most before a micro-batch reads it (seconds). Files that
#: land between two due points wait for the next one's lead; a hold shorter than the time
#: between due points lets them in on its own, in micro-batches no window waits for (at 2 s,
#: a sixth more CPU at 3,000 records/s a site, and six queries' windows twice as late:
#: docs/benchmarks.md, "A hold as long as the time between due points").
DEFAULT_HOLD_S = 8.0
#: How often the site's folder is looked at (seconds).
TICK_S = 0.05
#: The site's folder is listed again at least this often even when its modification time
#: has not changed (two renames within the file system's clock tick).
RELIST_S = 1.0
#: How many recent micro-batches' lag between modification and event times are kept.
LAG_SAMPLES = 20
#: How many recent micro-batches' times from a file's going in to their end are kept.
TOOK_SAMPLES = 8
#: How much longer than the slowest of those the lead is: what goes in ahead of a window's
#: hand-on is read before the file that hands it on lands, even on a busy machine.
LEAD_FACTOR = 1.5
#: At most this many files go in that no micro-batch has read yet: a site started on a folder
#: with a backlog reads it in micro-batches of about this many files, not in one.
MAX_UNREAD = 240


class FileGate:
    """Lets ``landing``'s new files into ``live`` (see the module's docstring); ``due`` says
    the event time (epoch ms) at which a stage next hands a window on (None: unknown)."""

    def __init__(self, landing: Path, live: Path, hold_s: float,
                 due: Callable[[], int | None], max_unread: int = MAX_UNREAD,
                 tend: Callable[[], None] = lambda: None, archive: Archive | None = None,
                 format: str = DEFAULT_FORMAT,
                 unreadable: Callable[[Path], str | None] = lambda path: None,
                 set_aside: Callable[[Path, str], None] = lambda path, reason: None) -> None:
        self.landing, self.live, self.hold_s, self._due = landing, live, hold_s, due
        # The files of the source's format, and where one that cannot be read whole goes.
        self.format, self._unreadable, self._set_aside = format, unreadable, set_aside
        self.archive = archive  # what becomes of the site's files once read (None: kept)
        self._tend = tend  # called after each look at the folder (the reader trims)
        self.max_unread = max_unread
        self._unread = 0  # files let in since the last micro-batch ended
        live.mkdir(parents=True, exist_ok=True)
        #: The names let in so far, one a line (a file read and trimmed from ``live`` is
        #: not let in again when the site starts again).
        self.names = live.parent / f"{live.name}.names"
        self._in = {name for name in os.listdir(live) if not _hidden(name)}
        if self.names.exists():
            self._in.update(filter(None, self.names.read_text().split("\n")))
        self._forget_taken()
        self._names = self.names.open("a")
        #: The landing order's place of the newest file let in (:meth:`_let_in`).
        self.last = live.parent / f"{live.name}.last"
        self._last_in: tuple[int, str] | None = None
        with contextlib.suppress(OSError, ValueError):
            mtime, name = self.last.read_text().split("\t", 1)
            self._last_in = (int(mtime), name)
        self._waiting: dict[str, tuple[int, float]] = {}  # name -> (mtime ms, first seen)
        self._listed: tuple[int, float] = (-1, 0.0)  # the folder's mtime, when listed
        self._released_ms: int | None = None  # the newest modification time let in
        self._lags: deque[int] = deque(maxlen=LAG_SAMPLES)
        self._took: deque[float] = deque(maxlen=TOOK_SAMPLES)  # let in -> read, seconds
        self._ahead: tuple[int | None, int] = (None, 0)  # a due point, how far let in for it
        self._unread_since = 0.0  # when the first of the ``_unread`` files went in
        # The files let in that no micro-batch has read yet (name -> modification time, ms),
        # and those the micro-batch under way took (see :meth:`batch_started`).
        self._pending: dict[str, int] = {}
        self._taken: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.released = 0  # files let in by this gate

    def _forget_taken(self) -> None:
        """Forget the names let in whose files have left both folders (archived, deleted),
        so the log of names stays as long as the site's folder; and hand the archive the
        files read before a stop that it had not taken yet (a name logged but no longer in
        ``live`` was read: a file leaves ``live`` only once Spark has committed it)."""
        live = set(os.listdir(self.live))
        if self.archive is not None:
            self.archive.register(self._done_with)
            self.archive.read(sorted(n for n in self._in - live
                                     if (self.landing / n).exists()))
        kept = {n for n in self._in if n in live or (self.landing / n).exists()}
        if len(kept) < len(self._in):
            staged = self.names.with_name(f".{self.names.name}.part")
            staged.write_text("".join(f"{n}\n" for n in sorted(kept)))
            os.replace(staged, self.names)
            self._in = kept

    def _done_with(self, name: str) -> bool:
        """Whether this gate's reader has read the site's file ``name``."""
        return name in self._in and not (self.live / name).exists()

    @property
    def waiting(self) -> int:
        """How many of the site's files wait to be let in."""
        return len(self._waiting)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"gate-{self.landing.name}")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._names.close()

    def trim(self, paths: Iterable[str]) -> None:
        """Take files every stage has read (and Spark committed) out of ``live``: the
        stream lists only what is new. ``paths`` as Spark names them (URIs or paths)."""
        names = [file_name(path) for path in paths]
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (self.live / name).unlink()
        if self.archive is not None:
            self.archive.read(names)

    def landed(self, path: str) -> Path:
        """Where a file ``live`` holds (or held) is now: in the site's folder, or in its
        archive."""
        name = file_name(path)
        return self.landing / name if self.archive is None else self.archive.where(name)

    def batch_started(self) -> None:
        """A micro-batch starts: it reads the files let in so far."""
        self._taken = set(self._pending)

    def behind(self, now_ms: int | None = None) -> tuple[int, float]:
        """How far the site's reading is behind its folder: how many files have landed and
        not been read yet (let in for the next micro-batch, or waiting here longer than the
        gate holds a file by design, ``hold_s``), and how long ago the oldest of them landed
        (seconds; 0: none). A file held to share a micro-batch with the next is not behind."""
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        held_since = time.monotonic() - self.hold_s
        landed = [*(m for m, seen in list(self._waiting.values()) if seen < held_since),
                  *list(self._pending.values())]
        return len(landed), max(0.0, (now_ms - min(landed)) / 1000) if landed else 0.0

    def read_up_to(self, latest: int | None) -> None:
        """A micro-batch ended with event times read up to ``latest``: how far they trail
        the files let in so far is a sample of the lag."""
        for name in self._taken:
            self._pending.pop(name, None)
        self._taken = set()
        if latest is not None and self._released_ms is not None:
            self._lags.append(self._released_ms - latest)
        if self._unread:
            self._took.append(time.monotonic() - self._unread_since)
        self._unread = 0
        due, step = self._ahead
        if step == 2:  # the file let in as reaching the due point may not have (a lag
            self._ahead = (due, 1)  # misjudged): the next that may reach it goes at once

    @property
    def lead_s(self) -> float:
        """How long before a window is due what waits goes in (see the module's docstring)."""
        return min(self.hold_s, self._lead_s)

    @property
    def _lead_s(self) -> float:
        took = max(self._took, default=0.0) * LEAD_FACTOR + TICK_S
        return max(self.hold_s / 4, took)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.tick()
                self._tend()
                if self.archive is not None:
                    self.archive.prune()
            except OSError as e:  # the folder went away, a full disk: said, tried again
                log.warning("letting %s's files in: %s", self.landing, e)

    def tick(self) -> None:
        """Look at the site's folder; let its waiting files in if it is time."""
        now = time.monotonic()
        self._list(now)
        if self._waiting and self._unread < self.max_unread and self._time(now):
            going = sorted(self._waiting, key=lambda n: landing_key(self._waiting[n][0], n))
            going = going[:self.max_unread - self._unread]
            for name in going:
                self._let_in(name)
            self._keep_last()
            trace.mark("let_in", folder=self.landing.name, files=len(going),
                       newest=self._released_ms)

    def _list(self, now: float) -> None:
        changed = os.stat(self.landing).st_mtime_ns
        if changed == self._listed[0] and now - self._listed[1] < RELIST_S:
            return
        self._listed = (changed, now)
        with os.scandir(self.landing) as entries:
            for entry in entries:
                if (entry.name in self._in or entry.name in self._waiting
                        or not is_input(entry.name, self.format) or not entry.is_file()):
                    continue
                self._waiting[entry.name] = (entry.stat().st_mtime_ns // 1_000_000, now)

    def _time(self, now: float) -> bool:
        if self.hold_s <= 0 or now - min(s for _, s in self._waiting.values()) >= self.hold_s:
            return True
        due = self._due()
        if due is None or not self._lags:
            return True
        # Once each for a due point: what waited, a lead ahead of it; then the file that
        # may reach it. Files after either wait (by the hold) until the stage has read it.
        reach = max(mtime for mtime, _ in self._waiting.values()) - min(self._lags)
        step = 2 if reach >= due else 1 if reach >= due - self.lead_s * 1000 else 0
        if step and self._lead_s > self.hold_s:  # busy: a file that waited would only
            return True  # make the micro-batch that hands the window on longer
        done = self._ahead[1] if self._ahead[0] == due else 0
        if step > done:
            self._ahead = (due, step)
        return step > done

    def _keep_last(self) -> None:
        if self._last_in is None:
            return
        staged = self.last.with_name(f".{self.last.name}.part")
        staged.write_text(f"{self._last_in[0]}\t{self._last_in[1]}")
        os.replace(staged, self.last)

    def _in_order(self, source: Path, name: str, mtime: int) -> int:
        """The file's modification time, stamped just after the newest let in if it lands
        behind it in landing order (see the module's docstring)."""
        if self._last_in is not None and landing_key(mtime, name) <= self._last_in:
            stamped = max(self._last_in[0] + 1, time.time_ns() // 1_000_000)
            try:
                os.utime(source, ns=(source.stat().st_atime_ns, stamped * 1_000_000))
            except OSError as e:  # a folder the site may not write: its order is Spark's
                log.warning("%s landed behind %s and cannot be stamped after it (%s): a late "
                            "record in it may be judged against the wrong files", name,
                            self._last_in[1], e)
                return mtime
            log.info("%s landed behind %s: stamped %d ms after it", name, self._last_in[1],
                     stamped - self._last_in[0])
            mtime = stamped
        self._last_in = landing_key(mtime, name)
        return mtime

    def _let_in(self, name: str) -> None:
        mtime, _ = self._waiting.pop(name)
        source, target = self.landing / name, self.live / name
        reason = self._unreadable(source) if source.exists() else None
        if reason is not None:  # none of it read: it leaves the folder, and is counted
            self._in.add(name)  # and is never looked at again, wherever it went
            self._set_aside(source, reason)
            return
        if source.exists():
            mtime = self._in_order(source, name, mtime)
        try:
            os.link(source, target)
        except FileExistsError:
            pass  # let in before a restart
        except FileNotFoundError:
            log.warning("%s left %s before it was read", name, self.landing)
            return
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM):
                raise
            staged = self.live / f".{name}.part"  # hidden from Spark until renamed
            shutil.copy2(source, staged)
            os.replace(staged, target)
        self._in.add(name)
        self._pending[name] = mtime
        self._names.write(f"{name}\n")  # after the link: a name logged is in ``live``
        self._names.flush()
        self.released += 1
        if not self._unread:
            self._unread_since = time.monotonic()
        self._unread += 1
        self._released_ms = mtime if self._released_ms is None else max(self._released_ms,
                                                                        mtime)


def _hidden(name: str) -> bool:
    """Whether Spark's file source skips a file of this name (and so does the gate)."""
    return name.startswith((".", "_"))
