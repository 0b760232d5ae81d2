"""The gate between a site's folder and its reader's stream (jetstream.stage.gate): files
wait to share a micro-batch, but never past ``hold_s``, and never those that may hand a
window on; each goes in once, unchanged."""

from __future__ import annotations

import errno
import gzip
import os
import time
from pathlib import Path

import pytest

from jetstream.formats import unreadable
from jetstream.schema import CDN_LOG_SCHEMA
from jetstream.stage.gate import FileGate

HOLD_S = 0.4


def land(folder: Path, name: str, mtime_ms: int) -> Path:
    path = folder / name
    path.write_text(f"{name}\n")
    os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
    return path


def gate(tmp_path: Path, due: list[int | None]) -> FileGate:
    (tmp_path / "in").mkdir(exist_ok=True)
    return FileGate(tmp_path / "in", tmp_path / "live", HOLD_S, lambda: due[0])


def live(g: FileGate) -> list[str]:
    return sorted(os.listdir(g.live))


def test_with_nothing_known_a_file_goes_in_at_once_as_a_hard_link(tmp_path: Path) -> None:
    g = gate(tmp_path, [None])
    landed = land(g.landing, "a.csv", 1_000)
    land(g.landing, ".a.csv.tmp", 1_000)  # a shipper's file being written: Spark skips it
    land(g.landing, "_SUCCESS", 1_000)
    g.tick()
    assert live(g) == ["a.csv"]
    assert os.stat(g.live / "a.csv").st_ino == landed.stat().st_ino
    assert g.waiting == 0 and g.released == 1


def test_files_wait_for_each_other_until_the_hold_is_up(tmp_path: Path) -> None:
    due: list[int | None] = [100_000]
    g = gate(tmp_path, due)
    land(g.landing, "a.csv", 10_000)
    g.tick()  # no lag known yet: in at once
    g.read_up_to(9_900)  # its records reached 9.9 s: event times trail by 0.1 s
    land(g.landing, "b.csv", 10_500)
    land(g.landing, "c.csv", 11_000)
    g.tick()
    assert live(g) == ["a.csv"] and g.waiting == 2
    time.sleep(HOLD_S)
    g.tick()
    assert live(g) == ["a.csv", "b.csv", "c.csv"] and g.waiting == 0


def test_a_file_that_may_hand_a_window_on_goes_in_at_once(tmp_path: Path) -> None:
    due: list[int | None] = [20_000]
    g = gate(tmp_path, due)
    land(g.landing, "a.csv", 10_000)
    g.tick()
    g.read_up_to(9_900)
    land(g.landing, "b.csv", 19_000)  # 18.9 s less the lag: short of the hold's quarter
    g.tick()
    assert g.waiting == 1
    land(g.landing, "c.csv", 20_000)  # may reach 20 s: it and the one before go in
    g.tick()
    assert live(g) == ["a.csv", "b.csv", "c.csv"]


def test_ahead_of_a_due_point_files_go_in_once_then_wait_for_the_one_that_reaches_it(
        tmp_path: Path) -> None:
    due: list[int | None] = [20_000]
    g = gate(tmp_path, due)
    land(g.landing, "a.csv", 10_000)
    g.tick()
    g.read_up_to(9_900)  # event times trail by 0.1 s; the lead is the hold's quarter, 0.1 s
    land(g.landing, "b.csv", 20_000)  # may reach 19.9 s: within the lead of the due point
    g.tick()
    assert live(g) == ["a.csv", "b.csv"]
    land(g.landing, "c.csv", 20_050)  # within the lead again: waits, the flush was spent
    g.tick()
    assert g.waiting == 1
    land(g.landing, "d.csv", 20_100)  # may reach the due point: it and c go in
    g.tick()
    assert live(g) == ["a.csv", "b.csv", "c.csv", "d.csv"] and g.waiting == 0
    land(g.landing, "e.csv", 20_150)  # d's micro-batch has not ended: e waits for it
    g.tick()
    assert g.waiting == 1
    g.read_up_to(19_990)  # d fell short (its lag was misjudged): the due point is the same
    g.tick()
    assert g.waiting == 0 and "e.csv" in live(g)


def test_a_gate_started_again_lets_nothing_in_twice(tmp_path: Path) -> None:
    g = gate(tmp_path, [None])
    land(g.landing, "a.csv", 1_000)
    g.tick()
    again = gate(tmp_path, [None])
    land(again.landing, "b.csv", 2_000)
    again.tick()
    assert live(again) == ["a.csv", "b.csv"] and again.released == 1


def test_across_file_systems_a_file_is_copied_whole_under_a_hidden_name_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cross_device(source: Path, target: Path) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    monkeypatch.setattr(os, "link", cross_device)
    g = gate(tmp_path, [None])
    land(g.landing, "a.csv", 1_000)
    g.tick()
    assert live(g) == ["a.csv"]
    assert (g.live / "a.csv").read_text() == "a.csv\n"
    assert (g.live / "a.csv").stat().st_mtime_ns == (g.landing / "a.csv").stat().st_mtime_ns


def test_a_file_gone_before_it_went_in_is_said_and_skipped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    due: list[int | None] = [100_000]
    g = gate(tmp_path, due)
    land(g.landing, "a.csv", 10_000)
    g.tick()
    g.read_up_to(10_000)
    land(g.landing, "b.csv", 10_500)
    g.tick()
    (g.landing / "b.csv").unlink()
    time.sleep(HOLD_S)
    g.tick()
    assert live(g) == ["a.csv"] and g.waiting == 0
    assert "b.csv left" in caplog.text


