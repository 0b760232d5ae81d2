"""Each aggregate's Spark form: the Spark aggregate expressions whose values make its partial.

One row of :data:`SPARK_FORMS` per aggregate type (an aggregate without its own row takes its
nearest base class's, as ``avg`` takes ``sum``'s): ``columns`` gives the Spark aggregate
expressions over the aggregate's input column, ``accumulator`` turns their values, as
collected, into the aggregate's accumulator (:mod:`jetstream.aggregates`). Adding an aggregate
to the Spark stage is adding its row here.

Sums are exact without Spark's DECIMAL arithmetic, which costs an object per value: an integer
is summed as its high and low 32 bits, two bigint sums that cannot overflow; a double as three
29-bit integer limbs of ``|x| / 2**band``, where the band of exponents joins the group key
(see :func:`float_parts`); a double that is an integer scaled by a power of two, such as
``bytes / 1024``, as that integer's halves (see :func:`scaled_parts`). All are put back
together in Python, exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from jetstream.aggregates import Aggregate, Count, CountDistinct, Max, Min, Quantile, Sum
from jetstream.approx.sketches import ApproxCountDistinct, ApproxQuantile, TopKItems
from jetstream.approx.summaries import datasketches
from jetstream.errors import PlanError
from jetstream.expr import Arith, Expr, Lit
from jetstream.schema import DataType, Schema
from jetstream.windows import WindowSpec

__all__ = ["LIMBS", "SPARK_FORMS", "SparkForm", "exact_floats", "float_parts", "form_of",
           "scaled_exponent", "scaled_parts"]

_MANTISSA_BITS = 52  # a double's fraction bits: an integer below 2**53 is exactly a double
_MIN_EXPONENT = -1074  # 2**-1074, the smallest subnormal: every double is a multiple of it
# Exponents that share one band (and one group row): |x| / 2**band is an integer below
# 2**(55 + 31), so three 29-bit limbs hold it; a column's values rarely span two bands.
_EXPONENT_BAND = 32
_LIMB_BITS = 29
#: The limbs of a double's integer part, most significant first.
LIMBS = 3
_NON_FINITE = (math.inf, -math.inf, math.nan)  # Spark, unlike Python, has NaN = NaN
_ONE_CHUNK = 1 << _MANTISSA_BITS


@dataclass(frozen=True)
class Input:
    """An aggregate's input as the stage's grouped rows hold it: ``value`` the column; for
    a sum of doubles, also its band and limb columns (see :func:`float_parts`), or for
    doubles that are scaled integers the exponent and the integer's halves
    (:func:`scaled_parts`)."""

    value: Column
    band: Column | None = None
    limbs: tuple[Column, ...] = ()


@dataclass(frozen=True)
class SparkForm:
    """``columns(agg, input)``: Spark aggregate expressions; ``accumulator(agg, values,
    band)``: the accumulator from their collected values and the row's band of exponents
    (None but for a sum of doubles), a new object that the caller owns."""

    columns: Callable[[Any, Input], list[Column]]
    accumulator: Callable[[Any, Sequence[Any], int | None], Any]
    #: Its input, when a double, comes in bands of exponents and limbs (a sum's).
    banded: bool = False


def _count(agg: Count, x: Input) -> list[Column]:
    return [F.count(F.lit(1)) if agg.expr is None else F.count(x.value)]


def _sum(agg: Sum, x: Input) -> list[Column]:
    if len(x.limbs) == LIMBS:  # doubles: limbs of the finite values, a count of the others
        return [F.count(x.value), *(F.sum(limb) for limb in x.limbs),
                *(F.count(F.when(x.value == F.lit(v), True)) for v in _NON_FINITE)]
    # Integers (or a scaled integer's): the high and low 32 bits summed apart cannot
    # overflow a bigint.
    high, low = x.limbs or (F.shiftright(x.value, 32), x.value.bitwiseAND(F.lit(0xFFFFFFFF)))
    return [F.count(x.value), F.sum(high), F.sum(low)]


def _sum_accumulator(agg: Sum, values: Sequence[Any], band: int | None) -> list[Any]:
    # Called once per collected row, so plain indexing: ``values`` is what ``_sum`` made, the
    # count, then the limbs (or the high and low halves), then the counts of inf, -inf, NaN.
    count = values[0]
    if not count:
        return agg.create()
    if len(values) == 3:  # integers: the count, the high and the low halves
        total = (values[1] << 32) + values[2]
        if band is None:
            return [count, total, []]
        return [count, 0, exact_floats(total, band)]  # doubles, ``total * 2**band``
    chunks = []
    if band is not None:  # a NULL band: this row's values are not finite
        chunks = exact_floats((((values[1] << _LIMB_BITS) + values[2]) << _LIMB_BITS)
                              + values[3], band)
    if not (values[4] or values[5] or values[6]):  # the usual row: no infinity or NaN;
        return [count, 0, chunks]  # the chunks are already exact partials
    floats = [value for value, times in zip(_NON_FINITE, values[1 + LIMBS:], strict=True)
              for _ in range(times)]
    return agg.merge([count, 0, []], [0, 0, [*floats, *chunks]])


def _first(agg: Aggregate, values: Sequence[Any], band: int | None) -> Any:
    return values[0]


def _hll(agg: ApproxCountDistinct, values: Sequence[Any], band: int | None) -> Any:
    return (agg.create() if values[0] is None
            else datasketches().hll_sketch.deserialize(bytes(values[0])))


def _kll(agg: ApproxQuantile, values: Sequence[Any], band: int | None) -> Any:
    return (agg.create() if values[0] is None
            else datasketches().kll_doubles_sketch.deserialize(bytes(values[0])))


#: Aggregate type -> its Spark form.
SPARK_FORMS: dict[type[Aggregate], SparkForm] = {
    Count: SparkForm(_count, lambda agg, v, band: int(v[0])),
    Sum: SparkForm(_sum, _sum_accumulator, banded=True),  # and avg, a Sum
    Min: SparkForm(lambda agg, x: [F.min(x.value)], _first),
    Max: SparkForm(lambda agg, x: [F.max(x.value)], _first),
    # Both skip NULLs, as the reference's ``add`` does.
    CountDistinct: SparkForm(lambda agg, x: [F.collect_set(x.value)],
                             lambda agg, v, band: set(v[0])),
    Quantile: SparkForm(lambda agg, x: [F.collect_list(x.value)],
                        lambda agg, v, band: list(v[0])),
    ApproxCountDistinct: SparkForm(lambda agg, x: [F.hll_sketch_agg(x.value, agg.lg_k)], _hll),
    ApproxQuantile: SparkForm(
        lambda agg, x: [F.kll_sketch_agg_double(x.value.cast("double"), agg.k)], _kll),
    # Built from per-item counts in a second Spark job (LocalStage._top_items): no columns.
    TopKItems: SparkForm(lambda agg, x: [], lambda agg, v, band: agg.create()),
}


def form_of(agg: Aggregate) -> SparkForm:
    """The Spark form of ``agg``: its type's row, or its nearest base class's."""
    for kind in type(agg).__mro__:
        if kind in SPARK_FORMS:
            return SPARK_FORMS[kind]
    msg = f"{agg} does not run in the Spark local stage"
    raise PlanError(msg)


def window_starts(spec: WindowSpec, t: Column) -> tuple[Column, Column, Column]:
    """For a record at time ``t`` (ms): the start of the last window of ``spec`` that holds
    it, the first start of the run of starts up to it that might (``ceil(size / every)``
    of them: a start ``s`` holds it if ``s + size > t``), and the start of the first that
    does, its ``earliest`` window (the one the watermark closes first)."""
    size, every = F.lit(spec.size_ms), F.lit(spec.every_ms)
    last = t - F.pmod(t, every)
    first = last - F.lit((math.ceil(spec.size_ms / spec.every_ms) - 1) * spec.every_ms)
    earliest = t - size
    return last, first, earliest - F.pmod(earliest, every) + every


def finite(x: Column) -> Column:
    """Whether a double is a number, not NULL, NaN or infinite."""
    return x.isNotNull() & ~F.isnan(x) & (F.abs(x) != F.lit(math.inf))


def summed_parts(name: str, value: Column, exponent: int | None
                 ) -> tuple[Column, dict[str, Column], dict[str, Column]]:
    """A sum of doubles' input ``value`` as the column ``name`` is to hold, then the two
    projections over it: its band and its limbs. With ``exponent`` (``scaled_exponent``)
    the value is an integer scaled by a power of two, always finite (``scaled_parts``);
    otherwise one not finite is NULL (``float_parts``)."""
    if exponent is None:
        return F.when(finite(value), value), *float_parts(name)
    return value, *scaled_parts(name, exponent)


def float_parts(name: str) -> tuple[dict[str, Column], dict[str, Column]]:
    """Two projections over a double column ``name`` (NULL where not finite): the first adds
    its band ``{name}_e``, the second its limbs ``{name}_m0, _m1, _m2`` (most significant
    first, signed like the value), with ``x == sum(limb * 2**(29 * (2 - i))) * 2**band``
    exactly for a finite ``x``; a NULL band and limbs for a NULL one. (Two projections, each
    over named columns, keep every expression small: Spark analyses the plan every batch.)

    ``floor(log2(|x|))`` is the exponent of ``x``'s top bit or one off (Spark's ``log2`` can
    be, near a power of two), so ``last = that - 53``, and never below -1074 (the subnormals'
    last bit), is at or up to two below the exponent of ``x``'s last bit: ``|x| / 2**last`` is
    an integer below 2**55. The band starts at a multiple of 32 exponents from -1074, at or
    below ``last``: ``v = |x| / 2**band`` is an integer below 2**86, a double (dividing by a
    power of two, all of -1074 to 971 being doubles, is exact). ``floor(v / 2**29)`` is exact
    and a double too (below 2**53, or ``v / 2**29`` was an integer already), so the limbs
    ``floor(v / 2**58)``, ``floor(v / 2**29) - that * 2**29`` (bigints) and
    ``v - floor(v / 2**29) * 2**29`` (a double below 2**29) are exact. Zero has no ``log2``
    (NULL), and ``greatest`` skips a NULL: zero gets band -1074 and zero limbs.
    """
    x = F.col(name)
    top = F.floor(F.log2(F.when(x != 0, F.abs(x))))
    last = F.greatest(top - F.lit(_MANTISSA_BITS + 1), F.lit(_MIN_EXPONENT))
    band = last - F.pmod(last - F.lit(_MIN_EXPONENT), F.lit(_EXPONENT_BAND))
    v = F.abs(x) / F.pow(F.lit(2.0), F.col(f"{name}_e"))
    scale = float(2**_LIMB_BITS)
    high, middle = F.floor(v / F.lit(scale * scale)), F.floor(v / F.lit(scale))
    limbs = (high, middle - high * F.lit(2**_LIMB_BITS),
             (v - middle.cast("double") * F.lit(scale)).cast("bigint"))
    return ({f"{name}_e": F.when(x.isNotNull(), band)},
            {f"{name}_m{i}": F.when(x < 0, -limb).otherwise(limb)
             for i, limb in enumerate(limbs)})


def scaled_exponent(expr: Expr, schema: Schema) -> int | None:
    """``e`` when every value of the double ``expr`` over ``schema`` is an integer times
    ``2**e``, the integer at most 2**63 in magnitude: an integer expression divided, or
    multiplied, by a literal power of two (``bytes / 1024``: ``e = -10``); otherwise None.

    Spark and Python both round the integer ``n`` to a double first (``/`` and ``*`` of a
    bigint and a double) and scaling by a power of two is exact (no result here comes near
    the subnormals or the overflow), so the value is ``double(n) * 2**e``: an integer-valued
    double times ``2**e``. Its exact sum is an integer sum's, scaled.
    """
    if not isinstance(expr, Arith) or expr.op not in "*/":
        return None
    operand, factor = expr.left, expr.right
    if expr.op == "*" and isinstance(operand, Lit):
        operand, factor = factor, operand
    if not (isinstance(factor, Lit) and type(factor.value) in (int, float)
            and factor.value > 0 and math.isfinite(factor.value)):
        return None
    mantissa, exponent = math.frexp(factor.value)
    if mantissa != 0.5 or not -64 <= exponent - 1 <= 64:  # not a power of two, or far off
        return None
    if operand.dtype(schema) is not DataType.INT:
        return None
    return -(exponent - 1) if expr.op == "/" else exponent - 1


def scaled_parts(name: str, exponent: int) -> tuple[dict[str, Column], dict[str, Column]]:
    """The two projections of :func:`float_parts` for a double column ``name`` whose values
    are integers times ``2**exponent`` (see :func:`scaled_exponent`): the exponent as the
    band ``{name}_e`` (a literal, the same in every row), and the integer's high and low 32
    bits ``{name}_m0, _m1``. ``n = x / 2**exponent`` is exact and an integer-valued double of
    at most 2**63 in magnitude, so ``floor(n / 2**32)`` (at most 2**31), and ``n`` minus that
    times 2**32 (in [0, 2**32), an exact subtraction: the result is a double) are exact."""
    x = F.col(name)
    n = x * F.lit(math.ldexp(1.0, -exponent))
    high = F.floor(n / F.lit(float(2**32)))
    return ({f"{name}_e": F.lit(exponent)},
            {f"{name}_m0": high, f"{name}_m1": (n - high * F.lit(float(2**32))).cast("bigint")})


def exact_floats(total: int, e: int) -> list[float]:
    """Floats whose exact sum is ``total * 2**e``: [0.0] for zero. They do not overlap and
    come in increasing magnitude, so they are already the exact partials of a ``Sum``.

    Cut into 52-bit chunks, each chunk times its power of two is a double, exactly. A total of
    2**1024 or more has no such chunks: it becomes ±inf, what a float addition overflows to.
    That is the one case where the stage is not exact (it is while the values of one band, at
    one site, in one micro-batch, window and key add up to less than 2**1024); the reference's
    exact partials overflow there too, to infinities that depend on the order of the values.
    """
    if -_ONE_CHUNK < total < _ONE_CHUNK:  # the usual total: one chunk, zero included
        return [math.ldexp(total, e)]
    sign, rest, shift = -1.0 if total < 0 else 1.0, abs(total), 0
    chunks = []
    try:
        while rest:
            if chunk := rest & ((1 << _MANTISSA_BITS) - 1):
                chunks.append(sign * math.ldexp(chunk, e + shift))
            rest >>= _MANTISSA_BITS
            shift += _MANTISSA_BITS
    except OverflowError:
        return [sign * math.inf]
    return chunks or [0.0]
