"""A topology's wide area on one Linux machine: a network namespace per site, shaped links.

Each site gets a namespace (``js-<n>``) and a veth pair whose outer end joins a bridge
(``js-wan``, 10.77.0.1/24, where the controller listens); the site's address is
10.77.0.<10 + n>. What a site sends its parent crosses its own veth, so each site's veth is
shaped with ``tc tbf`` at the bandwidth of its link to its parent in the aggregation tree, in
both directions; the root's is not shaped. tbf shapes rate only: the links' latencies are not
emulated (this kernel's netem is not available). Everything made is named ``js-*`` and is
removed by :meth:`WideArea.down`, which also clears what a crashed run left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import jetstream as js
from jetstream.aggtree.planner import plan_query
from jetstream.aggtree.topology import Topology
from jetstream.errors import ControlPlaneError
from jetstream.units import parse_bandwidth

__all__ = ["BRIDGE", "EmulatedSite", "WideArea", "uplinks"]

BRIDGE = "js-wan"
SUBNET = "10.77.0"
HOST_ADDRESS = f"{SUBNET}.1"
#: Where a running emulation notes what it made, for ``set-link`` and ``down``.
STATE_FILE = Path(os.environ.get("JETSTREAM_EMULATE_STATE", "/run/jetstream-emulate.json"))

Run = Callable[[Sequence[str]], str]


def _run(command: Sequence[str]) -> str:
    done = subprocess.run(list(command), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        msg = f"`{' '.join(command)}` failed: {done.stderr.strip() or done.returncode}"
        raise ControlPlaneError(msg)
    return done.stdout


@dataclass(frozen=True)
class EmulatedSite:
    name: str
    index: int
    parent: str | None
    uplink_bps: float | None  # None: not shaped (the root)

    @property
    def namespace(self) -> str:
        return f"js-{self.index}"

    @property
    def inner(self) -> str:  # the veth end inside the namespace (names are <= 15 chars)
        return f"js{self.index}n"

    @property
    def outer(self) -> str:  # the end on the bridge
        return f"js{self.index}h"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{10 + self.index}"


def uplinks(topology: Topology) -> dict[str, tuple[str | None, float | None]]:
    """Per site, its parent in the aggregation tree of a CDN top-k and that link's bit/s."""
    logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
    probe = js.Query("emulate", logs.window(js.tumbling("10s")).group_by("domain")
                     .agg(n=js.count()).top_k(10, by="n"))
    plan = plan_query(probe, topology)
    out: dict[str, tuple[str | None, float | None]] = {}
    for site in topology.sites:
        fragment = plan.fragments.get(site.name)
        parent = fragment.parent if fragment is not None and fragment.parent else None
        out[site.name] = (parent, topology.link(site.name, parent).bandwidth_bps
                          if parent else None)
    return out


