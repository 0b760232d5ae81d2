"""The physical planner on the shipped topologies, its refusals, and its properties."""

from __future__ import annotations

import itertools
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream import col
from jetstream.aggtree.cost import KEY_BYTES, VALUE_BYTES, Load
from jetstream.aggtree.generate import generate_topology
from jetstream.aggtree.loader import load_topology, parse_topology
from jetstream.aggtree.planner import _Costing, _loads, _Tree, plan_query
from jetstream.aggtree.topology import Link, Server, Site, SiteKind, SourceLoad, Topology
from jetstream.approx.levels import ladder, ranking
from jetstream.queryfile import load_query
from jetstream.rewrite import distributed

ROOT = Path(__file__).resolve().parent.parent
TOPK = load_query(ROOT / "examples" / "cdn_topk.py")
LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)


def topology(name: str) -> Topology:
    return load_topology(ROOT / "topologies" / f"{name}.yaml")


def parents(plan: object) -> dict[str, str]:
    return {f.site: f.parent for f in plan.fragments.values() if f.parent}  # type: ignore[attr-defined]


def test_figure_1_comes_out_as_the_paper_draws_it() -> None:
    plan = plan_query(TOPK, topology("cdn-3dc"))
    assert parents(plan) == {"PoP1": "DC1", "PoP2": "DC1", "PoP3": "DC1", "PoP4": "DC2",
                             "PoP5": "DC2", "PoP6": "DC2", "DC1": "DC3", "DC2": "DC3"}
    fragments = plan.fragments
    assert all(fragments[f"PoP{i}"].sources == ("cdn_logs",) for i in range(1, 7))
    assert fragments["DC1"].children == ("PoP1", "PoP2", "PoP3")
    # The datacenters answer the root's TPUT rounds for the exact top-k: a few rows a window
    # instead of thousands, coordinated by the root in one process.
    assert fragments["DC1"].rounds and fragments["DC2"].rounds
    assert not any(fragments[f"PoP{i}"].rounds for i in range(1, 7))
    assert fragments["DC3"].final and fragments["DC3"].partitions == 1
    assert plan.split
    # Partials are a small fraction of the raw logs they replace.
    assert plan.wan_bytes_per_s < plan.raw_bytes_per_s / 5
    assert 0 < plan.max_utilisation < 0.5
    text = plan.render()
    assert text.startswith("physical plan on cdn-3dc (root DC3)")
    assert "DC1: merge of 3 -> DC3" in text and "TPUT rounds: about 40 rows a window" in text
    assert "DC3: final\n" in text and "TPUT: the exact top 10" in text


def test_no_rounds_where_the_slo_has_no_time_for_two_more_round_trips() -> None:
    tight = js.Query("tight", TOPK.stream, slo=js.SLO(max_latency="400ms", max_error=0.01))
    plan = plan_query(tight, topology("cdn-3dc"))
    assert not any(f.rounds for f in plan.fragments.values())
    assert plan.fragments["DC3"].partitions == 4  # the split final top-k
    text = plan.render()
    assert "TPUT:" not in text and "TPUT rounds:" not in text
    assert ("no TPUT rounds on DC2 -> DC3: 2 more round trips take 320 ms, over half the SLO's "
            "max_latency of 400 ms") in text


def test_no_rounds_where_the_partials_are_about_as_small() -> None:
    text = plan_query(TOPK, topology("local-3dc")).render()
    assert ("no TPUT rounds on sfo -> ams: its partials have about 50 rows a window, the "
            "rounds would ship about 40") in text


def test_local_topology_sends_both_sites_to_the_root() -> None:
    plan = plan_query(TOPK, topology("local-3dc"))
    assert parents(plan) == {"sfo": "ams", "sin": "ams"}
    assert plan.fragments["ams"].roles[:2] == ["local stage", "final"]
    assert plan.depth() == 1


def test_a_holistic_aggregate_is_planned_split_as_the_sites_run_it() -> None:
    # The sites split an exact distinct count too (its partials carry the values): the
    # planner prices those values with every record, not the raw records nor a fixed row.
    query = js.Query("users", LOGS.window(js.tumbling("10s")).group_by("domain")
                     .agg(users=js.count_distinct("client_ip")))
    cdn = topology("cdn-3dc")
    plan = plan_query(query, cdn)
    assert plan.split
    assert plan.fragments["PoP1"].parent is not None
    pop1 = cdn.site("PoP1").sources[0]
    edge = plan.tree.edges["PoP1", plan.fragments["PoP1"].parent]
    values = pop1.events_per_s * VALUE_BYTES
    rows = pop1.distinct_keys * KEY_BYTES / 10
    assert edge["bytes_per_s"] == pytest.approx(values + rows)
    assert plan.wan_bytes_per_s < plan.raw_bytes_per_s  # values, not whole records
    thin = two_sites(distinct_keys=50, bandwidth="500kbit")
    plan_query(TOPK, thin)  # 50 domains' counts fit
    with pytest.raises(js.PlacementError, match="link pop-dc is over capacity"):
        plan_query(query, thin)  # 5,000 client addresses a second do not


