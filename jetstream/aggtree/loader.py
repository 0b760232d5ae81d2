"""Read a topology from YAML, refusing a bad file with the line and the field at fault.

The format (``topologies/README.md`` has the long version)::

    name: cdn-3dc                    # required; letters, digits, '_', '.', '-'
    root: DC3                        # required: the site where final results are made
    standby_roots: [DC2]             # optional: where the root moves if it dies, in order
    sites:                           # required, at least one
      - name: PoP1                   # required, unique
        kind: pop                    # required: pop | edge | datacenter
        servers:                     # required, at least one; names unique within the site
          - {name: pop1-a, cores: 2, memory_gb: 4}
        sources:                     # optional; names unique within the site
          - {name: cdn_logs, events_per_s: 2000, bytes_per_event: 200, distinct_keys: 3000}
        spark_master: local[2]       # optional; default local[N], N = the largest server's cores
        spark_conf: {spark.driver.memory: 2g}  # optional; over the topology's and the defaults
    spark_conf: {spark.sql.shuffle.partitions: 2}  # optional: every site's, under its own
    links:                           # optional for a single site; full duplex
      - {between: [PoP1, DC1], bandwidth: 100mbit, latency: 20ms}

``events_per_s`` (default 1000), ``bytes_per_event`` (200) and ``distinct_keys`` (1000) are
optional. Bandwidths are bits per second in ``tc`` style (``kbit``, ``mbit``, ``gbit``, powers
of 1000; see :mod:`jetstream.units`), latencies whole milliseconds with a unit (``"20ms"``, at
most a day). YAML anchors and merge keys (``<<: *small``) work; lists and mappings nest at
most ``MAX_NESTING`` deep.

Every problem is a :class:`~jetstream.errors.PlacementError` that reads
``FILE:LINE: FIELD.PATH: what is wrong``; the first problem found is reported. The file is
composed into nodes, not loaded, so that every value keeps the line it came from.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Iterable
from typing import Any, NoReturn

import networkx as nx
import yaml
from yaml.constructor import SafeConstructor

from jetstream.aggtree.topology import (
    Link,
    Server,
    Site,
    SiteKind,
    SourceLoad,
    Topology,
    spark_key_problem,
)
from jetstream.errors import PlacementError, PlanError
from jetstream.formats import DEFAULT_FORMAT, FORMATS
from jetstream.units import parse_bandwidth
from jetstream.windows import parse_duration

__all__ = ["load_topology", "parse_topology"]

# Site names become directory names (DIR/<site>/*.csv), process and host names.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_SPARK_MASTER = re.compile(
    r"^(local(\[(\d+|\*)(,\s*\d+)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]"
    r"|yarn|(spark|k8s|mesos)://\S+)$")
_FIELD = re.compile(r"^[A-Za-z0-9_-]+$")
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_KINDS = {kind.value: kind for kind in SiteKind}
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 6x faster on 500 sites
#: Deeper lists and mappings are refused (a topology needs five levels).
MAX_NESTING = 64
#: No wide-area link takes longer than this one way.
MAX_LATENCY_MS = 24 * 3600 * 1000


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """The topology in the YAML file at ``path``.

    Raises
    ------
    PlacementError
        If the file cannot be read or does not describe a valid topology; the message starts
        with ``path:LINE:`` and names the field.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        msg = f"{os.fspath(path)}: cannot read the topology: {e.strerror or e}"
        raise PlacementError(msg) from None
    except UnicodeDecodeError as e:
        msg = f"{os.fspath(path)}: cannot read the topology: not UTF-8 ({e.reason})"
        raise PlacementError(msg) from None
    return parse_topology(text, origin=os.fspath(path))


