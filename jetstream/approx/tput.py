"""Exact distributed top-k in three rounds: TPUT (Cao & Wang, PODC 2004), as pure functions.

Each of ``n`` sites holds a map key -> non-negative score; a key's total is the sum over the
sites (absent counts as 0). The site side and the coordinator side of every round are plain
functions over maps, so a transport can carry the rounds; :func:`tput_top_k` runs them all in
one process. Keys are ranked by total descending, then by key ascending, so ties are broken
the same way everywhere. Totals are exact: floats are added as the rationals they stand for,
and a total is reported as an ``int`` when all its non-zero scores are integers, otherwise as
the float nearest to the exact sum. (Zeros do not decide the type because TPUT need not ship
them: a score known to be ``<= 0`` is never asked for.)

The rounds, with ``R(x)`` the sum of the scores the coordinator has received for key ``x``:

1. every site sends its local top-k; ``tau1`` = the k-th highest ``R``; ``T = tau1 / n``
   (rounded down to a float);
2. every site sends the rest of its pairs with score ``>= T``; ``tau2`` = the k-th highest
   ``R``; keys whose upper bound is below ``tau2`` are pruned;
3. the sites send their scores of the remaining candidates; the top-k of those is the answer.
"""

from __future__ import annotations

import heapq
import math
import numbers
import sys
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from jetstream.aggregates import check_positive
from jetstream.errors import DataError

__all__ = [
    "Round2Request",
    "Round3Request",
    "TputResult",
    "coordinate_round1",
    "coordinate_round2",
    "coordinate_round3",
    "site_round1",
    "site_round2",
    "site_round3",
    "tput_top_k",
]

Score = int | float
#: A score or a sum of scores as the coordinator keeps it: floats become Fractions, so no sum
#: is rounded and every comparison between bounds is exact.
ExactScore = int | Fraction


# --- the sites -------------------------------------------------------------------------------


def site_round1(scores: Mapping[str, Score], k: int) -> dict[str, Score]:
    """Round 1 at one site: its local top-k, by score descending, then key ascending.

    A key the site leaves out scores at most the lowest score it sends; when it sends fewer
    than ``k`` pairs it has sent all it holds, and every other key scores 0 here. The
    coordinator bounds the unsent scores with these facts.

    Parameters
    ----------
    scores
        The site's key -> score map; not mutated.
    k
        How many keys the query wants.

    Returns
    -------
    dict
        At most ``k`` (key, score) pairs.

    Raises
    ------
    PlanError
        If ``k`` is not a positive integer.
    DataError
        If a score is negative, not finite, or not a number.
    """
    _check_k(k)
    for key, score in scores.items():
        _check_score(key, score)
    return dict(heapq.nsmallest(k, scores.items(), key=_rank))


def site_round2(scores: Mapping[str, Score], threshold: float,
                already_sent: Container[str]) -> dict[str, Score]:
    """Round 2 at one site: every pair with score ``>= threshold`` that round 1 did not send.

    Afterwards the coordinator knows that any score this site has not sent is ``< threshold``
    (ties at the threshold are sent, so the bound is strict).

    Parameters
    ----------
    scores
        The site's key -> score map; not mutated.
    threshold
        ``T`` from :class:`Round2Request`.
    already_sent
        The keys the site sent in round 1.

    Returns
    -------
    dict
        The (key, score) pairs to send.
    """
    for key, score in scores.items():
        _check_score(key, score)
    return {key: score for key, score in scores.items()
            if score >= threshold and key not in already_sent}


def site_round3(scores: Mapping[str, Score], candidates: Iterable[str]) -> dict[str, Score]:
    """Round 3 at one site: its exact scores of the candidates it holds (absent ones are 0).

    Parameters
    ----------
    scores
        The site's key -> score map; not mutated.
    candidates
        The site's entry of :attr:`Round3Request.ask`.

    Returns
    -------
    dict
        The (key, score) pairs to send.
    """
    reply = {key: scores[key] for key in candidates if key in scores}
    for key, score in reply.items():
        _check_score(key, score)
    return reply


# --- the coordinator -------------------------------------------------------------------------


@dataclass(frozen=True)
class Round2Request:
    """What the coordinator knows after round 1, and the threshold it sends every site.

    Attributes
    ----------
    k
        How many keys the query wants.
    threshold
        ``T``: ``tau1 / n`` rounded down to a float (rounding down only makes sites send
        more, so a wire format may round it down further but never up).
    reported
        Per site, the pairs it has sent.
    round1_bounds
        Per site, a bound on every score it left out of round 1.
    pairs_shipped
        Pairs received per round so far.
    """

    k: int
    threshold: float
    reported: tuple[Mapping[str, Score], ...]
    round1_bounds: tuple[ExactScore, ...]
    pairs_shipped: tuple[int, ...]


