"""The per-link key dictionary: on a push stream, each group-key value crosses once, then
travels as a small slot number.

Each push stream (one gRPC call, ordered and reliable) has a :class:`KeyEncoder` at the
sending end and a :class:`KeyDecoder` at the receiving end, with one table per (query, key
column). A batch's payload names the slots it defines (slot := value) before its rows use
them, and both ends apply the definitions in stream order, so the receiver's table is the
sender's after every batch. A full table reuses its least recently used slot for a new value
by defining it again; a slot the batch itself uses is never reused within that batch, so no
row can be decoded to another key. The tables live as long as the stream: a reconnect or a
restart on either side starts empty tables on both (the sender re-encodes everything it
sends again), which is the resynchronisation. Rows go sorted by slot and the first column's
slots as differences, which compress to almost nothing; a row's order carries no meaning.

Memory is bounded by :data:`CAPACITY` slots per table at both ends; a batch with more
distinct values in a column than that goes with plain keys. A receiver refuses (DataError) a
slot out of range, a slot used before it is defined, or a value that is not a plain scalar.
"""

from __future__ import annotations

import collections
import json
import zlib
from typing import Any

from jetstream.errors import DataError
from jetstream.v1 import dataplane_pb2 as pb

__all__ = ["CAPACITY", "KeyDecoder", "KeyEncoder"]

#: Slots per (query, key column) table of a stream, at either end.
CAPACITY = 1 << 16
#: The payload member that holds a coded batch's definitions: {column: [[slot, value], ...]}.
SLOTS = "slots"

Scalar = str | int | float | bool | None


class _Table:
    """One sender's slots for one key column: value -> slot, least recently used first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # Keyed by the value's JSON text: 1, 1.0 and True are different keys on the wire.
        self.slots: collections.OrderedDict[str, int] = collections.OrderedDict()

    def code(self, values: list[Any], texts: list[str]) -> tuple[list[int], list[list[Any]]]:
        """Each value's slot (``texts``: the values' JSON), and the definitions the receiver
        needs first. The caller sends a batch with more distinct values than slots plain:
        then the least recently used slot is never one this batch uses, so reusing it
        changes no earlier row."""
        out, defined = [], []
        for value, text in zip(values, texts, strict=True):
            slot = self.slots.get(text)
            if slot is None:
                slot = self._free()
                self.slots[text] = slot
                defined.append([slot, value])
            else:
                self.slots.move_to_end(text)
            out.append(slot)
        return out, defined

    def _free(self) -> int:
        if len(self.slots) < self.capacity:
            return len(self.slots)
        return self.slots.popitem(last=False)[1]  # the least recently used


class KeyEncoder:
    """The sending end of one push stream's dictionaries."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._tables: dict[tuple[str, str], _Table] = {}

    def encode(self, message: pb.PartialBatch) -> pb.PartialBatch:
        """``message`` with its key columns as slots (a new message), or ``message`` itself
        when there is nothing to code (a sketch, no rows, more values than slots)."""
        document = _rows_document(message)
        if document is None:
            return message
        columns: dict[str, list[Any]] = document["keys"]
        count = len(next(iter(columns.values())))
        texts = {name: [json.dumps(v) for v in values] for name, values in columns.items()}
        if not count or any(len(set(t)) > self.capacity for t in texts.values()):
            return message
        slots, definitions = {}, {}
        for name, values in columns.items():
            table = self._tables.setdefault((message.query, name), _Table(self.capacity))
            slots[name], definitions[name] = table.code(values, texts[name])
        order = sorted(range(count), key=lambda i: tuple(s[i] for s in slots.values()))
        coded: dict[str, list[int]] = {n: [s[i] for i in order] for n, s in slots.items()}
        first = next(iter(coded))
        coded[first] = _differences(coded[first])
        document["keys"] = coded
        document["partials"] = {n: [c[i] for i in order]
                                for n, c in document["partials"].items()}
        if "bounds" in document:
            bounds = document["bounds"]
            for member in ("slack", "complete"):
                bounds[member] = [bounds[member][i] for i in order]
        document[SLOTS] = {n: d for n, d in definitions.items() if d}
        payload = json.dumps(document, separators=(",", ":"), allow_nan=False).encode()
        packed = zlib.compress(payload, 6) if message.compressed else payload
        coded_message = pb.PartialBatch()
        coded_message.CopyFrom(message)
        coded_message.payload = packed
        return coded_message


