"""The reference executor: windows, watermarks, every operator, and bad input."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream import col
from tests.conftest import log


def counts(results: list[js.WindowResult], key: str = "domain") -> dict[tuple[int, int], dict]:
    return {(r.window_start, r.window_end): {row[key]: row["n"] for row in r.rows}
            for r in results}


def count_by_domain(logs: js.Stream, window: Any = None, watermark: str = "0s") -> js.Query:
    stream = logs.window(window or js.tumbling("10s"), watermark=watermark)
    return js.Query("q", stream.group_by("domain").agg(n=js.count()))


# -- windows and watermarks ------------------------------------------------------------------

def test_tumbling_window_boundaries(logs: js.Stream) -> None:
    events = [log(0), log(9_999), log(10_000), log(-1)]
    out = js.run_local(count_by_domain(logs, watermark="20s"), events)
    assert counts(out) == {(-10_000, 0): {"a.com": 1}, (0, 10_000): {"a.com": 2},
                           (10_000, 20_000): {"a.com": 1}}
    assert out.stats.late_records == 0 and out.stats.records_in == 4


def test_sliding_window_counts_each_event_in_every_window(logs: js.Stream) -> None:
    query = count_by_domain(logs, js.sliding("10s", every="5s"), watermark="1m")
    out = js.run_local(query, [log(1_000), log(6_000), log(12_000)])
    assert counts(out) == {(-5_000, 5_000): {"a.com": 1}, (0, 10_000): {"a.com": 2},
                           (5_000, 15_000): {"a.com": 2}, (10_000, 20_000): {"a.com": 1}}


def test_late_records_are_dropped_and_counted(logs: js.Stream) -> None:
    # After ts=25s the watermark is 20s: windows ending at or before 20s are closed.
    events = [log(1_000), log(25_000), log(9_000, "late.com"), log(19_999, "late.com"),
              log(20_000, "ok.com")]
    out = js.run_local(count_by_domain(logs, watermark="5s"), events)
    assert counts(out) == {(0, 10_000): {"a.com": 1}, (20_000, 30_000): {"a.com": 1, "ok.com": 1}}
    assert out.stats.late_records == 2


def test_window_closes_exactly_when_watermark_reaches_its_end(logs: js.Stream) -> None:
    out = js.run_local(count_by_domain(logs), [log(10_000), log(9_999), log(10_000)])
    assert counts(out) == {(10_000, 20_000): {"a.com": 2}}
    assert out.stats.late_records == 1


def test_watermark_tolerates_disorder_within_its_bound(logs: js.Stream) -> None:
    events = [log(12_000), log(8_000), log(15_000), log(11_000)]
    out = js.run_local(count_by_domain(logs, watermark="4s"), events)
    assert out.stats.late_records == 0
    assert counts(out) == {(0, 10_000): {"a.com": 1}, (10_000, 20_000): {"a.com": 3}}


def test_sliding_record_late_for_one_window_still_counts_in_the_next(logs: js.Stream) -> None:
    query = count_by_domain(logs, js.sliding("10s", every="5s"))
    out = js.run_local(query, [log(11_000), log(9_000, "b.com")])
    # Watermark 11s closes [0, 10s) but not [5s, 15s).
    assert counts(out)[(5_000, 15_000)] == {"a.com": 1, "b.com": 1}
    assert "b.com" not in counts(out).get((0, 10_000), {})
    assert out.stats.late_records == 1


# -- operators -------------------------------------------------------------------------------

def test_where_with_column_select_and_sum(logs: js.Stream) -> None:
    q = js.Query("q", logs.where(col("status") < 500)
                 .with_column("kb", col("bytes") / 1000)
                 .select("ts", "domain", "kb")
                 .window(js.tumbling("10s"))
                 .group_by("domain").agg(n=js.count(), kb=js.sum("kb"), top=js.max("kb")))
    events = [log(1, bytes=1000), log(2, bytes=3000), log(3, status=503, bytes=9000),
              log(4, "b.com", bytes=500)]
    (result,) = js.run_local(q, events)
    assert result.rows == [{"domain": "a.com", "n": 2, "kb": 4.0, "top": 3.0},
                           {"domain": "b.com", "n": 1, "kb": 0.5, "top": 0.5}]
    assert result.exact and result.error_bound == 0.0


def test_nulls_from_division_by_zero_are_skipped_by_aggregates(logs: js.Stream) -> None:
    q = js.Query("q", logs.with_column("per_ms", col("bytes") / col("latency_ms"))
                 .window(js.tumbling("10s"))
                 .agg(n=js.count(), m=js.count("per_ms"), avg=js.avg("per_ms")))
    (result,) = js.run_local(q, [log(1, latency_ms=0.0), log(2, latency_ms=2.0)])
    assert result.rows == [{"n": 2, "m": 1, "avg": 500.0}]


def test_map_applies_an_opaque_function(logs: js.Stream) -> None:
    def region(r: dict[str, Any]) -> dict[str, Any]:
        return {**r, "pop": r["pop"].upper()}

    q = js.Query("q", logs.map(region).window(js.tumbling("1s")).group_by("pop")
                 .agg(n=js.count()))
    (result,) = js.run_local(q, [log(1, pop="ams"), log(2, pop="sfo")])
    assert result.rows == [{"pop": "AMS", "n": 1}, {"pop": "SFO", "n": 1}]


def test_map_errors_name_the_step(logs: js.Stream) -> None:
    def broken(r: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("boom")

    q = js.Query("q", logs.map(broken).window(js.tumbling("1s")).agg(n=js.count()))
    with pytest.raises(js.DataError, match="map broken: the function raised ValueError: boom"):
        js.run_local(q, [log(1)])
    q = js.Query("q", logs.map(lambda r: {"ts": 1}, name="short").window(js.tumbling("1s"))
                 .agg(n=js.count()))
    with pytest.raises(js.DataError, match=r"map short: the function returned .* lacks 'pop'"):
        js.run_local(q, [log(1)])


def test_having_and_top_k_with_ties(logs: js.Stream) -> None:
    q = js.Query("q", logs.window(js.tumbling("10s")).group_by("domain").agg(n=js.count())
                 .where(col("n") >= 2).top_k(2, by="n"))
    events = [log(i, d) for i, d in enumerate(["c", "c", "b", "b", "a", "a", "a", "d"])]
    (result,) = js.run_local(q, events)
    # a has 3; b and c tie at 2 and the smaller key wins; d is cut by having.
    assert result.rows == [{"domain": "a", "n": 3}, {"domain": "b", "n": 2}]


def test_top_k_larger_than_the_window_keeps_every_row(logs: js.Stream) -> None:
    q = js.Query("q", logs.window(js.tumbling("10s")).group_by("domain").agg(n=js.count())
                 .top_k(10, by="n"))
    (result,) = js.run_local(q, [log(1, "x"), log(2, "y"), log(3, "y")])
    assert result.rows == [{"domain": "y", "n": 2}, {"domain": "x", "n": 1}]


def test_window_whose_rows_are_all_filtered_is_not_reported(logs: js.Stream) -> None:
    q = js.Query("q", logs.window(js.tumbling("10s")).agg(n=js.count()).where(col("n") > 1))
    out = js.run_local(q, [log(1), log(10_001), log(10_002)])
    assert [(r.window_start, r.rows) for r in out] == [(10_000, [{"n": 2}])]


def test_union_of_sources_interleaves_by_event_time() -> None:
    eu = js.source("eu", schema=js.CDN_LOG_SCHEMA)
    us = js.source("us", schema=js.CDN_LOG_SCHEMA)
    q = count_by_domain(eu.union(us))
    out = js.run_local(q, {"eu": [log(1_000, "e"), log(15_000, "e")],
                           "us": [log(2_000, "u"), log(16_000, "u")]})
    assert out.stats.late_records == 0
    assert counts(out) == {(0, 10_000): {"e": 1, "u": 1}, (10_000, 20_000): {"e": 1, "u": 1}}


def test_events_must_say_which_source_they_feed() -> None:
    eu = js.source("eu", schema=js.CDN_LOG_SCHEMA)
    q = count_by_domain(eu.union(js.source("us", schema=js.CDN_LOG_SCHEMA)))
    with pytest.raises(js.PlanError, match="pass events as a dict"):
        js.run_local(q, [log(1)])
    with pytest.raises(js.PlanError, match="no source named 'asia'"):
        js.run_local(q, {"asia": [log(1)]})


def test_approximate_aggregates_report_their_error(logs: js.Stream) -> None:
    q = js.Query("q", logs.window(js.tumbling("1m")).agg(
        users=js.approx_count_distinct("client_ip"), p50=js.approx_quantile("latency_ms", k=8),
        urls=js.top_k("url", 2)))
    events = [log(i, client_ip=f"10.0.{i % 50}.1", latency_ms=float(i), url=f"/u{i % 3}")
              for i in range(600)]
    (result,) = js.run_local(q, events)
    assert not result.exact
    assert result.error_bound is not None and result.error_bound > 0
    row = result.rows[0]
    assert abs(row["users"] - 50) <= result.error_bound * row["users"]
    assert abs(row["p50"] - 300) <= result.error_bound * 600 + 1
    assert [u["item"] for u in row["urls"]] == ["/u0", "/u1"]


# -- bad input is counted and set aside ------------------------------------------------------

def test_bad_records_are_counted_not_fatal(logs: js.Stream) -> None:
    events: list[Any] = [log(1), {"ts": 2}, log(3, status="500"), log(4, bytes=True),
                         log(5, latency_ms=math.nan), "not a record", log(6, domain=None), log(7)]
    out = js.run_local(count_by_domain(logs), events)
    assert counts(out) == {(0, 10_000): {"a.com": 2}}
    assert out.stats.records_in == 2
    assert out.stats.rejects.total == 6
    assert out.stats.rejects.counts == {"missing field": 2, "ill-typed field": 3,
                                        "not a record": 1}
    assert out.stats.rejects.kept[0].where == "record 1"


HEADER = "ts,pop,client_ip,domain,url,status,bytes,latency_ms,cache\n"


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def line(ts: int, domain: str = "a.com", status: str = "200") -> str:
    return f"{ts},ams,198.51.100.7,{domain},http://{domain}/,{status},100,3.5,HIT\n"


def test_csv_directory_one_stream_per_site(tmp_path: Path, logs: js.Stream) -> None:
    write(tmp_path / "ams" / "part-0.csv", HEADER + line(1_000) + line(12_000))
    write(tmp_path / "ams" / "part-1.csv", HEADER + line(13_000))
    write(tmp_path / "sfo" / "part-0.csv", HEADER + line(2_000, "b.com") + line(14_000, "b.com"))
    out = js.run_local(count_by_domain(logs), tmp_path)
    assert out.stats.late_records == 0
    assert counts(out) == {(0, 10_000): {"a.com": 1, "b.com": 1},
                           (10_000, 20_000): {"a.com": 2, "b.com": 1}}


def test_malformed_csv_lines_and_files_are_set_aside(tmp_path: Path, logs: js.Stream) -> None:
    write(tmp_path / "ams" / "a.csv", HEADER + line(1) + "garbage\n" + line(2, status="oops")
          + "\n" + line(3) + line(4)[:-1] + ",extra\n")
    write(tmp_path / "ams" / "b.csv", "ts,pop\n1,ams\n")
    write(tmp_path / "ams" / "c.csv", "")
    write(tmp_path / "ams" / "d.csv", HEADER.encode() + b"\xff\xfe,broken\n")
    out = js.run_local(count_by_domain(logs), tmp_path)
    assert counts(out) == {(0, 10_000): {"a.com": 2}}
    assert out.stats.rejects.counts == {"wrong field count": 2, "ill-typed field": 1,
                                        "bad header": 1, "unreadable file": 1}
    reasons = {r.where.rsplit("/", 1)[-1]: r.reason for r in out.stats.rejects.kept}
    assert reasons["a.csv:3"] == "wrong field count: 1, expected 9"
    assert reasons["a.csv:4"] == "ill-typed field: status should be int, got 'oops'"
    assert reasons["b.csv"].startswith("bad header: missing client_ip")


def test_missing_input_path_is_an_error(logs: js.Stream, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        js.run_local(count_by_domain(logs), tmp_path / "nope")


# -- the oracle agrees with brute force ------------------------------------------------------

EVENTS = st.lists(st.tuples(st.integers(-30_000, 60_000), st.sampled_from("abc"),
                            st.integers(0, 9)), max_size=60)
SPECS = st.sampled_from([js.tumbling("10s"), js.tumbling("7s"), js.sliding("10s", every="5s"),
                         js.sliding("10s", every="3s")])


def brute_force(events: list[tuple[int, str, int]], spec: Any) -> dict:
    """Per window and domain, (count, sum, min, max) of status, by enumerating window starts."""
    groups: dict = defaultdict(list)
    for ts, domain, status in events:
        if status >= 5:
            continue
        for start in range(-100_000 - (-100_000 % spec.every_ms), 100_000, spec.every_ms):
            if start <= ts < start + spec.size_ms:
                groups[(start, start + spec.size_ms)].append((domain, status))
    return {w: {d: (len(v := [s for dd, s in rows if dd == d]), sum(v), min(v), max(v))
                for d in {dd for dd, _ in rows}}
            for w, rows in groups.items()}


@settings(max_examples=150, deadline=None)
@given(EVENTS, SPECS)
def test_run_local_matches_brute_force_when_nothing_is_late(events, spec) -> None:
    logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
    q = js.Query("q", logs.where(col("status") < 5).window(spec, watermark="100s")
                 .group_by("domain")
                 .agg(n=js.count(), s=js.sum("status"), lo=js.min("status"), hi=js.max("status")))
    out = js.run_local(q, [log(ts, d, status=s) for ts, d, s in events])
    got = {(r.window_start, r.window_end): {row["domain"]: (row["n"], row["s"], row["lo"],
                                                            row["hi"]) for row in r.rows}
           for r in out}
    assert got == brute_force(events, spec)
    assert out.stats.late_records == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 100_000), max_size=40), SPECS)
def test_records_in_time_order_are_never_late(times: list[int], spec: Any) -> None:
    logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
    out = js.run_local(count_by_domain(logs, spec), [log(t) for t in sorted(times)])
    assert out.stats.late_records == 0
    total = sum(row["n"] for r in out for row in r.rows)
    assert total == sum(len(spec.windows_of(t)) for t in times)
