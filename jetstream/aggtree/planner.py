"""The physical planner: which site runs which part of a query, and the aggregation tree.

Objective, in order: (1) no link over its capacity, (2) the smallest utilisation of the most
loaded link, counting any utilisation up to ``COMFORTABLE_UTILISATION`` as equally good, (3)
the shortest latency from the farthest source to the root, (4) the fewest wide-area bytes per
second in total. So while links have room the tree follows the nearest, fastest paths (as the
JetStream paper's Figure 1 draws it), and as they fill up it spreads the load.

Every site that holds a source of the query runs the local stage (the record steps and the
partial aggregate); its partials travel up an aggregation tree toward the root, merged at each
site on the way; the root runs the final aggregate and the steps after it. A site's parent is
a neighbour one hop closer to the root; the planner picks every site's parent at once when the
choices are few (exhaustively) and otherwise site by site from the leaves up (greedily), with
at most ``max_fan_in`` children per site. Merges (and the root's final step) are spread over
key partitions where one server is too small for the load or the fan-in is large.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import networkx as nx

from jetstream.aggregates import AggregateKind
from jetstream.aggtree.cost import KEY_BYTES, Load, accumulator_bytes
from jetstream.aggtree.topology import Site, Topology
from jetstream.dsl import Query
from jetstream.errors import PlacementError
from jetstream.operators import Phase, Source, TopK, WindowAggregate
from jetstream.rewrite import distributed

__all__ = ["MERGE_ROWS_PER_CORE", "Fragment", "PhysicalPlan", "plan_query"]

#: Partial rows per second one core merges, for sizing key partitions (measured in Python,
#: rounded down; see docs/benchmarks.md).
MERGE_ROWS_PER_CORE = 50_000
#: Above this many children a merge is spread over key partitions when the site can.
SPLIT_FAN_IN = 16
#: Utilisation below this leaves a link enough headroom that latency decides the tree.
COMFORTABLE_UTILISATION = 0.5
#: Exhaustive search over parent choices up to this many combinations.
EXHAUSTIVE_LIMIT = 4096


@dataclass(frozen=True)
class Fragment:
    """What one site runs for one query."""

    query: str
    site: str
    sources: tuple[str, ...] = ()  # the local stage reads these sources, if any
    children: tuple[str, ...] = ()  # sites whose partials it merges
    parent: str | None = None  # where its (merged) partials go; None at the root
    partitions: int = 1  # key partitions its merge or final step is spread over
    final: bool = False  # the root: final aggregate and the steps after it

    @property
    def roles(self) -> list[str]:
        roles = ["local stage"] if self.sources else []
        roles += [f"merge of {len(self.children)}"] if self.children and not self.final else []
        roles += ["final"] if self.final else []
        return roles


@dataclass(frozen=True)
class PhysicalPlan:
    query: Query
    topology: Topology
    tree: nx.DiGraph  # child -> parent, edge attrs: bytes_per_s, utilisation
    fragments: Mapping[str, Fragment]
    split: bool  # whether the aggregate runs as partials and merges
    raw_bytes_per_s: float  # what shipping every record to the root would cost
    row_bytes: int = field(default=0)

    @property
    def wan_bytes_per_s(self) -> float:
        return float(sum(b for _, _, b in self.tree.edges(data="bytes_per_s")))

    @property
    def max_utilisation(self) -> float:
        return max((u for _, _, u in self.tree.edges(data="utilisation")), default=0.0)

    def covers(self, site: str) -> tuple[str, ...]:
        """The source sites whose partials reach the root through ``site`` (itself included)."""
        below = nx.ancestors(self.tree, site) | {site} if site in self.tree else {site}
        return tuple(sorted(s for s in below if s in self.fragments
                            and self.fragments[s].sources))

    def depth(self) -> int:
        root = self.topology.root
        return max((nx.shortest_path_length(self.tree, s, root) for s in self.tree), default=0)

    def render(self) -> str:
        lines = [f"physical plan on {self.topology.name} (root {self.topology.root}): "
                 f"{_rate(self.wan_bytes_per_s)} on the wide area instead of "
                 f"{_rate(self.raw_bytes_per_s)} of raw records; "
                 f"busiest link at {self.max_utilisation:.0%}"]
        order = list(nx.topological_sort(self.tree)) or [self.topology.root]
        for name in order:
            fragment = self.fragments[name]
            parts = f" over {fragment.partitions} partitions" if fragment.partitions > 1 else ""
            line = f"  {name}: {', '.join(fragment.roles)}{parts}"
            if fragment.parent is not None:
                edge = self.tree.edges[name, fragment.parent]
                link = self.topology.link(name, fragment.parent)
                line += (f" -> {fragment.parent}: {_rate(edge['bytes_per_s'])} of "
                         f"{_rate(link.bandwidth_bps / 8)} ({edge['utilisation']:.1%})")
            lines.append(line)
        return "\n".join(lines)


def _rate(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8
    for unit, size in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= size:
            return f"{bits / size:.1f} {unit}"
    return f"{bits:.0f} bit/s"


def plan_query(query: Query, topology: Topology, *, max_fan_in: int = 32) -> PhysicalPlan:
    """Place ``query`` on ``topology``.

    Parameters
    ----------
    query
        The query as the user wrote it; the planner rewrites it first.
    topology
        Sites, servers, sources and links.
    max_fan_in
        The most children one site may merge.

    Returns
    -------
    PhysicalPlan
        The fragment each involved site runs, and the aggregation tree with the expected
        bytes per second and utilisation of every link it uses.

    Raises
    ------
    PlacementError
        If no site holds one of the query's sources, a source cannot reach the root, a site would
        exceed ``max_fan_in``, or a link or a site would be over capacity; the message names
        the link or site.
    """
    plan = distributed(query).plan()  # split as the sites will run it
    ops = [plan.op(n) for n in plan.topological()]
    sources = sorted({op.name for op in ops if isinstance(op, Source)})
    aggregate = next(op for op in ops if isinstance(op, WindowAggregate))
    split = aggregate.phase is Phase.PARTIAL
    window = plan.window_of(next(n for n in plan.topological()
                                 if isinstance(plan.op(n), WindowAggregate)))
    assert window is not None, "the DSL windows every aggregate"
    window_s, every_s = window.spec.size_ms / 1000, window.spec.every_ms / 1000
    # A holistic aggregate's partial carries its values (every one, or every distinct one):
    # bytes with each record, not with each row.
    holistic = sum(agg.kind is AggregateKind.HOLISTIC for _, agg in aggregate.aggregates)
    row_bytes = KEY_BYTES * len(aggregate.keys) + sum(
        accumulator_bytes(agg) for _, agg in aggregate.aggregates
        if agg.kind is not AggregateKind.HOLISTIC) if split else 0

    missing = [name for name in sources if not topology.sites_with(name)]
    if missing:  # even one: its records would be silently left out of every window
        msg = (f"query {query.name}: no site of {topology.name} holds source "
               f"{', '.join(missing)}; list it under a site's sources")
        raise PlacementError(msg)
    leaves = {site.name: site for name in sources for site in topology.sites_with(name)}
    own = {name: Load.merged(Load.of_source(load, window_s, split, bool(aggregate.keys),
                                            values=holistic)
                             for load in site.sources if load.name in sources)
           for name, site in leaves.items()}
    raw = sum(load.events_per_s * load.bytes_per_event
              for site in leaves.values() for load in site.sources if load.name in sources)

    graph = topology.graph()
    if topology.root not in graph:
        msg = f"the root site {topology.root} is not available"
        raise PlacementError(msg)
    hops = nx.single_source_shortest_path_length(graph, topology.root)
    unreachable = sorted(set(leaves) - set(hops))
    if unreachable:
        msg = f"site {unreachable[0]} holds a source but has no path to the root {topology.root}"
        raise PlacementError(msg)
    candidates = {s: sorted(n for n in graph.neighbors(s) if hops[n] == hops[s] - 1)
                  for s in _on_the_way(graph, hops, leaves)}
    # Every choice of parents has the same sites: their orders are sorted once, here.
    down = sorted(candidates, key=lambda s: hops[s])  # the root's neighbours first
    up = sorted(candidates, key=lambda s: -hops[s])  # the leaves first

    def cost(parents: Mapping[str, str]) -> Cost:
        loads = _loads(parents, own, up)
        util = total = 0.0
        delay: dict[str, float] = {topology.root: 0.0}
        for child in down:
            parent = parents[child]
            delay[child] = delay.get(parent, 0.0) + graph.edges[child, parent]["latency_ms"]
            if child in loads:
                rate = loads[child].bytes_per_s(row_bytes, every_s)
                util = max(util, rate * 8 / graph.edges[child, parent]["bandwidth_bps"])
                total += rate
        fan_in = max(Counter(p for c, p in parents.items() if c in loads).values(), default=0)
        # How far from feasible: graded, so that a search can tell it is getting closer.
        overage = max(util - 1.0, 0.0) + max(fan_in - max_fan_in, 0)
        slowest = max((delay[s] for s in leaves if s in delay), default=0.0)
        key = (round(overage, 9), round(max(util, COMFORTABLE_UTILISATION), 9), slowest,
               round(total))
        return Cost(key, loads)

    parents = _choose(candidates, cost, nearest=lambda s: min(
        candidates[s], key=lambda p: (graph.edges[s, p]["latency_ms"], p)))
    chosen = cost(parents)
    feasible, loads = chosen.key[0] == 0, chosen.loads
    tree = nx.DiGraph()
    tree.add_node(topology.root)
    for child, parent in parents.items():
        if child in loads:
            rate = loads[child].bytes_per_s(row_bytes, every_s)
            link = topology.link(child, parent)
            tree.add_edge(child, parent, bytes_per_s=rate,
                          utilisation=rate * 8 / link.bandwidth_bps)
    if not feasible:
        _raise_infeasible(tree, topology, max_fan_in)
    fragments = _fragments(query.name, tree, topology, sources, loads, every_s, split,
                           ranked=any(isinstance(op, TopK) for op in ops))
    return PhysicalPlan(query, topology, tree, fragments, split, raw, row_bytes)


def _on_the_way(graph: nx.Graph, hops: Mapping[str, int], leaves: Mapping[str, Site]
                ) -> list[str]:
    """Every non-root site that some leaf's data could pass through on its way up."""
    seen, frontier = set(leaves), list(leaves)
    while frontier:
        site = frontier.pop()
        for n in graph.neighbors(site):
            if hops[n] == hops[site] - 1 and n not in seen:
                seen.add(n)
                frontier.append(n)
    return sorted((s for s in seen if hops[s] > 0), key=lambda s: (-hops[s], s))


