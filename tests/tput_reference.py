"""TPUT as the paper states it (Cao & Wang, PODC 2004): the oracle of the rounds the data
plane runs (:mod:`jetstream.approx.rounds`), as ``js.run_local`` is the oracle of the data
plane. Small on purpose: sites are maps key -> non-negative score, sums are exact
(``Fraction``), nothing is checked or carried.

1. every site sends its top ``k``; ``tau1`` is the ``k``-th highest partial sum, ``T = tau1 /
   m`` for ``m`` sites;
2. every site sends its other pairs scoring at least ``T``; ``tau2`` is the ``k``-th highest
   partial sum; a key whose partial sum plus ``T`` for each site that has not sent it is
   below ``tau2`` cannot be in the top ``k``;
3. the sites that have not sent a remaining candidate are asked for it; the candidates' exact
   totals give the top ``k`` (ties broken by key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

Scores = Mapping[str, int | float]


@dataclass(frozen=True)
class Tput:
    top: tuple[tuple[str, Fraction], ...]  # the top k: key, exact total
    shipped: tuple[int, int, int]  # (site, key) pairs sent up in each round
    asked: int  # (site, key) pairs asked for in round 3


def tput(sites: Sequence[Scores], k: int) -> Tput:
    m = len(sites)
    exact = [{key: Fraction(score) for key, score in s.items()} for s in sites]

    def best(scores: Mapping[str, Fraction], n: int) -> list[tuple[str, Fraction]]:
        return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:n]

    def kth(sent: list[dict[str, Fraction]]) -> Fraction:
        sums = _sums(sent)
        return best(sums, k)[-1][1] if len(sums) >= k else Fraction(0)

    sent = [dict(best(s, k)) for s in exact]
    shipped = [sum(len(s) for s in sent)]
    t = kth(sent) / m if m else Fraction(0)
    for s, got in zip(exact, sent, strict=True):
        more = {key: v for key, v in s.items() if key not in got and v >= t}
        got.update(more)
    shipped.append(sum(len(s) for s in sent) - shipped[0])
    tau2, sums = kth(sent), _sums(sent)
    candidates = [key for key, total in sums.items()
                  if total + t * sum(key not in got for got in sent) >= tau2]
    asked = third = 0
    for s, got in zip(exact, sent, strict=True):
        for key in candidates:
            if key not in got:
                asked += 1
                if key in s:
                    got[key] = s[key]
                    third += 1
    totals = _sums(sent)
    return Tput(tuple(best({key: totals[key] for key in candidates}, k)),
                (shipped[0], shipped[1], third), asked)


def _sums(sent: list[dict[str, Fraction]]) -> dict[str, Fraction]:
    sums: dict[str, Fraction] = {}
    for got in sent:
        for key, v in got.items():
            sums[key] = sums.get(key, Fraction(0)) + v
    return sums
