"""Semantics-preserving rewrites of the logical plan (filter pushback, distributive split,
top-k pushback, key partitioning): one rule per module and an ordered rule list. Coming in the
rewrite issue."""
