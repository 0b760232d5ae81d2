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

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import networkx as nx

from jetstream.aggregates import AggregateKind
from jetstream.aggtree.cost import KEY_BYTES, Load, accumulator_bytes, rate_text
from jetstream.aggtree.thin import thin_links
from jetstream.aggtree.topology import Site, Topology
from jetstream.approx.levels import Ranking, ranking
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
    #: A worker's share of its site's fragment: key partition (index, count); (0, 1): whole.
    part: tuple[int, int] = (0, 1)
    #: Its link to its parent runs TPUT's rounds (jetstream.approx.rounds): each window's
    #: top rows, then what the parent asks for, instead of every row.
    rounds: bool = False
    #: The bandwidth the plan gives its link to its parent (bit/s), where its sender starts
    #: (jetstream.dataplane.transport); its acks tell it the rest, so a new figure alone is no
    #: new plan.
    uplink_bps: float | None = field(default=None, compare=False)
    #: The degradation level its link to its parent starts at: 0 (exact), or one the SLO's
    #: max_error allows on a link too thin for exact partials (jetstream.aggtree.thin); its
    #: policy moves it from there, so a new figure alone is no new plan.
    level: int = field(default=0, compare=False)

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
    rounds_k: int = 0  # the k of the top-k whose links run TPUT's rounds (0: none do)
    #: Why links into the root that could run TPUT's rounds do not, for ``explain``.
    no_rounds: tuple[str, ...] = ()

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
                 f"{rate_text(self.wan_bytes_per_s)} on the wide area instead of "
                 f"{rate_text(self.raw_bytes_per_s)} of raw records; "
                 f"busiest link at {self.max_utilisation:.0%}"]
        order = list(nx.topological_sort(self.tree)) or [self.topology.root]
        for name in order:
            fragment = self.fragments[name]
            parts = f" over {fragment.partitions} partitions" if fragment.partitions > 1 else ""
            line = f"  {name}: {', '.join(fragment.roles)}{parts}"
            if fragment.parent is not None:
                edge = self.tree.edges[name, fragment.parent]
                link = self.topology.link(name, fragment.parent)
                line += (f" -> {fragment.parent}: {rate_text(edge['bytes_per_s'])} of "
                         f"{rate_text(link.bandwidth_bps / 8)} ({edge['utilisation']:.1%})")
                if fragment.rounds:
                    line += (f"; TPUT rounds: about {edge['rounds_rows']:,.0f} rows a window "
                             f"instead of {edge['exact_rows']:,.0f}")
                if "level" in edge:
                    level = edge["level"]
                    line += (f"; starts at level {level.name!r} (nominal error "
                             f"{level.error_bound:g}): exact partials would need "
                             f"{rate_text(level.exact_bytes_per_s)}")
            lines.append(line)
        if self.rounds_k:
            lines.append(
                f"  TPUT: the exact top {self.rounds_k} takes up to {ROUNDS_EXTRA_TRIPS} more "
                "round trips a window on the links marked, for far fewer rows than every "
                "key; the root coordinates them in one process")
        lines += [f"  no TPUT rounds on {note}" for note in self.no_rounds]
        return "\n".join(lines)


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
    costing = _Costing(
        root=topology.root, own=own, hops=hops, leaves=tuple(leaves),
        # Every choice of parents has the same sites: their order is sorted once, here.
        up=sorted(candidates, key=lambda s: -hops[s]),  # the leaves first
        latency_ms={(s, p): graph.edges[s, p]["latency_ms"] for s in candidates
                    for p in candidates[s]},
        bandwidth_bps={(s, p): graph.edges[s, p]["bandwidth_bps"] for s in candidates
                       for p in candidates[s]},
        row_bytes=row_bytes, every_s=every_s, max_fan_in=max_fan_in)
    parents = _choose(candidates, costing, nearest=lambda s: min(
        candidates[s], key=lambda p: (costing.latency_ms[s, p], p)))
    chosen = costing.of(parents)
    feasible, loads = chosen.key[0] == 0, chosen.loads
    tree = nx.DiGraph()
    tree.add_node(topology.root)
    for child, parent in parents.items():
        if child in loads:
            rate, utilisation = costing.edge(child, parent, loads[child])
            tree.add_edge(child, parent, bytes_per_s=rate, utilisation=utilisation)
    rank = ranking(distributed(query)) if split else None
    rounds, no_rounds = _rounds(query, tree, topology, loads, rank)
    root = topology.root
    for child, rows in rounds.items():  # the rounds' few rows are what the link carries
        link = topology.link(child, root)
        rate = rows * row_bytes / every_s
        tree.edges[child, root].update(bytes_per_s=rate,
                                       utilisation=rate * 8 / link.bandwidth_bps,
                                       rounds_rows=rows, exact_rows=loads[child].keys)
    # A link still too thin for the query (its bandwidth, or the SLO's max_wan_kbps and
    # max_latency) starts degraded, if the SLO's max_error allows a level that fits.
    levels = thin_links(query, tree, topology, aggregate, rank, row_bytes, every_s) \
        if split else {}
    if not feasible and (max((tree.in_degree(n) for n in tree), default=0) > max_fan_in
                         or any(u > 1.0 for *_, u in tree.edges(data="utilisation"))):
        _raise_infeasible(tree, topology, max_fan_in)
    # (A roll-up's coarser keys would not stay in their key partitions: its merges run whole.)
    fragments = _fragments(query.name, tree, topology, sources, loads, every_s,
                           split and not aggregate.rollup,
                           ranked=any(isinstance(op, TopK) for op in ops))
    for child, level in levels.items():
        fragments[child] = dataclasses.replace(fragments[child], level=level.index)
        tree.edges[child, fragments[child].parent].update(level=level)
    if rounds:
        # The links into the root carry TPUT's rounds: the root coordinates them in one
        # process (its workers could not), over the few rows the rounds bring.
        fragments[root] = dataclasses.replace(fragments[root], partitions=1)
        for child in rounds:
            fragments[child] = dataclasses.replace(fragments[child], rounds=True)
    return PhysicalPlan(query, topology, tree, fragments, split, raw, row_bytes,
                        rank.k if rounds and rank else 0, tuple(no_rounds))


