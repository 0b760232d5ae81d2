"""Partial batches on the wire: every aggregate survives the trip, garbage is refused."""

from __future__ import annotations

import dataclasses
import json
import re
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.approx.items import to_items
from jetstream.approx.truncate import exact_partial
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.partials import PartialBatch
from jetstream.errors import DataError
from jetstream.operators import Phase, WindowAggregate
from jetstream.v1 import dataplane_pb2 as pb

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
QUERY = js.optimize(js.Query("q", LOGS.window(js.tumbling("10s")).group_by("domain").agg(
    n=js.count(), kb=js.sum("latency_ms"), mean=js.avg("bytes"), lo=js.min("status"),
    users=js.count_distinct("client_ip"), p=js.quantile("latency_ms", 0.9),
    hll=js.approx_count_distinct("client_ip"), kll=js.approx_quantile("latency_ms"),
    urls=js.top_k("url", 3))))
# count_distinct and quantile keep the aggregate whole; take its definition as a partial.
AGGREGATE = next(op for op in map(QUERY.plan().op, QUERY.plan().topological())
                 if isinstance(op, WindowAggregate))
PARTIAL = WindowAggregate(schema=AGGREGATE.schema, keys=AGGREGATE.keys,
                          aggregates=AGGREGATE.aggregates, phase=Phase.PARTIAL)

RECORDS = st.lists(st.fixed_dictionaries({
    "domain": st.sampled_from(["a.com", "b.com", "é.org"]),
    "latency_ms": st.floats(-1e6, 1e6, allow_nan=False),
    "bytes": st.integers(0, 2**40), "status": st.integers(100, 599),
    "client_ip": st.sampled_from([f"10.0.0.{i}" for i in range(20)]),
    "url": st.sampled_from(["/a", "/b", "/c", "/d"])}), max_size=40)


def partial_rows(records: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    groups: dict[str, dict[str, Any]] = {}
    for record in records:
        row = groups.setdefault(record["domain"], {"domain": record["domain"], **{
            name: agg.create() for name, agg in PARTIAL.aggregates}})
        for name, agg in PARTIAL.aggregates:
            value = None if agg.expr is None else agg.expr.evaluate(record)
            row[name] = agg.add(row[name], value)
    return tuple(groups.values())


def batch(rows: tuple[dict[str, Any], ...], **fields: Any) -> PartialBatch:
    return PartialBatch("q", (0, 10_000), "sfo", rows, **fields)


def extracted(rows: tuple[Any, ...]) -> list[dict[str, Any]]:
    return [{name: agg.extract(row[name]) for name, agg in PARTIAL.aggregates} | {
        "domain": row["domain"]} for row in rows]


@settings(max_examples=60, deadline=None)
@given(RECORDS, st.integers(0, 5), st.integers(0, 2**40))
def test_every_aggregate_survives_the_wire(records: list[dict[str, Any]], attempt: int,
                                           sequence: int) -> None:
    rows = partial_rows(records)
    sent = batch(rows, attempt=attempt, sequence=sequence, events=len(records),
                 error_bound=0.01, complete=False)
    message = pb.PartialBatch.FromString(encode_batch(sent, PARTIAL).SerializeToString())
    received = decode_batch(message, PARTIAL)
    assert received.identity == sent.identity == ("q", 0, 10_000, "sfo", 0, 0)
    assert (received.attempt, received.sequence, received.events, received.complete) == (
        attempt, sequence, len(records), False)
    assert extracted(received.rows) == extracted(rows)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**45), 2**45), st.integers(0, 12)), min_size=1,
                max_size=30))
