"""Aggregates and sketches: one pass against plain Python, and merging tested by splitting.

The splitting tests follow Beam's sharded combine tests: hypothesis cuts the input into shards
(some empty), each shard is aggregated and compacted on its own, the partials are merged in the
given order and again in a shuffled tree, and the result is compared with one pass over the
whole input: equal for exact aggregates, within the reported ``error_bound`` for sketches.
"""

from __future__ import annotations

import copy
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import datasketches as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream import col
from jetstream.aggregates import (
    Aggregate,
    AggregateKind,
    Avg,
    Count,
    CountDistinct,
    Max,
    Min,
    Quantile,
    Sum,
)
from jetstream.approx.sketches import ApproxCountDistinct, ApproxQuantile, TopKItems
from jetstream.expr import Col
from jetstream.schema import DataType, Schema

X = Col("x")

# -- helpers ---------------------------------------------------------------------------------


def one_pass(agg: Aggregate, values: Sequence[Any]) -> Any:
    """The accumulator of one pass over ``values``, as a site would build it."""
    acc = agg.create()
    for v in values:
        acc = agg.add(acc, v)
    return acc


def cut(values: Sequence[Any], cuts: Sequence[int]) -> list[list[Any]]:
    """``values`` cut at the given offsets; repeated offsets make empty shards."""
    bounds = sorted(min(c, len(values)) for c in cuts)
    starts, ends = [0, *bounds], [*bounds, len(values)]
    return [list(values[i:j]) for i, j in zip(starts, ends, strict=True)]


def snapshot(acc: Any) -> Any:
    """A value that changes whenever ``acc`` does."""
    if isinstance(acc, ds.hll_sketch):
        return bytes(acc.serialize_compact())
    if isinstance(acc, ds.kll_doubles_sketch | ds.frequent_strings_sketch):
        return bytes(acc.serialize())
    return copy.deepcopy(acc)


def merge_checked(agg: Aggregate, acc: Any, other: Any) -> Any:
    """``agg.merge``, failing if it mutated ``other`` (the contract says it never does)."""
    before = snapshot(other)
    merged = agg.merge(acc, other)
    assert snapshot(other) == before, f"{agg} merge mutated its second argument"
    return merged


def merge_as_tree(agg: Aggregate, accs: list[Any], draw: Callable[[Any], Any]) -> Any:
    """Merge ``accs`` as a binary tree whose shape hypothesis picks."""
    if len(accs) == 1:
        return accs[0]
    split = draw(st.integers(1, len(accs) - 1))
    left = merge_as_tree(agg, accs[:split], draw)
    right = merge_as_tree(agg, accs[split:], draw)
    return merge_checked(agg, left, right)


def sharded_runs(agg: Aggregate, shards: list[list[Any]],
                 draw: Callable[[Any], Any]) -> tuple[Any, Any]:
    """Merged accumulators: folded in the given order, and as a tree over a shuffled order."""
    def partials() -> list[Any]:
        # Fresh partials per run: merge may mutate its first argument.
        return [agg.compact(one_pass(agg, shard)) for shard in shards]

    folded = agg.create()
    for partial in partials():
        folded = merge_checked(agg, folded, partial)
    order = draw(st.permutations(range(len(shards))))
    shuffled = partials()
    tree = merge_as_tree(agg, [shuffled[i] for i in order], draw)
    return folded, tree


cuts_st = st.lists(st.integers(0, 400), max_size=6)
ints = st.integers(-1000, 1000)
small_ints = st.integers(-20, 20)
texts = st.text(alphabet="abcxyz", max_size=3)
fractions = st.sampled_from([0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0]) | st.floats(0, 1)


def nearest_rank(values: Sequence[Any], q: float) -> Any:
    """The smallest value whose inclusive rank (the fraction of values <= it) is >= q."""
    n = len(values)
    return min(v for v in values if sum(x <= v for x in values) >= q * n)


