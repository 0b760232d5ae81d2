"""Bad input under fuzzing: the wire decoders, the sketches inside them, the topology and query
loaders, and a real gRPC receiver that refuses garbage and oversize messages while its other
streams go on.

For every decoder the only outcomes allowed are a value that passes its checks (and can be used:
merged, extracted, sent on) or its documented error -- DataError on the data plane,
PlacementError for a topology, PlanError for a query file -- saying what is wrong. Never
another exception, a hang, or a crash of the interpreter: DataSketches' C++ readers crash on
bad bytes unless the bytes are checked first, which is why some checks here run in a child
process.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import struct
import subprocess
import sys
import textwrap
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasketches as ds
import grpc
import pytest
import yaml
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.aggregates import Aggregate
from jetstream.aggtree.loader import MAX_NESTING, parse_topology
from jetstream.aggtree.topology import Topology
from jetstream.approx.items import from_items, to_items
from jetstream.approx.sketches import ApproxCountDistinct, ApproxQuantile, TopKItems
from jetstream.approx.truncate import exact_partial
from jetstream.control.codec import result_from_proto, result_to_proto
from jetstream.control.server import MAX_MESSAGE_BYTES, start_server
from jetstream.dataplane.codec import MAX_PAYLOAD_BYTES, decode_batch, encode_batch
from jetstream.dataplane.partials import PartialBatch
from jetstream.dataplane.servicer import DataPlaneServicer
from jetstream.dataplane.transport import PartialSender
from jetstream.errors import DataError, PlacementError, PlanError
from jetstream.operators import Phase, WindowAggregate
from jetstream.queryfile import load_query, query_from_source
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as rpc
from jetstream.v1 import query_pb2

ROOT = Path(__file__).resolve().parent.parent
LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
_QUERY = js.optimize(js.Query("q", LOGS.window(js.tumbling("10s")).group_by("domain").agg(
    n=js.count(), kb=js.sum("latency_ms"), mean=js.avg("bytes"), lo=js.min("status"),
    users=js.count_distinct("client_ip"), p=js.quantile("latency_ms", 0.9),
    hll=js.approx_count_distinct("client_ip"), kll=js.approx_quantile("latency_ms"),
    urls=js.top_k("url", 3))))
_WHOLE = next(op for op in map(_QUERY.plan().op, _QUERY.plan().topological())
              if isinstance(op, WindowAggregate))
#: Every kind of accumulator, as partials (count_distinct and quantile keep the query whole).
PARTIAL = WindowAggregate(schema=_WHOLE.schema, keys=_WHOLE.keys,
                          aggregates=_WHOLE.aggregates, phase=Phase.PARTIAL)
SKETCHED = [(name, agg) for name, agg in PARTIAL.aggregates
            if isinstance(agg, ApproxCountDistinct | ApproxQuantile | TopKItems)]

# Enough records that every sketch leaves its smallest form: HLL registers, several KLL
# levels, a frequent-items sketch that has purged.
RECORDS = [{"domain": ("a.com", "b.com", "é.org")[i % 3], "latency_ms": (i * 37 % 997) / 7,
            "bytes": i * 13, "status": 200 + i % 4 * 100,
            "client_ip": f"10.{i % 7}.{i // 7 % 250}.{i % 250}", "url": f"/p{i % 1100}"}
           for i in range(3000)]


def partial_rows(records: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    groups: dict[str, dict[str, Any]] = {}
    for record in records:
        row = groups.setdefault(record["domain"], {"domain": record["domain"], **{
            name: agg.create() for name, agg in PARTIAL.aggregates}})
        for name, agg in PARTIAL.aggregates:
            value = None if agg.expr is None else agg.expr.evaluate(record)
            row[name] = agg.add(row[name], value)
    return tuple(groups.values())


# ... and a row of small sketches
ROWS = partial_rows(RECORDS) + partial_rows([{**r, "domain": "small.net"} for r in RECORDS[:2]])
BATCH = PartialBatch("q", (0, 10_000), "sfo", ROWS, events=len(RECORDS), sequence=7)
VALID = encode_batch(BATCH, PARTIAL)
DOCUMENT = json.loads(zlib.decompress(VALID.payload))
ITEMS = encode_batch(dataclasses.replace(
    BATCH, rows=(), items=to_items(exact_partial(ROWS), PARTIAL, "n", 4), level=4), PARTIAL)
TEMPLATES = {"rows": VALID, "items": ITEMS}  # drawn by name: hypothesis prints what it draws


def refused_or_usable(message: pb.PartialBatch) -> PartialBatch | None:
    """Decode ``message``: a refusal must say what is wrong; a batch that passes must be
    usable -- its sketches answer, and the batch can be sent on to the next hop."""
    try:
        batch = decode_batch(message, PARTIAL)
    except DataError as e:
        assert re.match(r"partial batch from .+ for .+: \S", str(e), re.DOTALL), str(e)
        return None
    for row in batch.rows:
        for name, agg in SKETCHED:
            agg.extract(row[name])
            agg.error_bound(row[name])
    encode_batch(batch, PARTIAL)
    return batch


def with_payload(raw: bytes, compress: bool, template: pb.PartialBatch = VALID,
                 **fields: Any) -> pb.PartialBatch:
    message = pb.PartialBatch()
    message.CopyFrom(template)
    message.payload, message.compressed = (zlib.compress(raw) if compress else raw), compress
    for name, value in fields.items():
        setattr(message, name, value)
    return message


# -- byte mutations ---------------------------------------------------------------------------

#: One edit of a byte string: flip a bit, set a byte, cut it, append or insert bytes, or write
#: an extreme integer over a header field (sizes, counts, offsets live in the first 48 bytes).
EDITS = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10**6)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("field"), st.integers(0, 47), st.sampled_from([1, 2, 4, 8]),
              st.sampled_from([0, 1, 2, 3, 7, 8, 15, 0x7F, 0xFF, 0xFFFF, 0x7FFF_FFFF,
                               0xFFFF_FFFF, 2**63 - 1, 2**64 - 1])))


def edited(data: bytes, edits: list[tuple[Any, ...]]) -> bytes:
    out = bytearray(data)
    for edit in edits:
        kind, *args = edit
        if kind == "append":
            out += args[0]
        elif kind == "insert":
            at = args[0] % (len(out) + 1)
            out[at:at] = args[1]
        elif not out:
            continue
        elif kind == "flip":
            out[args[0] % len(out)] ^= 1 << args[1]
        elif kind == "set":
            out[args[0] % len(out)] = args[1]
        elif kind == "cut":
            del out[args[0] % len(out):]
        else:  # field
            at, width, value = args
            if at + width <= len(out):
                out[at:at + width] = (value & ((1 << 8 * width) - 1)).to_bytes(width, "little")
    return bytes(out)


# -- partial batches --------------------------------------------------------------------------

def test_the_samples_are_valid_and_every_sketch_is_past_its_smallest_form() -> None:
    assert refused_or_usable(VALID) is not None and refused_or_usable(ITEMS) is not None
    big = ROWS[0]
    assert big["hll"].get_estimate() > 500 and big["kll"].is_estimation_mode()
    assert big["urls"].num_active_items < 768  # it has purged


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_as_a_batch(data: bytes) -> None:
    try:
        message = pb.PartialBatch.FromString(data)
    except DecodeError:
        return  # gRPC refuses it before any of our code runs
    refused_or_usable(message)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=500), st.booleans(),
       st.sampled_from([pb.SUMMARY_KIND_ROWS, pb.SUMMARY_KIND_FREQUENT_ITEMS]))
def test_random_payloads(raw: bytes, compress: bool, kind: int) -> None:
    refused_or_usable(with_payload(raw, compress, kind=kind, ranked_by="n"))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(TEMPLATES)), st.lists(EDITS, min_size=1, max_size=4),
       st.booleans())
def test_mutated_payloads(name: str, edits: list[tuple[Any, ...]], inside: bool) -> None:
    """Edits of the bytes on the wire, or of the bytes inside the compressed stream."""
    template = TEMPLATES[name]
    if inside and template.compressed:
        raw = edited(zlib.decompress(template.payload), edits)
        message = with_payload(raw, True, template)
    else:
        message = with_payload(edited(template.payload, edits), False, template,
                               compressed=template.compressed)
    refused_or_usable(message)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=12)


def _paths(document: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield here
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _paths(value, (*here, key))
    elif isinstance(document, list):
        for i, value in enumerate(document[:3]):
            yield from _paths(value, (*here, i))


DOCUMENT_PATHS = [p for p in _paths(DOCUMENT) if p]


def _replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = dict(document) if isinstance(document, dict) else list(document)
    copy[path[0]] = _replaced(document[path[0]], path[1:], value)
    return copy


@settings(max_examples=250, deadline=None)
@given(st.sampled_from(DOCUMENT_PATHS), JSON_VALUES, st.booleans())
def test_wrong_values_anywhere_in_the_document(path: tuple[Any, ...], value: Any,
                                               compress: bool) -> None:
    """Wrong kinds, huge and negative counts, NaN and infinities, lists of the wrong length."""
    raw = json.dumps(_replaced(DOCUMENT, path, value)).encode()  # NaN is written as NaN
    refused_or_usable(with_payload(raw, compress))


COLUMNS = [("keys", "domain")] + [("partials", name) for name, _ in PARTIAL.aggregates]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(COLUMNS), st.sampled_from(COLUMNS))
def test_columns_swapped(a: tuple[str, str], b: tuple[str, str]) -> None:
    """A column sent as another: e.g. a KLL sketch where the HLL should be."""
    document = json.loads(json.dumps(DOCUMENT))
    document[a[0]][a[1]], document[b[0]][b[1]] = DOCUMENT[b[0]][b[1]], DOCUMENT[a[0]][a[1]]
    batch = refused_or_usable(with_payload(json.dumps(document).encode(), True))
    if a != b and {a[1], b[1]} & {name for name, _ in SKETCHED}:
        assert batch is None


INT_FIELDS = ["window_start_ms", "window_end_ms", "partition", "attempt", "sequence", "level",
              "events", "wan_bytes", "closed_at_ms", "revision", "kind"]
INT32 = {"partition", "attempt", "level", "revision", "kind"}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(TEMPLATES)),
       st.dictionaries(st.sampled_from(INT_FIELDS), st.integers(-(2**63), 2**63 - 1),
                       max_size=3),
       st.dictionaries(st.sampled_from(["error_bound", "items_extra"]), st.floats(), max_size=2),
       st.dictionaries(st.sampled_from(["query", "origin", "ranked_by"]),
                       st.text(max_size=10), max_size=2),
       st.lists(st.text(max_size=1200), max_size=70))
def test_mutated_fields(name: str, ints: dict[str, int],
                        floats: dict[str, float], texts: dict[str, str],
                        warnings: list[str]) -> None:
    """Negative sizes and counts, unknown kinds, NaN and infinite bounds, long warnings."""
    message = pb.PartialBatch()
    message.CopyFrom(TEMPLATES[name])
    for field, value in ints.items():
        setattr(message, field, value % 2**31 if field in INT32 and value >= 2**31 else
                max(value, -(2**31)) if field in INT32 else value)
    for field, number in floats.items():
        setattr(message, field, number)
    for field, text in texts.items():
        setattr(message, field, text)
    message.warnings.extend(warnings)
    batch = refused_or_usable(message)
    if batch is not None:  # nothing that passes is out of range
        assert batch.window[0] < batch.window[1] and 0 <= batch.error_bound < math.inf
        assert min(batch.partition, batch.attempt, batch.events, batch.revision) >= 0


@pytest.mark.parametrize(("payload", "compressed", "message"), [
    (zlib.compress(json.dumps(DOCUMENT).encode())[:-5], True, "cut short"),
    (zlib.compress(json.dumps(DOCUMENT).encode()) + b"extra", True, "followed by other bytes"),
    (zlib.compress(b"[" * 9 + b"1" * (MAX_PAYLOAD_BYTES) + b"]" * 9), True,
     f"inflates to over {MAX_PAYLOAD_BYTES} bytes"),
    (b"[" * 100_000 + b"]" * 100_000, False, "unreadable payload: maximum recursion depth"),
    (json.dumps({**DOCUMENT, "partials": {**DOCUMENT["partials"], "n": [2**64, 1, 1, 1]}})
     .encode(), False, "does not fit in 64 bits"),
    (json.dumps({**DOCUMENT, "partials": {**DOCUMENT["partials"],
                                          "kb": [[1, 0, [float("nan")]]] * 4}}).encode(),
     False, "NaN is not a finite number"),
    (json.dumps({**DOCUMENT, "partials": {**DOCUMENT["partials"],
                                          "kb": [[1, 0, [1e999]]] * 4}}).encode(),
     False, "Infinity is not a finite number"),
    (json.dumps({**DOCUMENT, "partials": {**DOCUMENT["partials"],
                                          "users": [[[1]], [], [], []]}}).encode(),
     False, "unhashable"),
], ids=["truncated zlib", "zlib and more", "zip bomb", "deep nesting", "huge count", "nan",
        "1e999", "unhashable distinct value"])
def test_regressions_found_by_fuzzing(payload: bytes, compressed: bool, message: str) -> None:
    """Each of these once got through as a wrong value or escaped as another exception."""
    with pytest.raises(DataError, match=re.escape(message)):
        decode_batch(with_payload(payload, False, compressed=compressed), PARTIAL)


@pytest.mark.parametrize(("fields", "message"), [
    ({"error_bound": math.nan}, "error_bound should be a non-negative number"),
    ({"error_bound": -0.5}, "error_bound should be a non-negative number"),
    ({"events": -1}, "events should be a non-negative number"),
    ({"partition": -3, "revision": -1}, "partition, revision should be"),
])
def test_out_of_range_fields_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=re.escape(message)):
        decode_batch(with_payload(zlib.decompress(VALID.payload), True, **fields), PARTIAL)


def test_an_items_sketch_with_an_infinite_extra_is_refused() -> None:
    message = with_payload(ITEMS.payload, False, ITEMS, compressed=ITEMS.compressed,
                           items_extra=math.inf)
    with pytest.raises(DataError, match="extra error inf is not a finite non-negative"):
        decode_batch(message, PARTIAL)


# -- sketches ---------------------------------------------------------------------------------

def _hll(lg_k: int, n: int, target: Any = None, union: bool = False) -> bytes:
    sketch = ds.hll_sketch(lg_k) if target is None else ds.hll_sketch(lg_k, target)
    for i in range(n):
        sketch.update(i)
    if union:
        gadget = ds.hll_union(lg_k)
        gadget.update(sketch)
        sketch = gadget.get_result(ds.tgt_hll_type.HLL_4)
    return bytes(sketch.serialize_compact())


def _kll(n: int, k: int = 200) -> bytes:
    sketch = ds.kll_doubles_sketch(k)
    for i in range(n):
        sketch.update(i * 0.37 % 101)
    return bytes(sketch.serialize())


def _items(n: int, lg_max_k: int = 10) -> bytes:
    sketch = ds.frequent_strings_sketch(lg_max_k)
    for i in range(n):
        sketch.update(f"/p{i % 1300}", 1 + i % 3)
    return bytes(sketch.serialize())


HLL, KLL, TOP = ApproxCountDistinct(None, 12), ApproxQuantile(None, 0.5, 200), TopKItems(None)
#: Valid sketches in each of their forms, by name (hypothesis prints what it draws).
SKETCH_SAMPLES: dict[str, tuple[Aggregate, bytes]] = {
    **{f"hll {form}": (HLL, _hll(12, n))
       for form, n in (("empty", 0), ("list", 3), ("set", 100), ("registers", 5000))},
    **{f"hll {t.name}": (HLL, _hll(8, 3000, t))
       for t in (ds.tgt_hll_type.HLL_4, ds.tgt_hll_type.HLL_6, ds.tgt_hll_type.HLL_8)},
    "hll union": (HLL, _hll(12, 40_000, union=True)),
    **{f"kll {n}": (KLL, _kll(n)) for n in (0, 1, 150, 5000)},
    "kll k=8": (KLL, _kll(3000, k=8)),
    **{f"items {n}": (TOP, _items(n)) for n in (0, 5, 5000)},
}


def usable(agg: Aggregate, acc: Any) -> None:
    """A sketch that passed ``decode`` answers, merges both ways, and crosses the wire again."""
    agg.extract(acc)
    agg.error_bound(acc)
    fresh = agg.add(agg.create(), 1)
    agg.extract(agg.merge(agg.create(), acc))
    agg.extract(agg.merge(acc, fresh))
    again = agg.decode(agg.encode(acc))
    agg.extract(again)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(SKETCH_SAMPLES)), st.lists(EDITS, min_size=1, max_size=4))
def test_corrupt_sketches_are_refused_or_usable(name: str,
                                                edits: list[tuple[Any, ...]]) -> None:
    agg, data = SKETCH_SAMPLES[name]
    try:
        acc = agg.decode(base64.b64encode(edited(data, edits)).decode())
    except ValueError as e:
        assert str(e).startswith(f"{agg.name}: not a "), str(e)
        return
    usable(agg, acc)


def test_the_sketch_samples_pass() -> None:
    for agg, data in SKETCH_SAMPLES.values():
        usable(agg, agg.decode(base64.b64encode(data).decode()))


@pytest.mark.parametrize(("agg", "data", "message"), [
    (HLL, _kll(5000), "not a compact HLL sketch: family 15"),
    (HLL, _items(50), "not a compact HLL sketch: family 10"),
    (KLL, _hll(12, 5000), "not a KLL doubles sketch: family 7"),
    (TOP, _kll(10), "not a frequent-items sketch: family 15"),
    (HLL, _hll(16, 5000), "lg_k 16 is not between 4 and this aggregate's 12"),
    (KLL, _kll(5000, k=400), "k 400 is not between 8 and this aggregate's 200"),
    (TOP, _items(10, lg_max_k=12), "a map of 2**12 items, over this aggregate's 2**10"),
    (HLL, bytes(ds.hll_sketch(12).serialize_updatable()), "flags 0x04"),
], ids=["kll as hll", "items as hll", "hll as kll", "kll as items", "bigger hll",
        "bigger kll", "bigger items", "updatable hll"])
def test_a_sketch_claiming_another_aggregate_is_refused(agg: Aggregate, data: bytes,
                                                        message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        agg.decode(base64.b64encode(data).decode())


#: Sketches that crashed the interpreter (segfault or abort) in a later merge or extract
#: before their bytes were checked; each is built from a valid one by a small edit.
CRASHERS = textwrap.dedent("""
    import base64, struct, sys
    import datasketches as ds
    from jetstream.approx.sketches import ApproxCountDistinct, ApproxQuantile

    def kll_level_past_the_next():  # KLL extract: segfault
        s = ds.kll_doubles_sketch(200)
        for i in range(2000):
            s.update(i / 7)
        b = bytearray(s.serialize())
        struct.pack_into("<I", b, 24, struct.unpack_from("<I", b, 24)[0] + 100)
        return ApproxQuantile(None, 0.5, 200), bytes(b), lambda agg, acc: agg.extract(acc)

    def hll4_register_without_exception():  # HLL union: segfault
        s = ds.hll_sketch(8, ds.tgt_hll_type.HLL_4)
        for i in range(3000):
            s.update(i)
        b = bytearray(s.serialize_compact())
        b[40] |= 0x0F
        return ApproxCountDistinct(None, 8), bytes(b), lambda agg, acc: agg.merge(acc, acc)

    def hll_list_of_255():  # HLL deserialize: heap overflow, abort
        s = ds.hll_sketch(12)
        for i in range(5):
            s.update(i)
        b = bytearray(s.serialize_compact())
        b[6] = 255
        b = (bytes(b) + bytes(range(256)) * 4)[:8 + 4 * 255]
        return ApproxCountDistinct(None, 12), b, lambda agg, acc: agg.merge(acc, acc)

    for make in (kll_level_past_the_next, hll4_register_without_exception, hll_list_of_255):
        agg, data, use = make()
        try:
            use(agg, agg.decode(base64.b64encode(data).decode()))
        except ValueError as e:
            print(make.__name__, "refused:", e)
        else:
            print(make.__name__, "ACCEPTED")
