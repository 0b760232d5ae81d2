"""A local stage's windows in plain Python: which are open, the watermark, what is handed on.

:class:`OpenWindows` holds the partials of every window a stage has not closed, merges each
micro-batch's rows into them, and hands on (``emit``) each window the watermark closes. It
decides lateness (a row for a window the watermark has closed is dropped and its records
counted late) and keeps the stage's snapshot. Nothing here knows of Spark, so it is tested
without it.

The watermark is the largest event time the site has read, less the window's delay. The
stage judges the rows of each file of a micro-batch against the watermark of the files read
before it (:meth:`LocalStage._merge <jetstream.stage.job.LocalStage._merge>`): the reference
executor's rule, so how files fall into micro-batches changes nothing; the batch's largest
event time moves :attr:`OpenWindows.latest` afterwards (:meth:`OpenWindows.advance`).

Early (``emit_early``, a live stage's): once the event time read passes a window's end by
``early_ms`` (the window's ``early``, half the watermark delay by default), the window is
handed on whole while still open, so
that its partial crosses a thin link while the watermark waits; the receiver takes it as final
once this input's watermark passes the window's end. If records for it come before the
watermark closes it, it is handed on again when it closes, whole, under the next revision; if
none come, nothing more is handed on.

An idle input (:meth:`OpenWindows.close` with no watermark, ``idle``) hands on its open
windows before the watermark closes them, as provisional ones (``emit_idle``): records for
them may still come, so they are not final. Such a window is kept until the watermark passes
it: records for it that come later are merged into it (the reference executor takes them
too: the watermark had not passed), and the whole window is handed on again with the next
revision (0, 1, 2, ...), which replaces the earlier one downstream; if none come, it is
handed on again unchanged, under the next revision, once the watermark passes it: final.

The snapshot (:meth:`OpenWindows.save`) holds the windows still open (and which were handed
on early, under which revision), those handed on because the input went idle, the watermark
and the id of the micro-batch it follows, written atomically.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.partials import PartialBatch
from jetstream.errors import DataError
from jetstream.formats import file_name, landing_key
from jetstream.operators import WindowAggregate, early_after
from jetstream.v1 import dataplane_pb2 as pb

__all__ = ["Emit", "OpenWindows"]

log = logging.getLogger(__name__)

# (window, rows, events, revision): a window handed on again (revision 1, 2, ...) is whole.
Emit = Callable[[tuple[int, int], list[dict[str, Any]], int, int], None]
Groups = dict[tuple[Any, ...], list[Any]]

_SNAPSHOT_VERSION = 2


class OpenWindows:
    """The open windows of one query's local stage (see the module's docstring).

    ``partial`` is the stage's partial aggregate (its keys and aggregates), ``delay_ms`` the
    window's watermark delay; ``emit`` gets each window handed on, ``emit_early`` (if given)
    each handed on before the watermark closes it, once the event time read is ``early_ms``
    past its end (None: half the delay; :meth:`hand_on_early`).
    """

    def __init__(self, query: str, partial: WindowAggregate, delay_ms: int,
                 emit: Emit, emit_early: Emit | None = None, early_ms: int | None = None,
                 emit_idle: Emit | None = None) -> None:
        self.query, self.partial, self.delay_ms, self.emit = query, partial, delay_ms, emit
        self.emit_early, self.emit_idle = emit_early, emit_idle
        self.early_ms = early_after(delay_ms, early_ms)
        self.latest: int | None = None  # the largest event time read so far
        self.done = -1  # the last micro-batch the snapshot holds
        #: The windows starting at or before this are withheld: a stage that joined a reader
        #: under way (:mod:`jetstream.stage.reader`) missed their earlier records (None: none).
        self.joined_ms: int | None = None
        self._open: dict[tuple[int, int], Groups] = {}
        self._events: Counter[tuple[int, int]] = Counter()
        # Windows handed on before the watermark closed them: their rows, events and revision.
        self._flushed: dict[tuple[int, int], tuple[Groups, int, int]] = {}
        # Open windows handed on early: the revision, and whether records came since.
        self._early: dict[tuple[int, int], tuple[int, bool]] = {}
        # Flushed windows handed on as provisional (``emit_idle``): again once closed.
        self._idle: set[tuple[int, int]] = set()
        # Each window's encoding in the last snapshot, by kind ("open", "flushed"), and the
        # windows changed since: a snapshot encodes again only those.
        self._saved: dict[tuple[str, tuple[int, int]], str] = {}
        self._changed: set[tuple[int, int]] = set()

    @property
    def watermark(self) -> int | None:
        """Every window ending at or before this has been handed on (None: nothing read)."""
        return None if self.latest is None else self.latest - self.delay_ms

    def file_watermarks(self, files: Mapping[str | None, tuple[int, int | None]]
                        ) -> dict[str | None, int | None]:
        """The watermark each file of a micro-batch is judged against: the largest event
        time of the files read before it (in the batches before, and in this one before it
        in landing order: :func:`jetstream.formats.landing_key`), less the delay. ``files``
        maps each file (its path or URI; None: the batch's records have no file) to when it
        landed (epoch ms) and its largest event time (None: it has no valid record)."""
        def order(file: str | None) -> tuple[int, str]:
            return landing_key(files[file][0], file_name(file or ""))
        reached, watermarks = self.latest, {}
        for file in sorted(files, key=order):
            watermarks[file] = None if reached is None else reached - self.delay_ms
            latest = files[file][1]
            if latest is not None:
                reached = latest if reached is None else max(reached, latest)
        return watermarks

    def closed(self, window: tuple[int, int]) -> bool:
        """Whether the watermark has closed ``window``: rows for it now are late."""
        watermark = self.watermark
        return watermark is not None and window[1] <= watermark

    def add(self, window: tuple[int, int], key: tuple[Any, ...], accs: list[Any],
            events: int) -> None:
        """Merge one group's accumulators (``accs``, which are taken over) into ``window``."""
        groups = self._open.setdefault(window, {})
        current = groups.get(key)
        groups[key] = accs if current is None else self._merged(current, accs)
        self._events[window] += events
        self._touch(window)

    def merge_into(self, window: tuple[int, int], key: tuple[Any, ...], i: int,
                   acc: Any) -> None:
        """Merge ``acc`` into the ``i``-th accumulator of a group :meth:`add` made."""
        accs = self._open[window][key]
        accs[i] = self.partial.aggregates[i][1].merge(accs[i], acc)
        self._touch(window)

    def _touch(self, window: tuple[int, int]) -> None:
        self._changed.add(window)
        if window in self._early:
            self._early[window] = (self._early[window][0], True)

    def advance(self, latest: int | None) -> None:
        """A micro-batch read event times up to ``latest`` (None: it read none)."""
        if latest is not None:
            self.latest = latest if self.latest is None else max(self.latest, latest)

    def close(self, watermark: int | None, idle: bool = False) -> None:
        """Hand on every window ending at or before ``watermark`` (None: every open window;
        those the watermark has not closed are kept, whole, for records that come later, and
        with ``idle`` handed on as provisional ones: the input went idle, it has not ended)."""
        for window in sorted(self._open):
            if watermark is not None and window[1] > watermark:
                continue
            self._changed.add(window)
            groups, events, revision = self._open.pop(window), self._events.pop(window, 0), 0
            if window in self._flushed:  # handed on before: merge, hand on whole again
                before, before_events, last = self._flushed.pop(window)
                self._idle.discard(window)
                for key, accs in before.items():
                    groups[key] = accs if key not in groups else self._merged(accs, groups[key])
                events, revision = events + before_events, last + 1
            elif window in self._early:
                last, changed = self._early.pop(window)
                if not changed:  # handed on whole already: the watermark makes it final
                    if self._idle_and_open(window, watermark):
                        self._flushed[window] = (groups, events, last)
                    continue
                revision = last + 1
            rows = self.rows(groups)
            kept = self._idle_and_open(window, watermark)
            emit = self.emit_idle if idle and kept and self.emit_idle else self.emit
            emit(window, rows, events, revision)
            if kept:  # kept for records to come
                self._flushed[window] = (self._detached(rows), events, revision)
                if emit is self.emit_idle:
                    self._idle.add(window)
        for window in [w for w in self._flushed if self.closed(w)]:
            groups, events, revision = self._flushed.pop(window)
            if window in self._idle:  # handed on provisional, nothing came since: final
                self._idle.discard(window)
                self._changed.add(window)
                self.emit(window, self.rows(groups), events, revision + 1)

    def _idle_and_open(self, window: tuple[int, int], watermark: int | None) -> bool:
        """Whether ``close`` hands ``window`` on because the input went idle, before the
        watermark closed it: it is kept for records to come."""
        return watermark is None and not self.closed(window)

    def hand_on_early(self) -> None:
        """Hand on (``emit_early``) every open window the event time read has passed by
        ``early_ms``, once: what comes for it after goes when it closes."""
        if self.emit_early is None or self.latest is None or self.early_ms >= self.delay_ms:
            return
        reached = self.latest - self.early_ms
        for window, groups in sorted(self._open.items()):
            if (window[1] > reached or self.closed(window) or window in self._flushed
                    or window in self._early):
                continue
            rows = self.rows(groups)
            self.emit_early(window, rows, self._events[window], 0)
            # What was handed on is the receiver's now: merge what comes into copies.
            self._open[window] = self._detached(rows)
            self._changed.add(window)
            self._early[window] = (0, False)

    def close_passed(self) -> None:
        """Hand on every window the watermark has closed."""
        if self.watermark is not None:
            self.close(self.watermark)

    def rows(self, groups: Groups) -> list[dict[str, Any]]:
        """A window's groups as partial rows (accumulators compacted for the wire)."""
        aggregates = self.partial.aggregates
        return [dict(zip(self.partial.keys, key, strict=True)) | {
            name: agg.compact(acc) for (name, agg), acc in zip(aggregates, accs, strict=True)}
            for key, accs in groups.items()]

    def due_ms(self, next_end: int) -> int:
        """The least event time whose reading hands a window on: an open window's end plus
        the early hand-on's share of the delay (once handed on early, plus the delay); the
        same for the next window to open, ending at ``next_end``."""
        early = self.delay_ms
        if self.emit_early is not None:
            early = min(early, self.early_ms)
        return min([next_end + early,
                    *(end + (self.delay_ms if (start, end) in self._early else early)
                      for start, end in self._open)])

    def open_windows(self) -> list[tuple[int, int]]:
        return sorted(self._open)

    def _detached(self, rows: Iterable[Mapping[str, Any]]) -> Groups:
        """Groups equal to ``rows`` (handed on) that share no accumulator with them: some
        accumulators merge in place."""
        aggregates = self.partial.aggregates
        return {tuple(row[k] for k in self.partial.keys):
                [agg.merge(agg.create(), row[name]) for name, agg in aggregates]
                for row in rows}

    def _merged(self, accs: list[Any], other: Iterable[Any]) -> list[Any]:
        return [agg.merge(a, b) for (_, agg), a, b in
                zip(self.partial.aggregates, accs, other, strict=True)]

    # -- the snapshot -------------------------------------------------------------------------
    def save(self, path: Path, batch_id: int) -> None:
        """Write the snapshot after micro-batch ``batch_id``, atomically and durably."""
        state = {"version": _SNAPSHOT_VERSION, "query": self.query, "batch": batch_id,
                 "latest": self.latest, "joined": self.joined_ms,
                 "windows": [[*w, self._events[w], -1, self._saving("open", w, g)]
                             for w, g in sorted(self._open.items())],
                 "flushed": [[*w, events, revision, self._saving("flushed", w, g)]
                             for w, (g, events, revision) in sorted(self._flushed.items())],
                 "early": [[*w, revision, changed]
                           for w, (revision, changed) in sorted(self._early.items())],
                 "idle": [list(w) for w in sorted(self._idle)]}
        temporary = path.with_name(f".{path.name}.tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        with temporary.open("w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        self.done = batch_id
        self._saved = {k: v for k, v in self._saved.items()
                       if k[1] in (self._open if k[0] == "open" else self._flushed)}
        self._changed.clear()

    def _saving(self, kind: str, window: tuple[int, int], groups: Groups) -> str:
        """A window's encoding for the snapshot: the last one's, if it has not changed."""
        key = (kind, window)
        if window in self._changed or key not in self._saved:
            self._saved[key] = self._encode(window, groups)
        return self._saved[key]

    def restore(self, path: Path) -> None:
        """Load the snapshot at ``path``.

        Raises
        ------
        DataError
            If it cannot be read, or is not a snapshot of this query in this version.
        """
        try:
            state = json.loads(path.read_text())
            if state.get("version") != _SNAPSHOT_VERSION or state.get("query") != self.query:
                msg = f"it is not a version {_SNAPSHOT_VERSION} snapshot of {self.query}"
                raise DataError(msg)
            for start, end, events, _, encoded in state["windows"]:
                self._open[(start, end)] = self._decode(encoded)
                self._events[(start, end)] = events
            for start, end, events, revision, encoded in state["flushed"]:
                self._flushed[(start, end)] = (self._decode(encoded), events, revision)
            for start, end, revision, changed in state.get("early", []):
                self._early[(start, end)] = (revision, changed)
            self._idle = {(start, end) for start, end in state.get("idle", [])}
            self.latest, self.done = state["latest"], state["batch"]
            self.joined_ms = state.get("joined")
        except (OSError, ValueError, KeyError, TypeError, DataError) as e:
            msg = f"{self.query}: cannot restore the local stage from {path}: {e}"
            raise DataError(msg) from e
        log.info("%s: restored %d open windows at micro-batch %d from %s", self.query,
                 len(self._open), self.done, path)

    def _encode(self, window: tuple[int, int], groups: Groups) -> str:
        batch = PartialBatch(self.query, window, "snapshot", tuple(self.rows(groups)))
        return base64.b64encode(encode_batch(batch, self.partial).SerializeToString()).decode()

    def _decode(self, encoded: str) -> Groups:
        message = pb.PartialBatch.FromString(base64.b64decode(encoded))
        return self._detached(decode_batch(message, self.partial).rows)