@dataclass(frozen=True)
class Round3Request:
    """The candidates that survived round 2, and per site the ones to ask it about.

    Attributes
    ----------
    k
        How many keys the query wants.
    ask
        Per site, the candidates whose score there is still unknown and may be above 0.
    known
        Per candidate, the exact sum of the scores received so far.
    threshold
        The ``T`` of round 2, for reports.
    pairs_shipped
        Pairs received per round so far.
    """

    k: int
    ask: tuple[tuple[str, ...], ...]
    known: Mapping[str, ExactScore]
    threshold: float
    pairs_shipped: tuple[int, ...]


@dataclass(frozen=True)
class TputResult:
    """The exact top-k, and what it cost to find.

    Attributes
    ----------
    top
        At most ``k`` (key, total) pairs, by total descending, then key ascending.
    pairs_shipped
        (key, score) pairs sent up by the sites in rounds 1, 2 and 3.
    keys_requested
        Candidate keys the coordinator sent down in round 3, summed over the sites.
    candidates
        Keys that survived round 2.
    threshold
        The ``T`` of round 2.
    """

    top: tuple[tuple[str, Score], ...]
    pairs_shipped: tuple[int, int, int]
    keys_requested: int
    candidates: int
    threshold: float

    @property
    def pairs_total(self) -> int:
        """Pairs sent up over all three rounds; compare with every site sending all its pairs."""
        return sum(self.pairs_shipped)


def coordinate_round1(k: int, replies: Sequence[Mapping[str, Score]]) -> Round2Request:
    """Turn the sites' local top-k into the threshold of round 2.

    A partial sum of received scores is a lower bound of a key's total, so at least ``k`` keys
    have a total of at least ``tau1``, the k-th highest partial sum (0 when fewer than ``k``
    keys were received). A key whose score is below ``T = tau1 / n`` at every site totals less
    than ``tau1`` and cannot be in the top-k; so it is safe for round 2 to ship only scores
    ``>= T``. When ``tau1`` is 0, ``T`` is 0 and round 2 ships every pair.

    Parameters
    ----------
    k
        How many keys the query wants.
    replies
        One :func:`site_round1` reply per site, in a fixed site order used in every round.

    Returns
    -------
    Round2Request

    Raises
    ------
    PlanError
        If ``k`` is not a positive integer.
    DataError
        If a reply holds a negative, non-finite or non-numeric score.
    """
    _check_k(k)
    partial: dict[str, ExactScore] = {}
    for reply in replies:
        for key, score in reply.items():
            partial[key] = partial.get(key, 0) + _exact(key, score)
    tau1 = _kth_highest(partial.values(), k)
    threshold = _float_at_most(Fraction(tau1) / len(replies)) if replies else 0.0
    # A site that sent fewer than k pairs sent all it holds: its unsent keys score 0.
    round1_bounds = tuple(min(_exact(key, score) for key, score in reply.items())
                          if len(reply) >= k else 0 for reply in replies)
    return Round2Request(k, threshold, tuple(dict(reply) for reply in replies), round1_bounds,
                         (_pairs(replies),))


def coordinate_round2(request: Round2Request,
                      replies: Sequence[Mapping[str, Score]]) -> Round3Request:
    """Bound every received key's total and prune the keys that cannot reach the top-k.

    After round 2 a site's unsent score for a key is ``< T`` (round 2), ``<=`` the lowest score
    it sent in round 1 (round 1 sent its top-k), and 0 if it sent fewer than ``k`` pairs in
    round 1. So a key's total lies between ``lower`` (the sum of its received scores) and
    ``upper`` (``lower`` plus that bound for every site that has not sent it). At least ``k``
    keys total ``>= tau2``, the k-th highest ``lower``, so a key with ``upper < tau2`` has
    ``k`` keys strictly above it and is pruned. Ties are never pruned: a key with
    ``upper == tau2`` stays a candidate. A key no site has sent totals ``< n T <= tau1 <= tau2``
    (sums only grow from round 1 to round 2), so it cannot be in the top-k either; when ``T``
    is 0 no such key exists. Round 3 asks a site only for candidates it has not sent, and only
    if its bound is above 0.

    Parameters
    ----------
    request
        What :func:`coordinate_round1` returned; not mutated.
    replies
        One :func:`site_round2` reply per site, in the order of round 1.

    Returns
    -------
    Round3Request

    Raises
    ------
    DataError
        If the number of replies is not the number of sites of round 1, or a reply holds a
        negative, non-finite or non-numeric score.
    """
    _check_replies(len(request.reported), replies, 2)
    threshold = _normal(Fraction(request.threshold))
    bounds = [min(threshold, bound) for bound in request.round1_bounds]
    reported = [{**before, **reply}
                for before, reply in zip(request.reported, replies, strict=True)]
    lower: dict[str, ExactScore] = {}
    covered: dict[str, ExactScore] = {}  # per key, the bounds of the sites that sent it
    for scores, bound in zip(reported, bounds, strict=True):
        for key, score in scores.items():
            lower[key] = lower.get(key, 0) + _exact(key, score)
            covered[key] = covered.get(key, 0) + bound
    tau2 = _kth_highest(lower.values(), request.k)
    all_bounds = sum(bounds)
    candidates = sorted(key for key, low in lower.items()
                        if low + all_bounds - covered[key] >= tau2)
    ask = tuple(tuple(key for key in candidates if key not in scores) if bound > 0 else ()
                for scores, bound in zip(reported, bounds, strict=True))
    return Round3Request(request.k, ask, {key: lower[key] for key in candidates},
                         request.threshold, (*request.pairs_shipped, _pairs(replies)))


