"""The expression IR: one tree the reference executor evaluates and the Spark stage compiles.

Expressions are frozen and compared by structure with :meth:`Expr.same_as`; ``==`` builds a
comparison, as in PySpark, so an expression has no truth value (``and``/``or`` raise; use
``&``, ``|`` and ``~``). The rewriter relies on :meth:`Expr.columns` and
:meth:`Expr.monotonicity`.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from jetstream.errors import PlanError
from jetstream.schema import DataType, Schema

__all__ = [
    "And",
    "Arith",
    "Call",
    "Col",
    "Compare",
    "Expr",
    "IsIn",
    "Lit",
    "Monotonicity",
    "Neg",
    "Not",
    "Or",
    "col",
    "lit",
]


class Monotonicity(enum.Enum):
    """How an expression moves when one input column grows (booleans order False < True)."""

    CONSTANT = "constant"
    INCREASING = "increasing"
    DECREASING = "decreasing"
    NONE = "none"

    def negate(self) -> Monotonicity:
        flip = {Monotonicity.INCREASING: Monotonicity.DECREASING,
                Monotonicity.DECREASING: Monotonicity.INCREASING}
        return flip.get(self, self)

    def plus(self, other: Monotonicity) -> Monotonicity:
        """The monotonicity of ``f + g``, given those of ``f`` and ``g``."""
        if self is Monotonicity.CONSTANT:
            return other
        if other is Monotonicity.CONSTANT or other is self:
            return self
        return Monotonicity.NONE

    def scaled(self, factor: float) -> Monotonicity:
        if factor == 0:
            return Monotonicity.CONSTANT
        return self if factor > 0 else self.negate()


class Expr:
    """Base of every expression node."""

    precedence: ClassVar[int] = 9

    # -- structure --------------------------------------------------------------------------
    def _values(self) -> dict[str, Any]:
        """The dataclass fields of this node by name (every subclass is a dataclass)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def children(self) -> tuple[Expr, ...]:
        return tuple(v for v in self._values().values() if isinstance(v, Expr))

    def transform(self, fn: Callable[[Expr], Expr]) -> Expr:
        """Rebuild bottom-up, replacing each node by ``fn(node)``."""
        values = {k: v.transform(fn) if isinstance(v, Expr) else v
                  for k, v in self._values().items()}
        return fn(type(self)(**values))

    def substitute(self, columns: Mapping[str, Expr]) -> Expr:
        """This expression with each listed column replaced by an expression."""
        return self.transform(lambda e: columns.get(e.name, e) if isinstance(e, Col) else e)

    def columns(self) -> frozenset[str]:
        """The input columns this expression reads."""
        return frozenset().union(*(c.columns() for c in self.children()))

    def same_as(self, other: object) -> bool:
        return isinstance(other, Expr) and type(self) is type(other) and self._key() == other._key()

    def _key(self) -> tuple[Any, ...]:
        return tuple(v._key() if isinstance(v, Expr) else v for v in self._values().values())

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def __bool__(self) -> bool:
        msg = "an expression has no truth value; combine conditions with &, | and ~"
        raise TypeError(msg)

    # -- meaning ----------------------------------------------------------------------------
    def dtype(self, schema: Schema) -> DataType:
        """The type of this expression over ``schema``; raises PlanError on a type error."""
        raise NotImplementedError

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        """The value of this expression for one record; None propagates as SQL NULL."""
        raise NotImplementedError

    def monotonicity(self, column: str) -> Monotonicity:
        """How this expression moves as ``column`` grows, all other columns fixed."""
        if column not in self.columns():
            return Monotonicity.CONSTANT
        return Monotonicity.NONE

    # -- the DSL ----------------------------------------------------------------------------
    def __add__(self, other: object) -> Expr:
        return Arith("+", self, lift(other))

    def __radd__(self, other: object) -> Expr:
        return Arith("+", lift(other), self)

    def __sub__(self, other: object) -> Expr:
        return Arith("-", self, lift(other))

    def __rsub__(self, other: object) -> Expr:
        return Arith("-", lift(other), self)

    def __mul__(self, other: object) -> Expr:
        return Arith("*", self, lift(other))

    def __rmul__(self, other: object) -> Expr:
        return Arith("*", lift(other), self)

    def __truediv__(self, other: object) -> Expr:
        return Arith("/", self, lift(other))

    def __rtruediv__(self, other: object) -> Expr:
        return Arith("/", lift(other), self)

    def __neg__(self) -> Expr:
        return Neg(self)

    def __lt__(self, other: object) -> Expr:
        return Compare("<", self, lift(other))

    def __le__(self, other: object) -> Expr:
        return Compare("<=", self, lift(other))

    def __gt__(self, other: object) -> Expr:
        return Compare(">", self, lift(other))

    def __ge__(self, other: object) -> Expr:
        return Compare(">=", self, lift(other))

    def __eq__(self, other: object) -> Expr:  # type: ignore[override]
        return Compare("==", self, lift(other))

    def __ne__(self, other: object) -> Expr:  # type: ignore[override]
        return Compare("!=", self, lift(other))

    def __and__(self, other: object) -> Expr:
        return And(self, lift(other))

    def __rand__(self, other: object) -> Expr:
        return And(lift(other), self)

    def __or__(self, other: object) -> Expr:
        return Or(self, lift(other))

    def __ror__(self, other: object) -> Expr:
        return Or(lift(other), self)

    def __invert__(self) -> Expr:
        return Not(self)

    def isin(self, *values: Any) -> Expr:
        """True where the value is one of ``values`` (a list or separate arguments)."""
        if len(values) == 1 and isinstance(values[0], set | frozenset):
            values = tuple(sorted(values[0], key=lambda v: (type(v).__name__, v)))
        elif len(values) == 1 and isinstance(values[0], list | tuple):
            values = tuple(values[0])
        return IsIn(self, tuple(values))

    def lower(self) -> Expr:
        return Call("lower", self)

    def url_domain(self) -> Expr:
        """The host part of a URL, lower-cased: ``http://a.B.com:80/x`` -> ``a.b.com``."""
        return Call("url_domain", self)

    def _wrap(self, child: Expr) -> str:
        return f"({child})" if child.precedence < self.precedence else str(child)

    def _wrap_condition(self, child: Expr) -> str:
        # Python's & binds tighter than <, so show every compound condition in parentheses.
        simple = type(child) is type(self) or child.precedence >= Expr.precedence
        return str(child) if simple else f"({child})"


