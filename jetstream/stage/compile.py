"""Compiling the expression IR to Spark Columns that give what ``Expr.evaluate`` gives.

The Columns expect rows typed by :func:`spark_schema` (INT is bigint, FLOAT double). Spark 4
runs with ANSI mode on, where overflow and division by zero raise; nothing here raises at run
time. The semantics, node by node:

- NULL propagates through every node; ``&`` and ``|`` are three-valued (so are Spark's AND and
  OR), and a ``where`` keeps only TRUE rows (so does Spark's filter).
- ``+ - *`` and unary ``-`` use ``try_add``/``try_subtract``/``try_multiply``. On INT they are
  64-bit: a step whose result is outside [-2**63, 2**63) is NULL, where the reference's Python
  int carries on (each step on its own: see ``_operand``). An INT literal outside that range
  is a PlanError.
- ``/`` is ``try_divide``: always a double, NULL for a zero divisor (0, 0.0 and -0.0). Spark
  makes INT operands doubles before dividing, so with an operand beyond ±2**53 the quotient can
  differ in the last bit from the reference's (Python divides ints exactly, then rounds once).
- FLOAT is an IEEE double in both: overflow gives ±inf, ``inf - inf`` gives NaN. Comparisons
  and ``isin`` follow Python, not Spark: NaN equals nothing and is ordered with nothing (Spark
  alone has NaN = NaN, and NaN above everything), and an INT meets a FLOAT exactly (Spark alone
  rounds the INT to a double). ``x.isin()`` is FALSE, or NULL for a NULL ``x`` (Spark's
  ``NULL IN ()`` is FALSE).
- Where the meaning depends on an operand's type, the Column asks Spark's ``typeof``, which the
  optimizer folds: a comparison of two bigints runs as a plain bigint comparison.
- ``lower`` is Spark's, whose Unicode tables (ICU) are newer than Python 3.11's (14.0): the 55
  code points given a lower case since then differ. ``url_domain`` takes ``_url_domain``'s
  steps with ``regexp_extract`` and ``substring_index`` (no Python UDF), then ``lower``.

Expressions are taken as type-checked by ``Expr.dtype``; the Columns do not check again.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jetstream.errors import PlanError
from jetstream.expr import And, Arith, Call, Col, Compare, Expr, IsIn, Lit, Neg, Not, Or
from jetstream.local import map_record
from jetstream.operators import Join, Map, Operator, Select, Source, Where, Window, WithColumn
from jetstream.schema import DataType, Schema
from jetstream.stage.forms import finite

__all__ = ["columns_named", "defined_as", "lookup_table", "map_step", "map_udf",
           "parse_text", "record_steps", "spark_schema", "spark_type", "to_column"]

_INT64 = range(-(2**63), 2**63)
_TWO_63 = 2.0**63

_SPARK_TYPES: dict[DataType, T.DataType] = {
    DataType.STRING: T.StringType(), DataType.INT: T.LongType(),
    DataType.FLOAT: T.DoubleType(), DataType.BOOL: T.BooleanType(),
}


def spark_type(dtype: DataType) -> T.DataType:
    """The Spark SQL type of a column of ``dtype``; raises PlanError for list and partial."""
    if dtype not in _SPARK_TYPES:
        known = ", ".join(d.value for d in _SPARK_TYPES)
        msg = f"a {dtype.value} column has no Spark type; the Spark stage holds {known}"
        raise PlanError(msg)
    return _SPARK_TYPES[dtype]


def spark_schema(schema: Schema) -> T.StructType:
    """The Spark schema of records of ``schema``, every column nullable."""
    fields = []
    for f in schema:
        try:
            fields.append(T.StructField(f.name, spark_type(f.dtype), nullable=True))
        except PlanError as e:
            msg = f"column {f.name!r}: {e}"
            raise PlanError(msg) from None
    return T.StructType(fields)


#: What a ``Col`` reads while :func:`columns_named` is in force (None: the row's own column).
_named: ContextVar[Mapping[str, Column] | None] = ContextVar("_named", default=None)


@contextlib.contextmanager
def columns_named(named: Mapping[str, Column]) -> Iterator[None]:
    """While inside, :func:`to_column` reads a column ``name`` as ``named[name]``: a
    stage's columns where several stages share one row, each under names of its own
    (:mod:`jetstream.stage.fused`)."""
    token = _named.set(named)
    try:
        yield
    finally:
        _named.reset(token)


def to_column(expr: Expr) -> Column:
    """The Spark Column computing ``expr`` as ``expr.evaluate`` does (see the module's notes).

    Raises
    ------
    PlanError
        For a node, operator, function or literal the Spark stage has no form for.
    """
    if isinstance(expr, Col):
        named = _named.get()
        if named is not None:
            return named[expr.name]
        return F.col("`" + expr.name.replace("`", "``") + "`")  # a dot is part of the name
    if isinstance(expr, Lit):
        return _literal(expr.value)
    if isinstance(expr, Arith) and expr.op in _ARITH:
        return _ARITH[expr.op](_operand(expr.left, expr.op), _operand(expr.right, expr.op))
    if isinstance(expr, Neg):
        # try_multiply, not negative: -(-2**63) overflows; on a double it is exact, -0.0 too.
        return F.try_multiply(_operand(expr.operand, "*"), F.lit(-1))
    if isinstance(expr, Compare) and expr.op in _COMPARE:
        return _compare(expr.op, expr.left, expr.right)
    if isinstance(expr, And):
        return to_column(expr.left) & to_column(expr.right)
    if isinstance(expr, Or):
        return to_column(expr.left) | to_column(expr.right)
    if isinstance(expr, Not):
        return ~to_column(expr.operand)
    if isinstance(expr, IsIn):
        return _isin(expr.operand, expr.values)
    if isinstance(expr, Call) and expr.fn in _CALLS:
        return _CALLS[expr.fn](to_column(expr.operand))
    msg = f"to_column: the Spark stage has no form for {type(expr).__name__} {expr}"
    raise PlanError(msg)


def _literal(value: Any) -> Column:
    if isinstance(value, bool | str | float):  # bool first: True is an int to Python
        return F.lit(value)
    if isinstance(value, int):
        if value not in _INT64:
            msg = f"lit: {value} does not fit the Spark stage's 64-bit int"
            raise PlanError(msg)
        return F.lit(value).cast(T.LongType())  # F.lit(1) alone would be a 32-bit int
    msg = f"lit: {value!r} has no Spark form"
    raise PlanError(msg)


def _operand(expr: Expr, op: str) -> Column:
    """``expr`` as an operand of ``op``; if it has the same ``+`` or ``*`` at its root, it
    ends in ``- 0``, which changes no value (not even -0.0's sign) but breaks the chain.

    Spark's optimizer regroups chains of ``+`` or of ``*`` to fold their constants
    (ReorderAssociativeOperator), try_ or not: ``0 * (x * 2**40)`` becomes ``x * 0``, and
    ``(x * 2**32) * 2**32`` NULL even for x = 0. Each step must overflow on its own.
    """
    root = expr.op if isinstance(expr, Arith) else "*" if isinstance(expr, Neg) else None
    column = to_column(expr)
    return F.try_subtract(column, F.lit(0)) if op in ("+", "*") and root == op else column


_ARITH: dict[str, Callable[[Column, Column], Column]] = {
    "+": F.try_add, "-": F.try_subtract, "*": F.try_multiply, "/": F.try_divide,
}

_COMPARE: dict[str, Callable[[Column, Column], Column]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne,
}
_MIRRORED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def _known_type(expr: Expr) -> str | None:
    """The Spark type of ``expr`` where the IR alone fixes it and it is not a number."""
    if isinstance(expr, Compare | And | Or | Not | IsIn) or (
            isinstance(expr, Lit) and isinstance(expr.value, bool)):
        return "boolean"
    if isinstance(expr, Call) or (isinstance(expr, Lit) and isinstance(expr.value, str)):
        return "string"
    return None


def _compare(op: str, left: Expr, right: Expr) -> Column:
    """``left op right``; numbers by their Spark types, which the IR leaves to the columns."""
    a, b = to_column(left), to_column(right)
    if _known_type(left) or _known_type(right):
        # Strings order by code point in both (UTF-8 bytes keep that order); conditions are
        # only ever tested for equality.
        return _COMPARE[op](a, b)
    ta, tb = F.typeof(a), F.typeof(b)
    return (F.when((ta == "double") & (tb == "double"),
                   _compare_doubles(op, a.cast("double"), b.cast("double")))
            .when((ta == "bigint") & (tb == "double"),
                  _compare_exactly(op, a.cast("bigint"), b.cast("double")))
            .when((ta == "double") & (tb == "bigint"),
                  _compare_exactly(_MIRRORED[op], b.cast("bigint"), a.cast("double")))
            .otherwise(_COMPARE[op](a, b)))


def _compare_doubles(op: str, a: Column, b: Column) -> Column:
    """``a op b`` for doubles as IEEE (and Python) compare them: NaN is unordered, unequal."""
    unordered = a.isNotNull() & b.isNotNull() & (F.isnan(a) | F.isnan(b))
    return F.when(unordered, F.lit(op == "!=")).otherwise(_COMPARE[op](a, b))


def _compare_exactly(op: str, n: Column, d: Column) -> Column:
    """``n op d`` for a bigint ``n`` and a double ``d``, exactly, as Python compares them.

    Rounding is monotone, so where ``n`` as a double differs from ``d`` that comparison is
    the answer. Where they are equal, ``d`` is a whole number: 2**63, which no bigint
    reaches, or one that converts to a bigint exactly.
    """
    rounded = n.cast("double")
    return (F.when(n.isNull() | d.isNull(), F.lit(None).cast("boolean"))
            .when(F.isnan(d), F.lit(op == "!="))
            .when(rounded != d, _COMPARE[op](rounded, d))
            .when(d >= _TWO_63, F.lit(op in ("<", "<=", "!=")))
            .otherwise(_COMPARE[op](n, d.try_cast("bigint"))))


def _isin(operand: Expr, values: Iterable[Any]) -> Column:
    """``operand`` among ``values``, compared as Python compares them, by the operand's type."""
    v = to_column(operand)
    candidates = _values_by_type(values)
    if known := _known_type(operand):
        return _among(v, candidates[known])
    kind = F.typeof(v)
    branches = F.when(kind == "bigint", _among(v.cast("bigint"), candidates["bigint"]))
    for name in ("double", "string", "boolean"):
        branches = branches.when(kind == name, _among(v.cast(name), candidates[name]))
    msg = f"isin: {operand} is not bigint, double, string or boolean; see spark_schema"
    return branches.otherwise(F.raise_error(F.lit(msg)))


def _values_by_type(values: Iterable[Any]) -> dict[str, list[Any]]:
    """For each Spark type, its values that Python holds equal to one of ``values``."""
    out: dict[str, list[Any]] = {"bigint": [], "double": [], "string": [], "boolean": []}
    for x in values:
        if isinstance(x, bool):
            out["boolean"].append(x)
        elif isinstance(x, str):
            out["string"].append(x)
        elif isinstance(x, int):
            if x in _INT64:
                out["bigint"].append(x)
            with contextlib.suppress(OverflowError):  # beyond every double
                if float(x) == x:  # and no double equals an int it rounds
                    out["double"].append(float(x))
        elif isinstance(x, float) and not math.isnan(x):  # Python's NaN is in no list
            out["double"].append(x)
            if x.is_integer() and -_TWO_63 <= x < _TWO_63:
                out["bigint"].append(int(x))
    return out


def _among(value: Column, candidates: list[Any]) -> Column:
    """``value IN candidates``, but NULL, not FALSE, for a NULL value and no candidates."""
    return value.isin(candidates) if candidates else F.when(value.isNotNull(), F.lit(False))


# _url_domain, step by step: strip a scheme or "//", cut at the first "/", "?" or "#", keep
# what follows the last "@", drop a port (an IPv6 literal "[...]" keeps its colons), lower-case.
_AUTHORITY = r"^(?:[A-Za-z][A-Za-z0-9+.-]*://|//)?([^/?#]*)"


def _url_domain(url: Column) -> Column:
    host = F.substring_index(F.regexp_extract(url, _AUTHORITY, 1), "@", -1)
    ipv6 = host.startswith("[") & host.contains("]")
    host = (F.when(ipv6, F.concat(F.substring_index(host, "]", 1), F.lit("]")))
            .otherwise(F.substring_index(host, ":", 1)))
    bare_path = url.startswith("/") & ~url.startswith("//")  # a path alone names no host
    return F.when(bare_path, F.lit(None).cast("string")).otherwise(F.lower(host))


_CALLS: dict[str, Callable[[Column], Column]] = {"lower": F.lower, "url_domain": _url_domain}


def parse_text(name: str, dtype: DataType) -> Column:
    """The text column ``name`` as ``dtype``, NULL where it does not parse."""
    text = F.col(f"`{name}`")
    if dtype is DataType.STRING:
        return text
    if dtype is DataType.BOOL:
        lowered = F.lower(F.trim(text))
        return (F.when(lowered.isin("true", "1"), F.lit(True))
                .when(lowered.isin("false", "0"), F.lit(False)))
    value = F.expr(f"try_cast(`{name}` AS {spark_type(dtype).simpleString()})")
    if dtype is DataType.FLOAT:  # NaN and infinities are not numbers a log line can hold
        return F.when(finite(value), value)
    return value


def map_step(step: Map, schema: Schema, internal: Sequence[str]
             ) -> Callable[[DataFrame], DataFrame]:
    """A ``map`` as a Python UDF over each kept record (its columns as a dict), giving the
    record of the step's schema, checked as the reference executor checks it
    (:func:`jetstream.local.map_record`). A record not kept is not given to the function
    (its columns are NULL): Spark evaluates a Python UDF on every row, whatever guards it.
    ``internal``: the stage's own columns, kept beside the record's."""
    names = schema.names
    mapped = map_udf(step, schema)(F.col("_keep"), *(F.col(f"`{n}`") for n in names))
    mapped = mapped.alias("_mapped")
    kept = [F.col(c) for c in internal]

    def run(df: DataFrame) -> DataFrame:
        return df.select(mapped, *kept).select("_mapped.*", *kept)
    return run


def map_udf(step: Map, schema: Schema) -> Callable[..., Column]:
    """A ``map`` as a Python UDF of whether the record is kept and its columns (of
    ``schema``, in order), giving the record of the step's schema as a struct (NULL for a
    record not kept), checked as the reference executor checks it."""
    names = schema.names

    def apply(keep: bool | None, *values: Any) -> tuple[Any, ...] | None:
        if not keep:
            return None
        out = map_record(step, dict(zip(names, values, strict=True)))
        return tuple(out[f.name] for f in step.schema)

    # Rows reach it pickled in batches: an Arrow UDF would need pyarrow and pandas at every
    # site (pyarrow alone added 65 MB to a site's process, which the demo's memory cannot take).
    return F.udf(apply, spark_schema(step.schema), useArrow=False)


def defined_as(expr: Expr, source: Source, steps: Sequence[Operator]) -> tuple[Expr, Schema]:
    """``expr`` and the schema it reads, or for a column that a step made, that step's
    expression for it and the step's input schema."""
    schemas = [source.schema, *(step.schema for step in steps)]
    if not isinstance(expr, Col):
        return expr, schemas[-1]
    name = expr.name
    for i in reversed(range(len(steps))):
        step = steps[i]
        made = (step.expr if isinstance(step, WithColumn) and step.name == name
                else dict(step.columns).get(name) if isinstance(step, Select) else None)
        if isinstance(made, Col):  # kept, or renamed, by a select
            name = made.name
        elif made is not None:
            return made, schemas[i]
    return Col(name), schemas[0]


def record_steps(spark: SparkSession, source: Schema, chain: Sequence[Operator],
             internal: Sequence[str]) -> list[Callable[[DataFrame], DataFrame]]:
    """A stage's record steps (``chain``, after its source of schema ``source``) as DataFrame
    transformations, their columns built once. A ``where`` does not drop a record but clears
    its ``_keep`` (it still counts as read); a ``select`` and a ``map`` keep the stage's own
    columns (``internal``)."""
    steps: list[Callable[[DataFrame], DataFrame]] = []
    inputs = [source, *(step.schema for step in chain)]  # each step's
    for i, step in enumerate(chain):
        if isinstance(step, Where):
            kept = F.col("_keep") & F.coalesce(to_column(step.predicate), F.lit(False))
            steps.append(functools.partial(DataFrame.withColumn, colName="_keep", col=kept))
        elif isinstance(step, WithColumn):
            steps.append(functools.partial(DataFrame.withColumn, colName=step.name,
                                           col=to_column(step.expr)))
        elif isinstance(step, Select):
            columns = [to_column(e).alias(n) for n, e in step.columns]
            columns += [F.col(c) for c in internal]
            steps.append(functools.partial(_select, columns=columns))
        elif isinstance(step, Join):
            steps.append(_join(spark, step, i))
        elif isinstance(step, Map):
            steps.append(map_step(step, inputs[i], internal))
        else:
            assert isinstance(step, Window), f"check_stage let {step.kind} through"
    return steps


def _join(spark: SparkSession, join: Join, i: int) -> Callable[[DataFrame], DataFrame]:
    """A lookup join as a broadcast join with the table (a left join; an inner join
    clears ``_keep`` where no row matched, so the record still counts as read)."""
    key, hit = f"_join{i}_key", f"_join{i}_hit"
    table = lookup_table(spark, join).withColumnRenamed(join.on, key)
    table = F.broadcast(table.withColumn(hit, F.lit(True)))
    kept = F.col("_keep") & F.col(hit).isNotNull() if join.how == "inner" else F.col("_keep")

    def step(df: DataFrame) -> DataFrame:
        joined = df.join(table, df[join.on] == table[key], "left")
        return joined.withColumn("_keep", kept).drop(key, hit)
    return step


def lookup_table(spark: SparkSession, join: Join) -> DataFrame:
    """A lookup join's table as a DataFrame, typed by :func:`spark_schema`."""
    return spark.createDataFrame(
        [[row[n] for n in join.table.schema.names] for row in join.table.rows],
        spark_schema(join.table.schema))


def _select(df: DataFrame, columns: list[Column]) -> DataFrame:
    return df.select(*columns)
