"""Which degradation levels a query has, and what each level keeps.

A query that ends in a top-k ranked by a count or a sum can degrade, link by link, from exact
partials to truncated ones: each window keeps only the ``factor * k`` keys with the largest
ranking value and states a bound on the rest (:mod:`jetstream.approx.truncate`). Below those,
when the ranking value is an integer, come frequent-items sketches of shrinking size
(:mod:`jetstream.approx.items`): they keep only the ranking value, with a looser bound, and
weigh less per key. The root then reports each row with its lower and upper bound and
whether it is certainly in the top-k. A query without such a top-k has only the exact level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jetstream.aggregates import Avg, Count, Sum
from jetstream.approx.items import MIN_LG_MAX_K, ItemsSketch, to_items
from jetstream.approx.policy import DegradationLevel, degradation_ladder
from jetstream.approx.sketches import datasketches
from jetstream.approx.truncate import BoundedPartial, truncate
from jetstream.dsl import Query
from jetstream.operators import Phase, TopK, WindowAggregate
from jetstream.schema import DataType

__all__ = [
    "TRUNCATION_FACTORS",
    "Encoding",
    "Ranking",
    "degrade",
    "encoding",
    "levels_for",
    "ranking",
]

#: The truncated levels keep this many times k keys per window, from finer to coarser.
TRUNCATION_FACTORS = (32, 8, 2)
#: What the exact level is taken to weigh in the ladder's units (kept keys): the policy
#: learns the real bytes per unit from the windows it sees.
EXACT_ROWS_GUESS = 128
#: Nominal error bounds of the truncated levels, finer to coarser, for the policy's choice
#: under an SLO's max_error. Every result reports the bound it actually has.
NOMINAL_ERRORS = (0.001, 0.003, 0.01)
#: Sketch levels: how many, and what one sketched key weighs against a truncated row (a row
#: carries every aggregate, a sketched key only its count). Their nominal error is the
#: sketch's a-priori one, a fraction of the window's total.
SKETCH_LEVELS = 2
SKETCH_ITEM_WEIGHT = 0.5


@dataclass(frozen=True)
class Ranking:
    """The query's final top-k: ``k`` keys by the aggregate named ``by``."""

    k: int
    by: str
    integral: bool = True  # the ranking value is an integer, so sketches can count it


@dataclass(frozen=True)
class Encoding:
    """How a window goes over the wire at one level: every row (``keep`` and ``lg_max_k``
    None), the top ``keep`` rows, or a frequent-items sketch of ``2**lg_max_k`` items."""

    keep: int | None = None
    lg_max_k: int | None = None


def ranking(query: Query) -> Ranking | None:
    """The top-k a degraded level can bound, or None: a top-k straight after the final
    aggregate, ranked by a count or a sum (not an average: dropping keys does not bound it)."""
    plan = query.plan()
    for node in plan.topological():
        op = plan.op(node)
        inputs = plan.inputs(node)
        if not isinstance(op, TopK) or op.per_input or len(inputs) != 1:
            continue
        below = plan.op(inputs[0])
        if isinstance(below, WindowAggregate) and below.phase is Phase.FINAL:
            agg = dict(below.aggregates).get(op.by)
            if isinstance(agg, Count | Sum) and not isinstance(agg, Avg):
                integral = below.schema.dtype(op.by) is DataType.INT
                return Ranking(op.k, op.by, integral)
    return None


def levels_for(rank: Ranking | None) -> tuple[DegradationLevel, ...]:
    """Exact first, then truncation to ``factor * k`` keys for each factor, then (integer
    rankings only) frequent-items sketches, coarser down."""
    if rank is None:
        return degradation_ladder([("exact", 1.0, 0.0)])
    exact = max(EXACT_ROWS_GUESS * rank.k, TRUNCATION_FACTORS[0] * rank.k * 2)
    epsilon = datasketches().frequent_strings_sketch.get_epsilon_for_lg_size
    sketches = [(f"sketch of {_capacity(lg)}", SKETCH_ITEM_WEIGHT * _capacity(lg),
                 max(NOMINAL_ERRORS[-1], epsilon(lg)))
                for lg in _sketch_sizes(rank)]
    return degradation_ladder([("exact", float(exact), 0.0)] + [
        (f"top {factor * rank.k}", float(factor * rank.k), error)
        for factor, error in zip(TRUNCATION_FACTORS, NOMINAL_ERRORS, strict=True)] + sketches)


def encoding(level: DegradationLevel, rank: Ranking | None) -> Encoding:
    """What a window keeps at ``level`` of :func:`levels_for`."""
    if level.index == 0 or rank is None:
        return Encoding()
    if level.index <= len(TRUNCATION_FACTORS):
        return Encoding(keep=TRUNCATION_FACTORS[level.index - 1] * rank.k)
    return Encoding(lg_max_k=_sketch_sizes(rank)[level.index - len(TRUNCATION_FACTORS) - 1])


def degrade(partial: BoundedPartial, aggregate: WindowAggregate, rank: Ranking | None,
            level: DegradationLevel) -> BoundedPartial | ItemsSketch:
    """A window's partial as ``level`` ships it: unchanged, truncated, or sketched."""
    how = encoding(level, rank)
    if rank is None or (how.keep is None and how.lg_max_k is None):
        return partial
    if how.lg_max_k is not None:
        return to_items(partial, aggregate, rank.by, how.lg_max_k)
    assert how.keep is not None
    return truncate(partial, aggregate, rank.by, how.keep)


def _sketch_sizes(rank: Ranking) -> list[int]:
    """Sketch sizes, halving from one that holds the coarsest truncation's keys, that weigh
    less than that truncation (none for small k, nor for a ranking that is not an integer)."""
    if not rank.integral:
        return []
    rows = TRUNCATION_FACTORS[-1] * rank.k
    largest = math.ceil(math.log2(rows / 0.75))
    fits = [lg for lg in range(largest, MIN_LG_MAX_K - 1, -1)
            if SKETCH_ITEM_WEIGHT * _capacity(lg) < rows]
    return fits[:SKETCH_LEVELS]


def _capacity(lg_max_k: int) -> int:
    """How many items a sketch of this size holds (DataSketches: 3/4 of its map)."""
    return 3 * 2**lg_max_k // 4