""")


def test_sketches_that_crashed_the_interpreter_are_refused() -> None:
    done = subprocess.run([sys.executable, "-c", CRASHERS], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-500:]}"
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [
        "kll_level_past_the_next", "hll4_register_without_exception", "hll_list_of_255"]
    assert all("refused: " in line for line in lines), lines
    assert "level boundaries" in lines[0] and "exceptions" in lines[1] and "coupons" in lines[2]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([0, 5, 300, 5000]), st.lists(EDITS, max_size=4), st.floats(),
       st.sampled_from(["n", "kb", "mean", "?"]))
def test_items_sketches_are_refused_or_read(n: int, edits: list[tuple[Any, ...]],
                                            extra: float, rank: str) -> None:
    data = to_items(exact_partial(ROWS[:n % len(ROWS)]), PARTIAL, "n", 4 + n % 3).serialize()
    try:
        read = from_items(edited(data, edits), extra, PARTIAL, rank)
    except DataError as e:
        assert str(e).startswith("frequent items: "), str(e)
        return
    assert all(0 <= s < math.inf for s in read.slack) and 0 <= read.omitted < math.inf


# -- window results ---------------------------------------------------------------------------

def _record(depth: int) -> st.SearchStrategy[query_pb2.Record]:
    scalar = st.one_of(st.builds(query_pb2.Value),
                       st.builds(query_pb2.Value, string_value=st.text(max_size=8)),
                       st.builds(query_pb2.Value, int_value=st.integers(-(2**63), 2**63 - 1)),
                       st.builds(query_pb2.Value, float_value=st.floats()),
                       st.builds(query_pb2.Value, bool_value=st.booleans()))
    value = scalar if depth == 0 else scalar | st.builds(
        query_pb2.Value, list_value=st.builds(query_pb2.RecordList,
                                              records=st.lists(_record(depth - 1), max_size=2)))
    return st.builds(query_pb2.Record, fields=st.dictionaries(st.text(max_size=5), value,
                                                              max_size=3))


RESULTS = st.builds(
    query_pb2.WindowResult, query=st.text(max_size=8),
    window_start_ms=st.integers(-(2**63), 2**63 - 1), window_end_ms=st.integers(-(2**63),
                                                                                2**63 - 1),
    rows=st.lists(_record(2), max_size=3), exact=st.booleans(),
    error_bound=st.none() | st.floats(), sites_reporting=st.integers(-(2**31), 2**31 - 1),
    sites_expected=st.integers(-(2**31), 2**31 - 1), latency_s=st.floats(),
    wan_bytes=st.integers(-(2**63), 2**63 - 1), revision=st.integers(-(2**31), 2**31 - 1),
    warnings=st.lists(st.text(max_size=10), max_size=2),
    columns=st.lists(st.text(max_size=5), max_size=3))


@settings(max_examples=200, deadline=None)
@given(RESULTS | st.binary(max_size=200).map(
    lambda b: _parsed(b) or query_pb2.WindowResult()))
def test_window_results_from_the_wire(message: query_pb2.WindowResult) -> None:
    try:
        result = result_from_proto(message)
    except DataError as e:
        assert str(e).startswith("window result of "), str(e)
        return
    assert result.window_start < result.window_end
    assert result.error_bound is None or 0 <= result.error_bound < math.inf
    result_from_proto(result_to_proto(result))  # the controller streams it on


def _parsed(data: bytes) -> query_pb2.WindowResult | None:
    try:
        return query_pb2.WindowResult.FromString(data)
    except DecodeError:
        return None


@pytest.mark.parametrize(("fields", "message"), [
    ({"window_start_ms": 10, "window_end_ms": 10}, "window [10, 10) is empty"),
    ({"error_bound": math.nan}, "error_bound nan is not a finite non-negative number"),
    ({"error_bound": -1.0}, "error_bound -1.0 is not"),
    ({"sites_reporting": -1}, "sites_reporting, sites_expected, wan_bytes and revision cannot"),
    ({"latency_s": math.inf}, "latency_s inf is not finite"),
])
def test_bad_window_results_are_refused(fields: dict[str, Any], message: str) -> None:
    result = query_pb2.WindowResult(query="q", window_start_ms=0, window_end_ms=10)
    for name, value in fields.items():
        setattr(result, name, value)
    with pytest.raises(DataError, match=re.escape(f"window result of q at "
                                                  f"{result.window_start_ms}: {message}")):
        result_from_proto(result)


# -- topologies -------------------------------------------------------------------------------

TOPOLOGY_TEXTS = [(ROOT / "topologies" / f"{name}.yaml").read_text()
                  for name in ("local-3dc", "cdn-3dc")]
WHERE = re.compile(r"^fuzz:\d+: \S")


def topology_or_refusal(text: str) -> Topology | None:
    try:
        return parse_topology(text, origin="fuzz")
    except PlacementError as e:
        assert WHERE.match(str(e)), str(e)
        return None


SNIPPETS = ["!!float abc", "!!int x", "!!binary '@@'", "!!timestamp soon", "!!set {a}",
            "!!python/object:os.system x", "*nowhere", "&a x", "<<: *a", "<<: 5", "<<: {[x]: 1}",
            "[[[", "{a: ", "~", "1e999", "-1", "0", ".nan", ".inf", "'", "\t", "? [a]\n: b",
            "2001-12-14", "9" * 500 + "ms", "0x1F", "🙂", "\x00", "\ufeff", "- - -", "&x [*x]",
            "{" * 200, "[" * 70 + "]" * 70]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(TOPOLOGY_TEXTS), st.lists(st.tuples(
    st.sampled_from(["delete", "repeat", "value", "insert", "indent", "char"]),
    st.integers(0, 10**4), st.integers(0, 10**4), st.sampled_from(SNIPPETS),
    st.characters(min_codepoint=32, max_codepoint=126)), min_size=1, max_size=4))
def test_mutated_topology_files(text: str, edits: list[tuple[str, int, int, str, str]]) -> None:
    lines = text.splitlines()
    for kind, i, j, snippet, char in edits:
        i %= len(lines)
        line = lines[i]
        if kind == "delete" and len(lines) > 1:
            del lines[i]
        elif kind == "repeat":
            lines.insert(i, lines[j % len(lines)])
        elif kind == "value" and ":" in line:
            lines[i] = line[:line.index(":") + 1] + " " + snippet
        elif kind == "insert":
            at = j % (len(line) + 1)
            lines[i] = line[:at] + snippet + line[at:]
        elif kind == "indent":
            lines[i] = " " * (j % 7) + line.lstrip()
        elif kind == "char" and line:
            at = j % len(line)
            lines[i] = line[:at] + char + line[at + 1:]
    topology_or_refusal("\n".join(lines))


YAML_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(), st.text(max_size=8),
    st.sampled_from(["DC1", "PoP1", "ams", "sfo", "pop", "edge", "datacenter", "100mbit",
                     "1.5gbit", "20ms", "10s", "local[2]", "cdn_logs", "bps"]))
YAML_KEYS = st.sampled_from(["name", "root", "sites", "kind", "servers", "cores", "memory_gb",
                             "sources", "links", "between", "bandwidth", "latency",
                             "events_per_s", "bytes_per_event", "distinct_keys",
                             "spark_master", "extra", "<<"]) | st.text(max_size=5)
YAML_DOCUMENTS = st.recursive(
    YAML_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(YAML_KEYS, inner, max_size=5),
    max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(YAML_DOCUMENTS | st.fixed_dictionaries(
    {"name": YAML_SCALARS, "root": YAML_SCALARS, "sites": YAML_DOCUMENTS},
    optional={"links": YAML_DOCUMENTS}))
def test_generated_topology_documents(document: Any) -> None:
    topology_or_refusal(yaml.safe_dump(document, allow_unicode=True))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_random_topology_text(text: str) -> None:
    topology_or_refusal(text)


def _leaves(document: Any, here: str = "") -> Iterator[tuple[str, tuple[Any, ...]]]:
    """(field path as the loader names it, key path) of every scalar in a topology."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _leaves(value, f"{here}.{key}" if here else key) if isinstance(
                value, dict | list) else [(f"{here}.{key}" if here else key, ())]
    elif isinstance(document, list):
        for i, value in enumerate(document):
            yield from _leaves(value, f"{here}[{i}]")


