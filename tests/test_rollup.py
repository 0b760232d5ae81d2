"""Dimension coarsening (jetstream.approx.rollup): the DSL's declaration, the plan on the wire,
the ladder's level, and the property that rolled-up partials, merged with others and truncated
anywhere on the way, give at the root what the query grouped by the coarser keys gives, or
bounds that hold it."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream import col
from jetstream.approx.levels import heaviest, ladder, ranking
from jetstream.approx.rollup import merged, roll_up
from jetstream.approx.truncate import (
    BoundedPartial,
    bounds,
    exact_partial,
    merge_bounded,
    missing_share,
    truncate,
    value_bounds,
)
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.history import plan_history
from jetstream.dataplane.partials import PartialBatch
from jetstream.errors import DataError, PlanError
from jetstream.planwire import query_from_proto, query_to_proto
from tests.test_merger import LOGS, split

DOMAIN = col("url").url_domain()


def aggregates() -> dict[str, js.Aggregate]:
    return {"requests": js.count(), "kb": js.sum("bytes"), "hi": js.max("bytes"),
            "lo": js.min("bytes"), "mean": js.avg("bytes"),
            "users": js.count_distinct("client_ip")}


def by_url(stream: js.Stream = LOGS, **rollup: Any) -> js.Stream:
    return (stream.window(js.tumbling("10s"), watermark="1m")
            .group_by("url", "status", rollup=rollup or {"url": DOMAIN}).agg(**aggregates()))


QUERY = js.Query("urls", by_url())
OPTIMIZED, SITE_QUERY, AGG = split(QUERY)
AGGS = dict(AGG.aggregates)


# --- the declaration -------------------------------------------------------------------------


@pytest.mark.parametrize(("build", "words"), [
    (lambda: by_url(url=col("domain")), "reads domain; a roll-up maps url's own value"),
    (lambda: by_url(ts=DOMAIN), "'ts' is not a group key"),
    (lambda: by_url(status=col("status") / 100), "status / 100 is float but status is int"),
    (lambda: by_url(url="domain"), "expected an expression"),
    (lambda: by_url().top_k(3, by="requests"), "top_k by requests: the aggregate may roll up"),
    (lambda: js.Query("q", by_url().where(col("requests") > 1)),
     "a step after it (where requests > 1)"),
])
def test_a_roll_up_that_cannot_run_is_refused_where_it_is_written(build: Any,
                                                                  words: str) -> None:
    with pytest.raises(PlanError, match=re.escape(words)):
        build()


def test_the_roll_up_travels_with_the_plan_and_splits_with_the_aggregate() -> None:
    again = query_from_proto(query_to_proto(QUERY))
    assert [(k, str(e)) for k, e in again.plan().output.rollup] == [("url", str(DOMAIN))]
    assert AGG.rollup == QUERY.plan().output.rollup  # the sites' partial keeps it
    assert "url rolls up to url.url_domain()" in QUERY.describe()


def test_the_ladder_rolls_up_first_then_every_coarser_level_rolls_up_too() -> None:
    steps = ladder(ranking(OPTIMIZED), AGG, heaviest(OPTIMIZED))
    names = [lv.name for lv in steps.levels]
    assert names[:2] == ["exact", "rolled up"]
    assert steps.levels[1].error_bound == 0.0
    assert all(steps.encodings[i].rollup for i in range(1, len(names)))
    assert all(name.startswith("rolled up") for name in names[1:])
    plain = js.Query("p", LOGS.window(js.tumbling("10s")).group_by("url").agg(n=js.count()))
    optimized, _, partial = split(plain)
    assert not any(how.rollup for how in ladder(None, partial, heaviest(optimized)).encodings)


# --- the property: rolled up anywhere, the root holds the coarser truth ----------------------


def rows_of(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Exact partial rows of events, one row per (url, status)."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for e in events:
        row = rows.setdefault((e["url"], e["status"]), {"url": e["url"], "status": e["status"]}
                              | {name: agg.create() for name, agg in AGG.aggregates})
        for name, agg in AGG.aggregates:
            value = {"requests": None, "users": e["client_ip"]}.get(name, e["bytes"])
            row[name] = agg.add(row[name], value)
    return list(rows.values())


def truth_by_domain(events: Iterable[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """What the query gives grouped by the coarser key: the oracle, js.run_local, on events
    whose url is replaced by its domain."""
    coarse = js.Query("coarse", by_url(LOGS.with_column("url", DOMAIN)))
    results = js.run_local(coarse, [dict(e, ts=1) for e in events])
    return {(r["url"], r["status"]): r for result in results for r in result.rows}


@st.composite
def sites(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    """Events over 2-5 sites: a few domains, each with several paths, Zipf-like."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    urls = [f"http://d{d}.example/p{p}" for d in range(draw(st.integers(1, 6)))
            for p in range(draw(st.integers(1, 8)))]
    popularity = [1 / (i + 1) ** draw(st.sampled_from([0.0, 1.0, 2.0])) for i in range(len(urls))]
    out: list[list[dict[str, Any]]] = [[] for _ in range(draw(st.integers(2, 5)))]
    for _ in range(draw(st.integers(0, 200))):
        rng.choice(out).append({"url": rng.choices(urls, popularity)[0],
                                "status": rng.choice([200, 200, 404]),
                                "bytes": rng.randint(0, 5000),
                                "client_ip": f"10.0.0.{rng.randint(1, 9)}",
                                "domain": "x", "pop": "p", "latency_ms": 1.0, "cache": "HIT"})
    return out


