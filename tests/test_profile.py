"""A link's profile: each level's bytes and error measured on the query's own windows, and the
policy choosing by them."""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.approx.levels import DegradationLevel, Ranking, heaviest, ladder, ranking
from jetstream.approx.policy import LinkPolicy
from jetstream.approx.profile import Profile, level_error
from jetstream.approx.truncate import exact_partial, merge_bounded, missing_share
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.finish import with_row_bounds
from jetstream.dataplane.partials import PartialBatch, summarised
from jetstream.operators import WindowAggregate
from jetstream.results import WindowResult
from tests.test_merger import LOGS, split

COUNTS = js.Query("by-domain", LOGS.window(js.tumbling("10s")).group_by("domain")
                  .agg(requests=js.count(), kb=js.sum("bytes")),
                  slo=js.SLO(max_error=0.1))
COUNTS_SPLIT, _, COUNTS_AGG = split(COUNTS)
TOP = js.Query("top", LOGS.window(js.tumbling("10s")).group_by("domain")
               .agg(requests=js.count()).top_k(5, by="requests"))
TOP_SPLIT, _, TOP_AGG = split(TOP)


def zipf_rows(aggregate: WindowAggregate, rnd: random.Random, keys: int, events: int
              ) -> list[dict[str, Any]]:
    """One site's exact partial rows of a window: ``events`` requests over ``keys`` domains,
    Zipf(1.1) in a shuffled order of the site's own."""
    order = list(range(keys))
    rnd.shuffle(order)
    picks = rnd.choices(order, [1 / (i + 1) ** 1.1 for i in range(keys)], k=events)
    rows: dict[int, dict[str, Any]] = {}
    for pick in picks:
        row = rows.setdefault(pick, {"domain": f"d{pick}.example"} | {
            name: agg.create() for name, agg in aggregate.aggregates})
        for name, agg in aggregate.aggregates:
            row[name] = agg.add(row[name], 1000)
    return list(rows.values())


def wire_bytes(aggregate: WindowAggregate):  # type: ignore[no-untyped-def]
    template = PartialBatch("q", (0, 10_000), "sfo", ())
    return lambda summary, index: encode_batch(summarised(template, summary, index),
                                               aggregate).ByteSize()


def test_a_profile_picks_one_window_in_every_and_none_within_its_interval() -> None:
    now = [0.0]
    profile = Profile(ladder(None, COUNTS_AGG, heaviest(COUNTS_SPLIT)), COUNTS_AGG, every=3,
                      min_interval_s=30.0, wall=lambda: now[0])
    picked = []
    for second in range(0, 120, 10):  # a window every 10 s
        now[0] = float(second)
        picked.append(profile.due())
    # The third window (at 20 s), then the first due 30 s on (50 s), and so on.
    assert [s for s, p in zip(range(0, 120, 10), picked, strict=True) if p] == [20, 50, 80, 110]


def test_a_profile_measures_every_level_of_a_sampled_window() -> None:
    steps = ladder(None, COUNTS_AGG, heaviest(COUNTS_SPLIT))
    profile = Profile(steps, COUNTS_AGG, every=2)
    rnd = random.Random(7)
    windows = [exact_partial(zipf_rows(COUNTS_AGG, rnd, 3000, 20_000)) for _ in range(4)]
    assert [profile.offer(w, wire_bytes(COUNTS_AGG)) for w in windows] == [False, True, False, True]
    assert profile.windows == 2 and profile.cpu_s > 0
    figures = profile.figures()
    assert [f.name for f in figures] == [lv.name for lv in steps.levels]
    assert all(f.windows == 2 for f in figures)
    sizes = [f.bytes for f in figures]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0] / 10
    errors = [f.error for f in figures]
    assert errors[0] == 0.0 and errors == sorted(errors) and errors[-1] > 0.1
    # A level's error is the share of the window its cut leaves out, the worst of the two.
    shares = [missing_share(steps.degrade(w, COUNTS_AGG, steps.levels[3]), COUNTS_AGG,
                            "requests") for w in (windows[1], windows[3])]
    assert errors[3] == max(shares)