LOCAL = yaml.safe_load(TOPOLOGY_TEXTS[0])
FIELDS = [path for path, _ in _leaves(LOCAL)]


def _set(document: Any, path: str, value: Any) -> Any:
    copy = json.loads(json.dumps(document))
    *parents, last = re.findall(r"[^.\[\]]+", path)
    node = copy
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[last] = value
    return copy


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(FIELDS), YAML_DOCUMENTS)
def test_a_wrong_value_is_refused_naming_a_field(path: str, value: Any) -> None:
    text = yaml.safe_dump(_set(LOCAL, path, value), allow_unicode=True)
    try:
        parse_topology(text, origin="fuzz")
    except PlacementError as e:
        named = re.match(r"^fuzz:\d+: ([\w.\[\]-]+): ", str(e))
        assert named or "missing required field" in str(e), str(e)


@pytest.mark.parametrize(("text", "message"), [
    ("[" * 100_000 + "]" * 100_000, f"nested more than {MAX_NESTING} deep"),
    ("a: b\n" + "[" * 100_000 + "]" * 99_999 + "}", "malformed YAML"),
    ("".join(" " * i + "a:\n" for i in range(200)), f"nested more than {MAX_NESTING} deep"),
    (TOPOLOGY_TEXTS[0].replace("cores: 2", "cores: !!int two", 1), "cannot read 'two' as"),
    (TOPOLOGY_TEXTS[0].replace("cores: 2", "cores: !!float abc", 1), "cannot read 'abc' as"),
    (TOPOLOGY_TEXTS[0].replace("name: local-3dc", "name: !!timestamp soon"),
     "name: cannot read 'soon' as tag:yaml.org,2002:timestamp"),
    (TOPOLOGY_TEXTS[0].replace("latency: 1ms", "latency: " + "9" * 400 + "ms", 1),
     "links[0].latency: longer than a day"),
    (TOPOLOGY_TEXTS[0].replace("name: local-3dc", "name: local-3dc\n<<: {[a]: 1}"),
     "expected a field name, got a list"),
], ids=["deep flow list: libyaml crashed", "deep and broken: Python recursion",
        "deep block mapping", "!!int", "!!float", "!!timestamp", "latency past a float",
        "merged list key"])
