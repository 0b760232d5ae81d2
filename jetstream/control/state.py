"""What the global controller knows of the sites and the queries (``SiteState``,
``QueryState``), and the snapshot of it that the status, the dashboard and the metrics read
(``ControllerView``); and the pieces a site controller placed a query's fragment in
(``Piece``), which the controller keeps as placements."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from jetstream.aggtree.planner import PhysicalPlan
from jetstream.aggtree.topology import Link, Topology
from jetstream.approx.profile import LevelFigures
from jetstream.control.results_hub import write_atomically
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError

__all__ = ["ControllerView", "LinkReport", "Measurement", "Piece", "Placement", "QueryState",
           "QueryView", "SavedQueries", "SiteState", "SiteView"]


@dataclass(frozen=True)
class LinkReport:
    """What a site's heartbeat says of one query's link to its parent."""

    level: str
    level_index: int  # 0 exact, higher coarser
    pinned: bool
    sent_bytes: int  # by the site's current sender: starts again at 0 when it is replaced
    profile: tuple[LevelFigures, ...] = ()  # each level as measured (jetstream.approx.profile)


@dataclass(frozen=True)
class Measurement:
    """A link's bandwidth as a site's heartbeat last said it."""

    bandwidth_bps: float
    at: float  # the controller's clock
    site: str  # the link's ends: the site that measured it, and its peer
    peer: str


@dataclass(frozen=True)
class Piece:
    """A part of a site's fragment of a query, placed on one of its servers (what
    ``DeployFragment`` answers, and the site's heartbeat reports)."""

    query: str
    name: str  # "local stage", "merge 1/2", "final 2/4"
    server: str
    pid: int = 0  # the process that runs it: the site's own, or its server's worker
    address: str = ""  # that process's gRPC address
    #: Or "starting": a worker not registered yet, a local stage whose Spark starts or warms
    #: up; "restarting": a worker started again.
    state: str = "running"
    on_worker: bool = False


class Placement(NamedTuple):
    """Which of a site's servers runs a piece of a query, and in which process: as the site
    deployed it (no pid yet), then as its heartbeats say (workers restart)."""

    query: str
    piece: str  # "local stage", "merge", "final 2/3", ...
    server: str
    pid: int = 0
    address: str = ""
    state: str = ""  # "running", "starting", "restarting"; empty: not reported yet


@dataclass
class SiteState:
    name: str
    address: str | None = None
    last_seen: float | None = None
    alive: bool = False
    placements: list[Placement] = field(default_factory=list)
    input_bytes: int = 0  # raw logs landed in its input folder, as its last heartbeat said
    links: dict[str, LinkReport] = field(default_factory=dict)  # query -> its link's report
    interval_s: float = 0.0  # until its next heartbeat, as its last one said (0: not said)
    allows_code: bool = False  # runs a plan's map functions (jetstream site --allow-code)
    #: Each input folder: files landed and not read yet, how long ago the oldest landed (s).
    behind: dict[str, tuple[int, float]] = field(default_factory=dict)


@dataclass
class QueryState:
    name: str
    spec: bytes  # the query's plan as submitted (a serialized QueryPlan): what sites get
    query: Query
    plan: PhysicalPlan | None = None
    state: str = "running"  # running | degraded | finished | cancelled
    detail: str = ""
    replans: int = 0
    version: int = 0
    deployed: set[str] = field(default_factory=set)  # sites that hold the current fragment
    expected: tuple[str, ...] = ()  # every source site of the query, alive or not
    failures: dict[str, str] = field(default_factory=dict)  # site -> why its stage failed
    #: Site -> the records its stages dropped as late, as its last heartbeat said.
    late_records: dict[str, int] = field(default_factory=dict)
    backfill: str = ""  # what its backfill from the cubes did, readable
    #: Since the root last failed over: where the sites start sending again (see
    #: ResultsHub.unsettled_from); 0: the root never has.
    resend_from_ms: int = 0

    @property
    def active(self) -> bool:
        return self.state in ("running", "degraded")


@dataclass(frozen=True)
class SiteView:
    """A site as the controller saw it at one moment (see :class:`ControllerView`)."""

    name: str
    kind: str
    address: str | None
    alive: bool
    seconds_since_heartbeat: float | None  # None: never heard from
    placements: tuple[Placement, ...]
    input_bytes: int
    links: Mapping[str, LinkReport]  # query -> its link's report
    #: Each input folder: files landed and not read yet, how long ago the oldest landed (s).
    behind: Mapping[str, tuple[int, float]] = field(
        default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class QueryView:
    """A query as the controller saw it at one moment."""

    name: str
    state: str
    detail: str
    replans: int
    plan: PhysicalPlan | None
    #: Sites whose local stage of the query failed -> why.
    failures: Mapping[str, str] = field(default_factory=dict)
    #: Site -> the records its local stages dropped as late (their window had closed there).
    late_records: Mapping[str, int] = field(default_factory=dict)

    @property
    def parents(self) -> dict[str, str]:
        """Each site's parent in the query's current tree."""
        if self.plan is None:
            return {}
        return {f.site: f.parent for f in self.plan.fragments.values() if f.parent}


@dataclass(frozen=True)
class ControllerView:
    """A read-only snapshot of the controller's state, taken under its lock in one go: what
    the status call and the dashboard show, so that neither reads the controller's own."""

    topology: Topology
    sites: tuple[SiteView, ...]
    queries: tuple[QueryView, ...]
    #: Every link that is up (of the topology as measured), with the bytes/s the running
    #: queries plan to put on it.
    link_load: tuple[tuple[Link, float], ...]
    measured_bps: Mapping[frozenset[str], float]  # a link's bandwidth as last measured

    def query(self, name: str) -> QueryView | None:
        return next((q for q in self.queries if q.name == name), None)

    def parent(self, query: str, site: str) -> str | None:
        """``site``'s parent in ``query``'s current tree (None: none, or no such query)."""
        state = self.query(query)
        return None if state is None else state.parents.get(site)


class SavedQueries:
    """The queries a controller keeps in its state folder (none without one), and where its
    root is: ``queries.json``, written whole, atomically, read back by a controller started
    again (``jetstream controller --state-dir``)."""

    def __init__(self, state_dir: Path | None) -> None:
        self.path = state_dir / "queries.json" if state_dir is not None else None

    def load(self) -> tuple[str | None, list[dict[str, Any]]]:
        """The root as saved and each query's entry (None and none: nothing saved)."""
        if self.path is None or not self.path.exists():
            return None, []
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
            return str(document.get("root", "")), list(document["queries"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            msg = f"{self.path}: cannot read the saved queries ({e}); move the file away"
            raise ControlPlaneError(msg) from None

    def save(self, root: str, queries: Iterable[QueryState]) -> None:
        if self.path is None:
            return
        saved = [{"name": q.name, "plan": base64.b64encode(q.spec).decode("ascii"),
                  "state": q.state, "detail": q.detail,
                  "replans": q.replans, "version": q.version, "expected": list(q.expected),
                  "resend_from_ms": q.resend_from_ms}
                 for q in queries]
        write_atomically(self.path, json.dumps({"root": root, "queries": saved}, indent=1))
