"""Dimension coarsening: a window's partial rows rolled up to coarser keys.

A query may declare a coarser value for a group key, as an expression of that key alone::

    logs.window(...).group_by("url", rollup={"url": col("url").url_domain()}).agg(...)

A link that cannot carry a window's rows may then send them rolled up (:func:`roll_up`):
each row's key replaced by its coarser value, and the rows that now share a key merged,
aggregate by aggregate, as a parent merges its children's partials. Every aggregate stays
exact, at the coarser keys: a rolled-up result's rows are what :func:`jetstream.run_local`
gives for the query with ``url`` replaced by ``url_domain(url)`` before the group_by. A
merge of inputs some of which are rolled up rolls the others up first (:func:`merged`), so
a window rolled up on one link is reported rolled up (``WindowResult.rolled_up``), however
its other links sent it.

A truncated partial rolls up with sound bounds: what its rows lack and what its dropped keys
hold together weigh at most its ``cut`` (:func:`jetstream.approx.truncate.missing_share`),
and any of it may belong to any coarser key. So every rolled-up row gets slack ``cut`` and
counts as incomplete, a coarser key without a row weighs at most ``cut`` (``omitted``), and
``cut`` and the ranges stay as they were. (A query with a roll-up has no top-k, so no
frequent-items sketch, whose ``cut`` bounds nothing, is ever rolled up.)
"""

from __future__ import annotations

from collections.abc import Iterable

from jetstream.approx.truncate import BoundedPartial, Key, Row, merge_bounded
from jetstream.errors import PlanError
from jetstream.operators import WindowAggregate

__all__ = ["merged", "roll_up", "rollup_text"]


def roll_up(partial: BoundedPartial, aggregate: WindowAggregate) -> BoundedPartial:
    """``partial`` with its keys at their coarser values (see the module docstring);
    unchanged if already rolled up.

    Raises
    ------
    PlanError
        If ``aggregate`` declares no roll-up.
    """
    if partial.rolled_up:
        return partial
    rows = tuple(_merged_by_key(partial.rows, aggregate))
    n, cut = len(rows), partial.cut
    if not partial.truncated:
        return BoundedPartial(rows, (0.0,) * n, 0.0, (True,) * n, False, ranges={},
                              rolled_up=True)
    return BoundedPartial(rows, (cut,) * n, cut, (False,) * n, True, cut, partial.ranges,
                          rolled_up=True)


def merged(partials: Iterable[BoundedPartial], aggregate: WindowAggregate) -> BoundedPartial:
    """:func:`~jetstream.approx.truncate.merge_bounded` of ``partials``, all rolled up first
    if any of them is."""
    inputs = list(partials)
    if any(p.rolled_up for p in inputs):
        inputs = [roll_up(p, aggregate) for p in inputs]
    return merge_bounded(inputs, aggregate)


def rollup_text(aggregate: WindowAggregate) -> dict[str, str]:
    """What a rolled-up result says it was rolled up to: key -> the expression, as text."""
    return {key: str(expr) for key, expr in aggregate.rollup}


def _merged_by_key(rows: Iterable[Row], aggregate: WindowAggregate) -> Iterable[Row]:
    if not aggregate.rollup:
        msg = (f"roll up: `{aggregate.describe()}` declares no coarser key; declare one with "
               "group_by(..., rollup={key: expression of it})")
        raise PlanError(msg)
    coarser = dict(aggregate.rollup)
    out: dict[Key, Row] = {}
    for row in rows:
        values = {k: coarser[k].evaluate(row) if k in coarser else row[k]
                  for k in aggregate.keys}
        key = tuple(values[k] for k in aggregate.keys)
        into = out.get(key)
        if into is None:
            into = out[key] = values | {name: agg.create() for name, agg in aggregate.aggregates}
        for name, agg in aggregate.aggregates:
            into[name] = agg.merge(into[name], row[name])
    return out.values()
