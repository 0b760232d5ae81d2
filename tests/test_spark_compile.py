"""The Spark backend of the expression IR against the reference, ``Expr.evaluate``, row by row."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from jetstream.errors import PlanError
from jetstream.expr import And, Arith, Call, Col, Compare, Expr, IsIn, Neg, Not, Or, col, lit
from jetstream.schema import CDN_LOG_SCHEMA, DataType, Schema
from jetstream.stage.compile import spark_schema, spark_type, to_column
from tests.test_expr import URL_DOMAINS

INT, FLOAT, STRING, BOOL = DataType.INT, DataType.FLOAT, DataType.STRING, DataType.BOOL
SCHEMA = Schema.of({"i": INT, "j": INT, "f": FLOAT, "g": FLOAT,
                    "s": STRING, "u": STRING, "b": BOOL, "c": BOOL})
INT64 = range(-(2**63), 2**63)


def spark_values(spark: SparkSession, exprs: Sequence[Expr], rows: Sequence[Mapping[str, Any]],
                 schema: Schema = SCHEMA) -> list[list[Any]]:
    """Each row's value of each expression, computed by Spark in one job."""
    data = [(n, *(row[name] for name in schema.names)) for n, row in enumerate(rows)]
    df = spark.createDataFrame(data, T.StructType([T.StructField("_row", T.LongType()),
                                                   *spark_schema(schema).fields]))
    got = df.select("_row", *(to_column(e).alias(f"e{k}") for k, e in enumerate(exprs)))
    return [list(r)[1:] for r in sorted(got.collect(), key=lambda r: r[0])]


