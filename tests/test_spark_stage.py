"""The Spark local stage: real Spark over CSV files, against the reference executor."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.local import finish_from_partials
from jetstream.queryfile import load_query
from jetstream.stage.job import LocalStage
from tests.conftest import log

ROOT = Path(__file__).resolve().parent.parent
LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)


def run_stage(spark: Any, query: js.Query, site_dir: Path, tmp: Path,
              **optimize: Any) -> tuple[Any, Any]:
    """The optimized query's results from the stage's partials, and the stage's stats."""
    optimized = js.optimize(query, **optimize)
    windows: dict[tuple[int, int], list[dict[str, Any]]] = {}
    stage = LocalStage(spark, optimized, site_dir, checkpoint_dir=tmp / "checkpoint",
                       quarantine_dir=tmp / "quarantine",
                       emit=keep_newest(windows))
    stats = stage.run_available()
    return finish_from_partials(optimized, windows), stats


def run_stage_on_records(spark: Any, query: js.Query, batches: list[list[dict[str, Any]]],
                         tmp: Path) -> list[Any]:
    """The optimized query's results from the stage's partials, one micro-batch a list."""
    optimized = js.optimize(query)
    windows: dict[tuple[int, int], list[dict[str, Any]]] = {}
    stage = LocalStage(spark, optimized, tmp / "in", checkpoint_dir=tmp / "checkpoint",
                       quarantine_dir=tmp / "quarantine",
                       emit=keep_newest(windows))
    for batch_id, records in enumerate(batches):
        stage.process_batch(as_text(spark, stage, records), batch_id)
    stage.flush()
    return finish_from_partials(optimized, windows)


def keep_newest(windows: dict[tuple[int, int], list[dict[str, Any]]]) -> Any:
    """An emit that keeps each window's newest revision (a window handed on again is whole)."""
    revisions: dict[tuple[int, int], int] = {}

    def emit(window: tuple[int, int], rows: list[dict[str, Any]], events: int,
             revision: int) -> None:
        assert revision == revisions.get(window, -1) + 1, "revisions count up, one by one"
        windows[window], revisions[window] = rows, revision
    return emit


def as_text(spark: Any, stage: LocalStage, records: list[dict[str, Any]]) -> Any:
    """Records as the stage reads them: every column as text (None: not malformed)."""
    text = [[repr(r[f.name]) if isinstance(r[f.name], float) else str(r[f.name])
             for f in LOGS.schema] + [None] for r in records]
    return spark.createDataFrame(text, stage.layout.text_schema)


def test_a_restarted_stage_resumes_from_its_snapshot_and_counts_each_batch_once(
        spark: Any, tmp_path: Path) -> None:
    query = js.optimize(js.Query("q", LOGS.window(js.tumbling("10s"), watermark="2s")
                                 .group_by("domain").agg(n=js.count(), kb=js.sum("bytes"))))
    batches = [[log(t, f"d{t % 3}.com") for t in range(start, start + 6_000, 500)]
               for start in range(0, 36_000, 6_000)]
    handed: dict[tuple[int, int], list[dict[str, Any]]] = {}
    again: list[tuple[int, int]] = []
    dying = False

    class Killed(Exception):
        pass

    def emit(window: tuple[int, int], rows: list[dict[str, Any]], events: int,
             revision: int) -> None:
        if window in handed:  # handed on before the crash: must be the very same
            assert rows == handed[window]
            again.append(window)
        handed[window] = rows
        if dying:  # killed once it has handed on a window, before its snapshot
            raise Killed

    def stage() -> LocalStage:
        return LocalStage(spark, query, tmp_path / "in", checkpoint_dir=tmp_path / "cp",
                          quarantine_dir=tmp_path / "q", emit=emit,
                          snapshot=tmp_path / "stage.json")

    first = stage()
    for batch_id in range(3):
        first.process_batch(as_text(spark, first, batches[batch_id]), batch_id)
    dying = True
    with pytest.raises(Killed):
        first.process_batch(as_text(spark, first, batches[3]), 3)
    dying = False
    del first  # killed: what it had open lives only in the snapshot of batch 2
    second = stage()
    for batch_id in range(2, len(batches)):  # Spark re-runs batches 2 and 3: not committed
        second.process_batch(as_text(spark, second, batches[batch_id]), batch_id)
    second.flush()
    want = js.run_local(query, [r for batch in batches for r in batch])
    assert finish_from_partials(query, handed) == want
    assert again  # batch 3's window was handed on again, identical


