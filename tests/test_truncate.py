"""Truncated exact top-N: dropping rows keeps sound bounds through merges and re-truncations."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.approx.levels import Ranking
from jetstream.approx.truncate import (
    BoundedPartial,
    bounds,
    exact_partial,
    merge_bounded,
    top_k_bounds,
    truncate,
    value_bounds,
)
from jetstream.dataplane.finish import with_row_bounds
from jetstream.operators import WindowAggregate
from jetstream.results import WindowResult
from tests.conftest import log
from tests.test_merger import LOGS, split

QUERY = js.Query("cdn-topk", LOGS.window(js.tumbling("10s"), watermark="1m")
                 .group_by("domain")
                 .agg(requests=js.count(), kb=js.sum("bytes"), hi=js.max("bytes"),
                      mean=js.avg("bytes"), lo=js.min("bytes"))
                 .top_k(3, by="requests"))
OPTIMIZED, SITE_QUERY, AGG = split(QUERY)
AGGS = dict(AGG.aggregates)


def rows_of(events: Iterable[tuple[str, Any]], aggregate: WindowAggregate = AGG
            ) -> list[dict[str, Any]]:
    """Exact partial rows of (domain, bytes) events, one row per domain."""
    rows: dict[str, dict[str, Any]] = {}
    for domain, size in events:
        row = rows.setdefault(domain, {"domain": domain} | {
            name: agg.create() for name, agg in aggregate.aggregates})
        for name, agg in aggregate.aggregates:
            row[name] = agg.add(row[name], size)
    return list(rows.values())


def values(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per domain, every aggregate's extracted value."""
    return {row["domain"]: {name: agg.extract(row[name]) for name, agg in AGG.aggregates}
            for row in rows}


def by_domain(partial: BoundedPartial, rank: str) -> dict[str, tuple[Any, Any, bool]]:
    """Per domain: (lb, ub, complete)."""
    b = bounds(partial, AGG, rank)
    return {row["domain"]: (lo, hi, whole)
            for row, lo, hi, whole in zip(b.rows, b.lb, b.ub, b.complete, strict=True)}


def snapshot(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{name: AGGS[name].encode(value) if name in AGGS else value
             for name, value in row.items()} for row in rows]


# --- a small example, checked by hand --------------------------------------------------------


def test_truncate_merge_and_certify_by_hand() -> None:
    site_a = rows_of([("a", 1)] * 10 + [("b", 1)] * 3 + [("c", 1)])
    site_b = rows_of([("b", 1)] * 4 + [("a", 1)] * 2 + [("d", 1)] * 3)
    before = snapshot(site_a) + snapshot(site_b)

    sent_a = truncate(site_a, AGG, "requests", 1)  # a:10 kept; b:3, c:1 dropped
    sent_b = truncate(site_b, AGG, "requests", 2)  # b:4, d:3 kept; a:2 dropped
    assert [r["domain"] for r in sent_a.rows] == ["a"]
    assert (sent_a.slack, sent_a.omitted, sent_a.truncated) == ((0.0,), 3, True)
    assert [r["domain"] for r in sent_b.rows] == ["b", "d"]
    assert sent_b.omitted == 2

    root = merge_bounded([sent_a, sent_b], AGG)
    # a: 10 here, up to 2 more dropped by b; b and d: up to 3 more dropped by a.
    assert by_domain(root, "requests") == {"a": (10, 12, False), "b": (4, 7, False),
                                           "d": (3, 6, False)}
    assert root.omitted == 5  # c (truly 1) may have been dropped by both: 3 + 2

    top1 = top_k_bounds(root, AGG, "requests", 1)
    assert [r["domain"] for r in top1.rows] == ["a"]
    assert top1.guaranteed == (True,)  # 10 >= every other ub (7, 6) and omitted (5)
    assert top1.error_bound == pytest.approx(2 / 10)
    top2 = top_k_bounds(root, AGG, "requests", 2)
    assert [r["domain"] for r in top2.rows] == ["a", "b"]
    assert top2.guaranteed == (True, False)  # b's 4 < d's ub 6: d may truly beat it
    assert top2.error_bound == pytest.approx(3 / 4)

    assert snapshot(site_a) + snapshot(site_b) == before  # the inputs are untouched


