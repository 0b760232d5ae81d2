"""Each rewrite rule on fixture plans (input plan -> expected plan), and where it declines."""

from __future__ import annotations

import textwrap

import pytest

import jetstream as js
from jetstream import col, lit
from jetstream.expr import Compare
from jetstream.operators import Union, WithColumn
from jetstream.rewrite import (
    RULES,
    RewriteContext,
    partition_keys,
    push_filters,
    push_top_k,
    split_aggregates,
)
from jetstream.rewrite.edit import bypass, input_of, insert_below, op, plan_of
from jetstream.rewrite.solve import solve
from tests.conftest import log

A = js.source("a", schema=js.CDN_LOG_SCHEMA)
B = js.source("b", schema=js.CDN_LOG_SCHEMA)
C = js.source("c", schema=js.CDN_LOG_SCHEMA)
W = js.tumbling("10s")
WINDOW = "window tumbling(10s) on ts, watermark 0ms"


def apply(rule, stream: js.Stream, **options) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    """The rewritten plan as text without details, and the rule's notes."""
    context = RewriteContext(**options)
    plan = rule(stream.plan, context)
    notes = [("" if n.fired else "declined: ") + n.text for n in context.notes]
    return shape(plan), notes


def shape(plan: js.LogicalPlan) -> str:
    return "\n".join(line.strip() for line in plan.render(detail=False).splitlines())


