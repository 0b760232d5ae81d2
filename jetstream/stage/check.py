"""What the Spark local stage can run, checked without Spark: the controller refuses at
submit a query that no site's stage could run, naming the step, instead of leaving it to
fail at the sites."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from jetstream.dsl import Query
from jetstream.errors import PlanError
from jetstream.operators import (
    Join,
    Map,
    Operator,
    Select,
    Source,
    Union,
    Where,
    Window,
    WindowAggregate,
    WithColumn,
)
from jetstream.plan import LogicalPlan

__all__ = ["STAGE_STEPS", "Chain", "check_stage", "local_inputs", "site_chains",
           "source_of"]

#: A source, the record steps after it, and the partial aggregate they feed.
Chain = list[Operator]

#: The record steps the local stage runs between the source and the partial aggregate.
STAGE_STEPS: tuple[type[Operator], ...] = (Where, WithColumn, Select, Join, Map, Window)


def site_chains(query: Query) -> list[Chain]:
    """What a site runs of an optimized query: for each partial aggregate, the chain from its
    source through the record steps to it. Several chains are the inputs of a ``union``,
    each with the partial copied onto it (:mod:`jetstream.rewrite.split_aggregates`).

    Raises
    ------
    PlanError
        If the query has no partial aggregate, or its partials do not all feed one merge
        through unions (two windowed streams unioned, say), or a chain does not start at a
        source.
    """
    plan, name = query.plan(), query.name
    partials = plan.partial_aggregates()
    merges = {_merge_of(plan, node) for node in partials}
    if len(merges) != 1 or None in merges or any(
            plan.op(node) != plan.op(partials[0]) for node in partials):
        msg = (f"query {name}: the local stage runs one partial aggregate, the plan has "
               f"{len(partials)} (a union of two windowed streams, say: union the raw "
               "streams, then window once)")
        raise PlanError(msg)
    chains = []
    for partial in partials:
        chain, node = [], partial
        while True:
            chain.append(plan.op(node))
            inputs = plan.inputs(node)
            if len(inputs) != 1:
                break
            node = inputs[0]
        chain.reverse()
        if not isinstance(chain[0], Source):
            msg = (f"query {name}: `{chain[0].describe()}` does not run in a site's local "
                   "stage, which reads sources and runs a chain of steps from each")
            raise PlanError(msg)
        chains.append(chain)
    return chains


def _merge_of(plan: LogicalPlan, node: int) -> int | None:
    """The step that merges the partial ``node``: the first after it that is not a union."""
    while isinstance(plan.op(node), WindowAggregate | Union):
        after = list(plan.graph.successors(node))
        if len(after) != 1:
            return None
        node = after[0]
        if isinstance(plan.op(node), WindowAggregate):
            return node
    return None


def source_of(chain: Chain) -> Source:
    source = chain[0]
    assert isinstance(source, Source), "site_chains starts every chain at a source"
    return source


def local_inputs(site: str, chains: Sequence[Chain], sources: Iterable[str]
                 ) -> list[tuple[str, Chain]]:
    """The local stages ``site`` runs of a query: one per chain whose source the site holds
    (``sources``), each an input of the site's merge with a name of its own — the site's,
    when it is the only one; else ``site[source]`` (``site[source#2]`` for a second chain
    from one source)."""
    held = set(sources)
    mine = [chain for chain in chains if source_of(chain).name in held]
    if len(mine) == 1:
        return [(site, mine[0])]
    seen: Counter[str] = Counter()
    named = []
    for chain in mine:
        source = source_of(chain).name
        seen[source] += 1
        label = source if seen[source] == 1 else f"{source}#{seen[source]}"
        named.append((f"{site}[{label}]", chain))
    return named


def check_stage(query: Query) -> list[Chain]:
    """The chains of ``query`` (an optimized, distributed query) a site's stages run, as
    :func:`site_chains` gives them; a PlanError, naming the step, unless the stage can run
    each."""
    chains = site_chains(query)
    for chain in chains:
        if not any(isinstance(step, Window) for step in chain):
            msg = f"query {query.name}: the local stage needs a window before the aggregate"
            raise PlanError(msg)
        for step in chain[1:-1]:
            if not isinstance(step, STAGE_STEPS):
                msg = (f"query {query.name}: `{step.describe()}` does not run in the Spark "
                       "local stage")
                raise PlanError(msg)
        if chain[0].schema.event_time is None:
            msg = f"query {query.name}: source {chain[0].describe()} has no event time column"
            raise PlanError(msg)
    return chains