def test_topology_regressions_found_by_fuzzing(text: str, message: str) -> None:
    with pytest.raises(PlacementError, match=re.escape(message)):
        parse_topology(text, origin="fuzz")


# -- query files ------------------------------------------------------------------------------

EXAMPLE = (ROOT / "examples" / "cdn_topk.py").read_text()


@pytest.mark.parametrize(("source", "message"), [
    ("raise ValueError('no')", "f.py: running the query file raised ValueError: no"),
    ("import sys\nsys.exit(3)", "f.py: the query file called exit(3)"),
    ("raise SystemExit", "f.py: the query file called exit()"),
    ("raise GeneratorExit", "raised GeneratorExit"),
    ("class E(Exception):\n    def __str__(self):\n        raise ValueError\nraise E()",
     "raised E: <E that cannot say what it is>"),
    ("def f():\n    f()\nf()", "raised RecursionError"),
    ("", "must assign a js.Query to the name `query`, found nothing"),
    ("query = 5", "found a int"),
    ("import jetstream as js\nquery = js.source('x', schema=js.CDN_LOG_SCHEMA)",
     "found a Stream"),
    ("query = (\n", "f.py:1: syntax error"),
    ("x = 1\n  y = 2", "f.py:2: syntax error: unexpected indent"),
    ("x = '\x00'", "syntax error"),
    ("(" * 5000 + ")" * 5000, "syntax error: too many nested parentheses"),
    ("import jetstream as js\nquery = js.Query('q', None)", "f.py: query q: expected a"),
])
def test_bad_query_files_get_a_plan_error(source: str, message: str) -> None:
    with pytest.raises(PlanError, match=re.escape(message)):
        query_from_source(source, "f.py")


