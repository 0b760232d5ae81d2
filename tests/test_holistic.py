"""Exact distinct counts and quantiles stepped down to HLL and KLL sketches on thin links:
whatever mix of exact and sketched partials reaches the root, in whatever order and through
however many merges and wire crossings, a result is exact and equal to the reference's when no
sketch reached it, and otherwise says so and stays within the bound it reports."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.aggregates import Aggregate, CountDistinct, Quantile
from jetstream.approx.holistic import sketched
from jetstream.approx.levels import HOLISTIC_SIZES
from jetstream.approx.truncate import exact_partial
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.partials import PartialBatch, summarised
from jetstream.local import finish_from_partials
from jetstream.rewrite import distributed, partial_aggregate
from tests.conftest import log
from tests.test_aggregates import rank_interval

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
WINDOW = (0, 10_000)


def holistic_query(q: float) -> js.Query:
    return distributed(js.Query("h", LOGS.window(js.tumbling("10s")).group_by("domain").agg(
        n=js.count(), users=js.count_distinct("client_ip"),
        slow=js.quantile("latency_ms", q), big=js.quantile("bytes", q))))


def events(rng: random.Random, n: int, domains: int) -> list[dict[str, Any]]:
    return [log(rng.randrange(10_000), f"d{rng.randrange(domains)}.com",
                client_ip=f"10.0.{rng.randrange(40)}.{rng.randrange(256)}",
                latency_ms=round(rng.uniform(0, 500), 2), bytes=rng.randrange(1 << 40))
            for _ in range(n)]


def partial_rows(query: js.Query, records: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """A site's partial rows of the window: each domain's accumulators."""
    partial = partial_aggregate(query)
    groups: dict[str, list[Any]] = {}
    for record in records:
        accs = groups.setdefault(record["domain"], [a.create() for _, a in partial.aggregates])
        for i, (_, agg) in enumerate(partial.aggregates):
            accs[i] = agg.add(accs[i], None if agg.expr is None else agg.expr.evaluate(record))
    return tuple({"domain": d, **{name: acc for (name, _), acc in
                                  zip(partial.aggregates, accs, strict=True)}}
                 for d, accs in groups.items())


def crossed(query: js.Query, rows: tuple[dict[str, Any], ...], size: int | None
            ) -> tuple[dict[str, Any], ...]:
    """``rows`` over a link at exact (``size`` None) or a sketch level, and back off the wire."""
    partial = partial_aggregate(query)
    batch = PartialBatch("h", WINDOW, "site", rows)
    if size is not None:
        batch = summarised(batch, sketched(exact_partial(list(rows)), partial,
                                           HOLISTIC_SIZES[size]), 1)
    return decode_batch(encode_batch(batch, partial), partial).rows


def merged(query: js.Query, parts: list[tuple[dict[str, Any], ...]]) -> list[dict[str, Any]]:
    """The parts' rows merged per domain, as a parent's merge does."""
    partial = partial_aggregate(query)
    out: dict[str, dict[str, Any]] = {}
    for rows in parts:
        for row in rows:
            into = out.setdefault(row["domain"], {"domain": row["domain"], **{
                name: agg.create() for name, agg in partial.aggregates}})
            for name, agg in partial.aggregates:
                into[name] = agg.merge(into[name], row[name])
    return list(out.values())


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32), q=st.sampled_from([0.0, 0.1, 0.5, 0.9, 0.99, 1.0]),
       sites=st.lists(st.tuples(st.integers(0, 2500), st.sampled_from([None, 0, 1])),
                      min_size=1, max_size=4),
       regions=st.integers(1, 2), again=st.sampled_from([None, 0, 1]), domains=st.integers(1, 3))
def test_stepped_down_partials_stay_within_their_bounds(
        seed: int, q: float, sites: list[tuple[int, int | None]], regions: int,
        again: int | None, domains: int) -> None:
    """Sites send their window exact or sketched; the sites of each region merge at a parent,
    which sends on at its own level (``again``); the root merges and finishes."""
    rng = random.Random(seed)
    query = holistic_query(q)
    records = [events(rng, n, domains) for n, _ in sites]
    sent = [crossed(query, partial_rows(query, r), size)
            for r, (_, size) in zip(records, sites, strict=True)]
    rng.shuffle(sent)
    up = [crossed(query, tuple(merged(query, sent[i::regions])), again)
          for i in range(min(regions, len(sent)))]
    results = finish_from_partials(query, {WINDOW: merged(query, up)})
    everything = [e for r in records for e in r]
    (want,) = js.run_local(query, everything) or [None]
    if want is None:
        assert results == []
        return
    (got,) = results
    stepped = any(size is not None for _, size in sites) or again is not None
    if got.exact:
        assert got.rows == want.rows and got.error_bound == 0.0
    else:
        assert stepped
    bound = got.error_bound
    for row, truth in zip(got.rows, want.rows, strict=True):
        assert row["domain"] == truth["domain"] and row["n"] == truth["n"]
        assert abs(row["users"] - truth["users"]) <= bound * row["users"] + 1, (row, truth)
        values = {"slow": [e["latency_ms"] for e in everything if e["domain"] == row["domain"]],
                  "big": [e["bytes"] for e in everything if e["domain"] == row["domain"]]}
        for column, vals in values.items():
            below, at_most = rank_interval(vals, row[column])
            assert at_most >= q - bound - 1e-9 and below <= q + bound + 1e-9, (column, row)
        assert isinstance(row["big"], int)  # a quantile of integers is one, sketched or not


@pytest.mark.parametrize("agg", [CountDistinct(js.col("x")), Quantile(js.col("x"), 0.5)],
                         ids=str)
def test_a_sketch_from_a_peer_is_checked_before_it_is_read(agg: Aggregate) -> None:
    kind = "hll" if isinstance(agg, CountDistinct) else "kll"
    bad = {kind: "AgEHDAUIAAA=", **({"ints": False} if kind == "kll" else {})}
    with pytest.raises(ValueError, match=f"{agg.name}: not a serialized {kind.upper()} sketch"):
        agg.decode(bad)
    with pytest.raises(ValueError, match=f"{agg.name}: not a list of values or a sketch"):
        agg.decode({"other": "x"})
