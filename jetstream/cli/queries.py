"""Running a query over finite input: with the reference executor (``local``), through every
site of a topology (``run``), and showing its plan (``explain``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from jetstream.aggtree.loader import load_topology
from jetstream.aggtree.planner import plan_query
from jetstream.cli.common import (
    DEFAULT_TOPOLOGY,
    client,
    output,
    progress,
    query_option,
    security_options,
)
from jetstream.control.launch import LocalCluster, replay
from jetstream.errors import PlanError
from jetstream.local import LocalRun, run_local
from jetstream.queryfile import load_query
from jetstream.rewrite import explain

__all__ = ["register"]


def _explain(args: argparse.Namespace) -> int:
    if args.controller:
        print(client(args).explain(args.query))
        return 0
    query = load_query(args.query)
    print(explain(query, partitions=args.partitions))
    if args.topology:
        print()
        print(plan_query(query, load_topology(args.topology)).render())
    return 0


def _local(args: argparse.Namespace) -> int:
    query = load_query(args.query)
    if not Path(args.input).exists():
        msg = f"--input {args.input}: no such file or directory"
        raise PlanError(msg)
    results = run_local(query, args.input)
    output(results, args.output)
    _report(results, sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    say = progress("run")
    input_dir = Path(args.input)
    query = load_query(args.query)  # run once, here: the sites get its plan
    if not input_dir.is_dir():
        msg = f"--input {input_dir}: not a directory (it should hold one folder per site)"
        raise PlanError(msg)
    topology = load_topology(args.topology)
    missing = [s.name for s in topology.sites if s.sources and not (input_dir / s.name).is_dir()]
    if missing:
        say(f"note: no input folder for {', '.join(missing)} in {input_dir}; "
            "those sites read nothing")

    with LocalCluster(Path(args.topology), input_dir, replay=True,
                      window_deadline_s=args.window_deadline, say=say) as cluster:
        results = replay(cluster, query, timeout_s=args.timeout, say=say)
    output(results, args.output)
    incomplete = sum(r.sites_reporting != r.sites_expected for r in results)
    say(f"{len(results)} windows, every one final"
        + (f"; {incomplete} without every site" if incomplete else "")
        + (f"; written to {args.output}" if args.output not in (None, "-") else ""))
    return 0


def _report(results: LocalRun, out: TextIO) -> None:
    stats = results.stats
    print(f"{len(results)} windows from {stats.records_in} records; "
          f"{stats.late_records} late, {stats.rejects.total} rejected", file=out)
    for reason, n in stats.rejects.counts.most_common():
        print(f"  rejected {n}: {reason}", file=out)
    for rejected in stats.rejects.kept[:5]:
        print(f"    e.g. {rejected.where}: {rejected.reason}", file=out)


def register(commands: Any) -> None:
    """Add this group's commands to ``commands`` (the parser's subparsers)."""
    local = commands.add_parser(
        "local", help="run a query with the reference executor (one process, exact)",
        description="Run a query over finite input with the reference executor and write one "
                    "JSON object per window.")
    local.add_argument("--query", required=True, metavar="QUERY.py",
                       help="a Python file that defines `query`")
    local.add_argument("--input", required=True, metavar="PATH",
                       help="a log file, or a directory searched for the files of the "
                            "query's source's format (*.csv by default)")
    local.add_argument("--output", metavar="OUT.jsonl", help="where to write (default: stdout)")
    local.set_defaults(run=_local)

    run = commands.add_parser(
        "run", help="replay finite input through the full distributed path, then exit",
        description="Start the controller and every site of the topology as local processes "
                    "(each site's local stage in its own Spark JVM), replay DIR/<site>/*.csv "
                    "(or the JSON lines or Parquet files the query's source names) through "
                    "them over gRPC, write one JSON object per window, and exit when every "
                    "window is final.")
    run.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), metavar="T.yaml",
                     help="sites, servers and links (default: the embedded local-3dc)")
    run.add_argument("--query", required=True, metavar="QUERY.py",
                     help="a Python file that defines `query`")
    run.add_argument("--input", required=True, metavar="DIR",
                     help="one folder of log files per site: DIR/<site>/*.csv (or the "
                          "files of the query's source's format)")
    run.add_argument("--output", metavar="OUT.jsonl", help="where to write (default: stdout)")
    run.add_argument("--timeout", type=float, default=600.0, metavar="S",
                     help="give up if the run takes longer (default: 600s)")
    run.add_argument("--window-deadline", type=float, default=120.0, metavar="S",
                     help="how long a window waits for a silent site (default: 120s; replay "
                          "compresses time, so sites finish far apart)")
    run.set_defaults(run=_run)

    explain_cmd = commands.add_parser(
        "explain", help="show a query's plan, how the rewriter changes it, and why",
        description="Print the logical plan, each rewrite rule that fired (or why it "
                    "declined), and the rewritten plan; with --topology, also where each part "
                    "would run.")
    query_option(explain_cmd)
    explain_cmd.add_argument("--partitions", type=int, default=1, metavar="N",
                             help="spread merges over N key partitions (default: 1)")
    explain_cmd.add_argument("--topology", metavar="T.yaml",
                             help="also show the physical plan on this topology")
    explain_cmd.add_argument("--controller", metavar="HOST:PORT",
                             help="ask a running controller instead (its live topology)")
    security_options(explain_cmd)
    explain_cmd.set_defaults(run=_explain)
