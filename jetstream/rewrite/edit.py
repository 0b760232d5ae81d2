"""Small edits of a logical plan's graph, shared by the rules.

The rules copy a plan's graph once on entry and edit the copy with these functions; operators
themselves are frozen and replaced whole. Edges carry a ``port`` that orders a node's inputs.
"""

from __future__ import annotations

import networkx as nx

from jetstream.errors import RewriteError
from jetstream.operators import Operator
from jetstream.plan import LogicalPlan, new_node_id

__all__ = ["add", "bypass", "consumers", "input_of", "insert_above", "insert_below", "op",
           "plan_of", "replace"]


def op(graph: nx.DiGraph, node: int) -> Operator:
    operator: Operator = graph.nodes[node]["op"]
    return operator


def add(graph: nx.DiGraph, operator: Operator) -> int:
    node = new_node_id()
    graph.add_node(node, op=operator)
    return node


def replace(graph: nx.DiGraph, node: int, operator: Operator) -> None:
    graph.nodes[node]["op"] = operator


def input_of(graph: nx.DiGraph, node: int, port: int = 0) -> int:
    for u, _, p in graph.in_edges(node, data="port"):
        if p == port:
            return int(u)
    msg = f"node {node} has no input on port {port}"
    raise RewriteError(msg)


def consumers(graph: nx.DiGraph, node: int) -> list[tuple[int, int]]:
    """(consumer, port) for every edge out of ``node``."""
    return [(v, p) for _, v, p in graph.out_edges(node, data="port")]


def insert_below(graph: nx.DiGraph, node: int, port: int, operator: Operator) -> int:
    """A new node between ``node`` and its input on ``port``."""
    upstream = input_of(graph, node, port)
    graph.remove_edge(upstream, node)
    new = add(graph, operator)
    graph.add_edge(upstream, new, port=0)
    graph.add_edge(new, node, port=port)
    return new


def insert_above(graph: nx.DiGraph, node: int, operator: Operator) -> int:
    """A new node between ``node`` and all of its consumers."""
    new = add(graph, operator)
    for consumer, port in consumers(graph, node):
        graph.remove_edge(node, consumer)
        graph.add_edge(new, consumer, port=port)
    graph.add_edge(node, new, port=0)
    return new


def bypass(graph: nx.DiGraph, node: int) -> None:
    """Remove a one-input node, connecting its input straight to its consumers."""
    upstream = input_of(graph, node)
    for consumer, port in consumers(graph, node):
        graph.add_edge(upstream, consumer, port=port)
    graph.remove_node(node)


def plan_of(graph: nx.DiGraph) -> LogicalPlan:
    """The plan whose output is the graph's one node without consumers."""
    sinks = [n for n in graph if graph.out_degree(n) == 0]
    if len(sinks) != 1:
        msg = f"a plan has one output, this graph has {len(sinks)}"
        raise RewriteError(msg)
    return LogicalPlan(graph, sinks[0])