def parse_topology(text: str, origin: str = "<string>") -> Topology:
    """The topology described by the YAML ``text``; ``origin`` names it in error messages.

    Raises
    ------
    PlacementError
        If the text is not YAML, or breaks a rule of the format: unknown or missing fields,
        wrong types, non-positive capacities or rates, duplicate names or links, links to
        unknown sites or to themselves, an unknown root, or sites that cannot reach the root
        (nor, once it is gone, a standby root).
    """
    reader = _Reader(origin)
    document = reader.compose(text)
    fields = reader.fields(document, "", required=("name", "root", "sites"),
                           optional=("links", "spark_conf", "standby_roots"))
    name = reader.name(fields["name"], "name")
    spark_conf = (_spark_conf(reader, fields["spark_conf"], "spark_conf", "every site")
                  if "spark_conf" in fields else {})

    site_nodes = reader.sequence(fields["sites"], "sites")
    if not site_nodes:
        reader.fail(fields["sites"], "sites", "expected at least one site")
    sites: list[Site] = []
    site_at: dict[str, yaml.Node] = {}  # where each site is defined, for later messages
    for i, node in enumerate(site_nodes):
        site, name_node = _site(reader, node, f"sites[{i}]", spark_conf)
        reader.unique(site_at, site.name, name_node, f"sites[{i}].name", "site")
        site_at[site.name] = node
        sites.append(site)

    declared: dict[str, tuple[str, str]] = {}  # source -> (format, the first site's name)
    for i, site in enumerate(sites):
        for load in site.sources:
            kind = load.format or DEFAULT_FORMAT
            first = declared.setdefault(load.name, (kind, site.name))
            if first[0] != kind:
                reader.fail(site_nodes[i], f"sites[{i}]",
                            f"source {load.name} is {kind} at site {site.name} and {first[0]} "
                            f"at site {first[1]}: a source's files have one format (give "
                            "each format a source of its own)")

    root = reader.string(fields["root"], "root")
    if root not in site_at:
        reader.fail(fields["root"], "root", f"unknown site {root!r}{_did_you_mean(root, site_at)}")

    links: list[Link] = []
    link_at: dict[frozenset[str], yaml.Node] = {}
    link_nodes = reader.sequence(fields["links"], "links") if "links" in fields else []
    for i, node in enumerate(link_nodes):
        link = _link(reader, node, f"links[{i}]", site_at)
        if link.ends in link_at:
            reader.fail(node, f"links[{i}]", f"duplicate link between {link.a} and {link.b} "
                        f"(first at line {_line(link_at[link.ends])})")
        link_at[link.ends] = node
        links.append(link)

    standbys = (_standby_roots(reader, fields["standby_roots"], root, site_at)
                if "standby_roots" in fields else ())
    topology = Topology(name=name, root=root, sites=tuple(sites), links=tuple(links),
                        standby_roots=standbys)
    _check_reaches_root(reader, topology, site_at)
    for i, standby in enumerate(standbys):
        _check_standby(reader, topology, standby, fields["standby_roots"],
                       f"standby_roots[{i}]")
    return topology


def _standby_roots(reader: _Reader, node: yaml.Node, root: str,
                   site_at: dict[str, yaml.Node]) -> tuple[str, ...]:
    names: list[str] = []
    for i, item in enumerate(reader.sequence(node, "standby_roots")):
        path = f"standby_roots[{i}]"
        name = reader.string(item, path)
        if name not in site_at:
            reader.fail(item, path, f"unknown site {name!r}{_did_you_mean(name, site_at)}")
        if name == root:
            reader.fail(item, path, f"{name} is the root; a standby is another site that "
                        "takes over when the root dies")
        if name in names:
            reader.fail(item, path, f"{name} is named twice")
        names.append(name)
    return tuple(names)


def _check_standby(reader: _Reader, topology: Topology, standby: str, node: yaml.Node,
                   path: str) -> None:
    """A standby root must reach every site with sources without the root it stands in
    for: it takes over only when that root is dead."""
    graph = topology.graph()
    graph.remove_node(topology.root)
    reachable = nx.node_connected_component(graph, standby)
    cut_off = [s.name for s in topology.sites
               if s.sources and s.name != topology.root and s.name not in reachable]
    if cut_off:
        reader.fail(node, path, f"standby root {standby} has no path to {', '.join(cut_off)} "
                    f"that avoids the root {topology.root}, so it could not take over; add a "
                    f"link from {cut_off[0]} towards {standby}")