def test_unreadable_query_files(tmp_path: Path) -> None:
    binary = tmp_path / "latin1.py"
    binary.write_bytes(b"query = '\xff'\n")
    with pytest.raises(PlanError, match=r"latin1.py: cannot read the query file: not UTF-8"):
        load_query(binary)
    with pytest.raises(PlanError, match="no such query file"):
        load_query(tmp_path)  # a directory
    with pytest.raises(PlanError, match="no such query file"):
        load_query(tmp_path / "missing.py")


SAFE_CHARS = st.sampled_from(list("abcxyz019 .,:()[]'\"=_-#\n"))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["delete", "repeat", "char"]), st.integers(0, 10**4),
                          st.integers(0, 10**4), SAFE_CHARS), min_size=1, max_size=3))
def test_mutated_query_files(edits: list[tuple[str, int, int, str]]) -> None:
    lines = EXAMPLE.splitlines()
    for kind, i, j, char in edits:
        i %= len(lines)
        if kind == "delete":
            del lines[i]
        elif kind == "repeat":
            lines.insert(i, lines[j % len(lines)])
        elif lines[i]:
            at = j % len(lines[i])
            lines[i] = lines[i][:at] + char + lines[i][at + 1:]
        if not lines:
            lines = [""]
    try:
        query = query_from_source("\n".join(lines), "f.py")
    except PlanError as e:
        assert str(e).startswith("f.py"), str(e)
    else:
        assert isinstance(query, js.Query)


