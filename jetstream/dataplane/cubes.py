"""The site-local cube store: the partials a site sends, kept durably in SQLite, rolled up.

A :class:`CubeStore` holds each partial batch a site sends upward as its wire message,
until its parent acks it and then for as long as retention says. It serves three needs:
*upstream backup* (what a parent has not acked survives a restart of the site process, and
a new sender sends it first), *backfill* (the partials of the last hour, at any resolution
kept) and *history* (the same window an hour, a day ago). Finished windows are merged into
coarser ones (e.g. 10 s -> 1 min -> 1 h) with the aggregates' own merge, and each
resolution is kept for its own time. See ``docs/cubes.md`` for why SQLite.

Times are event times in epoch milliseconds; ``now_ms`` is whatever the caller calls now
(the runtime passes the wall clock).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sqlite3
import threading
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from jetstream.dataplane.codec import MAX_PAYLOAD_BYTES, decode_batch, encode_batch
from jetstream.dataplane.merger import WindowMerger
from jetstream.dataplane.partials import PartialBatch
from jetstream.errors import DataError, PlanError
from jetstream.operators import WindowAggregate
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.windows import WindowSpec, parse_duration

__all__ = ["DEFAULT_RETENTION", "INBOX", "CubeStore", "parse_retention"]

log = logging.getLogger(__name__)

#: Resolution (ms) -> how long (s) windows of it are kept: 10 s windows for an hour, 1 min
#: rollups for a day, 1 h rollups for 30 days.
DEFAULT_RETENTION: Mapping[int, float] = {10_000: 3600.0, 60_000: 86_400.0,
                                           3_600_000: 30 * 86_400.0}

#: The destination of the batches a site merges (its children's, as they arrive, and its own
#: local stage's): its inbox, kept so that a merger restarted after a crash has again what the
#: site had acked. Not part of history or rollups: the site's own sent windows are.
INBOX = "<inbox>"

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS partials (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- grows with every write: the order things came
    query TEXT NOT NULL,
    origin TEXT NOT NULL,
    partition INTEGER NOT NULL,
    window_start INTEGER NOT NULL,
    window_end INTEGER NOT NULL,
    resolution INTEGER NOT NULL,           -- ms: a sent window's length, or a rollup's
    revision INTEGER NOT NULL,
    sequence INTEGER NOT NULL,
    destination TEXT NOT NULL,             -- who must ack it; '' for a rollup
    held INTEGER NOT NULL,                 -- 1 until the destination acks it
    inputs INTEGER NOT NULL DEFAULT 0,     -- a rollup: the newest id among what it merges
    message BLOB NOT NULL,                 -- a jetstream.v1.PartialBatch
    UNIQUE (destination, query, window_start, origin, partition, sequence, revision,
            resolution)
);
CREATE INDEX IF NOT EXISTS partials_by_window ON partials (query, resolution, window_start);
CREATE INDEX IF NOT EXISTS partials_held ON partials (destination, id) WHERE held = 1;
"""