def test_records_for_a_window_flushed_while_idle_hand_it_on_again_whole(
        spark: Any, tmp_path: Path) -> None:
    query = js.optimize(js.Query("q", LOGS.window(js.tumbling("10s"), watermark="2s")
                                 .group_by("domain").agg(n=js.count(), kb=js.sum("bytes"))))
    batches = [[log(t, f"d{t % 3}.com") for t in range(0, 6_000, 500)],
               [log(t, f"d{t % 2}.com") for t in range(4_000, 9_000, 250)],  # after the flush
               [log(t, "d9.com") for t in range(9_000, 25_000, 1_000)]]
    windows: dict[tuple[int, int], list[dict[str, Any]]] = {}
    handed: list[tuple[tuple[int, int], int]] = []
    newest = keep_newest(windows)

    def emit(window: tuple[int, int], rows: list[dict[str, Any]], events: int,
             revision: int) -> None:
        handed.append((window, revision))
        newest(window, rows, events, revision)

    stage = LocalStage(spark, query, tmp_path / "in", checkpoint_dir=tmp_path / "cp",
                       quarantine_dir=tmp_path / "q", emit=emit)
    stage.process_batch(as_text(spark, stage, batches[0]), 0)
    stage.flush()  # the input went quiet: window [0, 10 s) goes out before its watermark
    for batch_id in (1, 2):
        stage.process_batch(as_text(spark, stage, batches[batch_id]), batch_id)
    stage.flush()
    assert handed[:2] == [((0, 10_000), 0), ((0, 10_000), 1)]
    want = js.run_local(query, [r for batch in batches for r in batch])
    assert finish_from_partials(query, windows) == want


def test_a_window_flushed_while_idle_stays_flushed_for_a_stage_started_again(
        spark: Any, tmp_path: Path) -> None:
    """Killed after an idle flush, a stage started on its snapshot hands the window on
    again, with the records that came since, under the next revision: under the flushed
    one's, the site would take it for a repeat and drop it."""
    query = js.optimize(js.Query("q", LOGS.window(js.tumbling("10s"), watermark="2s")
                                 .group_by("domain").agg(n=js.count())))
    handed: list[tuple[tuple[int, int], int]] = []

    def stage() -> LocalStage:
        return LocalStage(spark, query, tmp_path / "in", checkpoint_dir=tmp_path / "cp",
                          quarantine_dir=tmp_path / "q", snapshot=tmp_path / "stage.json",
                          emit=lambda window, rows, events, revision: handed.append(
                              (window, revision)))

    first = stage()
    first.process_batch(as_text(spark, first, [log(t, "a.com") for t in range(0, 5_000, 500)]),
                        0)
    first.flush()  # idle: [0, 10 s) goes out early, then the process is killed
    second = stage()
    second.process_batch(as_text(spark, second, [log(t, "a.com")
                                                 for t in range(5_000, 20_000, 500)]), 1)
    assert handed == [((0, 10_000), 0), ((0, 10_000), 1)]


def test_cdn_top_k_equals_the_reference(spark: Any, tmp_path: Path) -> None:
    query = load_query(ROOT / "examples" / "cdn_topk.py")
    site = ROOT / "examples" / "logs" / "sfo"
    got, stats = run_stage(spark, query, site, tmp_path)
    want = js.run_local(query, site)
    assert got == want
    assert stats.records_in == want.stats.records_in
    assert stats.malformed == {"wrong field count": 1}  # the sample's broken line
    quarantined = [json.loads(line) for f in (tmp_path / "quarantine").glob("*.json")
                   for line in f.read_text().splitlines()]
    assert [q["reason"] for q in quarantined] == ["wrong field count"]
    assert quarantined[0]["line"].startswith("garbage line")


def test_every_splittable_aggregate_and_sliding_windows(spark: Any, tmp_path: Path) -> None:
    query = js.Query("q", LOGS.where(js.col("cache") == "HIT")
                     .with_column("kb", js.col("bytes") / 1024)
                     .window(js.sliding("20s", every="10s"), watermark="5s")
                     .group_by("pop")
                     .agg(n=js.count(), kb=js.sum("kb"), mean=js.avg("latency_ms"),
                          lo=js.min("status"), hi=js.max("bytes"), b=js.sum("bytes")))
    site = ROOT / "examples" / "logs" / "ams"
    got, _ = run_stage(spark, query, site, tmp_path)
    want = js.run_local(query, site)
    assert [(r.window_start, r.window_end) for r in got] == [
        (r.window_start, r.window_end) for r in want]
    assert got == want
    assert repr(got) == repr(want)  # the same floats to the last bit, and ints stay ints


