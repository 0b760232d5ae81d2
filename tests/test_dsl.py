"""Building queries: each operator's output schema and properties, and every refusal."""

from __future__ import annotations

import re

import pytest

import jetstream as js
from jetstream import col
from jetstream.expr import Monotonicity
from jetstream.operators import Map, Select, Source, TopK, Union, Where, Window, WindowAggregate


def windowed(stream: js.Stream) -> js.Stream:
    return stream.window(js.tumbling("10s"))


# -- each operator ---------------------------------------------------------------------------

def test_source_carries_schema_and_event_time(logs: js.Stream) -> None:
    assert isinstance(logs.plan.output, Source)
    assert logs.schema is js.CDN_LOG_SCHEMA
    assert logs.schema.event_time == "ts"


def test_where_keeps_schema(logs: js.Stream) -> None:
    s = logs.where(col("status") < 500)
    assert isinstance(s.plan.output, Where)
    assert s.schema == logs.schema


def test_with_column_adds_typed_column(logs: js.Stream) -> None:
    s = logs.with_column("kb", col("bytes") / 1024).with_column("ok", col("status") < 400)
    assert s.schema.dtype("kb") is js.DataType.FLOAT
    assert s.schema.dtype("ok") is js.DataType.BOOL
    assert s.schema.names[-2:] == ("kb", "ok")


def test_with_column_replaces_in_place_and_accepts_literals(logs: js.Stream) -> None:
    s = logs.with_column("status", 0).with_column("region", "eu")
    assert s.schema.names.index("status") == logs.schema.names.index("status")
    assert s.schema.dtype("region") is js.DataType.STRING


def test_select_projects_and_renames(logs: js.Stream) -> None:
    s = logs.select("ts", col("domain"), kb=col("bytes") / 1024)
    assert isinstance(s.plan.output, Select)
    assert s.schema.names == ("ts", "domain", "kb")
    assert s.schema.event_time == "ts"


def test_select_without_time_column_cannot_be_windowed(logs: js.Stream) -> None:
    s = logs.select("domain")
    assert s.schema.event_time is None
    with pytest.raises(js.PlanError, match="window: the input has no event time column"):
        s.window(js.tumbling("1s"))


def test_map_with_schema_and_monotonic_flag(logs: js.Stream) -> None:
    s = logs.map(lambda r: {"ts": r["ts"], "n": 1},
                 schema={"ts": js.DataType.INT, "n": js.DataType.INT}, monotonic=True, name="ones")
    op = s.plan.output
    assert isinstance(op, Map)
    assert s.schema.names == ("ts", "n") and s.schema.event_time == "ts"
    assert op.monotonic_in() == {"ts": Monotonicity.INCREASING, "n": Monotonicity.INCREASING}
    assert "map ones (monotonic)" in str(s.plan)


def test_union_of_two_sources(logs: js.Stream) -> None:
    other = js.source("more_logs", schema=js.CDN_LOG_SCHEMA)
    u = logs.union(other)
    assert isinstance(u.plan.output, Union)
    assert len(u.plan.inputs(u.plan.sink)) == 2
    assert [s.name for s in u.plan.sources()] == ["cdn_logs", "more_logs"]


def test_window_then_aggregate_then_top_k(logs: js.Stream) -> None:
    s = (logs.window(js.sliding("1m", every="10s"), watermark="5s")
         .group_by("domain", "pop")
         .agg(requests=js.count(), kb=js.sum(col("bytes") / 1024), p99=js.quantile("latency_ms",
                                                                                   0.99))
         .top_k(3, by="requests"))
    top = s.plan.output
    assert isinstance(top, TopK) and top.tie_break == ("domain", "pop")
    window = s.window_op
    assert isinstance(window, Window)
    assert (window.spec.size_ms, window.spec.every_ms, window.watermark_ms) == (60000, 10000, 5000)
    agg = s.aggregate_op
    assert isinstance(agg, WindowAggregate)
    assert agg.keyed_by == ("domain", "pop")
    assert not agg.decomposable  # exact quantile is holistic
    assert s.schema.names == ("domain", "pop", "requests", "kb", "p99")
    assert s.schema.dtype("kb") is js.DataType.FLOAT


def test_having_is_a_where_after_the_aggregate(logs: js.Stream) -> None:
    s = windowed(logs).group_by("domain").agg(n=js.count()).where(col("n") > 10)
    assert isinstance(s.plan.output, Where)
    assert s.aggregate_op is not None


def test_global_aggregate_without_keys(logs: js.Stream) -> None:
    s = windowed(logs).agg(n=js.count(), users=js.approx_count_distinct("client_ip"))
    assert s.schema.names == ("n", "users")
    assert s.aggregate_op is not None and not s.aggregate_op.exact


def test_streams_are_immutable(logs: js.Stream) -> None:
    before = logs.plan.graph.number_of_nodes()
    logs.where(col("status") < 500)
    assert logs.plan.graph.number_of_nodes() == before


def test_plan_prints_readably(logs: js.Stream) -> None:
    q = js.Query("q", windowed(logs.where(col("status") < 500).with_column("kb", col("bytes") / 2))
                 .group_by("domain").agg(n=js.count()).top_k(2, by="n"))
    text = str(q.plan())
    lines = [re.sub(r"\s+", " ", line.strip()) for line in text.splitlines()]
    assert lines[0].startswith("#1 source cdn_logs [stateless]")
    assert "#2 where status < 500 <- #1 [stateless]" in lines
    assert "#3 with_column kb = bytes / 2 <- #2 [stateless; increasing in bytes]" in lines
    assert any(line.startswith("#5 aggregate by domain: n=count() <- #4 [stateful; keyed_by=domain;"
                               " decomposable]") for line in lines)
    assert "-> (domain:string, n:int)" in lines
    assert q.describe().startswith("query q  (slo: none)")


