"""What a sketch is below the aggregates: DataSketches, loaded when first needed; every
sketch's bytes checked before DataSketches reads them; and the accumulators that an exact
``count_distinct`` or ``quantile`` becomes when a thin link steps it down to a sketch
(:mod:`jetstream.approx.holistic`): how they merge, what they answer, how far they may be off,
and how they cross the wire, ``{"hll": BASE64}`` or ``{"kll": BASE64, "ints": BOOL}`` (``ints``:
the values were integers, so the quantile is one).

The exact aggregates (:mod:`jetstream.aggregates`) and the approximate ones
(:mod:`jetstream.approx.sketches`) both stand on this module, which stands on no other of
ours.
"""

from __future__ import annotations

import base64
import itertools
import math
import struct
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import datasketches as ds

__all__ = ["MAX_KLL_K", "MAX_LG_K", "QuantileSketch", "check_frequent_strings", "check_hll",
           "check_kll_doubles", "datasketches", "decode", "distinct_error", "encode",
           "hll_error", "hll_union", "merge_distinct", "merge_quantile", "quantile_error",
           "quantile_of"]


def datasketches() -> Any:
    """The datasketches module, imported when a sketch is first needed: it loads numpy
    (about 13-17 MB a process), which processes that build no sketch (the controller, the
    CLI, a site or a worker whose links carry exact rows) do without."""
    import datasketches as module

    return module


#: The largest sketches a link steps down to (and a receiver accepts).
MAX_LG_K = 12
MAX_KLL_K = 200
#: Standard deviations behind the HLL bounds we report: about 99.7% confidence.
_HLL_STD_DEVS = 3


def hll_error(acc: ds.hll_sketch) -> float:
    """An HLL estimate's relative error, at three standard deviations."""
    estimate = acc.get_estimate()
    if estimate == 0:
        return 0.0
    spread = max(acc.get_upper_bound(_HLL_STD_DEVS) - estimate,
                 estimate - acc.get_lower_bound(_HLL_STD_DEVS))
    return float(spread / estimate)


@dataclass
class QuantileSketch:
    """A quantile's values as a KLL sketch; ``ints``: they were integers."""

    sketch: Any  # datasketches.kll_doubles_sketch
    ints: bool


def merge_distinct(acc: Any, other: Any) -> Any:
    """A set or HLL sketch merged with another (``other`` unchanged): a set if both are, else
    a sketch (of the smaller size)."""
    if isinstance(acc, set) and isinstance(other, set):
        acc |= other
        return acc
    if isinstance(acc, set):
        acc, other = hll_union([other], other.lg_config_k), acc
    if isinstance(other, set):
        for value in other:
            acc.update(value)
        return acc
    return hll_union([acc, other], min(acc.lg_config_k, other.lg_config_k))


def hll_union(sketches: list[Any], lg_k: int) -> Any:
    """The union of HLL sketches at ``lg_k`` (no larger than any of theirs). Each is brought
    to ``lg_k`` on its own first: DataSketches' union, given a larger sketch in coupon mode
    and then a smaller one, returned the smaller one's estimate (found by
    ``tests/test_holistic.py``)."""
    union = datasketches().hll_union(lg_k)
    for sketch in sketches:
        if len(sketches) > 1 and sketch.lg_config_k != lg_k:
            sketch = hll_union([sketch], lg_k)
        union.update(sketch)
    return union.get_result()


def merge_quantile(acc: Any, other: Any) -> Any:
    """A list of values or a KLL sketch merged with another: a list if both are, else a
    sketch (a list's values added to it)."""
    if isinstance(acc, list) and isinstance(other, list):
        acc.extend(other)
        return acc
    if isinstance(acc, list):
        acc, other = QuantileSketch(_copy_kll(other.sketch), other.ints), acc
    if isinstance(other, list):
        for value in other:
            acc.sketch.update(float(value))
        return QuantileSketch(acc.sketch, acc.ints and all(isinstance(v, int) for v in other))
    acc.sketch.merge(other.sketch)
    return QuantileSketch(acc.sketch, acc.ints and other.ints)


def _copy_kll(sketch: Any) -> Any:
    """A copy (``merge`` may mutate its first accumulator, never its second)."""
    return type(sketch).deserialize(sketch.serialize())


def distinct_error(acc: Any) -> float:
    return 0.0 if isinstance(acc, set) else hll_error(acc)


def quantile_error(acc: Any) -> float:
    if isinstance(acc, list) or not acc.sketch.is_estimation_mode():
        return 0.0
    return float(acc.sketch.normalized_rank_error(False))


