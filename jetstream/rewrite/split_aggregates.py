"""Distributive split: a windowed aggregate becomes partials near the data and one final step.

The fact it relies on is each aggregate's own definition (:mod:`jetstream.aggregates`): for
accumulators built by ``add`` over disjoint parts of a window's records, ``merge`` gives the
accumulator of the whole, so ``extract(merge(partials))`` equals one pass. Count and sum
carry a count and a sum, avg a sum and a count, approximate aggregates their sketches. So

    union(A, B) -> chain -> window -> aggregate
becomes
    A -> chain -> window -> partial aggregate ┐
    B -> chain -> window -> partial aggregate ┴-> union -> final aggregate

(the record steps between the union and the aggregate are copied onto each input; without a
union the partial still runs next to the data, one per site once the plan is placed).

It is NOT cheap to split a holistic aggregate — exact ``count_distinct`` or ``quantile``
ship every value — so by default those stay whole and ``explain`` says why. The distributed
path splits them anyway (``RewriteContext.split_holistic``): every value of one column, per
group and window, is still no more than the raw records it replaces.
"""

from __future__ import annotations

import dataclasses

import networkx as nx

from jetstream.operators import (
    KeyPartition,
    Map,
    Phase,
    Select,
    Union,
    Where,
    Window,
    WindowAggregate,
    WithColumn,
)
from jetstream.plan import LogicalPlan
from jetstream.rewrite.context import RewriteContext
from jetstream.rewrite.edit import add, consumers, input_of, insert_below, op, plan_of, replace
from jetstream.schema import DataType, Schema

__all__ = ["split_aggregates"]

RULE = "split_aggregates"
_RECORD_STEPS = (Where, WithColumn, Select, Map, Window, KeyPartition)


def split_aggregates(plan: LogicalPlan, context: RewriteContext) -> LogicalPlan:
    """The plan with each decomposable aggregate split into partials and a final step."""
    graph = plan.graph.copy()
    for node in list(nx.lexicographical_topological_sort(graph)):
        aggregate = op(graph, node)
        if not isinstance(aggregate, WindowAggregate) or aggregate.phase is not Phase.COMPLETE:
            continue
        if not aggregate.decomposable and not context.split_holistic:
            holistic = ", ".join(f"{name}={agg}" for name, agg in aggregate.aggregates
                                 if not agg.decomposable)
            context.declined(RULE, f"`{aggregate.describe()}` stays whole: {holistic} is "
                                   "holistic (its partial would carry every value)")
            continue
        partial = dataclasses.replace(aggregate, phase=Phase.PARTIAL,
                                      schema=_partial_schema(aggregate))
        replace(graph, node, dataclasses.replace(aggregate, phase=Phase.FINAL))
        partials = [insert_below(graph, node, 0, partial)]
        inputs = 1
        while partials:
            split = _below_union(graph, partials.pop())
            inputs += len(split) - 1 if split else 0
            partials += split
        carries = "; ".join(f"{name}={agg} as {agg.partial}" for name, agg in aggregate.aggregates)
        where = f"on each of {inputs} inputs" if inputs > 1 else "next to the data"
        context.fired(RULE, f"split `{aggregate.describe()}` into a partial {where} and a "
                            f"final step; partials carry {carries}")
    return plan_of(graph)


def _partial_schema(aggregate: WindowAggregate) -> Schema:
    keys = {k: aggregate.schema.dtype(k) for k in aggregate.keys}
    return Schema.of(keys | {name: DataType.PARTIAL for name, _ in aggregate.aggregates})


def _below_union(graph: nx.DiGraph, partial_node: int) -> list[int]:
    """Move a partial, with the record steps under it, onto each input of a union below.

    Returns the new partials (to try again: unions nest), or [] if there is no union below.
    """
    chain, node = [], input_of(graph, partial_node)
    while isinstance(op(graph, node), _RECORD_STEPS) and graph.out_degree(node) == 1:
        chain.append(node)
        node = input_of(graph, node)
    union = node
    if not isinstance(op(graph, union), Union) or graph.out_degree(union) != 1:
        return []
    partial = op(graph, partial_node)
    merged = add(graph, Union(schema=partial.schema))
    ((consumer, consumer_port),) = consumers(graph, partial_node)
    graph.add_edge(merged, consumer, port=consumer_port)
    new_partials = []
    for port, (upstream, _, _) in enumerate(sorted(graph.in_edges(union, data="port"),
                                                   key=lambda e: e[2])):
        for step in reversed(chain):
            copy = add(graph, op(graph, step))
            graph.add_edge(upstream, copy, port=0)
            upstream = copy
        copy = add(graph, partial)
        graph.add_edge(upstream, copy, port=0)
        graph.add_edge(copy, merged, port=port)
        new_partials.append(copy)
    graph.remove_nodes_from([partial_node, *chain, union])
    return new_partials
