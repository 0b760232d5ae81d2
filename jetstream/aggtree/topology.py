"""The topology model: sites, their servers and sources, and the wide-area links between them.

A topology is read from YAML by :mod:`jetstream.aggtree.loader`; this module only holds the
validated, frozen result and the networkx view the planner works on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import networkx as nx

from jetstream.errors import PlacementError

__all__ = ["Link", "Server", "Site", "SiteKind", "SourceLoad", "Topology", "spark_key_problem"]


def spark_key_problem(key: str) -> str | None:
    """What is wrong with ``key`` as the name of a site's Spark setting; None if nothing.

    A setting names a Spark property (``spark.driver.memory``); the master has a field of
    its own (``spark_master``, ``--spark-master``), so that there is one place to look.
    """
    if key == "spark.master":
        return "the master is not a setting: use spark_master (or --spark-master)"
    if (not key.startswith("spark.") or key == "spark." or "=" in key
            or any(c.isspace() for c in key)):
        return (f"{key!r} is not a Spark setting; its name starts with 'spark.' and holds "
                "no space or '=', e.g. spark.driver.memory")
    return None


class SiteKind(enum.Enum):
    POP = "pop"  # a point of presence: where data is born, small servers
    EDGE = "edge"  # another name for a site at the edge of the network
    DATACENTER = "datacenter"  # where aggregation can run on bigger servers

    @property
    def at_edge(self) -> bool:
        return self is not SiteKind.DATACENTER


@dataclass(frozen=True)
class Server:
    name: str
    cores: int
    memory_gb: float


@dataclass(frozen=True)
class SourceLoad:
    """A source that lives at a site, with the load the planner should expect from it.

    ``distinct_keys`` is how many group keys a window of this source typically holds, which
    bounds the size of its partial aggregates. ``format`` is its files'
    (:mod:`jetstream.formats`); None: as the query's source names it, else CSV.
    """

    name: str
    events_per_s: float = 1000.0
    bytes_per_event: int = 200
    distinct_keys: int = 1000
    format: str | None = None


@dataclass(frozen=True)
class Site:
    name: str
    kind: SiteKind
    servers: tuple[Server, ...]
    sources: tuple[SourceLoad, ...] = ()
    #: The Spark master for the site's local stage; None means ``local[N]`` with N cores.
    spark_master: str | None = None
    #: Spark settings for the site's session, by name, over the runtime's defaults;
    #: pairs (sorted by name) rather than a dict, so that a site stays hashable.
    spark_conf: tuple[tuple[str, str], ...] = ()

    @property
    def cores(self) -> int:
        return sum(s.cores for s in self.servers)

    @property
    def largest_server_cores(self) -> int:
        return max((s.cores for s in self.servers), default=0)

    @property
    def master(self) -> str:
        return self.spark_master or f"local[{max(self.largest_server_cores, 1)}]"

    def source(self, name: str) -> SourceLoad | None:
        return next((s for s in self.sources if s.name == name), None)


@dataclass(frozen=True)
class Link:
    """A full-duplex wide-area link: ``bandwidth_bps`` in each direction."""

    a: str
    b: str
    bandwidth_bps: float
    latency_ms: float

    @property
    def ends(self) -> frozenset[str]:
        return frozenset((self.a, self.b))


@dataclass(frozen=True)
class Topology:
    name: str
    root: str
    sites: tuple[Site, ...]
    links: tuple[Link, ...]
    #: Sites that take the root's place, in this order, when the root is dead.
    standby_roots: tuple[str, ...] = ()
    _by_name: dict[str, Site] = field(init=False, repr=False, compare=False)
    _by_ends: dict[frozenset[str], Link] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {s.name: s for s in self.sites})
        by_ends: dict[frozenset[str], Link] = {}
        for link in self.links:
            by_ends.setdefault(link.ends, link)
        object.__setattr__(self, "_by_ends", by_ends)

    def site(self, name: str) -> Site:
        try:
            return self._by_name[name]
        except KeyError:
            msg = f"topology {self.name}: no site named {name!r}"
            raise PlacementError(msg) from None

    def link(self, a: str, b: str) -> Link:
        link = self._by_ends.get(frozenset((a, b)))
        if link is not None:
            return link
        msg = f"topology {self.name}: no link between {a} and {b}"
        raise PlacementError(msg)

    def graph(self) -> nx.Graph:
        """Sites as nodes (attribute ``site``), links as edges (``link``, ``bandwidth_bps``,
        ``latency_ms``)."""
        graph = nx.Graph()
        for site in self.sites:
            graph.add_node(site.name, site=site)
        for link in self.links:
            graph.add_edge(link.a, link.b, link=link, bandwidth_bps=link.bandwidth_bps,
                           latency_ms=link.latency_ms)
        return graph

    def sites_with(self, source: str) -> list[Site]:
        """The sites where records of ``source`` are born."""
        return [s for s in self.sites if s.source(source) is not None]

    def source_format(self, source: str) -> str | None:
        """The format the sites declare for ``source``'s files (the loader checks they
        agree), or None where none does."""
        return next((load.format for site in self.sites if (load := site.source(source))
                     and load.format), None)
