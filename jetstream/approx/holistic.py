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

The sketches are DataSketches' (HLL_4, KLL of doubles); the accumulators, their merges and
their form on the wire are in :mod:`jetstream.approx.summaries`, which the aggregates use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jetstream.aggregates import CountDistinct, Quantile
from jetstream.approx.summaries import QuantileSketch, datasketches, hll_union
from jetstream.approx.truncate import BoundedPartial
from jetstream.operators import WindowAggregate

__all__ = ["SketchSize", "holistic", "sketched"]

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
    return acc if acc.lg_config_k <= lg_k else hll_union([acc], lg_k)


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


