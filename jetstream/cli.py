"""The ``jetstream`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from jetstream import __version__
from jetstream.aggtree.loader import load_topology
from jetstream.aggtree.planner import plan_query
from jetstream.control.client import DEFAULT_CONTROLLER, ControllerClient
from jetstream.control.daemons import run_controller, run_site
from jetstream.control.status_view import print_status, status_dict
from jetstream.errors import JetstreamError, PlanError
from jetstream.local import LocalRun, run_local
from jetstream.queryfile import load_query
from jetstream.rewrite import explain

__all__ = ["main"]

#: The topology ``jetstream controller`` runs when given none: everything on this machine.
#: (``topologies/local-3dc.yaml`` links to it.)
DEFAULT_TOPOLOGY = Path(__file__).resolve().parent / "aggtree" / "local-3dc.yaml"


def _explain(args: argparse.Namespace) -> int:
    if args.controller:
        print(ControllerClient(args.controller).explain(args.query))
        return 0
    query = load_query(args.query)
    print(explain(query, partitions=args.partitions))
    if args.topology:
        print()
        print(plan_query(query, load_topology(args.topology)).render())
    return 0


def _controller(args: argparse.Namespace) -> int:
    topology = load_topology(args.topology)
    print(f"jetstream controller: {topology.name} ({len(topology.sites)} sites, root "
          f"{topology.root}) on {args.host}:{args.port}; Ctrl-C stops", file=sys.stderr)
    run_controller(topology, args.port, host=args.host,
                   heartbeat_interval_s=args.heartbeat_interval,
                   heartbeat_timeout_s=args.heartbeat_timeout)
    return 0


def _site(args: argparse.Namespace) -> int:
    print(f"jetstream site {args.name}: registering with {args.controller}; Ctrl-C stops",
          file=sys.stderr)
    run_site(args.name, args.controller, port=args.port, host=args.host)
    return 0


def _submit(args: argparse.Namespace) -> int:
    response = ControllerClient(args.controller).submit(args.query)
    print(f"submitted {response.query}\n{response.plan}")
    return 0


def _status(args: argparse.Namespace) -> int:
    status = ControllerClient(args.controller).status()
    if args.json:
        print(json.dumps(status_dict(status), indent=2))
    else:
        print_status(status)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    ControllerClient(args.controller).cancel(args.name)
    print(f"cancelled {args.name}")
    return 0


def _results(args: argparse.Namespace) -> int:
    for result in ControllerClient(args.controller).results(args.name, args.timeout):
        print(json.dumps(result.to_dict()), flush=True)
    return 0


def _local(args: argparse.Namespace) -> int:
    query = load_query(args.query)
    if not Path(args.input).exists():
        msg = f"--input {args.input}: no such file or directory"
        raise PlanError(msg)
    results = run_local(query, args.input)
    if args.output in (None, "-"):
        _write_results(results, sys.stdout)
    else:
        with open(args.output, "w", encoding="utf-8") as out:
            _write_results(results, out)
    _report(results, sys.stderr)
    return 0


def _write_results(results: LocalRun, out: TextIO) -> None:
    for result in results:
        out.write(json.dumps(result.to_dict()) + "\n")


def _report(results: LocalRun, out: TextIO) -> None:
    stats = results.stats
    print(f"{len(results)} windows from {stats.records_in} records; "
          f"{stats.late_records} late, {stats.rejects.total} rejected", file=out)
    for reason, n in stats.rejects.counts.most_common():
        print(f"  rejected {n}: {reason}", file=out)
    for rejected in stats.rejects.kept[:5]:
        print(f"    e.g. {rejected.where}: {rejected.reason}", file=out)


def _demo(args: argparse.Namespace) -> int:
    print("The multi-site CDN top-k demo is not built yet: it needs the data plane and the log\n"
          "generator (issues 5 and 7). Until then, run the same query with the reference\n"
          "executor on the bundled sample logs:\n\n"
          "  jetstream local --query examples/cdn_topk.py --input examples/logs\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jetstream",
        description="JetStream-py: one streaming query over many sites and thin links.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    explain_cmd = commands.add_parser(
        "explain", help="show a query's plan, how the rewriter changes it, and why",
        description="Print the logical plan, each rewrite rule that fired (or why it "
                    "declined), and the rewritten plan; with --topology, also where each part "
                    "would run.")
    explain_cmd.add_argument("query", metavar="QUERY.py",
                             help="a Python file that defines `query`")
    explain_cmd.add_argument("--partitions", type=int, default=1, metavar="N",
                             help="spread merges over N key partitions (default: 1)")
    explain_cmd.add_argument("--topology", metavar="T.yaml",
                             help="also show the physical plan on this topology")
    explain_cmd.add_argument("--controller", metavar="HOST:PORT",
                             help="ask a running controller instead (its live topology)")
    explain_cmd.set_defaults(run=_explain)

    controller = commands.add_parser("controller", help="run the global controller")
    controller.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), metavar="T.yaml",
                            help="sites, servers and links (default: the embedded local-3dc)")
    controller.add_argument("--port", type=int, default=7070)
    controller.add_argument("--host", default="127.0.0.1")
    controller.add_argument("--heartbeat-interval", type=float, default=2.0, metavar="S",
                            help="how often sites report (default: 2s)")
    controller.add_argument("--heartbeat-timeout", type=float, default=6.0, metavar="S",
                            help="a site silent this long is dead (default: 6s)")
    controller.set_defaults(run=_controller)

    site = commands.add_parser("site", help="run a site controller")
    site.add_argument("--name", required=True, help="the site's name in the topology")
    site.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    site.add_argument("--port", type=int, default=0, help="listen port (default: any free)")
    site.add_argument("--host", default="127.0.0.1")
    site.set_defaults(run=_site)

    submit = commands.add_parser("submit", help="submit a query to the controller")
    submit.add_argument("query", metavar="QUERY.py")
    submit.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    submit.set_defaults(run=_submit)

    status = commands.add_parser("status", help="sites, queries, trees and link utilisation")
    status.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(run=_status)

    cancel = commands.add_parser("cancel", help="stop a running query everywhere")
    cancel.add_argument("name", help="the query's name")
    cancel.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    cancel.set_defaults(run=_cancel)

    results = commands.add_parser("results", help="stream a query's results as JSON lines")
    results.add_argument("name", help="the query's name")
    results.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    results.add_argument("--timeout", type=float, metavar="S", help="stop after S seconds")
    results.set_defaults(run=_results)

    local = commands.add_parser(
        "local", help="run a query with the reference executor (one process, exact)",
        description="Run a query over finite input with the reference executor and write one "
                    "JSON object per window.")
    local.add_argument("--query", required=True, metavar="QUERY.py",
                       help="a Python file that defines `query`")
    local.add_argument("--input", required=True, metavar="PATH",
                       help="a CSV file, or a directory searched for *.csv")
    local.add_argument("--output", metavar="OUT.jsonl", help="where to write (default: stdout)")
    local.set_defaults(run=_local)

    demo = commands.add_parser("demo", help="the multi-site CDN top-k demo (not built yet)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("controller", "site"):
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.run(args)
    except (JetstreamError, OSError) as e:
        print(f"jetstream {args.command}: error: {e}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