class KeyDecoder:
    """The receiving end of one push stream's dictionaries."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._tables: dict[tuple[str, str], dict[int, Scalar]] = {}

    def decode(self, query: str, document: Any) -> Any:
        """``document`` (a parsed payload) with its keys' values back in place of slots; as
        it is if it is not coded. Raises DataError for a slot that is out of range or not
        defined, or a definition that is not [slot, scalar]."""
        if not isinstance(document, dict) or SLOTS not in document:
            return document
        definitions, columns = document.pop(SLOTS), document.get("keys")
        if (not isinstance(definitions, dict) or not isinstance(columns, dict)
                or not set(definitions) <= set(columns)):
            msg = "its key slots are not defined per key column"
            raise DataError(msg)
        for name, defined in definitions.items():
            table = self._table(query, name)
            if not isinstance(defined, list):
                msg = f"the slot definitions of key {name} are not a list"
                raise DataError(msg)
            for pair in defined:
                if (not isinstance(pair, list) or len(pair) != 2 or not self._slot(pair[0])
                        or not isinstance(pair[1], Scalar)):
                    msg = f"key {name}: {pair!r:.60} does not define a slot"
                    raise DataError(msg)
                table[pair[0]] = pair[1]
        values = {}
        for i, (name, slots) in enumerate(columns.items()):
            if not isinstance(slots, list) or not all(map(self._slot, slots)):
                msg = f"key {name}: its slots are not small non-negative integers"
                raise DataError(msg)
            if i == 0:
                slots = _sums(slots)
            table = self._table(query, name)
            missing = next((s for s in slots if s not in table), None)
            if missing is not None:
                msg = f"key {name}: slot {missing} is used before it is defined"
                raise DataError(msg)
            values[name] = [table[s] for s in slots]
        document["keys"] = values
        return document

    def _table(self, query: str, name: str) -> dict[int, Scalar]:
        return self._tables.setdefault((query, name), {})

    def _slot(self, x: Any) -> bool:  # a slot, or a step between sorted slots
        return type(x) is int and 0 <= x < self.capacity


def _rows_document(message: pb.PartialBatch) -> dict[str, Any] | None:
    """The payload of a batch of plain rows, parsed; None for anything else (a sketch, a
    payload already coded, or one this end cannot read: the receiver judges it)."""
    if message.kind != pb.SUMMARY_KIND_ROWS:
        return None
    try:
        raw = zlib.decompress(message.payload) if message.compressed else message.payload
        document = json.loads(raw)
    except (ValueError, zlib.error):
        return None
    if not isinstance(document, dict) or SLOTS in document:
        return None
    keys, partials = document.get("keys"), document.get("partials")
    columns = [*keys.values(), *partials.values()] if (
        isinstance(keys, dict) and keys and isinstance(partials, dict)) else []
    if not columns or not all(isinstance(c, list) for c in columns) or len(
            {len(c) for c in columns}) != 1:
        return None
    bounds = document.get("bounds")
    if bounds is not None and not (isinstance(bounds, dict) and all(
            isinstance(bounds.get(m), list) and len(bounds[m]) == len(columns[0])
            for m in ("slack", "complete"))):
        return None
    return document


def _differences(sorted_slots: list[int]) -> list[int]:
    return [b - a for a, b in zip([0, *sorted_slots], sorted_slots, strict=False)]


def _sums(steps: list[int]) -> list[int]:
    out, total = [], 0
    for step in steps:
        total += step
        out.append(total)
    return out
