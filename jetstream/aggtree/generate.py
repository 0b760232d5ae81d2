"""Large CDN-like topologies for planner scale tests, and the YAML writer they are saved with.

``generate_topology(480, 16, 3, seed)`` is a four-level hierarchy: PoPs (where the logs are
born) under regional datacenters under continental ones under one root. About a quarter of the
PoPs also have a thinner backup link to a second region of their continent, so the graph is not
already a tree and the planner has a choice to make. ``topologies/large-500.yaml`` is
what :func:`generated_file` writes for it, byte for byte; regenerate it with::

    python -m jetstream.aggtree.generate --pops 480 --regions 16 --continents 3 \\
        --seed 2014 --name large-500 > topologies/large-500.yaml
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from collections.abc import Sequence

import yaml

from jetstream.aggtree.topology import Link, Server, Site, SiteKind, SourceLoad, Topology
from jetstream.errors import PlacementError
from jetstream.units import format_bandwidth
from jetstream.windows import format_duration

__all__ = ["generate_topology", "generated_file", "to_yaml"]

_MBIT = 1e6
_BACKUP_SHARE = 0.25  # of the PoPs, with a second, thinner uplink


def generate_topology(pops: int, regions: int, continents: int, seed: int, *,
                      name: str | None = None) -> Topology:
    """A root over ``continents`` over ``regions`` over ``pops``, sized at random from ``seed``.

    Children are spread evenly and in order over their parents (PoP ``i`` of ``n`` is in
    region ``i * regions // n``). Every PoP holds the source ``cdn_logs``. Links get wide-area
    bandwidths that grow toward the root: PoP uplinks 10-100 Mbit/s, regional 100 Mbit/s -
    1 Gbit/s, continental 1-10 Gbit/s, with latencies to match.

    Parameters
    ----------
    pops, regions, continents
        How many sites of each tier: ``pops >= regions >= continents >= 1``.
    seed
        The same seed gives the same topology, on any machine.
    name
        The topology's name; ``generated-<number of sites>`` by default.

    Raises
    ------
    PlacementError
        If the tier sizes are not ``pops >= regions >= continents >= 1``.
    """
    if not pops >= regions >= continents >= 1:
        msg = (f"generate_topology: need pops >= regions >= continents >= 1, got pops={pops}, "
               f"regions={regions}, continents={continents}")
        raise PlacementError(msg)
    rng = random.Random(seed)
    root = "core"
    continent_names = _numbered("cont", continents)
    region_names = _numbered("region", regions)
    pop_names = _numbered("pop", pops)
    continent_of = [continent_names[r * continents // regions] for r in range(regions)]
    region_of = [p * regions // pops for p in range(pops)]

    sites = [_datacenter(root, servers=8, cores=32)]
    sites += [_datacenter(c, servers=rng.randint(4, 6), cores=16) for c in continent_names]
    sites += [_datacenter(r, servers=rng.randint(2, 4), cores=rng.choice((8, 16)))
              for r in region_names]
    for pop in pop_names:
        cores = [rng.choice((2, 4)) for _ in range(rng.randint(1, 2))]
        servers = tuple(Server(f"{pop}-{i}", n, memory_gb=2.0 * n)
                        for i, n in enumerate(cores, start=1))
        source = SourceLoad("cdn_logs", events_per_s=float(rng.randrange(500, 5001, 100)),
                            bytes_per_event=rng.randrange(150, 301, 10),
                            distinct_keys=rng.randrange(1000, 20001, 500))
        sites.append(Site(pop, SiteKind.POP, servers, sources=(source,)))

    links = [Link(c, root, rng.choice((1_000, 2_000, 5_000, 10_000)) * _MBIT,
                  float(rng.randint(40, 150))) for c in continent_names]
    links += [Link(r, continent_of[i], rng.choice((100, 200, 500, 1_000)) * _MBIT,
                   float(rng.randint(10, 50))) for i, r in enumerate(region_names)]
    for p, pop in enumerate(pop_names):
        home = region_of[p]
        links.append(Link(pop, region_names[home], rng.choice((10, 20, 25, 50, 100)) * _MBIT,
                          float(rng.randint(2, 30))))
        neighbours = [r for r in range(regions)
                      if r != home and continent_of[r] == continent_of[home]]
        if neighbours and rng.random() < _BACKUP_SHARE:
            links.append(Link(pop, region_names[rng.choice(neighbours)],
                              rng.choice((5, 10, 20)) * _MBIT, float(rng.randint(20, 60))))

    return Topology(name=name or f"generated-{len(sites)}", root=root, sites=tuple(sites),
                    links=tuple(links))


def _numbered(prefix: str, count: int) -> list[str]:
    width = len(str(count))  # zero-padded, so names sort in order
    return [f"{prefix}{i:0{width}d}" for i in range(1, count + 1)]


def _datacenter(name: str, servers: int, cores: int) -> Site:
    return Site(name, SiteKind.DATACENTER,
                tuple(Server(f"{name}-{i}", cores, memory_gb=4.0 * cores)
                      for i in range(1, servers + 1)))


def to_yaml(topology: Topology) -> str:
    """The topology in the format :func:`~jetstream.aggtree.loader.parse_topology` reads.

    ``parse_topology(to_yaml(t)) == t`` for every topology the loader accepts.

    Raises
    ------
    PlacementError
        If a value has no exact YAML form: a latency that is not a whole number of
        milliseconds, a bandwidth that is not a positive finite number.
    """
    lines = [f"name: {_scalar(topology.name)}", f"root: {_scalar(topology.root)}"]
    if topology.standby_roots:
        lines.append(f"standby_roots: [{', '.join(map(_scalar, topology.standby_roots))}]")
    lines.append("sites:")
    for site in topology.sites:
        lines += [f"  - name: {_scalar(site.name)}", f"    kind: {site.kind.value}",
                  "    servers:"]
        lines += [f"      - {{name: {_scalar(s.name)}, cores: {s.cores}, "
                  f"memory_gb: {_number(s.memory_gb)}}}" for s in site.servers]
        if site.sources:
            lines.append("    sources:")
            lines += [f"      - {{name: {_scalar(s.name)}, "
                      f"events_per_s: {_number(s.events_per_s)}, "
                      f"bytes_per_event: {s.bytes_per_event}, "
                      f"distinct_keys: {s.distinct_keys}"
                      + (f", format: {s.format}" if s.format else "") + "}"
                      for s in site.sources]
        if site.spark_master is not None:
            lines.append(f"    spark_master: {_scalar(site.spark_master)}")
        if site.spark_conf:
            lines.append("    spark_conf:")
            lines += [f"      {_scalar(key)}: {_scalar(value)}" for key, value in site.spark_conf]
    lines.append("links:" if topology.links else "links: []")
    for link in topology.links:
        if link.latency_ms != int(link.latency_ms) or link.latency_ms < 0:
            msg = (f"link {link.a}-{link.b}: cannot write a latency of {link.latency_ms} ms; "
                   "the format holds whole milliseconds")
            raise PlacementError(msg)
        lines.append(f"  - {{between: [{_scalar(link.a)}, {_scalar(link.b)}], "
                     f"bandwidth: {format_bandwidth(link.bandwidth_bps)}, "
                     f"latency: {format_duration(int(link.latency_ms))}}}")
    return "\n".join(lines) + "\n"


_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _scalar(text: str) -> str:
    """``text`` as a YAML string: plain where YAML would read it back as this string."""
    resolved = yaml.resolver.Resolver().resolve(yaml.ScalarNode, text, (True, False))
    if _PLAIN.match(text) and resolved == "tag:yaml.org,2002:str":
        return text
    return json.dumps(text)  # a JSON string is a YAML double-quoted string


def _number(value: float) -> str:
    if not math.isfinite(value):
        msg = f"cannot write {value!r}: the format holds finite numbers"
        raise PlacementError(msg)
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    text = repr(float(value))
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:
        text = f"{mantissa}.0e{exponent}"  # YAML 1.1 reads '1e-05' as a string, '1.0e-05' not
    return text


def generated_file(pops: int, regions: int, continents: int, seed: int,
                   name: str | None = None) -> str:
    """The YAML of :func:`generate_topology`, under a comment that says how to regenerate it."""
    topology = generate_topology(pops, regions, continents, seed, name=name)
    command = (f"python -m jetstream.aggtree.generate --pops {pops} --regions {regions} "
               f"--continents {continents} --seed {seed}" + (f" --name {name}" if name else ""))
    header = (f"# {len(topology.sites)} sites, generated: do not edit. Regenerate with\n"
              f"#   {command} \\\n#     > topologies/{topology.name}.yaml\n")
    return header + to_yaml(topology)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jetstream.aggtree.generate",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pops", type=int, required=True)
    parser.add_argument("--regions", type=int, required=True)
    parser.add_argument("--continents", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--name")
    args = parser.parse_args(argv)
    sys.stdout.write(generated_file(args.pops, args.regions, args.continents, args.seed,
                                    name=args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
