"""Semantics-preserving rewrites of the logical plan.

One rule per module, each a function ``rule(plan, context) -> plan`` whose docstring states
the algebraic fact it relies on and where it does not hold. :data:`RULES` is the registry and
its order matters: filters first move toward the sources, aggregates then split into
partials (copying the pushed filters onto every site's branch), merges spread over key
partitions, and finally ``top_k`` moves onto those partitions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jetstream.dsl import Query, Stream
from jetstream.errors import PlanError
from jetstream.operators import WindowAggregate
from jetstream.plan import LogicalPlan
from jetstream.rewrite.context import Note, RewriteContext
from jetstream.rewrite.partition_keys import partition_keys
from jetstream.rewrite.push_filters import push_filters
from jetstream.rewrite.push_top_k import push_top_k
from jetstream.rewrite.split_aggregates import split_aggregates

__all__ = ["RULES", "Note", "RewriteContext", "distributed", "explain", "optimize",
           "partial_aggregate", "rewrite", "site_part"]

Rule = Callable[[LogicalPlan, RewriteContext], LogicalPlan]

RULES: tuple[Rule, ...] = (push_filters, split_aggregates, partition_keys, push_top_k)


def rewrite(plan: LogicalPlan, context: RewriteContext) -> LogicalPlan:
    """Apply every rule in order; ``context`` collects what each did."""
    for rule in RULES:
        plan = rule(plan, context)
    return plan


def optimize(query: Query, *, partitions: int = 1, bounds: tuple[Any, ...] | None = None,
             split_holistic: bool = False) -> Query:
    """The same query, rewritten to cut wide-area bytes; it gives the same results.

    ``partitions`` spreads each merge over that many key partitions (by hash, or by range of
    the first key when ``bounds`` gives the split points); ``split_holistic`` splits exact
    distinct counts and quantiles into partials too (see :mod:`.split_aggregates`).
    """
    return _optimized(query, RewriteContext(partitions, bounds, split_holistic=split_holistic))


def distributed(query: Query) -> Query:
    """The query as it runs across sites: optimized, every aggregate split into partials,
    holistic ones too (their partials carry the values). The planner and the sites both take
    their split from here."""
    return optimize(query, split_holistic=True)


def _optimized(query: Query, context: RewriteContext) -> Query:
    return Query(query.name, Stream(rewrite(query.plan(), context)), query.slo)


def explain(query: Query, *, partitions: int = 1, bounds: tuple[Any, ...] | None = None) -> str:
    """The logical plan, what each rule did (or why it declined), and the rewritten plan."""
    context = RewriteContext(partitions, bounds)
    rewritten = _optimized(query, context)
    width = max(len(rule.__name__) for rule in RULES)
    lines = [f"query {query.name}  (slo: {query.slo})", "", "logical plan",
             query.plan().render(), "", "rewrites"]
    for rule in RULES:
        notes = [n for n in context.notes if n.rule == rule.__name__]
        if not notes:
            lines.append(f"  {rule.__name__:<{width}}  nothing to do")
        for i, note in enumerate(notes):
            name = rule.__name__ if i == 0 else ""
            lines.append(f"  {name:<{width}}  {'' if note.fired else 'declined: '}{note.text}")
    lines += ["", "rewritten plan", rewritten.plan().render()]
    return "\n".join(lines)


def partial_aggregate(query: Query) -> WindowAggregate:
    """The partial aggregate of an optimized query: what sites send each other."""
    plan = query.plan()
    partials = plan.partial_aggregates()
    if not partials:
        msg = (f"query {query.name}: only windowed aggregates run across sites; add "
               ".window(...).group_by(...).agg(...) or run it with `jetstream local`")
        raise PlanError(msg)
    op = plan.op(partials[0])  # a source read twice has one partial per branch, all alike
    assert isinstance(op, WindowAggregate)
    return op


def site_part(query: Query) -> tuple[Query, WindowAggregate]:
    """What each site computes of an optimized query: the query up to its partial aggregate
    (its results are the partial rows a site sends), and that aggregate."""
    partial = partial_aggregate(query)
    plan = query.plan()
    site = Query(f"{query.name}/site", Stream(plan.up_to(plan.partial_aggregates()[0])))
    return site, partial