@settings(max_examples=200, deadline=None)
@given(sites(), st.integers(0, 2**32), st.booleans())
def test_rolled_up_partials_merge_and_truncate_to_the_coarser_truth_or_bounds_on_it(
        events: list[list[dict[str, Any]]], seed: int, cuts: bool) -> None:
    rng = random.Random(seed)

    def sent(rows: list[dict[str, Any]] | BoundedPartial) -> BoundedPartial:
        partial = rows if isinstance(rows, BoundedPartial) else exact_partial(rows)
        if rng.random() < 0.5:
            partial = roll_up(partial, AGG)
        if cuts and rng.random() < 0.5:
            partial = truncate(partial, AGG, "requests", rng.randint(1, 12))
        return partial

    leaves = [sent(rows_of(e)) for e in events]
    via = rng.sample(range(len(leaves)), rng.randint(0, len(leaves)))
    direct = [p for i, p in enumerate(leaves) if i not in via]
    if via:
        direct.append(sent(merged([leaves[i] for i in via], AGG)))
    root = roll_up(merged(direct, AGG), AGG)  # (the root reports at one granularity)
    everything = [e for site in events for e in site]
    truth = truth_by_domain(everything)

    assert root.rolled_up
    got = {(row["url"], row["status"]): row for row in root.rows}
    assert set(got) <= set(truth)
    ranked = bounds(root, AGG, "requests")
    for row, lb, ub, whole, of in zip(ranked.rows, ranked.lb, ranked.ub, ranked.complete,
                                      value_bounds(root, AGG), strict=True):
        real = truth[(row["url"], row["status"])]
        assert lb <= real["requests"] <= ub
        values = {name: AGGS[name].extract(row[name]) for name in AGGS}
        if whole:
            assert values == {name: real[name] for name in AGGS}, (values, real)
        for name in ("hi", "lo", "mean"):
            low, high = of[name]
            assert (low is None or low <= real[name]) and (high is None or real[name] <= high)
    left_out = sum(Fraction(v["requests"]) for k, v in truth.items() if k not in got)
    assert left_out <= Fraction(root.cut)
    if truth:
        total = sum(Fraction(v["requests"]) for v in truth.values())
        assert left_out / total <= Fraction(missing_share(root, AGG, "requests"))
    if not root.truncated:  # nothing cut on the way: the coarser truth, every aggregate
        assert {k: {name: AGGS[name].extract(row[name]) for name in AGGS}
                for k, row in got.items()} == {
            k: {name: v[name] for name in AGGS} for k, v in truth.items()}