# -- a real receiver: refusals end one stream, the others go on --------------------------------

class Receiver:
    """A DataPlaneServicer served the way the site daemons serve it (start_server's limits)."""

    def __init__(self) -> None:
        self.delivered: list[PartialBatch] = []
        self.arrived = threading.Condition()
        self.servicer = DataPlaneServicer(lambda q: PARTIAL if q == "q" else None, self._deliver)
        self.server, self.port = start_server(
            [(rpc.add_DataPlaneServicer_to_server, self.servicer, "jetstream.v1.DataPlane")], 0)

    def _deliver(self, batch: PartialBatch) -> None:
        with self.arrived:
            self.delivered.append(batch)
            self.arrived.notify_all()

    def from_(self, origin: str) -> list[PartialBatch]:
        with self.arrived:
            return [b for b in self.delivered if b.origin == origin]


def _push(port: int, messages: list[pb.PushMessage]) -> tuple[int, grpc.StatusCode | None]:
    """Push ``messages`` on one stream: how many were acked, and the status it ended with."""
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[
            ("grpc.max_send_message_length", -1)]) as channel:
        acks = 0
        try:
            for _ in rpc.DataPlaneStub(channel).Push(iter(messages), timeout=30):
                acks += 1
        except grpc.RpcError as e:
            return acks, e.code()
        return acks, None