class CubeStore:
    """A site's partials in one SQLite file; safe to share between threads.

    Parameters
    ----------
    path
        The database file; created, with its folder, if missing.
    retention
        Resolution in ms -> seconds to keep windows of it after they end. A window of a
        resolution not listed is kept as long as the coarsest listed one not coarser than it
        (the finest listed, if it is finer than all). The listed resolutions coarser than a
        query's windows are the levels its windows roll up into.
    max_rows, max_bytes
        Bounds on the whole store: past them, :meth:`expire` drops the oldest windows that
        nobody waits for, whatever their retention.

    Raises
    ------
    DataError
        If the retention or bounds are not positive, or the file cannot be opened as a
        cube store.
    """

    def __init__(self, path: str | Path, *, retention: Mapping[int, float] = DEFAULT_RETENTION,
                 max_rows: int = 200_000, max_bytes: int = 1 << 30) -> None:
        self.path = Path(path)
        self.retention = _checked(retention)
        if max_rows <= 0 or max_bytes <= 0:
            msg = f"cube store {self.path}: max_rows and max_bytes must be positive"
            raise DataError(msg)
        self.max_rows, self.max_bytes = max_rows, max_bytes
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit; each write is one explicit transaction (see _transaction).
            self._db = sqlite3.connect(self.path, timeout=10, isolation_level=None,
                                       check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            msg = f"cube store {self.path}: cannot open it: {e}"
            raise DataError(msg) from None
        try:
            with self._transaction() as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version not in (0, _SCHEMA_VERSION):
                    msg = (f"cube store {self.path}: schema version {version}, this "
                           f"jetstream reads {_SCHEMA_VERSION}; move the file away")
                    raise DataError(msg)
            # WAL: a commit is one append, a reader never blocks the writer, and a process
            # killed at any point leaves every commit intact. NORMAL: a commit is not
            # fsynced, except a durable one (see _transaction), which also makes every commit
            # before it survive a machine that loses power.
            with self._lock:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.executescript(_SCHEMA)
                self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        except DataError:
            self._db.close()
            raise
        except sqlite3.Error as e:
            self._db.close()
            msg = f"cube store {self.path}: not a cube store: {e}"
            raise DataError(msg) from None

    # -- upstream backup ------------------------------------------------------------------------
    def keep(self, batch: pb.PartialBatch, destination: str) -> None:
        """Keep ``batch`` until ``destination`` acks it; a batch with the same identity
        replaces it and counts as kept anew (as
        :class:`~jetstream.dataplane.transport.PartialSender` sends it anew)."""
        if not destination or destination == INBOX:
            msg = f"cube store: batch of {batch.query or '?'} kept for no destination"
            raise DataError(msg)
        self._put(batch, destination, held=True, durable=False)

    def receive(self, batch: pb.PartialBatch) -> None:
        """Keep a batch the site is about to merge, in its inbox, before it is acked; it
        expires like the rest (see :data:`INBOX`). This is the one commit on a window's way
        through a site that waits for the disk (see :meth:`_transaction`)."""
        self._put(batch, INBOX, held=False, durable=True)

    def received(self, query: str, span_ms: int) -> list[pb.PartialBatch]:
        """What the inbox holds of ``query`` for windows ending less than ``span_ms`` before
        the newest one's end (event time), in the order it came."""
        with self._transaction() as db:
            rows = db.execute(
                "SELECT message FROM partials WHERE destination = ?1 AND query = ?2 "
                "AND window_end > (SELECT MAX(window_end) FROM partials WHERE destination = ?1 "
                "AND query = ?2) - ?3 ORDER BY id", (INBOX, query, span_ms))
            return [self._message(raw) for raw, in rows.fetchall()]

    def _put(self, batch: pb.PartialBatch, destination: str, held: bool,
             durable: bool) -> None:
        if not batch.query or not batch.origin or batch.window_end_ms <= batch.window_start_ms:
            msg = (f"cube store: batch from {batch.origin or '?'} for {batch.query or '?'} "
                   f"has no query, origin or window")
            raise DataError(msg)
        with self._transaction(durable=durable) as db:
            db.execute(
                "INSERT OR REPLACE INTO partials (query, origin, partition, window_start, "
                "window_end, resolution, revision, sequence, destination, held, message) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (batch.query, batch.origin, batch.partition, batch.window_start_ms,
                 batch.window_end_ms, batch.window_end_ms - batch.window_start_ms,
                 batch.revision, batch.sequence, destination, int(held),
                 batch.SerializeToString()))

    def acked(self, ack: pb.Ack, destination: str) -> bool:
        """``destination`` acked a batch: nothing waits for it any more. Whether one was held."""
        with self._transaction() as db:
            done = db.execute(
                "UPDATE partials SET held = 0 WHERE held = 1 AND destination = ? AND query = ? "
                "AND window_start = ? AND origin = ? AND partition = ? AND sequence = ? "
                "AND revision = ?", (destination, ack.query, ack.window_start_ms, ack.origin,
                                     ack.partition, ack.sequence, ack.revision))
            return done.rowcount > 0

    def unacked(self, destination: str) -> list[pb.PartialBatch]:
        """What ``destination`` has not acked, in the order it was kept."""
        with self._transaction() as db:
            rows = db.execute("SELECT message FROM partials WHERE held = 1 AND destination = ? "
                              "ORDER BY id", (destination,)).fetchall()
        return [self._message(raw) for raw, in rows]

    def has_sent(self, destination: str, query: str, window: tuple[int, int],
                 origin: str, revision: int = 0) -> bool:
        """Whether a partial of ``origin`` for ``window``, of ``revision`` or a later one, was
        kept for ``destination``: a restarted local stage hands on again what it may have
        handed on already."""
        with self._transaction() as db:
            return db.execute(
                "SELECT 1 FROM partials WHERE destination = ? AND query = ? AND origin = ? "
                "AND window_start = ? AND window_end = ? AND revision >= ? LIMIT 1",
                (destination, query, origin, *window, revision)).fetchone() is not None

    def release(self, destination: str) -> int:
        """Stop holding what ``destination`` has not acked (nobody will: e.g. a replay starts
        over); it stays for history and expires like the rest. How many were held."""
        with self._transaction() as db:
            return db.execute("UPDATE partials SET held = 0 WHERE held = 1 AND destination = ?",
                              (destination,)).rowcount

    # -- backfill and history -------------------------------------------------------------------
    def windows(self, query: str, aggregate: WindowAggregate, start_ms: int, end_ms: int,
                resolution_ms: int | None = None, origins: Collection[str] | None = None
                ) -> list[PartialBatch]:
        """The partials of ``query`` for the windows inside ``[start_ms, end_ms)``, decoded,
        by window start: per window, origin and partition only the newest revision (see
        :meth:`messages`).

        Raises
        ------
        DataError
            If a kept partial does not decode with ``aggregate``.
        """
        return [decode_batch(message, aggregate) for message in
                self.messages(query, start_ms, end_ms, resolution_ms, origins)]

    def messages(self, query: str, start_ms: int, end_ms: int,
                 resolution_ms: int | None = None, origins: Collection[str] | None = None
                 ) -> list[pb.PartialBatch]:
        """The kept partials of ``query`` for the windows inside ``[start_ms, end_ms)``, as
        they were kept, by window start: per window, origin and partition only the newest
        revision.

        ``origins`` None: the windows the site sent upward (``resolution_ms`` None), or
        their rollups of that length. ``origins`` given: the windows those inputs of the
        site's merge made — its own local stages', the site's history — as they came
        (``resolution_ms`` None), or their rollups of that length (see :meth:`roll_up`).
        """
        where, args = ["query = ?", "window_start >= ?", "window_end <= ?"], [
            query, start_ms, end_ms]
        if origins is None:
            where.append("destination NOT IN ('', ?)" if resolution_ms is None
                         else "destination != ?")
            args.append(INBOX)
        else:
            where.append(f"origin IN ({', '.join('?' * len(origins))})")
            args += list(origins)
            where.append("destination = ?" if resolution_ms is None else "destination = ''")
            args += [INBOX] if resolution_ms is None else []
        if resolution_ms is not None:
            where.append("resolution = ?")
            args.append(resolution_ms)
        with self._transaction() as db:
            rows = db.execute(
                f"SELECT window_start, window_end, origin, partition, revision, id, message "
                f"FROM partials WHERE {' AND '.join(where)} "
                f"ORDER BY window_start, window_end, origin, partition, revision, id",
                args).fetchall()
        newest = {tuple(row[:4]): row[6] for row in rows}  # the order puts the newest last
        return [self._message(raw) for raw in newest.values()]

    def origins(self, query: str) -> list[str]:
        """Every origin of a window of ``query`` the store keeps."""
        with self._transaction() as db:
            return [origin for origin, in db.execute(
                "SELECT DISTINCT origin FROM partials WHERE query = ?", (query,))]

    # -- rollups --------------------------------------------------------------------------------
    def roll_up(self, query: str, aggregate: WindowAggregate, window: WindowSpec,
                now_ms: int, origins: Collection[str] | None = None) -> int:
        """Merge the finished windows of ``query`` into each coarser resolution of the
        retention, finest first; a rollup whose windows changed since (a correction) is
        merged again. How many rollups were written. ``origins``: roll up the windows those
        inputs of the site's merge made (its own local stages: the site's history), kept
        in its inbox; None: the windows the site sent upward.

        Only windows that tile time roll up: tumbling ones, and of sliding ones those that
        start at a multiple of their size (when the size is a multiple of the slide; other
        sliding windows stay as they are). A rollup is made (or made again) only while its
        finer windows are all still kept, and once it has ended by ``now_ms``; a level that
        is not a multiple of the one below is skipped.
        """
        if window.size_ms % window.every_ms:
            return 0
        written, finer = 0, window.size_ms
        for level in sorted(r for r in self.retention if r > window.size_ms):
            if level % finer:
                continue
            horizon = now_ms - int(self._retention_of(finer) * 1000)
            written += self._roll(query, aggregate, finer, level, finer == window.size_ms,
                                  horizon, now_ms, origins)
            finer = level
        return written

    def _roll(self, query: str, aggregate: WindowAggregate, finer: int, level: int, sent: bool,
              horizon: int, now_ms: int, origins: Collection[str] | None) -> int:
        first = -(-horizon // level) * level  # the first rollup whose windows are all kept
        last = now_ms - now_ms % level
        kind = "destination = ''"
        if sent:
            kind = ("window_start % resolution = 0 AND " + (
                f"destination NOT IN ('', '{INBOX}')" if origins is None else
                f"destination = '{INBOX}'"))
        if origins is not None:
            kind += f" AND origin IN ({', '.join('?' * len(origins))})"
        with self._transaction() as db:
            found = db.execute(
                f"SELECT origin, partition, window_start, revision, id FROM partials "
                f"WHERE query = ? AND resolution = ? AND window_start >= ? "
                f"AND window_end <= ? AND {kind} ORDER BY revision, id",
                (query, finer, first, last, *(origins or ())))
            groups: dict[tuple[str, int, int], dict[int, int]] = {}  # -> window -> newest id
            changed: dict[tuple[str, int, int], int] = {}  # -> the newest id of any row
            for origin, partition, start, _, row_id in found:
                group = (origin, partition, start - start % level)
                groups.setdefault(group, {})[start] = row_id
                changed[group] = max(changed.get(group, 0), row_id)
            made = dict(((o, p, s), i) for o, p, s, i in db.execute(
                "SELECT origin, partition, window_start, inputs FROM partials WHERE query = ? "
                "AND resolution = ? AND destination = '' AND window_start >= ?",
                (query, level, first)))
        written = 0
        for group, ids in sorted(groups.items()):
            if made.get(group, 0) >= changed[group]:
                continue  # merged already, and nothing in it has changed since
            rollup = self._merge(query, aggregate, group, level, list(ids.values()))
            if rollup is not None:
                written += self._put_rollup(rollup, level, changed[group])
        return written

    def _merge(self, query: str, aggregate: WindowAggregate, group: tuple[str, int, int],
               level: int, ids: list[int]) -> pb.PartialBatch | None:
        origin, partition, start = group
        with self._transaction() as db:
            raw = [row[0] for i in ids for row in db.execute(
                "SELECT message FROM partials WHERE id = ?", (i,))]
        batches = []
        for message in raw:
            try:
                batches.append(decode_batch(self._message(message), aggregate))
            except DataError as e:  # e.g. kept by an earlier query of the same name
                log.warning("cube store: %s: left out of its rollup", e)
        if not batches:
            return None
        # The finer windows are the merger's inputs, all present: it merges them at once.
        window = (start, start + level)
        merger = WindowMerger(aggregate, map(str, range(len(batches))), deadline_s=0.0)
        for i, batch in enumerate(batches):
            merger.add(dataclasses.replace(batch, window=window, origin=str(i)))
        (merged,) = merger.ready()
        message = encode_batch(PartialBatch(
            query, window, origin, merged.rows, partition=partition, events=merged.events,
            error_bound=merged.error_bound, complete=merged.complete,
            level=max(b.level for b in batches), covers=merged.covers,
            wan_bytes=merged.wan_bytes, closed_at_ms=merged.closed_at_ms, slack=merged.slack,
            omitted=merged.omitted, cut=merged.cut, complete_rows=merged.complete_rows,
            ranges=merged.ranges, rolled_up=merged.rolled_up, warnings=merged.warnings),
            aggregate)
        if len(message.payload) > MAX_PAYLOAD_BYTES:
            log.warning("cube store: the %d ms rollup of %s at %d is too large to keep",
                        level, query, start)
            return None
        return message

    def _put_rollup(self, rollup: pb.PartialBatch, level: int, inputs: int) -> int:
        with self._transaction() as db:
            (newer,) = db.execute(
                "SELECT COUNT(*) FROM partials WHERE destination = '' AND query = ? "
                "AND resolution = ? AND window_start = ? AND origin = ? AND partition = ? "
                "AND inputs >= ?", (rollup.query, level, rollup.window_start_ms, rollup.origin,
                                    rollup.partition, inputs)).fetchone()
            if newer:
                return 0  # another call merged the same windows or newer ones meanwhile
            # REPLACE gives it a new id, so the next level up sees it changed.
            db.execute(
                "INSERT OR REPLACE INTO partials (query, origin, partition, window_start, "
                "window_end, resolution, revision, sequence, destination, held, inputs, "
                "message) VALUES (?, ?, ?, ?, ?, ?, 0, 0, '', 0, ?, ?)",
                (rollup.query, rollup.origin, rollup.partition, rollup.window_start_ms,
                 rollup.window_end_ms, level, inputs, rollup.SerializeToString()))
        return 1

    # -- retention ------------------------------------------------------------------------------
    def expire(self, now_ms: int, query: str | None = None) -> int:
        """Drop windows past their retention (of ``query`` only, if given: each query's
        "now" is its own event time), then the oldest until the store is within
        ``max_rows`` and ``max_bytes``; never one a destination has not acked. How many."""
        dropped = 0
        which, args = ("", ()) if query is None else (" AND query = ?", (query,))
        with self._transaction() as db:
            for (resolution,) in db.execute("SELECT DISTINCT resolution FROM partials").fetchall():
                cutoff = now_ms - int(self._retention_of(resolution) * 1000)
                dropped += db.execute("DELETE FROM partials WHERE held = 0 AND resolution = ? "
                                      f"AND window_end < ?{which}",
                                      (resolution, cutoff, *args)).rowcount
            rows, size = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(message)), 0) FROM partials").fetchone()
            if rows > self.max_rows or size > self.max_bytes:
                doomed = []
                for row_id, length in db.execute(
                        "SELECT id, LENGTH(message) FROM partials WHERE held = 0 "
                        "ORDER BY window_end, id"):
                    if rows <= self.max_rows and size <= self.max_bytes:
                        break
                    doomed.append((row_id,))
                    rows, size = rows - 1, size - length
                db.executemany("DELETE FROM partials WHERE id = ?", doomed)
                dropped += len(doomed)
        return dropped

    def kept_for(self, resolution: int) -> float:
        """Seconds windows of ``resolution`` are kept after they end."""
        return self._retention_of(resolution)

    def _retention_of(self, resolution: int) -> float:
        listed = [r for r in self.retention if r <= resolution] or [min(self.retention)]
        return self.retention[max(listed)]

    def __len__(self) -> int:
        with self._transaction() as db:
            count: int = db.execute("SELECT COUNT(*) FROM partials").fetchone()[0]
            return count

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> CubeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self, *, durable: bool = False) -> Iterator[sqlite3.Connection]:
        """One transaction, under the lock; SQLite's errors come out as DataError.

        Every commit survives the process's death. A ``durable`` one is fsynced, and with
        it every commit before it: a batch in the inbox, which holds every window a site
        merges (a child's, before its ack; its own stage's, before the stage's snapshot
        forgets it). The rest — a batch kept for the parent, an ack, rollups, expiry — does
        not wait for the disk: after a power loss the inbox still has what a lost keep held,
        and a restarted run sends on again what it has not sent (``runtime``); a lost ack
        means a batch sent again, which the receiver drops. So a window pays one fsync in
        each site on its way up."""
        with self._lock:
            try:
                # (SQLite takes the level only outside a transaction.)
                self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as e:
                msg = f"cube store {self.path}: {e}"
                raise DataError(msg) from None

    def _message(self, raw: bytes) -> pb.PartialBatch:
        try:
            return pb.PartialBatch.FromString(raw)
        except Exception as e:  # protobuf's DecodeError, which it does not export typed
            msg = f"cube store {self.path}: a kept partial is unreadable: {e}"
            raise DataError(msg) from None


