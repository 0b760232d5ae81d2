"""The per-link degradation policy, driven by a simulated link and a fake clock."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.approx.levels import DegradationLevel, degradation_ladder
from jetstream.approx.policy import LevelChange, LinkPolicy, LinkSLO

WINDOW_S = 1.0
MIN_INTERVAL_S = 5.0
LATENCY_S = 0.05

#: Bytes per window at each level: exact top-k, then sketches of shrinking size.
LADDER = degradation_ladder([
    ("exact", 1_000_000, 0.0),
    ("kll-200", 400_000, 0.01),
    ("kll-64", 150_000, 0.02),
    ("kll-16", 60_000, 0.05),
    ("sample-1%", 20_000, 0.1),
])
#: The same levels, as fractions of the exact level's bytes.
RELATIVE = tuple(DegradationLevel(lv.index, lv.name, lv.bytes_per_window / 1e6, lv.error_bound)
                 for lv in LADDER)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Sent:
    produced: float
    level: DegradationLevel
    size: float
    started: float
    acked: float


@dataclass
class Ack:
    time: float
    level: DegradationLevel
    backlog: int


def simulate(policy: LinkPolicy, clock: FakeClock, bandwidth: Callable[[float], float],
             until_s: float, *, bytes_per_unit: float = 1.0,
             latency_s: float = LATENCY_S) -> list[Ack]:
    """A FIFO link: a window is made every WINDOW_S at the policy's level, sent when the link
    is free at the bandwidth of that moment (bytes/s), acked ``latency_s`` after its last byte;
    the backlog is the windows already made and not acked behind it."""
    queue: deque[Sent] = deque()
    link_free, next_window, acks = 0.0, 0.0, []
    while next_window < until_s or queue:
        if queue and (queue[0].acked <= next_window or next_window >= until_s):
            window = queue.popleft()
            clock.now = window.acked
            acks.append(Ack(clock.now, window.level, len(queue)))
            policy.observe(window.size, window.acked - window.started, len(queue),
                           level=window.level)
            continue
        clock.now = next_window
        level = policy.level
        size = level.bytes_per_window * bytes_per_unit
        start = max(next_window, link_free)
        link_free = start + size / bandwidth(start)
        queue.append(Sent(next_window, level, size, start, link_free + latency_s))
        next_window += WINDOW_S
    return acks


def steps(*segments: tuple[float, float]) -> Callable[[float], float]:
    """A bandwidth trace: ``(from_s, bytes_per_s)`` pairs, sorted by time."""
    def bandwidth(t: float) -> float:
        return [bps for start, bps in segments if start <= t][-1]
    return bandwidth


def fits(level: DegradationLevel, bps: float) -> bool:
    return level.bytes_per_window / bps + LATENCY_S <= WINDOW_S


def interval_rule_broken(history: Sequence[LevelChange], min_interval_s: float) -> list[str]:
    broken = []
    for before, after in itertools.pairwise(history):
        urgent = (after.to_level.index > after.from_level.index
                  and after.reason.startswith("backlog grew"))
        if after.time - before.time < min_interval_s and not urgent:
            broken.append(f"{before} then {after}")
    return broken


def make_policy(levels: Sequence[DegradationLevel] = LADDER, **kwargs: object
                ) -> tuple[LinkPolicy, FakeClock]:
    clock = FakeClock()
    options = {"window_s": WINDOW_S, "min_interval_s": MIN_INTERVAL_S, "clock": clock} | kwargs
    return LinkPolicy(levels, **options), clock  # type: ignore[arg-type]


# --- a bandwidth drop and its return -----------------------------------------------------


@pytest.mark.parametrize(("levels", "bytes_per_unit"), [(LADDER, 1.0), (RELATIVE, 1e6)],
                         ids=["absolute", "relative"])
def test_a_10x_drop_steps_down_within_two_windows_to_a_level_that_fits(
        levels: Sequence[DegradationLevel], bytes_per_unit: float) -> None:
    policy, clock = make_policy(levels)
    acks = simulate(policy, clock, steps((0, 4e6), (30, 4e5)), 60, bytes_per_unit=bytes_per_unit)

    assert policy.history[0].time > 30, "exact fits 4 MB/s: no change before the drop"
    first = policy.history[0]
    after_drop = [a for a in acks if a.time > 30]
    assert after_drop.index(next(a for a in after_drop if a.time >= first.time)) <= 1
    assert first.reason.startswith("backlog grew")
    assert first.to_level.index == 2, "jumps straight to the most accurate level that fits"
    assert fits(LADDER[2], 4e5) and not fits(LADDER[1], 4e5)
    assert len(policy.history) == 1, f"no overshoot: {policy.history}"
    assert policy.violation is None


def test_when_bandwidth_returns_the_level_climbs_one_step_per_interval_back_to_exact() -> None:
    policy, clock = make_policy()
    simulate(policy, clock, steps((0, 4e6), (30, 4e5), (60, 4e6)), 120)

    down, *ups = policy.history
    assert down.to_level.index == 2
    assert [(c.from_level.index, c.to_level.index) for c in ups] == [(2, 1), (1, 0)]
    assert all(c.reason.startswith("probe") for c in ups)
    assert ups[0].time < 60 + MIN_INTERVAL_S, "the first probe comes soon after the return"
    assert ups[1].time - ups[0].time >= MIN_INTERVAL_S
    assert policy.level.index == 0
    assert interval_rule_broken(policy.history, MIN_INTERVAL_S) == []


def test_a_link_the_plan_found_thin_starts_degraded_and_climbs_when_it_is_not() -> None:
    policy, clock = make_policy(start=3)
    assert policy.level.index == 3 and not policy.pinned
    simulate(policy, clock, steps((0, 4e6)), 60)  # the link is faster than planned
    assert policy.level.index == 0
    assert [(c.from_level.index, c.to_level.index) for c in policy.history] == [
        (3, 2), (2, 1), (1, 0)]
    # Never below what the SLO's max_error allows.
    assert make_policy(start=4, slo=LinkSLO(max_error=0.02))[0].level.index == 2


def test_a_deep_drop_jumps_several_levels_at_once() -> None:
    policy, clock = make_policy()
    simulate(policy, clock, steps((0, 4e6), (10, 4e4)), 40)
    first = policy.history[0]
    assert (first.from_level.index, first.to_level.index) == (0, 4)


def test_a_probe_the_link_cannot_carry_is_undone_when_the_backlog_grows() -> None:
    recovery = steps((0, 4e6), (30, 4e5), (60, 4e6))
    policy, clock = make_policy()
    simulate(policy, clock, recovery, 120)
    probe = policy.history[-1]
    assert (probe.from_level.index, probe.to_level.index) == (1, 0)

    # The same run, but the link falls to 300 kB/s as the probe to exact starts.
    policy, clock = make_policy()
    simulate(policy, clock, steps((0, 4e6), (30, 4e5), (60, 4e6), (probe.time, 3e5)), 120)
    assert policy.history[-2] == probe
    undo = policy.history[-1]
    assert undo.from_level.index == 0 and fits(undo.to_level, 3e5)
    assert undo.reason.startswith("backlog grew")
    assert undo.time - probe.time < MIN_INTERVAL_S, "undone before the interval is up"
    assert interval_rule_broken(policy.history, MIN_INTERVAL_S) == []


# --- estimates ---------------------------------------------------------------------------


def feed(policy: LinkPolicy, clock: FakeClock, size: float, send_s: float, backlog: int = 0,
         times: int = 1) -> None:
    for _ in range(times):
        clock.now += WINDOW_S
        policy.observe(size, send_s, backlog)


def test_one_outlier_moves_neither_the_estimate_nor_the_level() -> None:
    policy, clock = make_policy()
    feed(policy, clock, 1e6, 0.25, times=10)
    assert policy.throughput == pytest.approx(4e6)
    feed(policy, clock, 1e6, 2.5)  # one slow window, no backlog behind it
    assert policy.throughput == pytest.approx(4e6)
    feed(policy, clock, 1e6, 0.25, times=3)
    assert policy.throughput == pytest.approx(4e6)
    assert policy.history == [] and policy.level.index == 0


def test_a_window_the_link_has_been_on_too_long_steps_down_before_its_ack() -> None:
    policy, clock = make_policy()
    feed(policy, clock, 1e6, 0.25, times=10)  # 4 MB/s: exact fits
    # The link dropped: the window sent last has been on it 0.5 s, under the 0.8 s at which
    # a window is too slow: that says nothing yet.
    assert policy.observe_unacked(1e6, 0.5, 0).index == 0
    assert policy.throughput == pytest.approx(4e6)
    # At 5 s, the link has carried at most 200 kB/s: the policy steps down to what fits
    # that, while the window is still on its way.
    clock.now += WINDOW_S
    level = policy.observe_unacked(1e6, 5.0, 2)
    assert policy.throughput == pytest.approx(2e5)
    assert level.name == "kll-64" and fits(level, 2e5) and not fits(LADDER[1], 2e5)
    assert policy.history[-1].reason.startswith("backlog") or \
        policy.history[-1].reason.startswith("too slow"), policy.history
    # Its ack, later still, teaches the rest as any ack does.
    clock.now += WINDOW_S
    policy.observe(1e6, 8.0, 3, level=0)
    assert policy.throughput is not None and policy.throughput <= 2e5
    with pytest.raises(js.DataError, match="unacked window"):
        policy.observe_unacked(-1, 1.0, 0)


def test_a_throughput_no_ack_confirms_for_three_windows_is_not_recent() -> None:
    policy, clock = make_policy()
    assert policy.recent_throughput is None  # nothing acknowledged yet
    feed(policy, clock, 1e6, 0.25, times=3)
    clock.now += 3 * WINDOW_S
    assert policy.recent_throughput == policy.throughput == pytest.approx(4e6)
    feed(policy, clock, 0, 0.25)  # an empty window says nothing of the link's speed
    assert policy.recent_throughput is None  # the link stalled: its old speed is not news
    assert policy.throughput == pytest.approx(4e6)
    feed(policy, clock, 1e6, 0.5)
    assert policy.recent_throughput == policy.throughput


def test_two_slow_windows_are_a_shift_not_an_outlier() -> None:
    policy, clock = make_policy()
    feed(policy, clock, 1e6, 0.25, times=10)
    feed(policy, clock, 1e6, 2.5, times=2)
    assert policy.throughput == pytest.approx(4e5)
    assert policy.level.index == 2
    assert policy.history[0].reason.startswith("too slow")


def test_a_backlog_that_does_not_drain_while_the_link_is_slow_steps_down_one_level() -> None:
    policy, clock = make_policy()
    feed(policy, clock, 1e6, 0.25, backlog=3, times=5)
    assert policy.history == [], "stuck for 4 s only"
    # One slow window: the smoothed estimate ignores it, but it says the link is too slow for
    # the level now, so the backlog is the link's.
    feed(policy, clock, 1e6, 0.9, backlog=3)
    (change,) = policy.history
    assert change.reason == "backlog stuck at 3 windows for 5s"
    assert (change.from_level.index, change.to_level.index) == (0, 1)


def test_a_backlog_the_link_does_not_explain_moves_nothing() -> None:
    # Each window takes the link a quarter of a window, so it would drain any backlog: one
    # that stays or grows waits on something else (a slow receiver, a burst from the stage),
    # and fewer bytes would not shorten it. (The policy stepped down here before.)
    policy, clock = make_policy()
    for backlog in (3, 3, 3, 3, 3, 3, 3, 4, 5, 6, 0, 5, 4, 3, 2, 1, 0):
        feed(policy, clock, 1e6, 0.25, backlog=backlog)
    assert policy.history == [] and policy.level.index == 0


def test_a_draining_backlog_is_left_to_drain() -> None:
    policy, clock = make_policy()
    for backlog in (4, 4, 3, 3, 3, 2, 2, 2, 1, 0):
        feed(policy, clock, 1e6, 0.25, backlog=backlog)
    assert policy.history == []


def delayed(policy: LinkPolicy, clock: FakeClock, delay_s: float, bps: float, windows: int,
            backlogs: Sequence[int] = (0,)) -> None:
    """Each window, a near-empty message takes ``delay_s`` to be acked, and the window at the
    policy's level ``delay_s`` plus its bytes at ``bps`` bytes/s; the backlog behind the
    windows cycles through ``backlogs``."""
    for _, backlog in zip(range(windows), itertools.cycle(backlogs), strict=False):
        clock.now += WINDOW_S
        policy.observe_round_trip(delay_s)
        size = policy.level.bytes_per_window
        policy.observe(size, delay_s + size / bps, backlog)


@pytest.mark.parametrize("delay_s", [0.5, 2.0, 7.0])
def test_acks_late_by_the_same_delay_whatever_their_size_leave_a_fast_link_exact(
        delay_s: float) -> None:
    # A loaded machine: the receiver (or the sender) gets to every message delay_s late, and
    # the stage makes windows in bursts. The link carries an exact window in 25 ms.
    policy, clock = make_policy()
    delayed(policy, clock, delay_s, 4e7, 40, backlogs=(0, 3, 2, 1))
    assert policy.history == [] and policy.level.index == 0
    assert policy.violation is None
    assert policy.base_s == pytest.approx(delay_s)
    assert policy.send_time_s(0) == pytest.approx(0.025, rel=0.01)


@pytest.mark.parametrize("delay_s", [0.0, 0.5, 2.0])
def test_acks_late_by_a_delay_that_grows_with_bytes_step_down_to_what_fits(
        delay_s: float) -> None:
    # The same delays and bursts on a thin link: an exact window takes the link 2.5 s.
    policy, clock = make_policy()
    delayed(policy, clock, delay_s, 4e5, 40, backlogs=(0, 3, 2, 1))
    assert [c.to_level.index for c in policy.history] == [2]
    assert fits(LADDER[2], 4e5) and not fits(LADDER[1], 4e5)
    assert policy.throughput == pytest.approx(4e5, rel=0.01)  # the link's, not the delay's


def test_the_baseline_is_the_median_of_recent_round_trips() -> None:
    policy, _ = make_policy()
    assert policy.base_s == 0.0
    for seconds in (0.1, 5.0, 0.2, 0.3):  # one stall does not move it far
        policy.observe_round_trip(seconds)
    assert policy.base_s == pytest.approx(0.25)
    for _ in range(8):
        policy.observe_round_trip(1.0)
    assert policy.base_s == 1.0, "only the recent ones count"
    with pytest.raises(js.DataError, match="round trip"):
        policy.observe_round_trip(-0.1)


def test_send_time_scales_relative_levels_by_the_bytes_seen() -> None:
    policy, clock = make_policy(RELATIVE)
    assert policy.send_time_s(0) is None
    feed(policy, clock, 2e6, 0.5)  # the exact level weighs 2 MB here, sent at 4 MB/s
    assert policy.send_time_s(RELATIVE[1]) == pytest.approx(0.2)


# --- the SLO -------------------------------------------------------------------------------


def test_max_error_caps_the_level_and_a_thin_link_reports_the_latency_it_misses() -> None:
    policy, clock = make_policy(slo=LinkSLO(max_latency_s=0.5, max_error=0.02))
    assert policy.coarsest_allowed.index == 2
    # Back at 20 MB/s, exact fits the 0.5 s latency bound with headroom (0.1 s a window).
    acks = simulate(policy, clock, steps((0, 4e6), (20, 1e5), (60, 2e7)), 120)

    assert max(a.level.index for a in acks) == 2
    assert max(c.to_level.index for c in policy.history) == 2
    thin = [c for c in policy.history if 20 < c.time < 60]
    assert thin and thin[-1].to_level.index == 2
    assert policy.level.index == 0 and policy.violation is None, "recovers once the link does"

    policy, clock = make_policy(slo=LinkSLO(max_latency_s=0.5, max_error=0.02))
    simulate(policy, clock, steps((0, 4e6), (20, 1e5)), 60)
    assert policy.level.index == 2
    assert policy.violation is not None
    assert policy.violation.startswith("slo max_latency=0.5s cannot be met")
    assert "'kll-64'" in policy.violation and "max_error=0.02" in policy.violation
    assert "over the 0.5s budget" in policy.violation


def test_an_operator_pins_a_level_and_unpinning_hands_it_back_to_the_policy() -> None:
    policy, clock = make_policy(slo=LinkSLO(max_error=0.02))
    assert policy.pin(2).name == "kll-64" and policy.pinned
    # A fast link would have the policy probe back up; pinned, it stays put.
    simulate(policy, clock, steps((0, 4e7),), 30)
    assert policy.level.index == 2
    assert [c.reason for c in policy.history] == ["pinned by an operator"]
    with pytest.raises(js.DataError, match=r"'kll-16' is past the SLO's max_error \(its "
                                           r"error 0.05\); the coarsest it allows is "
                                           "'kll-64'"):
        policy.pin(3)
    clock.now = 0.0  # the next simulation starts its clock at 0 again
    policy.pin(None)
    assert not policy.pinned
    simulate(policy, clock, steps((0, 4e7),), 30)
    assert policy.level.index == 0  # probed back up, one level per interval
    assert policy.history[1].time - policy.history[0].time >= MIN_INTERVAL_S


@pytest.mark.parametrize("held", ["one level", "max_error=0", "pinned"])
def test_a_stream_that_cannot_step_down_says_when_the_link_sets_its_pace(held: str) -> None:
    """What crosses a link measures it only when the link is what limits it: a stream whose
    policy cannot step down (a query with one level, an SLO that allows exact only, a level
    an operator holds) says so from its windows' times, as one that stepped down does."""
    def policy_on(bandwidth: float) -> LinkPolicy:
        policy, clock = make_policy(LADDER[:1] if held == "one level" else LADDER,
                                    slo=LinkSLO(max_error=0.0) if held == "max_error=0" else None)
        if held == "pinned":
            policy.pin(0)
        simulate(policy, clock, steps((0, bandwidth)), 20)
        assert policy.level.index == 0
        return policy

    assert not policy_on(4e6).link_bound  # a window takes a quarter of a second: room left
    thin = policy_on(4e5)  # 2.5 s a window, and nowhere to go
    assert thin.link_bound
    assert thin.recent_throughput == pytest.approx(4e5, rel=0.1)


