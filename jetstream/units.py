"""Link bandwidths written the way ``tc`` writes rates: ``"100mbit"``, ``"1.5gbit"``.

Bandwidths are bits per second with decimal multiples (``kbit`` = 1,000 bit/s). Bare numbers
are refused (bits or bytes would be a guess), and so are ``bps``/``kbps``/``mbps``/``gbps``:
``tc`` reads ``mbps`` as megaBYTES per second while most people read it as megabits.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, localcontext

from jetstream.errors import PlacementError

__all__ = ["format_bandwidth", "parse_bandwidth"]

_BANDWIDTH_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_BANDWIDTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z/]*)\s*$", re.IGNORECASE)
_AMBIGUOUS = {"bps", "kbps", "mbps", "gbps", "tbps", "b/s", "kb/s", "mb/s", "gb/s", "tb/s"}
_DIGITS = 400  # enough for any float written out in full, so Decimal arithmetic stays exact
_EXAMPLES = "e.g. '100mbit', '1.5gbit', '512kbit'"


def parse_bandwidth(value: object, what: str = "bandwidth") -> float:
    """Bits per second in ``"512kbit"``, ``"100mbit"``, ``"1.5gbit"`` (case-insensitive).

    Units: ``bit``, ``kbit``, ``mbit``, ``gbit``, ``tbit``, all per second, powers of 1000.

    Raises
    ------
    PlacementError
        For a bare number, an unknown or ambiguous unit, or a rate that is not positive.
    """
    if isinstance(value, int | float):  # bool is an int too
        msg = f"{what}: {value!r} has no unit; write the rate in bits per second, {_EXAMPLES}"
        raise PlacementError(msg)
    if not isinstance(value, str) or not (m := _BANDWIDTH.match(value)):
        msg = f"{what}: {value!r} is not a bandwidth; {_EXAMPLES}"
        raise PlacementError(msg)
    unit = m.group(2).lower()
    if not unit:
        msg = f"{what}: {value!r} has no unit; write the rate in bits per second, {_EXAMPLES}"
        raise PlacementError(msg)
    if unit in _AMBIGUOUS:
        prefix = unit[0] if unit[0] in "kmgt" else ""
        as_bytes = Decimal(m.group(1)) * 8
        msg = (f"{what}: {value!r} is ambiguous: tc reads '{unit}' as bytes per second, most "
               f"people as bits; write '{m.group(1)}{prefix}bit' for bits, or "
               f"'{as_bytes:f}{prefix}bit' if you meant bytes")
        raise PlacementError(msg)
    if unit not in _BANDWIDTH_UNITS:
        msg = (f"{what}: unknown unit '{m.group(2)}' in {value!r}; use one of "
               f"{', '.join(_BANDWIDTH_UNITS)} (bits per second)")
        raise PlacementError(msg)
    with localcontext() as exact:
        exact.prec = _DIGITS
        bps = float(Decimal(m.group(1)) * _BANDWIDTH_UNITS[unit])  # one rounding, at the end
    if not bps > 0 or math.isinf(bps):
        msg = f"{what}: expected a positive bandwidth, got {value!r}"
        raise PlacementError(msg)
    return bps


def format_bandwidth(bps: float) -> str:
    """The shortest unit string :func:`parse_bandwidth` reads back as exactly ``bps``.

    >>> format_bandwidth(100e6), format_bandwidth(1.5e6), format_bandwidth(12.5)
    ('100mbit', '1500kbit', '12.5bit')
    """
    exact = Decimal(repr(float(bps)))  # the shortest decimal that reads back as bps
    if not exact.is_finite() or exact <= 0:
        msg = f"bandwidth: cannot write {bps!r}: expected a positive, finite number of bits/s"
        raise PlacementError(msg)
    with localcontext() as context:
        context.prec = _DIGITS
        if exact == exact.to_integral_value():
            for unit, factor in reversed(_BANDWIDTH_UNITS.items()):
                if exact % factor == 0:
                    return f"{exact // factor:f}{unit}"
        return f"{exact:f}bit"
