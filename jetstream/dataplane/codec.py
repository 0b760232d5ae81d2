"""The data plane's wire form: a partial batch (``jetstream.v1.PartialBatch``) and an ask of
TPUT's rounds (``RoundAsk``), to their messages and back.

A batch's payload is columnar JSON — the group keys column by column, then each aggregate's
accumulators (``Aggregate.encode``: numbers and lists, or a sketch's own bytes; an exact float
sum's partials as integers over a power of two when that is shorter, ``scales``) — or, at a
sketch degradation level, a frequent-items sketch of the keys (:mod:`jetstream.approx.items`);
compressed with zlib when that is smaller. Decoding checks everything a peer could get wrong
and raises :class:`~jetstream.errors.DataError` naming it, so a bad batch (or ask) is
refused, never merged. (How a sketch accumulator crosses inside the payload is the
aggregate's own: :mod:`jetstream.approx.summaries`.)

The control plane's messages have a codec of their own (:mod:`jetstream.control.codec`), and
so does the query (:mod:`jetstream.planwire`).
"""

from __future__ import annotations

import json
import math
import zlib
from typing import Any

from jetstream.aggregates import Sum
from jetstream.approx.items import from_items
from jetstream.approx.rounds import Ask
from jetstream.approx.truncate import Ranges, ranged_aggregates
from jetstream.dataplane.keydict import KeyDecoder
from jetstream.dataplane.partials import PartialBatch
from jetstream.errors import DataError
from jetstream.operators import WindowAggregate
from jetstream.v1 import dataplane_pb2 as pb

__all__ = ["MAX_PAYLOAD_BYTES", "ask_from_proto", "ask_to_proto", "decode_batch",
           "encode_batch"]

Window = tuple[int, int]

#: The largest payload a receiver accepts, compressed or not.
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
#: The most warnings a batch may carry (one per link on its way is plenty).
MAX_WARNINGS = 64
#: The finest binary fraction a float sum goes as an integer with (``_scaled_sums``).
MAX_SCALE = 30


def encode_batch(batch: PartialBatch, aggregate: WindowAggregate, *,
                 compress: bool = True) -> pb.PartialBatch:
    """The batch's wire form; ``compress=False`` for a hop within a site (to and from its
    workers), where compressing costs more time than the bytes it saves."""
    if batch.items is not None:
        kind, raw = pb.SUMMARY_KIND_FREQUENT_ITEMS, batch.items.serialize()
    else:
        kind, raw = pb.SUMMARY_KIND_ROWS, _document(batch, aggregate)
    packed = zlib.compress(raw, 6) if compress else raw
    compressed = len(packed) < len(raw)
    return pb.PartialBatch(
        query=batch.query, window_start_ms=batch.window[0], window_end_ms=batch.window[1],
        origin=batch.origin, partition=batch.partition, attempt=batch.attempt,
        sequence=batch.sequence, kind=kind, level=batch.level,
        payload=packed if compressed else raw, compressed=compressed, events=batch.events,
        error_bound=batch.error_bound, complete=batch.complete, covers=sorted(batch.covers),
        wan_bytes=batch.wan_bytes, closed_at_ms=batch.closed_at_ms, revision=batch.revision,
        ranked_by=batch.items.rank if batch.items else "",
        items_extra=batch.items.extra if batch.items else 0.0, warnings=batch.warnings,
        rounds=batch.rounds, early=batch.early)


