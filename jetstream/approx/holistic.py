"""Exact distinct counts and quantiles stepped down to sketches on a thin link.

The partial of an exact ``count_distinct`` is the set of values, that of a ``quantile`` every
value: they grow with the data. At a sketch level (:mod:`jetstream.approx.levels`) a link sends
a row's set as an HLL sketch and its values as a KLL sketch instead — each only where the
sketch is the lighter (a set of more than ``2**lg_k / 16`` values, more than ``3 * k``
values; below that the values go as they are, and stay exact). The aggregate takes either
form from then on: merging a set into a sketch updates the sketch, extracting a sketch gives
its estimate, and ``error_bound`` says how far it may be off (the HLL's relative error at
three standard deviations, the KLL's normalized rank error), so every result that a sketch
reached says so (``exact`` false, its ``error_bound``).

The sketches are DataSketches' (HLL_4, KLL of doubles); on the wire an accumulator is then a
JSON object, ``{"hll": BASE64}`` or ``{"kll": BASE64, "ints": BOOL}`` (``ints``: the values
were integers, so the quantile is one), checked before DataSketches reads it.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jetstream.aggregates import CountDistinct, Quantile
from jetstream.approx.sketches import check_hll, check_kll_doubles, datasketches, hll_error
from jetstream.approx.truncate import BoundedPartial
from jetstream.operators import WindowAggregate

__all__ = ["MAX_KLL_K", "MAX_LG_K", "QuantileSketch", "SketchSize", "decode",
           "distinct_error", "encode", "holistic", "merge_distinct", "merge_quantile",
           "quantile_error", "quantile_of", "sketched"]

#: The largest sketches a link steps down to (and a receiver accepts).
MAX_LG_K = 12
MAX_KLL_K = 200


@dataclass(frozen=True)
class SketchSize:
    """The size of a sketch level: HLL buckets ``2**lg_k``, KLL's ``k``."""

    lg_k: int
    k: int

    def label(self, kinds: Iterable[type]) -> str:
        """Its name in a ladder: the sketches the query's aggregates step down to."""
        names = {CountDistinct: f"HLL 2^{self.lg_k}", Quantile: f"KLL k={self.k}"}
        return ", ".join(names[kind] for kind in (CountDistinct, Quantile) if kind in kinds)

    def error(self, kinds: Iterable[type]) -> float:
        """The nominal error of its sketches: HLL's relative error at three standard
        deviations, KLL's normalized rank error."""
        errors = {CountDistinct: 3 * 1.04 / (2 ** self.lg_k) ** 0.5,
                  Quantile: datasketches().kll_doubles_sketch.get_normalized_rank_error(
                      self.k, False)}
        return max((errors[kind] for kind in errors if kind in kinds), default=0.0)


@dataclass
class QuantileSketch:
    """A quantile's values as a KLL sketch; ``ints``: they were integers."""

    sketch: Any  # datasketches.kll_doubles_sketch
    ints: bool


def holistic(aggregate: WindowAggregate) -> set[type]:
    """The kinds of exact holistic aggregates ``aggregate`` has (distinct counts, quantiles)."""
    return {type(agg) for _, agg in aggregate.aggregates
            if type(agg) in (CountDistinct, Quantile)}


def sketched(partial: BoundedPartial, aggregate: WindowAggregate,
             size: SketchSize) -> BoundedPartial:
    """``partial`` with each large set of distinct values an HLL sketch and each long list of
    values a KLL sketch of ``size`` (or a sketch already there made no larger)."""
    names = [(name, type(agg)) for name, agg in aggregate.aggregates
             if type(agg) in (CountDistinct, Quantile)]
    if not names:
        return partial
    rows = []
    for row in partial.rows:
        out = dict(row)
        for name, kind in names:
            acc = row[name]
            if kind is CountDistinct:
                out[name] = _distinct_sketch(acc, size.lg_k)
            else:
                out[name] = _quantile_sketch(acc, size.k)
        rows.append(out)
    return dataclasses.replace(partial, rows=tuple(rows))


def _distinct_sketch(acc: Any, lg_k: int) -> Any:
    if isinstance(acc, set):
        if len(acc) <= 2 ** lg_k // 16:
            return acc
        sketch = datasketches().hll_sketch(lg_k)
        for value in acc:
            sketch.update(value)
        return sketch
    return acc if acc.lg_config_k <= lg_k else _union([acc], lg_k)


