"""Topologies: the YAML format, its validation messages, the shipped files and the generator."""

from __future__ import annotations

import re
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.aggtree.generate import generate_topology, generated_file, to_yaml
from jetstream.aggtree.loader import load_topology, parse_topology
from jetstream.aggtree.topology import Link, Server, Site, SiteKind, SourceLoad, Topology
from jetstream.errors import PlacementError
from jetstream.units import format_bandwidth, parse_bandwidth

TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"
MBIT = 1e6


# --- the shipped topologies ---------------------------------------------------------------


def test_local_3dc_is_three_small_sites_on_fast_links() -> None:
    t = load_topology(TOPOLOGIES / "local-3dc.yaml")
    assert t.name == "local-3dc"
    assert [s.name for s in t.sites] == ["ams", "sfo", "sin"]
    assert t.root == "ams"
    assert all(s.kind is SiteKind.DATACENTER for s in t.sites)
    # Named after the sample logs, so `--input examples/logs` feeds every site.
    sample = TOPOLOGIES.parent / "examples" / "logs"
    assert sorted(p.name for p in sample.iterdir()) == ["ams", "sfo", "sin"]
    assert [s.name for s in t.sites_with("cdn_logs")] == ["ams", "sfo", "sin"]
    assert all(1 <= server.cores <= 2 for s in t.sites for server in s.servers)
    assert [s.name for s in t.site("ams").servers] == ["ams-1", "ams-2"]
    assert t.site("ams").master == "local[2]"  # set in the file
    assert t.site("sfo").spark_master is None
    assert t.site("sfo").master == "local[2]"  # the default: local[cores of the largest server]
    assert {link.ends for link in t.links} == {frozenset({"ams", "sfo"}),
                                              frozenset({"ams", "sin"})}
    assert all(link.bandwidth_bps == 1e9 and link.latency_ms == 1 for link in t.links)


def test_cdn_3dc_is_figure_1_of_the_paper() -> None:
    t = load_topology(TOPOLOGIES / "cdn-3dc.yaml")
    pops = [f"PoP{i}" for i in range(1, 7)]
    assert [s.name for s in t.sites] == [*pops, "DC1", "DC2", "DC3"]
    assert t.root == "DC3"
    assert all(t.site(p).kind is SiteKind.POP for p in pops)
    assert all(t.site(d).kind is SiteKind.DATACENTER for d in ("DC1", "DC2", "DC3"))
    # CDN logs are born at the PoPs, and only there.
    assert [s.name for s in t.sites_with("cdn_logs")] == pops
    assert all(not t.site(d).sources for d in ("DC1", "DC2", "DC3"))
    assert len(t.site("DC3").servers) >= 2  # the final top-k can be split
    assert t.site("DC2").largest_server_cores < t.site("DC1").largest_server_cores
    assert all(s.spark_master is None for s in t.sites)
    assert t.site("DC1").master == "local[8]"
    assert t.site("DC2").master == "local[4]"
    # Each PoP reaches both DC1 and DC2; its nearest is the fatter link too, and choosing
    # nearest draws the paper's tree: PoP1-3 to DC1, PoP4-6 to DC2, both to DC3.
    for pop in pops:
        near, far = sorted((t.link(pop, dc) for dc in ("DC1", "DC2")),
                           key=lambda link: link.latency_ms)
        assert near.bandwidth_bps > far.bandwidth_bps
        assert (near.ends - {pop}) == ({"DC1"} if pop in pops[:3] else {"DC2"})
        assert 10 * MBIT <= near.bandwidth_bps <= 100 * MBIT
    assert 1 * MBIT <= t.link("DC1", "DC3").bandwidth_bps <= 100 * MBIT
    assert t.link("DC2", "DC3").bandwidth_bps < t.link("DC1", "DC3").bandwidth_bps
    assert not any(link.ends == {"DC1", "DC2"} for link in t.links)
    # Raw logs behind DC1 outgrow its link to the root: the point of aggregating at the edge.
    raw_bps = sum(s.sources[0].events_per_s * s.sources[0].bytes_per_event * 8
                  for s in map(t.site, pops[:3]))
    assert raw_bps > t.link("DC1", "DC3").bandwidth_bps


def test_large_500_is_exactly_what_the_generator_writes() -> None:
    shipped = (TOPOLOGIES / "large-500.yaml").read_text()
    assert shipped == generated_file(pops=480, regions=16, continents=3, seed=2014,
                                     name="large-500")
    assert "python -m jetstream.aggtree.generate --pops 480" in shipped.splitlines()[1]


