"""Truncated exact top-N: a degraded partial that keeps the N highest-ranked rows and says
how much it may have left out, so that merges and further truncations keep sound bounds.

A :class:`BoundedPartial` holds exact accumulators for the rows it kept, and two kinds of
bound on what it left out, for a ranking aggregate that only grows with more data (a count,
or a sum of non-negative values):

* per row, ``slack``: the ranking value of that key may be up to ``slack`` higher than the
  kept row says, because some contributor dropped the key;
* ``omitted``: a key that has no row has a ranking value of at most ``omitted``;
* ``cut``: the keys that have no row have ranking values that add up to at most ``cut``
  (what a query without a top-k reports as the share of a window's total it may miss).

So a row's ranking value lies in ``[lb, ub]`` with ``lb`` the extracted value and
``ub = lb + slack``. Before and after, with ``n = 1``::

    rows a:5 b:3 c:1, omitted 0  --truncate-->  rows a:5 (slack 0), omitted 3
    (a:5 s0 | omitted 3) + (b:4 s0 | omitted 2)  --merge-->  a:5 s2, b:4 s3, omitted 5

The other aggregates of a row summarise only the contributors that kept the key: where a row
is not ``complete``, a count or a sum of non-negative values is a lower bound, a max a lower
bound, a min an upper bound, and an average neither. ``complete`` is tracked apart from
``slack`` because a dropped key may have a ranking value of 0 (a sum of zero bytes) and still
carry other aggregates.

A min, a max or an average gets bounds of its own from ``ranges``: for each, the smallest and
the largest value it had in any row dropped on the way (truncations widen it by what they
drop, merges take the union). What a row lacks is parts of dropped rows, so every min, max
and mean of a missing part lies in the range, and (:func:`value_bounds`) a row's true

* min lies in ``[min(v, lo), v]``, its max in ``[v, max(v, hi)]``;
* average lies in ``[min(v, lo), max(v, hi)]``: a mean of its known part, ``v``, and of
  missing parts, weighted by their counts, lies between the smallest and largest of them.

(With ``v`` NULL, the known part has no value: the true one is NULL or in ``[lo, hi]``.)
Ranges are known only where every summary on the way was a truncation: a frequent-items
sketch or TPUT's held-back keys leave them unknown (None), and those bounds open.

Bounds are computed exactly and rounded up to floats, so float sums never round a bound
below the value it bounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from jetstream.aggregates import Aggregate, Avg, Count, Max, Min, Sum, check_positive
from jetstream.errors import DataError, PlanError
from jetstream.operators import WindowAggregate
from jetstream.schema import value_order

__all__ = [
    "RANGED",
    "BoundedPartial",
    "Ranges",
    "RankBounds",
    "TopKBounds",
    "bounds",
    "exact_partial",
    "merge_bounded",
    "missing_share",
    "ranged_aggregates",
    "round_up",
    "top_k_bounds",
    "truncate",
    "union_ranges",
    "value_bounds",
    "with_bounds",
]

#: The aggregates a truncation bounds by the values it dropped (see ``ranges``).
RANGED = (Min, Max, Avg)

#: Per aggregate name, the smallest and largest value of it dropped (see the module docstring).
Ranges = Mapping[str, tuple[Any, Any]]

Row = dict[str, Any]
Key = tuple[Any, ...]


@dataclass(frozen=True)
class BoundedPartial:
    """Partial rows of one window, some keys possibly dropped, with bounds on what is missing.

    Attributes
    ----------
    rows
        One row per group key: key columns -> value, aggregate names -> accumulator.
    slack
        Per row, how much its ranking value may exceed the extracted one (>= 0).
    omitted
        No key without a row has a ranking value above this (>= 0).
    complete
        Per row, whether every contributor kept the key: then every aggregate is exact.
    truncated
        Whether any contributor dropped a row; False means the partial is exact.
    cut
        The keys without a row have ranking values that add up to at most this (>= 0).
        Truncations and merges keep it; a frequent-items sketch's rows
        (:mod:`jetstream.approx.items`, a top-k's only) do not bound it.
    ranges
        Per min, max or average (:data:`RANGED`) that any dropped row had a value of, the
        smallest and largest such value; None when unknown (see the module docstring).
    rolled_up
        Whether the rows' keys are the aggregate's coarser values (jetstream.approx.rollup).
    """

    rows: tuple[Row, ...]
    slack: tuple[float, ...]
    omitted: float
    complete: tuple[bool, ...]
    truncated: bool
    cut: float = 0.0
    ranges: Ranges | None = None
    rolled_up: bool = False

    def __post_init__(self) -> None:
        if not len(self.rows) == len(self.slack) == len(self.complete):
            msg = (f"bounded partial: {len(self.rows)} rows, but {len(self.slack)} slacks and "
                   f"{len(self.complete)} completeness flags; give one of each per row")
            raise DataError(msg)
        for what, bound in [*(("a slack", s) for s in self.slack), ("omitted", self.omitted),
                            ("cut", self.cut)]:
            if not bound >= 0:  # also refuses NaN
                msg = f"bounded partial: {what} is {bound!r}; bounds must be non-negative"
                raise DataError(msg)

    @property
    def exact(self) -> bool:
        return not self.truncated


def exact_partial(rows: Iterable[Row], rolled_up: bool = False) -> BoundedPartial:
    """Rows that nothing was dropped from, as a bounded partial (slack 0, omitted 0)."""
    kept = tuple(dict(row) for row in rows)
    return BoundedPartial(kept, (0.0,) * len(kept), 0.0, (True,) * len(kept), False,
                          ranges={}, rolled_up=rolled_up)


def with_bounds(rows: Iterable[Mapping[str, Any]], slack: Sequence[float] | None, omitted: float,
                complete: Sequence[bool] | None, cut: float = 0.0,
                ranges: Ranges | None = None, rolled_up: bool = False) -> BoundedPartial:
    """Rows as they travel (a batch, a merged window) as a bounded partial: without
    ``slack``, exact; without completeness flags, a row without slack counts as complete."""
    kept = tuple(dict(row) for row in rows)
    if slack is None:
        return exact_partial(kept, rolled_up)
    return BoundedPartial(kept, tuple(slack), omitted,
                          tuple(complete) if complete is not None else tuple(s == 0 for s in slack),
                          True, cut, ranges, rolled_up)


def truncate(rows: Sequence[Row] | BoundedPartial, aggregate: WindowAggregate, rank: str,
             n: int, *, slack: Sequence[float] | None = None,
             omitted: float = 0.0) -> BoundedPartial:
    """Keep the ``n`` rows with the largest upper bound of ``rank``, and bound the rest.

    A dropped key's ranking value is at most its upper bound, so the new ``omitted`` is the
    larger of the old one and the largest upper bound dropped, and ``cut`` grows by the
    dropped upper bounds' sum. As in the final top-k, a NULL
    ranking value (a sum of no values) ranks below a 0, and ties go to the smaller group key.

    Parameters
    ----------
    rows
        Partial rows of one window (not mutated), or a :class:`BoundedPartial` to truncate
        further (then leave ``slack`` and ``omitted`` out: it carries its own).
    aggregate
        The partial aggregate the rows come from: its ``keys`` and ``aggregates``.
    rank
        The name of the ranking aggregate: a count, or a sum of non-negative values.
    n
        How many rows to keep.
    slack, omitted
        Bounds that plain ``rows`` already carry; a row with slack 0 counts as complete.
        None and 0.0: the rows are exact.

    Returns
    -------
    BoundedPartial
        At most ``n`` rows, by upper bound descending, then group key ascending.

    Raises
    ------
    PlanError
        If ``rank`` names no aggregate, or one that is not a count or a sum, or ``n`` is not
        a positive integer.
    DataError
        If a ranking value is negative or not finite, or a group key appears twice.
    """
    _check_rank(aggregate, rank)
    check_positive(n, "truncate: n", "keep at least one row")
    partial = _as_bounded(rows, slack, omitted)
    ranked = _ranked(partial, aggregate, rank)
    order = sorted(range(len(ranked)),
                   key=lambda i: (-ranked[i].ub, ranked[i].null, ranked[i].order))
    kept, dropped = order[:n], order[n:]
    return BoundedPartial(
        tuple(dict(partial.rows[i]) for i in kept),
        tuple(partial.slack[i] for i in kept),
        max([partial.omitted, *(ranked[i].ub for i in dropped)]),
        tuple(partial.complete[i] for i in kept),
        partial.truncated or bool(dropped),
        round_up(_exact_sum(ranked[i].ub for i in dropped) + Fraction(partial.cut)),
        _widened(partial.ranges, (partial.rows[i] for i in dropped), aggregate),
        partial.rolled_up)


def merge_bounded(partials: Iterable[BoundedPartial],
                  aggregate: WindowAggregate) -> BoundedPartial:
    """Merge bounded partials of one window key by key; nothing the inputs hold is changed.

    A key's ranking value in an input that has no row for it is at most that input's
    ``omitted``, so a merged row's slack is, summed over the inputs, its slack where it has a
    row and the input's ``omitted`` where not; a key with no row anywhere is bounded by the
    sum of the ``omitted``, and all of them together by the sum of the ``cut``.

    Parameters
    ----------
    partials
        The inputs; not mutated (accumulators are merged into fresh ones).
    aggregate
        The partial aggregate the rows come from.

    Returns
    -------
    BoundedPartial
        One row per key of any input, in the order the keys first appear.

    Raises
    ------
    DataError
        If a group key appears twice in one input, or some inputs are rolled up and others
        not (:func:`jetstream.approx.rollup.merged` rolls them up first).
    """
    inputs = list(partials)
    rolled_up = {p.rolled_up for p in inputs}
    if len(rolled_up) > 1:
        msg = "merge_bounded: some partials are rolled up and some not; roll them all up first"
        raise DataError(msg)
    aggregates = aggregate.aggregates
    merged: dict[Key, Row] = {}
    # Per key: the exact sum of (slack - omitted) over the inputs holding it, so that adding
    # the sum of all omitted gives the slack; and over the truncated inputs, how many hold it.
    excess: dict[Key, Fraction] = {}
    held_by_truncated: dict[Key, int] = {}
    complete: dict[Key, bool] = {}
    for partial in inputs:
        seen: set[Key] = set()
        for row, slack, whole in zip(partial.rows, partial.slack, partial.complete,
                                     strict=True):
            key = tuple(row[k] for k in aggregate.keys)
            if key in seen:
                raise _twice("merge_bounded", key)
            seen.add(key)
            out = merged.get(key)
            if out is None:
                out = merged[key] = {k: row[k] for k in aggregate.keys} | {
                    name: agg.create() for name, agg in aggregates}
                excess[key], held_by_truncated[key], complete[key] = Fraction(0), 0, True
            for name, agg in aggregates:
                out[name] = agg.merge(out[name], row[name])
            excess[key] += Fraction(slack) - Fraction(partial.omitted)
            held_by_truncated[key] += partial.truncated
            complete[key] = complete[key] and whole
    all_omitted = sum((Fraction(p.omitted) for p in inputs), Fraction(0))
    truncated = sum(p.truncated for p in inputs)
    keys = list(merged)
    return BoundedPartial(
        tuple(merged[key] for key in keys),
        tuple(round_up(all_omitted + excess[key]) for key in keys),
        round_up(all_omitted),
        tuple(complete[key] and held_by_truncated[key] == truncated for key in keys),
        truncated > 0,
        round_up(sum((Fraction(p.cut) for p in inputs), Fraction(0))),
        union_ranges(p.ranges for p in inputs), True in rolled_up)


@dataclass(frozen=True)
class RankBounds:
    """Per row of a bounded partial, the interval its ranking value lies in.

    ``lb`` is the extracted value (NULL counts as 0), ``ub`` is ``lb`` plus the row's slack;
    a key without a row ranks at most ``omitted``. Where ``complete`` is False the row's other
    aggregates are partial too (see the module docstring).
    """

    rows: tuple[Row, ...]
    lb: tuple[int | float, ...]
    ub: tuple[int | float, ...]
    complete: tuple[bool, ...]
    omitted: float


def bounds(partial: BoundedPartial, aggregate: WindowAggregate, rank: str) -> RankBounds:
    """The lower and upper bound of every row's ranking value, and the bound on the others.

    Raises
    ------
    PlanError
        If ``rank`` names no aggregate, or one that is not a count or a sum.
    DataError
        If a ranking value is negative or not finite, or a group key appears twice.
    """
    _check_rank(aggregate, rank)
    ranked = _ranked(partial, aggregate, rank)
    return RankBounds(partial.rows, tuple(r.lb for r in ranked), tuple(r.ub for r in ranked),
                      partial.complete, partial.omitted)


def missing_share(partial: BoundedPartial, aggregate: WindowAggregate, rank: str) -> float:
    """The most the window's total of ``rank`` may hold beyond the rows' lower bounds, as a
    share of it: ``cut / (sum of lb + cut)`` (0.0 when nothing was cut), rounded up.

    Why it bounds both what a row lacks and what the keys without a row hold. Every part of
    the true total that no ``lb`` counts was dropped by some truncation on the way, whose
    upper bound went into ``cut``: so that part, ``M``, is at most ``cut``, and the total is
    ``T = L + M`` with ``L >= sum of lb``. ``M / T`` grows with ``M`` and falls with ``L``, so
    ``M / T <= cut / (sum of lb + cut)``; a row's true value exceeds its ``lb`` by a part of
    ``M``, and the keys without a row hold a part of ``M``.

    Raises
    ------
    PlanError, DataError
        As :func:`bounds`.
    """
    ranked = bounds(partial, aggregate, rank)
    held = sum((Fraction(lb) for lb in ranked.lb), Fraction(partial.cut))
    return round_up(Fraction(partial.cut) / held) if held else 0.0


@dataclass(frozen=True)
class TopKBounds:
    """The final top-k by lower bound, and what the bounds prove about it.

    Attributes
    ----------
    rows, lb, ub, complete
        The top-k rows, by ``lb`` descending, then group key ascending, and their bounds.
    guaranteed
        Per row, whether it is in the true top-k whatever was dropped: its ``lb`` is at least
        every other row's ``ub`` and ``omitted``, so at most ``k - 1`` keys can rank above it.
        (With ties at the k-th value, "in the top-k" means ranking at least that value.)
    error_bound
        The largest ``(ub - lb) / max(lb, 1)`` over the rows: 0.0 when every value is exact.
    """

    rows: tuple[Row, ...]
    lb: tuple[int | float, ...]
    ub: tuple[int | float, ...]
    complete: tuple[bool, ...]
    guaranteed: tuple[bool, ...]
    error_bound: float


def top_k_bounds(partial: BoundedPartial, aggregate: WindowAggregate, rank: str,
                 k: int) -> TopKBounds:
    """The ``k`` rows the final top-k picks by extracted value, and which of them are certain.

    Rows are picked as the final top-k operator picks them: largest ``lb`` first, a NULL
    below a 0, ties to the smaller group key.

    Raises
    ------
    PlanError
        If ``rank`` names no aggregate, or one that is not a count or a sum, or ``k`` is not
        a positive integer.
    DataError
        If a ranking value is negative or not finite, or a group key appears twice.
    """
    _check_rank(aggregate, rank)
    check_positive(k, "top_k_bounds: k")
    ranked = _ranked(partial, aggregate, rank)
    order = sorted(range(len(ranked)),
                   key=lambda i: (-ranked[i].lb, ranked[i].null, ranked[i].order))
    top, rest = order[:k], order[k:]
    beaten = max([partial.omitted, *(ranked[i].ub for i in rest)])
    return TopKBounds(
        rows=tuple(partial.rows[i] for i in top),
        lb=tuple(ranked[i].lb for i in top),
        ub=tuple(ranked[i].ub for i in top),
        complete=tuple(partial.complete[i] for i in top),
        guaranteed=tuple(ranked[i].lb >= beaten for i in top),
        error_bound=max(((ranked[i].ub - ranked[i].lb) / max(ranked[i].lb, 1) for i in top),
                        default=0.0))


def value_bounds(partial: BoundedPartial,
                 aggregate: WindowAggregate) -> list[dict[str, tuple[Any, Any]]]:
    """Per row, the bounds ``(lb, ub)`` of each of its mins, maxes and averages (see the
    module docstring; None: that side is open, the ranges being unknown). A complete row's
    are its own values."""
    ranged = ranged_aggregates(aggregate)
    if not ranged:
        return [{} for _ in partial.rows]
    out = []
    for row, whole in zip(partial.rows, partial.complete, strict=True):
        bounds_of: dict[str, tuple[Any, Any]] = {}
        for name, agg in ranged:
            value = agg.extract(row[name])
            if whole or (partial.ranges is not None and name not in partial.ranges):
                bounds_of[name] = (value, value)
            elif partial.ranges is None:
                bounds_of[name] = ((value, None) if type(agg) is Max else
                                   (None, value) if type(agg) is Min else (None, None))
            else:
                bounds_of[name] = _bounded(agg, value, *partial.ranges[name])
        out.append(bounds_of)
    return out


def union_ranges(ranges: Iterable[Ranges | None]) -> Ranges | None:
    """The ranges of several partials' dropped rows together (None if any is unknown)."""
    out: dict[str, tuple[Any, Any]] = {}
    for each in ranges:
        if each is None:
            return None
        for name, (lo, hi) in each.items():
            _spread(out, name, lo, hi)
    return out


def ranged_aggregates(aggregate: WindowAggregate) -> list[tuple[str, Aggregate]]:
    """The mins, maxes and averages of ``aggregate`` (:data:`RANGED`), by name."""
    return [(name, agg) for name, agg in aggregate.aggregates if type(agg) in RANGED]


# --- helpers ---------------------------------------------------------------------------------


def _exact_sum(values: Iterable[int | float]) -> Fraction:
    """The exact sum of ``values`` (integers added as integers: a count's are all)."""
    ints, floats = 0, []
    for value in values:
        if isinstance(value, int):
            ints += value
        else:
            floats.append(value)
    return sum((Fraction(f) for f in floats), Fraction(ints))


def _widened(ranges: Ranges | None, dropped: Iterable[Row],
             aggregate: WindowAggregate) -> Ranges | None:
    """``ranges`` with the values of the rows a truncation ``dropped``."""
    if ranges is None:
        return None
    out = dict(ranges)
    ranged = ranged_aggregates(aggregate)
    if not ranged:  # (a count or a sum alone: nothing to range)
        return out
    for row in dropped:
        for name, agg in ranged:
            value = agg.extract(row[name])
            if value is not None:
                _spread(out, name, value, value)
    return out


def _spread(ranges: dict[str, tuple[Any, Any]], name: str, lo: Any, hi: Any) -> None:
    """Widen ``ranges[name]`` to take in ``[lo, hi]``."""
    was = ranges.get(name)
    ranges[name] = (lo, hi) if was is None else (min(was[0], lo), max(was[1], hi))


def _bounded(agg: Aggregate, value: Any, lo: Any, hi: Any) -> tuple[Any, Any]:
    """An incomplete row's bounds on ``agg``, its known part's ``value``, the dropped values
    in ``[lo, hi]``."""
    if value is None:
        return lo, hi
    if type(agg) is Min:
        return min(value, lo), value
    if type(agg) is Max:
        return value, max(value, hi)
    # An average: the true mean is the sum over the count rounded once, where each part's
    # mean was rounded too: a few ulps of room.
    return _ulps(min(value, lo), -math.inf), _ulps(max(value, hi), math.inf)


def _ulps(value: float, toward: float, n: int = 4) -> float:
    for _ in range(n):
        value = math.nextafter(value, toward)
    return value



def _check_rank(aggregate: WindowAggregate, rank: str) -> Aggregate:
    found = dict(aggregate.aggregates).get(rank)
    if found is None:
        names = ", ".join(repr(name) for name, _ in aggregate.aggregates)
        msg = f"truncate: no aggregate named {rank!r} to rank by; name one of {names}"
        raise PlanError(msg)
    # Exact types: a subclass may extract something else (Avg, a Sum, extracts a mean, and
    # a dropped mean is not bounded by what the kept rows show).
    if type(found) not in (Count, Sum):
        msg = (f"truncate: cannot rank by {rank!r}, a {found}; dropping rows bounds only a "
               "count or a sum of non-negative values: rank by one of those")
        raise PlanError(msg)
    return found


def _as_bounded(rows: Sequence[Row] | BoundedPartial, slack: Sequence[float] | None,
                omitted: float) -> BoundedPartial:
    if isinstance(rows, BoundedPartial):
        if slack is not None or omitted != 0.0:
            msg = "truncate: a bounded partial carries its own slack and omitted; give neither"
            raise DataError(msg)
        return rows
    slacks = tuple(slack) if slack is not None else (0.0,) * len(rows)
    return BoundedPartial(tuple(rows), slacks, omitted, tuple(s == 0 for s in slacks),
                          omitted > 0 or any(s > 0 for s in slacks),
                          ranges={} if slack is None and omitted == 0 else None)


class _Ranked(NamedTuple):
    order: tuple[tuple[int, Any], ...]  # the group key as the final top-k orders it
    lb: int | float
    ub: int | float
    null: bool  # the extracted value was NULL: it ranks below a 0


def _ranked(partial: BoundedPartial, aggregate: WindowAggregate, rank: str) -> list[_Ranked]:
    agg = dict(aggregate.aggregates)[rank]
    out = []
    seen: set[Key] = set()
    for row, slack in zip(partial.rows, partial.slack, strict=True):
        key = tuple(row[k] for k in aggregate.keys)
        if key in seen:
            raise _twice("truncate", key)
        seen.add(key)
        value = agg.extract(row[rank])
        lb = 0 if value is None else value
        if isinstance(lb, bool) or not isinstance(lb, int | float) or not 0 <= lb < math.inf:
            msg = (f"truncate: {rank} = {agg} of key {key!r} is {value!r}; ranking needs "
                   "finite, non-negative values (a sum of non-negative ones)")
            raise DataError(msg)
        order = tuple(value_order(v) for v in key)
        out.append(_Ranked(order, lb, _upper(lb, slack), value is None))
    return out


def _upper(lb: int | float, slack: float) -> int | float:
    if slack == 0:
        return lb
    ub = round_up(Fraction(lb) + Fraction(slack))
    # A float lb is the partial sum rounded to nearest: the sum itself may be above it.
    return math.nextafter(ub, math.inf) if isinstance(lb, float) else ub


def round_up(exact: Fraction) -> float:
    """The smallest float >= ``exact`` (infinity past the largest float)."""
    try:
        rounded = float(exact)
    except OverflowError:
        return math.inf
    return rounded if rounded >= exact else math.nextafter(rounded, math.inf)


def _twice(step: str, key: Key) -> DataError:
    return DataError(f"{step}: group key {key!r} has two rows in one partial; "
                     "merge a partial's rows per key first")