@settings(max_examples=8, deadline=None)
@given(records=st.lists(st.tuples(st.integers(0, 45_000), st.sampled_from(["ams", "fra"]),
                                  st.sampled_from(["HIT", "MISS"]), st.integers(0, 5000)),
                        min_size=1, max_size=30),
       sliding=st.booleans())
def test_counts_under_a_where_in_any_window(spark: Any, tmp_path_factory: pytest.TempPathFactory,
                                            records: list[tuple[int, str, str, int]],
                                            sliding: bool) -> None:
    # count() is read from the stage's count of each group's rows, count(expr) and the sums
    # from columns of their own; records a where drops are read but in no group.
    window = js.sliding("20s", every="10s") if sliding else js.tumbling("10s")
    query = js.Query("q", LOGS.where(js.col("cache") == "HIT")
                     .window(window, watermark="60s").group_by("pop")
                     .agg(n=js.count(), with_bytes=js.count("bytes"), b=js.sum("bytes")))
    rows = [log(1767225600000 + ts, pop=pop, cache=cache, bytes=b)
            for ts, pop, cache, b in records]
    got = run_stage_on_records(spark, query, [rows], tmp_path_factory.mktemp("stage"))
    assert got == js.run_local(query, rows)


def test_sketches_from_spark_stay_within_their_bounds(spark: Any, tmp_path: Path) -> None:
    approx = js.Query("q", LOGS.window(js.tumbling("30s"), watermark="5s").agg(
        users=js.approx_count_distinct("client_ip"), p50=js.approx_quantile("latency_ms"),
        urls=js.top_k("domain", 3)))
    exact = js.Query("q", LOGS.window(js.tumbling("30s"), watermark="5s").agg(
        users=js.count_distinct("client_ip"), p50=js.quantile("latency_ms")))
    site = ROOT / "examples" / "logs" / "sin"
    got, _ = run_stage(spark, approx, site, tmp_path)
    truth = js.run_local(exact, site)
    assert len(got) == len(truth)
    for g, t in zip(got, truth, strict=True):
        assert not g.exact and g.error_bound is not None
        row, true = g.rows[0], t.rows[0]
        assert abs(row["users"] - true["users"]) <= g.error_bound * row["users"] + 1
        assert [u["item"] for u in row["urls"]] == [
            u["item"] for u in js.run_local(approx, site)[got.index(g)].rows[0]["urls"]]


def test_holistic_aggregates_equal_the_reference(spark: Any, tmp_path: Path) -> None:
    query = js.Query("q", LOGS.window(js.tumbling("30s"), watermark="5s").group_by("cache")
                     .agg(users=js.count_distinct("client_ip"), codes=js.count_distinct("status"),
                          p50=js.quantile("latency_ms"), p90=js.quantile("status", 0.9),
                          kb90=js.quantile(js.col("bytes") / 1024, 0.9),
                          mean=js.avg("latency_ms")))
    site = ROOT / "examples" / "logs" / "sin"
    got, _ = run_stage(spark, query, site, tmp_path, split_holistic=True)
    want = js.run_local(query, site)
    assert len(want) > 1
    assert got == want
    assert repr(got) == repr(want)


def _near_powers_of_two() -> st.SearchStrategy[float]:
    return st.builds(lambda k, step, sign: sign * step(2.0**k),
                     st.integers(-1074, 996),
                     st.sampled_from([lambda p: p, lambda p: math.nextafter(p, 0.0),
                                      lambda p: math.nextafter(p, math.inf)]),
                     st.sampled_from([1.0, -1.0]))


# At most 1e300 each and 24 of them: no total can overflow, so the reference is exact too.
# Ordinary values share a band of exponents, and their total needs rounding: next to a value
# of another band, a stage that rounded each band's total would round twice.
FLOATS = st.one_of(
    st.integers(-100_000, 100_000).map(lambda n: n / 100),
    st.floats(min_value=-1e6, max_value=1e6),
    st.floats(min_value=-1e300, max_value=1e300),
    st.sampled_from([0.0, -0.0, 1e300, -1e300, 1e-300, -1e-300, 5e-324, -5e-324,
                     2.2250738585072014e-308, 0.1, 1.0, 3.0]),
    _near_powers_of_two(),
)
SUMS = LOGS.window(js.tumbling("1h"), watermark="5s").group_by("pop")


