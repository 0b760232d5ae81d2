"""What a live site does with a file every reader of its folder has read
(jetstream.stage.archive): archived, pruned by age and size, deleted or kept; never before
every reader is done with it, and never let in again."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from jetstream.stage import archive as archive_module
from jetstream.stage.archive import Archive, ReadFiles
from jetstream.stage.gate import FileGate

HOUR_NS = 3600 * 10**9


def land(folder: Path, name: str, size: int = 10, age_ns: int = 0) -> Path:
    path = folder / name
    path.write_bytes(b"x" * size)
    when = time.time_ns() - age_ns
    os.utime(path, ns=(when, when))
    return path


def site(tmp_path: Path, policy: ReadFiles) -> Archive:
    (tmp_path / "in").mkdir(parents=True, exist_ok=True)
    return Archive(tmp_path / "in", tmp_path / "archive", policy)


def gate(tmp_path: Path, archive: Archive, name: str = "live") -> FileGate:
    return FileGate(tmp_path / "in", tmp_path / name, 0.0, lambda: None, archive=archive)


def read(g: FileGate) -> list[str]:
    """Let in what landed, and trim it as a reader does once Spark committed it."""
    g.tick()
    names = sorted(os.listdir(g.live))
    g.trim(names)
    return names


def test_a_file_read_is_archived_and_stays_where_the_reader_can_find_it(
        tmp_path: Path) -> None:
    archive = site(tmp_path, ReadFiles())
    g = gate(tmp_path, archive)
    land(g.landing, "a.csv")
    assert read(g) == ["a.csv"]
    assert os.listdir(g.landing) == [] and os.listdir(archive.folder) == ["a.csv"]
    assert g.landed("file:///x/live/a.csv") == archive.folder / "a.csv"
    land(g.landing, "b.csv")
    g.tick()  # let in, not read yet: stays in the site's folder
    assert os.listdir(g.landing) == ["b.csv"] and g.landed("b.csv") == g.landing / "b.csv"
    assert sorted(os.listdir(g.live)) == ["b.csv"]


def test_a_file_waits_in_the_folder_until_every_reader_of_it_has_read_it(
        tmp_path: Path) -> None:
    archive = site(tmp_path, ReadFiles())
    first, second = gate(tmp_path, archive, "live-1"), gate(tmp_path, archive, "live-2")
    land(first.landing, "a.csv")
    read(first)
    assert os.listdir(first.landing) == ["a.csv"]  # the second reader has not read it
    read(second)
    assert os.listdir(first.landing) == [] and os.listdir(archive.folder) == ["a.csv"]


def test_deleted_when_the_operator_says_so_and_kept_when_told_to(tmp_path: Path) -> None:
    deleting = site(tmp_path / "d", ReadFiles("delete"))
    g = gate(tmp_path / "d", deleting)
    land(g.landing, "a.csv")
    read(g)
    assert os.listdir(g.landing) == [] and not deleting.folder.exists()
    assert g.landed("a.csv") == g.landing / "a.csv"  # gone: the reader says so
    keeping = site(tmp_path / "k", ReadFiles("keep"))
    g = gate(tmp_path / "k", keeping)
    land(g.landing, "a.csv")
    read(g)
    assert os.listdir(g.landing) == ["a.csv"] and g.released == 1
    g.tick()
    assert g.released == 1  # kept, and not let in again


def test_the_archive_drops_files_past_the_retention_and_the_oldest_over_its_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive_module, "PRUNE_EVERY_S", 0.0)
    archive = site(tmp_path, ReadFiles(retention_s=3600, max_bytes=250))
    g = gate(tmp_path, archive)
    land(g.landing, "old.csv", 100, age_ns=2 * HOUR_NS)
    land(g.landing, "a.csv", 100, age_ns=HOUR_NS // 2)
    land(g.landing, "b.csv", 100, age_ns=HOUR_NS // 4)
    read(g)
    assert sorted(os.listdir(archive.folder)) == ["a.csv", "b.csv"]  # old.csv: past an hour
    land(g.landing, "c.csv", 100)
    read(g)
    assert sorted(os.listdir(archive.folder)) == ["b.csv", "c.csv"]  # 300 bytes > 250
    assert archive.archived_bytes == 200
    again = Archive(g.landing, archive.folder, archive.policy)  # a site started again
    assert again.archived_bytes == 200


def test_a_site_stopped_between_a_read_and_the_archive_archives_on_start_and_forgets(
        tmp_path: Path) -> None:
    g = gate(tmp_path, site(tmp_path, ReadFiles("keep")))  # as if stopped before archiving
    for name in ("a.csv", "b.csv"):
        land(g.landing, name)
    read(g)
    land(g.landing, "c.csv")
    g.tick()  # let in, not read
    g.stop()
    archive = site(tmp_path, ReadFiles())
    again = gate(tmp_path, archive)
    assert os.listdir(again.landing) == ["c.csv"]
    assert sorted(os.listdir(archive.folder)) == ["a.csv", "b.csv"]
    assert again.names.read_text().split() == ["c.csv"]  # the names of files gone: forgotten
    again.tick()
    assert again.released == 0  # c.csv is in live already; nothing goes in twice


def test_read_files_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="'move' is not one of archive, delete, keep"):
        ReadFiles("move")
    with pytest.raises(ValueError, match="above 0"):
        ReadFiles(max_bytes=0)
