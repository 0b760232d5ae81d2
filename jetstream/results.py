"""What a query produces: one :class:`WindowResult` per window."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

__all__ = ["WindowResult", "write_json_lines"]


@dataclass(frozen=True)
class WindowResult:
    """The rows of one event-time window ``[window_start, window_end)`` (epoch ms).

    ``exact`` is False when an approximate aggregate contributed; ``error_bound`` is then
    the largest relative error any value in ``rows`` can carry (0.0 when exact).

    A result of the distributed path also says how complete it is (``sites_reporting`` of
    ``sites_expected`` source sites), how long after the window could close it was made
    (``latency_s``: from when the last of its sites received the record that moved its
    watermark past the window's end), the wide-area bytes the window cost (``wan_bytes``), and its
    ``revision``: 0, then 1, 2, ... each time a late site's data corrects it, and
    ``warnings``: what a link on the way could not do (meet the SLO's latency without going
    past its ``max_error``, say), and ``missing_sites``: the source sites whose data it does
    not hold yet (dead, cut off, or late; a later revision corrects it when their data
    comes). The reference executor leaves these None (the lists empty).

    ``final`` says whether the result may still change (:mod:`jetstream.finality`): final
    and exact, it equals the reference executor's and no later revision changes it (a fault
    may repeat it, never alter it); otherwise ``provisional`` lists why (early, deadline,
    incomplete input, unsettled rounds, approximate), ``missing_sites`` the sites it waits
    for, and a later revision makes it final when it can. The reference executor's are final.

    ``rolled_up`` names the keys a link coarsened (key -> the coarser value's expression, see
    :mod:`jetstream.approx.rollup`): the rows are then at those coarser keys, exact there
    unless ``error_bound`` says otherwise, and ``exact`` is False. Empty: the query's own keys.
    """

    query: str
    window_start: int
    window_end: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    exact: bool = True
    error_bound: float | None = 0.0
    sites_reporting: int | None = None
    sites_expected: int | None = None
    latency_s: float | None = None
    wan_bytes: int | None = None
    revision: int = 0
    warnings: list[str] = field(default_factory=list)
    missing_sites: list[str] = field(default_factory=list)
    #: Answered from the sites' cubes (``jetstream history``), not by a live query.
    history: bool = False
    rolled_up: dict[str, str] = field(default_factory=dict)
    final: bool = True
    provisional: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_json_lines(results: Iterable[WindowResult], out: TextIO) -> None:
    """One JSON object per window: the format of ``jetstream run`` and ``jetstream local``."""
    for result in results:
        out.write(json.dumps(result.to_dict()) + "\n")
