"""A query's plan as a message: every step and expression survives the trip, and a reader
refuses what it cannot read (another version, code it was not told to allow, a forged step)."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.errors import PlanError
from jetstream.expr import Expr, col, lit
from jetstream.planwire import (
    PLAN_VERSION,
    expr_from_proto,
    expr_to_proto,
    query_from_bytes,
    query_from_proto,
    query_to_bytes,
    query_to_proto,
)
from jetstream.queryfile import load_query
from jetstream.v1 import query_pb2 as pb
from tests.conftest import log

ROOT = Path(__file__).resolve().parent.parent
LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)

_numbers = st.recursive(
    st.one_of(st.sampled_from([col("bytes"), col("latency_ms"), col("status")]),
              st.integers(-(2**63), 2**63 - 1).map(lit),
              st.floats(allow_nan=False, allow_infinity=False).map(lit)),
    lambda children: st.one_of(
        st.builds(operator.add, children, children),
        st.builds(operator.sub, children, children),
        st.builds(operator.mul, children, children),
        st.builds(operator.truediv, children, children),
        st.builds(operator.neg, children)),
    max_leaves=6)
_conditions = st.recursive(
    st.one_of(
        st.builds(lambda op, a, b: op(a, b),
                  st.sampled_from([operator.lt, operator.le, operator.gt, operator.ge,
                                   operator.eq, operator.ne]), _numbers, _numbers),
        st.builds(lambda vs: col("domain").isin(*vs), st.lists(st.text(max_size=5), max_size=3)),
        st.builds(lambda vs: col("status").isin(*vs),
                  st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)),
        st.builds(lambda fn, v: fn(col("url")) == v,
                  st.sampled_from([Expr.lower, Expr.url_domain]), st.text(max_size=5)),
        st.just(col("cache") == lit("HIT")),
        st.just(lit(True) == lit(False))),
    lambda children: st.one_of(st.builds(operator.and_, children, children),
                               st.builds(operator.or_, children, children),
                               st.builds(operator.invert, children)),
    max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(_conditions)
def test_every_expression_survives_the_trip(expr: Expr) -> None:
    data = expr_to_proto(expr).SerializeToString()
    back = expr_from_proto(pb.Expr.FromString(data))
    assert back.same_as(expr) and str(back) == str(expr)
    row = log(1000, "a.com")
    assert repr(back.evaluate(row)) == repr(expr.evaluate(row))


def _tables(tmp_path: Path) -> js.Table:
    (tmp_path / "customers.csv").write_text(
        "domain,customer,tier,weight\na.com,acme,gold,1.5\nb.com,bolt,silver,\n")
    return js.table("customers", tmp_path / "customers.csv", schema=js.Schema.of({
        "domain": js.DataType.STRING, "customer": js.DataType.STRING,
        "tier": js.DataType.STRING, "weight": js.DataType.FLOAT}))


def _double(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "bytes": record["bytes"] * 2}


def every_step(tmp_path: Path) -> list[js.Query]:
    """Queries that use every step and aggregate the DSL has."""
    customers = _tables(tmp_path)
    other = js.source("more_logs", schema=js.CDN_LOG_SCHEMA)
    joined = (LOGS.union(other).join(customers, on="domain", how="left")
              .where((col("tier") == "gold") | col("tier").isin("silver"))
              .with_column("kb", col("bytes") / 1024)
              .map(_double, changes=["bytes"], name="double")
              .select("ts", "domain", "customer", "kb", "bytes", "latency_ms", "url",
                      weight=col("weight") * 2))
    aggregates = dict(n=js.count(), rows=js.count("url"), kb=js.sum("kb"), lo=js.min("bytes"),
                      hi=js.max("bytes"), mean=js.avg("latency_ms"),
                      urls=js.count_distinct("url"), p9=js.quantile("latency_ms", 0.9),
                      hll=js.approx_count_distinct("url", lg_k=10),
                      kll=js.approx_quantile("latency_ms", 0.5, k=100),
                      top=js.top_k("url", 3, lg_max_k=8))
    return [
        js.Query("everything", joined.window(js.sliding("1m", every="10s"), watermark="2s",
                                                     early="1500ms")
                 .group_by("customer", "domain").agg(**aggregates)
                 .where(col("n") > 1).top_k(5, by="n"),
                 slo=js.SLO(max_latency="2500ms", max_error=0.05, max_wan_kbps=64.5)),
        js.Query("plain", LOGS.window(js.tumbling("10s")).agg(n=js.count())),
        load_query(ROOT / "examples" / "cdn_topk.py"),
    ]


def test_every_step_survives_the_trip(tmp_path: Path) -> None:
    for query in every_step(tmp_path):
        back = query_from_bytes(query_to_bytes(query), allow_code=True)
        assert back.describe() == query.describe()
        assert back.slo == query.slo or str(back.slo) == str(query.slo)
        events = [log(1_000 + 700 * i, ("a.com", "b.com", "c.com")[i % 3]) for i in range(60)]
        if query.name != "everything":
            assert back.plan().sources()[0].schema == query.plan().sources()[0].schema
            assert js.run_local(back, events) == js.run_local(query, events)


def test_a_map_travels_only_to_a_reader_that_allows_code(tmp_path: Path) -> None:
    query = every_step(tmp_path)[0]
    data = query_to_bytes(query)
    with pytest.raises(PlanError, match=r"map double: this process does not run code .*"
                                        r"--allow-code"):
        query_from_bytes(data)
    plan = query_from_bytes(data, allow_code=True).plan()
    mapped = [op for op in map(plan.op, plan.topological()) if op.kind == "map"]
    assert mapped and mapped[0].fn(log(1, "a.com"))["bytes"] == 2 * log(1, "a.com")["bytes"]


def test_a_plan_of_another_version_is_refused_saying_which() -> None:
    msg = query_to_proto(load_query(ROOT / "examples" / "cdn_topk.py"))
    msg.version = PLAN_VERSION + 1
    with pytest.raises(PlanError, match=rf"cdn-topk: its plan is of format version "
                                        rf"{PLAN_VERSION + 1}, newer than the version "
                                        rf"{PLAN_VERSION} this JetStream-py reads"):
        query_from_proto(msg)
    msg.version = 0
    with pytest.raises(PlanError, match="older than"):
        query_from_proto(msg)


def _forged(edit: Any) -> pb.QueryPlan:
    msg = query_to_proto(load_query(ROOT / "examples" / "cdn_topk.py"))
    edit(msg)
    return msg


@pytest.mark.parametrize(("edit", "error"), [
    (lambda m: setattr(m.steps[1].where.compare.left, "col", "nope"),
     r"step 2: where: unknown column 'nope'"),
    (lambda m: setattr(m.steps[1].where.compare, "op", "<>"), r"step 2: unknown operator '<>'"),
    (lambda m: m.steps[1].where.Clear(), "step 2: an expression of a kind"),
    (lambda m: m.steps[1].ClearField("op"), "step 2: a step of a kind"),
    (lambda m: m.steps[0].ClearField("op"), "step 1: a step of a kind"),
    (lambda m: m.steps[2].inputs.__setitem__(0, 4), "step 3 reads a step that does not come"),
    (lambda m: setattr(m.steps[4].aggregate.aggregates[0], "function", "median"),
     r"agg requests: unknown aggregate 'median'"),
    (lambda m: m.steps[4].aggregate.aggregates[1].params["q"].CopyFrom(pb.Value(int_value=1)),
     r"agg kb: sum does not take these arguments"),
    (lambda m: setattr(m.steps[3].window, "every_ms", 0), "is not a window"),
    (lambda m: setattr(m.steps[3].window, "early_ms", -1), "early -1 ms is not a window"),
    (lambda m: setattr(m.steps[3].window, "early_ms", 60_000), "early=1m is past the watermark"),
    (lambda m: setattr(m.steps[5].top_k, "k", 0), "k must be a positive integer"),
    (lambda m: setattr(m.steps[0].source.schema.fields[0], "type", "decimal"),
     "unknown type 'decimal'"),
    (lambda m: m.ClearField("steps"), "the plan has no steps"),
    (lambda m: setattr(m.steps[0].source.schema, "event_time", "pop"),
     "event time column 'pop' is not an int column"),
])
def test_a_forged_plan_is_refused_naming_the_step(edit: Any, error: str) -> None:
    with pytest.raises(PlanError, match=error):
        query_from_proto(_forged(edit))


def test_random_bytes_are_refused_as_a_plan() -> None:
    with pytest.raises(PlanError, match="not a query plan"):
        query_from_bytes(b"\xff\xff\xff")


def test_a_rewritten_plan_is_not_sent() -> None:
    optimized = js.optimize(load_query(ROOT / "examples" / "cdn_topk.py"))
    with pytest.raises(PlanError, match="is a step of a rewritten plan; send the query as "
                                        "written"):
        query_to_proto(optimized)


def test_a_function_that_cannot_be_pickled_is_refused_at_once() -> None:
    import threading

    lock = threading.Lock()
    query = js.Query("q", LOGS.map(lambda r: (lock, r)[1], name="locked")
                     .window(js.tumbling("10s")).agg(n=js.count()))
    with pytest.raises(PlanError, match="map locked: the function cannot travel to the sites"):
        query_to_proto(query)


def test_a_site_refuses_a_fragment_whose_plan_it_cannot_read() -> None:
    from jetstream.control.codec import assignment_from_proto
    from jetstream.v1 import control_pb2

    plan = query_to_proto(load_query(ROOT / "examples" / "cdn_topk.py"))
    fragment = control_pb2.Fragment(query="cdn-topk", sources=["cdn_logs"],
                                    spec=pb.QuerySpec(name="cdn-topk", plan=plan))
    assert assignment_from_proto(fragment, "ams", allow_code=False).fragment.query == "cdn-topk"
    fragment.spec.plan.version = PLAN_VERSION + 1
    with pytest.raises(PlanError, match=f"format version {PLAN_VERSION + 1}, newer"):
        assignment_from_proto(fragment, "ams", allow_code=False)


def test_a_fragment_crosses_with_its_links_planned_level() -> None:
    from jetstream.aggtree.planner import Fragment
    from jetstream.control.codec import assignment_from_proto, fragment_to_proto

    spec = query_to_proto(load_query(ROOT / "examples" / "cdn_topk.py")).SerializeToString()
    fragment = Fragment("cdn-topk", "sfo", sources=("cdn_logs",), parent="ams", level=3,
                        uplink_bps=1e5)
    message = fragment_to_proto(fragment, spec, version=2)
    back = assignment_from_proto(message, "sfo", allow_code=False).fragment
    assert (back.level, back.uplink_bps, back.parent) == (3, 1e5, "ams")
    message.level = -1  # a peer's nonsense is no level below exact
    assert assignment_from_proto(message, "sfo", allow_code=False).fragment.level == 0