def same(a: Any, b: Any) -> bool:
    """Equal, of the same type; floats bit for bit but for NaN's payload (-0.0 is not 0.0)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b))
    return type(a) is type(b) and a == b


def reference_64(expr: Expr, row: Mapping[str, Any]) -> tuple[Any, bool]:
    """``expr.evaluate(row)`` with the Spark stage's documented 64-bit departures, and whether
    one changed anything: an INT outside 64 bits is NULL, and int / int rounds each operand to
    a double first. Each node is the reference's own, evaluated over its children's values."""
    if not expr.children():
        return expr.evaluate(row), False
    results = [reference_64(child, row) for child in expr.children()]
    values = {f"_{n}": value for n, (value, _) in enumerate(results)}
    departed = any(d for _, d in results)
    names = iter(values)
    node = dataclasses.replace(expr, **{  # type: ignore[type-var]
        f.name: Col(next(names)) for f in dataclasses.fields(expr)  # type: ignore[arg-type]
        if isinstance(getattr(expr, f.name), Expr)})
    if isinstance(expr, Arith) and expr.op == "/" and all(type(v) is int for v in values.values()):
        a, b = values.values()
        if b != 0:
            return float(a) / float(b), departed or float(a) / float(b) != a / b
    value = node.evaluate(values)
    if type(value) is int and value not in INT64:
        return None, True
    return value, departed


# -- the property: random typed expressions over random rows -------------------------------

# Values drawn mostly from small pools, so that they meet: an int next to the double it rounds
# to, sums that overflow 64 bits or reach infinity, infinities that subtract to NaN.
INT_POOL = [0, 1, -1, 7, 2**31, 2**53, 2**53 + 1, -(2**53) - 1, 2**62, 2**63 - 1, -(2**63)]
FLOAT_POOL = [0.0, -0.0, 0.5, 1.0, 7.0, -1.5, 0.1, 2.0**53, 2.0**53 + 2, 2.0**63, -(2.0**63),
              9.2e18, 1e308, -1e308, 5e-324]
# A computed column can hold what no literal and no source record can (see DataType.accepts).
NON_FINITE = [math.inf, -math.inf, math.nan]
URL_STARTS = ["", "/", "//", "http://", "HTTPS://", "ftp+x://", "1a://", "h*t://", " "]
URL_PARTS = ["a", "B.Com", "x.org", ":8080", ":", "@", "user:pw@", "[::1]", "[", "]", "?q=1",
             "#f", "/p", "/", ".", "-", "É", "ß", "İ", "Σ", "\n"]
# Python 3.11 and Spark lower-case these alike (they differ only on letters newer than
# Unicode 14, see the compiler's notes), final sigma included.
TEXT = "aZ09 .:/?#@[]-_%ÀÉÎÕÜßàéøÿẞİıΑΒΓΣσςΩДЖяǅ"

ints = st.one_of(st.sampled_from(INT_POOL), st.integers(-6, 6),
                 st.integers(-(2**63), 2**63 - 1))
finite_floats = st.one_of(st.sampled_from(FLOAT_POOL), st.integers(-6, 6).map(float),
                          st.floats(allow_nan=False, allow_infinity=False))
strings = st.one_of(
    st.builds(lambda start, parts: start + "".join(parts), st.sampled_from(URL_STARTS),
              st.lists(st.sampled_from(URL_PARTS), max_size=4)),
    st.text(TEXT, max_size=6))
records = st.fixed_dictionaries({
    "i": st.none() | ints, "j": st.none() | ints,
    "f": st.sampled_from(NON_FINITE) | finite_floats | st.none(),
    "g": st.sampled_from(NON_FINITE) | finite_floats | st.none(),
    "s": st.none() | strings, "u": st.none() | strings,
    "b": st.none() | st.booleans(), "c": st.none() | st.booleans(),
})

number_literals = st.one_of(st.sampled_from(INT_POOL), st.integers(-3, 3),
                            st.sampled_from(FLOAT_POOL))
number_values = st.one_of(number_literals, st.sampled_from([2**64, -(2**70)]))  # isin only
number_leaves = st.one_of(st.sampled_from([col("i"), col("j"), col("f"), col("g")]),
                          number_literals.map(lit))
string_leaves = st.one_of(st.sampled_from([col("s"), col("u")]), strings.map(lit))
condition_leaves = st.one_of(st.sampled_from([col("b"), col("c")]), st.booleans().map(lit))
COMPARE_OPS = st.sampled_from(["<", "<=", ">", ">=", "==", "!="])


def numbers(depth: int) -> st.SearchStrategy[Expr]:
    if depth == 0:
        return number_leaves
    sub = numbers(depth - 1)
    return st.one_of(number_leaves, st.builds(Arith, st.sampled_from("+-*/"), sub, sub),
                     st.builds(Neg, sub))


def texts(depth: int) -> st.SearchStrategy[Expr]:
    if depth == 0:
        return string_leaves
    return st.one_of(string_leaves, st.builds(Call, st.sampled_from(["lower", "url_domain"]),
                                              texts(depth - 1)))


def conditions(depth: int) -> st.SearchStrategy[Expr]:
    atoms = st.one_of(
        condition_leaves,
        st.builds(Compare, COMPARE_OPS, number_leaves, number_leaves),
        st.builds(Compare, COMPARE_OPS, numbers(2), numbers(2)),
        st.builds(Compare, COMPARE_OPS, texts(1), texts(1)),
        st.builds(IsIn, numbers(2), st.lists(number_values, max_size=4).map(tuple)),
        st.builds(IsIn, texts(1), st.lists(strings, max_size=3).map(tuple)),
    )
    if depth == 0:
        return atoms
    sub = conditions(depth - 1)
    return st.one_of(
        atoms, st.builds(And, sub, sub), st.builds(Or, sub, sub), st.builds(Not, sub),
        st.builds(Compare, st.sampled_from(["==", "!="]), sub, sub),
        st.builds(IsIn, sub, st.lists(st.booleans(), max_size=2).map(tuple)),
    )


expressions = st.one_of(numbers(3), texts(2), conditions(2))


# Spark takes ~0.3 s a job and ~20 ms an expression, but rows come almost free: each example
# is one job over many rows.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(exprs=st.lists(expressions, min_size=4, max_size=16),
       rows=st.lists(records, min_size=20, max_size=60))
def test_spark_computes_what_the_reference_computes(spark: SparkSession, exprs: list[Expr],
                                                    rows: list[dict[str, Any]]) -> None:
    for e in exprs:
        e.dtype(SCHEMA)  # the strategies make only well-typed expressions
    got = spark_values(spark, exprs, rows)
    for row, values in zip(rows, got, strict=True):
        for e, value in zip(exprs, values, strict=True):
            want, departed = reference_64(e, row)
            if not departed:
                assert same(want, e.evaluate(row))
            assert same(value, want), f"{e} on {row}: Spark gave {value!r}, wanted {want!r}"


# Numbers a rounding apart, or NaN, which random rows and expressions seldom bring together.
near_numbers = st.integers(-1, 1).flatmap(lambda ulps: st.builds(
    lambda n, other: {**dict.fromkeys(SCHEMA.names), "i": n,
                      "j": n - ulps if n - ulps in INT64 else n,
                      "f": math.nextafter(float(n), math.copysign(math.inf, ulps)) if ulps
                      else float(n), "g": other},
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(2**53 - 4, 2**53 + 4),
              st.sampled_from([2**63 - 1, -(2**63), 2**63 - 512, 2**63 - 513, 0])),
    st.sampled_from([*NON_FINITE, 0.0, -0.0, 2.0**53])))
NUMBER_COMPARISONS = [Compare(op, a, b) for op in ("<", "<=", ">", ">=", "==", "!=")
                      for a, b in [(col("i"), col("f")), (col("f"), col("i")),
                                   (col("f"), col("g")), (col("g"), col("g")),
                                   (col("i"), col("g")), (col("i"), col("j"))]]


@settings(max_examples=3, deadline=None)
@given(rows=st.lists(near_numbers, min_size=100, max_size=300))
def test_numbers_compare_as_python_compares_them(spark: SparkSession,
                                                 rows: list[dict[str, Any]]) -> None:
    got = spark_values(spark, NUMBER_COMPARISONS, rows)
    for row, values in zip(rows, got, strict=True):
        assert values == [e.evaluate(row) for e in NUMBER_COMPARISONS], row


# -- tables: NULL, division by zero, overflow, NaN, exact int/float comparison -------------

ROW = {"i": 7, "j": 0, "f": 1.5, "g": 0.0, "s": "MiXed", "u": None, "b": True, "c": None}
INF = 10.0 * lit(1e308)
NAN = INF - INF

SAME_AS_REFERENCE: list[tuple[Expr, dict[str, Any], Any]] = [
    (col("i") / col("j"), {}, None),
    (col("f") / col("g"), {}, None),
    (col("f") / -col("g"), {}, None),  # -0.0 is zero too
    (lit(0) / 0, {}, None),
    (col("i") / 2, {}, 3.5),
    (col("i") / 7, {}, 1.0),
    (col("i") / col("j") + 1, {}, None),
    ((col("i") / col("j") > 1) & ~col("b"), {}, False),
    ((col("i") / col("j") > 1) | col("b"), {}, True),
    ((col("i") / col("j") > 1) & col("b"), {}, None),
    (col("u").lower(), {}, None),
    (col("u").url_domain(), {}, None),
    (col("c") == True, {}, None),  # noqa: E712 - builds an expression
    (col("c") != col("b"), {}, None),
    (col("u") < "a", {}, None),
    (col("u").isin("a"), {}, None),
    (col("u").isin(), {}, None),
    (col("s").isin(), {}, False),
    (~col("c"), {}, None),
    (-col("g"), {}, -0.0),
    (col("g").isin(-0.0), {}, True),
    (-col("g") == col("g"), {}, True),
    (col("i") + 0.5, {"i": 2**63 - 1}, 9.223372036854775807e18),
    ((col("i") * 2 > 0) | col("b"), {"i": 2**62}, True),  # the overflow's NULL is absorbed
    # Spark's optimizer would regroup these to fold their constants, overflowing elsewhere
    (col("i") * 2**32 * 2**32, {"i": 0}, 0),
    (col("i") + 2**62 + 2**62, {"i": -(2**63)}, 0),
    (-(col("i") * 2**32) * 2**32, {"i": 0}, 0),
    # IEEE overflow: inf, then NaN, which equals nothing and is ordered with nothing
    (INF, {}, math.inf),
    (-INF, {}, -math.inf),
    (NAN == NAN, {}, False),
    (NAN != NAN, {}, True),
    (NAN > 0, {}, False),
    (NAN <= 0, {}, False),
    (NAN < INF, {}, False),
    (INF > 1e308, {}, True),
    (col("i") == NAN, {}, False),
    (col("i") != NAN, {}, True),
    (col("i") < NAN, {}, False),
    (NAN.isin(1.0, 2), {}, False),
    (col("f") < NAN, {}, False),
    (col("f") == NAN, {"f": None}, None),
    # ints meet floats exactly (Spark alone would round the int to a double first)
    (col("i") == 2.0**53, {"i": 2**53 + 1}, False),
    (col("i") > 2.0**53, {"i": 2**53 + 1}, True),
    (col("i") < 2.0**63, {"i": 2**63 - 1}, True),
    (col("i") >= -(2.0**63), {"i": -(2**63)}, True),
    (col("i") > -(2.0**63), {"i": -(2**63)}, False),
    (col("f") < col("i"), {"f": 2.0**53, "i": 2**53 + 1}, True),
    (col("f") != col("i"), {"f": 2.0**53, "i": 2**53 + 1}, True),
    (col("i") <= 7.5, {}, True),
    (col("i") >= 7.5, {}, False),
    (col("i") == -0.0, {"i": 0}, True),
    (col("i") > 1e308, {"i": 2**63 - 1}, False),
    (col("i").isin(2.0**53), {"i": 2**53 + 1}, False),
    (col("i").isin(7.0, 8), {}, True),
    (col("i").isin(7.5), {}, False),
    (col("i").isin(2**64), {}, False),
    (col("f").isin(2**53 + 1), {"f": 2.0**53}, False),
    (col("f").isin(2**53), {"f": 2.0**53}, True),
    (col("f").isin(2**64), {"f": 2.0**64}, True),
    (col("f").isin(1, 1.5), {}, True),
]

# Where the Spark stage is 64-bit: the reference's Python int carries on, the stage gives NULL.
DEPARTURES: list[tuple[Expr, dict[str, Any], Any]] = [
    (col("i") + 1, {"i": 2**63 - 1}, None),
    (col("i") - 1, {"i": -(2**63)}, None),
    (col("i") * col("j"), {"i": 2**62, "j": 4}, None),
    (-col("i"), {"i": -(2**63)}, None),
    (col("i") * 2 / 2, {"i": 2**62}, None),
    (col("i") * 2 > 0, {"i": 2**62}, None),
    (0 * (col("i") * 2**31), {"i": 2**53}, None),
    (-(col("i") * 2), {"i": 2**62}, None),
    (col("i") * 2 * -1, {"i": 2**62}, None),
]


def test_null_division_by_zero_nan_and_exact_comparisons(spark: SparkSession) -> None:
    cases = SAME_AS_REFERENCE + DEPARTURES
    rows = [{**ROW, **changes} for _, changes, _ in cases]
    got = spark_values(spark, [e for e, _, _ in cases], rows)
    wrong = []
    for k, ((e, _, want), row) in enumerate(zip(cases, rows, strict=True)):
        if k < len(SAME_AS_REFERENCE):
            assert same(e.evaluate(row), want), f"reference: {e} on {row}"
        else:
            assert e.evaluate(row) is not want  # a real departure, worth its line
        if not same(got[k][k], want):
            wrong.append(f"{e} on {row}: Spark gave {got[k][k]!r}, wanted {want!r}")
    assert wrong == []


def test_where_keeps_only_true(spark: SparkSession) -> None:
    cond = (col("i") / col("j") > 1) | col("b")
    rows = [{**ROW, "j": j, "b": b} for j in (0, 1, 100) for b in (True, False, None)]
    df = spark.createDataFrame([tuple(r.values()) for r in rows], spark_schema(SCHEMA))
    kept = [r.asDict() for r in df.where(to_column(cond)).collect()]
    assert sorted(map(str, kept)) == sorted(str(r) for r in rows if cond.evaluate(r) is True)
    assert len(kept) == 5  # b TRUE (3), and i / j > 1 for j = 1 (2 more); NULL rows dropped


def test_type_dispatch_is_folded_away(spark: SparkSession,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    df = spark.createDataFrame([], spark_schema(SCHEMA))
    cond = (col("i") < 500) & col("s").isin("a", "b") & (col("f") > 1)
    df.select(to_column(cond).alias("x")).explain("extended")
    optimized = capsys.readouterr().out.split("== Optimized Logical Plan ==")[1]
    optimized = optimized.split("== Physical Plan ==")[0]
    assert "typeof" not in optimized
    assert "raise_error" not in optimized
    assert "((i#" in optimized and " < 500) AND s#" in optimized  # bigint < bigint, as is


# -- url_domain and lower --------------------------------------------------------------

URLS: list[tuple[str | None, str | None]] = [
    *URL_DOMAINS,  # the reference cases of tests/test_expr.py
    ("http://[::1]:8080/x", "[::1]"),
    ("/login?next=http://evil.com/", None),
    ("shop.com/r?to=https://evil.com/x", "shop.com"),
    ("//cdn.example.com/lib.js", "cdn.example.com"),
    # more of _url_domain's corners
    (None, None),
    ("/", None),
    ("//", ""),
    ("///x", ""),
    ("?x", ""),
    ("#", ""),
    ("@", ""),
    ("http://a.com@", ""),
    ("http://a.com\n/x", "a.com\n"),
    ("HTTP://[::1]:80", "[::1]"),
    ("http://user@[FE80::1%25eth0]:443/", "[fe80::1%25eth0]"),
    ("[::1", "["),
    ("http://[::1", "["),
    ("mailto:x@y.com", "y.com"),
    ("a@b@c:1", "c"),
    ("1http://x.com", "1http"),
    ("h*t://x", "h*t"),
    ("  http://x.com", "  http"),
    ("http:/one-slash.com", "http"),
    ("ftp+x.y-z://h", "h"),
    ("http://a.com:80:90/", "a.com"),
    ("http://Ä.example.COM/", "ä.example.com"),
]


def test_url_domain(spark: SparkSession) -> None:
    schema = Schema.of({"u": STRING})
    rows = [{"u": url} for url, _ in URLS]
    got = [values[0] for values in spark_values(spark, [col("u").url_domain()], rows, schema)]
    for (url, want), value in zip(URLS, got, strict=True):
        assert col("u").url_domain().evaluate({"u": url}) == want
        assert value == want, f"url_domain({url!r}): Spark gave {value!r}, wanted {want!r}"


LOWER = ["MiXed", "ÀÉÎÕÜ", "Straße", "ẞ", "İstanbul", "ΟΔΟΣ ΣΑΣ", "Σ", "ΑΣ.", "ДЖя", "ǅ", "ΑΣ1Α"]


def test_lower_agrees_with_python_on_settled_letters(spark: SparkSession) -> None:
    schema = Schema.of({"s": STRING})
    got = spark_values(spark, [col("s").lower()], [{"s": s} for s in LOWER], schema)
    assert [v[0] for v in got] == [s.lower() for s in LOWER]


def test_a_dotted_column_name_is_one_column(spark: SparkSession) -> None:
    schema = Schema.of({"a.b": INT, "a": INT})
    assert spark_values(spark, [col("a.b") + 1], [{"a.b": 1, "a": 5}], schema) == [[2]]


# -- types and refusals (no Spark needed) ---------------------------------------------


def test_spark_types() -> None:
    assert spark_type(INT) == T.LongType()
    assert spark_type(FLOAT) == T.DoubleType()
    assert spark_type(STRING) == T.StringType()
    assert spark_type(BOOL) == T.BooleanType()
    assert spark_schema(CDN_LOG_SCHEMA) == T.StructType([
        T.StructField("ts", T.LongType()), T.StructField("pop", T.StringType()),
        T.StructField("client_ip", T.StringType()), T.StructField("domain", T.StringType()),
        T.StructField("url", T.StringType()), T.StructField("status", T.LongType()),
        T.StructField("bytes", T.LongType()), T.StructField("latency_ms", T.DoubleType()),
        T.StructField("cache", T.StringType()),
    ])


def test_columns_of_no_spark_type_are_refused() -> None:
    with pytest.raises(PlanError, match="a list column has no Spark type"):
        spark_type(DataType.LIST)
    with pytest.raises(PlanError, match="column 'items': a list column has no Spark type"):
        spark_schema(Schema.of({"n": INT, "items": DataType.LIST}))


@dataclasses.dataclass(frozen=True, eq=False)
class Modulo(Expr):
    left: Expr
    right: Expr


@pytest.mark.parametrize(("expr", "message"), [
    (Modulo(col("i"), lit(2)), "no form for Modulo"),
    (Arith("%", col("i"), lit(2)), "no form for Arith i % 2"),
    (Compare("<>", col("i"), lit(2)), "no form for Compare i <> 2"),
    (col("b") & (Modulo(col("i"), lit(2)) == 1), "no form for Modulo"),
    (lit(2**63), "lit: 9223372036854775808 does not fit"),
    (col("i") < -(2**63) - 1, "lit: -9223372036854775809 does not fit"),
])
def test_unsupported_nodes_are_refused_by_name(expr: Expr, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        to_column(expr)


def test_lit_keeps_its_type(spark: SparkSession) -> None:
    schema = Schema.of({"x": INT})
    got = spark_values(spark, [lit(1), lit(1.0), lit("1"), lit(True), lit(2**63 - 1)],
                       [{"x": 0}], schema)
    assert all(same(a, b) for a, b in zip(got[0], [1, 1.0, "1", True, 2**63 - 1], strict=True))