def _loads(parents: Mapping[str, str], own: Mapping[str, Load], up: list[str]
           ) -> dict[str, Load]:
    """What each site sends up, from the leaves toward the root (``up``: the sites in that
    order)."""
    incoming: dict[str, list[Load]] = {s: [load] for s, load in own.items()}
    out: dict[str, Load] = {}
    for site in up:
        if site in incoming:
            out[site] = Load.merged(incoming[site])
            incoming.setdefault(parents[site], []).append(out[site])
    return out


@dataclass(frozen=True)
class Cost:
    key: tuple[float, float, float, float]  # smaller is better; key[0] > 0: infeasible
    loads: dict[str, Load]


def _choose(candidates: Mapping[str, list[str]], cost: Callable[[Mapping[str, str]], Cost],
            nearest: Callable[[str], str]) -> dict[str, str]:
    """The parent of every site: exhaustively when the choices are few, else leaves-up."""

    def key(parents: dict[str, str]) -> tuple[float, float, float, float]:
        return cost(parents).key

    sites = list(candidates)
    if math.prod(len(c) for c in candidates.values()) <= EXHAUSTIVE_LIMIT:
        options = (dict(zip(sites, choice, strict=True))
                   for choice in itertools.product(*(candidates[s] for s in sites)))
        return min(options, key=key)
    parents = {s: nearest(s) for s in sites}
    for site in sites:  # leaves first: a site's load is known when its turn comes
        if len(candidates[site]) > 1:  # (one candidate: nothing to cost)
            parents[site] = min(candidates[site], key=lambda p: key({**parents, site: p}))
    return parents