def _site(reader: _Reader, node: yaml.Node, path: str,
          spark_conf: dict[str, str]) -> tuple[Site, yaml.Node]:
    """A site; ``spark_conf`` is the topology's, which the site's own overrides by name."""
    fields = reader.fields(node, path, required=("name", "kind", "servers"),
                           optional=("sources", "spark_master", "spark_conf"))
    name = reader.name(fields["name"], f"{path}.name")
    kind = reader.kind(fields["kind"], f"{path}.kind")
    servers = _servers(reader, fields["servers"], f"{path}.servers", name)
    sources = (_sources(reader, fields["sources"], f"{path}.sources", name)
               if "sources" in fields else ())
    master = None
    if "spark_master" in fields:
        master = reader.string(fields["spark_master"], f"{path}.spark_master")
        if not _SPARK_MASTER.match(master):
            reader.fail(fields["spark_master"], f"{path}.spark_master",
                        f"{master!r} is not a Spark master URL; e.g. 'local[2]', 'local[*]', "
                        "'spark://host:7077', or leave it out for local[N]")
    if "spark_conf" in fields:
        spark_conf = {**spark_conf, **_spark_conf(reader, fields["spark_conf"],
                                                   f"{path}.spark_conf", f"site {name}")}
    site = Site(name=name, kind=kind, servers=servers, sources=sources, spark_master=master,
                spark_conf=tuple(sorted(spark_conf.items())))
    return site, fields["name"]