def rank_interval(values: Sequence[Any], v: Any) -> tuple[float, float]:
    """The normalized ranks ``v`` spans in ``values``: [fraction < v, fraction <= v]."""
    n = len(values)
    return sum(x < v for x in values) / n, sum(x <= v for x in values) / n


# -- one pass against plain Python ------------------------------------------------------------

ONE_PASS_CASES: list[tuple[Aggregate, Any, Callable[[list[Any]], Any]]] = [
    (Count(), st.one_of(ints, texts), len),
    (Count(X), st.one_of(ints, texts), len),
    (Sum(X), ints, lambda vs: sum(vs) if vs else None),
    (Min(X), ints, lambda vs: min(vs, default=None)),
    (Min(X), texts, lambda vs: min(vs, default=None)),
    (Max(X), ints, lambda vs: max(vs, default=None)),
    (Max(X), texts, lambda vs: max(vs, default=None)),
    (Avg(X), ints, lambda vs: sum(vs) / len(vs) if vs else None),
    (CountDistinct(X), st.one_of(small_ints, texts), lambda vs: len(set(vs))),
    (Quantile(X, 0.5), ints, lambda vs: nearest_rank(vs, 0.5) if vs else None),
    (Quantile(X, 0.9), ints, lambda vs: nearest_rank(vs, 0.9) if vs else None),
]


@pytest.mark.parametrize(("agg", "values_st", "expected"), ONE_PASS_CASES,
                         ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(ONE_PASS_CASES)])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_one_pass_matches_plain_python(agg: Aggregate, values_st: Any,
                                       expected: Callable[[list[Any]], Any],
                                       data: st.DataObject) -> None:
    values = data.draw(st.lists(values_st, max_size=50))
    acc = one_pass(agg, values)
    before = snapshot(acc)
    assert agg.extract(acc) == expected(values)
    assert snapshot(acc) == before, "extract mutated its accumulator"
    assert agg.error_bound(acc) == 0.0


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.floats(-1e6, 1e6), max_size=50))
def test_float_sum_and_avg_match_plain_python(values: list[float]) -> None:
    scale = math.fsum(abs(v) for v in values) + 1.0
    total = Sum(X).extract(one_pass(Sum(X), values))
    mean = Avg(X).extract(one_pass(Avg(X), values))
    if not values:
        assert total is None and mean is None
        return
    assert math.isclose(total, math.fsum(values), rel_tol=0, abs_tol=1e-9 * scale)
    assert math.isclose(mean, math.fsum(values) / len(values), rel_tol=0, abs_tol=1e-9 * scale)


@pytest.mark.parametrize(("agg", "empty"), [
    (Count(), 0), (Sum(X), None), (Min(X), None), (Max(X), None), (Avg(X), None),
    (CountDistinct(X), 0), (Quantile(X, 0.5), None), (ApproxCountDistinct(X), 0),
    (ApproxQuantile(X, 0.5), None), (TopKItems(X), []),
], ids=str)
def test_empty_input(agg: Aggregate, empty: Any) -> None:
    acc = agg.create()
    assert agg.extract(acc) == empty
    assert agg.error_bound(acc) == 0.0


# -- Quantile's nearest rank at the edges -----------------------------------------------------

@pytest.mark.parametrize(("values", "q", "expected"), [
    ([5, 1, 4, 2, 3], 0.0, 1),
    ([5, 1, 4, 2, 3], 1.0, 5),
    ([5, 1, 4, 2, 3], 0.5, 3),
    ([4, 1, 3, 2], 0.5, 2),  # the lower median: rank 2/4 already reaches 0.5
    ([4, 1, 3, 2], 0.51, 3),
    ([4, 1, 3, 2], 0.25, 1),
    ([4, 1, 3, 2], 0.26, 2),
    ([7], 0.0, 7),
    ([7], 0.3, 7),
    ([7], 1.0, 7),
    ([2, 2, 2, 9], 0.75, 2),
    ([2, 2, 2, 9], 0.76, 9),
    ([1.5, -3.0, 0.25], 0.0, -3.0),
])
def test_quantile_nearest_rank(values: list[Any], q: float, expected: Any) -> None:
    agg = Quantile(X, q)
    assert agg.extract(one_pass(agg, values)) == expected


