"""Aggregates: one definition each, with the life of Beam's CombineFn.

Every aggregate turns values into an accumulator and back::

    acc = agg.create()
    acc = agg.add(acc, value)        # may mutate ``acc``; returns the accumulator to keep
    acc = agg.merge(acc, other)      # may mutate ``acc``, never ``other``
    acc = agg.compact(acc)           # before an accumulator crosses a wire
    wire = agg.encode(acc)           # a JSON value; agg.decode(wire) gives it back
    value = agg.extract(acc)         # does not mutate ``acc``

The planner derives the partial/merge/final split of a query from this one definition: sites
``create``/``add``/``compact``, aggregators ``merge``, the root ``extract``. ``kind`` says what
the split costs: distributive and algebraic accumulators are small, holistic ones grow with the
data (the planner refuses to split them), approximate ones are DataSketches sketches of bounded
size (in :mod:`jetstream.approx.sketches`).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from jetstream.approx import summaries
from jetstream.errors import PlanError
from jetstream.expr import Expr
from jetstream.schema import DataType, Schema

__all__ = [
    "Aggregate",
    "AggregateKind",
    "Avg",
    "Count",
    "CountDistinct",
    "Max",
    "Min",
    "Quantile",
    "Sum",
    "check_fraction",
    "check_int",
]


class AggregateKind(enum.Enum):
    """How an aggregate splits over sites (Gray et al.'s classes, plus sketches)."""

    DISTRIBUTIVE = "distributive"  # the partial is the same function: count, sum, min, max
    ALGEBRAIC = "algebraic"  # a fixed-size tuple of distributive partials: avg
    HOLISTIC = "holistic"  # the partial grows with the data: exact distinct count, quantile
    APPROXIMATE = "approximate"  # a bounded-size sketch with an error bound


@dataclass(frozen=True, eq=False)
class Aggregate:
    """Base of every aggregate; ``expr`` is the input (None for ``count()`` of rows).

    Values are evaluated by the caller; NULL (None) values are skipped, as in SQL.
    """

    expr: Expr | None
    name: ClassVar[str]
    kind: ClassVar[AggregateKind]
    #: What a partial of this aggregate carries, for explain.
    partial: ClassVar[str]

    @property
    def exact(self) -> bool:
        return self.kind is not AggregateKind.APPROXIMATE

    @property
    def decomposable(self) -> bool:
        """Whether partials of this aggregate can be merged with bounded size."""
        return self.kind is not AggregateKind.HOLISTIC

    def result_type(self, schema: Schema) -> DataType:
        """The type of the result over ``schema``; raises PlanError if the input does not fit."""
        if self.expr is None:
            msg = f"{self.name} needs an input column"
            raise PlanError(msg)
        return self._result_type(self.expr.dtype(schema))

    def _result_type(self, input_type: DataType) -> DataType:
        return input_type

    def _need_numeric(self, input_type: DataType) -> DataType:
        if not input_type.is_numeric:
            msg = f"{self.name} needs a number, but {self.expr} is {input_type.value}"
            raise PlanError(msg)
        return input_type

    def create(self) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, value: Any) -> Any:
        raise NotImplementedError

    def merge(self, acc: Any, other: Any) -> Any:
        raise NotImplementedError

    def compact(self, acc: Any) -> Any:
        return acc

    def extract(self, acc: Any) -> Any:
        return acc

    def encode(self, acc: Any) -> Any:
        """The accumulator as a JSON value (numbers, strings, lists), for the wire."""
        return acc

    def decode(self, data: Any) -> Any:
        """An accumulator from ``encode``'s output; raises ValueError if it cannot be one."""
        return data

    def error_bound(self, acc: Any) -> float:
        """The largest relative error ``extract`` can have: 0.0 for exact aggregates."""
        return 0.0

    def is_exact(self, acc: Any) -> bool:
        """Whether ``extract(acc)`` is exact: an exact aggregate's partial stepped down to a
        sketch on a thin link no longer is."""
        return self.exact

    def __str__(self) -> str:
        return f"{self.name}({'' if self.expr is None else self.expr})"


@dataclass(frozen=True, eq=False)
class Count(Aggregate):
    """Rows, or non-NULL values of ``expr``."""

    expr: Expr | None = None
    name: ClassVar[str] = "count"
    partial: ClassVar[str] = "a count"
    kind: ClassVar[AggregateKind] = AggregateKind.DISTRIBUTIVE

    def result_type(self, schema: Schema) -> DataType:
        if self.expr is not None:
            self.expr.dtype(schema)
        return DataType.INT

    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def decode(self, data: Any) -> int:
        if not isinstance(data, int) or isinstance(data, bool) or data < 0:
            msg = f"{self.name}: not a count: {data!r:.80}"
            raise ValueError(msg)
        return data

    def merge(self, acc: int, other: int) -> int:
        return acc + other


