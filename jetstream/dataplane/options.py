"""What a site is told to run (:class:`Assignment`), how it runs its data plane
(:class:`SiteOptions`, ``jetstream site``'s flags), and what a query's sender knows of its link.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from jetstream.aggtree.planner import Fragment
from jetstream.approx.profile import LevelFigures
from jetstream.dataplane.cubes import DEFAULT_RETENTION
from jetstream.dataplane.transport import Connect
from jetstream.stage.archive import ReadFiles
from jetstream.stage.gate import DEFAULT_HOLD_S
from jetstream.stage.warm import WARM_UP_S

__all__ = ["DEFAULT_DEADLINE_S", "Assignment", "LinkState", "SiteOptions"]


#: How long a merger waits for a silent input before a window goes out incomplete, when
#: the query's SLO does not say (``max_latency``).
DEFAULT_DEADLINE_S = 10.0


@dataclass(frozen=True)
class Assignment:
    """What a site is told to run for one query: its fragment and where things go."""

    fragment: Fragment
    spec: bytes  # the query's plan (a serialized jetstream.v1.QueryPlan)
    version: int = 0
    parent_address: str = ""  # the parent site's gRPC address; empty at the root
    covers: tuple[str, ...] = ()  # the source sites whose records reach the root through here
    expected: tuple[str, ...] = ()  # every source site of the query, alive or not
    #: The workers that merge the fragment's key partitions, in partition order: (the name
    #: their merged windows come back under, address). Set by the site controller when it
    #: runs them (:mod:`jetstream.control.workers`); empty, this process merges everything.
    workers: tuple[tuple[str, str], ...] = ()
    #: After the root failed over: the windows starting at or after this (epoch ms) are sent
    #: to the parent again, and merged again at the root, from the cube store (0: none).
    resend_from_ms: int = 0


@dataclass
class SiteOptions:
    """How a site runs its data plane (``jetstream site`` flags)."""

    input_dir: Path | None = None  # the folder log shippers drop this site's CSV files into
    state_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "jetstream")
    replay: bool = False  # process what the input holds now, then end
    deadline_s: float | None = None  # overrides the SLO's max_latency for window deadlines
    idle_s: float = 5.0  # an input without records this long is idle
    trigger_s: float = 0.25  # micro-batch interval of a live local stage
    #: A new file waits up to this long to share a micro-batch with the next, unless its
    #: records may hand a window on (:mod:`jetstream.stage.gate`); 0: it never waits.
    batch_hold_s: float = DEFAULT_HOLD_S
    #: What becomes of a live input's file once every query here has read it: archived
    #: (kept a while), deleted or kept in place (:mod:`jetstream.stage.archive`).
    read_files: ReadFiles = field(default_factory=ReadFiles)
    #: Before a live stage's stream starts, warm its JVM up on made-up records for at most
    #: this long (:mod:`jetstream.stage.warm`); 0: not at all.
    warm_up_s: float = WARM_UP_S
    level_interval_s: float = 5.0  # a link's degradation level changes at most this often
    #: Measure each level's bytes and error on the link's own windows (a profile,
    #: :mod:`jetstream.approx.profile`); off, the policy plans with the ladder's nominal
    #: weights and errors alone.
    profile: bool = True
    #: A link measures its profile on at most one window this often (each measurement
    #: costs a tenth of a second to seconds of the site's CPU, with its interpreter held).
    profile_interval_s: float = 30.0
    #: The local stage's Spark master; None: what the controller says (the topology's).
    #: Given up front, Spark starts before anything else (see ``SiteRuntime.session``).
    spark_master: str | None = None
    #: Spark settings over ``DEFAULT_SPARK_CONF``: ``jetstream site --spark-conf`` over the
    #: topology's ``spark_conf`` for the site. Read once, when Spark starts.
    spark_conf: dict[str, str] = field(default_factory=dict)
    #: Keep the partials the site sends in a cube store, ``state_dir/<site>/cubes.sqlite``:
    #: what the parent has not acked is sent again after a restart, and finished windows roll
    #: up for history. Off, they live in memory only (and two sites never share a file).
    cubes: bool = False
    #: Resolution (ms) -> seconds its windows are kept; see
    #: :class:`~jetstream.dataplane.cubes.CubeStore`.
    retention: Mapping[int, float] = field(default_factory=lambda: dict(DEFAULT_RETENTION))
    #: Whether children may send to this site's workers directly (``DataPlane.Routes``):
    #: not when peers reach the site through an address of another machine (``--advertise``:
    #: a NAT or proxy), which its workers do not have.
    offer_routes: bool = True
    #: A worker's wide-area bytes received so far, per link (its data plane's count): its
    #: progress reports carry them to its site, which counts them in its metrics.
    received: Callable[[], Mapping[str, int]] | None = None
    #: How the site dials its parent's data plane: ``jetstream site`` sets its
    #: ``Security.channel`` (mutual TLS, token); None, plaintext, is for in-process tests.
    connect: Connect | None = None
    #: This data plane is a worker of a site (``jetstream worker``): its parent is its own
    #: site's process, so its links are local hops, never degraded or counted as wide-area.
    worker: bool = False
    #: Added to every revision this data plane sends: a worker started again (its windows
    #: rebuilt from what its site sends it again) must replace what it sent before, so each
    #: start counts from a higher base (``jetstream worker --epoch``).
    revision_base: int = 0
    #: Whether a plan's ``map`` functions, which travel as code, may run here (``jetstream
    #: site --allow-code``); without it a plan that carries one is refused when deployed.
    allow_code: bool = False


@dataclass(frozen=True)
class LinkState:
    """What a query's sender knows of the site's link to its parent (see
    :meth:`SiteRuntime.links`)."""

    parent: str
    level: str
    level_index: int  # 0 exact, higher coarser
    pinned: bool  # held by an operator rather than chosen by the policy
    sent_bytes: int  # sent for the query, resends included
    throughput: float | None  # bytes/s, the policy's recent throughput (None: none lately)
    rate_bps: float | None = None  # what the link carries, as its acks time it (None: unknown)
    #: Each level's measured figures, exact first (jetstream.approx.profile); empty on a
    #: link that has no profile.
    profile: tuple[LevelFigures, ...] = ()
    #: The link, not the query, sets what crosses it, so :attr:`throughput` measures the
    #: link (see :attr:`jetstream.approx.policy.LinkPolicy.link_bound`).
    saturated: bool = False