def _document(batch: PartialBatch, aggregate: WindowAggregate) -> bytes:
    document: dict[str, Any] = {
        "keys": {k: [row[k] for row in batch.rows] for k in aggregate.keys},
        "partials": {name: [agg.encode(agg.compact(row[name])) for row in batch.rows]
                     for name, agg in aggregate.aggregates},
    }
    scales = {}
    for name, agg in aggregate.aggregates:
        if isinstance(agg, Sum):
            scaled = _scaled_sums(document["partials"][name])
            if scaled is not None:
                scales[name], document["partials"][name] = scaled
    if scales:
        document["scales"] = scales
    if batch.slack is not None:
        complete = batch.complete_rows or tuple(s == 0 for s in batch.slack)
        document["bounds"] = {"slack": list(batch.slack), "omitted": batch.omitted,
                              "complete": list(complete), "cut": batch.cut}
        if batch.ranges is not None:
            document["bounds"]["ranges"] = {name: list(r) for name, r in batch.ranges.items()}
    if batch.rolled_up:
        document["rolled_up"] = True
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def decode_batch(message: pb.PartialBatch, aggregate: WindowAggregate,
                 keys: KeyDecoder | None = None) -> PartialBatch:
    """The batch in ``message``; raises DataError saying what is wrong with it. ``keys``:
    the dictionary of the stream it came on, if its keys may come as slots."""
    where = f"partial batch from {message.origin or '?'} for {message.query or '?'}"
    if not message.origin or not message.query:
        msg = f"{where}: no origin or query"
        raise DataError(msg)
    if message.window_end_ms <= message.window_start_ms:
        msg = f"{where}: window [{message.window_start_ms}, {message.window_end_ms}) is empty"
        raise DataError(msg)
    if message.kind not in (pb.SUMMARY_KIND_ROWS, pb.SUMMARY_KIND_FREQUENT_ITEMS):
        msg = f"{where}: summary kind {message.kind} is not understood here"
        raise DataError(msg)
    if len(message.warnings) > MAX_WARNINGS or any(len(w) > 1000 for w in message.warnings):
        msg = f"{where}: more than {MAX_WARNINGS} warnings, or one over 1000 characters"
        raise DataError(msg)
    if len(message.payload) > MAX_PAYLOAD_BYTES:
        msg = f"{where}: payload of {len(message.payload)} bytes is over the limit"
        raise DataError(msg)
    negative = [name for name in ("partition", "attempt", "sequence", "level", "events",
                                  "wan_bytes", "closed_at_ms", "revision")
                if getattr(message, name) < 0]
    if negative or not 0 <= message.error_bound < math.inf:
        msg = (f"{where}: {', '.join(negative) or 'error_bound'} should be a non-negative "
               "number")
        raise DataError(msg)
    raw = _inflate(message.payload, where) if message.compressed else message.payload
    try:
        document = (None if message.kind == pb.SUMMARY_KIND_FREQUENT_ITEMS
                    else json.loads(raw, parse_int=_int64, parse_float=_finite,
                               parse_constant=_no_constant))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        msg = f"{where}: unreadable payload: {e}"
        raise DataError(msg) from None
    if keys is not None:
        try:
            document = keys.decode(message.query, document)
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
    slack: tuple[float, ...] | None
    complete: tuple[bool, ...] | None
    if document is None:
        try:
            read = from_items(raw, message.items_extra, aggregate, message.ranked_by)
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
        rows, slack, omitted, complete = read.rows, read.slack, read.omitted, read.complete
        cut, ranges, rolled_up = 0.0, None, False
    else:
        if isinstance(document, dict) and isinstance(document.get("partials"), dict):
            _unscaled(document, aggregate, where)
        rows = _rows(document, aggregate, where)
        bounds = document.get("bounds")
        slack, omitted, complete, cut = _bounds(bounds, len(rows), where)
        ranges = None if slack is None else _ranges(bounds.get("ranges"), aggregate, where)
        rolled_up = document.get("rolled_up", False)
        if rolled_up is not False and not (rolled_up is True and aggregate.rollup):
            msg = (f"{where}: rolled_up is {rolled_up!r}, but the query declares "
                   f"{'a' if aggregate.rollup else 'no'} roll-up")
            raise DataError(msg)
    return PartialBatch(
        query=message.query, window=(message.window_start_ms, message.window_end_ms),
        origin=message.origin, rows=rows, partition=message.partition, attempt=message.attempt,
        sequence=message.sequence, events=message.events, error_bound=message.error_bound,
        complete=message.complete, level=message.level,
        covers=frozenset(message.covers) or frozenset({message.origin}),
        wan_bytes=message.wan_bytes, closed_at_ms=message.closed_at_ms,
        revision=message.revision, slack=slack, omitted=omitted, complete_rows=complete, cut=cut,
        ranges=ranges, rolled_up=rolled_up, warnings=tuple(message.warnings),
        rounds=message.rounds and slack is not None, early=message.early)