def coordinate_round3(request: Round3Request,
                      replies: Sequence[Mapping[str, Score]]) -> TputResult:
    """Add the sites' last scores to the candidates' sums: the exact totals, and the top-k.

    Every key of the true top-k is a candidate (:func:`coordinate_round2`), and every
    candidate's total is now exact, so the top-k of the candidates is the top-k of all keys.

    Parameters
    ----------
    request
        What :func:`coordinate_round2` returned; not mutated.
    replies
        One :func:`site_round3` reply per site, in the order of round 1.

    Returns
    -------
    TputResult

    Raises
    ------
    DataError
        If the number of replies is not the number of sites, or a reply holds a negative,
        non-finite or non-numeric score.
    """
    _check_replies(len(request.ask), replies, 3)
    totals = dict(request.known)
    for ask, reply in zip(request.ask, replies, strict=True):
        for key in ask:
            if key in reply:
                totals[key] += _exact(key, reply[key])
    top = heapq.nsmallest(request.k, totals.items(), key=_rank)
    pairs = (*request.pairs_shipped, _pairs(replies))
    return TputResult(
        top=tuple((key, float(total) if isinstance(total, Fraction) else total)
                  for key, total in top),
        pairs_shipped=(pairs[0], pairs[1], pairs[2]),
        keys_requested=sum(len(ask) for ask in request.ask),
        candidates=len(request.known),
        threshold=request.threshold,
    )


def tput_top_k(site_scores: Sequence[Mapping[str, Score]], k: int) -> TputResult:
    """The exact top-k keys by total over the sites, found by the three rounds of TPUT.

    Parameters
    ----------
    site_scores
        Per site, its key -> non-negative score map; not mutated.
    k
        How many keys to return; fewer come back when the sites hold fewer keys.

    Returns
    -------
    TputResult
        The top-k (by total descending, then key ascending) with exact totals, and the pairs
        shipped per round.

    Raises
    ------
    PlanError
        If ``k`` is not a positive integer.
    DataError
        If a score is negative, not finite, or not a number.
    """
    _check_k(k)
    round1 = [site_round1(scores, k) for scores in site_scores]
    request2 = coordinate_round1(k, round1)
    round2 = [site_round2(scores, request2.threshold, sent)
              for scores, sent in zip(site_scores, round1, strict=True)]
    request3 = coordinate_round2(request2, round2)
    round3 = [site_round3(scores, ask)
              for scores, ask in zip(site_scores, request3.ask, strict=True)]
    return coordinate_round3(request3, round3)


# --- helpers ---------------------------------------------------------------------------------


def _check_k(k: int) -> None:
    check_positive(k, "tput: k", "ask for at least one key")


def _check_score(key: str, score: Score) -> None:
    if isinstance(score, bool) or not isinstance(score, numbers.Real) or not 0 <= score < math.inf:
        msg = f"tput: the score of {key!r} is {score!r}; scores must be finite and non-negative"
        raise DataError(msg)


def _check_replies(sites: int, replies: Sequence[Mapping[str, Score]], round_: int) -> None:
    if len(replies) != sites:
        msg = (f"tput round {round_}: {len(replies)} site replies, expected {sites}, "
               "one per site of round 1 and in the same order")
        raise DataError(msg)


def _exact(key: str, score: Score) -> ExactScore:
    _check_score(key, score)
    return int(score) if isinstance(score, numbers.Integral) or score == 0 else Fraction(score)


def _normal(value: Fraction) -> ExactScore:
    # Integer arithmetic is much cheaper than Fraction arithmetic where it is enough.
    return value.numerator if value.denominator == 1 else value


def _rank(item: tuple[str, ExactScore | float]) -> tuple[ExactScore | float, str]:
    return -item[1], item[0]


def _kth_highest(values: Iterable[ExactScore], k: int) -> ExactScore:
    highest = heapq.nlargest(k, values)
    return highest[-1] if len(highest) == k else 0


def _float_at_most(value: Fraction) -> float:
    """The largest float ``<= value`` (``value >= 0``)."""
    try:
        rounded = float(value)
    except OverflowError:
        return sys.float_info.max
    return rounded if rounded <= value else math.nextafter(rounded, -math.inf)


def _pairs(replies: Sequence[Mapping[str, Score]]) -> int:
    return sum(len(reply) for reply in replies)