def test_large_500_loads() -> None:
    t = load_topology(TOPOLOGIES / "large-500.yaml")
    assert t == generate_topology(480, 16, 3, seed=2014, name="large-500")
    assert (t.name, t.root, len(t.sites)) == ("large-500", "core", 500)
    kinds = [s.kind for s in t.sites]
    assert kinds.count(SiteKind.POP) == 480
    assert len(t.sites_with("cdn_logs")) == 480
    assert nx.is_connected(t.graph())


def test_every_shipped_file_is_a_fixed_point_of_the_writer() -> None:
    for path in sorted(TOPOLOGIES.glob("*.yaml")):
        t = load_topology(path)
        assert parse_topology(to_yaml(t), origin=path.name) == t, path.name


# --- the generator ------------------------------------------------------------------------


def test_generator_builds_the_four_tiers() -> None:
    t = generate_topology(pops=12, regions=4, continents=2, seed=7)
    graph = t.graph()
    assert t.name == "generated-19" and t.root == "core"
    tier = {s.name: s.name.rstrip("0123456789") for s in t.sites}
    assert sorted(tier.values()) == ["cont"] * 2 + ["core"] + ["pop"] * 12 + ["region"] * 4
    assert set(graph["core"]) == {"cont1", "cont2"}
    for site in t.sites:
        uplinks = {tier[n] for n in graph[site.name]} - {"pop"}
        if tier[site.name] == "pop":
            assert uplinks == {"region"}
            assert [s.name for s in site.sources] == ["cdn_logs"]
            assert site.kind is SiteKind.POP
        else:
            assert not site.sources and site.kind is SiteKind.DATACENTER
    # Spread evenly and in order: three PoPs per region, two regions per continent.
    assert [n for n in graph["region1"] if tier[n] == "pop"][:3] == ["pop01", "pop02", "pop03"]
    assert set(graph["cont1"]) == {"core", "region1", "region2"}


def test_generator_is_deterministic_and_gives_the_planner_a_choice() -> None:
    one = generate_topology(60, 6, 2, seed=1)
    assert one == generate_topology(60, 6, 2, seed=1)
    assert one != generate_topology(60, 6, 2, seed=2)
    # Some PoPs have a backup link to a second region, so the graph is not a tree.
    assert len(one.links) > len(one.sites) - 1


def test_generator_scales_to_a_thousand_sites() -> None:
    t = generate_topology(pops=940, regions=50, continents=9, seed=3)
    assert len(t.sites) == 1000
    assert nx.is_connected(t.graph())
    assert parse_topology(to_yaml(t)) == t


@pytest.mark.parametrize(("pops", "regions", "continents"), [(2, 3, 1), (5, 2, 3), (1, 1, 0)])
def test_generator_refuses_tiers_out_of_order(pops: int, regions: int, continents: int) -> None:
    with pytest.raises(PlacementError, match="pops >= regions >= continents >= 1"):
        generate_topology(pops, regions, continents, seed=0)


@settings(max_examples=40, deadline=None)
@given(pops=st.integers(1, 25), data=st.data(), seed=st.integers(0, 2**32))
def test_generated_topologies_round_trip(pops: int, data: st.DataObject, seed: int) -> None:
    regions = data.draw(st.integers(1, pops))
    continents = data.draw(st.integers(1, regions))
    t = generate_topology(pops, regions, continents, seed)
    text = to_yaml(t)
    assert parse_topology(text) == t
    assert to_yaml(parse_topology(text)) == text


# Names YAML would read as something else unless the writer quotes them.
TRICKY_NAMES = ["true", "no", "Off", "null", "NULL", "1", "0x1F", "0o17", "1_000", "1.5", "1e3",
                "_", "a.b", "x-1"]
names = st.one_of(st.sampled_from(TRICKY_NAMES),
                  st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,6}", fullmatch=True))
positive = st.one_of(st.floats(min_value=1e-6, max_value=1e15, allow_subnormal=False),
                     st.integers(1, 10**6).map(float))
