"""The tests' TPUT (``tests/tput_reference.py``, the paper's three rounds) gives the exact
top-k of the summed scores: it is the oracle of the rounds the data plane runs
(``tests/test_rounds.py`` checks them against it)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tput_reference import tput

Scores = Mapping[str, int | float]


def exact_top_k(sites: Sequence[Scores], k: int) -> tuple[tuple[str, Fraction], ...]:
    """Every site's every score added exactly, sorted, cut."""
    totals: dict[str, Fraction] = {}
    for scores in sites:
        for key, score in scores.items():
            totals[key] = totals.get(key, Fraction(0)) + Fraction(score)
    return tuple(sorted(totals.items(), key=lambda item: (-item[1], item[0]))[:k])


KEYS = st.sampled_from([f"k{i:02d}" for i in range(24)])
SCORE = st.one_of(
    st.integers(0, 3),  # many ties, and zeros
    st.integers(0, 10**6),
    st.sampled_from([0.5, 1.5, 2.0, 0.1, 0.2, 0.3]),  # 0.1 + 0.2 != 0.3 in floats
    st.floats(0, 1e300, allow_nan=False, allow_infinity=False),
)


@st.composite
def zipf_sites(draw: st.DrawFn) -> list[dict[str, int | float]]:
    """Sites that agree on a skewed popularity, each with its own noise and its own gaps."""
    n_keys = draw(st.integers(1, 40))
    exponent = draw(st.sampled_from([0.8, 1.1, 2.0]))
    seed = draw(st.integers(0, 2**32))
    rng = random.Random(seed)
    sites = []
    for _ in range(draw(st.integers(1, 8))):
        site: dict[str, int | float] = {}
        for rank in range(1, n_keys + 1):
            if rng.random() < 0.7:
                site[f"d{rank:02d}"] = int(1000 / rank**exponent * rng.uniform(0.5, 1.5))
        sites.append(site)
    return sites


# With n sites and every score a multiple of n, T = tau1 / n is an integer that scores can
# equal: ties at the threshold.
THRESHOLD_TIES = st.integers(1, 4).flatmap(lambda n: st.lists(
    st.dictionaries(KEYS, st.integers(0, 3).map(lambda v: v * n), max_size=12),
    min_size=n, max_size=n))

SITES = st.one_of(
    st.lists(st.dictionaries(KEYS, SCORE, max_size=12), max_size=8),
    st.lists(st.dictionaries(KEYS, st.integers(0, 2), max_size=24), max_size=8),
    THRESHOLD_TIES,
    zipf_sites(),
)


@settings(max_examples=300, deadline=None)
@given(SITES, st.one_of(st.integers(1, 3), st.integers(1, 30)))
def test_the_reference_is_the_exact_top_k(sites: list[dict[str, int | float]], k: int) -> None:
    result = tput(sites, k)
    assert result.top == exact_top_k(sites, k)
    # Every (site, key) pair goes up at most once, over all three rounds.
    assert sum(result.shipped) <= sum(len(scores) for scores in sites)


def test_the_rounds_step_by_step() -> None:
    sites = [{"a": 10, "b": 6, "c": 1}, {"b": 8, "d": 7, "c": 4}, {"a": 3, "c": 9, "e": 2}]
    # Round 1 (k = 1): a 10, b 8, c 9, so tau1 = 10 and T = 10/3. Round 2: b 6, then d 7 and
    # c 4; nothing from the third site (e 2 and a 3 are below T). The sums are a 10, b 14,
    # c 13, d 7, so tau2 = 14: a may reach 10 + 2T, c 13 + T, both >= 14; d at most 7 + 2T is
    # pruned. Round 3 asks for c at the first site, a at the second and third, b at the third:
    # c 1 and a 3 come back.
    result = tput(sites, 1)
    assert result.shipped == (3, 3, 2)
    assert result.asked == 4
    assert result.top == (("b", 14),)  # c also totals 14; b wins the tie by its key


def test_fewer_keys_than_k_and_no_sites() -> None:
    assert tput([{"a": 1, "b": 2}, {"b": 3}, {}], 5).top == (("b", 5), ("a", 1))
    assert tput([], 3).top == ()
    assert tput([{}, {"a": 2}, {}], 1).top == (("a", 2),)
    assert tput([{"a": 0, "b": 0}, {"c": 4, "a": 0}], 3).top == (("c", 4), ("a", 0), ("b", 0))
