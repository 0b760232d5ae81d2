"""Frequent-items sketches as the coarsest degradation levels of a top-k.

A window's partial rows (exact, or already truncated, see :mod:`jetstream.approx.truncate`)
become a DataSketches frequent-items sketch of at most ``2**lg_max_k`` items: each key,
weighted by the lower bound of its ranking value (a count, or a sum of non-negative
integers). The sketch keeps no other aggregate, which is why it is smaller than truncated
rows, and states its own error.

Why the bounds stay sound. Say a key's true ranking value ``T`` lies in ``[lb, lb + slack]``
where it has a row, and in ``[0, omitted]`` where not. The sketch, fed the weights ``lb``,
answers for every key ``sketch_lb <= lb <= sketch_ub``. So ``sketch_lb <= T <= sketch_ub +
extra`` with ``extra = max(largest slack, omitted)`` -- 0 for exact rows. Sketches merge,
and so do their extras (they add up), but a merge here goes through
:func:`~jetstream.approx.truncate.merge_bounded`: a sketch read back is a bounded partial
whose rows have ``slack = sketch_ub - sketch_lb + extra`` and are incomplete (their other
aggregates were dropped), and whose ``omitted`` is the sketch's offset plus ``extra``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jetstream.aggregates import Aggregate, Count, Sum, check_int
from jetstream.approx.sketches import MAX_LG_MAX_K
from jetstream.approx.summaries import check_frequent_strings, datasketches
from jetstream.approx.truncate import BoundedPartial, bounds
from jetstream.errors import DataError
from jetstream.operators import WindowAggregate

if TYPE_CHECKING:
    import datasketches as ds

__all__ = ["ItemsSketch", "from_items", "to_items"]

#: Smallest sketch offered: at lg_max_k 3 merged DataSketches frequent-items sketches were
#: seen to report an upper bound below the true count (see ``sketches.TopKItems``).
MIN_LG_MAX_K = 4


@dataclass(frozen=True)
class ItemsSketch:
    """A window's keys in a frequent-items sketch, ranked by the aggregate ``rank``.

    ``extra``: how far above the sketch's upper bound a key's true value may still be.
    """

    sketch: ds.frequent_strings_sketch
    rank: str
    extra: float

    def serialize(self) -> bytes:
        return bytes(self.sketch.serialize())


def to_items(partial: BoundedPartial, aggregate: WindowAggregate, rank: str,
             lg_max_k: int) -> ItemsSketch:
    """The partial's keys in a sketch of at most ``2**lg_max_k`` items (nothing is mutated).

    Raises
    ------
    PlanError
        If ``rank`` is not a count or a sum, or ``lg_max_k`` is out of range.
    DataError
        If a ranking value is not a non-negative integer (a sketch counts integers).
    """
    check_int(lg_max_k, MIN_LG_MAX_K, MAX_LG_MAX_K, "frequent items: lg_max_k")
    ranked = bounds(partial, aggregate, rank)
    sketch = datasketches().frequent_strings_sketch(lg_max_k)
    # Lightest first: a purge takes from every counter held, so the heavy keys, which the
    # top-k needs, keep their counts whole if they come last.
    order = sorted(range(len(partial.rows)), key=lambda i: ranked.lb[i])
    for row, lb in ((partial.rows[i], ranked.lb[i]) for i in order):
        if not isinstance(lb, int):
            msg = (f"frequent items: {rank} of key {_key(row, aggregate.keys)!r} is {lb!r}; "
                   "a frequent-items sketch counts integers, so rank by a count or a sum "
                   "of integers")
            raise DataError(msg)
        if lb:
            sketch.update(_item(row, aggregate.keys), lb)
    return ItemsSketch(sketch, rank, max([partial.omitted, *partial.slack]))


def from_items(data: bytes, extra: float, aggregate: WindowAggregate,
               rank: str) -> BoundedPartial:
    """The sketch in ``data`` read back as a bounded partial (see the module docstring).

    Raises
    ------
    DataError
        If ``data`` is not a frequent-items sketch of this aggregate's keys, or ``extra`` is
        negative, or ``rank`` names no count or sum of ``aggregate``.
    """
    where = "frequent items"
    found = dict(aggregate.aggregates).get(rank)
    if type(found) not in (Count, Sum):
        msg = f"{where}: ranked by {rank!r}, which is not a count or a sum of this query"
        raise DataError(msg)
    assert found is not None
    if not 0 <= extra < math.inf:
        msg = f"{where}: extra error {extra!r} is not a finite non-negative number"
        raise DataError(msg)
    try:
        check_frequent_strings(data, MAX_LG_MAX_K)  # before C++ trusts what the bytes say
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    try:
        sketch = datasketches().frequent_strings_sketch.deserialize(data)
        items = sketch.get_frequent_items(
            datasketches().frequent_items_error_type.NO_FALSE_NEGATIVES, 0)
    except (RuntimeError, ValueError, TypeError, IndexError, MemoryError) as e:
        msg = f"{where}: not a frequent-items sketch: {e}"
        raise DataError(msg) from None
    # A tracked item's upper bound is its counter plus the sketch's offset; an untracked
    # one's is the offset alone.
    offset = items[0][3] - items[0][2] if items else 0
    rows, slack, seen = [], [], set()
    for item, _, lb, ub in items:
        row = _row(item, aggregate, where)
        key = _key(row, aggregate.keys)
        if key in seen:  # e.g. '["a"]' and '[ "a"]': merges assume one row per key
            msg = f"{where}: key {key!r:.60} is in the sketch twice"
            raise DataError(msg)
        seen.add(key)
        for name, agg in aggregate.aggregates:
            row[name] = _accumulator(agg, lb) if name == rank else agg.create()
        rows.append(row)
        slack.append(float(ub - lb) + extra)
    return BoundedPartial(tuple(rows), tuple(slack), float(offset) + extra,
                          (False,) * len(rows), True)


def _accumulator(agg: Aggregate, value: int) -> Any:
    """An accumulator of a count or a sum that extracts ``value``."""
    return value if isinstance(agg, Count) else agg.add(agg.create(), value)


def _key(row: dict[str, Any], keys: Sequence[str]) -> tuple[Any, ...]:
    return tuple(row[k] for k in keys)


def _item(row: dict[str, Any], keys: Sequence[str]) -> str:
    return json.dumps([row[k] for k in keys], separators=(",", ":"), allow_nan=False)


def _row(item: str, aggregate: WindowAggregate, where: str) -> dict[str, Any]:
    try:
        values = json.loads(item)
    except ValueError:
        values = None
    if not isinstance(values, list) or len(values) != len(aggregate.keys):
        msg = f"{where}: item {item!r:.60} is not a key of {list(aggregate.keys)}"
        raise DataError(msg)
    for key, value in zip(aggregate.keys, values, strict=True):
        dtype = aggregate.schema.dtype(key)
        if value is not None and not dtype.accepts(value):
            msg = f"{where}: key {key} should be {dtype.value}, got {value!r:.40}"
            raise DataError(msg)
    return dict(zip(aggregate.keys, values, strict=True))
