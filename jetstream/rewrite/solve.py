"""Solving a comparison for its one column: ``x + c < t`` becomes ``x < t - c``.

Used by filter pushback once a predicate has been rewritten in terms of a map's input. The
result is exact for integer additions and subtractions; where the inverse is not exact
(multiplication, division, floating point), the solved predicate is relaxed so that it never
drops a record the original keeps, and the caller keeps the original above it.
"""

from __future__ import annotations

import math

from jetstream.expr import And, Arith, Col, Compare, Expr, Lit, Neg
from jetstream.schema import DataType, Schema

__all__ = ["solve"]

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}

#: How far a relaxed threshold moves, relative to its size: far beyond double rounding error.
_SLACK = 1e-9


def _number(expr: Expr) -> int | float | None:
    if isinstance(expr, Lit) and isinstance(expr.value, int | float) and not isinstance(
            expr.value, bool):
        return expr.value
    return None


def solve(predicate: Expr, schema: Schema) -> tuple[Expr, bool] | None:
    """``predicate`` with each comparison solved for its column, and whether that is exact.

    Handles ``f(x) op t`` and ``t op f(x)`` where ``f`` applies ``+ - * /`` by number literals
    and negation to one column, and conjunctions of such comparisons. Only integer columns,
    literals and additions solve exactly. Returns None when nothing can be solved.
    """
    if isinstance(predicate, And):
        left, right = solve(predicate.left, schema), solve(predicate.right, schema)
        if left is None and right is None:
            return None
        (lp, lx), (rp, rx) = left or (predicate.left, True), right or (predicate.right, True)
        return And(lp, rp), lx and rx
    if not isinstance(predicate, Compare):
        return None
    op, side, threshold = predicate.op, predicate.left, _number(predicate.right)
    if threshold is None:
        op, side, threshold = _FLIP[op], predicate.right, _number(predicate.left)
    if threshold is None or isinstance(side, Col):
        return None
    exact = isinstance(threshold, int)
    t: int | float = threshold
    while not isinstance(side, Col):
        if isinstance(side, Neg):
            op, t, side = _FLIP[op], -t, side.operand
            continue
        if not isinstance(side, Arith):
            return None
        c_right, c_left = _number(side.right), _number(side.left)
        if side.op == "+" and c_right is not None:
            t, side = t - c_right, side.left
        elif side.op == "+" and c_left is not None:
            t, side = t - c_left, side.right
        elif side.op == "-" and c_right is not None:
            t, side = t + c_right, side.left
        elif side.op == "-" and c_left is not None:  # c - e op t  <=>  e flip(op) c - t
            op, t, side = _FLIP[op], c_left - t, side.right
        elif side.op in "*/" and (c := c_right if c_right is not None else
                                  c_left if side.op == "*" else None):
            t = t / c if side.op == "*" else t * c
            op, exact = (_FLIP[op] if c < 0 else op), False
            side = side.left if c_right is not None else side.right
        else:
            return None
        exact = exact and isinstance(t, int)
    if exact and schema.dtype(side.name) is DataType.INT:
        return Compare(op, side, Lit(t)), True
    if op in ("==", "!="):
        return None  # an inexact equality cannot be relaxed into a comparison
    slack = abs(t) * _SLACK + _SLACK
    if op in ("<", "<="):
        op, bound = "<=", t + slack
        if schema.dtype(side.name) is DataType.INT:
            bound = math.floor(bound)  # the same integers pass; the plan reads better
    else:
        op, bound = ">=", t - slack
        if schema.dtype(side.name) is DataType.INT:
            bound = math.ceil(bound)
    return Compare(op, side, Lit(bound)), False