def quantile_of(acc: QuantileSketch, q: float) -> int | float | None:
    if acc.sketch.is_empty():
        return None
    value = acc.sketch.get_quantile(q, True)  # inclusive: as Quantile defines it
    return int(value) if acc.ints else float(value)


def encode(acc: Any) -> dict[str, Any]:
    """A sketch accumulator as a JSON object."""
    if isinstance(acc, QuantileSketch):
        return {"kll": base64.b64encode(acc.sketch.serialize()).decode("ascii"),
                "ints": acc.ints}
    return {"hll": base64.b64encode(acc.serialize_compact()).decode("ascii")}


def decode(name: str, data: dict[str, Any]) -> Any:
    """``encode``'s output back, checked first (DataSketches' readers trust their bytes);
    ValueError naming the aggregate if it is not a sketch this side accepts."""
    kind = "hll" if set(data) == {"hll"} else "kll" if set(data) == {"kll", "ints"} else None
    if kind is None or not isinstance(data[kind], str) or (
            kind == "kll" and not isinstance(data["ints"], bool)):
        msg = f"{name}: not a list of values or a sketch: {data!r:.80}"
        raise ValueError(msg)
    try:
        raw = base64.b64decode(data[kind], validate=True)
        if kind == "hll":
            check_hll(raw, MAX_LG_K)
            return datasketches().hll_sketch.deserialize(raw)
        check_kll_doubles(raw, MAX_KLL_K)
        return QuantileSketch(datasketches().kll_doubles_sketch.deserialize(raw), data["ints"])
    except (TypeError, ValueError, RuntimeError, IndexError, MemoryError) as e:
        msg = f"{name}: not a serialized {kind.upper()} sketch: {e}"
        raise ValueError(msg) from None


# DataSketches' C++ readers trust the counts and offsets inside the bytes: a flipped bit in a
# KLL level boundary or an HLL register passes ``deserialize`` and then crashes the whole
# interpreter in a later merge (a segfault, not an exception). So every field a reader relies
# on is checked here first, against the layouts of datasketches-cpp 5 (little-endian), and only
# the forms ``encode`` writes are accepted. Each check raises ValueError saying what is wrong.


def _unpack(layout: str, data: bytes, offset: int, what: str) -> tuple[Any, ...]:
    try:
        return struct.unpack_from("<" + layout, data, offset)
    except struct.error:
        msg = f"{what}: {len(data)} bytes is too short"
        raise ValueError(msg) from None


_HLL_FLAGS = 0b111110  # read-only, empty, compact, out-of-order, full-size; not big-endian
_HLL_EMPTY, _HLL_COMPACT = 4, 8
_HLL_LIST_MAX = 7  # a list of 8 coupons becomes a set (or the register array)
_HLL_ARRAY_START = 40
_HLL_AUX_TOKEN = 15
_SLOT_MASK = (1 << 26) - 1
_LOW_NIBBLE = bytes(b & 15 for b in range(256))
_HIGH_NIBBLE = bytes(b >> 4 for b in range(256))


def check_hll(data: bytes, max_lg_k: int) -> None:
    """Raise ValueError unless ``data`` is a well-formed compact HLL sketch of lg_k <= max_lg_k.

    Checked: the header, the exact length of each mode (list, set, register array), that
    coupons are distinct and non-empty, the register values and their count at the minimum,
    and that an HLL_4 image's exception table holds exactly the registers that point to it.
    """
    what = "not a compact HLL sketch"
    pre, version, family, lg_k, _, flags, count, mode = _unpack("8B", data, 0, what)
    cur_mode, target = mode & 3, mode >> 2
    if family != 7 or version != 1:
        msg = f"{what}: family {family}, serial version {version}"
        raise ValueError(msg)
    if not 4 <= lg_k <= max_lg_k:
        msg = f"{what}: lg_k {lg_k} is not between 4 and this aggregate's {max_lg_k}"
        raise ValueError(msg)
    if cur_mode > 2 or target > 2 or flags & ~_HLL_FLAGS or not flags & _HLL_COMPACT:
        msg = f"{what}: mode byte {mode:#04x}, flags {flags:#04x}"
        raise ValueError(msg)
    k = 1 << lg_k
    if flags & _HLL_EMPTY:
        if (pre, cur_mode, count, len(data)) != (2, 0, 0, 8):
            msg = f"{what}: an empty sketch of {len(data)} bytes"
            raise ValueError(msg)
    elif cur_mode == 0:  # a short list of coupons
        if pre != 2 or not 1 <= count <= _HLL_LIST_MAX or len(data) != 8 + 4 * count:
            msg = f"{what}: a list of {count} coupons in {len(data)} bytes"
            raise ValueError(msg)
        _check_coupons(data, 8, count, what)
    elif cur_mode == 1:  # a hash set of coupons
        (count,) = _unpack("I", data, 8, what)
        if (pre != 3 or lg_k < 8 or not 1 <= count <= 3 * (k >> 3) // 4 + 1
                or len(data) != 12 + 4 * count):
            msg = f"{what}: a set of {count} coupons in {len(data)} bytes at lg_k {lg_k}"
            raise ValueError(msg)
        _check_coupons(data, 12, count, what)
    else:
        _check_hll_array(data, pre, lg_k, target, what)