def _typed_values(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Values with their types, so that 1, 1.0 and True are told apart."""
    return tuple((type(v).__name__, v) for v in values)


def lift(value: object) -> Expr:
    """An expression as is, or a Python value as a literal."""
    return value if isinstance(value, Expr) else Lit(value)


def _check_numeric(expr: Expr, schema: Schema, what: str) -> DataType:
    dtype = expr.dtype(schema)
    if not dtype.is_numeric:
        msg = f"{what} needs a number, but {expr} is {dtype.value}"
        raise PlanError(msg)
    return dtype


def _check_bool(expr: Expr, schema: Schema, what: str) -> None:
    dtype = expr.dtype(schema)
    if dtype is not DataType.BOOL:
        msg = f"{what} needs a condition, but {expr} is {dtype.value}"
        raise PlanError(msg)


@dataclass(frozen=True, eq=False)
class Col(Expr):
    name: str

    def columns(self) -> frozenset[str]:
        return frozenset((self.name,))

    def dtype(self, schema: Schema) -> DataType:
        return schema.dtype(self.name)

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        return row[self.name]

    def monotonicity(self, column: str) -> Monotonicity:
        return Monotonicity.INCREASING if column == self.name else Monotonicity.CONSTANT

    def __str__(self) -> str:
        return self.name


_LITERAL_TYPES: tuple[tuple[type, DataType], ...] = (
    (bool, DataType.BOOL), (int, DataType.INT), (float, DataType.FLOAT), (str, DataType.STRING))


@dataclass(frozen=True, eq=False)
class Lit(Expr):
    value: Any

    def __post_init__(self) -> None:
        if not any(isinstance(self.value, t) for t, _ in _LITERAL_TYPES):
            msg = f"lit: {self.value!r} is not a bool, int, float or str"
            raise PlanError(msg)
        if isinstance(self.value, float) and not math.isfinite(self.value):
            msg = f"lit: {self.value!r} is not a finite number"
            raise PlanError(msg)

    def _key(self) -> tuple[Any, ...]:
        return _typed_values((self.value,))

    def dtype(self, schema: Schema) -> DataType:
        return next(d for t, d in _LITERAL_TYPES if isinstance(self.value, t))

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        return self.value

    def __str__(self) -> str:
        return repr(self.value)


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: None if b == 0 else a / b,  # SQL: division by zero is NULL
}


@dataclass(frozen=True, eq=False)
class Arith(Expr):
    op: str
    left: Expr
    right: Expr

    @property
    def precedence(self) -> int:  # type: ignore[override]
        return 6 if self.op in "*/" else 5

    def dtype(self, schema: Schema) -> DataType:
        lt = _check_numeric(self.left, schema, f"'{self.op}'")
        rt = _check_numeric(self.right, schema, f"'{self.op}'")
        if self.op == "/" or DataType.FLOAT in (lt, rt):
            return DataType.FLOAT
        return DataType.INT

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        a, b = self.left.evaluate(row), self.right.evaluate(row)
        if a is None or b is None:
            return None
        return _ARITH[self.op](a, b)

    def monotonicity(self, column: str) -> Monotonicity:
        ml, mr = self.left.monotonicity(column), self.right.monotonicity(column)
        if self.op == "+":
            return ml.plus(mr)
        if self.op == "-":
            return ml.plus(mr.negate())
        if ml is Monotonicity.CONSTANT and mr is Monotonicity.CONSTANT:
            return Monotonicity.CONSTANT
        # Scaling by a literal keeps (or flips) the direction; by anything else, unknown sign.
        if isinstance(self.right, Lit) and isinstance(self.right.value, int | float):
            factor = self.right.value
            if self.op == "/":
                return ml.scaled(factor) if factor else Monotonicity.NONE
            return ml.scaled(factor)
        left = self.left
        if self.op == "*" and isinstance(left, Lit) and isinstance(left.value, int | float):
            return mr.scaled(left.value)
        return Monotonicity.NONE

    def __str__(self) -> str:
        right = f"({self.right})" if self.right.precedence <= self.precedence else str(self.right)
        return f"{self._wrap(self.left)} {self.op} {right}"


@dataclass(frozen=True, eq=False)
class Neg(Expr):
    operand: Expr
    precedence: ClassVar[int] = 7

    def dtype(self, schema: Schema) -> DataType:
        return _check_numeric(self.operand, schema, "'-'")

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        v = self.operand.evaluate(row)
        return None if v is None else -v

    def monotonicity(self, column: str) -> Monotonicity:
        return self.operand.monotonicity(column).negate()

    def __str__(self) -> str:
        return f"-{self._wrap(self.operand)}"


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


@dataclass(frozen=True, eq=False)
class Compare(Expr):
    op: str
    left: Expr
    right: Expr
    precedence: ClassVar[int] = 4

    def dtype(self, schema: Schema) -> DataType:
        lt, rt = self.left.dtype(schema), self.right.dtype(schema)
        if not lt.comparable_with(rt):
            msg = f"cannot compare {self.left} ({lt.value}) with {self.right} ({rt.value})"
            raise PlanError(msg)
        if self.op not in ("==", "!=") and lt is DataType.BOOL:
            msg = f"'{self.op}' does not order conditions ({self.left})"
            raise PlanError(msg)
        return DataType.BOOL

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        a, b = self.left.evaluate(row), self.right.evaluate(row)
        if a is None or b is None:
            return None
        return _COMPARE[self.op](a, b)

    def monotonicity(self, column: str) -> Monotonicity:
        ml, mr = self.left.monotonicity(column), self.right.monotonicity(column)
        if self.op in ("<", "<="):
            return mr.plus(ml.negate())
        if self.op in (">", ">="):
            return ml.plus(mr.negate())
        both_constant = ml is Monotonicity.CONSTANT and mr is Monotonicity.CONSTANT
        return Monotonicity.CONSTANT if both_constant else Monotonicity.NONE

    def __str__(self) -> str:
        # Comparisons do not chain here as they do in Python: bracket a nested one.
        left, right = (f"({c})" if c.precedence <= self.precedence else str(c)
                       for c in (self.left, self.right))
        return f"{left} {self.op} {right}"


@dataclass(frozen=True, eq=False)
class And(Expr):
    left: Expr
    right: Expr
    precedence: ClassVar[int] = 2

    def dtype(self, schema: Schema) -> DataType:
        _check_bool(self.left, schema, "'&'")
        _check_bool(self.right, schema, "'&'")
        return DataType.BOOL

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        a, b = self.left.evaluate(row), self.right.evaluate(row)
        if a is False or b is False:
            return False
        return None if a is None or b is None else True

    def monotonicity(self, column: str) -> Monotonicity:
        return self.left.monotonicity(column).plus(self.right.monotonicity(column))

    def __str__(self) -> str:
        return f"{self._wrap_condition(self.left)} & {self._wrap_condition(self.right)}"


@dataclass(frozen=True, eq=False)
class Or(Expr):
    left: Expr
    right: Expr
    precedence: ClassVar[int] = 1

    def dtype(self, schema: Schema) -> DataType:
        _check_bool(self.left, schema, "'|'")
        _check_bool(self.right, schema, "'|'")
        return DataType.BOOL

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        a, b = self.left.evaluate(row), self.right.evaluate(row)
        if a is True or b is True:
            return True
        return None if a is None or b is None else False

    def monotonicity(self, column: str) -> Monotonicity:
        return self.left.monotonicity(column).plus(self.right.monotonicity(column))

    def __str__(self) -> str:
        return f"{self._wrap_condition(self.left)} | {self._wrap_condition(self.right)}"


@dataclass(frozen=True, eq=False)
class Not(Expr):
    operand: Expr
    precedence: ClassVar[int] = 3

    def dtype(self, schema: Schema) -> DataType:
        _check_bool(self.operand, schema, "'~'")
        return DataType.BOOL

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        v = self.operand.evaluate(row)
        return None if v is None else not v

    def monotonicity(self, column: str) -> Monotonicity:
        return self.operand.monotonicity(column).negate()

    def __str__(self) -> str:
        return f"~{self._wrap_condition(self.operand)}"


@dataclass(frozen=True, eq=False)
class IsIn(Expr):
    operand: Expr
    values: tuple[Any, ...]

    def dtype(self, schema: Schema) -> DataType:
        dtype = self.operand.dtype(schema)
        for value in self.values:
            vtype = Lit(value).dtype(schema)
            if not dtype.comparable_with(vtype):
                msg = f"isin: {self.operand} is {dtype.value} but {value!r} is {vtype.value}"
                raise PlanError(msg)
        return DataType.BOOL

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        v = self.operand.evaluate(row)
        return None if v is None else v in self.values

    def _key(self) -> tuple[Any, ...]:
        return self.operand._key(), _typed_values(self.values)

    def __str__(self) -> str:
        return f"{self._wrap(self.operand)}.isin({', '.join(map(repr, self.values))})"


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _url_domain(url: str) -> str | None:
    """The host of a URL, lower-cased; NULL for a bare path, which has no host."""
    if m := _SCHEME.match(url):
        rest = url[m.end():]
    elif url.startswith("//"):  # scheme-relative
        rest = url[2:]
    elif url.startswith("/"):
        return None
    else:  # "example.com/path": a host without a scheme
        rest = url
    host = re.split(r"[/?#]", rest, maxsplit=1)[0].rsplit("@", 1)[-1]
    if host.startswith("[") and "]" in host:  # an IPv6 literal keeps its colons
        host = host[: host.index("]") + 1]
    else:
        host = host.split(":", 1)[0]
    return host.lower()


_FUNCTIONS: dict[str, Callable[[str], str | None]] = {"lower": str.lower,
                                                      "url_domain": _url_domain}


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A string function from a fixed list, so both backends can implement it."""

    fn: str
    operand: Expr

    def __post_init__(self) -> None:
        if self.fn not in _FUNCTIONS:
            msg = f"unknown function {self.fn!r}; known: {', '.join(_FUNCTIONS)}"
            raise PlanError(msg)

    def dtype(self, schema: Schema) -> DataType:
        dtype = self.operand.dtype(schema)
        if dtype is not DataType.STRING:
            msg = f"{self.fn} needs a string, but {self.operand} is {dtype.value}"
            raise PlanError(msg)
        return DataType.STRING

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        v = self.operand.evaluate(row)
        return None if v is None else _FUNCTIONS[self.fn](v)

    def __str__(self) -> str:
        return f"{self._wrap(self.operand)}.{self.fn}()"


def col(name: str) -> Expr:
    """A reference to an input column."""
    if not isinstance(name, str) or not name:
        msg = f"col: a column name must be a non-empty string, not {name!r}"
        raise PlanError(msg)
    return Col(name)


def lit(value: Any) -> Expr:
    """A constant."""
    return Lit(value)


def columns_of(exprs: Iterable[Expr]) -> frozenset[str]:
    return frozenset().union(*(e.columns() for e in exprs))