def _raise_infeasible(tree: nx.DiGraph, topology: Topology, max_fan_in: int) -> None:
    for child, parent, data in sorted(tree.edges(data=True), key=lambda e: -e[2]["utilisation"]):
        if data["utilisation"] > 1.0:
            link = topology.link(child, parent)
            msg = (f"link {child}-{parent} is over capacity: the query needs "
                   f"{_rate(data['bytes_per_s'])} of partials and the link has "
                   f"{_rate(link.bandwidth_bps / 8)}")
            raise PlacementError(msg)
    busiest = max(tree.nodes, key=tree.in_degree)
    msg = (f"site {busiest} would merge {tree.in_degree(busiest)} children, more than the "
           f"fan-in limit of {max_fan_in}")
    raise PlacementError(msg)


def _fragments(query: str, tree: nx.DiGraph, topology: Topology, sources: list[str],
               loads: Mapping[str, Load], every_s: float, split: bool, ranked: bool
               ) -> dict[str, Fragment]:
    fragments = {}
    for name in tree.nodes:
        site = topology.site(name)
        children = tuple(sorted(tree.predecessors(name)))
        final = name == topology.root
        incoming_rows = sum(loads[c].keys for c in children) / every_s if children else 0.0
        fragments[name] = Fragment(
            query=query,
            site=name,
            sources=tuple(s for s in sources if site.source(s) is not None),
            children=children,
            parent=next(iter(tree.successors(name)), None),
            partitions=_partitions(site, incoming_rows, len(children), final and ranked, split),
            final=final)
    return fragments


def _partitions(site: Site, rows_per_s: float, fan_in: int, split_top_k: bool,
                split: bool) -> int:
    """How many key partitions a site's merge runs on; raises if its servers cannot keep up."""
    if not split or not site.servers:
        return 1
    per_server = site.largest_server_cores * MERGE_ROWS_PER_CORE
    needed = math.ceil(rows_per_s / per_server) if per_server else len(site.servers) + 1
    if needed > len(site.servers):
        msg = (f"site {site.name} is over capacity: merging {rows_per_s:,.0f} partial rows/s "
               f"needs {needed} servers of {site.largest_server_cores} cores, it has "
               f"{len(site.servers)}")
        raise PlacementError(msg)
    wanted = needed
    if fan_in > SPLIT_FAN_IN or split_top_k:  # spread a wide merge or the final top-k
        wanted = len(site.servers)
    return max(1, min(wanted, len(site.servers)))
