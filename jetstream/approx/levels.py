"""Which degradation levels a query has, and what each level keeps.

A query that ends in a top-k ranked by a count or a sum can degrade, link by link, from exact
partials to truncated ones: each window keeps only the ``factor * k`` keys with the largest
ranking value and states a bound on the rest (:mod:`jetstream.approx.truncate`). The root then
reports each row with its lower and upper bound and whether it is certainly in the top-k. A
query without such a top-k has only the exact level.
"""

from __future__ import annotations

from dataclasses import dataclass

from jetstream.aggregates import Avg, Count, Sum
from jetstream.approx.policy import DegradationLevel, degradation_ladder
from jetstream.dsl import Query
from jetstream.operators import Phase, TopK, WindowAggregate

__all__ = ["TRUNCATION_FACTORS", "Ranking", "levels_for", "ranking", "rows_kept"]

#: The truncated levels keep this many times k keys per window, from finer to coarser.
TRUNCATION_FACTORS = (32, 8, 2)
#: What the exact level is taken to weigh in the ladder's units (kept keys): the policy
#: learns the real bytes per unit from the windows it sees.
EXACT_ROWS_GUESS = 128
#: Nominal error bounds of the truncated levels, finer to coarser, for the policy's choice
#: under an SLO's max_error. Every result reports the bound it actually has.
NOMINAL_ERRORS = (0.001, 0.003, 0.01)


@dataclass(frozen=True)
class Ranking:
    """The query's final top-k: ``k`` keys by the aggregate named ``by``."""

    k: int
    by: str


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
                return Ranking(op.k, op.by)
    return None


def levels_for(rank: Ranking | None) -> tuple[DegradationLevel, ...]:
    """Exact first, then truncation to ``factor * k`` keys for each factor, coarser down."""
    if rank is None:
        return degradation_ladder([("exact", 1.0, 0.0)])
    exact = max(EXACT_ROWS_GUESS * rank.k, TRUNCATION_FACTORS[0] * rank.k * 2)
    return degradation_ladder([("exact", float(exact), 0.0)] + [
        (f"top {factor * rank.k}", float(factor * rank.k), error)
        for factor, error in zip(TRUNCATION_FACTORS, NOMINAL_ERRORS, strict=True)])


def rows_kept(level: DegradationLevel, rank: Ranking | None) -> int | None:
    """How many keys a window keeps at ``level``; None: all of them (exact)."""
    if level.index == 0 or rank is None:
        return None
    return TRUNCATION_FACTORS[level.index - 1] * rank.k