def test_a_policy_that_stepped_down_on_its_own_is_link_bound_and_a_pinned_one_is_not() -> None:
    policy, clock = make_policy()
    assert not policy.link_bound  # nothing acknowledged yet
    simulate(policy, clock, steps((0, 4e5)), 30)
    assert policy.level.index == 2 and policy.link_bound  # fits now, but the link decided
    policy, clock = make_policy()
    policy.pin(2)
    simulate(policy, clock, steps((0, 4e6)), 30)
    assert not policy.link_bound  # held coarse by an operator on a fast link


def test_without_an_slo_the_window_length_is_the_bound() -> None:
    policy, clock = make_policy()
    simulate(policy, clock, steps((0, 1e4)), 40)
    assert policy.level.index == 4
    assert policy.violation is not None
    assert policy.violation.startswith("the window length 1s cannot be met")


def test_max_wan_bps_caps_the_rate_like_a_slower_link() -> None:
    policy, clock = make_policy(slo=LinkSLO(max_wan_bps=8 * 4e5))
    simulate(policy, clock, steps((0, 4e6)), 30)
    assert policy.level.index == 2
    assert [c.to_level.index for c in policy.history] == [2]


def test_the_dsl_slo_converts_to_link_units() -> None:
    slo = js.SLO(max_latency="3s", max_error=0.01, max_wan_kbps=800)
    assert LinkSLO.from_slo(slo) == LinkSLO(max_latency_s=3.0, max_error=0.01,
                                            max_wan_bps=800_000)
    policy, _ = make_policy(slo=slo)
    assert policy.coarsest_allowed.index == 1
    assert policy.budget_s == WINDOW_S