def test_a_key_every_truncating_input_kept_is_complete() -> None:
    site_a = rows_of([("a", 100)] * 5 + [("b", 7)])
    site_b = rows_of([("a", 1), ("c", 2)])  # exact: nothing dropped
    root = merge_bounded([truncate(site_a, AGG, "requests", 1), exact_partial(site_b)], AGG)
    assert by_domain(root, "requests") == {"a": (6, 6, True), "c": (1, 2.0, False)}
    assert values(root.rows)["a"] == values(rows_of([("a", 100)] * 5 + [("a", 1)]))["a"]


def test_a_dropped_zero_ranking_value_still_makes_the_row_incomplete() -> None:
    # z's kb is 0 at site a, so dropping it costs no slack; its requests are still missing.
    site_a = rows_of([("x", 5), ("z", 0), ("z", 0)])
    site_b = rows_of([("z", 7)])
    sent = truncate(site_a, AGG, "kb", 1)
    assert (sent.omitted, sent.truncated) == (0, True)
    root = merge_bounded([sent, exact_partial(site_b)], AGG)
    assert by_domain(root, "kb")["z"] == (7, 7, False)
    assert values(root.rows)["z"]["requests"] == 1  # a lower bound: truly 3


def test_ties_go_to_the_smaller_key_and_null_ranks_below_zero() -> None:
    rows = rows_of([("b", 1), ("a", 1), ("c", 1)])
    assert [r["domain"] for r in truncate(rows, AGG, "requests", 2).rows] == ["a", "b"]
    empty = {"domain": "a"} | {name: agg.create() for name, agg in AGG.aggregates}
    zero = rows_of([("b", 0)])[0]
    kept = truncate([empty, zero], AGG, "kb", 1)
    assert [r["domain"] for r in kept.rows] == ["b"]
    assert kept.omitted == 0  # a's NULL sum ranks as 0


def test_a_bounded_partial_truncates_again_with_its_own_bounds() -> None:
    site_a = truncate(rows_of([("a", 1)] * 3 + [("b", 1)] * 2 + [("c", 1)]), AGG, "requests", 2)
    site_b = exact_partial(rows_of([("c", 1)] * 3))
    merged = merge_bounded([site_a, site_b], AGG)  # a 3, b 2, c 3 + 1 slack
    again = truncate(merged, AGG, "requests", 1)
    assert [r["domain"] for r in again.rows] == ["c"]  # ub 4 beats a's 3
    assert again.slack == (1.0,)
    assert again.omitted == 3
    same = truncate(merged.rows, AGG, "requests", 1, slack=merged.slack,
                    omitted=merged.omitted)
    assert (same.slack, same.omitted) == (again.slack, again.omitted)


def test_site_partials_from_the_reference_executor() -> None:
    sites = {"ams": ["a.com"] * 6 + ["b.com"] * 2 + ["c.com"],
             "sfo": ["a.com"] * 4 + ["c.com"] * 3 + ["d.com"],
             "sin": ["b.com"] * 3 + ["a.com"] * 2 + ["d.com"] * 2}
    partials = []
    for site, domains in sites.items():
        events = [log(1000 + i, d, pop=site) for i, d in enumerate(domains)]
        (result,) = js.run_local(SITE_QUERY, events)
        partials.append(truncate(result.rows, AGG, "requests", 2))
    root = merge_bounded(partials, AGG)

    every = [log(1000, d) for domains in sites.values() for d in domains]
    (reference,) = js.run_local(OPTIMIZED, every)
    truth = {r["domain"]: r["requests"] for r in reference.rows}  # the top 3
    for domain, (lb, ub, _) in by_domain(root, "requests").items():
        if domain in truth:
            assert lb <= truth[domain] <= ub
    top = top_k_bounds(root, AGG, "requests", 1)
    assert [r["domain"] for r in top.rows] == [reference.rows[0]["domain"]] == ["a.com"]
    assert top.guaranteed == (True,)


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(("rank", "words"), [
    ("mean", "'mean'"),  # an average: a Sum subclass, but a dropped mean is unbounded
    ("hi", "'hi'"),
    ("nope", "no aggregate named 'nope'"),
])
def test_only_a_count_or_a_sum_ranks(rank: str, words: str) -> None:
    rows = rows_of([("a", 1)])
    for call in (lambda: truncate(rows, AGG, rank, 1),
                 lambda: bounds(exact_partial(rows), AGG, rank),
                 lambda: top_k_bounds(exact_partial(rows), AGG, rank, 1)):
        with pytest.raises(js.PlanError, match=words) as caught:
            call()
        assert str(caught.value)[0].islower()