#: TPUT ships about this many times k rows a window over a link (its top k, the rows above
#: the threshold, the candidates asked for): what the planner prices its rounds at.
ROUNDS_ROWS_PER_K = 4
#: TPUT is chosen where it ships at most this share of a window's rows: at twice the rows,
#: its extra round trips buy too little.
ROUNDS_SAVING = 2
#: The extra round trips TPUT's rounds take after the first (the threshold, the keys).
ROUNDS_EXTRA_TRIPS = 2


def _rounds(query: Query, tree: nx.DiGraph, topology: Topology, loads: Mapping[str, Load],
            rank: Ranking | None) -> tuple[dict[str, float], list[str]]:
    """The children of the root whose links run TPUT's rounds, each with the rows a window
    is expected to ship then: for an exact top-k by a count or a sum right after the final
    aggregate, where the child's exact partial has ``ROUNDS_SAVING`` times the rows the rounds
    would ship, or more, and the SLO's ``max_latency`` allows two more round trips on the
    link (half of it at most). Also, for the other children, why not."""
    if rank is None:
        return {}, []
    root, out, why_not = topology.root, {}, []
    budget_ms = query.slo.max_latency_ms if query.slo and query.slo.max_latency_ms else None
    for child in sorted(tree.predecessors(root)):
        rows = float(ROUNDS_ROWS_PER_K * rank.k)
        extra_ms = ROUNDS_EXTRA_TRIPS * 2 * topology.link(child, root).latency_ms
        exact = loads[child].keys if child in loads else 0.0
        if exact < ROUNDS_SAVING * rows:
            why_not.append(f"{child} -> {root}: its partials have about {exact:,.0f} rows a "
                           f"window, the rounds would ship about {rows:,.0f}")
        elif budget_ms is not None and extra_ms > budget_ms / 2:
            why_not.append(f"{child} -> {root}: {ROUNDS_EXTRA_TRIPS} more round trips take "
                           f"{extra_ms:,.0f} ms, over half the SLO's max_latency of "
                           f"{budget_ms:,} ms")
        else:
            out[child] = rows
    return out, why_not


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


