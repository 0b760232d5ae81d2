"""What a query produces: one :class:`WindowResult` per window."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["WindowResult"]


@dataclass(frozen=True)
class WindowResult:
    """The rows of one event-time window ``[window_start, window_end)`` (epoch ms).

    ``exact`` is False when an approximate aggregate contributed; ``error_bound`` is then
    the largest relative error any value in ``rows`` can carry (0.0 when exact).
    """

    query: str
    window_start: int
    window_end: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    exact: bool = True
    error_bound: float | None = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