def _add_exactly(partials: list[float], x: float) -> None:
    """Add ``x`` to ``partials`` (Shewchuk): they stay non-overlapping and sum exactly.

    So a float sum does not depend on the order of its terms or on how they were split over
    sites: ``math.fsum(partials)`` is the correctly rounded total either way. The exception
    is a total beyond the largest double: it becomes the infinity (or, with infinities of
    both signs, the NaN) that float addition gives, and stays that.
    """
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        if not math.isfinite(hi):
            partials[:] = [hi]
            return
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


@dataclass(frozen=True, eq=False)
class Sum(Aggregate):
    """The exact total: integers as integers, floats as exact partial sums (see above).

    The accumulator is ``[values seen, integer total, float partials]``.
    """

    name: ClassVar[str] = "sum"
    partial: ClassVar[str] = "an exact sum"
    kind: ClassVar[AggregateKind] = AggregateKind.DISTRIBUTIVE

    def _result_type(self, input_type: DataType) -> DataType:
        return self._need_numeric(input_type)

    def create(self) -> list[Any]:
        return [0, 0, []]

    def add(self, acc: list[Any], value: Any) -> list[Any]:
        acc[0] += 1
        if isinstance(value, float):
            _add_exactly(acc[2], value)
        else:
            acc[1] += value
        return acc

    def merge(self, acc: list[Any], other: list[Any]) -> list[Any]:
        acc[0] += other[0]
        acc[1] += other[1]
        for x in other[2]:
            _add_exactly(acc[2], x)
        return acc

    def extract(self, acc: list[Any]) -> Any:
        if not acc[0]:
            return None
        return math.fsum([*acc[2], acc[1]]) if acc[2] else acc[1]

    def decode(self, data: Any) -> list[Any]:
        if not (isinstance(data, list) and len(data) == 3 and isinstance(data[0], int)
                and isinstance(data[1], int | float) and isinstance(data[2], list)
                and all(type(x) is float for x in data[2])):
            msg = f"{self.name}: not a partial sum: {data!r:.80}"
            raise ValueError(msg)
        return [data[0], data[1], list(data[2])]


class _Extreme(Aggregate):
    pick: ClassVar[Any]

    def _result_type(self, input_type: DataType) -> DataType:
        if input_type is DataType.LIST:
            msg = f"{self.name} cannot order {self.expr}, a list"
            raise PlanError(msg)
        return input_type

    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return value if acc is None else type(self).pick(acc, value)

    def merge(self, acc: Any, other: Any) -> Any:
        return acc if other is None else self.add(acc, other)

    def decode(self, data: Any) -> Any:
        if isinstance(data, list | dict):
            msg = f"{self.name}: not a single value: {data!r:.80}"
            raise ValueError(msg)
        return data


@dataclass(frozen=True, eq=False)
class Min(_Extreme):
    name: ClassVar[str] = "min"
    partial: ClassVar[str] = "a minimum"
    kind: ClassVar[AggregateKind] = AggregateKind.DISTRIBUTIVE
    pick: ClassVar[Any] = min


@dataclass(frozen=True, eq=False)
class Max(_Extreme):
    name: ClassVar[str] = "max"
    partial: ClassVar[str] = "a maximum"
    kind: ClassVar[AggregateKind] = AggregateKind.DISTRIBUTIVE
    pick: ClassVar[Any] = max


@dataclass(frozen=True, eq=False)
class Avg(Sum):
    """The mean: the exact sum and the count travel together, so partials merge exactly."""

    name: ClassVar[str] = "avg"
    partial: ClassVar[str] = "a sum and a count"
    kind: ClassVar[AggregateKind] = AggregateKind.ALGEBRAIC

    def _result_type(self, input_type: DataType) -> DataType:
        self._need_numeric(input_type)
        return DataType.FLOAT

    def extract(self, acc: list[Any]) -> float | None:
        total = super().extract(acc)
        return None if total is None else total / acc[0]