def parse_retention(text: str) -> dict[int, float]:
    """``"10s=1h,1m=1d,1h=30d"`` as resolution (ms) -> seconds to keep.

    Raises
    ------
    DataError
        If a part is not ``RESOLUTION=DURATION`` with positive durations.
    """
    out: dict[int, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        resolution, _, keep = part.partition("=")
        try:
            out[parse_duration(resolution, "resolution")] = parse_duration(keep, "keep") / 1000
        except PlanError as e:
            msg = f"retention {part!r}: {e}; write RESOLUTION=DURATION, e.g. '10s=1h,1m=1d'"
            raise DataError(msg) from None
    return _checked(out)


def _checked(retention: Mapping[int, float]) -> dict[int, float]:
    if not retention:
        msg = "cube store: retention is empty; give at least one resolution, e.g. {10000: 3600}"
        raise DataError(msg)
    for resolution, seconds in retention.items():
        if not isinstance(resolution, int) or resolution <= 0:
            msg = f"cube store: resolution {resolution!r} must be a positive number of ms"
            raise DataError(msg)
        if not (isinstance(seconds, int | float) and 0 < seconds < math.inf):
            msg = (f"cube store: retention of {resolution} ms windows must be a positive "
                   f"number of seconds, not {seconds!r}")
            raise DataError(msg)
    return dict(retention)
