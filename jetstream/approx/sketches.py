"""Approximate aggregates from DataSketches: HLL distinct counts, KLL quantiles, frequent items.

Each follows the :class:`~jetstream.aggregates.Aggregate` contract, and ``error_bound`` reports
the relative error of what ``extract`` returns. No sketch is written by hand here: the same
binary formats come out of Spark's DataSketches aggregates at the edge. A sketch that arrives
from a peer is checked field by field before DataSketches reads it (see ``check_hll``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from jetstream.aggregates import (
    Aggregate,
    AggregateKind,
    check_fraction,
    check_int,
    check_positive,
)
from jetstream.approx.summaries import (
    check_frequent_strings,
    check_hll,
    check_kll_doubles,
    datasketches,
    hll_error,
)
from jetstream.errors import PlanError
from jetstream.schema import DataType

if TYPE_CHECKING:
    import datasketches as ds

__all__ = ["MAX_LG_MAX_K", "ApproxCountDistinct", "ApproxQuantile", "TopKItems"]

#: The largest frequent-items sketch accepted from a peer (as ``to_items`` and ``top_k`` offer).
MAX_LG_MAX_K = 26


class _Sketch(Aggregate):
    """A DataSketches accumulator crosses the wire as its own serialized bytes (base64)."""

    sketch_type: ClassVar[str]  # the name of its class in datasketches

    def encode(self, acc: Any) -> str:
        data = acc.serialize_compact() if hasattr(acc, "serialize_compact") else acc.serialize()
        return base64.b64encode(data).decode("ascii")

    def decode(self, data: Any) -> Any:
        try:
            raw = base64.b64decode(data, validate=True)
        except (TypeError, ValueError) as e:
            msg = f"{self.name}: not a serialized sketch: {e}"
            raise ValueError(msg) from None
        try:
            self.check(raw)  # DataSketches' readers trust the bytes: see check_hll
        except ValueError as e:
            raise ValueError(f"{self.name}: {e}") from None
        try:
            return getattr(datasketches(), type(self).sketch_type).deserialize(raw)
        except (TypeError, ValueError, RuntimeError, IndexError, MemoryError) as e:
            msg = f"{self.name}: not a serialized sketch: {e}"
            raise ValueError(msg) from None

    def check(self, data: bytes) -> None:
        """Raise ValueError unless ``data`` is safe to deserialize as this aggregate's sketch."""
        raise NotImplementedError

@dataclass(frozen=True, eq=False)
class ApproxCountDistinct(_Sketch):
    """Distinct values estimated by an HLL sketch of ``2**lg_k`` buckets."""

    lg_k: int = 12
    name: ClassVar[str] = "approx_count_distinct"
    sketch_type: ClassVar[str] = "hll_sketch"
    partial: ClassVar[str] = "an HLL sketch"
    kind: ClassVar[AggregateKind] = AggregateKind.APPROXIMATE

    def __post_init__(self) -> None:
        check_int(self.lg_k, 4, 21, f"{self.name}: lg_k")

    def check(self, data: bytes) -> None:
        check_hll(data, self.lg_k)

    def _result_type(self, input_type: DataType) -> DataType:
        if input_type is DataType.LIST:
            msg = f"{self.name} cannot hash {self.expr}, a list"
            raise PlanError(msg)
        return DataType.INT

    def create(self) -> ds.hll_sketch:
        return datasketches().hll_sketch(self.lg_k)

    def add(self, acc: ds.hll_sketch, value: Any) -> ds.hll_sketch:
        acc.update(value)
        return acc

    def merge(self, acc: ds.hll_sketch, other: ds.hll_sketch) -> ds.hll_sketch:
        union = datasketches().hll_union(self.lg_k)
        union.update(acc)
        union.update(other)
        return union.get_result()

    def extract(self, acc: ds.hll_sketch) -> int:
        return round(acc.get_estimate())

    def error_bound(self, acc: ds.hll_sketch) -> float:
        return hll_error(acc)


