"""TPUT's rounds as the data plane runs them: what a child answers, what the coordinator asks
next, and when a window's exact top-k is known.

The coordinator (the parent that makes the final top-k) merges what its inputs sent as
bounded partials (:mod:`jetstream.approx.truncate`): a child's answer holds its exact rows
for the keys it sent, and ``omitted``, the largest ranking value among the keys it has not
sent. A window is *settled* when the rows that every contributor holds (``complete``) include
the true top-k: let ``tau`` be the k-th largest value among them; every incomplete row's upper
bound and the bound on keys nobody sent are below ``tau``. Then the complete rows alone give
the exact top-k (all of their aggregates are exact, ties broken by key as the final step
does), whatever rounds led there. Until then :func:`next_asks` asks for what blocks it, in
TPUT's order (Cao & Wang, PODC 2004):

1. each child sends its top ``k`` (:func:`first_answer`);
2. while keys nobody sent may still reach ``tau`` (the k-th largest lower bound), every child
   that may hold such keys is asked for its rows ranking at least ``T = tau / m``, ``m`` the
   number of children asked in rounds: afterwards no unsent key totals ``m * T`` or more;
3. the incomplete rows whose upper bound reaches ``tau`` are asked of the children that have
   not sent them (a child without the key answers with an empty row, so the key is complete).

After these three rounds the window is settled; a child that has sent every row it holds
answers with an exact partial. Ranking values must be counts or sums of non-negative values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from jetstream.approx.truncate import BoundedPartial, Key, Row, bounds, merge_bounded
from jetstream.operators import WindowAggregate
from jetstream.schema import value_order

__all__ = ["Ask", "answer", "exact_rows", "first_answer", "next_asks", "settled"]


@dataclass(frozen=True)
class Ask:
    """What a coordinator asks of one child for one window: its ``top`` rows, every row
    ranking at least ``threshold``, and the rows of ``keys``."""

    top: int = 0
    threshold: float | None = None
    keys: tuple[Key, ...] = ()


def answer(exact: Sequence[Row], sent: frozenset[Key], ask: Ask, aggregate: WindowAggregate,
           rank: str) -> tuple[BoundedPartial, frozenset[Key]]:
    """A child's answer to ``ask``, given its exact rows of the window and the keys it has
    sent before: those rows again and the ones ``ask`` adds (an empty row for an asked key it
    does not hold), bounded by the largest value it still holds back; and the keys sent now.
    Every row sent: the exact partial itself."""
    every = bounds(BoundedPartial(tuple(exact), (0.0,) * len(exact), 0.0,
                                  (True,) * len(exact), False), aggregate, rank)
    keyed = {_key(row, aggregate): i for i, row in enumerate(exact)}
    chosen = {keyed[k] for k in sent if k in keyed}
    order = sorted(range(len(exact)), key=lambda i: (-every.lb[i], _order(exact[i], aggregate)))
    chosen.update(order[:ask.top])
    if ask.threshold is not None:
        chosen.update(i for i in range(len(exact)) if every.lb[i] >= ask.threshold)
    chosen.update(keyed[k] for k in ask.keys if k in keyed)
    empty = tuple(_empty(k, aggregate) for k in ask.keys if k not in keyed and k not in sent)
    absent = tuple(_empty(k, aggregate) for k in sent if k not in keyed)  # asked before
    rows = tuple(exact[i] for i in sorted(chosen)) + absent + empty
    now = frozenset(_key(row, aggregate) for row in rows)
    held_back = [every.lb[i] for i in range(len(exact)) if i not in chosen]
    if not held_back:
        return BoundedPartial(rows, (0.0,) * len(rows), 0.0, (True,) * len(rows), False), now
    return BoundedPartial(rows, (0.0,) * len(rows), float(max(held_back)),
                          (True,) * len(rows), True), now


def first_answer(exact: Sequence[Row], k: int, aggregate: WindowAggregate,
                 rank: str) -> tuple[BoundedPartial, frozenset[Key]]:
    """Round 1: the child's top ``k`` rows (see :func:`answer`)."""
    return answer(exact, frozenset(), Ask(top=k), aggregate, rank)


def settled(merged: BoundedPartial, aggregate: WindowAggregate, rank: str, k: int) -> bool:
    """Whether the complete rows of ``merged`` hold the exact top-``k`` (module docstring)."""
    if not merged.truncated:
        return True
    tau = _tau(merged, aggregate, rank, k, complete_only=True)
    if tau is None or tau == 0:  # a 0 ties with keys nobody sent: nothing may be held back
        return False
    b = bounds(merged, aggregate, rank)
    return merged.omitted < tau and all(c or ub < tau for ub, c in zip(b.ub, b.complete,
                                                                       strict=True))


def exact_rows(merged: BoundedPartial) -> tuple[Row, ...]:
    """The rows of a settled window that the final top-k may pick from: the complete ones."""
    return tuple(row for row, whole in zip(merged.rows, merged.complete, strict=True) if whole)


def next_asks(inputs: Mapping[str, BoundedPartial], aggregate: WindowAggregate, rank: str,
              k: int) -> dict[str, Ask]:
    """What to ask each input next so that the window settles (empty once it has). Inputs
    that sent an exact partial are never asked; ``m`` counts those that did not."""
    merged = merge_bounded(inputs.values(), aggregate)
    if settled(merged, aggregate, rank, k):
        return {}
    rounds = {name: p for name, p in inputs.items() if p.truncated}
    tau = _tau(merged, aggregate, rank, k, complete_only=False) or 0
    if merged.omitted >= tau or tau == 0:
        # T = tau / m, rounded down so that m children each holding back less than T hold
        # back less than tau together.
        threshold = _at_most(Fraction(tau) / len(rounds))
        return {name: Ask(threshold=threshold) for name, p in rounds.items()
                if p.omitted >= threshold}
    b = bounds(merged, aggregate, rank)
    wanted = [_key(row, aggregate) for row, ub, whole in zip(b.rows, b.ub, b.complete,
                                                              strict=True)
              if not whole and ub >= tau]
    asks = {}
    for name, p in rounds.items():
        held = {_key(row, aggregate) for row in p.rows}
        missing = tuple(key for key in wanted if key not in held)
        if missing:
            asks[name] = Ask(keys=missing)
    return asks


def _tau(merged: BoundedPartial, aggregate: WindowAggregate, rank: str, k: int, *,
         complete_only: bool) -> int | float | None:
    """The k-th largest lower bound (of the complete rows only, or of all); None if fewer."""
    b = bounds(merged, aggregate, rank)
    values = sorted((lb for lb, whole in zip(b.lb, b.complete, strict=True)
                     if whole or not complete_only), reverse=True)
    return values[k - 1] if len(values) >= k else None


def _at_most(exact: Fraction) -> float:
    """The largest float <= ``exact``."""
    rounded = float(exact)
    return rounded if Fraction(rounded) <= exact else math.nextafter(rounded, -math.inf)


def _key(row: Row, aggregate: WindowAggregate) -> Key:
    return tuple(row[k] for k in aggregate.keys)


def _order(row: Row, aggregate: WindowAggregate) -> tuple[object, ...]:
    return tuple(value_order(row[k]) for k in aggregate.keys)


def _empty(key: Key, aggregate: WindowAggregate) -> Row:
    """A key's row with nothing in it: merging it changes no value, and says the sender
    holds nothing more of the key."""
    return dict(zip(aggregate.keys, key, strict=True)) | {
        name: agg.create() for name, agg in aggregate.aggregates}
