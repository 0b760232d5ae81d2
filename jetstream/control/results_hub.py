"""The results hub: each query's window results, to every subscriber as they arrive, kept in
a state folder across restarts (see :class:`ResultsHub`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

from jetstream.results import WindowResult

__all__ = ["MAX_RESULTS", "ResultsHub", "utc", "write_atomically"]

log = logging.getLogger(__name__)


#: The results kept per query (the newest); a subscriber further behind skips the older.
MAX_RESULTS = 10_000


class ResultsHub:
    """Window results per query, to every subscriber (StreamResults) as they arrive; the
    newest ``keep`` of each query. With a ``folder``, also appended there (one JSON line a
    result, a file a query) and read back when a restarted controller makes its hub.

    Exactly one result per (window, revision): a root that restarts merges its inbox again
    and publishes windows it had published, from revision 0. A repeat of what the window's
    newest result says is dropped; anything else under a revision already used goes out under
    the next one: the root's newest word on the window is what a reader keeps. A result
    that covers fewer sites than the window's newest is dropped: a root that took over from a
    dead one lacks what that one had merged, and would otherwise take back a whole answer.
    Once a window's newest result is final and exact, nothing else is taken for it: such a
    result equals the reference and no revision may change it (one that would is dropped,
    with a warning, and counted in ``changed_final``).
    """

    def __init__(self, folder: Path | None = None, keep: int = MAX_RESULTS) -> None:
        self._lock = threading.Condition()
        self._results: dict[str, list[WindowResult]] = {}
        self._dropped: dict[str, int] = {}  # query -> how many old results were let go
        self._closed: set[str] = set()
        # query -> window -> (its newest revision published, what that result said, how
        # many sites it covered, whether it was final and exact, whether every expected
        # site was among them)
        self._newest: dict[str, dict[tuple[int, int], tuple[int, str, int, bool, bool]]] = {}
        #: Results dropped because they would have changed a final, exact one.
        self.changed_final = 0
        self._folder, self._keep = folder, keep
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            for path in sorted(folder.glob("*.jsonl")):
                lines = path.read_text(encoding="utf-8").splitlines()
                kept = [r for line in lines if (r := _result(line, path)) is not None][-keep:]
                if len(kept) < len(lines):  # rewritten whole: appends start on a fresh line
                    write_atomically(path, "".join(_line(r) for r in kept))
                if kept:
                    self._results[kept[0].query] = kept
                    for result in kept:
                        self._admit(result)

    def _file(self, query: str) -> Path | None:
        if self._folder is None:
            return None
        return self._folder / f"{urllib.parse.quote(query, safe='')}.jsonl"

    def _admit(self, result: WindowResult) -> WindowResult | None:
        """``result`` as it may go out — None for a repeat of its window's newest result,
        renumbered for something else under a revision already used — noted as the newest."""
        said = _said(result)
        newest = self._newest.setdefault(result.query, {})
        window = (result.window_start, result.window_end)
        revision, before, covered, settled, _ = newest.get(window, (-1, "", 0, False, False))
        reporting = result.sites_reporting or 0
        if settled:  # the same again is a repeat; anything else would change it
            if said != before:
                self.changed_final += 1
                log.warning("query %s: a result of window %s dropped: it would change the "
                            "final one published before", result.query,
                            utc(result.window_start))
            return None
        if reporting < covered:
            log.info("query %s: a result of window %s covering %d sites dropped: %d did "
                     "before", result.query, utc(result.window_start), reporting, covered)
            return None
        if result.revision <= revision:
            if said == before:
                return None
            result = dataclasses.replace(result, revision=revision + 1)
        newest[window] = (result.revision, said, reporting, result.final and result.exact,
                          reporting >= (result.sites_expected or 0))
        return result

    def unsettled_from(self, query: str) -> int:
        """Where a root taking over must start again (epoch ms, a window start): the first
        window whose newest result is incomplete, or else the newest two windows published
        (a window published out of order may be missing before them); 0 with none."""
        with self._lock:
            newest = self._newest.get(query, {})
            if not newest:
                return 0
            start, end = max(newest)
            since = start - (end - start)
            incomplete = [w[0] for w, (*_, complete) in newest.items() if not complete]
            return min([since, *incomplete])

    def publish(self, result: WindowResult) -> None:
        with self._lock:
            admitted = self._admit(result)
            if admitted is None:
                return
            result = admitted
            kept = self._results.setdefault(result.query, [])
            kept.append(result)
            path = self._file(result.query)
            if len(kept) >= 2 * self._keep:  # let the oldest half go, in the file too
                self._dropped[result.query] = self._dropped.get(result.query, 0) + len(
                    kept) - self._keep
                del kept[:-self._keep]
                oldest = min(r.window_start for r in kept)  # forget the windows let go
                newest = self._newest[result.query]
                for window in [w for w in newest if w[0] < oldest]:
                    del newest[window]
                if path is not None:
                    write_atomically(path, "".join(_line(r) for r in kept))
            elif path is not None:
                with path.open("a", encoding="utf-8") as out:
                    out.write(_line(result))
            self._lock.notify_all()

    def newest(self, query: str, n: int) -> list[WindowResult]:
        """The newest ``n`` results of ``query``, oldest first (corrections included)."""
        with self._lock:
            return self._results.get(query, [])[-n:]

    def reset(self, query: str) -> None:
        """Forget a finished run's results, for a new query of the same name."""
        with self._lock:
            self._results.pop(query, None)
            self._dropped.pop(query, None)
            self._newest.pop(query, None)
            self._closed.discard(query)
            path = self._file(query)
            if path is not None:
                path.unlink(missing_ok=True)

    def close(self, query: str) -> None:
        with self._lock:
            self._closed.add(query)
            self._lock.notify_all()

    def follow(self, query: str, stop: Callable[[], bool]) -> Iterator[WindowResult]:
        """Every result of ``query``, past and future, until it closes or ``stop()``."""
        seen = 0  # counted from the first result ever published, let go or not

        def ready() -> bool:
            return (self._dropped.get(query, 0) + len(self._results.get(query, ())) > seen
                    or query in self._closed or stop())

        while True:
            with self._lock:
                self._lock.wait_for(ready, timeout=0.5)
                dropped = self._dropped.get(query, 0)
                seen = max(seen, dropped)
                fresh = self._results.get(query, [])[seen - dropped:]
                done = query in self._closed or stop()
            yield from fresh
            seen += len(fresh)
            if done and not fresh:
                return


def _line(result: WindowResult) -> str:
    return json.dumps(result.to_dict()) + "\n"


def _said(result: WindowResult) -> str:
    """A digest of what a result says of its window, apart from when and at what cost it
    came."""
    text = json.dumps([result.rows, result.exact, result.error_bound, result.sites_reporting,
                       result.sites_expected, result.missing_sites, result.warnings,
                       *([result.rolled_up] if result.rolled_up else []),
                       *([] if result.final else [result.provisional])],
                      sort_keys=True, default=repr)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _result(line: str, path: Path) -> WindowResult | None:
    """A result kept in ``path``; None, with a warning, for a line a crash cut short."""
    try:
        return WindowResult(**json.loads(line))
    except (ValueError, TypeError) as e:
        log.warning("%s: skipping a damaged result: %s", path, e)
        return None


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a crash leaves the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.tmp")
    with staged.open("w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(staged, path)


def utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")