@pytest.mark.parametrize("n", [0, -1, True, 1.5])
def test_n_must_be_a_positive_integer(n: Any) -> None:
    with pytest.raises(js.PlanError, match="n must be a positive integer"):
        truncate(rows_of([("a", 1)]), AGG, "requests", n)


def test_top_k_bounds_refuses_k_below_one() -> None:
    with pytest.raises(js.PlanError, match="k must be a positive integer"):
        top_k_bounds(exact_partial(rows_of([("a", 1)])), AGG, "requests", 0)


def test_bad_data_is_refused() -> None:
    with pytest.raises(js.DataError, match="non-negative"):
        truncate(rows_of([("a", -5)]), AGG, "kb", 1)
    twice = rows_of([("a", 1)]) * 2
    with pytest.raises(js.DataError, match="two rows"):
        truncate(twice, AGG, "requests", 1)
    with pytest.raises(js.DataError, match="two rows"):
        merge_bounded([BoundedPartial(tuple(twice), (0.0, 0.0), 0.0, (True, True), False)], AGG)
    with pytest.raises(js.DataError, match="one of each per row"):
        truncate(rows_of([("a", 1)]), AGG, "requests", 1, slack=[])
    with pytest.raises(js.DataError, match="non-negative"):
        truncate(rows_of([("a", 1)]), AGG, "requests", 1, omitted=-1.0)
    with pytest.raises(js.DataError, match="carries its own"):
        truncate(exact_partial(rows_of([("a", 1)])), AGG, "requests", 1, omitted=1.0)


# --- the property: sound bounds through a tree of truncations --------------------------------

WEIGHTS = {
    "ints": lambda rng: rng.randint(0, 1000),
    "zeros": lambda rng: rng.choice([0, 0, 1, 2]),  # zero sums: dropped for free
    "floats": lambda rng: rng.choice([0.1, 0.2, 0.3, 1.5, 1e-3, 1e6 + 0.1]),
}


