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

#: A relative error far beyond what a few double roundings can cause (about 1e-16 each).
_EPS = 1e-9
#: Past these overall factors a column's term can underflow or overflow, beyond any bound.
_SAFE_SCALE = (1e-150, 1e150)
#: The least a relaxed threshold moves.
_SLACK = 1e-9


def _number(expr: Expr) -> int | float | None:
    if isinstance(expr, Lit) and isinstance(expr.value, int | float) and not isinstance(
            expr.value, bool):
        return expr.value
    return None


def _peel(op: str, side: Expr, t: int | float
          ) -> tuple[str, Col, int | float, float, bool] | None:
    """Undo ``side``'s steps one by one.

    Returns (op, column, threshold, error, integral). The error bounds how far the true
    boundary can sit from the threshold when ``side`` is evaluated in floating point: each
    step rounds by a relative amount, and adding a large constant can absorb the column's
    contribution altogether. ``integral``: only integer additions and subtractions, which
    are exact on an integer column.
    """
    err, integral = _EPS * abs(t), isinstance(t, int)
    scale = 1.0  # how much the steps so far multiply the column by
    while not isinstance(side, Col):
        if isinstance(side, Neg):
            op, t, side = _FLIP[op], -t, side.operand
            continue
        if not isinstance(side, Arith):
            return None
        before = t
        c: int | float
        c_right, c_left = _number(side.right), _number(side.left)
        if side.op == "+" and c_right is not None:
            t, side, c = t - c_right, side.left, c_right
        elif side.op == "+" and c_left is not None:
            t, side, c = t - c_left, side.right, c_left
        elif side.op == "-" and c_right is not None:
            t, side, c = t + c_right, side.left, c_right
        elif side.op == "-" and c_left is not None:  # c - e op t  <=>  e flip(op) c - t
            op, t, side, c = _FLIP[op], c_left - t, side.right, c_left
        elif side.op in "*/" and (factor := c_right if c_right is not None else
                                  c_left if side.op == "*" else None):
            c = factor
            scale *= abs(c) if side.op == "*" else 1 / abs(c)
            if not _SAFE_SCALE[0] <= scale <= _SAFE_SCALE[1]:
                return None  # the column's term could underflow to 0 or overflow: no bound
            shrink = 1 / abs(c) if side.op == "*" else abs(c)
            t = t / c if side.op == "*" else t * c
            op = _FLIP[op] if c < 0 else op
            side = side.left if c_right is not None else side.right
            err, integral = (err + _EPS * abs(before)) * shrink + _EPS * abs(t), False
            continue
        else:
            return None
        err += _EPS * (abs(before) + abs(c) + abs(t))
        integral = integral and isinstance(c, int)
    return op, side, t, err, integral


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
    try:
        solved = _peel(op, side, threshold)
    except (OverflowError, ZeroDivisionError):
        return None
    if solved is None:
        return None
    op, column, t, err, integral = solved
    if integral and schema.dtype(column.name) is DataType.INT:
        return Compare(op, column, Lit(t)), True
    if op in ("==", "!=") or not math.isfinite(t + err):
        return None  # an inexact equality cannot be relaxed into a comparison
    slack = err + _SLACK
    if op in ("<", "<="):
        op, bound = "<=", t + slack
        if schema.dtype(column.name) is DataType.INT:
            bound = math.floor(bound)  # the same integers pass; the plan reads better
    else:
        op, bound = ">=", t - slack
        if schema.dtype(column.name) is DataType.INT:
            bound = math.ceil(bound)
    return Compare(op, column, Lit(bound)), False
