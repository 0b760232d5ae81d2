"""Summaries with error bounds: exact maps and DataSketches sketches behind one contract.

The approximate aggregates live in :mod:`jetstream.approx.sketches`; degradation levels and
the bandwidth feedback policy will live here too.
"""
