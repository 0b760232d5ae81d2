"""Warming a live stage up before its stream starts (:mod:`jetstream.stage.warm`): real Spark,
the stage's own plan over made-up records, nothing of it left behind."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import jetstream as js
from jetstream.stage.check import check_stage
from jetstream.stage.warm import made_up_records, warm_up
from tests.test_spark_stage import run_stage

EVERY_TYPE = js.Schema.of({"ts": js.DataType.INT, "site": js.DataType.STRING,
                           "n": js.DataType.INT, "x": js.DataType.FLOAT,
                           "ok": js.DataType.BOOL}, event_time="ts")
SOURCE = js.source("things", schema=EVERY_TYPE)


def counted(stream: js.Stream, name: str) -> js.Query:
    return js.Query(name, stream.window(js.tumbling("10s"), watermark="5s")
                    .group_by("site").agg(n=js.count(), x=js.sum("x")))


def test_made_up_records_parse_as_their_types_and_a_where_keeps_some(
        spark: Any, tmp_path: Path) -> None:
    now = 1_767_225_600_000
    records = made_up_records(EVERY_TYPE, 300, now)
    assert all(now - 30_000 < int(r[0]) <= now for r in records)
    folder = tmp_path / "in"
    folder.mkdir()
    with (folder / "a.csv").open("w", newline="") as out:
        # In time order: the reference drops what is late record by record, a batch does not.
        csv.writer(out).writerows([EVERY_TYPE.names, *sorted(records, key=lambda r: int(r[0]))])
    query = counted(SOURCE.where(js.col("n") < 500), "made-up")
    got, stats = run_stage(spark, query, folder, tmp_path)
    assert got == js.run_local(js.optimize(query), folder)
    assert stats.records_in == 300 and not stats.malformed
    rows = [row for result in got for row in result.rows]
    assert 0 < sum(row["n"] for row in rows) < 300  # the where goes both ways
    assert len({row["site"] for row in rows}) > 10  # groups repeat, and there are several


def test_a_warm_up_runs_the_stage_and_leaves_nothing_behind(spark: Any, tmp_path: Path) -> None:
    query = js.optimize(counted(SOURCE.where(js.col("ok")), "warm-once"))
    [chain] = check_stage(query)
    scratch = tmp_path / "warm-up"
    streams = len(spark.streams.active)
    warm = warm_up(spark, query, chain, scratch, batches=3, seconds=120)
    assert warm.failure == "" and warm.batches == 3 and not warm.again
    assert warm.seconds >= warm.first_s > 0 and warm.last_s > 0
    assert not scratch.exists() and len(spark.streams.active) == streams  # its stream stopped
    # Started again in this JVM (a new plan version, say), the stage is warm already.
    assert warm_up(spark, query, chain, scratch, batches=3, seconds=120).again


def test_a_warm_up_stops_when_asked_and_a_failing_one_is_reported(
        spark: Any, tmp_path: Path) -> None:
    query = js.optimize(counted(SOURCE, "warm-stopped"))
    [chain] = check_stage(query)
    assert warm_up(spark, query, chain, tmp_path / "a", stopping=lambda: True).batches == 0

    def refuse(record: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("made-up sites are not served here")

    query = js.optimize(counted(
        SOURCE.map(refuse, schema=EVERY_TYPE.fields_by_name(), name="refuse"), "warm-refused"))
    [chain] = check_stage(query)
    warm = warm_up(spark, query, chain, tmp_path / "b", seconds=120)
    assert warm.batches == 0 and warm.failure  # said, not raised: the live stage still runs
    assert not (tmp_path / "b").exists()