@settings(max_examples=15, deadline=None)
@given(values=st.lists(st.tuples(st.sampled_from(["g0", "g1", "g2"]), st.integers(0, 1),
                                 FLOATS), min_size=1, max_size=24))
# g0: two bands, the first's total inexact (rounding it before adding the second gives
# 18.65); g1: just below a power of two, where Spark's log2 gives 2.0.
@example(values=[("g0", 0, -0.04), ("g0", 0, -2.95), ("g0", 0, 21.64),
                 ("g1", 1, 3.9999999999999996)])
def test_float_sums_are_exact(spark: Any, tmp_path_factory: pytest.TempPathFactory,
                              values: list[tuple[str, int, float]]) -> None:
    query = js.Query("q", SUMS.agg(total=js.sum("latency_ms"), mean=js.avg("latency_ms"),
                                   n=js.count()))
    records = [log(1767225600000 + i, pop=pop, latency_ms=x)
               for i, (pop, _, x) in enumerate(values)]
    batches = [[r for r, (_, b, _) in zip(records, values, strict=True) if b == batch]
               for batch in (0, 1)]
    got = run_stage_on_records(spark, query, batches, tmp_path_factory.mktemp("stage"))
    want = js.run_local(query, records)
    assert got == want
    assert repr(got) == repr(want)  # the same floats to the last bit, 0.0 and not 0


def test_float_sums_of_infinities_and_nans(spark: Any, tmp_path: Path) -> None:
    # An expression overflows to ±inf, and inf - inf is NaN: the reference's exact partials
    # give inf for one infinity and NaN once there is anything else; so must the stage's.
    query = js.Query("q", LOGS.with_column("y", js.col("latency_ms") * 1e308)
                     .with_column("z", js.col("y") - js.col("y"))
                     .window(js.tumbling("1h"), watermark="5s").group_by("pop")
                     .agg(y=js.sum("y"), mean=js.avg("y"), z=js.sum("z")))
    groups = {"inf": [10.0], "-inf": [-10.0], "inf+x": [10.0, 1e-310], "inf-inf": [10.0, -10.0],
              "two": [10.0, 10.0], "finite": [1e-300, -1e-300], "zero": [-0.0]}
    records = [log(1767225600000, pop=pop, latency_ms=x)
               for pop, xs in groups.items() for x in xs]
    got = run_stage_on_records(spark, query, [records], tmp_path)
    assert repr(got) == repr(js.run_local(query, records))  # repr: NaN == NaN


@settings(max_examples=10, deadline=None)
@given(values=st.lists(st.tuples(st.sampled_from(["g0", "g1"]),
                                 st.one_of(st.integers(-(2**63), 2**63 - 1),
                                           st.integers(-1000, 1000),
                                           st.sampled_from([-(2**63), 2**63 - 1, -1, 0]))),
                       min_size=1, max_size=24))
def test_integer_sums_are_exact_past_64_bits(spark: Any, tmp_path_factory: pytest.TempPathFactory,
                                             values: list[tuple[str, int]]) -> None:
    # Each value fits a bigint, their total need not: the reference's Python int carries on.
    query = js.Query("q", SUMS.agg(total=js.sum("bytes"), mean=js.avg("bytes")))
    records = [log(1767225600000 + i, pop=pop, bytes=x) for i, (pop, x) in enumerate(values)]
    got = run_stage_on_records(spark, query, [records], tmp_path_factory.mktemp("stage"))
    assert got == js.run_local(query, records)


@settings(max_examples=10, deadline=None)
@given(values=st.lists(st.tuples(st.sampled_from(["g0", "g1"]),
                                 st.one_of(st.integers(-(2**63), 2**63 - 1),
                                           st.integers(-100_000, 100_000),
                                           st.sampled_from([-(2**63), 2**63 - 1, 2**53 + 1,
                                                            -1, 0]))),
                       min_size=1, max_size=24))
