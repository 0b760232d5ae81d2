"""What becomes of a site's file once every live reader of its folder has read it.

A live site's folder is where its log shippers drop files. Each reader's gate
(:mod:`jetstream.stage.gate`) lists that folder whenever it changes, so a folder that keeps
every file a site ever had costs more to look at every day (about 1 µs a file a look, 57 ms
at 50,000 files). Once every reader of the folder has read a file — its micro-batch is in
Spark's commit log and the file has left the reader's ``live`` folder — the file is done
with, and :class:`Archive` takes it out of the folder (``--read-files``):

- ``archive`` (the default): moved (renamed, or copied where the two are on different file
  systems) into the site's archive folder, ``STATE/<site>/archive/<folder>-<digest>/``;
  archived files older than the retention (``--archive-retention``, a day by default, by
  modification time) are deleted, and the oldest go first while the archive holds more
  than its bound (``--archive-max-bytes``, 10 GiB by default);
- ``delete``: deleted;
- ``keep``: left where it is (the folder is then the operator's to prune).

A reader's stream reads the hard link in its ``live`` folder, not the site's file, so moving
or deleting the latter never takes a record from a micro-batch. A stage that reads a
recent micro-batch again (a query's run replaced by a new version) finds its files where
:meth:`Archive.where` says, as long as the archive has them. ``jetstream run`` and a replayed
site (``--replay``) read the user's input and never move or delete it.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_ARCHIVE_MAX_BYTES", "DEFAULT_ARCHIVE_RETENTION_S", "READ_FILES", "Archive",
           "ReadFiles"]

#: What a site may do with a file every reader has read (``jetstream site --read-files``).
READ_FILES = ("archive", "delete", "keep")
DEFAULT_ARCHIVE_RETENTION_S = 24 * 3600.0
DEFAULT_ARCHIVE_MAX_BYTES = 10 * 2**30
#: How often the archive is pruned by age and size (seconds).
PRUNE_EVERY_S = 10.0


@dataclass(frozen=True)
class ReadFiles:
    """The operator's choice for read files (see the module's docstring)."""

    mode: str = "archive"
    retention_s: float = DEFAULT_ARCHIVE_RETENTION_S
    max_bytes: int = DEFAULT_ARCHIVE_MAX_BYTES

    def __post_init__(self) -> None:
        if self.mode not in READ_FILES:
            msg = f"read files: {self.mode!r} is not one of {', '.join(READ_FILES)}"
            raise ValueError(msg)
        if not self.retention_s > 0 or not self.max_bytes > 0:
            msg = ("read files: the archive's retention and its bound must be above 0, not "
                   f"{self.retention_s!r} s and {self.max_bytes!r} bytes")
            raise ValueError(msg)


class Archive:
    """One site folder's read files, for every reader (gate) of that folder.

    A gate says what its reader has read (:meth:`read`); a file goes once every gate
    registered for the folder is done with it (``done(name)``: let in, and out of its
    ``live`` folder again).
    """

    def __init__(self, landing: Path, folder: Path, policy: ReadFiles) -> None:
        self.landing, self.folder, self.policy = landing, folder, policy
        self._done: list[Callable[[str], bool]] = []  # each gate's: is it done with a name
        self._lock = threading.Lock()
        #: The archived files, a heap by age: (modification time ns, bytes, name).
        self._kept: list[tuple[int, int, str]] = []
        self._bytes = 0
        self._pruned = 0.0  # monotonic time of the last prune
        self.moved = 0  # files taken out of the site's folder (archived or deleted)
        if policy.mode == "archive":
            folder.mkdir(parents=True, exist_ok=True)
            with os.scandir(folder) as entries:
                found = sorted((e.stat().st_mtime_ns, e.stat().st_size, e.name)
                               for e in entries if e.is_file())
            self._kept = found  # sorted: a heap
            self._bytes = sum(size for _, size, _ in found)

    def register(self, done: Callable[[str], bool]) -> None:
        """A gate of this folder, by its test of whether it is done with a file's name."""
        with self._lock:
            self._done.append(done)

    def read(self, names: Iterable[str]) -> None:
        """A reader has read these files; take out of the site's folder those every reader
        has read."""
        if self.policy.mode == "keep":
            return
        with self._lock:
            for name in names:
                if all(done(name) for done in self._done):
                    self._take(name)
        self.prune()

    def where(self, name: str) -> Path:
        """Where a file of the site's folder is now: there still, or in the archive."""
        landed = self.landing / name
        archived = self.folder / name
        return archived if not landed.exists() and archived.exists() else landed

    def _take(self, name: str) -> None:
        source = self.landing / name
        try:
            if self.policy.mode == "delete":
                source.unlink()
            else:
                stat = source.stat()
                shutil.move(source, self.folder / name)  # a rename, or a copy across disks
                heapq.heappush(self._kept, (stat.st_mtime_ns, stat.st_size, name))
                self._bytes += stat.st_size
        except FileNotFoundError:
            return  # taken out already (by an earlier run, or by the operator)
        self.moved += 1

    def prune(self) -> None:
        """Delete the archived files past the retention, then the oldest while the archive
        holds more than its bound (at most every ``PRUNE_EVERY_S`` within the bound)."""
        with self._lock:
            now = time.monotonic()
            if now - self._pruned < PRUNE_EVERY_S and self._bytes <= self.policy.max_bytes:
                return
            self._pruned = now
            oldest = time.time_ns() - int(self.policy.retention_s * 1e9)
            while self._kept and (self._kept[0][0] < oldest
                                  or self._bytes > self.policy.max_bytes):
                _, size, name = heapq.heappop(self._kept)
                self._bytes -= size
                with contextlib.suppress(FileNotFoundError):
                    (self.folder / name).unlink()

    @property
    def archived_bytes(self) -> int:
        return self._bytes