def two_sites(distinct_keys: int, bandwidth: str, latency: str = "10ms") -> Topology:
    """A PoP of 5,000 records/s and a datacenter, joined by one link."""
    return parse_topology(two_sites_yaml(distinct_keys, bandwidth, latency))


def two_sites_yaml(distinct_keys: int, bandwidth: str, latency: str = "10ms") -> str:
    """:func:`two_sites` as a topology file says it."""
    return f"""
name: thin
root: dc
sites:
  - {{name: pop, kind: pop, servers: [{{name: p, cores: 2, memory_gb: 4}}],
     sources: [{{name: cdn_logs, events_per_s: 5000, distinct_keys: {distinct_keys}}}]}}
  - {{name: dc, kind: datacenter, servers: [{{name: d, cores: 8, memory_gb: 16}}]}}
links:
  - {{between: [pop, dc], bandwidth: {bandwidth}, latency: {latency}}}
"""


def test_a_thin_link_is_named_with_the_level_that_would_fit() -> None:
    thin = two_sites(distinct_keys=50000, bandwidth="100kbit", latency="1s")
    # Too little time for TPUT's round trips: the link would carry every key's partial.
    tight = js.Query("tight", TOPK.stream, slo=js.SLO(max_latency="5s"))
    with pytest.raises(js.PlacementError, match="link pop-dc is over capacity: the query needs "
                                                r"\d.*of partials and the link has 100.0 kbit/s; "
                                                "the query's SLO sets no max_error; level 'top "
                                                r"320' \(nominal error 0.001\) would fit"):
        plan_query(tight, thin)
    exact = js.Query("exact", TOPK.stream, slo=js.SLO(max_latency="5s", max_error=0))
    with pytest.raises(js.PlacementError, match=r"link pop-dc is over capacity: .*the SLO's "
                                                "max_error=0 allows none; level 'top 320'"):
        plan_query(exact, thin)


def test_a_link_whose_windows_cross_slower_than_max_latency_allows_needs_a_level() -> None:
    # At 400 ms, DC2's exact partials take 0.68 s a window to reach DC3: without a max_error
    # the SLO cannot be met; with one, the link starts at a level that crosses in time.
    tight = js.Query("tight", TOPK.stream, slo=js.SLO(max_latency="400ms"))
    with pytest.raises(js.PlacementError, match=r"link DC\d-DC3: a window's partials take "
                                                r"0\.\d+ s to cross it, over the SLO's "
                                                "max_latency of 0.4 s"):
        plan_query(tight, topology("cdn-3dc"))
    allowed = js.Query("tight", TOPK.stream, slo=js.SLO(max_latency="400ms", max_error=0.01))
    plan = plan_query(allowed, topology("cdn-3dc"))
    assert plan.fragments["DC2"].level > 0 and "starts at level" in plan.render()


def test_max_wan_kbps_caps_what_a_link_carries_for_the_query() -> None:
    capped = js.Query("capped", TOPK.stream,
                      slo=js.SLO(max_latency="5s", max_wan_kbps=10))
    thin = two_sites(distinct_keys=5000, bandwidth="10mbit", latency="1s")
    assert plan_query(js.Query("q", TOPK.stream, slo=js.SLO(max_latency="5s")),
                      thin).fragments["pop"].level == 0
    with pytest.raises(js.PlacementError, match=r"link pop-dc: the query needs .* of partials "
                                                "and its SLO's max_wan_kbps allows 10.0 kbit/s"):
        plan_query(capped, thin)


def test_a_thin_link_starts_at_the_cheapest_level_the_slos_max_error_allows() -> None:
    thin = two_sites(distinct_keys=50000, bandwidth="100kbit", latency="1s")
    query = js.Query("q", TOPK.stream, slo=js.SLO(max_latency="5s", max_error=0.05))
    plan = plan_query(query, thin)
    names = [lv.name for lv in ladder(ranking(distributed(query)), None).levels]
    assert plan.fragments["pop"].level == names.index("top 20")  # 0.01; a sketch's is 0.11
    assert not plan.fragments["pop"].rounds
    edge = plan.tree.edges["pop", "dc"]
    assert edge["utilisation"] <= 1.0 and edge["level"].exact_bytes_per_s > 100_000 / 8
    assert "pop: local stage -> dc: " in plan.render()
    assert "starts at level 'top 20' (nominal error 0.01): exact partials would need" in (
        plan.render())