counts = st.integers(1, 10**9)


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    site_names = draw(st.lists(names, min_size=1, max_size=6, unique=True))
    sites = []
    for name in site_names:
        server_names = draw(st.lists(names, min_size=1, max_size=3, unique=True))
        source_names = draw(st.lists(names, max_size=2, unique=True))
        sites.append(Site(
            name, draw(st.sampled_from(SiteKind)),
            tuple(Server(s, draw(st.integers(1, 256)), draw(positive)) for s in server_names),
            tuple(SourceLoad(s, draw(positive), draw(counts), draw(counts))
                  for s in source_names),
            spark_master=draw(st.none() | st.sampled_from(
                ["local", "local[3]", "local[*]", "local[2,4]", "spark://host-1:7077",
                 "yarn"])),
            spark_conf=draw(st.sampled_from(
                [(), (("spark.driver.memory", "2g"),),
                 (("spark.sql.adaptive.enabled", "true"), ("spark.x", "1"), ("spark.y", ""))]))))
    # A spanning tree (each site to an earlier one), then a few more links.
    pairs = [(draw(st.integers(0, i - 1)), i) for i in range(1, len(sites))]
    others = [(i, j) for i in range(len(sites)) for j in range(i + 1, len(sites))
              if (i, j) not in pairs]
    pairs += draw(st.lists(st.sampled_from(others), unique=True)) if others else []
    links = []
    for i, j in pairs:
        a, b = (site_names[i], site_names[j])[:: draw(st.sampled_from([1, -1]))]
        bandwidth = draw(st.one_of(positive, st.integers(1, 999).map(lambda n: n * 1e9)))
        links.append(Link(a, b, bandwidth, float(draw(st.integers(0, 10**7)))))
    return Topology(draw(names), draw(st.sampled_from(site_names)), tuple(sites), tuple(links))


@settings(max_examples=60, deadline=None)
@given(topologies())
def test_any_valid_topology_round_trips(t: Topology) -> None:
    assert parse_topology(to_yaml(t)) == t


def test_writer_refuses_a_latency_the_format_cannot_hold() -> None:
    t = generate_topology(1, 1, 1, seed=0)
    half = Topology(t.name, t.root, t.sites, (Link("pop1", "region1", 1e6, 0.5), *t.links[1:]))
    with pytest.raises(PlacementError, match="whole milliseconds"):
        to_yaml(half)


# --- bandwidth and latency ----------------------------------------------------------------


@pytest.mark.parametrize(("text", "bps"), [
    ("1bit", 1), ("512kbit", 512e3), ("100mbit", 100e6), ("100MBit", 100e6), ("1.5gbit", 1.5e9),
    ("2tbit", 2e12), (" 10 mbit ", 10e6), ("0.5kbit", 500), ("12.5bit", 12.5),
])
def test_bandwidths_are_bits_per_second_with_decimal_units(text: str, bps: float) -> None:
    assert parse_bandwidth(text) == bps


@pytest.mark.parametrize(("value", "message"), [
    (100, "bw: 100 has no unit; write the rate in bits per second, e.g. '100mbit'"),
    ("100", "bw: '100' has no unit"),
    (1.5, "bw: 1.5 has no unit"),
    (True, "bw: True has no unit"),
    ("100mbps", "bw: '100mbps' is ambiguous: tc reads 'mbps' as bytes per second, most people "
                "as bits; write '100mbit' for bits, or '800mbit' if you meant bytes"),
    ("8kbps", "write '8kbit' for bits, or '64kbit' if you meant bytes"),
    ("1Gbps", "is ambiguous"),
    ("10bps", "write '10bit' for bits, or '80bit' if you meant bytes"),
    ("10mb/s", "is ambiguous"),
    ("10mib", "bw: unknown unit 'mib' in '10mib'; use one of bit, kbit, mbit, gbit, tbit"),
    ("fast", "bw: 'fast' is not a bandwidth"),
    ("-5mbit", "bw: '-5mbit' is not a bandwidth"),
    ("1e3mbit", "is not a bandwidth"),
    ("0mbit", "bw: expected a positive bandwidth, got '0mbit'"),
    (None, "bw: None is not a bandwidth"),
])
def test_bandwidths_refused(value: object, message: str) -> None:
    with pytest.raises(PlacementError) as info:
        parse_bandwidth(value, what="bw")
    assert message in str(info.value)


@pytest.mark.parametrize(("bps", "text"), [
    (100e6, "100mbit"), (1.5e6, "1500kbit"), (1e9, "1gbit"), (12.5, "12.5bit"), (3e12, "3tbit"),
    (1234, "1234bit"), (0.001, "0.001bit"),
])
def test_bandwidths_are_written_in_the_largest_exact_unit(bps: float, text: str) -> None:
    assert format_bandwidth(bps) == text
    assert parse_bandwidth(text) == bps


@given(st.floats(min_value=0, exclude_min=True, allow_infinity=False))
def test_every_positive_bandwidth_reads_back_exactly(bps: float) -> None:
    assert parse_bandwidth(format_bandwidth(bps)) == bps


@pytest.mark.parametrize("bps", [0.0, -1.0, float("inf"), float("nan")])
def test_writing_an_impossible_bandwidth_is_refused(bps: float) -> None:
    with pytest.raises(PlacementError, match="positive, finite"):
        format_bandwidth(bps)


@pytest.mark.parametrize(("text", "ms"), [("20ms", 20), ("1s", 1000), ("0ms", 0),
                                          ("1.5s", 1500), ("2m", 120_000)])
