"""What a rewrite run is asked to do, and what each rule reports back for ``explain``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jetstream.errors import RewriteError

__all__ = ["Note", "RewriteContext"]


@dataclass(frozen=True)
class Note:
    rule: str
    fired: bool
    text: str


@dataclass
class RewriteContext:
    """Options for the rules, and the notes they leave.

    ``partitions`` is how many servers a merge or final aggregate is split over (the physical
    planner chooses it; 1 leaves aggregates whole); ``bounds``, if given, makes that a range
    partitioning on the first group key with these ``partitions - 1`` split points.
    ``split_holistic`` splits holistic aggregates too: the distributed path asks for it, since
    their partials (every value of one column) are still no bigger than the raw records.
    """

    partitions: int = 1
    bounds: tuple[Any, ...] | None = None
    split_holistic: bool = False
    notes: list[Note] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.partitions, int) or self.partitions < 1:
            msg = f"partitions must be a positive integer, not {self.partitions!r}"
            raise RewriteError(msg)
        if self.bounds is not None:
            self.bounds = tuple(self.bounds)
            if len(self.bounds) != self.partitions - 1 or list(self.bounds) != sorted(self.bounds):
                msg = (f"range partitioning over {self.partitions} servers needs "
                       f"{self.partitions - 1} ascending bounds, not {self.bounds!r}")
                raise RewriteError(msg)

    def fired(self, rule: str, text: str) -> None:
        self.notes.append(Note(rule, True, text))

    def declined(self, rule: str, text: str) -> None:
        if Note(rule, False, text) not in self.notes:
            self.notes.append(Note(rule, False, text))