def _quantile_sketch(acc: Any, k: int) -> Any:
    if isinstance(acc, list):
        if len(acc) <= 3 * k:
            return acc
        sketch = datasketches().kll_doubles_sketch(k)
        for value in acc:
            sketch.update(float(value))
        return QuantileSketch(sketch, all(isinstance(v, int) for v in acc))
    if acc.sketch.k <= k:
        return acc
    smaller = datasketches().kll_doubles_sketch(k)
    smaller.merge(acc.sketch)
    return QuantileSketch(smaller, acc.ints)


def merge_distinct(acc: Any, other: Any) -> Any:
    """A set or HLL sketch merged with another (``other`` unchanged): a set if both are, else
    a sketch (of the smaller size)."""
    if isinstance(acc, set) and isinstance(other, set):
        acc |= other
        return acc
    if isinstance(acc, set):
        acc, other = _union([other], other.lg_config_k), acc
    if isinstance(other, set):
        for value in other:
            acc.update(value)
        return acc
    return _union([acc, other], min(acc.lg_config_k, other.lg_config_k))


def _union(sketches: list[Any], lg_k: int) -> Any:
    """The union of HLL sketches at ``lg_k`` (no larger than any of theirs). Each is brought
    to ``lg_k`` on its own first: DataSketches' union, given a larger sketch in coupon mode
    and then a smaller one, returned the smaller one's estimate (found by
    ``tests/test_holistic.py``)."""
    union = datasketches().hll_union(lg_k)
    for sketch in sketches:
        if len(sketches) > 1 and sketch.lg_config_k != lg_k:
            sketch = _union([sketch], lg_k)
        union.update(sketch)
    return union.get_result()


def merge_quantile(acc: Any, other: Any) -> Any:
    """A list of values or a KLL sketch merged with another: a list if both are, else a
    sketch (a list's values added to it)."""
    if isinstance(acc, list) and isinstance(other, list):
        acc.extend(other)
        return acc
    if isinstance(acc, list):
        acc, other = QuantileSketch(_copy_kll(other.sketch), other.ints), acc
    if isinstance(other, list):
        for value in other:
            acc.sketch.update(float(value))
        return QuantileSketch(acc.sketch, acc.ints and all(isinstance(v, int) for v in other))
    acc.sketch.merge(other.sketch)
    return QuantileSketch(acc.sketch, acc.ints and other.ints)


def _copy_kll(sketch: Any) -> Any:
    """A copy (``merge`` may mutate its first accumulator, never its second)."""
    return type(sketch).deserialize(sketch.serialize())


def distinct_error(acc: Any) -> float:
    return 0.0 if isinstance(acc, set) else hll_error(acc)


def quantile_error(acc: Any) -> float:
    if isinstance(acc, list) or not acc.sketch.is_estimation_mode():
        return 0.0
    return float(acc.sketch.normalized_rank_error(False))


def quantile_of(acc: QuantileSketch, q: float) -> int | float | None:
    if acc.sketch.is_empty():
        return None
    value = acc.sketch.get_quantile(q, True)  # inclusive: as Quantile defines it
    return int(value) if acc.ints else float(value)


def encode(acc: Any) -> dict[str, Any]:
    """A sketch accumulator as a JSON object."""
    if isinstance(acc, QuantileSketch):
        return {"kll": base64.b64encode(acc.sketch.serialize()).decode("ascii"),
                "ints": acc.ints}
    return {"hll": base64.b64encode(acc.serialize_compact()).decode("ascii")}


def decode(name: str, data: dict[str, Any]) -> Any:
    """``encode``'s output back, checked first (DataSketches' readers trust their bytes);
    ValueError naming the aggregate if it is not a sketch this side accepts."""
    kind = "hll" if set(data) == {"hll"} else "kll" if set(data) == {"kll", "ints"} else None
    if kind is None or not isinstance(data[kind], str) or (
            kind == "kll" and not isinstance(data["ints"], bool)):
        msg = f"{name}: not a list of values or a sketch: {data!r:.80}"
        raise ValueError(msg)
    try:
        raw = base64.b64decode(data[kind], validate=True)
        if kind == "hll":
            check_hll(raw, MAX_LG_K)
            return datasketches().hll_sketch.deserialize(raw)
        check_kll_doubles(raw, MAX_KLL_K)
        return QuantileSketch(datasketches().kll_doubles_sketch.deserialize(raw), data["ints"])
    except (TypeError, ValueError, RuntimeError, IndexError, MemoryError) as e:
        msg = f"{name}: not a serialized {kind.upper()} sketch: {e}"
        raise ValueError(msg) from None