def test_float_sums_of_few_binary_digits_go_as_integers_and_come_back_exact(
        values: list[tuple[int, int]]) -> None:
    """Kilobytes as bytes / 1024 and the like: the sum's partials cross as integers over a
    power of two (shorter), and come back bit for bit."""
    (_, total) = next((n, a) for n, a in PARTIAL.aggregates if n == "kb")
    acc = total.create()
    for numerator, digits in values:
        acc = total.add(acc, numerator / 2**digits)
    rows = ({"domain": "a.com"} | {name: agg.create() for name, agg in PARTIAL.aggregates}
            | {"kb": acc},)
    message = encode_batch(batch(rows), PARTIAL)
    document = json.loads(zlib.decompress(message.payload) if message.compressed
                          else message.payload)
    received = decode_batch(message, PARTIAL).rows[0]["kb"]
    assert received == acc and all(type(x) is float for x in received[2])
    floats = acc[2]
    # A 53-bit integer is at most 17 characters (sign and 16 digits): floats longer than
    # that on average go scaled.
    if floats and all(abs(x) * 2**12 <= 2**53 for x in floats) and sum(
            len(repr(x)) for x in floats) > 17 * len(floats):
        assert "scales" in document


def test_large_payloads_are_compressed() -> None:
    rows = partial_rows([{"domain": "a.com", "latency_ms": 1.0, "bytes": 1, "status": 200,
                          "client_ip": f"10.0.{i // 250}.{i % 250}", "url": "/a"}
                         for i in range(2000)])
    message = encode_batch(batch(rows), PARTIAL)
    assert message.compressed
    assert extracted(decode_batch(message, PARTIAL).rows) == extracted(rows)


def tampered(**changes: Any) -> pb.PartialBatch:
    message = encode_batch(batch(partial_rows([])), PARTIAL)
    for field, value in changes.items():
        setattr(message, field, value)
    return message


def payload(document: Any, compress: bool = False) -> dict[str, Any]:
    raw = json.dumps(document).encode()
    return {"payload": zlib.compress(raw) if compress else raw, "compressed": compress}


GOOD_COLUMNS = {"keys": {"domain": ["a.com"]},
                "partials": {name: [agg.encode(agg.create())] for name, agg in PARTIAL.aggregates}}