class WideArea:
    """The namespaces, veths and shaping of one topology (see the module docstring)."""

    def __init__(self, topology: Topology, *, run: Run = _run,
                 state_file: Path = STATE_FILE) -> None:
        self.topology, self._run, self.state_file = topology, run, state_file
        if len(topology.sites) > 200:
            msg = f"topology {topology.name}: {len(topology.sites)} sites; emulating is " \
                  "limited to 200 (one /24)"
            raise ControlPlaneError(msg)
        self.sites = {name: EmulatedSite(name, i, parent, bps)
                      for i, (name, (parent, bps)) in enumerate(uplinks(topology).items())}

    @staticmethod
    def check_host() -> None:
        """Refuse, saying why, where namespaces cannot be made."""
        if os.geteuid() != 0:
            msg = "jetstream emulate needs root (network namespaces and tc): run it with sudo"
            raise ControlPlaneError(msg)
        missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
        if missing:
            msg = (f"jetstream emulate needs iproute2 ({' and '.join(missing)} not found): "
                   "apt-get install iproute2")
            raise ControlPlaneError(msg)

    def up(self, made: Callable[[EmulatedSite, int], None] = lambda site, n: None) -> None:
        """Make every namespace, link and shaping, calling ``made(site, n)`` as the n-th site
        is ready (progress: about ten commands a site); on failure, remove what was made."""
        self.down()  # what an earlier, crashed run left
        try:
            self._run(["ip", "link", "add", BRIDGE, "type", "bridge"])
            self._run(["ip", "addr", "add", f"{HOST_ADDRESS}/24", "dev", BRIDGE])
            self._run(["ip", "link", "set", BRIDGE, "up"])
            for n, site in enumerate(self.sites.values(), 1):
                self._add(site)
                made(site, n)
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            self.state_file.write_text(json.dumps({
                "topology": self.topology.name,
                "sites": {s.name: {"index": s.index, "parent": s.parent}
                          for s in self.sites.values()}}))
        except BaseException:
            self.down()
            raise

    def _add(self, site: EmulatedSite) -> None:
        ns = site.namespace
        self._run(["ip", "netns", "add", ns])
        self._run(["ip", "-n", ns, "link", "set", "lo", "up"])
        self._run(["ip", "link", "add", site.outer, "type", "veth", "peer", "name", site.inner])
        self._run(["ip", "link", "set", site.inner, "netns", ns])
        self._run(["ip", "link", "set", site.outer, "master", BRIDGE])
        self._run(["ip", "link", "set", site.outer, "up"])
        self._run(["ip", "-n", ns, "addr", "add", f"{site.address}/24", "dev", site.inner])
        self._run(["ip", "-n", ns, "link", "set", site.inner, "up"])
        if site.uplink_bps is not None:
            self._shape(site, site.uplink_bps, "add")

    def _shape(self, site: EmulatedSite, bps: float, verb: str) -> None:
        rate = f"{int(bps)}bit"
        # A burst of 10 ms at the rate (at least 16 kB, what TCP needs to reach it, but no
        # more than a quarter second of a thin link, and never under one full packet), and
        # a queue of 2 s of the rate before tbf drops, at least 16 kB (a TCP connection's
        # first flight): a thin link delays rather than loses.
        burst = int(max(min(max(bps / 8 / 100, 16_384), bps / 8 / 4), 1_600))
        limit = int(max(bps / 8 * 2, 16_384)) + burst
        shaping = ["root", "tbf", "rate", rate, "burst", f"{burst}b", "limit", f"{limit}b"]
        self._run(["ip", "netns", "exec", site.namespace, "tc", "qdisc", verb, "dev",
                   site.inner, *shaping])
        self._run(["tc", "qdisc", verb, "dev", site.outer, *shaping])

    def set_link(self, a: str, b: str, bandwidth: str) -> str:
        """Re-shape the link between ``a`` and ``b`` (one is the other's parent) while it runs."""
        bps = parse_bandwidth(bandwidth)
        for child, parent in ((a, b), (b, a)):
            site = self.sites.get(child)
            if site is not None and site.parent == parent:
                self._shape(site, bps, "change" if site.uplink_bps is not None else "add")
                return f"link {child} -> {parent} now {bandwidth} ({bps:,.0f} bit/s)"
        tree = ", ".join(f"{s.name}-{s.parent}" for s in self.sites.values() if s.parent)
        msg = f"no emulated link between {a} and {b}; the links are {tree}"
        raise ControlPlaneError(msg)

    def prefix(self, site: str) -> list[str]:
        """The command prefix that runs a process inside ``site``'s namespace."""
        return ["ip", "netns", "exec", self.sites[site].namespace]

    def down(self) -> None:
        """Remove every ``js-*`` namespace and link, and the state file; never fails half way."""
        namespaces = [line.split()[0] for line in self._quiet(["ip", "netns", "list"])
                      if line.startswith("js-")]
        for ns in namespaces:
            self._quiet(["ip", "netns", "del", ns])
        links = [line.split(":")[1].strip().split("@")[0]
                 for line in self._quiet(["ip", "-o", "link", "show"])
                 if ":" in line and line.split(":")[1].strip().startswith("js")]
        for link in links:
            self._quiet(["ip", "link", "del", link])
        self.state_file.unlink(missing_ok=True)

    def _quiet(self, command: Sequence[str]) -> list[str]:
        try:
            return self._run(command).splitlines()
        except ControlPlaneError:
            return []

    @classmethod
    def running(cls, topology: Topology, *, run: Run = _run,
                state_file: Path = STATE_FILE) -> WideArea:
        """The emulation a ``jetstream emulate`` process has up, for ``set-link``."""
        if not state_file.exists():
            msg = f"no emulation is running ({state_file} is missing); start one with " \
                  "`jetstream emulate TOPOLOGY`"
            raise ControlPlaneError(msg)
        recorded = json.loads(state_file.read_text())
        if recorded.get("topology") != topology.name:
            msg = (f"the running emulation is of {recorded.get('topology')!r}, not "
                   f"{topology.name!r}; pass --topology")
            raise ControlPlaneError(msg)
        return cls(topology, run=run, state_file=state_file)