# -- refusals: each names the step and the column --------------------------------------------

@pytest.mark.parametrize(("build", "message"), [
    (lambda s: s.where(col("stauts") < 500), "where: unknown column 'stauts'"),
    (lambda s: s.where(col("domain") < 500), "where: cannot compare domain (string) with 500"),
    (lambda s: s.where(col("status")), "where: status is not a condition"),
    (lambda s: s.where(col("status") + 1 > col("domain")), "where: cannot compare"),
    (lambda s: s.with_column("x", col("domain") * 2), "with_column x: '*' needs a number"),
    (lambda s: s.select("nope"), "select nope: unknown column 'nope'"),
    (lambda s: s.select("ts", "ts"), "select: column 'ts' is selected twice"),
    (lambda s: s.group_by("domain").agg(n=js.count()), "agg: the stream has no window"),
    (lambda s: s.agg(n=js.count()), "agg: the stream has no window"),
    (lambda s: windowed(s).group_by("nope"), "group_by: unknown column 'nope'"),
    (lambda s: windowed(s).group_by("domain").agg(n=js.sum("domain")),
     "agg n: sum needs a number, but domain is string"),
    (lambda s: windowed(s).group_by("domain").agg(n=js.avg("nope")),
     "agg n: unknown column 'nope'"),
    (lambda s: windowed(s).group_by("domain").agg(domain=js.count()),
     "agg domain: the name is already a group key"),
    (lambda s: windowed(s).group_by("domain").agg(), "agg: give at least one aggregate"),
    (lambda s: windowed(s).group_by("domain").agg(n=len), "agg n: expected an aggregate"),
    (lambda s: windowed(s).group_by("domain").agg(n=js.count()).top_k(3, by="requests"),
     "top_k by requests: unknown column 'requests'"),
    (lambda s: windowed(s).group_by("domain").agg(n=js.count()).top_k(0, by="n"),
     "top_k by n: k must be a positive integer"),
    (lambda s: windowed(s).top_k(3, by="bytes"), "top_k by bytes: needs an aggregated stream"),
    (lambda s: windowed(s).group_by("domain").agg(n=js.count()).where(col("bytes") > 1),
     "having: unknown column 'bytes'"),
    (lambda s: windowed(windowed(s)), "window: the stream is already windowed"),
    (lambda s: s.window(js.tumbling("10s"), watermark="-1s"),
     "window watermark: '-1s' is not a duration"),
    (lambda s: s.window(js.tumbling("10s"), watermark="5s", early="6s"),
     "window: early=6s is past the watermark (5s): a window closes then; give early at most"),
    (lambda s: s.window(js.tumbling("10s"), watermark="5s", early="soon"),
     "window early: 'soon' is not a duration"),
    (lambda s: s.select("domain").window(js.tumbling("10s")),
     "window: the input has no event time column"),
    (lambda s: s.map(lambda r: r, changes=["nope"], name="f"),
     "map f: changes names unknown column 'nope'"),
    (lambda s: s.map(lambda r: r, schema={"ts": js.DataType.INT, "n": js.DataType.INT},
                     changes=[], name="f"),
     "map f: the function adds column 'n', so changes must name it"),
    (lambda s: s.window("10s"), "window: expected js.tumbling"),
    (lambda s: s.union(s.select("ts")), "union: the inputs differ in columns"),
    (lambda s: s.union(windowed(s)), "union: the inputs are windowed or aggregated differently"),
    (lambda s: windowed(s).group_by("domain").agg(n=js.count()).group_by("domain")
     .agg(m=js.count()), "agg: the stream is already aggregated"),
])
def test_bad_queries_are_refused_when_built(logs: js.Stream, build, message: str) -> None:
    with pytest.raises(js.PlanError, match=re.escape(message)):
        build(logs)


def test_query_needs_an_aggregated_output(logs: js.Stream) -> None:
    with pytest.raises(js.PlanError, match="query q: the output is not aggregated"):
        js.Query("q", windowed(logs))
    with pytest.raises(js.PlanError, match="query: a query needs a non-empty name"):
        js.Query("", windowed(logs).agg(n=js.count()))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_latency": "0s"}, "max_latency must be positive"),
    ({"max_latency": 3}, "slo max_latency: 3 is not a duration"),
    ({"max_error": 1.5}, "max_error is a fraction"),
    ({"max_wan_kbps": -1}, "max_wan_kbps must be a positive number"),
])
def test_bad_slo_is_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(js.PlanError, match=message):
        js.SLO(**kwargs)  # type: ignore[arg-type]


def test_slo_parses_latency() -> None:
    slo = js.SLO(max_latency="3s", max_error=0.01, max_wan_kbps=512)
    assert slo.max_latency_ms == 3000
    assert str(slo) == "max_latency=3s, max_error=0.01, max_wan_kbps=512"


def test_source_needs_a_schema() -> None:
    with pytest.raises(js.PlanError, match=r"source x: schema must be a js\.Schema"):
        js.source("x", schema={"ts": "int"})  # type: ignore[arg-type]


def test_schema_refuses_duplicate_and_bad_time_columns() -> None:
    with pytest.raises(js.PlanError, match="column 'a' appears twice"):
        js.Schema((js.Field("a", js.DataType.INT), js.Field("a", js.DataType.INT)))
    with pytest.raises(js.PlanError, match="event time column 'a' must be int"):
        js.Schema.of({"a": js.DataType.STRING}, event_time="a")
