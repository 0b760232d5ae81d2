"""The aggregate functions of the DSL: ``js.count()``, ``js.sum("kb")``, ``js.top_k("url", 5)``."""

from __future__ import annotations

from jetstream.aggregates import Aggregate, Avg, Count, CountDistinct, Max, Min, Quantile, Sum
from jetstream.approx.sketches import ApproxCountDistinct, ApproxQuantile, TopKItems
from jetstream.errors import PlanError
from jetstream.expr import Col, Expr

__all__ = [
    "approx_count_distinct",
    "approx_quantile",
    "avg",
    "count",
    "count_distinct",
    "max",
    "min",
    "quantile",
    "sum",
    "top_k",
]

ColumnLike = str | Expr


def _input(column: ColumnLike, fn: str) -> Expr:
    if isinstance(column, Expr):
        return column
    if isinstance(column, str) and column:
        return Col(column)
    msg = f"{fn}: expected a column name or an expression, not {column!r}"
    raise PlanError(msg)


def count(column: ColumnLike | None = None) -> Aggregate:
    """The number of rows, or of non-NULL values of ``column``."""
    return Count(None if column is None else _input(column, "count"))


def sum(column: ColumnLike) -> Aggregate:
    return Sum(_input(column, "sum"))


def min(column: ColumnLike) -> Aggregate:
    return Min(_input(column, "min"))


def max(column: ColumnLike) -> Aggregate:
    return Max(_input(column, "max"))


def avg(column: ColumnLike) -> Aggregate:
    return Avg(_input(column, "avg"))


def count_distinct(column: ColumnLike) -> Aggregate:
    """Exact distinct count; holistic, so it cannot be split over sites cheaply."""
    return CountDistinct(_input(column, "count_distinct"))


def quantile(column: ColumnLike, q: float = 0.5) -> Aggregate:
    """Exact ``q``-quantile (nearest rank); holistic."""
    return Quantile(_input(column, "quantile"), q)


def approx_count_distinct(column: ColumnLike, lg_k: int = 12) -> Aggregate:
    """Distinct count from an HLL sketch (relative error about 1.6% at lg_k=12, 1 sigma)."""
    return ApproxCountDistinct(_input(column, "approx_count_distinct"), lg_k)


def approx_quantile(column: ColumnLike, q: float = 0.5, k: int = 200) -> Aggregate:
    """``q``-quantile from a KLL sketch (rank error about 1.3% at k=200)."""
    return ApproxQuantile(_input(column, "approx_quantile"), q, k)


def top_k(column: ColumnLike, k: int = 10, lg_max_k: int = 10) -> Aggregate:
    """The ``k`` most frequent values of ``column``, with count bounds (frequent-items sketch)."""
    return TopKItems(_input(column, "top_k"), k, lg_max_k)