def test_tputs_rounds_fit_a_link_too_thin_for_every_key() -> None:
    plan = plan_query(TOPK, two_sites(distinct_keys=50000, bandwidth="100kbit"))
    assert plan.fragments["pop"].rounds and plan.fragments["pop"].level == 0
    assert plan.tree.edges["pop", "dc"]["utilisation"] <= 1.0


def test_query_without_sources_on_the_topology() -> None:
    other = js.Query("q", js.source("app_logs", schema=js.CDN_LOG_SCHEMA)
                     .window(js.tumbling("1s")).agg(n=js.count()))
    with pytest.raises(js.PlacementError, match="no site of cdn-3dc holds source app_logs"):
        plan_query(other, topology("cdn-3dc"))


def test_fan_in_limit() -> None:
    with pytest.raises(js.PlacementError, match="more than the fan-in limit of 2"):
        plan_query(TOPK, topology("cdn-3dc"), max_fan_in=2)


def test_a_site_too_small_for_its_merge() -> None:
    small = parse_topology("""
name: small
root: dc
sites:
  - {name: pop, kind: pop, servers: [{name: p, cores: 2, memory_gb: 4}],
     sources: [{name: cdn_logs, events_per_s: 900000, distinct_keys: 9000000}]}
  - {name: dc, kind: datacenter, servers: [{name: d, cores: 1, memory_gb: 2}]}
links:
  - {between: [pop, dc], bandwidth: 100gbit, latency: 10ms}
""")
    with pytest.raises(js.PlacementError, match="site dc is over capacity: merging"):
        plan_query(TOPK, small)


def test_filters_and_sliding_windows_are_planned() -> None:
    query = js.Query("q", LOGS.where(col("status") >= 500)
                     .window(js.sliding("1m", every="10s"), watermark="5s")
                     .agg(n=js.count(), p=js.approx_quantile("latency_ms")))
    plan = plan_query(query, topology("cdn-3dc"))
    assert plan.split and set(parents(plan)) == {f"PoP{i}" for i in range(1, 7)} | {"DC1", "DC2"}


# -- properties ------------------------------------------------------------------------------

def assert_is_a_tree_to_the_root(plan: object, topo: Topology) -> None:
    tree: nx.DiGraph = plan.tree  # type: ignore[attr-defined]
    for site in tree:
        assert tree.out_degree(site) == (0 if site == topo.root else 1)
    for source_site in (s.name for s in topo.sites if s.sources):
        paths = list(nx.all_simple_paths(tree, source_site, topo.root)) if (
            source_site != topo.root) else [[topo.root]]
        assert len(paths) == 1, f"{source_site} reaches the root {len(paths)} times"
    for child, parent in tree.edges:
        topo.link(child, parent)  # every hop is a real link
        assert tree.edges[child, parent]["utilisation"] <= 1.0


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 32), st.integers(1, 6), st.integers(1, 3), st.integers(0, 10_000))
def test_generated_topologies_plan_to_a_tree(pops: int, regions: int, continents: int,
                                             seed: int) -> None:
    regions, continents = min(regions, pops), min(continents, regions, pops)
    topo = generate_topology(pops, regions, continents, seed)
    assert_is_a_tree_to_the_root(plan_query(TOPK, topo), topo)


@st.composite
def small_meshes(draw: st.DrawFn) -> Topology:
    """A root, two middle sites, and up to four leaves with one or two uplinks each."""
    def server(name: str) -> tuple[Server, ...]:
        return (Server(f"{name}-1", 8, 16),)

    keys = st.integers(100, 20_000)
    leaves = [f"leaf{i}" for i in range(draw(st.integers(1, 4)))]
    sites = [Site("root", SiteKind.DATACENTER, server("root")),
             Site("mid0", SiteKind.DATACENTER, server("mid0")),
             Site("mid1", SiteKind.DATACENTER, server("mid1"))]
    sites += [Site(name, SiteKind.POP, server(name),
                   (SourceLoad("cdn_logs", 2000, 200, draw(keys)),)) for name in leaves]
    bandwidth = st.sampled_from([1e5, 3e5, 1e6, 3e6, 1e7])
    links = [Link("mid0", "root", draw(bandwidth), 10), Link("mid1", "root", draw(bandwidth), 10)]
    for leaf in leaves:
        ups = draw(st.sampled_from([["mid0"], ["mid1"], ["mid0", "mid1"]]))
        links += [Link(leaf, up, draw(bandwidth), draw(st.integers(1, 50))) for up in ups]
    return Topology("mesh", "root", tuple(sites), tuple(links))


