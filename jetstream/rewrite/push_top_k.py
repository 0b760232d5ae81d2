"""Top-k pushback: a ``top_k`` over the union of key-disjoint partitions runs on each first.

The fact it relies on: if the inputs of a union hold disjoint sets of group keys, a row in
the top k of the union is in the top k of its own input (everything ranked above it in its
input is ranked above it overall), and merging sorted lists only moves a row down. So

    partition i -> final aggregate ┐
                                   ├-> union -> top_k 10
becomes
    partition i -> final aggregate -> top_k 10 (partial) ┐
                                                         ├-> union -> top_k 10

and each server ships k rows instead of all of its groups.

It is NOT safe where the inputs can share a key: per-site partials of one domain's count
must be merged before anyone can rank the domain, so a ``top_k`` never moves below a merge or
final aggregate, nor onto inputs that are not partitions of one exchange by the ranked key.
"""

from __future__ import annotations

import dataclasses

import networkx as nx

from jetstream.operators import (
    KeyPartition,
    Map,
    Phase,
    Select,
    TopK,
    Union,
    Where,
    WindowAggregate,
    WithColumn,
)
from jetstream.plan import LogicalPlan
from jetstream.rewrite.context import RewriteContext
from jetstream.rewrite.edit import input_of, insert_below, op, plan_of

__all__ = ["push_top_k"]

RULE = "push_top_k"


def push_top_k(plan: LogicalPlan, context: RewriteContext) -> LogicalPlan:
    """The plan with each final ``top_k`` copied onto the key-disjoint inputs of its union."""
    graph = plan.graph.copy()
    for node in list(nx.lexicographical_topological_sort(graph)):
        top = op(graph, node)
        if not isinstance(top, TopK) or top.per_input:
            continue
        below_node = input_of(graph, node)
        below = op(graph, below_node)
        text = f"`{top.describe()}`"
        if isinstance(below, WindowAggregate) and below.phase in (Phase.MERGE, Phase.FINAL):
            context.declined(RULE, f"{text} stays above `{below.describe()}`: the partials it "
                                   "merges can share a key (one domain counted at several "
                                   "sites), so a partial top_k below it would lose counts")
            continue
        if not isinstance(below, Union):
            context.declined(RULE, f"{text} has one input (`{below.describe()}`): there are "
                                   "no partitions to rank separately")
            continue
        ports = sorted(p for _, _, p in graph.in_edges(below_node, data="port"))
        exchanges = [_exchange_of(graph, input_of(graph, below_node, p), set(top.tie_break))
                     for p in ports]
        if not _disjoint(exchanges):
            context.declined(RULE, f"{text} stays above the union: its inputs are not "
                                   f"partitions of one exchange by {', '.join(top.tie_break)}, "
                                   "so they can share a key")
            continue
        for port in ports:
            schema = op(graph, input_of(graph, below_node, port)).schema
            insert_below(graph, below_node, port,
                         dataclasses.replace(top, schema=schema, per_input=True))
        context.fired(RULE, f"copied {text} onto each of the {len(ports)} key-disjoint "
                            "partitions; the final top_k merges their lists")
    return plan_of(graph)


def _exchange_of(graph: nx.DiGraph, node: int, keys: set[str]) -> KeyPartition | None:
    """The key partition every row at ``node`` comes through, if its key survives to here.

    ``keys`` are the columns that identify a row at the top; each step on the way down must
    leave them unchanged, and the partition must be by a subset of them.
    """
    while True:
        step = op(graph, node)
        if isinstance(step, KeyPartition):
            return step if set(step.keys) <= keys else None
        if isinstance(step, WindowAggregate):
            keys &= set(step.keys)
        elif isinstance(step, WithColumn | Select | Map):
            if step.writes is None:
                return None
            keys -= step.writes
        elif not isinstance(step, Where | TopK):
            return None
        node = input_of(graph, node)


def _disjoint(exchanges: list[KeyPartition | None]) -> bool:
    first = exchanges[0]
    if first is None or any(e is None or not e.same_exchange(first) for e in exchanges):
        return False
    indexes = [e.index for e in exchanges if e is not None]
    return len(set(indexes)) == len(indexes)