@settings(max_examples=100, deadline=None)
@given(values=st.lists(ints, min_size=1, max_size=40), q=fractions)
def test_quantile_agrees_with_the_definition(values: list[int], q: float) -> None:
    agg = Quantile(X, q)
    got = agg.extract(one_pass(agg, values))
    assert got == nearest_rank(values, q)
    assert Quantile(X, 0.0).extract(list(values)) == min(values)
    assert Quantile(X, 1.0).extract(list(values)) == max(values)


def test_quantile_empty_is_none() -> None:
    assert Quantile(X, 0.0).extract([]) is None
    assert Quantile(X, 1.0).extract([]) is None


# -- merging by splitting: exact aggregates ---------------------------------------------------

EXACT_CASES: list[tuple[Callable[[st.DataObject], Aggregate], Any]] = [
    (lambda d: Count(), st.one_of(ints, texts)),
    (lambda d: Count(X), st.one_of(ints, texts)),
    (lambda d: Sum(X), ints),
    (lambda d: Min(X), ints),
    (lambda d: Min(X), texts),
    (lambda d: Max(X), ints),
    (lambda d: Max(X), texts),
    (lambda d: Avg(X), ints),
    (lambda d: CountDistinct(X), st.one_of(small_ints, texts)),
    (lambda d: Quantile(X, d.draw(fractions, label="q")), ints),
    (lambda d: Quantile(X, d.draw(fractions, label="q")), st.floats(-1e3, 1e3)),
]
EXACT_IDS = ["count", "count-x", "sum", "min-int", "min-str", "max-int", "max-str", "avg",
             "count_distinct", "quantile-int", "quantile-float"]


