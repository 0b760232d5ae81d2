"""Lateness that does not depend on batching: each file judged against the files before it.

The reference executor and a site's Spark stage apply one rule (``docs/dsl.md``, "Late
records"): a file's records are judged against the watermark of the files read before it in
landing order (modification time, then name). So the same files read one a micro-batch, all
in one, or across a restart give the same windows, equal to ``run_local``'s.
"""

from __future__ import annotations

import csv
import itertools
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.stage.batches import read_files
from jetstream.stage.job import LocalStage
from tests.conftest import log
from tests.test_spark_stage import keep_newest

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
BY_STATUS = js.Query("by-status", LOGS.window(js.tumbling("10s"), watermark="5s")
                     .group_by("status").agg(n=js.count(), kb=js.sum("bytes")))
BY_DOMAIN = js.Query("by-domain", LOGS.where(js.col("status") < 500)
                     .window(js.sliding("10s", every="5s"), watermark="3s")
                     .group_by("domain").agg(n=js.count(), top=js.top_k("url", 3)))


def write_files(folder: Path, files: list[list[dict[str, Any]]]) -> list[Path]:
    """One CSV file a list, landed in that order (modification times a second apart)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, records in enumerate(files):
        path = folder / f"part-{i:03d}.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=js.CDN_LOG_SCHEMA.names)
            writer.writeheader()
            writer.writerows(records)
        landed = (1_700_000_000 + i) * 1_000_000_000
        os.utime(path, ns=(landed, landed))
        paths.append(path)
    return paths


def stage_over(spark: Any, query: js.Query, paths: list[Path], cuts: list[int],
               tmp: Path, restart_at: int | None = None) -> list[js.WindowResult]:
    """The query's results from a stage that reads ``paths`` in micro-batches cut before
    each index of ``cuts``; at micro-batch ``restart_at`` the stage is started again from
    its snapshot."""
    optimized = js.optimize(query)
    windows: dict[tuple[int, int], list[dict[str, Any]]] = {}
    emit = keep_newest(windows)

    def started() -> LocalStage:
        return LocalStage(spark, optimized, tmp / "in", checkpoint_dir=tmp / "checkpoint",
                          quarantine_dir=tmp / "quarantine", emit=emit,
                          snapshot=tmp / "snapshot.json")
    stage = started()
    bounds = [0, *cuts, len(paths)]
    for batch_id, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        if batch_id == restart_at:
            stage = started()
        stage.process_batch(read_files(spark, [str(p) for p in paths[lo:hi]], stage.layout),
                            batch_id)
    stage.flush()
    return js.local.finish_from_partials(optimized, windows)


def rows_of(results: list[js.WindowResult]) -> list[Any]:
    return [(r.window_start, sorted(map(repr, r.rows))) for r in results]


def test_the_issue_s_three_records_are_judged_alike_however_they_are_batched(
        spark: Any, tmp_path: Path) -> None:
    # ts 16,000 moves the watermark to 11,000 past [0, 10 s): the 404 at ts 2,000 in the
    # file after it is late, whether or not the two share a micro-batch.
    paths = write_files(tmp_path / "site", [[log(1_000)], [log(16_000)],
                                            [log(2_000, status=404)]])
    reference = js.run_local(BY_STATUS, tmp_path / "site")
    assert reference.stats.late_records == 1
    first = next(r for r in reference if r.window_start == 0)
    assert [(row["status"], row["n"]) for row in first.rows] == [(200, 1)]
    for cuts in ([], [1, 2], [2]):
        got = stage_over(spark, BY_STATUS, paths, cuts, tmp_path / f"cut{cuts}")
        assert rows_of(got) == rows_of(reference), cuts


def test_records_of_one_file_are_not_late_to_each_other(tmp_path: Path) -> None:
    # Within a file the watermark does not move: a file is a unit, as a micro-batch holds it.
    write_files(tmp_path / "site", [[log(1_000), log(16_000), log(2_000, status=404)]])
    out = js.run_local(BY_STATUS, tmp_path / "site")
    assert out.stats.late_records == 0
    # Records given as dicts are a unit each: the 404 is late among them.
    assert js.run_local(BY_STATUS, [log(1_000), log(16_000),
                                    log(2_000, status=404)]).stats.late_records == 1


def test_files_are_read_in_landing_order_not_name_order(tmp_path: Path) -> None:
    paths = write_files(tmp_path / "site", [[log(1_000)], [log(16_000)]])
    late = tmp_path / "site" / "a-first-by-name.csv"  # landed last, first by name
    late.write_text(paths[0].read_text().replace("1000,", "2000,").replace(",200,", ",404,"))
    os.utime(late, ns=(1_800_000_000 * 10**9,) * 2)
    out = js.run_local(BY_STATUS, tmp_path / "site")
    assert out.stats.late_records == 1


@st.composite
def batched_files(draw: st.DrawFn) -> tuple[list[list[dict[str, Any]]], list[int], int]:
    """Files of records a little out of order with some far behind, a cut into
    micro-batches, and where a restart falls."""
    n = draw(st.integers(2, 7))
    files, clock = [], 0
    for _ in range(n):
        clock += draw(st.integers(0, 9_000))
        records = []
        for _ in range(draw(st.integers(1, 6))):
            behind = draw(st.sampled_from([0, 0, 1_000, 4_000, 7_000, 30_000]))
            ts = max(0, clock - behind + draw(st.integers(0, 900)))
            records.append(log(ts, draw(st.sampled_from(["a.com", "b.com"])),
                               status=draw(st.sampled_from([200, 404, 503])),
                               url=draw(st.sampled_from(["/x", "/y", "/z", "/w"]))))
        files.append(records)
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1)))
    return files, cuts, draw(st.integers(0, len(cuts) + 1))


@pytest.mark.parametrize("query", [BY_STATUS, BY_DOMAIN], ids=lambda q: q.name)
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=batched_files())
def test_any_batching_and_a_restart_give_the_reference_s_windows(
        spark: Any, tmp_path_factory: pytest.TempPathFactory, query: js.Query,
        case: tuple[list[list[dict[str, Any]]], list[int], int]) -> None:
    files, cuts, restart_at = case
    tmp = tmp_path_factory.mktemp("batched")
    paths = write_files(tmp / "site", files)
    reference = js.run_local(query, tmp / "site")
    assert rows_of(stage_over(spark, query, paths, cuts, tmp / "cut", restart_at)) \
        == rows_of(reference)
    assert rows_of(stage_over(spark, query, paths, [], tmp / "whole")) == rows_of(reference)
