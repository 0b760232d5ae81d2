"""Tests for event-time windows: durations, window specs and window assignment."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jetstream.errors import PlanError
from jetstream.windows import (
    Sliding,
    Tumbling,
    WindowSpec,
    format_duration,
    parse_duration,
    sliding,
    tumbling,
)

SECOND, MINUTE, HOUR, DAY = 1_000, 60_000, 3_600_000, 86_400_000
UNITS = {"ms": 1, "s": SECOND, "m": MINUTE, "min": MINUTE, "h": HOUR, "d": DAY}

# -- parse_duration -----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "ms"), [
    ("500ms", 500),
    ("1ms", 1),
    ("0ms", 0),
    ("0s", 0),
    ("10s", 10 * SECOND),
    ("1m", MINUTE),
    ("1min", MINUTE),
    ("15min", 15 * MINUTE),
    ("2h", 2 * HOUR),
    ("1d", DAY),
    ("7d", 7 * DAY),
    ("1.5s", 1_500),
    ("0.5m", 30 * SECOND),
    ("0.25h", 15 * MINUTE),
    ("1.5d", 36 * HOUR),
    ("0.001s", 1),
    ("2.0s", 2 * SECOND),
    ("10.000ms", 10),
    ("007s", 7 * SECOND),
    (" 10s", 10 * SECOND),
    ("10s ", 10 * SECOND),
    ("10 s", 10 * SECOND),
    ("\t2 min\n", 2 * MINUTE),
])
def test_parse_duration(text: str, ms: int) -> None:
    result = parse_duration(text)
    assert result == ms
    assert type(result) is int


@pytest.mark.parametrize(("delta", "ms"), [
    (dt.timedelta(milliseconds=250), 250),
    (dt.timedelta(seconds=1.5), 1_500),
    (dt.timedelta(minutes=1), MINUTE),
    (dt.timedelta(hours=2, minutes=30), 150 * MINUTE),
    (dt.timedelta(days=1), DAY),
    (dt.timedelta(0), 0),
    (dt.timedelta(microseconds=3000), 3),
])
def test_parse_duration_of_a_timedelta(delta: dt.timedelta, ms: int) -> None:
    result = parse_duration(delta)
    assert result == ms
    assert type(result) is int


@pytest.mark.parametrize("value", [
    10, 10.0, 0, "10", "1.5", "", "   ", "s", "ms", "ten seconds", "10 sec", "10 seconds",
    "10sec", "10mins", "1hr", "1w", "1y", "1e3ms", "1.s", ".5s", "1.5.0s", "1,5s", "-1s",
    "+1s", "1 m s", "10s10ms", "1h30m", "10s!", "s10", "P1D", None, b"10s", [10, "s"],
])
def test_parse_duration_refuses_non_durations_and_says_how_to_write_one(value: Any) -> None:
    with pytest.raises(PlanError) as info:
        parse_duration(value)
    message = str(info.value)
    assert message.startswith(f"duration: {value!r} is not a duration")
    assert "write it with a unit" in message
    for example in ("'500ms'", "'10s'", "'1m'", "'1h'"):
        assert example in message


def test_parse_duration_names_what_it_was_parsing() -> None:
    with pytest.raises(PlanError, match=r"^window watermark: 5 is not a duration; write it"):
        parse_duration(5, "window watermark")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [
    "0.5ms", "1.25ms", "0.0001s", "1.0001s", dt.timedelta(microseconds=1),
    dt.timedelta(milliseconds=1, microseconds=500),
])
def test_parse_duration_refuses_fractions_of_a_millisecond(value: str | dt.timedelta) -> None:
    with pytest.raises(PlanError, match="is not a whole number of milliseconds"):
        parse_duration(value, "size")


@pytest.mark.parametrize(("text", "ms"), [
    ("1.001s", 1_001),
    ("1.003s", 1_003),
    ("0.017m", 1_020),
    ("1.15h", 4_140_000),
])
def test_parse_duration_of_decimals_is_exact(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@given(n=st.integers(0, 10**6), unit=st.sampled_from(sorted(UNITS)), space=st.sampled_from(
    ["", " "]))
def test_parse_duration_of_whole_numbers(n: int, unit: str, space: str) -> None:
    assert parse_duration(f"{n}{space}{unit}") == n * UNITS[unit]


# A window of 10**6 ms every 1 ms has 10**6 windows to list: no deadline (a loaded CI
# machine took 319 ms over one).
@settings(deadline=None)
@given(size=st.integers(1, 10**6), every=st.integers(1, 10**6), ts=st.integers(-10**12, 10**12))
def test_last_end_is_the_latest_window_end_at_or_before_a_time(size: int, every: int,
                                                              ts: int) -> None:
    spec = WindowSpec(max(size, every), every)
    end = spec.last_end(ts)
    assert end <= ts < end + spec.every_ms
    assert end in [e for _, e in spec.windows_of(end - 1)]  # a window ends there


@given(ms=st.integers(0, 10**12))
def test_parse_duration_agrees_with_timedelta(ms: int) -> None:
    assert parse_duration(dt.timedelta(milliseconds=ms)) == ms


@pytest.mark.parametrize("text", ["10S", "10MS", "1H"])
def test_units_are_case_sensitive(text: str) -> None:
    # "10MS" could be read as ten milliseconds or (in other tools) ten megaseconds: no guessing.
    with pytest.raises(PlanError, match="is not a duration"):
        parse_duration(text)


# -- format_duration ----------------------------------------------------------------------


@pytest.mark.parametrize(("ms", "text"), [
    (0, "0ms"),
    (1, "1ms"),
    (999, "999ms"),
    (1_000, "1s"),
    (1_500, "1500ms"),
    (59_000, "59s"),
    (90_000, "90s"),
    (MINUTE, "1m"),
    (61 * SECOND, "61s"),
    (90 * MINUTE, "90m"),
    (HOUR, "1h"),
    (25 * HOUR, "25h"),
    (DAY, "1d"),
    (7 * DAY, "7d"),
    (DAY + 1, f"{DAY + 1}ms"),
])
def test_format_duration(ms: int, text: str) -> None:
    assert format_duration(ms) == text


@given(ms=st.one_of(st.integers(0, 10**10), st.integers(0, 1000).map(lambda n: n * MINUTE)))
def test_format_duration_reads_back(ms: int) -> None:
    assert parse_duration(format_duration(ms)) == ms


@given(ms=st.integers(1, 10**10))
def test_format_duration_uses_the_largest_exact_unit(ms: int) -> None:
    text = format_duration(ms)
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text).groups()  # type: ignore[union-attr]
    assert int(number) * UNITS[unit] == ms
    larger = ["ms", "s", "m", "h", "d"]
    for bigger in larger[larger.index(unit) + 1:]:
        assert ms % UNITS[bigger] != 0


# -- window specs -------------------------------------------------------------------------


def test_tumbling() -> None:
    spec = tumbling("1m")
    assert spec == Tumbling(MINUTE, MINUTE)
    assert isinstance(spec, WindowSpec)
    assert (spec.size_ms, spec.every_ms) == (MINUTE, MINUTE)
    assert str(spec) == "tumbling(1m)"
    assert tumbling(dt.timedelta(seconds=90)) == Tumbling(90 * SECOND, 90 * SECOND)
    assert str(tumbling("1500ms")) == "tumbling(1500ms)"


def test_sliding() -> None:
    spec = sliding("10m", "30s")
    assert spec == Sliding(10 * MINUTE, 30 * SECOND)
    assert isinstance(spec, WindowSpec)
    assert str(spec) == "sliding(10m, every=30s)"
    assert sliding(dt.timedelta(hours=1), "1h") == Sliding(HOUR, HOUR)
    assert str(sliding("1d", "90m")) == "sliding(1d, every=90m)"


def test_specs_are_frozen_values() -> None:
    assert tumbling("60s") == tumbling("1m")
    assert hash(tumbling("60s")) == hash(tumbling("1min"))
    assert sliding("1m", "10s") != tumbling("1m")
    with pytest.raises(AttributeError):
        tumbling("1m").size_ms = 5  # type: ignore[misc]


@pytest.mark.parametrize(("size", "message"), [
    ("0s", "tumbling: the window size must be positive, not '0s'"),
    ("0ms", "tumbling: the window size must be positive"),
    (dt.timedelta(0), "tumbling: the window size must be positive"),
    (dt.timedelta(seconds=-5), "tumbling: the window size must be positive"),
    ("-5s", "tumbling: '-5s' is not a duration; write it with a unit"),
    (60, "tumbling: 60 is not a duration; write it with a unit"),
    ("1 minute", "tumbling: '1 minute' is not a duration"),
    ("0.5ms", "tumbling: '0.5ms' is not a whole number of milliseconds"),
])
def test_tumbling_refuses(size: Any, message: str) -> None:
    with pytest.raises(PlanError, match=re.escape(message)):
        tumbling(size)


@pytest.mark.parametrize(("size", "every", "message"), [
    ("1m", "2m", "sliding: every='2m' is longer than the window '1m', which would skip events; "
                 "use a shorter every or js.tumbling"),
    ("1s", "1001ms", "is longer than the window"),
    ("0s", "0s", "sliding: size and every must be positive, not '0s' and '0s'"),
    ("1m", "0s", "sliding: size and every must be positive, not '1m' and '0s'"),
    ("0s", "1s", "sliding: size and every must be positive"),
    (dt.timedelta(minutes=-1), "1s", "sliding: size and every must be positive"),
    ("1m", dt.timedelta(seconds=-1), "sliding: size and every must be positive"),
    ("1m", 10, "sliding every: 10 is not a duration; write it with a unit"),
    (60, "10s", "sliding: 60 is not a duration; write it with a unit"),
    ("1m", "10", "sliding every: '10' is not a duration"),
])
def test_sliding_refuses(size: Any, every: Any, message: str) -> None:
    with pytest.raises(PlanError, match=re.escape(message)):
        sliding(size, every)


# -- windows_of: boundaries ---------------------------------------------------------------


@pytest.mark.parametrize(("ts", "windows"), [
    (0, [(0, MINUTE)]),
    (1, [(0, MINUTE)]),
    (MINUTE - 1, [(0, MINUTE)]),
    (MINUTE, [(MINUTE, 2 * MINUTE)]),
    (MINUTE + 1, [(MINUTE, 2 * MINUTE)]),
    (-1, [(-MINUTE, 0)]),
    (-MINUTE, [(-MINUTE, 0)]),
    (-MINUTE - 1, [(-2 * MINUTE, -MINUTE)]),
    (1_700_000_000_000, [(1_700_000_000_000 - 1_700_000_000_000 % MINUTE,
                          1_700_000_000_000 - 1_700_000_000_000 % MINUTE + MINUTE)]),
])
def test_tumbling_windows_of(ts: int, windows: list[tuple[int, int]]) -> None:
    assert tumbling("1m").windows_of(ts) == windows


@pytest.mark.parametrize(("ts", "windows"), [
    # size 10s, every 5s: two windows each
    (0, [(-5_000, 5_000), (0, 10_000)]),
    (4_999, [(-5_000, 5_000), (0, 10_000)]),
    (5_000, [(0, 10_000), (5_000, 15_000)]),
    (9_999, [(0, 10_000), (5_000, 15_000)]),
    (10_000, [(5_000, 15_000), (10_000, 20_000)]),
    (-1, [(-10_000, 0), (-5_000, 5_000)]),
    (-5_000, [(-10_000, 0), (-5_000, 5_000)]),
    (-5_001, [(-15_000, -5_000), (-10_000, 0)]),
])
def test_sliding_windows_of(ts: int, windows: list[tuple[int, int]]) -> None:
    assert sliding("10s", "5s").windows_of(ts) == windows


@pytest.mark.parametrize(("ts", "windows"), [
    # size 10, every 3: starts are multiples of 3 in (ts - 10, ts]
    (0, [(-9, 1), (-6, 4), (-3, 7), (0, 10)]),
    (1, [(-6, 4), (-3, 7), (0, 10)]),
    (2, [(-6, 4), (-3, 7), (0, 10)]),
    (3, [(-6, 4), (-3, 7), (0, 10), (3, 13)]),
    (-1, [(-9, 1), (-6, 4), (-3, 7)]),
    (-3, [(-12, -2), (-9, 1), (-6, 4), (-3, 7)]),
])
def test_windows_of_when_size_is_not_a_multiple_of_every(
        ts: int, windows: list[tuple[int, int]]) -> None:
    assert sliding("10ms", "3ms").windows_of(ts) == windows


def test_windows_of_when_every_equals_size_is_tumbling() -> None:
    assert sliding("1m", "1m").windows_of(MINUTE + 5) == tumbling("1m").windows_of(MINUTE + 5)


def test_windows_of_with_gaps_between_windows() -> None:
    # sliding() refuses every > size, but a WindowSpec can describe it: an event in a gap falls
    # in no window.
    spec = WindowSpec(size_ms=2, every_ms=5)
    assert spec.windows_of(5) == [(5, 7)]
    assert spec.windows_of(6) == [(5, 7)]
    assert spec.windows_of(7) == []
    assert spec.windows_of(9) == []
    assert spec.windows_of(-4) == [(-5, -3)]
    assert spec.windows_of(-3) == []


# -- windows_of: properties ---------------------------------------------------------------


def brute_force_windows(size: int, every: int, ts: int) -> list[tuple[int, int]]:
    """Every window [k * every, k * every + size) that holds ts, by trying a wide range of k."""
    low_k = (ts - size) // every - 2
    high_k = ts // every + 2
    return [(k * every, k * every + size) for k in range(low_k, high_k + 1)
            if k * every <= ts < k * every + size]


timestamps = st.one_of(st.integers(-10**6, 10**6), st.integers(-(2**42), 2**42))


@st.composite
def sliding_sizes(draw: st.DrawFn) -> tuple[int, int]:
    every = draw(st.integers(1, 60))
    size = draw(st.one_of(st.integers(every, 400), st.integers(1, 8).map(lambda k: k * every)))
    return size, every


@settings(max_examples=300)
@given(sizes=sliding_sizes(), ts=timestamps)
def test_sliding_windows_match_brute_force(sizes: tuple[int, int], ts: int) -> None:
    size, every = sizes
    windows = sliding(f"{size}ms", f"{every}ms").windows_of(ts)
    assert windows == brute_force_windows(size, every, ts)
    for start, end in windows:
        assert start <= ts < end
        assert end - start == size
        assert start % every == 0
    starts = [s for s, _ in windows]
    assert starts == sorted(starts)
    assert len(set(starts)) == len(starts)


@settings(max_examples=300)
@given(sizes=sliding_sizes(), ts=timestamps)
def test_sliding_window_count(sizes: tuple[int, int], ts: int) -> None:
    """An event at ts falls in one window per multiple of every in (ts - size, ts]: that is
    ceil((size - ts mod every) / every) windows. So size/every when every divides size;
    otherwise ceil(size/every) when ts mod every < size mod every, and floor(size/every) when
    not."""
    size, every = sizes
    count = len(sliding(f"{size}ms", f"{every}ms").windows_of(ts))
    offset = ts % every
    assert count == -((offset - size) // every)  # ceil((size - offset) / every), in integers
    if size % every == 0:
        assert count == size // every
    elif offset < size % every:
        assert count == math.ceil(size / every)
    else:
        assert count == size // every


@settings(max_examples=200)
@given(size=st.integers(1, 10**8), ts=timestamps)
def test_tumbling_gives_exactly_one_window(size: int, ts: int) -> None:
    windows = tumbling(f"{size}ms").windows_of(ts)
    assert len(windows) == 1
    ((start, end),) = windows
    assert start <= ts < end
    assert end - start == size
    assert start % size == 0
    assert windows == brute_force_windows(size, size, ts)


@settings(max_examples=200)
@given(size=st.integers(1, 100), every=st.integers(1, 100), ts=timestamps)
def test_any_window_spec_matches_brute_force(size: int, every: int, ts: int) -> None:
    # Including every > size, which only a hand-built WindowSpec can describe.
    assert WindowSpec(size, every).windows_of(ts) == brute_force_windows(size, every, ts)


@settings(max_examples=100)
@given(sizes=sliding_sizes(), ts=st.integers(-10**4, 10**4))
def test_each_window_holds_a_contiguous_run_of_timestamps(sizes: tuple[int, int],
                                                         ts: int) -> None:
    # The windows of ts and ts + 1 differ by at most one opening and one closing window.
    size, every = sizes
    spec = sliding(f"{size}ms", f"{every}ms")
    now, later = set(spec.windows_of(ts)), set(spec.windows_of(ts + 1))
    closed = now - later
    opened = later - now
    assert all(end == ts + 1 for _, end in closed)
    assert all(start == ts + 1 for start, _ in opened)
    assert len(closed) <= 1
    assert len(opened) <= 1