@pytest.mark.parametrize(("make", "values_st"), EXACT_CASES, ids=EXACT_IDS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_exact_merge_by_sharding(make: Callable[[st.DataObject], Aggregate], values_st: Any,
                                 data: st.DataObject) -> None:
    agg = make(data)
    values = data.draw(st.lists(values_st, max_size=60), label="values")
    shards = cut(values, data.draw(cuts_st, label="cuts"))
    folded, tree = sharded_runs(agg, shards, data.draw)
    whole = agg.extract(agg.compact(one_pass(agg, values)))
    assert agg.extract(folded) == whole
    assert agg.extract(tree) == whole


@pytest.mark.parametrize("agg", [Sum(X), Avg(X)], ids=str)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_float_sum_and_avg_merge_by_sharding(agg: Aggregate, data: st.DataObject) -> None:
    values = data.draw(st.lists(st.floats(-1e6, 1e6), max_size=60), label="values")
    shards = cut(values, data.draw(cuts_st, label="cuts"))
    folded, tree = sharded_runs(agg, shards, data.draw)
    whole = agg.extract(one_pass(agg, values))
    if whole is None:
        assert agg.extract(folded) is None and agg.extract(tree) is None
        return
    tol = 1e-9 * (math.fsum(abs(v) for v in values) + 1.0)
    assert math.isclose(agg.extract(folded), whole, rel_tol=0, abs_tol=tol)
    assert math.isclose(agg.extract(tree), whole, rel_tol=0, abs_tol=tol)


@pytest.mark.parametrize(("agg", "left", "right"), [
    (Count(), [1, 2], [3]),
    (Sum(X), [1, 2], [3]),
    (Min(X), [5], [1]),
    (Max(X), [1], [5]),
    (Avg(X), [1, 2], [3, 4]),
    (CountDistinct(X), [1, 2], [2, 3]),
    (Quantile(X, 0.5), [1, 2], [3]),
    (ApproxCountDistinct(X, 4), list(range(100)), list(range(50, 300))),
    (ApproxQuantile(X, 0.5, 8), list(range(100)), list(range(50, 300))),
    (TopKItems(X, 3, 4), list(range(20)) * 2, list(range(10, 40))),
], ids=str)
def test_merge_does_not_mutate_its_second_argument(agg: Aggregate, left: list[Any],
                                                   right: list[Any]) -> None:
    acc, other = one_pass(agg, left), one_pass(agg, right)
    before = snapshot(other)
    agg.extract(agg.merge(acc, other))
    assert snapshot(other) == before


# -- merging by splitting: approximate aggregates ---------------------------------------------

def check_distinct_bound(agg: ApproxCountDistinct, acc: Any, values: Sequence[Any]) -> None:
    estimate, bound = agg.extract(acc), agg.error_bound(acc)
    true = len(set(values))
    assert bound >= 0.0
    # +1 covers rounding the estimate to an integer.
    assert abs(estimate - true) <= bound * estimate + 1, (estimate, true, bound)


def check_rank_bound(agg: ApproxQuantile, acc: Any, values: Sequence[Any]) -> None:
    """The returned value's inclusive rank range in ``values`` comes within the bound of q."""
    got, bound = agg.extract(acc), agg.error_bound(acc)
    below, at_most = rank_interval(values, got)
    slack = 1e-9
    assert at_most >= agg.q - bound - slack, (got, agg.q, bound, below, at_most)
    assert below <= agg.q + bound + slack, (got, agg.q, bound, below, at_most)


def check_top_k(agg: TopKItems, acc: Any, values: Sequence[Any]) -> None:
    items, bound = agg.extract(acc), agg.error_bound(acc)
    true = Counter(str(v) for v in values)
    total = len(values)
    assert len(items) <= agg.k
    for it in items:
        assert it["lb"] <= true[it["item"]] <= it["ub"], (it, true[it["item"]])
        assert it["lb"] <= it["count"] <= it["ub"]
    counts = [it["count"] for it in items]
    assert counts == sorted(counts, reverse=True)
    if bound == 0.0:
        exact = sorted(true.items(), key=lambda kv: (-kv[1], kv[0]))[: agg.k]
        assert [(it["item"], it["count"]) for it in items] == exact
        return
    # No false negatives: an item counted more than bound * total times is in the sketch's list,
    # with an estimate at least its true count. Only the cut to k can drop it, and only if k
    # other items could be estimated at least as high: true count >= its count - the bound.
    threshold = bound * total
    reported = {it["item"] for it in items}
    for item, n in true.items():
        if n <= threshold + 1e-6:
            continue
        rivals = sum(1 for other, m in true.items() if other != item and m >= n - threshold)
        if rivals < agg.k:
            assert item in reported, (item, n, threshold, rivals)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(data=st.data())
def test_approx_count_distinct_merge_by_sharding(data: st.DataObject) -> None:
    agg = ApproxCountDistinct(X, data.draw(st.integers(4, 8), label="lg_k"))
    values = data.draw(st.lists(st.one_of(st.integers(0, 300), texts), max_size=300))
    shards = cut(values, data.draw(cuts_st, label="cuts"))
    folded, tree = sharded_runs(agg, shards, data.draw)
    for acc in (folded, tree, one_pass(agg, values)):
        check_distinct_bound(agg, acc, values)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(data=st.data())
def test_approx_quantile_merge_by_sharding(data: st.DataObject) -> None:
    agg = ApproxQuantile(X, data.draw(fractions, label="q"), data.draw(st.sampled_from([8, 16])))
    values = data.draw(st.lists(st.one_of(small_ints, st.floats(-1e3, 1e3)), min_size=1,
                                max_size=300))
    shards = cut(values, data.draw(cuts_st, label="cuts"))
    folded, tree = sharded_runs(agg, shards, data.draw)
    for acc in (folded, tree, one_pass(agg, values)):
        check_rank_bound(agg, acc, values)
        if len(values) <= agg.k:
            assert agg.error_bound(acc) == 0.0


@settings(max_examples=100, deadline=None, derandomize=True)
@given(data=st.data())
def test_top_k_merge_by_sharding(data: st.DataObject) -> None:
    agg = TopKItems(X, data.draw(st.integers(1, 8), label="k"),
                    data.draw(st.integers(4, 6), label="lg_max_k"))
    values = data.draw(st.lists(st.one_of(st.integers(0, 12), st.sampled_from("abc")),
                                max_size=200))
    shards = cut(values, data.draw(cuts_st, label="cuts"))
    folded, tree = sharded_runs(agg, shards, data.draw)
    for acc in (folded, tree, one_pass(agg, values)):
        check_top_k(agg, acc, values)


def zipf(rng: random.Random, n: int, universe: int, s: float = 1.1) -> list[int]:
    weights = [1 / rank**s for rank in range(1, universe + 1)]
    return rng.choices(range(universe), weights, k=n)


def big_sharded(agg: Aggregate, values: list[Any], rng: random.Random) -> Any:
    """A merged accumulator over 5 uneven shards, one of them empty, folded out of order."""
    cuts = sorted(rng.randrange(len(values)) for _ in range(4))
    shards = cut(values, [*cuts, cuts[-1]])
    rng.shuffle(shards)
    merged = agg.create()
    for shard in shards:
        merged = merge_checked(agg, merged, agg.compact(one_pass(agg, shard)))
    return merged


@pytest.mark.parametrize("seed", range(3))
def test_approx_count_distinct_in_estimation_mode(seed: int) -> None:
    rng = random.Random(seed)
    values = zipf(rng, 20_000, 8_000)
    agg = ApproxCountDistinct(X, 5 + seed)
    merged = big_sharded(agg, values, rng)
    assert agg.error_bound(merged) > 0.0
    check_distinct_bound(agg, merged, values)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("q", [0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0])
def test_approx_quantile_in_estimation_mode(seed: int, q: float) -> None:
    rng = random.Random(seed)
    values = [float(v) for v in zipf(rng, 20_000, 5_000)] + [rng.random() for _ in range(2000)]
    agg = ApproxQuantile(X, q, 16)
    merged = big_sharded(agg, values, rng)
    assert agg.error_bound(merged) > 0.0
    check_rank_bound(agg, merged, values)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("lg_max_k", [4, 5, 6])
def test_top_k_in_estimation_mode(seed: int, lg_max_k: int) -> None:
    rng = random.Random(seed)
    values = zipf(rng, 20_000, 2_000)
    agg = TopKItems(X, 5, lg_max_k)
    merged = big_sharded(agg, values, rng)
    assert agg.error_bound(merged) > 0.0
    check_top_k(agg, merged, values)
    assert agg.extract(merged)[0]["item"] == "0"  # the head of a Zipf stream is never missed


def test_top_k_exact_when_nothing_was_purged() -> None:
    agg = TopKItems(X, 2)
    acc = one_pass(agg, ["b", "a", "b", 1, "a", "c", 1, 1])
    assert agg.error_bound(acc) == 0.0
    assert agg.extract(acc) == [
        {"item": "1", "count": 3, "lb": 3, "ub": 3},
        {"item": "a", "count": 2, "lb": 2, "ub": 2},  # ties broken by text: a before b
    ]


def test_approx_quantile_exact_below_k_on_distinct_ranks() -> None:
    # No value has a rank at exactly q, so inclusive and exclusive answers coincide.
    agg = ApproxQuantile(X, 0.3, 8)
    acc = one_pass(agg, [5, 1, 4, 2, 3])
    assert agg.error_bound(acc) == 0.0
    assert agg.extract(acc) == 2.0


@pytest.mark.parametrize(("values", "q"), [
    ([1, 2, 3, 4], 0.5),
    ([1, 2, 3, 4], 0.25),
    ([10, 20], 0.5),
    (list(range(1, 11)), 0.9),
], ids=str)
def test_approx_quantile_exact_mode_agrees_with_quantile(values: list[int], q: float) -> None:
    approx, exact = ApproxQuantile(X, q), Quantile(X, q)
    merged = approx.merge(one_pass(approx, values[:1]), one_pass(approx, values[1:]))
    assert approx.error_bound(merged) == 0.0
    assert approx.extract(merged) == exact.extract(one_pass(exact, values))


def test_a_float_column_holds_floats_so_1_and_1_0_are_one_value() -> None:
    # HLL hashes the int 1 and the float 1.0 differently; the executor's input checks turn
    # every value of a float column into a float, so the sketch sees one value.
    logs = js.source("s", schema=Schema.of({"ts": DataType.INT, "x": DataType.FLOAT},
                                           event_time="ts"))
    q = js.Query("q", logs.window(js.tumbling("1s")).agg(
        approx=js.approx_count_distinct("x"), exact=js.count_distinct("x")))
    events = [{"ts": 1, "x": v} for v in (1, 1.0, 2, 2.0, 3.5)]
    (result,) = js.run_local(q, events)
    assert result.rows == [{"approx": 3, "exact": 3}]


# -- result types and refusals ----------------------------------------------------------------

SCHEMA = Schema.of({
    "url": DataType.STRING,
    "bytes": DataType.INT,
    "latency_ms": DataType.FLOAT,
    "cached": DataType.BOOL,
    "top_urls": DataType.LIST,
})


@pytest.mark.parametrize(("agg", "dtype"), [
    (js.count(), DataType.INT),
    (js.count("url"), DataType.INT),
    (js.count("top_urls"), DataType.INT),
    (js.sum("bytes"), DataType.INT),
    (js.sum("latency_ms"), DataType.FLOAT),
    (js.sum(col("bytes") * 2), DataType.INT),
    (js.sum(col("bytes") / 1024), DataType.FLOAT),
    (js.min("bytes"), DataType.INT),
    (js.min("url"), DataType.STRING),
    (js.max("latency_ms"), DataType.FLOAT),
    (js.max("cached"), DataType.BOOL),
    (js.avg("bytes"), DataType.FLOAT),
    (js.avg("latency_ms"), DataType.FLOAT),
    (js.count_distinct("url"), DataType.INT),
    (js.count_distinct("bytes"), DataType.INT),
    (js.quantile("bytes", 0.9), DataType.INT),
    (js.quantile("latency_ms"), DataType.FLOAT),
    (js.approx_count_distinct("url"), DataType.INT),
    (js.approx_quantile("bytes"), DataType.FLOAT),
    (js.top_k("url"), DataType.LIST),
    (js.top_k("bytes", 3), DataType.LIST),
], ids=str)
def test_result_type(agg: Aggregate, dtype: DataType) -> None:
    assert agg.result_type(SCHEMA) is dtype


@pytest.mark.parametrize(("agg", "column"), [
    (js.sum("url"), "url"),
    (js.sum("cached"), "cached"),
    (js.sum(col("url").lower()), "url.lower()"),
    (js.avg("url"), "url"),
    (js.avg("top_urls"), "top_urls"),
    (js.quantile("url", 0.5), "url"),
    (js.approx_quantile("cached"), "cached"),
    (js.min("top_urls"), "top_urls"),
    (js.max("top_urls"), "top_urls"),
    (js.count_distinct("top_urls"), "top_urls"),
    (js.approx_count_distinct("top_urls"), "top_urls"),
    (js.top_k("top_urls"), "top_urls"),
], ids=str)
def test_result_type_refuses_wrong_input(agg: Aggregate, column: str) -> None:
    with pytest.raises(js.PlanError) as err:
        agg.result_type(SCHEMA)
    message = str(err.value)
    assert message.startswith(agg.name + " ")
    assert f" {column}" in message


@pytest.mark.parametrize("agg", [js.count("nope"), js.sum("nope"), js.top_k("nope")], ids=str)
def test_result_type_refuses_unknown_column(agg: Aggregate) -> None:
    with pytest.raises(js.PlanError, match="unknown column 'nope'"):
        agg.result_type(SCHEMA)


@pytest.mark.parametrize("cls", [Sum, Min, Max, Avg, CountDistinct, Quantile,
                                 ApproxCountDistinct, ApproxQuantile, TopKItems])
def test_result_type_needs_an_input_column(cls: type[Aggregate]) -> None:
    with pytest.raises(js.PlanError, match=f"^{cls.name} needs an input column$"):
        cls(None).result_type(SCHEMA)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: js.quantile("x", -0.1), "quantile: q must be a fraction in [0, 1], not -0.1"),
    (lambda: js.quantile("x", 1.5), "quantile: q must be a fraction in [0, 1], not 1.5"),
    (lambda: js.quantile("x", math.nan), "quantile: q must be a fraction"),
    (lambda: js.quantile("x", True), "quantile: q must be a fraction"),
    (lambda: js.quantile("x", "0.5"), "quantile: q must be a fraction"),
    (lambda: js.approx_quantile("x", 1.01), "approx_quantile: q must be a fraction"),
    (lambda: js.approx_quantile("x", -1e-9), "approx_quantile: q must be a fraction"),
    (lambda: js.approx_quantile("x", 0.5, k=7),
     "approx_quantile: k must be an integer between 8 and 65535"),
    (lambda: js.approx_quantile("x", 0.5, k=65536),
     "approx_quantile: k must be an integer between"),
    (lambda: js.approx_count_distinct("x", lg_k=3),
     "approx_count_distinct: lg_k must be an integer between 4 and 21, not 3"),
    (lambda: js.approx_count_distinct("x", lg_k=22), "approx_count_distinct: lg_k must be"),
    (lambda: js.top_k("x", 0), "top_k: k must be a positive integer, not 0"),
    (lambda: js.top_k("x", -3), "top_k: k must be a positive integer"),
    (lambda: js.top_k("x", 2.5), "top_k: k must be a positive integer, not 2.5"),
    (lambda: js.top_k("x", 5, lg_max_k=3),
     "top_k: lg_max_k must be an integer between 4 and 26, not 3"),
    (lambda: js.top_k("x", 5, lg_max_k=27), "top_k: lg_max_k must be an integer between 4 and 26"),
])
def test_parameter_validation(build: Callable[[], Aggregate], message: str) -> None:
    with pytest.raises(js.PlanError, match="^" + re.escape(message)):
        build()


