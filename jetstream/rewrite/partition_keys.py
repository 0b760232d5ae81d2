"""Key partitioning: split a merge or final aggregate over N servers by its group key.

The fact it relies on: an aggregate computes each group from that group's rows alone, so
with the rows cut by key into disjoint parts (an exchange: hash of the key, or ranges of the
first key), aggregating each part and taking the union gives the same rows:

    partials -> final aggregate by domain
becomes
    partials -> partition 1/N by hash(domain) -> final aggregate ┐
             ...                                                 ├-> union
             -> partition N/N by hash(domain) -> final aggregate ┘

The physical planner chooses N (``RewriteContext.partitions``); with N = 1 the rule does
nothing. It is NOT possible for an aggregate without group keys (one group per window), and
partials stay where they are: they run next to the data, one per site.
"""

from __future__ import annotations

import dataclasses

import networkx as nx

from jetstream.operators import KeyPartition, Phase, Union, WindowAggregate
from jetstream.plan import LogicalPlan
from jetstream.rewrite.context import RewriteContext
from jetstream.rewrite.edit import add, consumers, input_of, op, plan_of

__all__ = ["partition_keys"]

RULE = "partition_keys"


def partition_keys(plan: LogicalPlan, context: RewriteContext) -> LogicalPlan:
    """The plan with each merge, final or unsplit aggregate spread over ``partitions`` parts."""
    count = context.partitions
    graph = plan.graph.copy()
    for node in list(nx.lexicographical_topological_sort(graph)):
        aggregate = op(graph, node)
        if not isinstance(aggregate, WindowAggregate) or aggregate.phase is Phase.PARTIAL:
            continue
        text = f"`{aggregate.describe()}`"
        if count == 1:
            context.declined(RULE, f"{text} stays on one server (1 partition; the physical "
                                   "planner chooses more where a site's servers are small)")
            continue
        if not aggregate.keys:
            context.declined(RULE, f"{text} has no group key to partition by")
            continue
        if aggregate.rollup:
            context.declined(RULE, f"{text} stays whole: a link may roll its rows up, and a "
                                   "key's coarser value falls in another partition than it")
            continue
        upstream = input_of(graph, node)
        if isinstance(op(graph, upstream), KeyPartition):
            continue  # already partitioned
        union = add(graph, Union(schema=aggregate.schema))
        for consumer, port in consumers(graph, node):
            graph.add_edge(union, consumer, port=port)
        graph.remove_node(node)
        for index in range(count):
            exchange = KeyPartition(schema=op(graph, upstream).schema, keys=aggregate.keys,
                                    index=index, count=count, bounds=context.bounds)
            part = add(graph, exchange)
            graph.add_edge(upstream, part, port=0)
            copy = add(graph, dataclasses.replace(aggregate))
            graph.add_edge(part, copy, port=0)
            graph.add_edge(copy, union, port=index)
        scheme = "ranges" if context.bounds is not None else "hashes"
        context.fired(RULE, f"spread {text} over {count} partitions by {scheme} of "
                            f"{', '.join(aggregate.keys)}")
    return plan_of(graph)
