"""Event-time windows: durations, tumbling and sliding window specs, and window assignment."""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from decimal import Decimal

from jetstream.errors import PlanError

__all__ = ["Sliding", "Tumbling", "WindowSpec", "parse_duration", "sliding", "tumbling"]

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|min|m|h|d)\s*$")


def parse_duration(value: str | dt.timedelta, what: str = "duration") -> int:
    """Milliseconds in ``"500ms"``, ``"10s"``, ``"1m"``, ``"2h"``, ``"1d"`` or a timedelta.

    Bare numbers are refused: seconds or milliseconds would be a guess.
    """
    ms: float | Decimal
    if isinstance(value, dt.timedelta):
        ms = value / dt.timedelta(milliseconds=1)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        ms = Decimal(m.group(1)) * _UNITS_MS[m.group(2)]  # exact: "1.001s" is 1001 ms
    else:
        msg = (f"{what}: {value!r} is not a duration; write it with a unit, "
               "e.g. '500ms', '10s', '1m', '1h'")
        raise PlanError(msg)
    if ms != int(ms):
        msg = f"{what}: {value!r} is not a whole number of milliseconds"
        raise PlanError(msg)
    return int(ms)


def format_duration(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class WindowSpec:
    """Windows ``[start, start + size_ms)`` whose starts are multiples of ``every_ms``."""

    size_ms: int
    every_ms: int

    def windows_of(self, ts: int) -> list[tuple[int, int]]:
        """The windows an event at ``ts`` (epoch ms) falls in, earliest first."""
        last_start = ts - ts % self.every_ms
        first_start = last_start - (math.ceil(self.size_ms / self.every_ms) - 1) * self.every_ms
        return [(s, s + self.size_ms)
                for s in range(first_start, last_start + 1, self.every_ms)
                if s <= ts < s + self.size_ms]

    def last_end(self, ts: int) -> int:
        """The latest end of a window at or before ``ts`` (epoch ms)."""
        return ts - (ts - self.size_ms) % self.every_ms


@dataclass(frozen=True)
class Tumbling(WindowSpec):
    def __str__(self) -> str:
        return f"tumbling({format_duration(self.size_ms)})"


@dataclass(frozen=True)
class Sliding(WindowSpec):
    def __str__(self) -> str:
        return f"sliding({format_duration(self.size_ms)}, every={format_duration(self.every_ms)})"


def tumbling(size: str | dt.timedelta) -> Tumbling:
    """Back-to-back windows of one size: each event falls in exactly one."""
    size_ms = parse_duration(size, "tumbling")
    if size_ms <= 0:
        msg = f"tumbling: the window size must be positive, not {size!r}"
        raise PlanError(msg)
    return Tumbling(size_ms, size_ms)


def sliding(size: str | dt.timedelta, every: str | dt.timedelta) -> Sliding:
    """Windows of ``size`` starting every ``every``: an event falls in about size/every of them."""
    size_ms = parse_duration(size, "sliding")
    every_ms = parse_duration(every, "sliding every")
    if size_ms <= 0 or every_ms <= 0:
        msg = f"sliding: size and every must be positive, not {size!r} and {every!r}"
        raise PlanError(msg)
    if every_ms > size_ms:
        msg = (f"sliding: every={every!r} is longer than the window {size!r}, which would skip "
               "events; use a shorter every or js.tumbling")
        raise PlanError(msg)
    return Sliding(size_ms, every_ms)
