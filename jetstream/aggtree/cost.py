"""The planner's cost model: how many bytes a query's partials put on a link.

Deliberately simple and stated: a partial aggregate of one window holds one row per group
key the window saw (at most ``SourceLoad.distinct_keys``, at most one per event), each row
as large as its key and its aggregates' accumulators; a merge of several children's partials
holds every key of the largest child plus ``NEW_KEY_SHARE`` of the others' (sites of a CDN
see mostly the same domains). A stream that cannot be split ships its raw records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from jetstream.aggregates import Aggregate, AggregateKind, Avg, Count, Max, Min, Sum
from jetstream.aggtree.topology import SourceLoad
from jetstream.approx.sketches import ApproxCountDistinct, ApproxQuantile, TopKItems

__all__ = ["KEY_BYTES", "NEW_KEY_SHARE", "VALUE_BYTES", "WIRE_BYTES", "Load", "accumulator_bytes",
           "rate_text"]

#: Bytes a group key column takes in a partial row.
KEY_BYTES = 32
#: One value in a holistic aggregate's partial (an exact distinct count's or quantile's).
VALUE_BYTES = 16
#: Of the keys a second child brings to a merge, the share the first child did not have.
NEW_KEY_SHARE = 0.5


#: Aggregate type -> the size of its compacted accumulator on the wire, roughly (a holistic
#: aggregate's partial carries its values: see ``VALUE_BYTES``).
WIRE_BYTES: dict[type[Aggregate], Callable[[Any], int]] = {
    Count: lambda agg: 8,
    Min: lambda agg: 8,
    Max: lambda agg: 8,
    Sum: lambda agg: 16,
    Avg: lambda agg: 24,
    ApproxCountDistinct: lambda agg: 2 ** (agg.lg_k - 1) + 40,  # HLL_4: half a byte a bucket
    ApproxQuantile: lambda agg: 8 * 3 * agg.k,  # KLL keeps about 3k items past its first level
    TopKItems: lambda agg: 3 * 2 ** agg.lg_max_k * 16,  # items and counts, 3/4 full
}


def accumulator_bytes(aggregate: Aggregate) -> int:
    """The size of one aggregate's compacted accumulator on the wire, roughly: its type's row
    of ``WIRE_BYTES``, or its nearest base class's; 16 for one that has none."""
    for kind in type(aggregate).__mro__:
        if kind in WIRE_BYTES:
            return WIRE_BYTES[kind](aggregate)
    if aggregate.kind is AggregateKind.HOLISTIC:
        msg = f"{aggregate} is holistic: its partial has no fixed size"
        raise ValueError(msg)
    return 16


@dataclass(frozen=True)
class Load:
    """What one site sends its parent per window: partial rows, or raw records."""

    keys: float = 0.0  # partial rows per window
    raw_bytes_per_s: float = 0.0  # records that could not be aggregated on the way

    def bytes_per_s(self, row_bytes: int, every_s: float) -> float:
        return self.keys * row_bytes / every_s + self.raw_bytes_per_s

    @staticmethod
    def of_source(source: SourceLoad, window_s: float, split: bool, grouped: bool = True,
                  values: int = 0) -> Load:
        """A source's load: raw records if not ``split``, one row a window if not ``grouped``;
        ``values``: how many holistic aggregates carry a value of each record in their
        partials (``VALUE_BYTES`` each)."""
        if not split:
            return Load(raw_bytes_per_s=source.events_per_s * source.bytes_per_event)
        keys = float(source.distinct_keys) if grouped else 1.0
        return Load(keys=min(keys, source.events_per_s * window_s),
                    raw_bytes_per_s=source.events_per_s * VALUE_BYTES * values)

    @staticmethod
    def merged(loads: Iterable[Load]) -> Load:
        loads = list(loads)
        keys = sorted((load.keys for load in loads), reverse=True)
        merged_keys = keys[0] + NEW_KEY_SHARE * sum(keys[1:]) if keys else 0.0
        return Load(merged_keys, sum(load.raw_bytes_per_s for load in loads))


def rate_text(bytes_per_s: float) -> str:
    """A rate as people read a link's: ``1.5 Mbit/s``."""
    bits = bytes_per_s * 8
    for unit, size in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= size:
            return f"{bits / size:.1f} {unit}"
    return f"{bits:.0f} bit/s"
