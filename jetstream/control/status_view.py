"""``jetstream status`` as readable tables: sites, queries and their trees, link utilisation;
once, or (``--watch``) live until Ctrl-C."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from google.protobuf.json_format import MessageToDict
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from jetstream.errors import ControlPlaneError
from jetstream.v1 import control_pb2 as pb

__all__ = ["print_status", "render_status", "status_dict", "watch_status"]


def status_dict(status: pb.StatusResponse) -> dict[str, object]:
    return MessageToDict(status, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True)


def print_status(status: pb.StatusResponse, console: Console | None = None) -> None:
    (console or Console()).print(render_status(status))


def watch_status(fetch: Callable[[], pb.StatusResponse], *, interval_s: float = 1.0,
                 console: Console | None = None, stop: threading.Event | None = None) -> int:
    """Show the status live, asking ``fetch`` for it every ``interval_s``, until Ctrl-C (or
    ``stop``); a controller that stops answering is said so on screen, and asked again.
    How many times the view was drawn."""
    stop = stop or threading.Event()
    drawn = 0
    with Live(Group(), console=console or Console(), auto_refresh=False) as live:
        try:
            while not stop.is_set():
                try:
                    view: RenderableType = render_status(fetch())
                except ControlPlaneError as e:
                    view = Text(f"controller unreachable: {e}; asking again", style="red")
                stamp = Text(f"{time.strftime('%H:%M:%S')} · every {interval_s:g}s · Ctrl-C "
                             "stops", style="dim")
                live.update(Group(view, stamp), refresh=True)
                drawn += 1
                stop.wait(interval_s)
        except KeyboardInterrupt:
            pass
    return drawn


def _process(placement: pb.Placement) -> str:
    """Which process runs a piece, and whether it is up: " (pid 123, 127.0.0.1:4567)"."""
    if not placement.pid:
        return ""
    state = "" if placement.state in ("", "running") else f", [yellow]{placement.state}[/yellow]"
    return f" (pid {placement.pid}, {placement.address}{state})"


def _profiles(status: pb.StatusResponse) -> list[RenderableType]:
    """Each running query's links to parents: the level now, and every level as its profile
    measured it on the query's own windows (bytes a window, the error of its result)."""
    parents = {q.name: dict(q.parents) for q in status.queries}
    table = Table(title="query links (each level as measured on the query's own windows: "
                        "bytes a window, error of its result; * the level now)")
    for column in ("query", "link", "level", "profile"):
        table.add_column(column)
    for site in status.sites:
        for report in site.links:
            parent = parents.get(report.query, {}).get(site.name) or "?"
            profile = "\n".join(
                f"{'* ' if p.level == report.level else '  '}{p.level}: {p.bytes:,.0f} B, "
                f"error {p.error:.3g} ({p.windows} windows)" for p in report.profile if p.windows)
            table.add_row(report.query, f"{site.name} -> {parent}",
                          report.level + (" (pinned)" if report.pinned else ""),
                          profile or "[dim]not measured yet[/dim]")
    return [table] if table.row_count else []


def render_status(status: pb.StatusResponse) -> Group:
    parts: list[RenderableType] = []
    sites = Table(title=f"sites of {status.topology} (root {status.root})")
    for column in ("site", "kind", "address", "health", "behind", "runs"):
        sites.add_column(column)
    for s in status.sites:
        if not s.address:
            health = "[dim]not registered[/dim]"
        elif s.alive:
            health = f"[green]alive[/green] ({s.seconds_since_heartbeat:.1f}s ago)"
        else:
            health = f"[red]dead[/red] ({s.seconds_since_heartbeat:.0f}s silent)"
        runs = "\n".join(f"{p.query}: {p.piece} on {p.server}{_process(p)}"
                         for p in s.placements)
        behind = "\n".join(f"{b.folder}: {b.files_waiting} files, {b.lag_s:.0f}s"
                           for b in s.behind if b.files_waiting)
        sites.add_row(s.name, s.kind, s.address or "-", health, behind or "-", runs or "-")
    parts.append(sites)

    queries = Table(title="queries")
    for column in ("query", "state", "re-plans", "aggregation tree", "late records", "detail"):
        queries.add_column(column)
    for q in status.queries:
        tree = "\n".join(f"{child} -> {parent}" for child, parent in sorted(q.parents.items()))
        colour = {"running": "green", "degraded": "yellow"}.get(q.state, "dim")
        # Dropped at the sites: their window had gone on final (not merged into a revision).
        late = "\n".join(f"{site}: {n:,}" for site, n in sorted(q.late_records.items()) if n)
        queries.add_row(q.name, f"[{colour}]{q.state}[/{colour}]", str(q.replans), tree or "-",
                        late or "0", q.detail or "-")
    parts.append(queries if status.queries else Text("no queries"))
    parts += _profiles(status)

    links = Table(title="links (planned load of running queries)")
    for column in ("link", "bandwidth", "planned", "utilisation"):
        links.add_column(column)
    for link in status.links:
        links.add_row(f"{link.a} - {link.b}", f"{link.bandwidth_bps / 1e6:.1f} Mbit/s",
                      f"{link.planned_bytes_per_s * 8 / 1e3:.1f} kbit/s",
                      f"{link.utilisation:.1%}")
    parts.append(links)
    return Group(*parts)
