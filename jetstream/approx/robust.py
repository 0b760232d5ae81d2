"""A smoothed estimate that one outlying sample does not move (the link policy's throughput
and window volume, :mod:`jetstream.approx.policy`)."""

from __future__ import annotations

__all__ = ["OUTLIER_FACTOR", "SMOOTHING", "RobustAverage"]

#: Weight of a new sample in the throughput and volume averages.
SMOOTHING = 0.3
#: A sample this many times above or below the average is an outlier until the next confirms it.
OUTLIER_FACTOR = 2.0


class RobustAverage:
    """An EWMA that ignores one outlier: a sample more than OUTLIER_FACTOR off the average waits
    for the next sample; if that one is off the same way, the average jumps to the pair's mean
    (the level shifted), otherwise the outlier is forgotten."""

    def __init__(self) -> None:
        self.value: float | None = None
        self.latest: float | None = None
        self._suspect: float | None = None

    def add(self, sample: float) -> None:
        self.latest = sample
        if self.value is None:
            self.value = sample
            return
        if self.value / OUTLIER_FACTOR <= sample <= self.value * OUTLIER_FACTOR:
            self.value += SMOOTHING * (sample - self.value)
            self._suspect = None
        elif self._suspect is not None and (self._suspect > self.value) == (sample > self.value):
            self.value = (self._suspect + sample) / 2
            self._suspect = None
        else:
            self._suspect = sample

    def cap(self, bound: float) -> None:
        """The quantity is at most ``bound`` (known, not sampled): no more than that now."""
        if self.value is None or self.value > bound:
            self.value = bound
        self.latest = bound if self.latest is None else min(self.latest, bound)
        self._suspect = None