def _check_coupons(data: bytes, start: int, count: int, what: str) -> None:
    coupons = _unpack(f"{count}I", data, start, what)
    if len(set(coupons)) != count or any(c >> 26 == 0 for c in coupons):
        msg = f"{what}: its coupons repeat or are empty"
        raise ValueError(msg)


def _check_hll_array(data: bytes, pre: int, lg_k: int, target: int, what: str) -> None:
    k = 1 << lg_k
    cur_min = data[6]
    hip, kxq0, kxq1, at_min, aux = _unpack("3d2I", data, 8, what)
    size = (k // 2, (3 * k >> 2) + 1, k)[target]
    if pre != 10 or len(data) != _HLL_ARRAY_START + size + 4 * aux:
        msg = f"{what}: {len(data)} bytes for {k} registers and {aux} exceptions"
        raise ValueError(msg)
    if not all(math.isfinite(x) and x >= 0 for x in (hip, kxq0, kxq1)) or at_min > k:
        msg = f"{what}: its estimator state is not finite and non-negative"
        raise ValueError(msg)
    registers = data[_HLL_ARRAY_START:_HLL_ARRAY_START + size]
    if target == 0:  # HLL_4: 4-bit offsets from cur_min, 15 = "see the exception table"
        low, high = registers.translate(_LOW_NIBBLE), registers.translate(_HIGH_NIBBLE)
        tokens = low.count(_HLL_AUX_TOKEN) + high.count(_HLL_AUX_TOKEN)
        if cur_min > 63 - 14 or low.count(0) + high.count(0) != at_min or tokens != aux:
            msg = (f"{what}: {tokens} registers point to {aux} exceptions, or the minimum "
                   f"{cur_min} and its count {at_min} do not match the registers")
            raise ValueError(msg)
        if aux:
            pointing = {2 * i for i, v in enumerate(low) if v == _HLL_AUX_TOKEN} | {
                2 * i + 1 for i, v in enumerate(high) if v == _HLL_AUX_TOKEN}
            pairs = _unpack(f"{aux}I", data, _HLL_ARRAY_START + size, what)
            if ({p & _SLOT_MASK for p in pairs} != pointing
                    or any(not cur_min + _HLL_AUX_TOKEN <= p >> 26 for p in pairs)):
                msg = f"{what}: its exception table does not match its registers"
                raise ValueError(msg)
        return
    if cur_min or aux:
        msg = f"{what}: an HLL_{4 + 2 * target} image with a minimum or exceptions"
        raise ValueError(msg)
    if target == 2 and (max(registers) > 63 or registers.count(0) != at_min):
        msg = f"{what}: a register over 63, or {at_min} is not the count of empty ones"
        raise ValueError(msg)


_KLL_EMPTY, _KLL_SORTED, _KLL_SINGLE = 1, 2, 4
_KLL_M = 8  # the only level width DataSketches writes
_KLL_MAX_LEVELS = 61


def _kll_capacity(k: int, levels: int) -> int:
    """How many items a KLL sketch of ``levels`` levels holds (kll_helper.hpp)."""
    def cap(k: int, depth: int) -> int:  # k * (2/3)**depth, rounded as in C++
        if depth > 30:
            return cap(cap(k, depth // 2), depth - depth // 2)
        return (((2 * k) << depth) // 3**depth + 1) >> 1
    return sum(max(_KLL_M, cap(k, levels - h - 1)) for h in range(levels))


def check_kll_doubles(data: bytes, max_k: int) -> None:
    """Raise ValueError unless ``data`` is a well-formed KLL doubles sketch of k <= max_k.

    Checked: the header, the level boundaries against the capacity the reader will allocate,
    that the levels' weights add up to ``n``, and that no value is NaN, lies outside
    ``[min, max]``, or is out of order within a sorted level (C++'s sort and merge assume it).
    """
    what = "not a KLL doubles sketch"
    pre, version, family, flags, k, m, _ = _unpack("4BH2B", data, 0, what)
    if family != 15 or version not in (1, 2) or m != _KLL_M or flags & ~7:
        msg = f"{what}: family {family}, serial version {version}, m {m}, flags {flags:#04x}"
        raise ValueError(msg)
    if not 8 <= k <= max_k:
        msg = f"{what}: k {k} is not between 8 and this aggregate's {max_k}"
        raise ValueError(msg)
    if flags & _KLL_EMPTY:
        if pre != 2 or len(data) != 8:
            msg = f"{what}: an empty sketch of {len(data)} bytes"
            raise ValueError(msg)
        return
    if flags & _KLL_SINGLE:
        if pre != 2 or len(data) != 16 or math.isnan(_unpack("d", data, 8, what)[0]):
            msg = f"{what}: a one-item sketch of {len(data)} bytes, or its item is NaN"
            raise ValueError(msg)
        return
    n, min_k, count = _unpack("QHB", data, 8, what)
    start = 20 + 4 * count + 16
    if pre != 5 or not 1 <= count <= _KLL_MAX_LEVELS or not 8 <= min_k <= k or (
            len(data) < start or (len(data) - start) % 8):
        msg = f"{what}: {count} levels, min_k {min_k}, in {len(data)} bytes"
        raise ValueError(msg)
    capacity = _kll_capacity(k, count)
    levels = [*_unpack(f"{count}I", data, 20, what), capacity]
    pairs = list(itertools.pairwise(levels))
    if (any(a > b for a, b in pairs) or capacity - levels[0] != (len(data) - start) // 8
            or sum((b - a) << h for h, (a, b) in enumerate(pairs)) != n):
        msg = f"{what}: its level boundaries {levels} do not fit its size or its count {n}"
        raise ValueError(msg)
    low, high = _unpack("2d", data, 20 + 4 * count, what)
    items = array("d", data[start:])
    if not low <= high or any(not low <= x <= high for x in items):  # NaN fails every test
        msg = f"{what}: a value is NaN or outside its [min, max]"
        raise ValueError(msg)
    for h in range(0 if flags & _KLL_SORTED else 1, count):
        level = items[levels[h] - levels[0]:levels[h + 1] - levels[0]]
        if any(a > b for a, b in itertools.pairwise(level)):
            msg = f"{what}: level {h} is not sorted"
            raise ValueError(msg)


def check_frequent_strings(data: bytes, max_lg_max_k: int) -> None:
    """Raise ValueError unless ``data`` is a well-formed frequent-items sketch of strings whose
    map holds at most ``2**max_lg_max_k`` items.

    Checked: the header and map sizes (what the reader allocates), that every weight is
    positive and the items are distinct UTF-8 strings filling the bytes exactly, and that the
    weights, the offset and the total fit in a signed 64-bit integer and agree.
    """
    what = "not a frequent-items sketch"
    pre, version, family, lg_max, lg_cur, flags, _ = _unpack("6BH", data, 0, what)
    if family != 10 or version != 1 or flags & ~0b101 or not 3 <= lg_cur <= lg_max:
        msg = f"{what}: family {family}, serial version {version}, flags {flags:#04x}, " \
              f"map sizes 2**{lg_cur} of 2**{lg_max}"
        raise ValueError(msg)
    if lg_max > max_lg_max_k:
        msg = f"{what}: a map of 2**{lg_max} items, over this aggregate's 2**{max_lg_max_k}"
        raise ValueError(msg)
    if flags:
        if pre != 1 or len(data) != 8:
            msg = f"{what}: an empty sketch of {len(data)} bytes"
            raise ValueError(msg)
        return
    count, _, total, offset = _unpack("2I2Q", data, 8, what)
    if pre != 4 or count > 3 * (1 << lg_max) // 4 or len(data) < 32 + 12 * count:
        msg = f"{what}: {count} items in {len(data)} bytes, map of 2**{lg_max}"
        raise ValueError(msg)
    weights = _unpack(f"{count}Q", data, 32, what)
    at, items = 32 + 8 * count, set()
    for _ in range(count):
        (size,) = _unpack("I", data, at, what)
        item = data[at + 4:at + 4 + size]
        if len(item) != size:
            msg = f"{what}: an item runs past the end"
            raise ValueError(msg)
        try:
            items.add(item.decode("utf-8"))
        except UnicodeDecodeError:
            msg = f"{what}: item {len(items)} is not UTF-8 text"
            raise ValueError(msg) from None
        at += 4 + size
    if at != len(data) or len(items) != count:
        msg = f"{what}: {len(data) - at} bytes after its items, or an item repeats"
        raise ValueError(msg)
    if min(weights, default=1) < 1 or not offset <= total < 1 << 62 or sum(weights) > total:
        msg = f"{what}: its weights {sum(weights)}, offset {offset} and total {total} disagree"
        raise ValueError(msg)
