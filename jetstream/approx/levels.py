"""Which degradation levels a query has, and what each level keeps.

A query that ends in a top-k ranked by a count or a sum can degrade, link by link, from exact
partials to truncated ones: each window keeps only the ``factor * k`` keys with the largest
ranking value and states a bound on the rest (:mod:`jetstream.approx.truncate`). Below those,
when the ranking value is an integer, come frequent-items sketches of shrinking size
(:mod:`jetstream.approx.items`): they keep only the ranking value, with a looser bound, and
weigh less per key. The root then reports each row with its lower and upper bound and
whether it is certainly in the top-k.

A query without a top-k whose result is its aggregate's rows, one per key, degrades by the
same truncation, by the first of its counts or sums (:func:`heaviest`): a window keeps its
heaviest keys, and the result bounds each row's value and the share of the window's total the
keys left out may hold (``BoundedPartial.cut``).

A query with exact distinct counts or quantiles steps down first to HLL and KLL sketches of
them (:mod:`jetstream.approx.holistic`): two sizes without a top-k or a truncation, the finer
one (and its truncations) with one.

A query whose group_by declares a roll-up (:mod:`jetstream.approx.rollup`) steps down first to
its rows rolled up to the coarser keys, exact there (its nominal error 0: the user chose that
granularity); every level below rolls up too. A query with none of these has only the exact
level.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from jetstream.aggregates import Avg, Count, Sum
from jetstream.approx.holistic import SketchSize, holistic, sketched
from jetstream.approx.items import MIN_LG_MAX_K, ItemsSketch, to_items
from jetstream.approx.rollup import roll_up
from jetstream.approx.truncate import BoundedPartial, truncate
from jetstream.dsl import Query
from jetstream.errors import PlanError
from jetstream.operators import Phase, TopK, WindowAggregate
from jetstream.schema import DataType

__all__ = [
    "HOLISTIC_SIZES",
    "TRUNCATION_FACTORS",
    "DegradationLevel",
    "Encoding",
    "Ladder",
    "Ranking",
    "checked_levels",
    "degradation_ladder",
    "heaviest",
    "ladder",
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
#: Without a top-k: the truncated levels keep this many keys a window (the heaviest), and
#: their nominal errors (a share of the window's total, for the policy's choice under an
#: SLO's max_error: a guess, as every result reports the bound it actually has); the exact
#: level is taken to weigh ``CUT_EXACT_ROWS`` rows.
CUT_KEEPS = (1024, 256, 64)
CUT_ERRORS = (0.02, 0.1, 0.3)
CUT_EXACT_ROWS = 4 * CUT_KEEPS[0]
#: Sketch levels: how many, and what one sketched key weighs against a truncated row (a row
#: carries every aggregate, a sketched key only its count). Their nominal error is the
#: sketch's a-priori one, a fraction of the window's total.
SKETCH_LEVELS = 2
SKETCH_ITEM_WEIGHT = 0.5
#: What a rolled-up window is taken to weigh against its exact partial (a guess, as the
#: others: a link's profile measures it).
ROLLUP_WEIGHT = 1 / 8


@dataclass(frozen=True)
class DegradationLevel:
    """One way to encode a stream's windows: ``index`` 0 is exact, higher is coarser.

    ``bytes_per_window`` is what a window is expected to weigh at this level, absolute or
    relative to the other levels (the policy learns the scale from the windows it sees);
    ``error_bound`` is the relative error a result may carry at this level (0.0 when exact).
    """

    index: int
    name: str
    bytes_per_window: float
    error_bound: float


def degradation_ladder(
        levels: Iterable[tuple[str, float, float]]) -> tuple[DegradationLevel, ...]:
    """Levels from ``(name, bytes_per_window, error_bound)`` triples, most accurate first."""
    return tuple(DegradationLevel(i, name, float(size), float(error))
                 for i, (name, size, error) in enumerate(levels))


@dataclass(frozen=True)
class Ranking:
    """The query's final top-k: ``k`` keys by the aggregate named ``by`` (``k`` 0: the
    aggregate a query without a top-k keeps its heaviest keys by, :func:`heaviest`)."""

    k: int
    by: str
    integral: bool = True  # the ranking value is an integer, so sketches can count it


@dataclass(frozen=True)
class Encoding:
    """How a window goes over the wire at one level: every row (``keep`` and ``lg_max_k``
    None), the top ``keep`` rows, or a frequent-items sketch of ``2**lg_max_k`` items; with
    ``sketch``, the rows' exact distinct counts and quantiles as sketches of that size; with
    ``rollup``, its rows rolled up to the coarser keys first."""

    keep: int | None = None
    lg_max_k: int | None = None
    sketch: SketchSize | None = None
    rollup: bool = False


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


def heaviest(query: Query) -> Ranking | None:
    """For a query (split as the sites run it) without a top-k whose result is its final
    aggregate's rows as they are, the aggregate a degraded level keeps the heaviest keys by:
    its first count, else its first sum (of values that must then be non-negative: a window
    with a negative one goes exact). None: it has a top-k, neither, or a step after."""
    if ranking(query) is not None:
        return None
    plan = query.plan()
    last = plan.op(list(plan.topological())[-1])
    if not isinstance(last, WindowAggregate) or last.phase is not Phase.FINAL:
        return None
    for kind in (Count, Sum):
        for name, agg in last.aggregates:
            if type(agg) is kind:
                return Ranking(0, name, last.schema.dtype(name) is DataType.INT)
    return None


#: The sketch levels of exact distinct counts and quantiles (:mod:`jetstream.approx.holistic`),
#: finer to coarser, and what a window is taken to weigh at each against its exact partial
#: (the policy learns the real bytes from the windows it sees). A query with a top-k steps
#: down to the first, then truncates the sketched rows.
HOLISTIC_SIZES = (SketchSize(lg_k=12, k=200), SketchSize(lg_k=10, k=64))
HOLISTIC_WEIGHTS = (0.25, 0.1)


@dataclass(frozen=True)
class Ladder:
    """A query's degradation levels, most accurate first, and what a window keeps at each
    (see :func:`ladder`)."""

    rank: Ranking | None
    levels: tuple[DegradationLevel, ...]
    encodings: tuple[Encoding, ...]
    heaviest: Ranking | None = None  # without a top-k: what truncations keep keys by

    def encoding(self, level: DegradationLevel) -> Encoding:
        return self.encodings[level.index]

    def degrade(self, partial: BoundedPartial, aggregate: WindowAggregate,
                level: DegradationLevel) -> BoundedPartial | ItemsSketch:
        """A window's partial as ``level`` ships it: unchanged, its holistic aggregates
        sketched, truncated, or a frequent-items sketch of its keys."""
        how = self.encodings[level.index]
        if how.rollup:
            partial = roll_up(partial, aggregate)
        if how.lg_max_k is not None:
            assert self.rank is not None, "only a top-k has frequent-items levels"
            return to_items(partial, aggregate, self.rank.by, how.lg_max_k)
        if how.keep is not None:
            by = self.rank or self.heaviest
            assert by is not None, "only a top-k or a heaviest measure has truncated levels"
            partial = truncate(partial, aggregate, by.by, how.keep)
        if how.sketch is not None:
            partial = sketched(partial, aggregate, how.sketch)
        return partial


def ladder(rank: Ranking | None, aggregate: WindowAggregate | None = None,
           heaviest: Ranking | None = None) -> Ladder:
    """The levels of a query whose final top-k is ``rank`` (None: it has none) and whose
    partial aggregate is ``aggregate``: exact first; HLL and KLL sketches of its exact
    distinct counts and quantiles, if it has any; for a top-k, truncation to ``factor * k``
    keys for each factor (of sketched rows, if any), then, for an integer ranking, frequent-
    items sketches of shrinking size; without a top-k, with ``heaviest`` (see
    :func:`heaviest`), truncation to each of ``CUT_KEEPS`` keys by it. Where ``aggregate``
    declares a roll-up, the rolled-up rows come second, and every later level rolls up."""
    kinds = holistic(aggregate) if aggregate is not None else set()
    cuts = heaviest if rank is None else None
    exact = (float(max(EXACT_ROWS_GUESS * rank.k, TRUNCATION_FACTORS[0] * rank.k * 2))
             if rank is not None else float(CUT_EXACT_ROWS) if cuts is not None else 1.0)
    steps: list[tuple[str, float, float, Encoding]] = [("exact", exact, 0.0, Encoding())]
    sketch, row_weight, floor = None, 1.0, 0.0
    if kinds:
        truncated = rank is not None or cuts is not None  # then the finer sketch only
        sizes = zip(HOLISTIC_SIZES[:1] if truncated else HOLISTIC_SIZES, HOLISTIC_WEIGHTS,
                    strict=False)
        steps += [(size.label(kinds), exact * weight, size.error(kinds), Encoding(sketch=size))
                  for size, weight in sizes]
        sketch, row_weight = HOLISTIC_SIZES[0], HOLISTIC_WEIGHTS[0]
        floor = sketch.error(kinds)
    if rank is not None:
        also = f", {sketch.label(kinds)}" if sketch is not None else ""
        steps += [(f"top {factor * rank.k}{also}", factor * rank.k * row_weight,
                   max(error, floor), Encoding(keep=factor * rank.k, sketch=sketch))
                  for factor, error in zip(TRUNCATION_FACTORS, NOMINAL_ERRORS, strict=True)]
        steps += [(f"sketch of {_capacity(lg)}", SKETCH_ITEM_WEIGHT * _capacity(lg),
                   max(NOMINAL_ERRORS[-1], floor, _epsilon(lg)), Encoding(lg_max_k=lg))
                  for lg in _sketch_sizes(rank, row_weight)]
    if cuts is not None:
        also = f", {sketch.label(kinds)}" if sketch is not None else ""
        steps += [(f"heaviest {n}{also}", n * row_weight, max(error, floor),
                   Encoding(keep=n, sketch=sketch))
                  for n, error in zip(CUT_KEEPS, CUT_ERRORS, strict=True)]
    if aggregate is not None and aggregate.rollup:
        rolled = exact * ROLLUP_WEIGHT
        steps = [steps[0], ("rolled up", rolled, 0.0, Encoding(rollup=True)),
                 *((f"rolled up, {name}", min(size, rolled), error, replace(how, rollup=True))
                   for name, size, error, how in steps[1:])]
    return Ladder(rank, degradation_ladder((name, size, error) for name, size, error, _ in steps),
                  tuple(how for *_, how in steps), cuts)


def _sketch_sizes(rank: Ranking, row_weight: float = 1.0) -> list[int]:
    """Sketch sizes, halving from one that holds the coarsest truncation's keys, that weigh
    less than that truncation (none for small k, nor for a ranking that is not an integer);
    ``row_weight``: what a truncated row weighs against an exact one."""
    if not rank.integral:
        return []
    rows = TRUNCATION_FACTORS[-1] * rank.k * row_weight
    largest = math.ceil(math.log2(rows / 0.75))
    fits = [lg for lg in range(largest, MIN_LG_MAX_K - 1, -1)
            if SKETCH_ITEM_WEIGHT * _capacity(lg) < rows]
    return fits[:SKETCH_LEVELS]


def _capacity(lg_max_k: int) -> int:
    """How many items a sketch of this size holds (DataSketches: 3/4 of its map)."""
    return 3 * 2**lg_max_k // 4


def _epsilon(lg_max_k: int) -> float:
    """A sketch of this size's error, as a share of the stream's weight: DataSketches'
    ``frequent_strings_sketch.get_epsilon_for_lg_size`` (3.5 / its map's size), here so
    that building a ladder, which every sender does, does not load the library and numpy
    with it (about 13 MB a process) where no sketch is ever made (tested equal)."""
    return 3.5 / 2**lg_max_k


def checked_levels(levels: Sequence[DegradationLevel]) -> tuple[DegradationLevel, ...]:
    """``levels`` as a tuple, if they make a ladder: indexed from 0, most accurate first.

    Raises
    ------
    PlanError
        If they are empty, out of order, or a figure is out of range.
    """
    levels = tuple(levels)
    if not levels:
        msg = "link policy: needs at least one level, e.g. DegradationLevel(0, 'exact', 1.0, 0.0)"
        raise PlanError(msg)
    for position, lv in enumerate(levels):
        if not isinstance(lv, DegradationLevel):
            msg = f"link policy: level {position} must be a DegradationLevel, not {lv!r}"
            raise PlanError(msg)
        if lv.index != position:
            msg = (f"link policy: level {lv.name!r} has index {lv.index} but is at position "
                   f"{position}; list levels most accurate first, indexed from 0")
            raise PlanError(msg)
        if not (_is_number(lv.bytes_per_window) and 0 < lv.bytes_per_window < math.inf):
            msg = (f"link policy: level {lv.name!r} needs a positive bytes_per_window, "
                   f"not {lv.bytes_per_window!r}")
            raise PlanError(msg)
        if not (_is_number(lv.error_bound) and 0 <= lv.error_bound < math.inf):
            msg = (f"link policy: level {lv.name!r} needs an error_bound >= 0, "
                   f"not {lv.error_bound!r}")
            raise PlanError(msg)
    for finer, coarser in itertools.pairwise(levels):
        if coarser.bytes_per_window > finer.bytes_per_window:
            msg = (f"link policy: level {coarser.name!r} is coarser than {finer.name!r} but "
                   f"weighs more ({coarser.bytes_per_window:g} > {finer.bytes_per_window:g} "
                   f"bytes per window); order levels from heaviest to lightest")
            raise PlanError(msg)
        if coarser.error_bound < finer.error_bound:
            msg = (f"link policy: level {coarser.name!r} is coarser than {finer.name!r} but "
                   f"has a smaller error_bound ({coarser.error_bound:g} < "
                   f"{finer.error_bound:g}); order levels from exact to coarsest")
            raise PlanError(msg)
    return levels


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
