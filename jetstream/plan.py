"""The logical plan: a networkx DiGraph of operators, and the node that is its output.

Nodes are integers with the operator in the ``op`` attribute; an edge's ``port`` orders a
node's inputs. A plan is never changed after it is built: every change copies the graph.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from jetstream.operators import Operator, Phase, Source, Window, WindowAggregate

__all__ = ["LogicalPlan", "new_node_id"]

_node_ids = itertools.count(1)


def new_node_id() -> int:
    """A node id no plan uses yet."""
    return next(_node_ids)


@dataclass(frozen=True, eq=False)
class LogicalPlan:
    graph: nx.DiGraph
    sink: int

    @classmethod
    def leaf(cls, op: Operator) -> LogicalPlan:
        graph = nx.DiGraph()
        node = new_node_id()
        graph.add_node(node, op=op)
        return cls(graph, node)

    def then(self, op: Operator, *others: LogicalPlan) -> LogicalPlan:
        """A new plan whose output is ``op`` fed by this plan's output, then by ``others``'."""
        graph = nx.compose_all([self.graph, *(o.graph for o in others)])
        node = new_node_id()
        graph.add_node(node, op=op)
        for port, upstream in enumerate([self, *others]):
            graph.add_edge(upstream.sink, node, port=port)
        return LogicalPlan(graph, node)

    def op(self, node: int) -> Operator:
        op: Operator = self.graph.nodes[node]["op"]
        return op

    @property
    def output(self) -> Operator:
        return self.op(self.sink)

    def inputs(self, node: int) -> list[int]:
        """The nodes feeding ``node``, in port order."""
        edges = self.graph.in_edges(node, data="port")
        return [u for u, _, _ in sorted(edges, key=lambda e: e[2])]

    def topological(self) -> list[int]:
        """Every node, inputs before outputs, ties in the order they were created."""
        return list(nx.lexicographical_topological_sort(self.graph))

    def sources(self) -> list[Source]:
        return [op for op in map(self.op, self.topological()) if isinstance(op, Source)]

    def partial_aggregates(self) -> list[int]:
        """The nodes of the partial aggregates (what sites send up the tree), in order."""
        return [n for n in self.topological() if isinstance(op := self.op(n), WindowAggregate)
                and op.phase is Phase.PARTIAL]

    def up_to(self, node: int) -> LogicalPlan:
        """The plan whose output is ``node``: ``node`` and everything that feeds it."""
        nodes = nx.ancestors(self.graph, node) | {node}
        return LogicalPlan(self.graph.subgraph(nodes).copy(), node)

    def upstream(self, node: int) -> Iterable[Operator]:
        """The operators ``node`` reads from, nearest first along the first input."""
        while inputs := self.inputs(node):
            node = inputs[0]
            yield self.op(node)

    def window_of(self, node: int) -> Window | None:
        """The window in force at the output of ``node``, if any."""
        op = self.op(node)
        if isinstance(op, Window):
            return op
        return next((u for u in self.upstream(node) if isinstance(u, Window)), None)

    def aggregate_of(self, node: int) -> WindowAggregate | None:
        """The aggregate whose output reaches ``node``, if ``node`` is after one."""
        op = self.op(node)
        if isinstance(op, WindowAggregate):
            return op
        return next((u for u in self.upstream(node) if isinstance(u, WindowAggregate)), None)

    def render(self, title: str | None = None, *, detail: bool = True) -> str:
        """The plan as text, one operator a line, numbered inputs first.

        ``detail`` adds each operator's properties and each change of schema.
        """
        order = self.topological()
        number = {node: i for i, node in enumerate(order, 1)}
        lines = [title] if title else []
        shown_schema = None
        for node in order:
            op = self.op(node)
            fed_by = ", ".join(f"#{number[u]}" for u in self.inputs(node))
            line = f"  #{number[node]} {op.describe()}"
            if fed_by:
                line += f"  <- {fed_by}"
            if detail:
                line += f"  [{'; '.join(op.properties())}]"
            lines.append(line)
            if detail and op.schema != shown_schema:
                lines.append(f"       -> {op.schema}")
                shown_schema = op.schema
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()