@st.composite
def streams(draw: st.DrawFn) -> list[list[tuple[str, Any]]]:
    """Zipf-like (domain, bytes) events over 2-6 sites, each with its own share of keys."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    n_keys = draw(st.integers(1, 30))
    exponent = draw(st.sampled_from([0.0, 0.8, 1.2, 2.0]))
    weight = WEIGHTS[draw(st.sampled_from(sorted(WEIGHTS)))]
    keys = [f"d{r:02d}" for r in range(1, n_keys + 1)]
    popularity = [1 / r**exponent for r in range(1, n_keys + 1)]
    sites: list[list[tuple[str, Any]]] = [[] for _ in range(draw(st.integers(2, 6)))]
    for _ in range(draw(st.integers(0, 300))):
        key = rng.choices(keys, popularity)[0]
        rng.choice(sites).append((key, weight(rng)))
    return sites


def true_rank(value: Any) -> Any:
    return 0 if value is None else value


@settings(max_examples=300, deadline=None)
@given(streams(), st.sampled_from(["requests", "kb"]), st.integers(1, 6), st.booleans(),
       st.integers(0, 2**32))
def test_bounds_hold_through_truncations_and_merges(
        sites: list[list[tuple[str, Any]]], rank: str, k: int, everything: bool,
        seed: int) -> None:
    rng = random.Random(seed)  # the cuts and the shape of the tree
    site_rows = [rows_of(events) for events in sites]
    before = [snapshot(rows) for rows in site_rows]
    n_keys = len({key for events in sites for key, _ in events})

    def cut() -> int:  # with ``everything``, every cut keeps every key: nothing may be lost
        return max(n_keys, 1) + rng.randint(0, 2) if everything else rng.randint(1, n_keys + 1)

    sent = [truncate(rows, AGG, rank, cut()) for rows in site_rows]
    # Some sites go through an intermediate aggregator that truncates again.
    via = rng.sample(range(len(sent)), rng.randint(0, len(sent)))
    direct = [p for i, p in enumerate(sent) if i not in via]
    if via:
        middle = merge_bounded([sent[i] for i in via], AGG)
        direct.append(truncate(middle, AGG, rank, cut()))
    root = merge_bounded(direct, AGG)
    if rng.random() < 0.3:
        root = truncate(root, AGG, rank, cut())

    truth = values(rows_of(e for events in sites for e in events))
    ranked = bounds(root, AGG, rank)
    got = values(root.rows)
    for row, lb, ub, complete in zip(ranked.rows, ranked.lb, ranked.ub, ranked.complete,
                                     strict=True):
        real = truth[row["domain"]]
        assert lb <= true_rank(real[rank]) <= ub
        mine = got[row["domain"]]
        if complete:
            assert mine == real
        else:  # the other aggregates are lower bounds: counts, sums of bytes >= 0, max
            assert mine["requests"] <= real["requests"]
            assert true_rank(mine["kb"]) <= true_rank(real["kb"])
            assert mine["hi"] <= real["hi"]
    # A min, a max and an average each lie in bounds of their own.
    for row, whole, of in zip(root.rows, root.complete, value_bounds(root, AGG), strict=True):
        real = truth[row["domain"]]
        for name in ("hi", "lo", "mean"):
            lb, ub = of[name]
            if real[name] is None:  # no value (NULL bytes only): bounds on one if it had
                assert not whole or lb is ub is None
                continue
            assert lb <= real[name] <= ub, (name, row, of[name], real[name])
            if whole or everything:
                assert lb == ub == real[name] or name == "mean", (name, of[name], real[name])
    for domain, real in truth.items():
        if domain not in got:
            assert true_rank(real[rank]) <= ranked.omitted
    # Together, the keys left out weigh at most the cut (exactly: as fractions).
    left_out = sum(Fraction(true_rank(real[rank])) for domain, real in truth.items()
                   if domain not in got)
    assert left_out <= Fraction(root.cut)

    top = top_k_bounds(root, AGG, rank, k)
    assert top.error_bound >= 0
    ordered = sorted((true_rank(v[rank]) for v in truth.values()), reverse=True)
    kth = ordered[k - 1] if len(ordered) >= k else 0
    for row, sure in zip(top.rows, top.guaranteed, strict=True):
        if sure:
            assert true_rank(truth[row["domain"]][rank]) >= kth

    if everything:
        assert root.exact and not root.truncated
        assert set(root.slack) <= {0.0} and root.omitted == 0 and all(root.complete)
        assert root.cut == 0
        assert got == truth
        assert ranked.lb == ranked.ub
        assert all(top.guaranteed) and top.error_bound == 0.0
    assert [snapshot(rows) for rows in site_rows] == before  # inputs never mutated


@settings(max_examples=300, deadline=None)
@given(streams(), st.sampled_from(["requests", "kb"]), st.integers(0, 2**32))
def test_a_query_without_a_top_k_bounds_its_rows_and_what_its_keys_left_out_hold(
        sites: list[list[tuple[str, Any]]], rank: str, seed: int) -> None:
    """Every row of a degraded query without a top-k has its value in [lb, ub], and the
    result's error_bound, a share of the window's total, covers both what the keys left out
    hold and what any row's value exceeds its lb by."""
    rng = random.Random(seed)
    n_keys = len({key for events in sites for key, _ in events})
    sent = [truncate(rows_of(events), AGG, rank, rng.randint(1, n_keys + 1))
            for events in sites]
    root = merge_bounded(sent, AGG)
    finished = WindowResult("q", 0, 10_000, [{"domain": d, **v}
                                             for d, v in values(root.rows).items()])
    result = with_row_bounds(finished, root, AGG, Ranking(0, rank))
    truth = {d: true_rank(v[rank])
             for d, v in values(rows_of(e for events in sites for e in events)).items()}
    assert not result.exact and result.error_bound is not None
    for row in result.rows:
        assert row["lb"] <= truth[row["domain"]] <= row["ub"], row
        assert row["complete"] is False or row[rank] == truth[row["domain"]] or (
            row[rank] is None and truth[row["domain"]] == 0)
    shown = {row["domain"] for row in result.rows}
    left_out = sum(Fraction(v) for d, v in truth.items() if d not in shown)
    total = sum(Fraction(v) for v in truth.values())
    if total:
        assert left_out / total <= Fraction(result.error_bound), (left_out, total)
        # Float sums added in another order than the merge's differ in their last bits.
        slack = Fraction(0) if rank == "requests" else Fraction(1, 10**12)
        for row in result.rows:
            lacks = Fraction(truth[row["domain"]]) - Fraction(row["lb"])
            assert lacks / total <= Fraction(result.error_bound) + slack, (row, total)
