"""``jetstream results`` in a terminal: the newest windows of a query as a live table."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from jetstream.results import WindowResult

__all__ = ["follow_table", "render_window"]

#: Rows shown per window, and windows kept on screen.
MAX_ROWS = 10
MAX_WINDOWS = 3


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S")


def _cells(values: list[Any]) -> list[str]:
    """A column's values as text that reads alike down the column: numbers with thousands
    separators, and every float with as many decimals (up to 3) as the column's most exact
    float needs."""
    floats = [v for v in values if isinstance(v, float) and math.isfinite(v)]
    places = max((len(f"{v:.3f}".rstrip("0").partition(".")[2]) for v in floats), default=0)
    return [_cell(v, places) for v in values]


def _cell(value: Any, places: int) -> str:
    if isinstance(value, float):
        return f"{value:,.{places}f}" if math.isfinite(value) else str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list) and value and all(
            isinstance(b, dict) and set(b) <= {"aggregate", "lb", "ub"} for b in value):
        # An aggregate's bounds (jetstream.dataplane.finish.aggregate_bounds): open sides ?.
        return "; ".join(f"{b['aggregate']} [{_side(b.get('lb'))}, {_side(b.get('ub'))}]"
                         for b in value)
    if isinstance(value, list):
        return json.dumps(value)[:60]
    return "" if value is None else str(value)


def _side(value: Any) -> str:
    """One side of a bound: ? when open, a float to at most 3 decimals."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return "?" if value is None else _cell(value, 0)


def render_window(result: WindowResult) -> Group:
    """One window's rows, under a line saying how complete and how fresh the result is."""
    facts = []
    if result.sites_expected:
        missing = (f" (missing {', '.join(result.missing_sites)})"
                   if result.missing_sites else "")
        facts.append(f"{result.sites_reporting}/{result.sites_expected} sites{missing}")
    if result.latency_s is not None:
        facts.append(f"{result.latency_s:.1f}s after close")
    if result.wan_bytes is not None:
        facts.append(f"{result.wan_bytes:,} B wide-area")
    facts.append("exact" if result.exact else f"± {result.error_bound or 0:.2%}")
    if result.rolled_up:
        facts.append("rolled up: " + ", ".join(f"{key} to {to}"
                                               for key, to in result.rolled_up.items()))
    if result.revision:
        facts.append(f"correction {result.revision}")
    facts.append("final" if result.final
                 else f"provisional ({', '.join(result.provisional) or 'may change'})")
    heading = Text(f"{result.query} [{_time(result.window_start)}, "
                   f"{_time(result.window_end)}) UTC — {', '.join(facts)}", style="bold")
    table = Table()
    columns = list(result.rows[0]) if result.rows else ["(no rows)"]
    for column in columns:
        table.add_column(column, justify="left" if column == columns[0] else "right")
    shown = result.rows[:MAX_ROWS]
    for cells in zip(*(_cells([row.get(c) for row in shown]) for c in columns), strict=True):
        table.add_row(*cells)
    if len(result.rows) > MAX_ROWS:
        table.caption = f"{len(result.rows) - MAX_ROWS} more rows"
    notes = [Text(f"warning: {w}", style="yellow") for w in result.warnings]
    return Group(heading, table, *notes)


def follow_table(results: Iterable[WindowResult], console: Console | None = None) -> int:
    """Show results as they arrive, the newest windows last; how many arrived."""
    latest: dict[tuple[int, int], WindowResult] = {}
    count = 0
    with Live(Group(), console=console or Console(), auto_refresh=False) as live:
        for result in results:
            count += 1
            latest[(result.window_start, result.window_end)] = result  # a correction replaces
            shown = [latest[w] for w in sorted(latest)[-MAX_WINDOWS:]]
            live.update(Group(*(render_window(r) for r in shown)), refresh=True)
    return count
