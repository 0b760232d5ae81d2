"""``jetstream results`` in a terminal: the newest windows of a query as a live table."""

from __future__ import annotations

import json
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


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, list):
        return json.dumps(value)[:60]
    return "" if value is None else str(value)


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
    if result.revision:
        facts.append(f"correction {result.revision}")
    heading = Text(f"{result.query} [{_time(result.window_start)}, "
                   f"{_time(result.window_end)}) UTC — {', '.join(facts)}", style="bold")
    table = Table()
    columns = list(result.rows[0]) if result.rows else ["(no rows)"]
    for column in columns:
        table.add_column(column, justify="left" if column == columns[0] else "right")
    for row in result.rows[:MAX_ROWS]:
        table.add_row(*(_cell(row.get(c)) for c in columns))
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
