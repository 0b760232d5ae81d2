"""The per-link key dictionary: batches decode to exactly what was sent, through reused slots,
reconnects and restarts; a receiver refuses slots it cannot decode."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.approx.truncate import BoundedPartial
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.keydict import KeyDecoder, KeyEncoder
from jetstream.dataplane.partials import PartialBatch, summarised
from jetstream.errors import DataError
from jetstream.operators import Phase, WindowAggregate
from jetstream.v1 import dataplane_pb2 as pb

# Two key columns of different types, so that 1 and "1" and 1.0 meet in the tables.
AGGREGATE = WindowAggregate(
    schema=js.Schema.of({"domain": js.DataType.STRING, "status": js.DataType.INT,
                         "n": js.DataType.PARTIAL, "kb": js.DataType.PARTIAL}),
    keys=("domain", "status"), aggregates=(("n", js.count()), ("kb", js.sum("bytes"))),
    phase=Phase.PARTIAL)
DOMAINS = st.sampled_from(["a.com", "b.com", "1", "é.org", "", "c.com", "d.com", "e.com"])
STATUSES = st.sampled_from([200, 404, 1, 500, 0])
ROWS = st.dictionaries(st.tuples(DOMAINS, STATUSES | st.none()),
                       st.tuples(st.integers(1, 10**6), st.floats(0, 1e9)), max_size=25)


def rows_of(counts: dict[tuple[str, int | None], tuple[int, float]]
            ) -> tuple[dict[str, Any], ...]:
    total = dict(AGGREGATE.aggregates)["kb"]
    return tuple({"domain": d, "status": s, "n": n, "kb": total.add(total.create(), kb)}
                 for (d, s), (n, kb) in counts.items())


def by_key(batch: PartialBatch) -> dict[tuple[Any, ...], Any]:
    return {(row["domain"], row["status"]): (row["n"], row["kb"]) for row in batch.rows}


# One step of a stream's life: a batch (its rows, and whether it goes compressed), or a
# reconnect (both ends start their tables anew, as a new stream does).
STEPS = st.lists(st.one_of(st.tuples(ROWS, st.booleans()), st.just("reconnect")),
                 min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(STEPS, st.integers(1, 12))
def test_batches_decode_to_what_was_sent_through_reused_slots_and_reconnects(
        steps: list[Any], capacity: int) -> None:
    sender, receiver = KeyEncoder(capacity), KeyDecoder(capacity)
    for window, step in enumerate(steps):
        if step == "reconnect":
            sender, receiver = KeyEncoder(capacity), KeyDecoder(capacity)
            continue
        counts, compress = step
        sent = PartialBatch("q", (window * 10, window * 10 + 10), "sfo", rows_of(counts))
        message = encode_batch(sent, AGGREGATE, compress=compress)
        wire = pb.PartialBatch.FromString(sender.encode(message).SerializeToString())
        got = decode_batch(wire, AGGREGATE, receiver)
        assert by_key(got) == by_key(sent)
        assert got.identity == sent.identity


@settings(max_examples=60, deadline=None)
@given(st.lists(ROWS, min_size=1, max_size=6), st.data())
def test_a_truncated_batch_keeps_each_rows_bounds_through_the_sorting(
        windows: list[Any], data: st.DataObject) -> None:
    sender, receiver = KeyEncoder(), KeyDecoder()
    for window, counts in enumerate(windows):
        rows = rows_of(counts)
        slack = tuple(data.draw(st.floats(0, 100)) for _ in rows)
        complete = tuple(s == 0 for s in slack)
        sent = summarised(PartialBatch("q", (window, window + 1), "sfo", rows),
                          BoundedPartial(rows, slack, 7.0, complete, truncated=True), level=1)
        wire = sender.encode(encode_batch(sent, AGGREGATE))
        got = decode_batch(wire, AGGREGATE, receiver)
        assert got.omitted == 7.0
        assert got.slack is not None and got.complete_rows is not None
        bounds = {(r["domain"], r["status"]): (s, c)
                  for r, s, c in zip(got.rows, got.slack, got.complete_rows, strict=True)}
        assert bounds == {(r["domain"], r["status"]): (s, c)
                          for r, s, c in zip(rows, slack, complete, strict=True)}


def test_a_key_crosses_once_then_travels_as_a_slot() -> None:
    rows = rows_of({(f"www.domain-{i}.example.com", 200): (i + 1, 1.0) for i in range(300)})
    sender, receiver = KeyEncoder(), KeyDecoder()
    sizes = []
    for window in range(3):
        message = encode_batch(PartialBatch("q", (window, window + 1), "sfo", rows), AGGREGATE)
        coded = sender.encode(message)
        sizes.append(len(coded.payload))
        assert by_key(decode_batch(coded, AGGREGATE, receiver)) == by_key(
            decode_batch(message, AGGREGATE))
    plain = len(encode_batch(PartialBatch("q", (0, 1), "sfo", rows), AGGREGATE).payload)
    assert sizes[1] == sizes[2] < plain / 2 < sizes[0]


def test_a_coded_batch_is_refused_where_no_dictionary_decodes_it() -> None:
    message = encode_batch(PartialBatch("q", (0, 1), "sfo", rows_of({("a.com", 200): (1, 2.0)})),
                           AGGREGATE)
    with pytest.raises(DataError, match="does not hold the keys"):
        decode_batch(KeyEncoder().encode(message), AGGREGATE)


def coded(document: dict[str, Any]) -> pb.PartialBatch:
    return pb.PartialBatch(query="q", window_start_ms=0, window_end_ms=1, origin="sfo",
                           kind=pb.SUMMARY_KIND_ROWS,
                           payload=zlib.compress(json.dumps(document).encode()),
                           compressed=True)


PARTIALS = {"n": [1], "kb": [[1, 0, [2.0]]]}


@pytest.mark.parametrize(("slots", "keys", "message"), [
    ({}, {"domain": [0], "status": [0]}, "slot 0 is used before it is defined"),
    ({"domain": [[70000, "a"]], "status": [[0, 1]]}, {"domain": [70000], "status": [0]},
     "does not define a slot"),
    ({"domain": [[0, ["a"]]], "status": [[0, 1]]}, {"domain": [0], "status": [0]},
     "does not define a slot"),
    ({"domain": [[0, "a"]], "status": [[0, 1]]}, {"domain": [-1], "status": [0]},
     "not small non-negative integers"),
    ({"domain": [[0, "a"]], "status": [[0, 1]]}, {"domain": [0], "status": ["x"]},
     "not small non-negative integers"),
    ({"url": [[0, "a"]]}, {"domain": [0], "status": [0]}, "not defined per key column"),
    ({"domain": [[0, "a"]], "status": [[0, 1]]}, {"domain": [0, 0], "status": [0, 0]},
     "its columns differ in length|a group key has two rows"),
])
def test_slots_a_receiver_cannot_decode_are_refused(slots: dict[str, Any],
                                                    keys: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=message):
        decode_batch(coded({"keys": keys, "partials": PARTIALS, "slots": slots}), AGGREGATE,
                     KeyDecoder())


def test_a_batch_with_more_values_than_slots_goes_with_plain_keys() -> None:
    message = encode_batch(PartialBatch("q", (0, 1), "sfo", rows_of(
        {(f"d{i}", 200): (1, 1.0) for i in range(5)})), AGGREGATE)
    assert KeyEncoder(capacity=4).encode(message) is message
    assert len(decode_batch(message, AGGREGATE, KeyDecoder(capacity=4)).rows) == 5