def test_a_window_sent_early_has_its_lead_on_top_of_max_latency() -> None:
    """Windows set out ``lead_s`` before they close: they may take that much more than
    max_latency to cross, never more than the window."""
    policy = LinkPolicy(LADDER, window_s=10, slo=LinkSLO(max_latency_s=3.0), lead_s=2.5)
    assert policy.budget_s == 5.5
    assert LinkPolicy(LADDER, window_s=10, slo=LinkSLO(max_latency_s=9.0),
                      lead_s=2.5).budget_s == 10
    assert LinkPolicy(LADDER, window_s=10, lead_s=2.5).budget_s == 10


# --- misuse --------------------------------------------------------------------------------


@pytest.mark.parametrize(("levels", "kwargs", "message"), [
    ((), {}, "at least one level"),
    ((DegradationLevel(1, "a", 1, 0),), {}, "index 1 but is at position 0"),
    (degradation_ladder([("a", 1, 0), ("b", 2, 0.1)]), {}, "weighs more"),
    (degradation_ladder([("a", 1, 0.1), ("b", 0.5, 0)]), {}, "smaller error_bound"),
    (degradation_ladder([("a", 0, 0)]), {}, "positive bytes_per_window"),
    (degradation_ladder([("a", 1, 0.1)]), {"slo": LinkSLO(max_error=0.01)}, "allows no level"),
    (LADDER, {"up_fraction": 0.8}, "up_fraction < down_fraction"),
    (LADDER, {"min_interval_s": -1}, "min_interval_s"),
], ids=["empty", "index", "bytes", "error", "zero-bytes", "max-error", "fractions", "interval"])
def test_misuse_is_refused_when_the_policy_is_built(
        levels: Sequence[DegradationLevel], kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(js.PlanError, match=message):
        make_policy(levels, **kwargs)


def test_bad_observations_are_data_errors() -> None:
    policy, _ = make_policy()
    for args in ((-1, 1.0, 0), (1, 0.0, 0), (1, float("nan"), 0), (1, 1.0, -1)):
        with pytest.raises(js.DataError):
            policy.observe(*args)
    with pytest.raises(js.DataError, match="no level 7"):
        policy.observe(1, 1.0, 0, level=7)


# --- properties ----------------------------------------------------------------------------

traces = st.lists(st.tuples(st.floats(1, 30), st.floats(1e3, 1e7)), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(trace=traces, max_error=st.sampled_from([None, 0.0, 0.01, 0.02, 0.05]),
       latency_s=st.floats(0.0, 0.5), max_latency_s=st.sampled_from([None, 0.3, 2.0]))
def test_random_traces_respect_the_interval_rule_and_max_error(
        trace: list[tuple[float, float]], max_error: float | None, latency_s: float,
        max_latency_s: float | None) -> None:
    segments, start = [], 0.0
    for duration, bps in trace:
        segments.append((start, bps))
        start += duration
    policy, clock = make_policy(slo=LinkSLO(max_latency_s=max_latency_s, max_error=max_error))
    acks = simulate(policy, clock, steps(*segments), start, latency_s=latency_s)

    history = policy.history
    assert interval_rule_broken(history, MIN_INTERVAL_S) == []
    allowed = max_error if max_error is not None else 1.0
    assert all(a.level.error_bound <= allowed for a in acks)
    assert all(c.to_level.error_bound <= allowed for c in history)
    for before, after in itertools.pairwise(history):
        assert after.from_level == before.to_level and after.time >= before.time
    for change in history:
        if change.to_level.index < change.from_level.index:
            assert change.from_level.index - change.to_level.index == 1, "probes are one step"
    if policy.violation is not None:
        assert policy.level == policy.coarsest_allowed