def _raw_push(port: int, data: bytes) -> grpc.StatusCode | None:
    """Bytes that are not a protobuf message at all, on a stream of their own."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream("/jetstream.v1.DataPlane/Push",
                                     request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)
        try:
            list(call(iter([data]), timeout=30))
        except grpc.RpcError as e:
            return e.code()
        return None


def _batch(origin: str, window: int, **fields: Any) -> pb.PushMessage:
    rows = partial_rows(RECORDS[window % 7::7][:50])
    return pb.PushMessage(batch=encode_batch(
        PartialBatch("q", (window, window + 10), origin, rows, **fields), PARTIAL))


def _with(message: pb.PushMessage, **fields: Any) -> pb.PushMessage:
    out = pb.PushMessage()
    out.CopyFrom(message)
    for name, value in fields.items():
        setattr(out.batch, name, value)
    return out


def _corrupt_kll(origin: str) -> pb.PushMessage:
    """A batch whose KLL sketch would crash the receiver's interpreter if it were read."""
    message = _batch(origin, 0)
    document = json.loads(zlib.decompress(message.batch.payload))
    sketch = bytearray(base64.b64decode(document["partials"]["kll"][0]))
    struct.pack_into("<I", sketch, 24, struct.unpack_from("<I", sketch, 24)[0] + 100)
    document["partials"]["kll"][0] = base64.b64encode(sketch).decode()
    return _with(message, payload=json.dumps(document).encode(), compressed=False)