def test_latencies_are_durations(text: str, ms: float) -> None:
    t = parse_topology(BASE.replace("latency: 20ms", f"latency: {text}"))
    assert t.link("PoP1", "DC1").latency_ms == ms


# --- validation: every message names the file, the line and the field ---------------------

BASE = """\
# The base of the error cases: each case edits a line or two.
name: tiny
root: DC3
sites:
  - name: PoP1
    kind: pop
    servers:
      - {name: pop1-a, cores: 2, memory_gb: 4}
    sources:
      - {name: cdn_logs, events_per_s: 2000, bytes_per_event: 200, distinct_keys: 3000}
  - name: DC1
    kind: datacenter
    servers:
      - {name: dc1-a, cores: 8, memory_gb: 32}
      - {name: dc1-b, cores: 8, memory_gb: 32}
  - name: DC3
    kind: datacenter
    servers:
      - {name: dc3-a, cores: 8, memory_gb: 32}
links:
  - {between: [PoP1, DC1], bandwidth: 50mbit, latency: 20ms}
  - {between: [DC1, DC3], bandwidth: 10mbit, latency: 60ms}
"""


def edit(edits: dict[int, str]) -> str:
    """BASE with lines replaced (1-based); a replacement may span lines or be empty."""
    lines = BASE.splitlines()
    for number, text in edits.items():
        lines[number - 1] = text
    return "\n".join(lines) + "\n"


def error_of(text: str, origin: str = "cdn-3dc.yaml") -> str:
    with pytest.raises(PlacementError) as info:
        parse_topology(text, origin=origin)
    return str(info.value)


def test_the_base_of_the_error_cases_is_valid() -> None:
    t = parse_topology(BASE)
    assert [s.name for s in t.sites] == ["PoP1", "DC1", "DC3"]
    assert t.site("PoP1").sources == (SourceLoad("cdn_logs", 2000.0, 200, 3000),)
    assert t.links == (Link("PoP1", "DC1", 50e6, 20.0), Link("DC1", "DC3", 10e6, 60.0))


SERVER = "      - {name: dc1-a, %s}"
LINK = "  - {between: [%s], bandwidth: %s, latency: %s}"