def _spark_conf(reader: _Reader, node: yaml.Node, path: str, whose: str) -> dict[str, str]:
    """Spark settings by name, each value as the string Spark reads (``true``, not
    ``True``); ``whose`` names them in messages ("site PoP1", "every site")."""
    if not isinstance(node, yaml.MappingNode):
        reader.fail(node, path, f"expected a mapping of Spark settings for {whose}, e.g. "
                    f"{{spark.driver.memory: 2g}}, got {reader.describe(node, path)}")
    settings: dict[str, str] = {}
    for key_node, value_node in reader.entries(node, path):
        key = reader.value(key_node, path)
        if not isinstance(key, str):
            reader.fail(key_node, path, f"{whose}: expected the name of a Spark setting, "
                        f"e.g. spark.driver.memory, got {_show(key)}")
        here = _join(path, key)
        problem = spark_key_problem(key)
        if problem is not None:
            reader.fail(key_node, here, f"{whose}: {problem}")
        value = (reader.value(value_node, here) if isinstance(value_node, yaml.ScalarNode)
                 else value_node)
        if value is None or not isinstance(value, str | int | float | bool):
            reader.fail(value_node, here, f"{whose}: expected a single value for {key}, e.g. "
                        f"a string, a number or true/false, got "
                        f"{reader.describe(value_node, here)}")
        settings[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return settings


def _servers(reader: _Reader, node: yaml.Node, path: str, site: str) -> tuple[Server, ...]:
    nodes = reader.sequence(node, path)
    if not nodes:
        reader.fail(node, path, "expected at least one server to run the site's stage")
    servers: list[Server] = []
    name_at: dict[str, yaml.Node] = {}
    for i, server_node in enumerate(nodes):
        here = f"{path}[{i}]"
        f = reader.fields(server_node, here, required=("name", "cores", "memory_gb"))
        server = Server(name=reader.name(f["name"], f"{here}.name"),
                        cores=reader.positive_int(f["cores"], f"{here}.cores"),
                        memory_gb=reader.positive_number(f["memory_gb"], f"{here}.memory_gb"))
        reader.unique(name_at, server.name, f["name"], f"{here}.name", "server",
                      within=f" in site {site}")
        name_at[server.name] = f["name"]
        servers.append(server)
    return tuple(servers)


def _sources(reader: _Reader, node: yaml.Node, path: str, site: str) -> tuple[SourceLoad, ...]:
    sources: list[SourceLoad] = []
    name_at: dict[str, yaml.Node] = {}
    for i, source_node in enumerate(reader.sequence(node, path)):
        here = f"{path}[{i}]"
        f = reader.fields(source_node, here, required=("name",),
                          optional=("events_per_s", "bytes_per_event", "distinct_keys",
                                    "format"))
        # Only what the file sets: SourceLoad's defaults live in one place, the dataclass.
        load: dict[str, Any] = {}
        if "events_per_s" in f:
            load["events_per_s"] = reader.positive_number(f["events_per_s"],
                                                          f"{here}.events_per_s")
        for field in ("bytes_per_event", "distinct_keys"):
            if field in f:
                load[field] = reader.positive_int(f[field], f"{here}.{field}")
        if "format" in f:
            load["format"] = reader.string(f["format"], f"{here}.format")
            if load["format"] not in FORMATS:
                reader.fail(f["format"], f"{here}.format", f"expected one of "
                            f"{', '.join(FORMATS)}, got {load['format']!r}")
        source = dataclasses.replace(SourceLoad(name=reader.name(f["name"], f"{here}.name")),
                                     **load)
        reader.unique(name_at, source.name, f["name"], f"{here}.name", "source",
                      within=f" in site {site}")
        name_at[source.name] = f["name"]
        sources.append(source)
    return tuple(sources)


def _link(reader: _Reader, node: yaml.Node, path: str, site_at: dict[str, yaml.Node]) -> Link:
    fields = reader.fields(node, path, required=("between", "bandwidth", "latency"))
    between = fields["between"]
    ends = reader.sequence(between, f"{path}.between")
    if len(ends) != 2:
        reader.fail(between, f"{path}.between",
                    f"expected the two sites the link joins, e.g. [PoP1, DC1], got {len(ends)}")
    a, b = (reader.string(end, f"{path}.between[{j}]") for j, end in enumerate(ends))
    for j, end in enumerate((a, b)):
        if end not in site_at:
            reader.fail(ends[j], f"{path}.between[{j}]",
                        f"unknown site {end!r}{_did_you_mean(end, site_at)}")
    if a == b:
        reader.fail(between, f"{path}.between", f"a link from {a} to itself")
    bandwidth = reader.value(fields["bandwidth"], f"{path}.bandwidth")
    try:
        bandwidth_bps = parse_bandwidth(bandwidth, what=f"{path}.bandwidth")
    except PlacementError as e:  # the message starts with the path already
        reader.fail(fields["bandwidth"], "", str(e))
    latency = reader.value(fields["latency"], f"{path}.latency")
    if not isinstance(latency, str):
        reader.fail(fields["latency"], f"{path}.latency",
                    f"expected a duration with a unit, e.g. '20ms', got {_show(latency)}")
    try:
        latency_ms = parse_duration(latency, what=f"{path}.latency")
    except PlanError as e:
        reader.fail(fields["latency"], "", str(e))
    if latency_ms > MAX_LATENCY_MS:
        reader.fail(fields["latency"], f"{path}.latency",
                    "longer than a day; expected a link's latency, e.g. '20ms'")
    return Link(a=a, b=b, bandwidth_bps=bandwidth_bps, latency_ms=float(latency_ms))


def _check_reaches_root(reader: _Reader, topology: Topology,
                        site_at: dict[str, yaml.Node]) -> None:
    reachable = nx.node_connected_component(topology.graph(), topology.root)
    cut_off = [site for site in topology.sites if site.name not in reachable]
    if not cut_off:
        return
    names = ", ".join(site.name for site in cut_off)
    with_sources = [site for site in cut_off if site.sources]
    first = with_sources[0] if with_sources else cut_off[0]
    index = topology.sites.index(first)
    if with_sources:
        problem = (f"{first.name} has sources but no path to the root {topology.root}, so its "
                   f"records could never be merged; cut off from the root: {names}")
    else:
        problem = (f"the topology is not connected: {names} cannot reach the root "
                   f"{topology.root} over any link")
    reader.fail(site_at[first.name], f"sites[{index}]", problem)


class _Reader:
    """Turns YAML nodes into checked values, failing with ``origin:line: path: problem``."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self._constructor = SafeConstructor()

    def fail(self, node: yaml.Node | None, path: str, problem: str, line: int = 1) -> NoReturn:
        where = f"{self.origin}:{_line(node) if node is not None else line}"
        msg = f"{where}: {path}: {problem}" if path else f"{where}: {problem}"
        raise PlacementError(msg)

    def compose(self, text: str) -> yaml.Node:
        try:
            self._within_depth(yaml.parse(text, Loader=_FAST_LOADER))
            document = yaml.compose(text, Loader=_FAST_LOADER)
        except yaml.YAMLError as fast_error:
            # The pure-Python parser says more, and counts characters rather than bytes.
            try:
                self._within_depth(yaml.parse(text, Loader=yaml.SafeLoader))
                yaml.compose(text, Loader=yaml.SafeLoader)
            except yaml.YAMLError as e:
                self._malformed(text, e)
            self._malformed(text, fast_error)
        if document is None:
            self.fail(None, "", "the topology is empty; expected a mapping with name, root, "
                      "sites and links")
        return document

    def _within_depth(self, events: Iterable[yaml.Event]) -> None:
        """Refuse lists and mappings nested deeper than MAX_NESTING before composing them:
        the composers recurse, and libyaml's overflows the C stack (a crash, not an error)."""
        depth = 0
        for event in events:
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_NESTING:
                    line = event.start_mark.line + 1 if event.start_mark else 1
                    self.fail(None, "", f"lists and mappings nested more than {MAX_NESTING} "
                              "deep", line=line)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1

    def _malformed(self, text: str, error: yaml.YAMLError) -> NoReturn:
        line = 1
        problem = str(error).split("\n")[0]
        if isinstance(error, yaml.MarkedYAMLError):
            mark = error.problem_mark or error.context_mark
            line = mark.line + 1 if mark is not None else 1
            problem = ", ".join(p for p in (error.context, error.problem) if p)
        elif isinstance(error, yaml.reader.ReaderError):
            line = text[:error.position].count("\n") + 1
        self.fail(None, "", f"malformed YAML: {problem}", line=line)

    def fields(self, node: yaml.Node, path: str, required: tuple[str, ...],
               optional: tuple[str, ...] = ()) -> dict[str, yaml.Node]:
        """The values of a mapping's fields by name, after checking the names."""
        allowed = required + optional
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, path, f"expected a mapping with fields {', '.join(allowed)}, "
                      f"got {self.describe(node, path)}")
        seen: dict[str, yaml.Node] = {}
        for key, _ in node.value:
            if key.tag == _MERGE:
                continue
            if not (isinstance(key, yaml.ScalarNode) and key.tag == _STR):
                self.fail(key, path, f"expected a field name, got {self.describe(key, path)}")
            if key.value in seen:
                self.fail(key, _join(path, key.value),
                          f"duplicate field (first at line {_line(seen[key.value])})")
            seen[key.value] = key
        try:
            self._constructor.flatten_mapping(node)  # resolve merge keys: '<<: *anchor'
        except yaml.MarkedYAMLError as e:
            self.fail(node, path, f"bad merge key: {e.problem}")
        fields: dict[str, yaml.Node] = {}
        for key, value in node.value:  # own keys come after merged ones, and win
            if not (isinstance(key, yaml.ScalarNode) and key.tag == _STR):  # a merged one
                self.fail(key, path, f"expected a field name, got {self.describe(key, path)}")
            if key.value not in allowed:
                hint = _did_you_mean(key.value, allowed, otherwise=f"; expected one of "
                                                                  f"{', '.join(allowed)}")
                self.fail(key, _join(path, key.value), f"unknown field{hint}")
            fields[key.value] = value
        for field in required:
            if field not in fields:
                self.fail(node, path, f"missing required field '{field}'")
        return fields

    def entries(self, node: yaml.MappingNode, path: str) -> list[tuple[yaml.Node, yaml.Node]]:
        """A mapping's keys and values, merge keys resolved; a key twice is refused."""
        seen: dict[object, yaml.Node] = {}
        for key, _ in node.value:
            if key.tag == _MERGE:
                continue
            if isinstance(key, yaml.ScalarNode) and key.value in seen:
                self.fail(key, _join(path, key.value),
                          f"duplicate entry (first at line {_line(seen[key.value])})")
            seen[key.value if isinstance(key, yaml.ScalarNode) else id(key)] = key
        try:
            self._constructor.flatten_mapping(node)
        except yaml.MarkedYAMLError as e:
            self.fail(node, path, f"bad merge key: {e.problem}")
        return list(node.value)

    def sequence(self, node: yaml.Node, path: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, path, f"expected a list, got {self.describe(node, path)}")
        return list(node.value)

    def value(self, node: yaml.Node, path: str) -> object:
        """The Python value of a scalar; a mapping or a list is refused."""
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, path, f"expected a single value, got {self.describe(node, path)}")
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as e:
            problem = e.problem if isinstance(e, yaml.MarkedYAMLError) else str(e)
            self.fail(node, path, f"cannot read the value: {problem}")
        except (ValueError, TypeError, AttributeError, OverflowError):
            # PyYAML's constructors trust a value's explicit tag: "!!int x" or
            # "!!timestamp soon" fail inside them with a plain Python error.
            self.fail(node, path, f"cannot read {node.value!r:.60} as {node.tag}")

    def describe(self, node: yaml.Node, path: str) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        return _show(self.value(node, path))

    def string(self, node: yaml.Node, path: str) -> str:
        value = self.value(node, path)
        if not isinstance(value, str) or not value:
            quote = (f" (quote it: '{node.value}')"
                     if isinstance(node, yaml.ScalarNode) and node.value else "")
            self.fail(node, path, f"expected a string, got {_show(value)}{quote}")
        return value

    def name(self, node: yaml.Node, path: str) -> str:
        name = self.string(node, path)
        if not _NAME.match(name):
            self.fail(node, path, f"{name!r} is not a valid name; use letters, digits, '_', "
                      "'.' and '-', starting with a letter, digit or '_'")
        return name

    def kind(self, node: yaml.Node, path: str) -> SiteKind:
        value = self.string(node, path)
        if value not in _KINDS:
            self.fail(node, path, f"unknown kind {value!r}; expected one of "
                      f"{', '.join(_KINDS)}{_did_you_mean(value, _KINDS)}")
        return _KINDS[value]

    def positive_int(self, node: yaml.Node, path: str) -> int:
        value = self.value(node, path)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.fail(node, path, f"expected a positive integer, got {_show(value)}")
        return value

    def positive_number(self, node: yaml.Node, path: str) -> float:
        value = self.value(node, path)
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value <= 0):
            self.fail(node, path, f"expected a positive number, got {_show(value)}")
        return float(value)

    def unique(self, seen: dict[str, yaml.Node], name: str, node: yaml.Node, path: str,
               what: str, within: str = "") -> None:
        if name in seen:
            self.fail(node, path, f"duplicate {what} name {name!r}{within} "
                      f"(first at line {_line(seen[name])})")


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _join(path: str, field: str) -> str:
    shown = field if _FIELD.match(field) else repr(field)  # "\r", "", "a b" stay visible
    return f"{path}.{shown}" if path else shown


def _show(value: object) -> str:
    return "nothing" if value is None else repr(value)


def _did_you_mean(word: str, choices: Iterable[str], otherwise: str = "") -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else otherwise
