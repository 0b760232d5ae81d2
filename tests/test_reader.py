"""A site's one reader of a folder feeding every live stage: real Spark streams over files."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import jetstream as js
from jetstream.local import finish_from_partials
from jetstream.schema import CDN_LOG_SCHEMA
from jetstream.stage.batches import batch_files
from jetstream.stage.job import LocalStage
from jetstream.stage.reader import SourceReader
from tests.conftest import log
from tests.test_spark_stage import keep_newest

LOGS = js.source("cdn_logs", schema=CDN_LOG_SCHEMA)
WINDOWED = LOGS.window(js.tumbling("1s"), watermark="100ms")
BY_DOMAIN = js.Query("by-domain", WINDOWED.group_by("domain").agg(n=js.count()))
BYTES = js.Query("bytes", WINDOWED.group_by("pop").agg(bytes=js.sum("bytes"), n=js.count()))
DOMAINS = ("a.com", "b.org", "c.net", "d.io")


def _boom(record: dict[str, Any]) -> dict[str, Any]:
    if record["domain"] == "boom.com":
        raise ValueError("boom")
    return record


BOOM = js.Query("boom", LOGS.map(_boom, schema=CDN_LOG_SCHEMA)
                .window(js.tumbling("1s"), watermark="100ms").agg(n=js.count()))


def records(file: int, n: int = 40, domain: str | None = None) -> list[dict[str, Any]]:
    """File ``file``'s records: event times in order across files, a second a file."""
    return [log(1_000_000 + file * 1000 + i * (1000 // n),
                domain or DOMAINS[(i * 7 + file) % len(DOMAINS)],
                pop=("ams", "sfo")[i % 2], bytes=100 + i) for i in range(n)]


def drop(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """A CSV file landing whole in ``folder``, as shippers drop them."""
    names = CDN_LOG_SCHEMA.names
    staged = folder.parent / f".{name}"
    staged.write_text(",".join(names) + "\n" + "".join(
        ",".join(str(r[n]) for n in names) + "\n" for r in rows))
    staged.rename(folder / name)


class Stage:
    """A query's live stage and the windows it hands on."""

    def __init__(self, spark: Any, query: js.Query, folder: Path, tmp: Path,
                 snapshot: Path | None = None) -> None:
        self.query = js.optimize(query)
        self.windows: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self.stage = LocalStage(spark, self.query, folder, checkpoint_dir=tmp / "unused",
                                quarantine_dir=tmp / f"quarantine-{query.name}",
                                emit=keep_newest(self.windows), snapshot=snapshot)

    def results(self) -> list[Any]:
        self.stage.flush()
        return finish_from_partials(self.query, self.windows)


def wait_for(done: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "in").mkdir()
    return tmp_path / "in"


@pytest.fixture
def reader(spark: Any, folder: Path, tmp_path: Path) -> Any:
    layout = Stage(spark, BY_DOMAIN, folder, tmp_path).stage.layout
    made = SourceReader(spark, folder, layout, "ts", tmp_path / "reader", trigger_s=0.1)
    yield made
    made.stop()


def test_two_queries_share_one_stream_and_each_equals_run_local(
        spark: Any, folder: Path, tmp_path: Path, reader: SourceReader) -> None:
    streams = len(spark.streams.active)
    a, b = Stage(spark, BY_DOMAIN, folder, tmp_path), Stage(spark, BYTES, folder, tmp_path)
    reader.attach(a.stage)
    reader.attach(b.stage)
    assert len(spark.streams.active) == streams + 1  # one stream for both queries
    assert reader._fused is not None and reader._fused.stages == [a.stage, b.stage]  # one plan
    written = [r for i in range(4) for r in records(i)]
    for i in range(4):
        drop(folder, f"{i}.csv", records(i))
    wait_for(lambda: a.stage.stats.records_in == b.stage.stats.records_in == len(written),
             "both stages to read every record")
    assert a.results() == js.run_local(BY_DOMAIN, written)
    assert b.results() == js.run_local(BYTES, written)
    # What every stage read leaves the folder the stream lists once Spark has committed its
    # micro-batch; the site's folder keeps every file.
    wait_for(lambda: not os.listdir(reader.gate.live), "the files read to leave live/")
    assert sorted(os.listdir(folder)) == [f"{i}.csv" for i in range(4)]


def test_a_stage_that_cannot_be_fused_plans_each_batch_beside_the_others(
        spark: Any, folder: Path, tmp_path: Path, reader: SourceReader) -> None:
    # A frequent-items sketch counts items in a job of its own: with it on the reader, every
    # stage is planned on the raw records each batch (no fused plan), and each still equals
    # run_local.
    items = js.Query("items", WINDOWED.agg(n=js.count(), top=js.top_k("domain", 2)))
    a, b = Stage(spark, BY_DOMAIN, folder, tmp_path), Stage(spark, items, folder, tmp_path)
    reader.attach(a.stage)
    reader.attach(b.stage)
    written = [r for i in range(3) for r in records(i)]
    for i in range(3):
        drop(folder, f"{i}.csv", records(i))
    wait_for(lambda: a.stage.stats.records_in == b.stage.stats.records_in == len(written),
             "both stages to read every record")
    assert reader._fused is None
    assert a.results() == js.run_local(BY_DOMAIN, written)
    assert [r.rows for r in b.results()] == [r.rows for r in js.run_local(items, written)]


def test_stages_sharing_a_batch_each_count_its_records_and_malformed_lines_once(
        spark: Any, folder: Path, tmp_path: Path, reader: SourceReader) -> None:
    # Several stages take the batch's records parsed once and its counters observed once:
    # each stage's counters are the batch's, not a multiple, and each sets aside the bad.
    stages = [Stage(spark, query, folder, tmp_path)
              for query in (js.Query("sliding", LOGS.window(js.sliding("2s", "1s"),
                                                            watermark="100ms")
                                     .agg(n=js.count())), BY_DOMAIN, BYTES)]
    for stage in stages:
        reader.attach(stage.stage)
    written = [r for i in range(3) for r in records(i)]
    for i in range(3):
        drop(folder, f"{i}.csv", records(i))
        with (folder / f"{i}.csv").open("a") as f:  # a short line and a bad number
            f.write("1000000,ams\n")
            f.write(",".join(["1000001", "ams", "198.51.100.1", "a.com", "http://a.com/",
                              "200", "many", "1.5", "HIT"]) + "\n")
    wait_for(lambda: all(s.stage.stats.records_in == len(written) for s in stages),
             "every stage to read every record")
    for stage in stages:
        assert stage.stage.stats.malformed == {"wrong field count": 3, "ill-typed field": 3}
        assert stage.results() == js.run_local(stage.query, written)
        wait_for(lambda stage=stage: any(Path(tmp_path, f"quarantine-{stage.query.name}")
                                         .glob("*.json")), "the bad lines set aside")


def test_a_query_added_while_another_runs_withholds_what_it_missed_and_a_removed_one_stops(
        spark: Any, folder: Path, tmp_path: Path, reader: SourceReader) -> None:
    first, cancelled = Stage(spark, BY_DOMAIN, folder, tmp_path), Stage(
        spark, BYTES, folder, tmp_path / "cancelled")
    reader.attach(first.stage)
    reader.attach(cancelled.stage)
    before = [r for i in range(2) for r in records(i)]
    for i in range(2):
        drop(folder, f"{i}.csv", records(i))
    wait_for(lambda: first.stage.stats.records_in == len(before), "the first files")
    since = reader.position  # a query is deployed: its stage joins where the reader is now
    joined = max(r["ts"] for r in before)
    assert since.latest == joined
    # A record late into the window it joined in comes with the next file, which lands
    # before the new stage is attached (Spark started, it warmed up): it is read again.
    files = {i: ([log(joined + 15, "a.com")] if i == 2 else []) + records(i) for i in range(2, 5)}
    drop(folder, "2.csv", files[2])
    wait_for(lambda: first.stage.stats.records_in == len(before) + len(files[2]), "file 2")
    added = Stage(spark, BYTES, folder, tmp_path / "added")
    reader.attach(added.stage, since)
    reader.detach(cancelled.stage)
    assert added.stage.windows.joined_ms == joined
    after = [r for i in range(2, 5) for r in files[i]]
    for i in range(3, 5):
        drop(folder, f"{i}.csv", files[i])
    wait_for(lambda: first.stage.stats.records_in == len(before) + len(after), "every file")
    wait_for(lambda: added.stage.stats.records_in == len(after), "the added query's files")
    # The first query never stopped: every window; the cancelled one read only the first.
    assert first.results() == js.run_local(BY_DOMAIN, before + after)
    assert cancelled.stage.stats.records_in == len(before) + len(files[2])
    # The added one withholds the window it joined in, whose first records it never saw.
    want = [w for w in js.run_local(BYTES, before + after) if w.window_start > joined]
    assert added.results() == want
    assert added.stage.stats.withheld_records > 0


def test_a_query_that_fails_is_detached_alone_and_the_reader_goes_on(
        spark: Any, folder: Path, tmp_path: Path, reader: SourceReader) -> None:
    good, bad = Stage(spark, BY_DOMAIN, folder, tmp_path), Stage(spark, BOOM, folder, tmp_path)
    reader.attach(good.stage)
    reader.attach(bad.stage)
    written = records(0) + records(1, domain="boom.com") + records(2)
    drop(folder, "0.csv", records(0))
    drop(folder, "1.csv", records(1, domain="boom.com"))
    wait_for(lambda: bad.stage.failure is not None, "the failing map to fail its stage")
    assert "boom" in str(bad.stage.failure)
    drop(folder, "2.csv", records(2))
    wait_for(lambda: good.stage.stats.records_in == len(written), "the good stage's records")
    assert reader.failure() is None
    assert good.results() == js.run_local(BY_DOMAIN, written)


def test_a_query_back_from_its_snapshot_reads_again_what_it_missed(
        spark: Any, folder: Path, tmp_path: Path, reader: SourceReader) -> None:
    snapshot = tmp_path / "stage.json"
    first = Stage(spark, BY_DOMAIN, folder, tmp_path, snapshot=snapshot)
    reader.attach(first.stage)
    for i in range(2):
        drop(folder, f"{i}.csv", records(i))
    wait_for(lambda: first.stage.stats.records_in == 80, "the first files")
    reader.detach(first.stage)  # its run is replaced: the new one takes its snapshot
    for i in range(2, 4):
        drop(folder, f"{i}.csv", records(i))
    wait_for(lambda: sum(len(f) for f in reader._files.values()) == 4, "the files listed")
    back = Stage(spark, BY_DOMAIN, folder, tmp_path, snapshot=snapshot)
    reader.attach(back.stage)  # reads the two files it missed again
    drop(folder, "4.csv", records(4))
    wait_for(lambda: back.stage.stats.records_in == 3 * 40, "the gap and the next file")
    assert back.stage.windows.joined_ms is None
    back.stage.flush()
    handed_on = {**first.windows, **back.windows}  # what the first handed on, then the next
    assert finish_from_partials(back.query, handed_on) == js.run_local(
        BY_DOMAIN, [r for i in range(5) for r in records(i)])


# -- with real processes: three sites of local-3dc, each reading its folder once -------------

def test_live_sites_add_and_cancel_queries_while_a_third_runs_equal_to_run_local(
        tmp_path: Path) -> None:
    from jetstream.control.launch import LocalCluster

    topology = Path(__file__).resolve().parent.parent / "topologies" / "local-3dc.yaml"
    sites = ("ams", "sfo", "sin")
    third = js.Query("third", LOGS.window(js.tumbling("2s"), watermark="200ms")
                     .group_by("domain").agg(n=js.count(), bytes=js.sum("bytes")))
    cancelled = js.Query("cancelled", LOGS.window(js.tumbling("2s"), watermark="200ms")
                         .agg(n=js.count()))
    added = js.Query("added", LOGS.window(js.tumbling("2s"), watermark="200ms")
                     .group_by("pop").agg(n=js.count()))
    inputs = tmp_path / "input"
    for site in sites:
        (inputs / site).mkdir(parents=True)
    base = (time.time_ns() // 1_000_000) // 2000 * 2000

    def land(i: int) -> None:  # a second of records at every site
        for k, site in enumerate(sites):
            rows = [log(base + i * 1000 + j * 25, DOMAINS[(i + j + k) % 4], pop=site)
                    for j in range(40)]
            drop(inputs / site, f"{i:03d}.csv", rows)

    with LocalCluster(topology, inputs, idle_timeout_s=3, logs=tmp_path / "logs",
                      site_args=lambda s: ["--warm-up", "0"]) as cluster:
        for query in (third, cancelled):
            cluster.client.submit(query)
        for query in (third, cancelled):
            cluster.wait_for_stages(query.name)
        for i in range(6):
            land(i)
            time.sleep(0.5)
        cluster.client.submit(added)
        cluster.client.cancel(cancelled.name)
        for i in range(6, 14):
            land(i)
            time.sleep(0.5)
        results: dict[str, dict[int, Any]] = {"third": {}, "added": {}}
        for name, want in (("third", js.run_local(third, inputs)),
                           ("added", js.run_local(added, inputs))):
            for result in cluster.client.results(name, timeout_s=90):
                seen = results[name].get(result.window_start)
                if seen is None or result.revision >= seen.revision:
                    results[name][result.window_start] = result
                if all(w.window_start in results[name] and results[name][
                        w.window_start].sites_reporting == 3 for w in want):
                    break
            truth = {w.window_start: w.rows for w in want}
            got = {w: r.rows for w, r in results[name].items() if r.sites_reporting == 3}
            if name == "third":  # it ran throughout: every window, whole, as run_local has it
                assert got == truth
                assert len(results[name]) == len(truth)
            else:  # it withholds the windows it joined in or before; the rest are whole
                assert got == {w: truth[w] for w in got}
                assert set(got) >= {w for w in truth if w >= base + 8000}
        # Each site read its folder with one reader (one checkpoint) for all three queries.
        for site in sites:
            assert len(list((tmp_path / "logs" / "state" / site / "readers").iterdir())) == 1


def test_a_malformed_line_is_set_aside_naming_its_file_in_the_sites_folder(
        spark: Any, folder: Path, tmp_path: Path, reader: SourceReader) -> None:
    a = Stage(spark, BY_DOMAIN, folder, tmp_path)
    reader.attach(a.stage)
    drop(folder, "0.csv", records(0))
    bad = folder.parent / ".1.csv"
    bad.write_text((folder / "0.csv").read_text() + "not,a,record\n")
    bad.rename(folder / "1.csv")
    wait_for(lambda: a.stage.stats.records_in == 2 * len(records(0)), "both files")
    wait_for(lambda: sum(a.stage.stats.malformed.values()) == 1, "the bad line counted")
    wait_for(lambda: list((tmp_path / "quarantine-by-domain").glob("*.json")), "quarantine")
    set_aside = [json.loads(line) for part in (tmp_path / "quarantine-by-domain").glob("*.json")
                 for line in part.read_text().splitlines()]
    assert [(r["line"], r["file"]) for r in set_aside] == [
        ("not,a,record", (folder / "1.csv").resolve().as_uri().replace("file:///", "file:/"))]


def test_files_committed_before_a_kill_leave_the_live_folder_when_a_reader_starts_again(
        spark: Any, folder: Path, tmp_path: Path, reader: SourceReader) -> None:
    a = Stage(spark, BY_DOMAIN, folder, tmp_path)
    reader.attach(a.stage)
    for i in range(3):
        drop(folder, f"{i}.csv", records(i))
    wait_for(lambda: a.stage.stats.records_in == 3 * len(records(0)), "the records")
    wait_for(lambda: not os.listdir(reader.gate.live), "the files read to leave live/")
    reader.stop()
    # As a SIGKILL between Spark's commit and the trim leaves them: files read still in live/,
    # beside one let in and not read yet.
    drop(folder, "3.csv", records(3))
    for i in range(4):
        os.link(folder / f"{i}.csv", reader.gate.live / f"{i}.csv")
    again = SourceReader(spark, folder, a.stage.layout, "ts", tmp_path / "reader",
                         trigger_s=0.1)
    try:
        assert os.listdir(again.gate.live) == ["3.csv"]
    finally:
        again.stop()


def test_a_live_reader_of_json_lines_reads_its_format_and_sets_a_corrupt_file_aside(
        spark: Any, folder: Path, tmp_path: Path) -> None:
    """A source of JSON lines, live: the gate lets in only its files, a cut-off gzip file
    goes to rejected/ whole and is counted, and the stage's windows equal run_local's."""
    logs = js.source("cdn_logs", schema=CDN_LOG_SCHEMA, format="json")
    query = js.Query("json", logs.window(js.tumbling("1s"), watermark="100ms")
                     .group_by("domain").agg(n=js.count()))
    stage = Stage(spark, query, folder, tmp_path)
    live = SourceReader(spark, folder, stage.stage.layout, "ts", tmp_path / "reader",
                        trigger_s=0.1, hold_s=0)
    try:
        live.attach(stage.stage)
        written = [r for i in range(3) for r in records(i)]
        for i in range(3):
            text = "".join(json.dumps(r) + "\n" for r in records(i))
            (folder.parent / f".{i}").write_bytes(gzip.compress(text.encode()))
            (folder.parent / f".{i}").rename(folder / f"{i}.jsonl.gz")
        cut = gzip.compress("".join(json.dumps(r) + "\n" for r in records(9)).encode())
        (folder.parent / ".cut").write_bytes(cut[: len(cut) // 2])
        (folder.parent / ".cut").rename(folder / "9.jsonl.gz")
        drop(folder, "3.csv", records(3))  # another format's file: not this source's
        wait_for(lambda: stage.stage.stats.records_in == len(written)
                 and stage.stage.stats.malformed["unreadable file"] == 1,
                 "every record read and the cut-off file set aside")
        assert stage.results() == js.run_local(query, written)
        assert (tmp_path / "rejected" / "9.jsonl.gz").read_bytes() == cut[: len(cut) // 2]
        noted = (tmp_path / f"quarantine-{query.name}" / "unreadable.jsonl").read_text()
        assert "9.jsonl.gz" in noted and "unreadable file" in noted
        assert "3.csv" in os.listdir(folder) and "3.csv" not in os.listdir(live.gate.live)
    finally:
        live.stop()


def test_each_batchs_files_are_read_back_from_sparks_file_source_log(
        spark: Any, folder: Path, tmp_path: Path, reader: SourceReader) -> None:
    # What a fused job that fails is run again on, stage by stage: past the log's first
    # compaction (the site's sessions compact it every 1000 batches; here every 5), where
    # older batches' entries move to one file.
    interval = "spark.sql.streaming.fileSource.log.compactInterval"
    kept = spark.conf.get(interval)
    spark.conf.set(interval, "5")
    stage = Stage(spark, BY_DOMAIN, folder, tmp_path)
    try:
        reader.attach(stage.stage)
        for i in range(12):
            drop(folder, f"{i}.csv", records(i))
            wait_for(lambda i=i: stage.stage.stats.records_in == 40 * (i + 1), f"file {i}")
    finally:
        spark.conf.set(interval, kept)
    assert any(p.name.endswith(".compact")
               for p in (reader.checkpoint_dir / "sources" / "0").iterdir())
    read = {b: [Path(f.removeprefix("file:")).name for f in files]
            for b, files in reader._files.items()}
    assert sorted(n for names in read.values() for n in names) == sorted(
        f"{i}.csv" for i in range(12))
    for b, names in read.items():
        logged = batch_files(reader.checkpoint_dir, b)
        assert [Path(f.removeprefix("file:")).name for f in logged] == sorted(names)
    assert batch_files(reader.checkpoint_dir, reader.last_batch + 1) == []