def test_a_file_read_and_trimmed_is_not_let_in_again_by_a_gate_started_again(
        tmp_path: Path) -> None:
    g = gate(tmp_path, [None])
    land(g.landing, "a.csv", 1_000)
    g.tick()
    g.trim([(g.live / "a.csv").as_uri()])  # Spark names its files by URI
    assert live(g) == [] and (g.landing / "a.csv").exists()
    assert g.landed((g.live / "a.csv").as_uri()) == g.landing / "a.csv"
    g.stop()
    again = gate(tmp_path, [None])
    land(again.landing, "b c.csv", 2_000)
    again.tick()
    assert live(again) == ["b c.csv"]
    again.trim([(again.live / "b c.csv").as_uri()])  # a name a URI quotes
    assert live(again) == []


def test_a_backlog_goes_in_a_bounded_number_of_files_at_a_time(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    g = FileGate(tmp_path / "in", tmp_path / "live", HOLD_S, lambda: None, max_unread=2)
    for i in range(5):
        land(g.landing, f"{i}.csv", 1_000 + i)
    g.tick()
    assert live(g) == ["0.csv", "1.csv"]  # oldest first
    g.tick()
    assert g.waiting == 3  # none read yet
    g.read_up_to(1_001)
    g.tick()
    assert live(g) == ["0.csv", "1.csv", "2.csv", "3.csv"]


def test_a_gate_lets_in_its_source_s_format_and_sets_aside_a_file_it_cannot_read_whole(
        tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    set_aside: list[tuple[str, str]] = []
    g = FileGate(tmp_path / "in", tmp_path / "live", HOLD_S, lambda: None, format="json",
                 unreadable=lambda path: unreadable(path, CDN_LOG_SCHEMA),
                 set_aside=lambda path, reason: set_aside.append((path.name, reason)))
    for name in ("a.jsonl", "b.json.gz", "c.csv", "notes.txt"):
        land(g.landing, name, 1_000)
    (g.landing / "b.json.gz").write_bytes(gzip.compress(b'{"ts": 1}\n')[:12])  # cut off
    (g.landing / "d.ndjson.gz").write_bytes(gzip.compress(b'{"ts": 2}\n'))
    g.tick()
    assert live(g) == ["a.jsonl", "d.ndjson.gz"]  # neither CSV nor a note: not its input
    assert [name for name, _ in set_aside] == ["b.json.gz"]
    assert "EOFError" in set_aside[0][1] or "Compressed file ended" in set_aside[0][1]
    time.sleep(HOLD_S)
    land(g.landing, "e.jsonl", 2_000)  # the folder listed again, the cut-off file still in it
    g.tick()
    assert len(set_aside) == 1 and "e.jsonl" in live(g)  # set aside once


def test_files_go_in_in_landing_order_and_one_that_lands_behind_is_stamped_after(
        tmp_path: Path) -> None:
    """Landing order (modification time, then name) is the order the lateness rule judges
    files in: a file that lands with a time before the newest let in is stamped after it,
    so the reference executor reads the folder in the order the site did — also after the
    gate starts again."""
    g = gate(tmp_path, [None])
    land(g.landing, "b.csv", 5_000)
    land(g.landing, "a.csv", 5_000)
    land(g.landing, "c.csv", 4_000)
    g.tick()
    assert [name for name in g.names.read_text().split()] == ["c.csv", "a.csv", "b.csv"]
    behind = land(g.landing, "0-behind.csv", 1_000)
    g.tick()
    assert behind.stat().st_mtime_ns // 1_000_000 > 5_000
    g.stop()
    again = gate(tmp_path, [None])  # started again: it remembers the newest let in
    late = land(again.landing, "1-behind.csv", 2_000)
    again.tick()
    assert late.stat().st_mtime_ns // 1_000_000 > behind.stat().st_mtime_ns // 1_000_000


def test_how_far_behind_counts_the_files_not_read_yet(tmp_path: Path) -> None:
    g = gate(tmp_path, [100_000])
    now = time.time_ns() // 1_000_000
    assert g.behind(now) == (0, 0.0)
    land(g.landing, "a.csv", now - 3_000)
    g.tick()  # nothing known: in at once, not read yet
    g.read_up_to(None)
    assert g.behind(now)[0] == 1  # no micro-batch has read it
    g.batch_started()
    land(g.landing, "b.csv", now - 1_000)
    g.tick()  # let in during the micro-batch: the next reads it
    assert g.behind(now) == (2, 3.0)
    g.read_up_to(now - 2_000)
    assert g.behind(now) == (1, 1.0)


def test_a_file_the_gate_holds_by_design_is_not_behind_until_held_longer(
        tmp_path: Path) -> None:
    g = gate(tmp_path, [20_000])  # a due point ahead: files wait to share a batch
    land(g.landing, "a.csv", 10_000)
    g.tick()
    g.batch_started()
    g.read_up_to(9_900)  # a micro-batch read it
    land(g.landing, "b.csv", 19_000)  # short of the due point: it waits
    g.tick()
    now = 20_000
    assert g.waiting == 1 and g.behind(now) == (0, 0.0)
    name, (mtime, seen) = next(iter(g._waiting.items()))
    g._waiting[name] = (mtime, seen - HOLD_S - 1)  # seen that long ago: held past its hold
    assert g.behind(now) == (1, 1.0)
