"""Summaries with error bounds, and TPUT's rounds.

The approximate aggregates (DataSketches' HLL, KLL and frequent items) are in
:mod:`jetstream.approx.sketches`; what a link sends below exact partials in
:mod:`~jetstream.approx.truncate`, :mod:`~jetstream.approx.items` and
:mod:`~jetstream.approx.holistic` (and a declared roll-up's coarser keys in
:mod:`~jetstream.approx.rollup`), the ladder of those levels in :mod:`~jetstream.approx.levels`,
the feedback policy that picks a link's level in :mod:`~jetstream.approx.policy`, and TPUT's
exact top-k rounds in :mod:`~jetstream.approx.rounds` (their oracle, the paper's three rounds,
is the tests' ``tests/tput_reference.py``).
"""