def _scaled_sums(column: list[Any]) -> tuple[int, list[Any]] | None:
    """A column of exact float sums (``[n, integer total, float partials]``) with every
    float partial as an integer times 2**-scale, when that is exact and shorter than the
    floats written out: (scale, the column so). Sums of values with few binary fraction
    digits (kilobytes as bytes / 1024, halves, quarters) shrink to integers, a third or
    less of their text; others stay as they are (None)."""
    floats = [x for acc in column for x in acc[2]]
    if not floats or not all(type(x) is float and math.isfinite(x) for x in floats):
        return None
    scale = max(x.as_integer_ratio()[1].bit_length() - 1 for x in floats)
    if scale > MAX_SCALE or any(abs(x) * 2.0**scale > 2**53 for x in floats):
        return None  # not exact as a 53-bit integer, or too fine to gain anything
    ints = [int(x * 2**scale) for x in floats]
    if sum(len(str(i)) for i in ints) >= sum(len(repr(x)) for x in floats):
        return None
    parts = iter(ints)
    return scale, [[n, total, [next(parts) for _ in partials]]
                   for n, total, partials in column]


def _unscaled(document: dict[str, Any], aggregate: WindowAggregate, where: str) -> None:
    """Undo :func:`_scaled_sums` in ``document``, checking what it says."""
    scales = document.pop("scales", None)
    if scales is None:
        return
    sums = {name for name, agg in aggregate.aggregates if isinstance(agg, Sum)}
    if not isinstance(scales, dict) or not set(scales) <= sums or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_SCALE
            for s in scales.values()):
        msg = f"{where}: scales {scales!r:.80} name no sums of this query, or are out of range"
        raise DataError(msg)
    for name, scale in scales.items():
        column = document["partials"].get(name)
        for acc in column if isinstance(column, list) else ():
            if not (isinstance(acc, list) and len(acc) == 3 and isinstance(acc[2], list)
                    and all(isinstance(v, int) and not isinstance(v, bool)
                            and abs(v) <= 2**53 for v in acc[2])):
                msg = f"{where}: a scaled sum of {name} is not a list of 53-bit integers"
                raise DataError(msg)
            acc[2] = [math.ldexp(float(v), -scale) for v in acc[2]]


def _int64(text: str) -> int:
    """A JSON integer, if it fits the 64 bits every hop after this one (and a result) has."""
    value = int(text)
    if not -(2**63) <= value < 2**63:
        msg = f"the integer {text:.30} does not fit in 64 bits"
        raise ValueError(msg)
    return value


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # "1e999"
        return _no_constant(text)
    return value


def _no_constant(name: str) -> float:
    """``encode_batch`` never writes NaN or Infinity (``allow_nan=False``): refuse them too,
    or the batch could not be sent on from here."""
    msg = f"{name:.30} is not a finite number"
    raise ValueError(msg)


def _inflate(payload: bytes, where: str) -> bytes:
    """The zlib stream ``payload`` decompressed: whole, and at most MAX_PAYLOAD_BYTES."""
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(payload, MAX_PAYLOAD_BYTES)
    except zlib.error as e:
        msg = f"{where}: unreadable payload: {e}"
        raise DataError(msg) from None
    if inflater.unconsumed_tail:  # it stopped at the limit with input left
        msg = f"{where}: unreadable payload: it inflates to over {MAX_PAYLOAD_BYTES} bytes"
        raise DataError(msg)
    if not inflater.eof or inflater.unused_data:
        msg = f"{where}: unreadable payload: the compressed stream is cut short or followed " \
              "by other bytes"
        raise DataError(msg)
    return raw


def _rows(document: Any, aggregate: WindowAggregate, where: str) -> tuple[dict[str, Any], ...]:
    names = [name for name, _ in aggregate.aggregates]
    if (not isinstance(document, dict) or not {"keys", "partials"} <= set(document)
            or not set(document) <= {"keys", "partials", "bounds", "rolled_up"}
            or not isinstance(document["keys"], dict)
            or sorted(document["keys"]) != sorted(aggregate.keys)
            or not isinstance(document["partials"], dict)
            or sorted(document["partials"]) != sorted(names)):
        msg = f"{where}: the payload does not hold the keys {list(aggregate.keys)} and " \
              f"partials {names} of this query"
        raise DataError(msg)
    columns = {**document["keys"], **document["partials"]}
    lengths = {len(c) if isinstance(c, list) else -1 for c in columns.values()}
    if len(lengths) > 1 or -1 in lengths:
        msg = f"{where}: its columns differ in length"
        raise DataError(msg)
    count = lengths.pop() if lengths else 0
    for key in aggregate.keys:
        dtype = aggregate.schema.dtype(key)
        bad = next((v for v in columns[key] if v is not None and not dtype.accepts(v)), None)
        if bad is not None:
            msg = f"{where}: key {key} should be {dtype.value}, got {bad!r:.40}"
            raise DataError(msg)
    rows: list[dict[str, Any]] = [{k: columns[k][i] for k in aggregate.keys}
                                  for i in range(count)]
    if len({tuple(row.values()) for row in rows}) != count:  # merges assume one row per key
        msg = f"{where}: a group key has two rows"
        raise DataError(msg)
    for name, agg in aggregate.aggregates:
        for row, data in zip(rows, columns[name], strict=True):
            try:
                row[name] = agg.decode(data)
            except (ValueError, TypeError) as e:  # TypeError: e.g. an unhashable distinct value
                msg = f"{where}: {e}"
                raise DataError(msg) from None
    return tuple(rows)


