"""Links too thin for a query's exact partials: the degradation level the plan starts each
at, from the query's SLO.

A link over capacity at the declared load is not refused outright when the query can
degrade (:mod:`jetstream.approx.levels`) and its SLO allows it: the link gets the cheapest
level whose nominal error is within the SLO's ``max_error`` (the user said that much error
is fine, and the fewest bytes leave the most room), if that level fits the link; its sender's
policy starts there and steps up as the link allows. A query's declared roll-up
(:mod:`jetstream.approx.rollup`) has nominal error 0, so it is allowed with or without
``max_error``. A query whose allowed levels do not fit is refused, naming the link and the
level (and the ``max_error``) that would fit.

A level's bytes at the declared load are estimated from the exact partial's: a truncation
keeps ``factor * k`` of its rows, a frequent-items sketch weighs about as many rows as
:func:`~jetstream.approx.levels.ladder` says, and a sketch of distinct counts and quantiles
its share of the exact partial (the ladder's guess, which the policy corrects from the
windows it sees).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from jetstream.aggtree.cost import rate_text
from jetstream.aggtree.topology import Topology
from jetstream.approx.levels import (
    ROLLUP_WEIGHT,
    DegradationLevel,
    Ladder,
    Ranking,
    heaviest,
    ladder,
)
from jetstream.dsl import SLO, Query
from jetstream.errors import PlacementError
from jetstream.operators import WindowAggregate
from jetstream.rewrite import distributed

__all__ = ["PlannedLevel", "thin_links"]


@dataclass(frozen=True)
class PlannedLevel:
    """The level a thin link starts at, what it is expected to carry, and its error."""

    index: int
    name: str
    bytes_per_s: float
    exact_bytes_per_s: float
    error_bound: float


def thin_links(query: Query, tree: nx.DiGraph, topology: Topology,
               aggregate: WindowAggregate, rank: Ranking | None, row_bytes: int,
               every_s: float) -> dict[str, PlannedLevel]:
    """For each edge of ``tree`` whose exact partials do not fit (see :class:`_Budget`), the
    level its child starts at (the edge's ``bytes_per_s`` and ``utilisation`` become that
    level's); raises PlacementError, naming the link and what would fit, for one that no
    level allowed by the SLO fits."""
    slo = query.slo
    max_error = slo.max_error if slo is not None else None
    levels: Ladder | None = None  # made for the first link that needs it
    planned = {}
    for child, parent, edge in sorted(tree.edges(data=True)):
        link = topology.link(child, parent)
        budget = _Budget(f"{child}-{parent}", link.bandwidth_bps, link.latency_ms, slo,
                         every_s)
        exact = edge["bytes_per_s"]
        if budget.fits(exact):
            continue
        levels = levels or ladder(rank, aggregate, heaviest(distributed(query)))
        rows = exact * every_s / row_bytes if row_bytes else 0.0
        shares = [_share(levels, level, rows) for level in levels.levels]
        fitting = [lv for lv, share in zip(levels.levels, shares, strict=True)
                   if budget.fits(exact * share)]
        # (A declared roll-up's level, nominal error 0, needs no max_error.)
        allowed = [lv for lv in fitting if lv.error_bound <= (max_error or 0.0)]
        if not allowed:
            raise PlacementError(f"{budget.why_not(exact)}; {_what_fits(fitting, max_error)}")
        level = allowed[-1]  # the cheapest the SLO allows
        rate = exact * shares[level.index]
        edge.update(bytes_per_s=rate, utilisation=rate * 8 / link.bandwidth_bps)
        planned[child] = PlannedLevel(level.index, level.name, rate, exact, level.error_bound)
    return planned


@dataclass(frozen=True)
class _Budget:
    """What one link of a plan may carry for a query: at most its bandwidth, and the SLO's
    ``max_wan_kbps`` if less; and with ``max_latency``, a window's partial must cross it
    (its bytes at that rate, and the link's latency) within it."""

    link: str
    bandwidth_bps: float
    latency_ms: float
    slo: SLO | None
    every_s: float

    @property
    def bps(self) -> float:
        cap = self.slo.max_wan_kbps if self.slo is not None else None
        return self.bandwidth_bps if cap is None else min(self.bandwidth_bps, cap * 1000)

    def crossing_s(self, bytes_per_s: float) -> float:
        return bytes_per_s * self.every_s * 8 / self.bps + self.latency_ms / 1000

    def fits(self, bytes_per_s: float) -> bool:
        latency_ms = self.slo.max_latency_ms if self.slo is not None else None
        return bytes_per_s * 8 <= self.bps and (
            latency_ms is None or self.crossing_s(bytes_per_s) <= latency_ms / 1000)

    def why_not(self, bytes_per_s: float) -> str:
        """Why partials of ``bytes_per_s`` do not fit."""
        if bytes_per_s * 8 > self.bandwidth_bps:
            return (f"link {self.link} is over capacity: the query needs "
                    f"{rate_text(bytes_per_s)} of partials and the link has "
                    f"{rate_text(self.bandwidth_bps / 8)}")
        if bytes_per_s * 8 > self.bps:
            return (f"link {self.link}: the query needs {rate_text(bytes_per_s)} of partials "
                    f"and its SLO's max_wan_kbps allows {rate_text(self.bps / 8)}")
        assert self.slo is not None and self.slo.max_latency_ms is not None
        return (f"link {self.link}: a window's partials take {self.crossing_s(bytes_per_s):.2f}"
                f" s to cross it, over the SLO's max_latency of "
                f"{self.slo.max_latency_ms / 1000:g} s")


def _share(levels: Ladder, level: DegradationLevel, rows: float) -> float:
    """What a window weighs at ``level``, as a share of its exact partial of ``rows`` rows."""
    if level.index == 0:
        return 1.0
    how = levels.encoding(level)
    if how.keep is None and how.lg_max_k is None:  # rolled up, or holistic values sketched
        return level.bytes_per_window / levels.levels[0].bytes_per_window
    kept = min(1.0, level.bytes_per_window / rows) if rows else 1.0
    return min(kept, ROLLUP_WEIGHT) if how.rollup else kept


def _what_fits(fitting: list[DegradationLevel], max_error: float | None) -> str:
    degraded = [lv for lv in fitting if lv.index > 0]
    if not degraded:
        return ("no degradation level of the query fits it either: give the link more "
                "bandwidth, relax the SLO, or send less (a coarser group key, a filter "
                "before the aggregate)")
    finest = degraded[0]
    said = ("the query's SLO sets no max_error" if max_error is None
            else f"the SLO's max_error={max_error:g} allows none")
    return (f"{said}; level {finest.name!r} (nominal error {finest.error_bound:g}) would "
            f"fit: js.SLO(max_error={finest.error_bound:g}) allows it")
