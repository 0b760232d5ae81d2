"""Final or provisional: the one place that says whether a window's result may still change.

A result is **final** when every input it needs has been read and handed on as final: then,
if it is also exact (no approximation contributed, see :class:`~jetstream.results.WindowResult`),
it equals the reference executor's and no later revision changes it. Anything else is
**provisional**, and says why, with one or more of the reasons below; a later revision makes
it final when it can. The reference executor's results are final.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["APPROXIMATE", "DEADLINE", "EARLY", "INCOMPLETE_INPUT", "MISSING_SITE", "REASONS",
           "UNSETTLED", "provisional"]

#: Some input's batch was sent early, before that input's watermark closed the window.
EARLY = "early"
#: It went out at its deadline without the inputs it waits for (``missing_sites``).
DEADLINE = "deadline"
#: An input's own batch of it was provisional (a merge below went out at its deadline).
INCOMPLETE_INPUT = "incomplete input"
#: TPUT's rounds had not settled the exact top-k (or could not: a negative ranking value).
UNSETTLED = "unsettled rounds"
#: A site's records are missing: it did not answer (a re-plan took it for dead; a history
#: query's cubes), or its local stage failed.
MISSING_SITE = "missing site"
#: A degraded level (a summary, a truncation, keys rolled up) contributed: not exact.
APPROXIMATE = "approximate"
#: Every reason, in the order a result lists them.
REASONS = (DEADLINE, MISSING_SITE, EARLY, INCOMPLETE_INPUT, UNSETTLED, APPROXIMATE)


def provisional(reasons: Iterable[str]) -> list[str]:
    """The reasons a result is provisional, each once and in :data:`REASONS`' order (empty:
    it is final)."""
    given = set(reasons)
    unknown = given - set(REASONS)
    if unknown:
        msg = f"unknown reasons a result is provisional: {sorted(unknown)}"
        raise ValueError(msg)
    return [r for r in REASONS if r in given]