def test_refused_streams_leave_the_others_whole() -> None:
    receiver = Receiver()
    good = PartialSender(f"127.0.0.1:{receiver.port}", max_backoff_s=0.2)
    windows = list(range(0, 400, 10))
    try:
        assert MAX_PAYLOAD_BYTES < MAX_MESSAGE_BYTES
        oversize = _with(_batch("big", 10), payload=b"x" * (MAX_MESSAGE_BYTES + 1))
        bad: dict[str, Callable[[], Any]] = {
            "garbage": lambda: _push(receiver.port, [
                _batch("garbage", 0), _with(_batch("garbage", 10), payload=b"\x00garbage")]),
            "oversize": lambda: _push(receiver.port, [_batch("big", 0), oversize]),
            "sketch": lambda: _push(receiver.port, [_corrupt_kll("sketch")]),
            "not protobuf": lambda: _raw_push(receiver.port, b"\xff" * 64),
        }
        outcomes: dict[str, Any] = {}
        threads = [threading.Thread(target=lambda k=k, f=f: outcomes.__setitem__(k, f()))
                   for k, f in bad.items()]
        for i, w in enumerate(windows):
            good.send(_batch("good", w, sequence=w).batch)
            if i == len(windows) // 2:  # the bad streams arrive while the good one is busy
                for thread in threads:
                    thread.start()
        for thread in threads:
            thread.join(60)
        assert good.flush(30), f"{good.unacked} batches of the good stream were never acked"
        assert sorted(b.window[0] for b in receiver.from_("good")) == windows

        assert outcomes["garbage"] == (1, grpc.StatusCode.INVALID_ARGUMENT)
        assert outcomes["oversize"] == (1, grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert outcomes["sketch"] == (0, grpc.StatusCode.INVALID_ARGUMENT)
        assert outcomes["not protobuf"] is not None and outcomes["not protobuf"] is not (
            grpc.StatusCode.OK)
        # What got through before each refusal was delivered; the refusals were counted.
        assert [b.window[0] for b in receiver.from_("garbage")] == [0]
        assert [b.window[0] for b in receiver.from_("big")] == [0]
        assert receiver.servicer.refused == {"garbage": 1, "sketch": 1}
    finally:
        good.close()
        receiver.server.stop(grace=0).wait(5)
