"""Frequent-items sketch levels: a window's keys in a DataSketches sketch keep sound bounds
through merges, truncations and further sketches."""

from __future__ import annotations

import random
from typing import Any

import datasketches as ds
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.approx.items import from_items, to_items
from jetstream.approx.truncate import (
    BoundedPartial,
    bounds,
    exact_partial,
    merge_bounded,
    top_k_bounds,
    truncate,
)
from tests.test_truncate import AGG, by_domain, rows_of, snapshot, streams, true_rank, values


def through_sketch(partial: BoundedPartial, rank: str, lg_max_k: int) -> BoundedPartial:
    """What a receiver reads back from a sketch level: via the sketch's serialized bytes."""
    sketch = to_items(partial, AGG, rank, lg_max_k)
    return from_items(sketch.serialize(), sketch.extra, AGG, rank)


def test_a_sketch_that_holds_every_key_is_exact_in_its_ranking() -> None:
    rows = rows_of([("a", 5)] * 7 + [("b", 1)] * 3 + [("c", 2)])
    back = through_sketch(exact_partial(rows), "requests", 4)
    assert by_domain(back, "requests") == {"a": (7, 7, False), "b": (3, 3, False),
                                           "c": (1, 1, False)}
    assert back.omitted == 0 and back.truncated
    # Only the ranking survives: the other aggregates are empty, and the rows say so.
    assert values(back.rows)["a"] == {"requests": 7, "kb": None, "hi": None, "mean": None,
                                      "lo": None}


def test_a_small_sketch_bounds_what_it_forgets() -> None:
    events = [(f"d{i:02d}", 1) for i in range(60) for _ in range(60 - i)]
    back = through_sketch(exact_partial(rows_of(events)), "requests", 4)
    assert 0 < len(back.rows) <= 12  # 0.75 * 2**4 items at most
    truth = values(rows_of(events))
    for domain, (lb, ub, _) in by_domain(back, "requests").items():
        assert lb <= truth[domain]["requests"] <= ub
    for domain, real in truth.items():
        if domain not in {r["domain"] for r in back.rows}:
            assert real["requests"] <= back.omitted
    top = top_k_bounds(back, AGG, "requests", 1)
    assert [r["domain"] for r in top.rows] == ["d00"]


def test_a_truncated_partial_carries_its_bounds_into_the_sketch() -> None:
    cut = truncate(rows_of([("a", 1)] * 9 + [("b", 1)] * 4 + [("c", 1)] * 2), AGG,
                   "requests", 2)  # c (2) dropped: omitted 2
    sketch = to_items(cut, AGG, "requests", 4)
    assert sketch.extra == 2
    assert by_domain(from_items(sketch.serialize(), sketch.extra, AGG, "requests"),
                     "requests") == {"a": (9, 11.0, False), "b": (4, 6.0, False)}


def test_refusals() -> None:
    floats = exact_partial(rows_of([("a", 0.5)]))
    with pytest.raises(js.DataError, match="counts integers"):
        to_items(floats, AGG, "kb", 4)
    with pytest.raises(js.PlanError, match="lg_max_k"):
        to_items(floats, AGG, "requests", 3)
    with pytest.raises(js.PlanError, match="cannot rank by 'hi'"):
        to_items(floats, AGG, "hi", 4)
    good = to_items(exact_partial(rows_of([("a", 1)])), AGG, "requests", 4).serialize()
    for data, extra, rank, words in [
            (b"garbage", 0.0, "requests", "not a frequent-items sketch"),
            (good, -1.0, "requests", "extra error"),
            (good, float("nan"), "requests", "extra error"),
            (good, 0.0, "mean", "not a count or a sum")]:
        with pytest.raises(js.DataError, match=words):
            from_items(data, extra, AGG, rank)
    wrong = ds.frequent_strings_sketch(4)
    for item in ("plain text", "[1,2]", "[3]"):
        wrong.update(item, 1)
    with pytest.raises(js.DataError, match=r"not a key of|should be"):
        from_items(bytes(wrong.serialize()), 0.0, AGG, "requests")


# --- the property: sound bounds through any mix of levels, hop by hop -------------------------


@settings(max_examples=300, deadline=None)
@given(streams(), st.sampled_from(["requests", "kb"]), st.integers(1, 6),
       st.integers(0, 2**32))
def test_bounds_hold_through_any_mix_of_levels(
        sites: list[list[tuple[str, Any]]], rank: str, k: int, seed: int) -> None:
    rng = random.Random(seed)  # each hop's level and the shape of the tree
    site_rows = [rows_of(events) for events in sites]
    if any(not isinstance(true_rank(v[rank]), int) for rows in site_rows
           for v in values(rows).values()):
        return  # float sums have no sketch levels (sketches count integers)
    before = [snapshot(rows) for rows in site_rows]
    n_keys = len({key for events in sites for key, _ in events})

    def degrade(partial: BoundedPartial) -> BoundedPartial:
        how = rng.choice(["exact", "top", "items"])
        if how == "top":
            return truncate(partial, AGG, rank, rng.randint(1, n_keys + 1))
        if how == "items":
            return through_sketch(partial, rank, rng.randint(4, 6))
        return partial

    sent = [degrade(exact_partial(rows)) for rows in site_rows]
    via = rng.sample(range(len(sent)), rng.randint(0, len(sent)))
    direct = [p for i, p in enumerate(sent) if i not in via]
    if via:
        direct.append(degrade(merge_bounded([sent[i] for i in via], AGG)))
    root = merge_bounded(direct, AGG)

    truth = values(rows_of(e for events in sites for e in events))
    ranked = bounds(root, AGG, rank)
    got = values(root.rows)
    for row, lb, ub, complete in zip(ranked.rows, ranked.lb, ranked.ub, ranked.complete,
                                     strict=True):
        real = truth.get(row["domain"])
        assert real is not None, "a sketch made up a key"
        assert lb <= true_rank(real[rank]) <= ub
        mine = got[row["domain"]]
        if complete:
            assert mine == real
        else:  # lower bounds; an aggregate a sketch dropped is empty
            assert mine["requests"] <= real["requests"]
            assert true_rank(mine["kb"]) <= true_rank(real["kb"])
            assert mine["hi"] is None or mine["hi"] <= real["hi"]
    for domain, real in truth.items():
        if domain not in got:
            assert true_rank(real[rank]) <= ranked.omitted
    top = top_k_bounds(root, AGG, rank, k)
    ordered = sorted((true_rank(v[rank]) for v in truth.values()), reverse=True)
    kth = ordered[k - 1] if len(ordered) >= k else 0
    for row, sure in zip(top.rows, top.guaranteed, strict=True):
        if sure:
            assert true_rank(truth[row["domain"]][rank]) >= kth
    assert [snapshot(rows) for rows in site_rows] == before