def test_mixing_rolled_up_and_fine_partials_needs_rolling_up_first() -> None:
    events = [{"url": "http://a.example/x", "status": 200, "bytes": 5, "client_ip": "1"},
              {"url": "http://a.example/y", "status": 200, "bytes": 7, "client_ip": "2"}]
    fine = exact_partial(rows_of(events))
    with pytest.raises(DataError, match="roll them all up first"):
        merge_bounded([fine, roll_up(fine, AGG)], AGG)
    both = merged([fine, roll_up(fine, AGG)], AGG)
    assert both.rolled_up and len(both.rows) == 1
    assert AGGS["requests"].extract(both.rows[0]["requests"]) == 4
    assert AGGS["users"].extract(both.rows[0]["users"]) == 2
    plain = js.Query("p", LOGS.window(js.tumbling("10s")).group_by("url").agg(n=js.count()))
    with pytest.raises(PlanError, match="declares no coarser key"):
        roll_up(exact_partial([{"url": "u", "n": 1}]), split(plain)[2])


# --- on the wire -----------------------------------------------------------------------------


def test_a_rolled_up_batch_says_so_on_the_wire_and_a_query_without_one_refuses_it() -> None:
    rows = roll_up(exact_partial(rows_of([
        {"url": "http://a.example/x", "status": 200, "bytes": 5, "client_ip": "1"}])), AGG)
    batch = PartialBatch("urls", (0, 10_000), "ams", rows.rows, rolled_up=True)
    back = decode_batch(encode_batch(batch, AGG), AGG)
    assert back.rolled_up and back.slack is None and back.rows[0]["url"] == "a.example"
    assert not decode_batch(encode_batch(batch.__class__("urls", (0, 10_000), "ams",
                                                         rows.rows), AGG), AGG).rolled_up
    plain = js.Query("urls", LOGS.window(js.tumbling("10s"), watermark="1m")
                     .group_by("url", "status").agg(**aggregates()))
    with pytest.raises(DataError, match="the query declares no roll-up"):
        decode_batch(encode_batch(batch, AGG), split(plain)[2])


# --- history from cubes that kept rolled-up windows ------------------------------------------


def test_history_reads_kept_windows_rolled_up_at_the_granularity_they_hold() -> None:
    stored = js.Query("urls", LOGS.window(js.tumbling("10s"), watermark="5s")
                      .group_by("url", "cache", rollup={"url": DOMAIN}).agg(requests=js.count()))
    now, minute = 10 * 3_600_000, 60_000

    def plan(stream: js.Stream) -> Any:
        return plan_history(js.Query("h", stream), [stored], since_ms=now - 30 * minute,
                            until_ms=now, now_ms=now)

    with pytest.raises(PlanError, match="cannot answer a filter on url"):
        plan(LOGS.where(col("url") == "http://a.com/x").window(js.tumbling("1m"))
             .group_by("cache").agg(n=js.count()))
    window = (now - 10 * minute, now - 10 * minute + 10_000)
    fine = PartialBatch("urls", window, "ams", (
        {"url": "http://a.com/x", "cache": "HIT", "requests": 2},
        {"url": "http://a.com/y", "cache": "MISS", "requests": 1}))
    rolled = PartialBatch("urls", window, "sfo", (
        {"url": "a.com", "cache": "HIT", "requests": 4},), rolled_up=True)
    per_url = plan(LOGS.window(js.tumbling("1m")).group_by("url").agg(n=js.count()))
    (result,) = per_url.finish([fine, rolled], expected=("ams", "sfo"), unanswered={})
    assert result.rolled_up == {"url": "url.url_domain()"} and not result.exact
    assert result.rows == [{"url": "a.com", "n": 7}]
    # Without url, a rolled-up window holds the history's keys exactly.
    per_cache = plan(LOGS.window(js.tumbling("1m")).group_by("cache").agg(n=js.count()))
    (result,) = per_cache.finish([fine, rolled], expected=("ams", "sfo"), unanswered={})
    assert not result.rolled_up and result.exact
    assert sorted(result.rows, key=lambda r: r["cache"]) == [{"cache": "HIT", "n": 6},
                                                            {"cache": "MISS", "n": 1}]
