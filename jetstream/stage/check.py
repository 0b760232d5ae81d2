"""What the Spark local stage can run, checked without Spark: the controller refuses at
submit a query that no site's stage could run, naming the step, instead of leaving it to
fail at the sites."""

from __future__ import annotations

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

__all__ = ["STAGE_STEPS", "check_stage", "site_chain"]

#: The record steps the local stage runs between the source and the partial aggregate.
STAGE_STEPS: tuple[type[Operator], ...] = (Where, WithColumn, Select, Join, Map, Window)


def site_chain(query: Query) -> list[Operator]:
    """Source, record steps, partial aggregate of an optimized query: what a site runs.

    Raises
    ------
    PlanError
        If the query has other than one partial aggregate, or the part a site runs is not
        one source and a chain of steps the stage runs (a ``union`` of sources, say).
    """
    plan, name = query.plan(), query.name
    partials = plan.partial_aggregates()
    union = next((op for op in map(plan.op, plan.topological()) if isinstance(op, Union)),
                 None)
    if union is not None and len(partials) != 1:
        sources = sorted({s.name for s in plan.sources()})
        fix = (f"it reads {', '.join(sources)}: give the sites one source that holds every "
               "record (a column can tell them apart)" if len(sources) > 1 else
               "write its branches as one stream (one where with | between the conditions)")
        msg = (f"query {name}: `{union.describe()}` does not run at the sites: a site's local "
               f"stage runs one chain of steps from one source; {fix}")
        raise PlanError(msg)
    if len(partials) != 1:
        msg = (f"query {name}: the local stage runs one partial aggregate, the plan has "
               f"{len(partials)} (a union of two windowed streams, say: union the raw "
               "streams, then window once)")
        raise PlanError(msg)
    chain, node = [], partials[0]
    while True:
        chain.append(plan.op(node))
        inputs = plan.inputs(node)
        if len(inputs) != 1:
            break
        node = inputs[0]
    chain.reverse()
    if not isinstance(chain[0], Source):
        msg = (f"query {name}: `{chain[0].describe()}` does not run in a site's local stage, "
               "which reads one source; give the sites one source with every record")
        raise PlanError(msg)
    if not isinstance(chain[-1], WindowAggregate):
        msg = f"query {name}: the local stage needs an aggregate"
        raise PlanError(msg)
    return chain


def check_stage(query: Query) -> list[Operator]:
    """The part of ``query`` (an optimized, distributed query) a site's stage runs, as
    :func:`site_chain` gives it; a PlanError, naming the step, unless the stage can run it."""
    chain = site_chain(query)
    if not any(isinstance(step, Window) for step in chain):
        msg = f"query {query.name}: the local stage needs a window before the aggregate"
        raise PlanError(msg)
    for step in chain[1:-1]:
        if not isinstance(step, STAGE_STEPS):
            msg = (f"query {query.name}: `{step.describe()}` does not run in the Spark local "
                   "stage")
            raise PlanError(msg)
    if chain[0].schema.event_time is None:
        msg = f"query {query.name}: source {chain[0].describe()} has no event time column"
        raise PlanError(msg)
    return chain