@dataclass(frozen=True, eq=False)
class ApproxQuantile(_Sketch):
    """The ``q``-quantile from a KLL sketch; the bound is the normalized rank error."""

    q: float = 0.5
    k: int = 200
    name: ClassVar[str] = "approx_quantile"
    sketch_type: ClassVar[str] = "kll_doubles_sketch"
    partial: ClassVar[str] = "a KLL sketch"
    kind: ClassVar[AggregateKind] = AggregateKind.APPROXIMATE

    def __post_init__(self) -> None:
        check_fraction(self.q, self.name)
        check_int(self.k, 8, 65535, f"{self.name}: k")

    def check(self, data: bytes) -> None:
        check_kll_doubles(data, self.k)

    def _result_type(self, input_type: DataType) -> DataType:
        self._need_numeric(input_type)
        return DataType.FLOAT

    def create(self) -> ds.kll_doubles_sketch:
        return datasketches().kll_doubles_sketch(self.k)

    def add(self, acc: ds.kll_doubles_sketch, value: Any) -> ds.kll_doubles_sketch:
        acc.update(float(value))
        return acc

    def merge(self, acc: ds.kll_doubles_sketch,
              other: ds.kll_doubles_sketch) -> ds.kll_doubles_sketch:
        acc.merge(other)
        return acc

    def extract(self, acc: ds.kll_doubles_sketch) -> float | None:
        # inclusive: the smallest value whose rank is >= q, as Quantile defines it
        return None if acc.is_empty() else float(acc.get_quantile(self.q, True))

    def error_bound(self, acc: ds.kll_doubles_sketch) -> float:
        return float(acc.normalized_rank_error(False)) if acc.is_estimation_mode() else 0.0

    def __str__(self) -> str:
        return f"{self.name}({self.expr}, {self.q})"


@dataclass(frozen=True, eq=False)
class TopKItems(_Sketch):
    """The ``k`` most frequent values, from a frequent-items sketch of at most 2**lg_max_k items.

    ``extract`` gives ``[{"item", "count", "lb", "ub"}, ...]``, most frequent first; the true
    count of each item lies in ``[lb, ub]``. Values are counted by their text.
    """

    k: int = 10
    lg_max_k: int = 10
    name: ClassVar[str] = "top_k"
    sketch_type: ClassVar[str] = "frequent_strings_sketch"
    partial: ClassVar[str] = "a frequent-items sketch"
    kind: ClassVar[AggregateKind] = AggregateKind.APPROXIMATE

    def __post_init__(self) -> None:
        check_positive(self.k, f"{self.name}: k")
        # At DataSketches' smallest size (3) our property tests saw merged sketches report an
        # upper bound below the true count, so the smallest size offered is 4.
        check_int(self.lg_max_k, 4, MAX_LG_MAX_K, f"{self.name}: lg_max_k")

    def check(self, data: bytes) -> None:
        check_frequent_strings(data, self.lg_max_k)

    def _result_type(self, input_type: DataType) -> DataType:
        if input_type is DataType.LIST:
            msg = f"{self.name} cannot count {self.expr}, a list"
            raise PlanError(msg)
        return DataType.LIST

    def create(self) -> ds.frequent_strings_sketch:
        return datasketches().frequent_strings_sketch(self.lg_max_k)

    def add(self, acc: ds.frequent_strings_sketch, value: Any) -> ds.frequent_strings_sketch:
        acc.update(str(value))
        return acc

    def merge(self, acc: ds.frequent_strings_sketch,
              other: ds.frequent_strings_sketch) -> ds.frequent_strings_sketch:
        acc.merge(other)
        return acc

    def _items(self, acc: ds.frequent_strings_sketch) -> list[tuple[str, int, int, int]]:
        items = acc.get_frequent_items(
            datasketches().frequent_items_error_type.NO_FALSE_NEGATIVES)
        return sorted(items, key=lambda it: (-it[1], it[0]))

    def extract(self, acc: ds.frequent_strings_sketch) -> list[dict[str, Any]]:
        return [{"item": item, "count": est, "lb": lb, "ub": ub}
                for item, est, lb, ub in self._items(acc)[: self.k]]

    def error_bound(self, acc: ds.frequent_strings_sketch) -> float:
        if acc.is_empty():
            return 0.0
        widest = max((ub - lb for _, _, lb, ub in self._items(acc)), default=0)
        return float(widest / acc.total_weight)

    def __str__(self) -> str:
        return f"{self.name}({self.expr}, {self.k})"


# -- checking a peer's sketch before DataSketches reads it ------------------------------------