def _bounds(bounds: Any, count: int, where: str
            ) -> tuple[tuple[float, ...] | None, float, tuple[bool, ...] | None, float]:
    """A truncated batch's per-row slack, omitted bound, completeness and cut (None, 0.0,
    None, 0.0 when exact; a sender before the cut sends none)."""
    if bounds is None:
        return None, 0.0, None, 0.0

    def bound(x: Any) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < math.inf

    if (not isinstance(bounds, dict) or not {"slack", "omitted", "complete"} <= set(bounds)
            or not set(bounds) <= {"slack", "omitted", "complete", "cut", "ranges"}
            or not bound(bounds.get("cut", 0.0))
            or not isinstance(bounds["slack"], list) or len(bounds["slack"]) != count
            or not all(map(bound, bounds["slack"])) or not bound(bounds["omitted"])
            or not isinstance(bounds["complete"], list) or len(bounds["complete"]) != count
            or not all(isinstance(c, bool) for c in bounds["complete"])):
        msg = (f"{where}: its bounds are not {count} non-negative slacks, an omitted bound, "
               f"{count} completeness flags and a non-negative cut")
        raise DataError(msg)
    return (tuple(float(x) for x in bounds["slack"]), float(bounds["omitted"]),
            tuple(bounds["complete"]), float(bounds.get("cut", 0.0)))


def _ranges(ranges: Any, aggregate: WindowAggregate, where: str) -> Ranges | None:
    """A truncated batch's ranges of its mins, maxes and averages over the rows it left out
    (None: unknown; a sender before ranges sends none)."""
    if ranges is None:
        return None
    ranged = {name for name, _ in ranged_aggregates(aggregate)}
    try:
        if (isinstance(ranges, dict) and set(ranges) <= ranged and all(
                isinstance(r, list) and len(r) == 2
                and not any(isinstance(v, list | dict) or v is None for v in r)
                and r[0] <= r[1] for r in ranges.values())):
            return {name: (lo, hi) for name, (lo, hi) in ranges.items()}
    except TypeError:  # values that do not compare
        pass
    msg = (f"{where}: its ranges are not a smallest and a largest value of some of its "
           f"mins, maxes and averages ({', '.join(sorted(ranged)) or 'it has none'})")
    raise DataError(msg)


def ask_to_proto(window: Window, ask: Ask) -> pb.RoundAsk:
    return pb.RoundAsk(window_start_ms=window[0], window_end_ms=window[1], top=ask.top,
                       by_threshold=ask.threshold is not None,
                       threshold=ask.threshold or 0.0,
                       keys=json.dumps([list(k) for k in ask.keys]) if ask.keys else "")


def ask_from_proto(message: pb.RoundAsk) -> tuple[Window, Ask]:
    """The window and the ask; raises DataError for an ask that does not hold together."""
    try:
        keys = json.loads(message.keys) if message.keys else []
    except ValueError as e:
        raise DataError(f"an ask's keys are not JSON: {e}") from None
    if not isinstance(keys, list) or not all(isinstance(k, list) for k in keys):
        msg = "an ask's keys are not a list of group keys"
        raise DataError(msg)
    if message.top < 0 or (message.by_threshold and not message.threshold >= 0):
        msg = "an ask's top or threshold is negative"
        raise DataError(msg)
    return (message.window_start_ms, message.window_end_ms), Ask(
        top=message.top, threshold=message.threshold if message.by_threshold else None,
        keys=tuple(tuple(k) for k in keys))