@dataclass(frozen=True)
class _Costing:
    """What a choice of parents costs: the static facts (every site's own load, the links'
    latencies and bandwidths) and the objective of the module's docstring as a sort key."""

    root: str
    own: Mapping[str, Load]  # what each source site's own records put on its uplink
    hops: Mapping[str, int]  # from the root
    leaves: tuple[str, ...]  # the sites that hold a source
    up: list[str]  # the sites with a parent to choose, the leaves first
    latency_ms: Mapping[tuple[str, str], float]  # (child, candidate parent) -> its link's
    bandwidth_bps: Mapping[tuple[str, str], float]
    row_bytes: int
    every_s: float
    max_fan_in: int

    def edge(self, child: str, parent: str, load: Load) -> tuple[float, float]:
        """Bytes per second ``load`` puts on the link from ``child`` to ``parent``, and that
        link's utilisation."""
        rate = load.bytes_per_s(self.row_bytes, self.every_s)
        return rate, rate * 8 / self.bandwidth_bps[child, parent]

    def key(self, util: float, fan_in: int, slowest: float, total: float
            ) -> tuple[float, float, float, float]:
        # How far from feasible: graded, so that a search can tell it is getting closer.
        overage = max(util - 1.0, 0.0) + max(fan_in - self.max_fan_in, 0)
        return (round(overage, 9), round(max(util, COMFORTABLE_UTILISATION), 9),
                round(slowest, 6), round(total))

    def delay(self, site: str, parents: Mapping[str, str]) -> float:
        """Milliseconds from ``site`` to the root along ``parents``."""
        total = 0.0
        while site != self.root:
            parent = parents[site]
            total += self.latency_ms[site, parent]
            site = parent
        return total

    def of(self, parents: Mapping[str, str]) -> Cost:
        """The cost of ``parents``, computed over the whole tree."""
        loads = _loads(parents, self.own, self.up)
        edges = [self.edge(child, parents[child], load) for child, load in loads.items()]
        fan_in = max(Counter(parents[c] for c in loads).values(), default=0)
        slowest = max((self.delay(s, parents) for s in self.leaves), default=0.0)
        return Cost(self.key(max((u for _, u in edges), default=0.0), fan_in, slowest,
                             sum(r for r, _ in edges)), loads)


@dataclass(frozen=True)
class _Move:
    """One site's parent changed, and what changes with it."""

    site: str
    parent: str
    loads: dict[str, Load | None]  # sites whose load changes -> the new one (None: no load)
    edges: dict[str, tuple[float, float] | None]  # children whose uplink's load changes
    kids: dict[str, set[str]]  # parents whose sending children change -> the new ones
    shift_ms: float  # how much farther from the root the site and the sites below it are
    key: tuple[float, float, float, float]