def test_a_level_with_no_data_to_measure_stays_unmeasured() -> None:
    steps = ladder(ranking(TOP_SPLIT), TOP_AGG)
    profile = Profile(steps, TOP_AGG, every=1, skip={0})
    profile.offer(exact_partial(zipf_rows(TOP_AGG, random.Random(1), 500, 5000)),
                  wire_bytes(TOP_AGG))
    figures = profile.figures()
    assert figures[0].windows == 0  # TPUT's rounds: what they ship no window's encoding says
    assert profile.measured()[0] is None
    assert all(f.windows == 1 for f in figures[1:])
    # A top-k's error: what the input adds to a row's width over its own k-th value.
    assert 0 < figures[1].error <= figures[-1].error


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 4), st.integers(0, 2**32), st.integers(1, 3))
def test_the_result_s_error_is_at_most_the_largest_a_sender_measured(
        sites: int, seed: int, index: int) -> None:
    """A merge's missing share is at most its inputs' largest: what the profiles measure at
    the senders bounds what the root reports."""
    rnd = random.Random(seed)
    steps = ladder(None, COUNTS_AGG, heaviest(COUNTS_SPLIT))
    level = steps.levels[index]
    windows = [exact_partial(zipf_rows(COUNTS_AGG, rnd, rnd.randint(50, 3000),
                                       rnd.randint(100, 5000))) for _ in range(sites)]
    sent = [steps.degrade(w, COUNTS_AGG, level) for w in windows]
    measured = [level_error(steps, index, s, COUNTS_AGG, w)  # type: ignore[arg-type]
                for s, w in zip(sent, windows, strict=True)]
    root = merge_bounded(sent, COUNTS_AGG)  # type: ignore[arg-type]
    result = with_row_bounds(WindowResult("q", 0, 10_000, []), root, COUNTS_AGG,
                             Ranking(0, "requests"))
    assert Fraction(result.error_bound or 0) <= Fraction(max(measured))


LEVELS = (DegradationLevel(0, "exact", 100.0, 0.0), DegradationLevel(1, "fine", 50.0, 0.01),
          DegradationLevel(2, "mid", 20.0, 0.02), DegradationLevel(3, "coarse", 5.0, 0.05))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_policy_steps_down_only_to_levels_whose_measured_error_fits() -> None:
    clock = Clock()
    policy = LinkPolicy(LEVELS, window_s=1.0, slo=js.SLO(max_error=0.05), clock=clock,
                        min_interval_s=0.0)
    # Measured: 'mid' loses more than its nominal error, past max_error; 'coarse' less.
    policy.learn([(10_000.0, 0.0), (4_000.0, 0.03), (1_500.0, 0.2), (600.0, 0.04)])
    assert policy.measured(2) == (1_500.0, 0.2)
    # A link of 2,000 bytes/s: exact and 'fine' are too slow, 'mid' would fit but loses too
    # much: the policy goes to 'coarse', by the measured bytes.
    for _ in range(3):
        clock.now += 1.0
        policy.observe(10_000, 5.0, 0, level=0)  # exact windows, sent before the change
    assert policy.level.name == "coarse", policy.history
    assert policy.send_time_s(3) == 600.0 / 2_000
    # 'coarse' turns out to lose too much as well: the link goes to the nearest finer level
    # whose error fits, even though it is slow.
    clock.now += 1.0
    assert policy.learn([(10_000.0, 0.0), (4_000.0, 0.03), (1_500.0, 0.2),
                         (600.0, 0.3)]).name == "fine"
    assert policy.history[-1].reason.startswith("profile: 'coarse' would have had error 0.3")


def test_without_max_error_the_profile_only_sharpens_the_bytes() -> None:
    clock = Clock()
    policy = LinkPolicy(LEVELS, window_s=1.0, clock=clock, min_interval_s=0.0)
    policy.learn([(10_000.0, 0.0), (4_000.0, 0.5), (1_500.0, 0.9), None])
    clock.now += 1.0
    policy.observe(10_000, 5.0, 0)
    assert policy.level.name == "mid"  # the most accurate that fits: 1,500 B at 2,000 B/s
    # An unmeasured level is predicted from its guess, scaled to bytes by the measured ones.
    assert policy.send_time_s(3) == pytest.approx(5 * 15_500 / 170 / 2_000)
    # What crosses the link is learnt against the measured bytes: a key dictionary that
    # halves a window brings every level's predicted time down, smoothly.
    assert policy.send_time_s(1) == pytest.approx(2.0)
    clock.now += 1.0
    policy.observe(750, 0.375, 0)  # a 'mid' window: 750 B at 2,000 B/s
    clock.now += 1.0
    policy.observe(750, 0.375, 0)
    assert policy.send_time_s(1) == pytest.approx(2.0 * (0.7 * 0.7 + (1 - 0.7 * 0.7) / 2))