def test_sums_of_scaled_integers_are_exact(spark: Any, tmp_path_factory: pytest.TempPathFactory,
                                           values: list[tuple[str, int]]) -> None:
    # Integers scaled by powers of two are summed as integers (bytes / 1024, a renamed copy,
    # halves, fours). Past 2**53 a value is rounded, then scaled exactly, in the reference as
    # in Spark. (Not so for other divisors: see jetstream.stage.compile on ``/``.)
    query = js.Query("q", LOGS.with_column("kb", js.col("bytes") / 1024)
                     .with_column("half", js.col("bytes") * 0.5)
                     .with_column("fours", 4.0 * js.col("bytes"))
                     .select("pop", "ts", "half", "fours", kib=js.col("kb"))
                     .window(js.tumbling("1h"), watermark="5s").group_by("pop")
                     .agg(kib=js.sum("kib"), half=js.avg("half"), fours=js.sum("fours")))
    records = [log(1767225600000 + i, pop=pop, bytes=x) for i, (pop, x) in enumerate(values)]
    got = run_stage_on_records(spark, query, [records], tmp_path_factory.mktemp("stage"))
    want = js.run_local(query, records)
    assert repr(got) == repr(want)


@pytest.mark.parametrize(("steps", "exponent"), [
    (lambda s: s.with_column("x", js.col("bytes") / 1024), -10),
    (lambda s: s.with_column("x", js.col("bytes") * 0.25).select("ts", "pop", "x"), -2),
    (lambda s: s.with_column("y", js.col("bytes") * 1.0).select("ts", "pop", x=js.col("y")), 0),
    (lambda s: s.with_column("x", js.col("bytes") / 1000), None),  # not a power of two
    (lambda s: s.with_column("x", js.col("latency_ms") / 1024), None),  # not an integer
    # The operand's type where the column was made counts, not after a later step:
    (lambda s: s.with_column("x", js.col("bytes") / 2).with_column("bytes", js.col("x")), -1),
    (lambda s: s.with_column("x", js.col("latency_ms") / 2)
     .with_column("latency_ms", js.col("bytes")), None),
    (lambda s: s.with_column("x", js.col("latency_ms")), None),
])
def test_which_float_sums_are_summed_as_scaled_integers(spark: Any, tmp_path: Path, steps: Any,
                                                        exponent: int | None) -> None:
    query = js.optimize(js.Query("q", steps(LOGS).window(js.tumbling("1h"), watermark="5s")
                                 .group_by("pop").agg(x=js.sum("x"))))
    stage = LocalStage(spark, query, tmp_path, checkpoint_dir=tmp_path / "c",
                       quarantine_dir=tmp_path / "q", emit=lambda *_: None)
    band = stage._compiled.parts[0]["_in0_x_e"]  # a literal for a scaled integer
    assert (str(band) == f"Column<'{exponent}'>") if exponent is not None else "log2" in str(band)


@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_lookup_join_and_a_map_in_the_stage_equal_the_reference(
        spark: Any, tmp_path_factory: pytest.TempPathFactory, how: str) -> None:
    customers = js.Table("customers", js.Schema.of({
        "domain": js.DataType.STRING, "customer": js.DataType.STRING,
        "weight": js.DataType.INT}), (
        {"domain": "a.com", "customer": "acme", "weight": 2},
        {"domain": "b.com", "customer": "bolt", "weight": None},
        {"domain": "c.com", "customer": "acme", "weight": 5}))

    def weigh(record: dict[str, Any]) -> dict[str, Any]:  # a closure: pickled by value
        return {**record, "weighted": record["bytes"] * (record["weight"] or 1)}

    schema = {**LOGS.schema.fields_by_name(), "customer": js.DataType.STRING,
              "weight": js.DataType.INT, "weighted": js.DataType.INT}
    query = js.Query("q", LOGS.join(customers, on="domain", how=how)
                     .where(js.col("weight") > 1)
                     .map(weigh, schema=schema, name="weigh", changes=["weighted"])
                     .window(js.tumbling("10s"), watermark="5s")
                     .group_by("customer", "domain")
                     .agg(n=js.count(), weighted=js.sum("weighted"), ms=js.max("latency_ms")))
    records = [log(1767225600000 + 700 * i, ("a.com", "b.com", "c.com", "d.com")[i % 4],
                   bytes=100 * i) for i in range(40)]
    batches = [records[:25], records[25:]]
    got = run_stage_on_records(spark, query, batches, tmp_path_factory.mktemp("stage"))
    want = js.run_local(query, records)
    assert got == want and len(want) >= 2