@dataclass(frozen=True, eq=False)
class CountDistinct(Aggregate):
    """The exact number of distinct values: holistic, its partial is the set of values — or,
    once a thin link has stepped it down, an HLL sketch (:mod:`jetstream.approx.holistic`),
    and the count an estimate with its ``error_bound``."""

    name: ClassVar[str] = "count_distinct"
    partial: ClassVar[str] = "the set of values"
    kind: ClassVar[AggregateKind] = AggregateKind.HOLISTIC

    def _result_type(self, input_type: DataType) -> DataType:
        if input_type is DataType.LIST:
            msg = f"{self.name} cannot hash {self.expr}, a list"
            raise PlanError(msg)
        return DataType.INT

    def create(self) -> set[Any]:
        return set()

    def add(self, acc: Any, value: Any) -> Any:
        if isinstance(acc, set):
            acc.add(value)
        else:
            acc.update(value)
        return acc

    def merge(self, acc: Any, other: Any) -> Any:
        if isinstance(acc, set) and isinstance(other, set):
            acc |= other
            return acc
        return summaries.merge_distinct(acc, other)

    def extract(self, acc: Any) -> int:
        return len(acc) if isinstance(acc, set) else round(acc.get_estimate())

    def is_exact(self, acc: Any) -> bool:
        return isinstance(acc, set)

    def error_bound(self, acc: Any) -> float:
        return 0.0 if isinstance(acc, set) else summaries.distinct_error(acc)

    def encode(self, acc: Any) -> Any:
        return list(acc) if isinstance(acc, set) else summaries.encode(acc)

    def decode(self, data: Any) -> Any:
        if isinstance(data, dict):
            return summaries.decode(self.name, data)
        if not isinstance(data, list):
            msg = f"{self.name}: not a list of values: {data!r:.80}"
            raise ValueError(msg)
        return set(data)


def check_int(value: int, low: int, high: int, what: str) -> None:
    """Refuse a size parameter that is not an integer in ``[low, high]``."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        msg = f"{what} must be an integer between {low} and {high}, not {value!r}"
        raise PlanError(msg)


def check_positive(value: object, what: str, hint: str = "") -> None:
    """Refuse a count that is not a positive integer; ``hint`` says what to ask for instead."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{what} must be a positive integer, not {value!r}" + (f"; {hint}" if hint else "")
        raise PlanError(msg)


def check_fraction(q: float, what: str) -> None:
    if not isinstance(q, int | float) or isinstance(q, bool) or not 0.0 <= q <= 1.0:
        msg = f"{what}: q must be a fraction in [0, 1], not {q!r}"
        raise PlanError(msg)


@dataclass(frozen=True, eq=False)
class Quantile(Aggregate):
    """The exact ``q``-quantile by nearest rank: the smallest value with rank >= q.

    That is the ``inclusive`` definition DataSketches' KLL uses, so approximate and exact
    quantiles answer the same question. Holistic: its partial is every value — or, once a
    thin link has stepped it down, a KLL sketch (:mod:`jetstream.approx.holistic`), and the
    quantile one within the sketch's rank error (its ``error_bound``).
    """

    q: float = 0.5
    name: ClassVar[str] = "quantile"
    partial: ClassVar[str] = "every value"
    kind: ClassVar[AggregateKind] = AggregateKind.HOLISTIC

    def __post_init__(self) -> None:
        check_fraction(self.q, self.name)

    def _result_type(self, input_type: DataType) -> DataType:
        return self._need_numeric(input_type)

    def create(self) -> list[Any]:
        return []

    def add(self, acc: Any, value: Any) -> Any:
        if isinstance(acc, list):
            acc.append(value)
        else:
            acc = summaries.merge_quantile(acc, [value])
        return acc

    def merge(self, acc: Any, other: Any) -> Any:
        if isinstance(acc, list) and isinstance(other, list):
            acc.extend(other)
            return acc
        return summaries.merge_quantile(acc, other)

    def encode(self, acc: Any) -> Any:
        return acc if isinstance(acc, list) else summaries.encode(acc)

    def decode(self, data: Any) -> Any:
        if isinstance(data, dict):
            return summaries.decode(self.name, data)
        if not isinstance(data, list):
            msg = f"{self.name}: not a list of values: {data!r:.80}"
            raise ValueError(msg)
        return data

    def extract(self, acc: Any) -> Any:
        if not isinstance(acc, list):
            return summaries.quantile_of(acc, self.q)
        if not acc:
            return None
        ordered = sorted(acc)
        rank = max(math.ceil(self.q * len(ordered)), 1)
        return ordered[rank - 1]

    def is_exact(self, acc: Any) -> bool:
        return self.error_bound(acc) == 0.0

    def error_bound(self, acc: Any) -> float:
        return 0.0 if isinstance(acc, list) else summaries.quantile_error(acc)

    def __str__(self) -> str:
        return f"{self.name}({self.expr}, {self.q})"
