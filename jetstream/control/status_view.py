"""``jetstream status`` as readable tables: sites, queries and their trees, link utilisation."""

from __future__ import annotations

from google.protobuf.json_format import MessageToDict
from rich.console import Console
from rich.table import Table

from jetstream.v1 import control_pb2 as pb

__all__ = ["print_status", "status_dict"]


def status_dict(status: pb.StatusResponse) -> dict[str, object]:
    return MessageToDict(status, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True)


def print_status(status: pb.StatusResponse, console: Console | None = None) -> None:
    console = console or Console()
    sites = Table(title=f"sites of {status.topology} (root {status.root})")
    for column in ("site", "kind", "address", "health", "runs"):
        sites.add_column(column)
    for s in status.sites:
        if not s.address:
            health = "[dim]not registered[/dim]"
        elif s.alive:
            health = f"[green]alive[/green] ({s.seconds_since_heartbeat:.1f}s ago)"
        else:
            health = f"[red]dead[/red] ({s.seconds_since_heartbeat:.0f}s silent)"
        runs = "\n".join(f"{p.query}: {p.piece} on {p.server}" for p in s.placements)
        sites.add_row(s.name, s.kind, s.address or "-", health, runs or "-")
    console.print(sites)

    queries = Table(title="queries")
    for column in ("query", "state", "re-plans", "aggregation tree", "detail"):
        queries.add_column(column)
    for q in status.queries:
        tree = "\n".join(f"{child} -> {parent}" for child, parent in sorted(q.parents.items()))
        colour = {"running": "green", "degraded": "yellow"}.get(q.state, "dim")
        queries.add_row(q.name, f"[{colour}]{q.state}[/{colour}]", str(q.replans), tree or "-",
                        q.detail or "-")
    console.print(queries if status.queries else "no queries")

    links = Table(title="links (planned load of running queries)")
    for column in ("link", "bandwidth", "planned", "utilisation"):
        links.add_column(column)
    for link in status.links:
        links.add_row(f"{link.a} - {link.b}", f"{link.bandwidth_bps / 1e6:.1f} Mbit/s",
                      f"{link.planned_bytes_per_s * 8 / 1e3:.1f} kbit/s",
                      f"{link.utilisation:.1%}")
    console.print(links)