def test_a_batch_with_nothing_valid_counts_what_it_read(spark: Any, tmp_path: Path) -> None:
    """A file with only its header, and one whose records a filter drops, still count: the
    counters ride on the batch's one job, which then collects no rows."""
    query = js.Query("q", LOGS.where(js.col("status") > 999)
                     .window(js.tumbling("10s"), watermark="1s").agg(n=js.count()))
    site = tmp_path / "in"
    site.mkdir()
    header = ",".join(f.name for f in LOGS.schema)
    (site / "a.csv").write_text(header + "\n")
    (site / "b.csv").write_text(header + "\n" + "\n".join(
        ",".join(str(r[f.name]) for f in LOGS.schema) for r in (log(1000), log(20_000)))
        + "\nnot,a,record\n")
    got, stats = run_stage(spark, query, site, tmp_path)
    assert got == js.run_local(js.optimize(query), site) == []
    assert stats.records_in == 2
    assert stats.malformed == {"wrong field count": 1}


def test_a_live_micro_batch_is_one_spark_job(spark: Any, tmp_path: Path) -> None:
    """Parsing, counting, lateness and the partials of a batch are one Spark job (plus one,
    only in a batch with malformed lines, that sets them aside)."""
    optimized = js.optimize(load_query(ROOT / "examples" / "cdn_topk.py"))
    site = tmp_path / "in"
    site.mkdir()
    header = ",".join(f.name for f in LOGS.schema)
    done: list[float] = []
    stage = LocalStage(spark, optimized, site, checkpoint_dir=tmp_path / "checkpoint",
                       quarantine_dir=tmp_path / "quarantine", emit=lambda *_: None,
                       on_batch=lambda stats, seconds: done.append(seconds))
    stage.start(trigger_s=0.1)
    try:
        for i in range(4):  # a file a batch, the later ones with late records in them
            lines = [",".join(str(r[f.name]) for f in LOGS.schema)
                     for r in (log(i * 6_000 + t, f"d{t % 5}.com") for t in range(0, 6_000, 100))]
            (tmp_path / "f.csv").write_text(header + "\n" + "\n".join(lines) + "\n")
            (tmp_path / "f.csv").rename(site / f"{i}.csv")
            deadline = time.monotonic() + 120
            while len(done) <= i and time.monotonic() < deadline:
                time.sleep(0.05)
        assert len(done) == stage.stats.batches == 4
        assert stage.jobs_run() == 4
    finally:
        stage.stop()
    assert stage.stats.records_in == 240


def test_a_stop_that_interrupts_a_batch_ends_the_stream_quietly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An interrupted micro-batch's error goes back to Spark short enough for its
    interruption pattern (StreamExecution.PROXY_ERROR, one frame per character: on the usual
    text of several kB it overflowed the stream thread's stack), and py4j does not log it;
    any other error, or one while not stopping, goes back as it is."""
    import logging
    import re

    from jetstream.stage import batches

    class Py4JJavaError(Exception):
        """What pyspark raises for a Java exception (py4j's needs a live JVM to print)."""

    proxy_error = re.compile(r"py4j.protocol.Py4JJavaError: An error occurred while calling"
                             r"((.|\r\n|\r|\n)*)(java.lang.InterruptedException|"
                             r"java.io.InterruptedIOException|"
                             r"java.nio.channels.ClosedByInterruptException)")
    trace = "\n".join(f"\tat org.apache.spark.Frame{i}(Frame.scala:{i})" for i in range(300))
    interrupted = Py4JJavaError("An error occurred while calling o789.collectToPython.\n"
                            f": java.lang.InterruptedException\n{trace}")
    stage = LocalStage.__new__(LocalStage)
    stage._stopping = True
    with pytest.raises(batches._Interrupted) as raised, batches.stopped_quietly(stage):
        raise interrupted
    text = str(raised.value)  # what Spark matches, in py4j's traceback of it
    assert len(text) < 200 and proxy_error.search(text)
    with caplog.at_level(logging.ERROR, logger="py4j.clientserver"):
        try:
            raise raised.value
        except batches._Interrupted:
            logging.getLogger("py4j.clientserver").exception("callback failed")
    assert caplog.records == []
    stage._stopping = False  # not stopping: an interruption is an error like any other
    with pytest.raises(Py4JJavaError), batches.stopped_quietly(stage):
        raise interrupted
    stage._stopping = True
    with pytest.raises(ValueError, match="bad"), batches.stopped_quietly(stage):
        raise ValueError("bad")