@pytest.mark.parametrize(("changes", "message"), [
    ({"origin": ""}, "no origin or query"),
    ({"window_end_ms": 0}, "window [0, 0) is empty"),
    ({"kind": pb.SUMMARY_KIND_HLL}, "summary kind 4 is not understood"),
    ({"payload": b"\x00garbage", "compressed": True}, "unreadable payload"),
    ({"payload": b"{not json", "compressed": False}, "unreadable payload"),
    (payload({"keys": {}, "partials": {}}), "the payload does not hold the keys ['domain']"),
    (payload({**GOOD_COLUMNS, "keys": {"domain": ["a.com", "b.com"]}}),
     "its columns differ in length"),
    (payload({**GOOD_COLUMNS, "keys": {"domain": [7]}}), "key domain should be string, got 7"),
    (payload({**GOOD_COLUMNS, "partials": {**GOOD_COLUMNS["partials"], "n": ["x"]}}),
     "count: not a count"),
    (payload({**GOOD_COLUMNS, "partials": {**GOOD_COLUMNS["partials"], "hll": ["!!"]}}),
     "approx_count_distinct: not a serialized sketch"),
    (payload({**GOOD_COLUMNS, "partials": {**GOOD_COLUMNS["partials"], "kb": [[1, 2]]}}),
     "sum: not a partial sum"),
    (payload(GOOD_COLUMNS, compress=True) | {"payload": zlib.compress(b" " * (9 << 20))},
     "unreadable payload"),
    (payload({**GOOD_COLUMNS, "scales": {"kb": 99}}), "scales {'kb': 99} name no sums"),
    (payload({**GOOD_COLUMNS, "scales": {"n": 1}}), "scales {'n': 1} name no sums"),
    (payload({**GOOD_COLUMNS, "scales": {"kb": 3},
              "partials": {**GOOD_COLUMNS["partials"], "kb": [[1, 0, [1.5]]]}}),
     "a scaled sum of kb is not a list of 53-bit integers"),
    (payload({**GOOD_COLUMNS, "scales": {"kb": 3},
              "partials": {**GOOD_COLUMNS["partials"], "kb": [[1, 0, [2**60]]]}}),
     "a scaled sum of kb is not a list of 53-bit integers"),
])
def test_garbage_is_refused_with_a_reason(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(js.DataError, match="partial batch from .* for q: " + re.escape(message)):
        decode_batch(tampered(**changes), PARTIAL)


def test_a_truncated_batch_carries_its_bounds_and_bad_bounds_are_refused() -> None:
    rows = partial_rows([{"domain": d, "latency_ms": 1.0, "bytes": 10, "status": 200,
                          "client_ip": "10.0.0.1", "url": "/a"} for d in ("a.com", "b.com")])
    sent = batch(rows, slack=(0.0, 2.0), omitted=1.5, level=2, cut=4.5)
    received = decode_batch(encode_batch(sent, PARTIAL), PARTIAL)
    assert (received.slack, received.omitted, received.level, received.cut) == (
        (0.0, 2.0), 1.5, 2, 4.5)
    assert received.bounded.cut == 4.5
    assert received.complete_rows == (True, False)  # by default: the rows without slack
    kept = dataclasses.replace(sent, complete_rows=(False, False))
    assert decode_batch(encode_batch(kept, PARTIAL), PARTIAL).complete_rows == (False, False)
    assert decode_batch(encode_batch(batch(()), PARTIAL), PARTIAL).slack is None
    for bad in [{"slack": (0.0,)}, {"slack": (0.0, -1.0)}, {"slack": (0.0, 2.0, 1.0)},
                {"cut": -1.0}]:
        message = encode_batch(dataclasses.replace(sent, **bad), PARTIAL)
        with pytest.raises(DataError, match="bounds"):
            decode_batch(message, PARTIAL)
    # The ranges of its mins and averages over what it left out go with it; unknown ones
    # stay unknown.
    assert received.ranges is None
    ranged = dataclasses.replace(sent, ranges={"mean": (2.5, 40.0), "lo": (200, 404)})
    assert decode_batch(encode_batch(ranged, PARTIAL), PARTIAL).ranges == {
        "mean": (2.5, 40.0), "lo": (200, 404)}
    for ranges in [{"n": (1, 2)}, {"mean": (3.0, 2.0)}, {"lo": (1, "a")}, {"lo": (None, 2)},
                   {"mean": ([1], [2])}]:
        message = encode_batch(dataclasses.replace(sent, ranges=ranges), PARTIAL)
        with pytest.raises(DataError, match="ranges are not"):
            decode_batch(message, PARTIAL)


def test_a_sketch_level_batch_carries_a_frequent_items_sketch() -> None:
    records = [{"domain": d, "latency_ms": 1.0, "bytes": 10, "status": 200,
                "client_ip": "10.0.0.1", "url": "/a"} for d in ["a.com"] * 5 + ["b.com"] * 2]
    rows = partial_rows(records)
    sketch = to_items(exact_partial(rows), PARTIAL, "n", 4)
    message = encode_batch(batch((), items=sketch, level=4), PARTIAL)
    assert message.kind == pb.SUMMARY_KIND_FREQUENT_ITEMS and message.ranked_by == "n"
    received = decode_batch(message, PARTIAL)
    assert [(r["domain"], r["n"]) for r in received.rows] == [("a.com", 5), ("b.com", 2)]
    assert (received.slack, received.omitted, received.complete_rows, received.level) == (
        (0.0, 0.0), 0.0, (False, False), 4)
    for changes, words in [({"payload": b"nonsense"}, "not a frequent-items sketch"),
                           ({"ranked_by": "lo"}, "ranked by .lo., which is not a count or a sum"),
                           ({"items_extra": -1.0}, "extra error")]:
        bad = pb.PartialBatch()
        bad.CopyFrom(message)
        for name, value in changes.items():
            setattr(bad, name, value)
        if "payload" in changes:
            bad.compressed = False
        with pytest.raises(DataError, match="partial batch from sfo for q: frequent items: "
                           + words):
            decode_batch(bad, PARTIAL)


def test_warnings_travel_and_a_flood_of_them_is_refused() -> None:
    sent = batch((), warnings=("link a -> b: too thin",))
    assert decode_batch(encode_batch(sent, PARTIAL), PARTIAL).warnings == sent.warnings
    for flood in [("w",) * 65, ("w" * 1001,)]:
        message = encode_batch(dataclasses.replace(sent, warnings=flood), PARTIAL)
        with pytest.raises(DataError, match="warnings"):
            decode_batch(message, PARTIAL)
