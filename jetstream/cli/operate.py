"""Operating a running deployment through its controller: submit and cancel queries, follow
their results, ask the past, see and steer the sites and links."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from rich.console import Console

from jetstream.cli.common import client, controller_option, query_option, security_options
from jetstream.control.codec import result_from_proto
from jetstream.control.results_view import follow_table, render_window
from jetstream.control.status_view import print_status, status_dict, watch_status
from jetstream.errors import PlanError
from jetstream.results import WindowResult, write_json_lines
from jetstream.windows import parse_duration

__all__ = ["parse_time", "register"]


def _submit(args: argparse.Namespace) -> int:
    since = None if args.since is None else parse_time(
        args.since, time.time_ns() // 1_000_000, "--since")
    response = client(args).submit(args.query, since)
    print(f"submitted {response.query}\n{response.plan}")
    if response.backfill:
        print(response.backfill)
    return 0


def _status(args: argparse.Namespace) -> int:
    controller = client(args)
    if args.watch:
        watch_status(controller.status, interval_s=args.interval)
        return 0
    status = controller.status()
    if args.json:
        print(json.dumps(status_dict(status), indent=2))
    else:
        print_status(status)
    return 0


def _results(args: argparse.Namespace) -> int:
    results = client(args).results(args.name, args.timeout)
    if args.output:
        results = _also_to(results, args.output)
    if args.json or not sys.stdout.isatty():
        for result in results:
            print(json.dumps(result.to_dict()), flush=True)
    else:
        follow_table(results)
    return 0


def _also_to(results: Iterator[WindowResult], path: str) -> Iterator[WindowResult]:
    """``results``, each also appended to the JSON lines file at ``path`` as it passes."""
    with open(path, "a", encoding="utf-8") as sink:
        for result in results:
            write_json_lines([result], sink)
            sink.flush()
            yield result


def _history(args: argparse.Namespace) -> int:
    now_ms = time.time_ns() // 1_000_000
    since = parse_time(args.since, now_ms, "--since")
    until = parse_time(args.until, now_ms, "--until") if args.until else now_ms
    response = client(args).history(args.query, since, until)
    results = [result_from_proto(r) for r in response.results]
    if args.json or not sys.stdout.isatty():
        write_json_lines(results, sys.stdout)
    else:
        console = Console()
        for result in results:
            console.print(render_window(result))
    print(f"jetstream history: {len(results)} window(s) from the "
          f"{response.resolution_ms // 1000} s cubes of {response.stored}; the sites sent "
          f"{response.bytes:,} bytes", file=sys.stderr)
    return 0


def parse_time(text: str, now_ms: int, what: str) -> int:
    """Epoch ms from ``text``: a duration ago (``1h``), an ISO 8601 time (UTC unless it
    says otherwise), or epoch milliseconds."""
    if text.isdigit():
        return int(text)
    try:
        return now_ms - parse_duration(text, what)
    except PlanError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        msg = (f"{what} {text!r}: give a duration ago (30m, 1h, 2d), an ISO 8601 time "
               "(2026-11-24T10:00:00Z) or epoch milliseconds")
        raise PlanError(msg) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _level(args: argparse.Namespace) -> int:
    now = client(args).set_level(args.name, args.site, args.level or "")
    how = "pinned by an operator" if now.pinned else "chosen by the link's policy"
    print(f"{args.name}: link {now.link} at {now.level!r} ({how})")
    print("levels: " + ", ".join(f"{i} {name!r}" for i, name in enumerate(now.levels)))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    client(args).cancel(args.name)
    print(f"cancelled {args.name}")
    return 0


def register(commands: Any) -> None:
    """Add this group's commands to ``commands`` (the parser's subparsers)."""
    submit = commands.add_parser(
        "submit", help="submit a query to the controller",
        description="Submit QUERY.py to the controller, which places it on the sites. With "
                    "--since, its results start with the windows since then, answered from "
                    "the sites' cubes of a query that ran (as `jetstream history` answers), "
                    "and it runs live from the end of that query's newest complete window: "
                    "no gap, nothing counted twice.")
    query_option(submit)
    submit.add_argument("--since", metavar="TIME",
                        help="backfill from then: a duration ago (30m), an ISO 8601 time, or "
                             "epoch ms")
    controller_option(submit)
    security_options(submit)
    submit.set_defaults(run=_submit)

    status = commands.add_parser("status", help="sites, queries, trees and link utilisation")
    controller_option(status)
    shown = status.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="machine-readable output")
    shown.add_argument("--watch", action="store_true",
                       help="a live view, redrawn every --interval seconds until Ctrl-C")
    status.add_argument("--interval", type=float, default=1.0, metavar="S",
                        help="with --watch, how often to redraw (default: 1s)")
    security_options(status)
    status.set_defaults(run=_status)

    results = commands.add_parser(
        "results", help="follow a query's results: a live table, or JSON lines",
        description="Follow a query's results as they arrive: a live table of the newest "
                    "windows in a terminal, JSON lines (one per window, corrections "
                    "included) when piped or with --json. Ends when the query does.")
    results.add_argument("name", help="the query's name")
    controller_option(results)
    results.add_argument("--timeout", type=float, metavar="S", help="stop after S seconds")
    results.add_argument("--json", action="store_true", help="JSON lines even in a terminal")
    results.add_argument("--output", metavar="OUT.jsonl",
                         help="also append every result to this JSON lines file")
    security_options(results)
    results.set_defaults(run=_results)

    history = commands.add_parser(
        "history", help="a windowed aggregate over the past, from the sites' cubes",
        description="Answer QUERY.py over the windows inside [--since, --until) from the "
                    "cubes the sites keep of a query that ran: its group keys among the "
                    "stored query's, its aggregates among its, the same steps before the "
                    "window (filters on the stored keys aside), a window made of a kept "
                    "resolution (10 s windows for an hour, 1 min rollups for a day, 1 h for "
                    "30 days by default). Refused, naming what is missing, otherwise. A table "
                    "in a terminal, JSON lines (each with \"history\": true) when piped or "
                    "with --json.")
    query_option(history)
    history.add_argument("--since", required=True, metavar="TIME",
                         help="the start: a duration ago (30m, 1h), an ISO 8601 time, or "
                              "epoch ms")
    history.add_argument("--until", metavar="TIME", help="the end (default: now)")
    history.add_argument("--json", action="store_true", help="JSON lines even in a terminal")
    controller_option(history)
    security_options(history)
    history.set_defaults(run=_history)

    level = commands.add_parser(
        "level", help="show or pin the degradation level of a site's link to its parent",
        description="Without LEVEL, show where the link of SITE to its parent is for query "
        "NAME. With LEVEL (a level's name or index), hold it there; 'auto' hands the choice "
        "back to the link's policy. The running query is not restarted; levels past the "
        "query's SLO max_error are refused.")
    level.add_argument("name", help="the query's name")
    level.add_argument("site", help="the site whose link to its parent to show or pin")
    level.add_argument("level", nargs="?", help="a level's name or index, or 'auto'")
    controller_option(level)
    security_options(level)
    level.set_defaults(run=_level)

    cancel = commands.add_parser("cancel", help="stop a running query everywhere")
    cancel.add_argument("name", help="the query's name")
    controller_option(cancel)
    security_options(cancel)
    cancel.set_defaults(run=_cancel)