ERRORS: list[tuple[str, dict[int, str], str]] = [
    # The wrong type of value, or a value out of range.
    ("cores not a number", {14: SERVER % "cores: two, memory_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0].cores: expected a positive integer, got 'two'"),
    ("cores fractional", {14: SERVER % "cores: 2.5, memory_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0].cores: expected a positive integer, got 2.5"),
    ("cores zero", {14: SERVER % "cores: 0, memory_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0].cores: expected a positive integer, got 0"),
    ("cores negative", {14: SERVER % "cores: -4, memory_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0].cores: expected a positive integer, got -4"),
    ("cores boolean", {14: SERVER % "cores: yes, memory_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0].cores: expected a positive integer, got True"),
    ("cores empty", {14: SERVER % "cores: , memory_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0].cores: expected a positive integer, got nothing"),
    ("cores a list", {14: SERVER % "cores: [8], memory_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0].cores: expected a single value, got a list"),
    ("memory zero", {14: SERVER % "cores: 8, memory_gb: 0"},
     "cdn-3dc.yaml:14: sites[1].servers[0].memory_gb: expected a positive number, got 0"),
    ("memory infinite", {14: SERVER % "cores: 8, memory_gb: .inf"},
     "cdn-3dc.yaml:14: sites[1].servers[0].memory_gb: expected a positive number, got inf"),
    ("memory with a unit", {14: SERVER % "cores: 8, memory_gb: 32GB"},
     "cdn-3dc.yaml:14: sites[1].servers[0].memory_gb: expected a positive number, got '32GB'"),
    ("rate zero", {10: "      - {name: cdn_logs, events_per_s: 0}"},
     "cdn-3dc.yaml:10: sites[0].sources[0].events_per_s: expected a positive number, got 0"),
    ("event size fractional", {10: "      - {name: cdn_logs, bytes_per_event: 200.5}"},
     "cdn-3dc.yaml:10: sites[0].sources[0].bytes_per_event: expected a positive integer, "
     "got 200.5"),
    ("keys negative", {10: "      - {name: cdn_logs, distinct_keys: -3}"},
     "cdn-3dc.yaml:10: sites[0].sources[0].distinct_keys: expected a positive integer, got -3"),
    ("name not a string", {11: "  - name: 1"},
     "cdn-3dc.yaml:11: sites[1].name: expected a string, got 1 (quote it: '1')"),
    ("name with a space", {11: "  - name: DC 1"},
     "cdn-3dc.yaml:11: sites[1].name: 'DC 1' is not a valid name; use letters, digits, '_', "
     "'.' and '-', starting with a letter, digit or '_'"),
    ("name with an unknown tag", {11: "  - name: !dc DC1"},
     "cdn-3dc.yaml:11: sites[1].name: cannot read the value: could not determine a "
     "constructor for the tag '!dc'"),
    ("kind misspelt", {12: "    kind: datacentre"},
     "cdn-3dc.yaml:12: sites[1].kind: unknown kind 'datacentre'; expected one of pop, edge, "
     "datacenter; did you mean 'datacenter'?"),
    ("kind unknown", {12: "    kind: cloud"},
     "cdn-3dc.yaml:12: sites[1].kind: unknown kind 'cloud'; expected one of pop, edge, "
     "datacenter"),
    ("servers a mapping", {13: "    servers: {name: dc1-a}", 14: "", 15: ""},
     "cdn-3dc.yaml:13: sites[1].servers: expected a list, got a mapping"),
    ("servers empty", {13: "    servers: []", 14: "", 15: ""},
     "cdn-3dc.yaml:13: sites[1].servers: expected at least one server to run the site's stage"),
    ("sources empty", {9: "    sources:", 10: ""},
     "cdn-3dc.yaml:9: sites[0].sources: expected a list, got nothing"),
    ("a site that is a list", {16: "  - [DC3]", 17: "", 18: "", 19: ""},
     "cdn-3dc.yaml:16: sites[2]: expected a mapping with fields name, kind, servers, sources, "
     "spark_master, spark_conf, got a list"),
    ("no sites", {4: "sites: []", **dict.fromkeys(range(5, 20), "")},
     "cdn-3dc.yaml:4: sites: expected at least one site"),
    ("spark master misspelt", {12: "    kind: datacenter\n    spark_master: locl[2]"},
     "cdn-3dc.yaml:13: sites[1].spark_master: 'locl[2]' is not a Spark master URL; e.g. "
     "'local[2]', 'local[*]', 'spark://host:7077', or leave it out for local[N]"),
    # Fields: unknown, duplicate, missing.
    ("unknown field, close to a known one", {14: SERVER % "cores: 8, memroy_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0].memroy_gb: unknown field; did you mean 'memory_gb'?"),
    ("unknown field", {12: "    colour: blue"},
     "cdn-3dc.yaml:12: sites[1].colour: unknown field; expected one of name, kind, servers, "
     "sources, spark_master, spark_conf"),
    ("unknown top-level field", {2: "name: tiny\nversion: 2"},
     "cdn-3dc.yaml:3: version: unknown field; expected one of name, root, sites, links, "
     "spark_conf, standby_roots"),
    ("field name not a string", {14: SERVER % "1: 8, memory_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0]: expected a field name, got 1"),
    ("duplicate field", {14: SERVER % "cores: 8, cores: 4, memory_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0].cores: duplicate field (first at line 14)"),
    ("duplicate top-level field", {20: "name: again\nlinks:"},
     "cdn-3dc.yaml:20: name: duplicate field (first at line 2)"),
    ("missing server field", {14: SERVER % "memory_gb: 32"},
     "cdn-3dc.yaml:14: sites[1].servers[0]: missing required field 'cores'"),
    ("missing site kind", {12: ""},
     "cdn-3dc.yaml:11: sites[1]: missing required field 'kind'"),
    ("missing root", {3: ""},
     "cdn-3dc.yaml:2: missing required field 'root'"),
    ("missing link latency", {22: "  - {between: [DC1, DC3], bandwidth: 10mbit}"},
     "cdn-3dc.yaml:22: links[1]: missing required field 'latency'"),
    # Names: duplicates and unknown sites.
    ("duplicate site", {16: "  - name: DC1"},
     "cdn-3dc.yaml:16: sites[2].name: duplicate site name 'DC1' (first at line 11)"),
    ("duplicate server", {15: "      - {name: dc1-a, cores: 8, memory_gb: 32}"},
     "cdn-3dc.yaml:15: sites[1].servers[1].name: duplicate server name 'dc1-a' in site DC1 "
     "(first at line 14)"),
    ("duplicate source", {9: "    sources: [{name: cdn_logs},",
                          10: "              {name: cdn_logs}]"},
     "cdn-3dc.yaml:10: sites[0].sources[1].name: duplicate source name 'cdn_logs' in site "
     "PoP1 (first at line 9)"),
    ("root not a site", {3: "root: DC4"},
     "cdn-3dc.yaml:3: root: unknown site 'DC4'; did you mean 'DC3'?"),
    ("root not a string", {3: "root: [DC3]"},
     "cdn-3dc.yaml:3: root: expected a single value, got a list"),
    # Links.
    ("link to an unknown site", {22: LINK % ("DC1, DC33", "10mbit", "60ms")},
     "cdn-3dc.yaml:22: links[1].between[1]: unknown site 'DC33'; did you mean 'DC3'?"),
    ("link to an unheard-of site", {21: LINK % ("Mars, DC1", "1mbit", "1s")},
     "cdn-3dc.yaml:21: links[0].between[0]: unknown site 'Mars'"),
    ("link to itself", {22: LINK % ("DC3, DC3", "10mbit", "60ms")},
     "cdn-3dc.yaml:22: links[1].between: a link from DC3 to itself"),
    ("link with one end", {22: LINK % ("DC3", "10mbit", "60ms")},
     "cdn-3dc.yaml:22: links[1].between: expected the two sites the link joins, e.g. "
     "[PoP1, DC1], got 1"),
    ("duplicate link, reversed",
     {22: LINK % ("DC1, DC3", "10mbit", "60ms") + "\n" + LINK % ("DC1, PoP1", "5mbit", "20ms")},
     "cdn-3dc.yaml:23: links[2]: duplicate link between DC1 and PoP1 (first at line 21)"),
    ("bandwidth without a unit", {21: LINK % ("PoP1, DC1", "50", "20ms")},
     "cdn-3dc.yaml:21: links[0].bandwidth: 50 has no unit; write the rate in bits per second, "
     "e.g. '100mbit', '1.5gbit', '512kbit'"),
    ("bandwidth ambiguous", {21: LINK % ("PoP1, DC1", "50Mbps", "20ms")},
     "cdn-3dc.yaml:21: links[0].bandwidth: '50Mbps' is ambiguous: tc reads 'mbps' as bytes per "
     "second, most people as bits; write '50mbit' for bits, or '400mbit' if you meant bytes"),
    ("bandwidth zero", {21: LINK % ("PoP1, DC1", "0mbit", "20ms")},
     "cdn-3dc.yaml:21: links[0].bandwidth: expected a positive bandwidth, got '0mbit'"),
    ("latency without a unit", {21: LINK % ("PoP1, DC1", "50mbit", "20")},
     "cdn-3dc.yaml:21: links[0].latency: expected a duration with a unit, e.g. '20ms', got 20"),
    ("latency in a fraction of a ms",
     {21: LINK % ("PoP1, DC1", "50mbit", "0.5ms")},
     "cdn-3dc.yaml:21: links[0].latency: '0.5ms' is not a whole number of milliseconds"),
    ("latency negative", {21: LINK % ("PoP1, DC1", "50mbit", "-1ms")},
     "cdn-3dc.yaml:21: links[0].latency: '-1ms' is not a duration; write it with a unit, "
     "e.g. '500ms', '10s', '1m', '1h'"),
    ("links a mapping", {20: "links: {}", 21: "", 22: ""},
     "cdn-3dc.yaml:20: links: expected a list, got a mapping"),
    # Reaching the root.
    ("a site with sources cut off", {21: ""},
     "cdn-3dc.yaml:5: sites[0]: PoP1 has sources but no path to the root DC3, so its records "
     "could never be merged; cut off from the root: PoP1"),
    ("the root cut off", {22: ""},
     "cdn-3dc.yaml:5: sites[0]: PoP1 has sources but no path to the root DC3, so its records "
     "could never be merged; cut off from the root: PoP1, DC1"),
    ("a site without sources cut off", {3: "root: DC1", 22: ""},
     "cdn-3dc.yaml:16: sites[2]: the topology is not connected: DC3 cannot reach the root DC1 "
     "over any link"),
    ("no links at all", {20: "", 21: "", 22: ""},
     "cdn-3dc.yaml:5: sites[0]: PoP1 has sources but no path to the root DC3, so its records "
     "could never be merged; cut off from the root: PoP1, DC1"),
    # The YAML itself.
    ("an unclosed flow mapping", {14: "      - {name: dc1-a, cores: 8, memory_gb: 32"},
     "cdn-3dc.yaml:15: malformed YAML: while parsing a flow mapping, expected ',' or '}', "
     "but got '{'"),
    ("bad indentation", {12: "   kind: datacenter"},
     "cdn-3dc.yaml:12: malformed YAML: while parsing a block collection, expected <block end>, "
     "but found '<block mapping start>'"),
    ("a tab", {12: "\tkind: datacenter"},
     "cdn-3dc.yaml:12: malformed YAML: while scanning for the next token, found character "
     "'\\t' that cannot start any token"),
    ("an undefined alias", {14: "      - *big"},
     "cdn-3dc.yaml:14: malformed YAML: found undefined alias 'big'"),
    ("two documents", {20: "---"},
     "cdn-3dc.yaml:20: malformed YAML: expected a single document in the stream, but found "
     "another document"),
    ("a control character", {12: "    kind: data\x07center"},
     "cdn-3dc.yaml:12: malformed YAML: unacceptable character #x0007: special characters are "
     "not allowed"),
]


@pytest.mark.parametrize(("edits", "message"), [(e, m) for _, e, m in ERRORS],
                         ids=[case for case, _, _ in ERRORS])
def test_errors_name_the_file_line_and_field(edits: dict[int, str], message: str) -> None:
    assert error_of(edit(edits)) == message


@pytest.mark.parametrize(("text", "message"), [
    ("", "x.yaml:1: the topology is empty; expected a mapping with name, root, sites and links"),
    ("# nothing here\n", "x.yaml:1: the topology is empty"),
    ("- PoP1\n- DC1\n", "x.yaml:1: expected a mapping with fields name, root, sites, links, "
                        "spark_conf, standby_roots, got a list"),
    ("just words", "x.yaml:1: expected a mapping with fields name, root, sites, links, "
                   "spark_conf, standby_roots, got 'just words'"),
])
def test_errors_about_the_whole_file(text: str, message: str) -> None:
    assert error_of(text, origin="x.yaml").startswith(message)


def test_load_topology_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "cdn-3dc.yaml"
    path.write_text(edit({14: SERVER % "cores: two, memory_gb: 32"}))
    with pytest.raises(PlacementError) as info:
        load_topology(path)
    assert str(info.value) == (f"{path}:14: sites[1].servers[0].cores: expected a positive "
                               "integer, got 'two'")


def test_load_topology_refuses_a_missing_or_binary_file(tmp_path: Path) -> None:
    with pytest.raises(PlacementError, match=r"nowhere\.yaml: cannot read the topology: No such"):
        load_topology(tmp_path / "nowhere.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"name: \xff\xfe")
    with pytest.raises(PlacementError, match=r"bin\.yaml: cannot read the topology: not UTF-8"):
        load_topology(tmp_path / "bin.yaml")


def test_anchors_and_merge_keys_share_server_shapes() -> None:
    text = edit({
        14: "      - {<<: &big {cores: 8, memory_gb: 32}, name: dc1-a}",
        15: "      - {<<: *big, name: dc1-b, cores: 16}",
        19: "      - {<<: *big, name: dc3-a}",
    })
    t = parse_topology(text)
    assert t.site("DC1").servers == (Server("dc1-a", 8, 32.0), Server("dc1-b", 16, 32.0))
    assert t.site("DC3").servers == (Server("dc3-a", 8, 32.0),)


def test_a_merged_unknown_field_points_at_the_anchor() -> None:
    text = edit({14: "      - {<<: &big {cores: 8, memroy: 32}, name: dc1-a}",
                 15: "      - {<<: *big, name: dc1-b}"})
    assert error_of(text) == ("cdn-3dc.yaml:14: sites[1].servers[0].memroy: unknown field; did "
                              "you mean 'memory_gb'?")


def test_source_loads_default_to_the_model_defaults() -> None:
    t = parse_topology(edit({10: "      - {name: cdn_logs}"}))
    assert t.site("PoP1").sources == (SourceLoad("cdn_logs"),)
    assert t.site("DC1").sources == ()


def test_a_single_site_needs_no_links() -> None:
    text = "name: solo\nroot: only\nsites:\n  - name: only\n    kind: edge\n    servers:\n" \
           "      - {name: s, cores: 1, memory_gb: 0.5}\n"
    t = parse_topology(text)
    assert t.links == () and t.site("only").kind is SiteKind.EDGE
    assert t.site("only").servers[0].memory_gb == 0.5
    assert t.site("only").master == "local[1]"


def test_quoted_names_that_look_like_numbers_are_names() -> None:
    t = parse_topology(edit({11: '  - name: "1"', 21: LINK % ("PoP1, '1'", "50mbit", "20ms"),
                             22: LINK % ('"1", DC3', "10mbit", "60ms")}))
    assert t.site("1").name == "1"
    assert t.link("1", "DC3").bandwidth_bps == 10e6


# --- Spark settings ---------------------------------------------------------------------------


def test_spark_settings_are_the_sites_own_over_the_topologys() -> None:
    t = parse_topology(edit({
        3: "root: DC3\nspark_conf: {spark.sql.shuffle.partitions: 4, spark.driver.memory: 1g}",
        10: "      - {name: cdn_logs}\n    spark_conf:\n      spark.driver.memory: 2g\n"
            "      spark.sql.adaptive.enabled: true\n      spark.memory.fraction: 0.5",
    }))
    assert dict(t.site("PoP1").spark_conf) == {
        "spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "4",
        "spark.sql.adaptive.enabled": "true", "spark.memory.fraction": "0.5"}
    assert dict(t.site("DC1").spark_conf) == {"spark.driver.memory": "1g",
                                              "spark.sql.shuffle.partitions": "4"}
    assert parse_topology(to_yaml(t)) == t


def test_spark_settings_are_optional() -> None:
    assert all(site.spark_conf == () for site in parse_topology(BASE).sites)


SPARK_CONF = "      - {name: cdn_logs}\n    spark_conf: %s"


@pytest.mark.parametrize(("conf", "message"), [
    ("{driver.memory: 2g}",
     "cdn-3dc.yaml:11: sites[0].spark_conf.'driver.memory': site PoP1: 'driver.memory' is not a "
     "Spark setting; its name starts with 'spark.' and holds no space or '=', e.g. "
     "spark.driver.memory"),
    ("{spark.master: 'local[2]'}",
     "cdn-3dc.yaml:11: sites[0].spark_conf.'spark.master': site PoP1: the master is not a "
     "setting: use spark_master (or --spark-master)"),
    ("{spark.driver.memory: }",
     "cdn-3dc.yaml:11: sites[0].spark_conf.'spark.driver.memory': site PoP1: expected a single "
     "value for spark.driver.memory, e.g. a string, a number or true/false, got nothing"),
    ("{spark.jars: [a.jar, b.jar]}",
     "cdn-3dc.yaml:11: sites[0].spark_conf.'spark.jars': site PoP1: expected a single value "
     "for spark.jars, e.g. a string, a number or true/false, got a list"),
    ("[spark.driver.memory=2g]",
     "cdn-3dc.yaml:11: sites[0].spark_conf: expected a mapping of Spark settings for site "
     "PoP1, e.g. {spark.driver.memory: 2g}, got a list"),
    ("{spark.a: 1, spark.a: 2}",
     "cdn-3dc.yaml:11: sites[0].spark_conf.'spark.a': duplicate entry (first at line 11)"),
])
def test_a_bad_spark_setting_is_refused_naming_the_site_and_key(conf: str, message: str) -> None:
    assert error_of(edit({10: SPARK_CONF % conf})) == message


def test_a_bad_topology_wide_spark_setting_says_it_is_every_sites() -> None:
    assert error_of(edit({3: "root: DC3\nspark_conf: {sql.shuffle: 2}"})) == (
        "cdn-3dc.yaml:4: spark_conf.'sql.shuffle': every site: 'sql.shuffle' is not a Spark "
        "setting; its name starts with 'spark.' and holds no space or '=', e.g. "
        "spark.driver.memory")


STANDBY = """\
name: t
root: a
standby_roots: [b]
sites:
  - {name: a, kind: datacenter, servers: [{name: a1, cores: 1, memory_gb: 1}]}
  - {name: b, kind: datacenter, servers: [{name: b1, cores: 1, memory_gb: 1}]}
  - name: c
    kind: pop
    servers: [{name: c1, cores: 1, memory_gb: 1}]
    sources: [{name: cdn_logs}]
links:
  - {between: [a, b], bandwidth: 1gbit, latency: 1ms}
  - {between: [c, a], bandwidth: 1gbit, latency: 1ms}
  - {between: [c, b], bandwidth: 1gbit, latency: 1ms}
"""


def test_standby_roots_are_read_and_written_back() -> None:
    topology = parse_topology(STANDBY)
    assert topology.standby_roots == ("b",)
    assert parse_topology(to_yaml(topology)) == topology


@pytest.mark.parametrize(("change", "message"), [
    ("standby_roots: [b]", None),
    ("standby_roots: [a]", "standby_roots[0]: a is the root"),
    ("standby_roots: [x]", "standby_roots[0]: unknown site 'x'"),
    ("standby_roots: [b, b]", "standby_roots[1]: b is named twice"),
    ("standby_roots: b", "standby_roots"),
])
def test_a_bad_standby_root_is_refused_naming_the_field(change: str,
                                                         message: str | None) -> None:
    text = STANDBY.replace("standby_roots: [b]", change)
    if message is None:
        parse_topology(text)
        return
    with pytest.raises(PlacementError, match=re.escape(message)):
        parse_topology(text)


def test_a_standby_root_that_reaches_the_sources_only_through_the_root_is_refused() -> None:
    text = STANDBY.replace("  - {between: [c, b], bandwidth: 1gbit, latency: 1ms}\n", "")
    with pytest.raises(PlacementError, match="standby root b has no path to c that avoids the "
                       "root a, so it could not take over; add a link from c towards b"):
        parse_topology(text)