def feasible_by_brute_force(topo: Topology) -> bool:
    """Whether some choice of uplinks keeps every link within its capacity."""
    leaves = [s for s in topo.sites if s.sources]
    ups = {leaf.name: [link for link in topo.links if leaf.name in link.ends] for leaf in leaves}
    row_bytes = 32 + 8 + 16  # one key, a count and a sum: the example query's partial row
    for choice in itertools.product(*ups.values()):
        per_mid: dict[str, list[Load]] = {"mid0": [], "mid1": []}
        ok = True
        for leaf, link in zip(leaves, choice, strict=True):
            load = Load.of_source(leaf.sources[0], 10.0, split=True)
            ok &= load.bytes_per_s(row_bytes, 10.0) * 8 <= link.bandwidth_bps
            per_mid[next(iter(link.ends - {leaf.name}))].append(load)
        for mid, loads in per_mid.items():
            if loads:
                rate = Load.merged(loads).bytes_per_s(row_bytes, 10.0)
                ok &= rate * 8 <= topo.link(mid, "root").bandwidth_bps
        if ok:
            return True
    return False


@settings(max_examples=150, deadline=None)
@given(small_meshes())
def test_no_link_over_capacity_when_a_feasible_plan_exists(topo: Topology) -> None:
    try:
        plan = plan_query(TOPK, topo)
    except js.PlacementError as e:
        assert "over capacity" in str(e)
        assert not feasible_by_brute_force(topo)
    else:
        assert_is_a_tree_to_the_root(plan, topo)


def test_planning_a_thousand_sites() -> None:
    topo = generate_topology(950, 40, 5, 7)
    assert len(topo.sites) == 996
    plan = plan_query(TOPK, topo)
    assert_is_a_tree_to_the_root(plan, topo)
    assert plan.depth() == 3


@st.composite
def layered_trees(draw: st.DrawFn) -> tuple[_Costing, dict[str, list[str]], dict[str, str]]:
    """Three layers under a root, each site with one or two candidate parents a layer up,
    loads on the lowest layer and on some of the middle one; and a first choice of parents."""
    layers = [["root"]] + [[f"l{depth}s{i}" for i in range(draw(st.integers(1, width)))]
                           for depth, width in ((1, 3), (2, 4), (3, 6))]
    candidates = {site: sorted(set(draw(st.lists(st.sampled_from(above), min_size=1,
                                                 max_size=2))))
                  for above, layer in itertools.pairwise(layers) for site in layer}
    load = st.builds(Load, st.integers(0, 5000).map(float), st.integers(0, 10**6).map(float))
    own = {site: draw(load) for site in layers[3]}
    own |= {site: draw(load) for site in layers[2] if draw(st.booleans())}
    hops = {site: depth for depth, layer in enumerate(layers) for site in layer}
    edges = [(s, p) for s, ps in candidates.items() for p in ps]
    costing = _Costing(
        root="root", own=own, hops=hops, leaves=tuple(own),
        up=sorted(candidates, key=lambda s: -hops[s]),
        latency_ms={e: float(draw(st.integers(1, 80))) for e in edges},
        bandwidth_bps={e: draw(st.sampled_from([1e5, 1e6, 1e7])) for e in edges},
        row_bytes=56, every_s=10.0, max_fan_in=draw(st.integers(1, 4)))
    first = {site: draw(st.sampled_from(ps)) for site, ps in candidates.items()}
    return costing, candidates, first


@settings(max_examples=200, deadline=None)
@given(layered_trees(), st.lists(st.tuples(st.integers(0, 100), st.integers(0, 1)), max_size=12))
def test_moving_one_parent_costs_what_costing_the_whole_tree_does(
        case: tuple[_Costing, dict[str, list[str]], dict[str, str]],
        moves: list[tuple[int, int]]) -> None:
    costing, candidates, first = case
    tree = _Tree(costing, first)
    sites = sorted(candidates)
    for i, j in moves:
        site = sites[i % len(sites)]
        parent = candidates[site][j % len(candidates[site])]
        move = tree.try_move(site, parent)
        whole = costing.of({**tree.parents, site: parent}).key
        assert move.key[:3] == pytest.approx(whole[:3], abs=1e-6)
        assert abs(move.key[3] - whole[3]) <= 1  # bytes/s, rounded: sums in another order
        tree.move(move)
        expected = _loads(tree.parents, costing.own, costing.up)
        assert tree.loads.keys() == expected.keys()
        for name, loaded in expected.items():
            assert tree.loads[name].keys == pytest.approx(loaded.keys)
            assert tree.loads[name].raw_bytes_per_s == pytest.approx(loaded.raw_bytes_per_s)