def expect(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def test_rules_are_registered_in_order() -> None:
    assert (push_filters, split_aggregates, partition_keys, push_top_k) == RULES


# -- push_filters ----------------------------------------------------------------------------

def test_filter_is_copied_onto_each_input_of_a_union() -> None:
    plan, notes = apply(push_filters, A.union(B).where(col("status") < 500).window(W)
                        .agg(n=js.count()))
    assert plan == expect(f"""
          #1 source a
          #2 source b
          #3 where status < 500  <- #1
          #4 where status < 500  <- #2
          #5 union  <- #3, #4
          #6 {WINDOW}  <- #5
          #7 aggregate: n=count()  <- #6
    """)
    assert notes == ["copied `where status < 500` onto each of the 2 inputs of the union"]


def test_filter_through_an_integer_map_is_solved_exactly() -> None:
    # The paper's example: x + c followed by < t becomes x < t - c, then + c.
    plan, notes = apply(push_filters, A.with_column("x", col("status") + 3)
                        .where(col("x") < 403).window(W).agg(n=js.count()))
    assert plan == expect(f"""
          #1 source a
          #2 where status < 400  <- #1
          #3 with_column x = status + 3  <- #2
          #4 {WINDOW}  <- #3
          #5 aggregate: n=count()  <- #4
    """)
    assert notes == ["moved `where x < 403` below `with_column x = status + 3` as "
                     "`where status < 400`"]


def test_inexact_inverse_is_relaxed_and_the_exact_check_kept() -> None:
    plan, notes = apply(push_filters, A.with_column("kb", col("bytes") / 1024)
                        .where(col("kb") > 10).window(W).agg(n=js.count()))
    assert plan == expect(f"""
          #1 source a
          #2 where bytes >= 10240  <- #1
          #3 with_column kb = bytes / 1024  <- #2
          #4 where kb > 10 (exact check, kept)  <- #3
          #5 {WINDOW}  <- #4
          #6 aggregate: n=count()  <- #5
    """)
    assert notes == ["moved `where kb > 10` below `with_column kb = bytes / 1024` as "
                     "`where bytes >= 10240` (relaxed; the exact check stays above)"]


def test_filter_through_a_select_reads_the_renamed_column() -> None:
    plan, _ = apply(push_filters, A.select("ts", d=col("domain")).where(col("d") == "x")
                    .window(W).agg(n=js.count()))
    assert "#2 where domain == 'x'  <- #1" in plan
    assert "#3 select ts, d = domain  <- #2" in plan


def test_filter_passes_a_map_that_does_not_change_what_it_reads() -> None:
    upper = A.map(lambda r: {**r, "pop": r["pop"].upper()}, changes=["pop"], name="upper")
    plan, notes = apply(push_filters, upper.where(col("status") < 500)
                        .where(col("pop") == "AMS").window(W).agg(n=js.count()))
    assert plan == expect(f"""
          #1 source a
          #2 where status < 500  <- #1
          #3 map upper (changes pop)  <- #2
          #4 where pop == 'AMS'  <- #3
          #5 {WINDOW}  <- #4
          #6 aggregate: n=count()  <- #5
    """)
    assert notes == [
        "moved `where status < 500` below `map upper (changes pop)`, which does not change "
        "the columns it reads",
        "declined: `where pop == 'AMS'` stays above `map upper (changes pop)`: the function "
        "changes pop, which the filter reads"]


def test_filter_stays_above_an_opaque_map() -> None:
    _, notes = apply(push_filters, A.map(lambda r: r, name="f", monotonic=True)
                     .where(col("status") < 500).window(W).agg(n=js.count()))
    assert notes == ["declined: `where status < 500` stays above `map f (monotonic)`: the "
                     "function may change any column; declare changes=[...] to let filters "
                     "pass (it is monotonic, but its inverse is unknown)"]


def test_key_filter_moves_below_the_aggregate_but_having_does_not() -> None:
    plan, notes = apply(push_filters, A.window(W).group_by("domain").agg(n=js.count())
                        .where((col("n") > 2) & (col("domain") != "b")))
    assert plan == expect(f"""
          #1 source a
          #2 where domain != 'b'  <- #1
          #3 {WINDOW}  <- #2
          #4 aggregate by domain: n=count()  <- #3
          #5 where n > 2  <- #4
    """)
    assert notes == [
        "declined: `where n > 2` stays above `aggregate by domain: n=count()`: it reads "
        "aggregate values (n), so it is a HAVING filter",
        f"moved `where domain != 'b'` below `aggregate by domain: n=count()`, `{WINDOW}`"]


def test_filter_stays_above_top_k() -> None:
    _, notes = apply(push_filters, A.window(W).group_by("domain").agg(n=js.count())
                     .top_k(3, by="n").where(col("n") > 1))
    assert notes == ["declined: `where n > 1` stays above `top_k 3 by n`: which rows are in "
                     "the top k depends on every row"]


def test_filter_stays_above_a_step_shared_with_another_branch() -> None:
    shared = A.where(col("status") < 500)
    plan, notes = apply(push_filters, shared.union(shared.with_column("status", 1))
                        .where(col("bytes") > 5).window(W).agg(n=js.count()))
    assert "declined: `where bytes > 5` stays above `where status < 500`, which also feeds " \
           "another step" in notes
    assert "#2 where status < 500  <- #1" in plan


# -- solve -----------------------------------------------------------------------------------

SCHEMA = js.Schema.of({"x": js.DataType.INT, "f": js.DataType.FLOAT})


@pytest.mark.parametrize(("predicate", "solved", "exact"), [
    (col("x") + 3 < 10, "x < 7", True),
    (Compare(">", lit(10), col("x") - 2), "x < 12", True),  # literal on the left
    (5 - col("x") <= 1, "x >= 4", True),
    (-col("x") == 3, "x == -3", True),
    (col("x") * 2 > 7, "x >= 4", False),
    (col("f") + 3 < 10, "f <= 7.000000031", False),
    ((col("x") / 4 + 1 < 3) & (col("f") > 1), "(x <= 8) & (f > 1)", False),
])
def test_solve(predicate: js.Expr, solved: str, exact: bool) -> None:
    result = solve(predicate, SCHEMA)
    assert result is not None
    assert (str(result[0]), result[1]) == (solved, exact)


@pytest.mark.parametrize("predicate", [col("x") * 2 == 3, col("x") + col("f") < 1,
                                       col("x") * 0 < 1, col("x") < 1])
def test_solve_declines(predicate: js.Expr) -> None:
    assert solve(predicate, SCHEMA) is None


# -- split_aggregates ------------------------------------------------------------------------

def test_split_next_to_the_data_without_a_union() -> None:
    plan, notes = apply(split_aggregates, A.window(W).group_by("domain")
                        .agg(n=js.count(), m=js.avg("bytes")))
    assert plan == expect(f"""
          #1 source a
          #2 {WINDOW}  <- #1
          #3 partial aggregate by domain: n=count(), m=avg(bytes)  <- #2
          #4 final aggregate by domain: n=count(), m=avg(bytes)  <- #3
    """)
    assert notes == ["split `aggregate by domain: n=count(), m=avg(bytes)` into a partial next "
                     "to the data and a final step; partials carry n=count() as a count; "
                     "m=avg(bytes) as a sum and a count"]


def test_split_copies_the_record_steps_onto_every_input_of_nested_unions() -> None:
    plan, notes = apply(split_aggregates, A.union(B.union(C))
                        .with_column("kb", col("bytes") / 1024).window(W)
                        .group_by("domain").agg(kb=js.sum("kb")))
    assert plan == expect(f"""
          #1 source a
          #2 source b
          #3 source c
          #4 with_column kb = bytes / 1024  <- #1
          #5 {WINDOW}  <- #4
          #6 partial aggregate by domain: kb=sum(kb)  <- #5
          #7 with_column kb = bytes / 1024  <- #2
          #8 {WINDOW}  <- #7
          #9 partial aggregate by domain: kb=sum(kb)  <- #8
          #10 with_column kb = bytes / 1024  <- #3
          #11 {WINDOW}  <- #10
          #12 partial aggregate by domain: kb=sum(kb)  <- #11
          #13 union  <- #9, #12
          #14 union  <- #6, #13
          #15 final aggregate by domain: kb=sum(kb)  <- #14
    """)
    assert "a partial on each of 3 inputs" in notes[0]


@pytest.mark.parametrize(("aggregate", "shown"), [
    (js.count_distinct("client_ip"), "u=count_distinct(client_ip)"),
    (js.quantile("latency_ms", 0.99), "u=quantile(latency_ms, 0.99)"),
])
def test_holistic_aggregates_stay_whole(aggregate: js.Aggregate, shown: str) -> None:
    stream = A.window(W).group_by("domain").agg(n=js.count(), u=aggregate)
    plan, notes = apply(split_aggregates, stream)
    assert plan == shape(stream.plan)
    assert notes == [f"declined: `aggregate by domain: n=count(), {shown}` stays whole: "
                     f"{shown} is holistic (its partial would carry every value)"]
    # The distributed path splits them anyway, and the answer stays the same.
    query = js.Query("q", stream)
    split = js.optimize(query, split_holistic=True)
    assert "partial aggregate" in split.plan().render()
    events = [log(1_000 * i, f"d{i % 3}.com", client_ip=f"10.0.0.{i % 5}",
                  latency_ms=float(i)) for i in range(40)]
    assert js.run_local(split, events) == js.run_local(query, events)


def test_approximate_aggregates_split_as_sketches() -> None:
    _, notes = apply(split_aggregates, A.window(W).agg(
        u=js.approx_count_distinct("client_ip"), p=js.approx_quantile("latency_ms"),
        t=js.top_k("url", 3)))
    assert "as an HLL sketch" in notes[0] and "as a KLL sketch" in notes[0]
    assert "as a frequent-items sketch" in notes[0]


# -- partition_keys --------------------------------------------------------------------------

SPLIT = js.Stream(split_aggregates(A.window(W).group_by("domain").agg(n=js.count()).plan,
                                   RewriteContext()))


def test_one_partition_leaves_the_plan_alone() -> None:
    plan, notes = apply(partition_keys, SPLIT)
    assert plan == shape(SPLIT.plan)
    assert notes == ["declined: `final aggregate by domain: n=count()` stays on one server (1 "
                     "partition; the physical planner chooses more where a site's servers are "
                     "small)"]


def test_final_aggregate_spread_over_hash_partitions() -> None:
    plan, notes = apply(partition_keys, SPLIT, partitions=2)
    assert plan == expect(f"""
          #1 source a
          #2 {WINDOW}  <- #1
          #3 partial aggregate by domain: n=count()  <- #2
          #4 partition 1/2 by hash(domain)  <- #3
          #5 final aggregate by domain: n=count()  <- #4
          #6 partition 2/2 by hash(domain)  <- #3
          #7 final aggregate by domain: n=count()  <- #6
          #8 union  <- #5, #7
    """)
    assert notes == ["spread `final aggregate by domain: n=count()` over 2 partitions by hashes "
                     "of domain"]


def test_holistic_aggregate_spread_over_range_partitions() -> None:
    stream = A.window(W).group_by("domain").agg(u=js.count_distinct("client_ip"))
    plan, _ = apply(partition_keys, stream, partitions=3, bounds=("g", "p"))
    assert "#3 partition 1/3 by range(domain) [, 'g')  <- #2" in plan
    assert "#5 partition 2/3 by range(domain) ['g', 'p')  <- #2" in plan
    assert "#7 partition 3/3 by range(domain) ['p', )  <- #2" in plan
    assert "#9 union  <- #4, #6, #8" in plan


def test_global_aggregate_has_no_key_to_partition_by() -> None:
    _, notes = apply(partition_keys, A.window(W).agg(n=js.count()), partitions=2)
    assert notes == ["declined: `aggregate: n=count()` has no group key to partition by"]


@pytest.mark.parametrize(("options", "message"), [
    ({"partitions": 0}, "partitions must be a positive integer"),
    ({"partitions": 3, "bounds": ("p",)}, "needs 2 ascending bounds"),
    ({"partitions": 3, "bounds": ("p", "g")}, "needs 2 ascending bounds"),
])
def test_bad_partitioning_options(options: dict, message: str) -> None:
    with pytest.raises(js.RewriteError, match=message):
        RewriteContext(**options)


# -- push_top_k ------------------------------------------------------------------------------

TOP = A.window(W).group_by("domain").agg(n=js.count()).top_k(3, by="n")


def test_top_k_moves_onto_key_disjoint_partitions() -> None:
    query = js.optimize(js.Query("q", TOP), partitions=2)
    assert shape(query.plan()) == expect(f"""
          #1 source a
          #2 {WINDOW}  <- #1
          #3 partial aggregate by domain: n=count()  <- #2
          #4 partition 1/2 by hash(domain)  <- #3
          #5 final aggregate by domain: n=count()  <- #4
          #6 partition 2/2 by hash(domain)  <- #3
          #7 final aggregate by domain: n=count()  <- #6
          #8 top_k 3 by n (partial)  <- #5
          #9 top_k 3 by n (partial)  <- #7
          #10 union  <- #8, #9
          #11 top_k 3 by n  <- #10
    """)


def test_top_k_never_moves_below_a_merge_of_site_partials() -> None:
    stream = js.Stream(split_aggregates(TOP.plan, RewriteContext()))
    plan, notes = apply(push_top_k, stream)
    assert plan == shape(stream.plan)
    assert notes == ["declined: `top_k 3 by n` stays above `final aggregate by domain: "
                     "n=count()`: the partials it merges can share a key (one domain counted at "
                     "several sites), so a partial top_k below it would lose counts"]


def test_top_k_stays_above_a_union_of_overlapping_inputs() -> None:
    per_site = [s.window(W).group_by("domain").agg(n=js.count()) for s in (A, B)]
    stream = per_site[0].union(per_site[1]).top_k(3, by="n")
    plan, notes = apply(push_top_k, stream)
    assert plan == shape(stream.plan)
    assert notes == ["declined: `top_k 3 by n` stays above the union: its inputs are not "
                     "partitions of one exchange by domain, so they can share a key"]


def test_top_k_stays_above_partitions_whose_key_was_rewritten() -> None:
    partitioned = js.optimize(js.Query("q", TOP), partitions=2).plan()
    graph = partitioned.graph.copy()
    union = next(n for n in graph if isinstance(op(graph, n), Union))
    for port in (0, 1):  # drop the partial top_ks, and rewrite the key on each input instead
        bypass(graph, input_of(graph, union, port))
        schema = op(graph, input_of(graph, union, port)).schema
        insert_below(graph, union, port, WithColumn(schema=schema, name="domain",
                                                    expr=col("domain").lower()))
    plan, notes = apply(push_top_k, js.Stream(plan_of(graph)))
    assert "(partial)" not in plan
    assert notes == ["declined: `top_k 3 by n` stays above the union: its inputs are not "
                     "partitions of one exchange by domain, so they can share a key"]


# -- explain ---------------------------------------------------------------------------------

def test_explain_shows_plan_rules_and_result() -> None:
    query = js.Query("q", A.union(B).where(col("status") < 500).window(W).group_by("domain")
                     .agg(n=js.count(), u=js.count_distinct("client_ip")).top_k(3, by="n"))
    text = js.explain(query, partitions=2)
    sections = text.split("\n\n")
    assert sections[0] == "query q  (slo: none)"
    assert sections[1].startswith("logical plan\n  #1 source a")
    rewrites = sections[2].splitlines()
    assert rewrites[0] == "rewrites"
    assert rewrites[1].startswith("  push_filters      copied `where status < 500`")
    assert rewrites[2].startswith("  split_aggregates  declined: `aggregate by domain: n=count(), "
                                  "u=count_distinct(client_ip)` stays whole")
    assert rewrites[3].startswith("  partition_keys    spread `aggregate by domain")
    assert rewrites[4].startswith("  push_top_k        copied `top_k 3 by n` onto each of the 2")
    assert sections[3].startswith("rewritten plan\n")
