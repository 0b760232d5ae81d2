"""A local stage's windows in plain Python (jetstream.stage.bookkeeping): windows handed on
early, while the watermark waits, come to the same thing as waiting for it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.rewrite import distributed, site_part
from jetstream.stage.bookkeeping import OpenWindows

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
QUERY = js.Query("q", LOGS.window(js.tumbling("10s"), watermark="4s").group_by("domain").agg(
    n=js.count(), mean=js.avg("latency_ms")))  # avg's accumulator merges in place
_, PARTIAL = site_part(distributed(QUERY))
SIZE, DELAY = 10_000, 4_000

Window = tuple[int, int]
Handed = list[tuple[Window, list[dict[str, Any]], int, int, bool]]


def stage(handed: Handed, *, early: bool) -> OpenWindows:
    def emit(flag: bool) -> Any:
        return lambda window, rows, events, revision: handed.append(
            (window, rows, events, revision, flag))
    return OpenWindows("q", PARTIAL, DELAY, emit(False), emit(True) if early else None)


def run_batch(windows: OpenWindows, batch: list[tuple[int, str, float]]) -> None:
    """One micro-batch, as the Spark stage runs it: rows for closed windows are late."""
    for ts, domain, latency in batch:
        window = (ts - ts % SIZE, ts - ts % SIZE + SIZE)
        if windows.closed(window):
            continue
        (_, count), (_, avg) = PARTIAL.aggregates
        windows.add(window, (domain,), [count.add(count.create(), None),
                                        avg.add(avg.create(), latency)], 1)
    windows.advance(max((ts for ts, _, _ in batch), default=None))
    windows.close_passed()
    windows.hand_on_early()


def canonical(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    (_, avg) = PARTIAL.aggregates[1]
    return sorted((r["domain"], r["n"], avg.extract(r["mean"])) for r in rows)


def final_word(handed: Handed) -> dict[Window, Any]:
    """What a receiver holds in the end for each window: the newest revision handed on."""
    newest: dict[Window, tuple[int, list[dict[str, Any]]]] = {}
    for window, rows, _, revision, _ in handed:
        held = newest.get(window)
        assert held is None or revision > held[0], f"{window}: revision {revision} again"
        newest[window] = (revision, rows)
    return {window: canonical(rows) for window, (_, rows) in newest.items()}


EVENTS = st.lists(st.tuples(st.integers(0, 60_000), st.sampled_from(["a", "b", "c"]),
                            st.sampled_from([1.5, 2.25, 100.0])), max_size=80)


@settings(max_examples=150, deadline=None)
@given(EVENTS, st.lists(st.integers(1, 8), min_size=1, max_size=30))
def test_early_hand_ons_come_to_what_waiting_for_the_watermark_gives(
        events: list[tuple[int, str, float]], sizes: list[int]) -> None:
    """The same micro-batches, with and without windows handed on early: each window's
    newest revision, as the watermark passes it, holds the same rows; a window handed on
    early and not changed after is not handed on again; and rows handed on stay as they were
    (accumulators that merge in place are not shared with what comes later)."""
    batches, rest = [], list(events)
    for size in sizes:
        batches.append(rest[:size])
        rest = rest[size:]
    batches.append(rest)
    plain: Handed = []
    eager: Handed = []
    waiting, early = stage(plain, early=False), stage(eager, early=True)
    copies: list[list[tuple[Any, ...]]] = []
    for batch in batches:
        run_batch(waiting, batch)
        run_batch(early, batch)
        copies.extend(canonical(rows) for _, rows, *_ in eager[len(copies):])
        assert early.watermark == waiting.watermark
        # Once the watermark passes a window, its newest early revision is the final word.
        if early.watermark is not None:
            closed = {w for w, *_ in plain if w[1] <= early.watermark}
            newest = {w: canonical(rows) for w, rows, *_ in eager if w in closed}
            assert newest == {w: canonical(rows) for w, rows, *_ in plain if w in closed}
    waiting.close(None)
    early.close(None)
    copies.extend(canonical(rows) for _, rows, *_ in eager[len(copies):])
    assert final_word(eager) == final_word(plain)
    assert [canonical(rows) for _, rows, *_ in eager] == copies, "a handed-on row changed"
    for window in {w for w, *_ in eager}:  # each hand-on of a window is a change
        versions = [canonical(rows) for w, rows, *_ in eager if w == window]
        assert all(a != b for a, b in itertools.pairwise(versions))


def test_a_window_goes_early_once_its_end_is_passed_by_half_the_delay() -> None:
    handed: Handed = []
    windows = stage(handed, early=True)
    run_batch(windows, [(1_000, "a", 1.5), (11_000, "b", 1.5)])
    assert handed == []  # 11 s: the first window's end, but not yet by 2 s
    run_batch(windows, [(12_000, "a", 1.5)])
    assert [(w, rev, flag) for w, _, _, rev, flag in handed] == [((0, SIZE), 0, True)]
    run_batch(windows, [(13_000, "a", 1.5)])  # nothing new for the first window
    run_batch(windows, [(14_000, "a", 1.5)])  # the watermark closes it: final as it went
    assert len(handed) == 1
    run_batch(windows, [(21_000, "a", 1.5), (22_500, "c", 2.25)])  # the second goes early
    run_batch(windows, [(19_000, "c", 2.25)])  # a record for it, before the watermark
    run_batch(windows, [(24_000, "a", 1.5)])  # closes it: handed on again, whole
    assert [(w, rev, flag) for w, _, _, rev, flag in handed[1:]] == [
        ((SIZE, 2 * SIZE), 0, True), ((SIZE, 2 * SIZE), 1, False)]
    assert canonical(handed[-1][1]) == [("a", 3, 1.5), ("b", 1, 1.5), ("c", 1, 2.25)]


def test_early_says_how_far_past_its_end_a_window_goes() -> None:
    handed: Handed = []
    windows = OpenWindows("q", PARTIAL, DELAY, lambda *_: None,
                          lambda w, rows, events, rev: handed.append((w, rows, events, rev, True)),
                          early_ms=1_000)
    run_batch(windows, [(1_000, "a", 1.5), (10_500, "b", 1.5)])
    assert handed == []
    run_batch(windows, [(11_000, "b", 1.5)])
    assert [w for w, *_ in handed] == [(0, SIZE)]
    never = OpenWindows("q", PARTIAL, DELAY, lambda *_: None,
                        lambda *_: pytest.fail("went early"), early_ms=DELAY)
    run_batch(never, [(1_000, "a", 1.5), (13_999, "b", 1.5)])  # early = the watermark: never


def test_what_went_early_survives_a_snapshot(tmp_path: Path) -> None:
    handed: Handed = []
    windows = stage(handed, early=True)
    run_batch(windows, [(1_000, "a", 1.5), (12_000, "a", 1.5)])
    windows.save(tmp_path / "stage.json", 0)
    again = stage(handed, early=True)
    again.restore(tmp_path / "stage.json")
    run_batch(again, [(12_500, "b", 1.5)])
    run_batch(again, [(15_000, "b", 1.5)])  # closes the first window: nothing new for it
    assert [(w, rev, flag) for w, _, _, rev, flag in handed] == [((0, SIZE), 0, True)]


STEPS = st.lists(st.one_of(
    st.tuples(st.just("batch"), EVENTS),
    st.tuples(st.just("idle"), st.none()),
    st.tuples(st.just("save"), st.none())), min_size=1, max_size=20)


@settings(max_examples=100, deadline=None)
@given(STEPS)
def test_a_snapshot_encodes_again_only_what_changed_and_reads_back_whole(
        tmp_path_factory: pytest.TempPathFactory,
        steps: list[tuple[str, Any]]) -> None:
    """Micro-batches, idle closes and snapshots in any order: every snapshot holds what
    encoding every window afresh gives, and a stage restored from it hands on what the
    stage it was taken from does."""
    path = tmp_path_factory.mktemp("snap") / "stage.json"
    handed: Handed = []
    windows = stage(handed, early=True)
    batch = 0
    for kind, events in [*steps, ("save", None)]:
        if kind == "batch":
            run_batch(windows, events)
        elif kind == "idle":
            windows.close(None)
        else:
            windows.save(path, batch)
            batch += 1
            fresh = stage([], early=True)
            fresh.restore(path)
            saved = json.loads(path.read_text())
            assert [w[-1] for w in saved["windows"]] == [
                windows._encode(w, g) for w, g in sorted(windows._open.items())]
            assert [w[-1] for w in saved["flushed"]] == [
                windows._encode(w, g) for w, (g, _, _) in sorted(windows._flushed.items())]
    again: Handed = []
    restored = stage(again, early=True)
    restored.restore(path)
    rest: Handed = []
    windows.emit = windows.emit_early = lambda w, rows, e, r: rest.append((w, rows, e, r, False))
    restored.emit = restored.emit_early = lambda w, rows, e, r: again.append(
        (w, rows, e, r, False))
    windows.close(None)
    restored.close(None)
    assert [(w, canonical(rows), e, r) for w, rows, e, r, _ in again] == [
        (w, canonical(rows), e, r) for w, rows, e, r, _ in rest]


def test_due_is_the_next_event_time_that_hands_a_window_on() -> None:
    windows = stage([], early=True)  # the delay 4 s: early at half of it, 2 s
    next_end = 20_000
    assert windows.due_ms(next_end) == next_end + 2_000  # nothing open
    run_batch(windows, [(3_000, "a", 1.5)])
    assert windows.due_ms(next_end) == SIZE + 2_000  # the open window, early
    run_batch(windows, [(12_500, "a", 1.5)])  # past 10 s + 2 s: it went early
    assert windows.due_ms(next_end) == SIZE + DELAY  # then it waits for the watermark
    assert stage([], early=False).due_ms(next_end) == next_end + DELAY


def test_an_idle_close_hands_windows_on_provisional_and_the_watermark_makes_them_final(
        ) -> None:
    """An input gone idle has not ended: its open windows go on provisional; a record for
    one that comes later is not late, and the whole window goes again, under the next
    revision, when the watermark closes it; one that nothing came for goes again unchanged
    then, final."""
    handed: list[tuple[Window, list[dict[str, Any]], int, str]] = []

    def emit(kind: str) -> Any:
        return lambda window, rows, events, revision: handed.append(
            (window, rows, revision, kind))
    windows = OpenWindows("q", PARTIAL, DELAY, emit("final"), emit_idle=emit("idle"))
    run_batch(windows, [(1_000, "a", 1.0), (11_000, "c", 1.0)])
    windows.close(None, idle=True)
    assert [(w, rev, kind) for w, _, rev, kind in handed] == [
        ((0, SIZE), 0, "idle"), ((SIZE, 2 * SIZE), 0, "idle")]
    run_batch(windows, [(2_000, "b", 2.0)])  # not late: the watermark had not passed
    run_batch(windows, [(25_000, "d", 1.0)])  # closes [0, 10 s) and [10 s, 20 s)
    assert [(w, rev, kind) for w, _, rev, kind in handed[2:]] == [
        ((0, SIZE), 1, "final"), ((SIZE, 2 * SIZE), 1, "final")]
    assert canonical(handed[2][1]) == [("a", 1, 1.0), ("b", 1, 2.0)]
    assert canonical(handed[3][1]) == canonical(handed[1][1])  # unchanged, now final