@pytest.mark.parametrize("agg", [
    js.quantile("x", 0), js.quantile("x", 1), js.approx_quantile("x", 0.0, k=8),
    js.approx_quantile("x", 1.0, k=65535), js.approx_count_distinct("x", lg_k=4),
    js.approx_count_distinct("x", lg_k=21), js.top_k("x", 1, lg_max_k=4),
    js.top_k("x", 1, lg_max_k=26),
], ids=str)
def test_parameters_at_the_edges_are_accepted(agg: Aggregate) -> None:
    acc = agg.add(agg.create(), 1)
    assert agg.extract(acc) is not None


@pytest.mark.parametrize("build", [
    lambda: js.approx_count_distinct("x", lg_k=12.5),
    lambda: js.approx_quantile("x", 0.5, k=100.5),
    lambda: js.top_k("x", 5, lg_max_k=6.5),
], ids=["lg_k", "k", "lg_max_k"])
def test_non_integer_sketch_sizes_are_refused_while_planning(
        build: Callable[[], Aggregate]) -> None:
    with pytest.raises(js.PlanError):
        build()


# -- the DSL constructors ---------------------------------------------------------------------

@pytest.mark.parametrize(("agg", "cls", "text"), [
    (js.count(), Count, "count()"),
    (js.count("url"), Count, "count(url)"),
    (js.sum("bytes"), Sum, "sum(bytes)"),
    (js.min("bytes"), Min, "min(bytes)"),
    (js.max("bytes"), Max, "max(bytes)"),
    (js.avg(col("bytes") / 1024), Avg, "avg(bytes / 1024)"),
    (js.count_distinct("url"), CountDistinct, "count_distinct(url)"),
    (js.quantile("bytes"), Quantile, "quantile(bytes, 0.5)"),
    (js.quantile("bytes", 0.99), Quantile, "quantile(bytes, 0.99)"),
    (js.approx_count_distinct("url"), ApproxCountDistinct, "approx_count_distinct(url)"),
    (js.approx_quantile("bytes", 0.9), ApproxQuantile, "approx_quantile(bytes, 0.9)"),
    (js.top_k("url", 5), TopKItems, "top_k(url, 5)"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_constructor_builds_the_aggregate(agg: Aggregate, cls: type[Aggregate],
                                          text: str) -> None:
    assert type(agg) is cls
    assert str(agg) == text


def test_constructors_take_names_or_expressions() -> None:
    assert js.count().expr is None
    assert js.sum("bytes").expr.same_as(col("bytes"))
    kb = col("bytes") / 1024
    assert js.avg(kb).expr is kb
    assert js.top_k(col("url").url_domain(), 3).expr.same_as(col("url").url_domain())


def test_constructor_defaults() -> None:
    assert js.quantile("x").q == 0.5
    assert (js.approx_quantile("x").q, js.approx_quantile("x").k) == (0.5, 200)
    assert js.approx_count_distinct("x").lg_k == 12
    assert (js.top_k("x").k, js.top_k("x").lg_max_k) == (10, 10)
    agg = js.top_k("x", k=3, lg_max_k=5)
    assert (agg.k, agg.lg_max_k) == (3, 5)


@pytest.mark.parametrize("fn", [js.count, js.sum, js.min, js.max, js.avg, js.count_distinct,
                                js.quantile, js.approx_count_distinct, js.approx_quantile,
                                js.top_k], ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", ["", 3, b"url", ["url"]], ids=repr)
def test_constructor_refuses_non_columns(fn: Callable[..., Aggregate], bad: Any) -> None:
    pattern = f"^{fn.__name__}: expected a column name or an expression, not "
    with pytest.raises(js.PlanError, match=pattern + re.escape(repr(bad))):
        fn(bad)


# -- kinds ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("agg", "kind"), [
    (js.count(), AggregateKind.DISTRIBUTIVE),
    (js.count("x"), AggregateKind.DISTRIBUTIVE),
    (js.sum("x"), AggregateKind.DISTRIBUTIVE),
    (js.min("x"), AggregateKind.DISTRIBUTIVE),
    (js.max("x"), AggregateKind.DISTRIBUTIVE),
    (js.avg("x"), AggregateKind.ALGEBRAIC),
    (js.count_distinct("x"), AggregateKind.HOLISTIC),
    (js.quantile("x"), AggregateKind.HOLISTIC),
    (js.approx_count_distinct("x"), AggregateKind.APPROXIMATE),
    (js.approx_quantile("x"), AggregateKind.APPROXIMATE),
    (js.top_k("x"), AggregateKind.APPROXIMATE),
], ids=str)
def test_kind_exact_and_decomposable(agg: Aggregate, kind: AggregateKind) -> None:
    assert agg.kind is kind
    assert agg.exact is (kind is not AggregateKind.APPROXIMATE)
    assert agg.decomposable is (kind is not AggregateKind.HOLISTIC)


def test_a_float_sum_past_the_largest_double_is_infinite_not_an_error() -> None:
    total = js.sum("x")
    assert total.extract(one_pass(total, [1e308, 1e308])) == math.inf
    assert total.extract(one_pass(total, [1e308, 1e308, 1.0])) == math.inf
    assert math.isnan(total.extract(one_pass(total, [math.inf, -math.inf, 2.0])))
    assert total.extract(total.merge(one_pass(total, [-1e308]),
                                     one_pass(total, [-1e308]))) == -math.inf