class _Tree:
    """A choice of parents and what it costs, kept as one site's parent changes at a time:
    only the sites on the old and the new parent's ways to the root are re-costed, so trying
    every site's candidates costs about (sites x depth), not (sites x sites)."""

    def __init__(self, costing: _Costing, parents: Mapping[str, str]) -> None:
        self.costing, self.parents = costing, dict(parents)
        self.loads = _loads(parents, costing.own, costing.up)
        self.edges = {c: costing.edge(c, parents[c], load) for c, load in self.loads.items()}
        self.kids: dict[str, set[str]] = {}  # parent -> its children that send something
        for child in self.loads:
            self.kids.setdefault(parents[child], set()).add(child)
        self.leaf_delay = {s: costing.delay(s, parents) for s in costing.leaves}
        self.total = sum(rate for rate, _ in self.edges.values())
        self._rank()

    def _rank(self) -> None:
        """Sort the links by utilisation and the leaves by delay, so that a move finds the
        largest of those it leaves alone in a few steps."""
        self.by_util = sorted(self.edges, key=lambda c: -self.edges[c][1])
        self.by_delay = sorted(self.leaf_delay, key=lambda s: -self.leaf_delay[s])

    def try_move(self, site: str, parent: str) -> _Move:
        """What giving ``site`` the parent ``parent`` would change and cost."""
        costing, old = self.costing, self.parents[site]
        kids: dict[str, set[str]] = {}
        if site in self.loads:
            kids[old] = self.kids.get(old, set()) - {site}
            kids[parent] = self.kids.get(parent, set()) | {site}
        loads: dict[str, Load | None] = {}
        for a in sorted(set(self._way_up(old)) | set(self._way_up(parent)),
                        key=lambda s: -costing.hops[s]):  # the leaves first
            incoming = [costing.own[a]] if a in costing.own else []
            for k in kids.get(a, self.kids.get(a, ())):  # each sends: its load is not None
                incoming.append(loads.get(k) or self.loads[k])
            load = Load.merged(incoming) if incoming else None
            loads[a] = load
            if (load is None) != (a not in self.loads):  # starts or stops sending
                up = self.parents[a]
                now = kids.get(up, self.kids.get(up, set()))
                kids[up] = now | {a} if load is not None else now - {a}
        edges: dict[str, tuple[float, float] | None] = {
            a: None if load is None else costing.edge(a, self.parents[a], load)
            for a, load in loads.items()}
        if site in self.loads:
            edges[site] = costing.edge(site, parent, self.loads[site])
        shift = (costing.latency_ms[site, parent] + costing.delay(parent, self.parents)
                 - costing.delay(site, self.parents))
        below = self._leaves_below(site)
        util = max([next((self.edges[c][1] for c in self.by_util if c not in edges), 0.0),
                    *(e[1] for e in edges.values() if e is not None)])
        total = (self.total + sum(e[0] for e in edges.values() if e is not None)
                 - sum(self.edges[c][0] for c in edges if c in self.edges))
        fan_in = max((len(kids.get(p, k)) for p, k in self.kids.items()), default=0)
        fan_in = max([fan_in, *map(len, kids.values())])
        slowest = max([next((self.leaf_delay[s] for s in self.by_delay if s not in below), 0.0),
                       *(self.leaf_delay[s] + shift for s in below)])
        key = costing.key(util, fan_in, slowest, total)
        return _Move(site, parent, loads, edges, kids, shift, key)

    def move(self, move: _Move) -> None:
        for leaf in self._leaves_below(move.site):
            self.leaf_delay[leaf] += move.shift_ms
        self.parents[move.site] = move.parent
        for site, load in move.loads.items():
            if load is None:
                self.loads.pop(site, None)
            else:
                self.loads[site] = load
        for child, edge in move.edges.items():
            self.total -= self.edges.pop(child, (0.0, 0.0))[0]
            if edge is not None:
                self.edges[child] = edge
                self.total += edge[0]
        self.kids.update(move.kids)
        self._rank()

    def _way_up(self, site: str) -> list[str]:
        way = []
        while site != self.costing.root:
            way.append(site)
            site = self.parents[site]
        return way

    def _leaves_below(self, site: str) -> set[str]:
        """The source sites whose data passes through ``site`` (itself included)."""
        below, frontier = set(), [site]
        while frontier:
            s = frontier.pop()
            if s in self.leaf_delay:
                below.add(s)
            frontier.extend(self.kids.get(s, ()))
        return below


def _choose(candidates: Mapping[str, list[str]], costing: _Costing,
            nearest: Callable[[str], str]) -> dict[str, str]:
    """The parent of every site: exhaustively when the choices are few, else leaves-up."""
    sites = list(candidates)
    if math.prod(len(c) for c in candidates.values()) <= EXHAUSTIVE_LIMIT:
        options = (dict(zip(sites, choice, strict=True))
                   for choice in itertools.product(*(candidates[s] for s in sites)))
        return min(options, key=lambda parents: costing.of(parents).key)
    tree = _Tree(costing, {s: nearest(s) for s in sites})
    for site in costing.up:  # leaves first: a site's load is known when its turn comes
        if len(candidates[site]) > 1:  # (one candidate: nothing to cost)
            tree.move(min((tree.try_move(site, p) for p in candidates[site]),
                          key=lambda move: move.key))
    return tree.parents


def _raise_infeasible(tree: nx.DiGraph, topology: Topology, max_fan_in: int) -> None:
    for child, parent, data in sorted(tree.edges(data=True), key=lambda e: -e[2]["utilisation"]):
        if data["utilisation"] > 1.0:
            link = topology.link(child, parent)
            msg = (f"link {child}-{parent} is over capacity: the query needs "
                   f"{rate_text(data['bytes_per_s'])} of partials and the link has "
                   f"{rate_text(link.bandwidth_bps / 8)}")
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
        parent = next(iter(tree.successors(name)), None)
        fragments[name] = Fragment(
            query=query,
            site=name,
            sources=tuple(s for s in sources if site.source(s) is not None),
            children=children,
            parent=parent,
            partitions=_partitions(site, incoming_rows, len(children), final and ranked, split),
            final=final,
            uplink_bps=None if parent is None else topology.link(name, parent).bandwidth_bps)
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
