"""The ``jetstream`` command line."""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from jetstream import __version__
from jetstream.dsl import Query
from jetstream.errors import JetstreamError, PlanError
from jetstream.local import LocalRun, run_local
from jetstream.rewrite import explain

__all__ = ["load_query", "main"]


def load_query(path: str | Path) -> Query:
    """The ``query`` a Python module defines; raises PlanError naming what is wrong."""
    p = Path(path)
    if not p.is_file():
        msg = f"{p}: no such query file"
        raise PlanError(msg)
    try:
        namespace = runpy.run_path(str(p), run_name="jetstream_query")
    except JetstreamError as e:
        msg = f"{p}: {e}"
        raise PlanError(msg) from None
    except SyntaxError as e:
        msg = f"{p}:{e.lineno}: syntax error: {e.msg}"
        raise PlanError(msg) from None
    query = namespace.get("query")
    if not isinstance(query, Query):
        found = "nothing" if query is None else f"a {type(query).__name__}"
        msg = f"{p}: the module must assign a js.Query to the name `query`, found {found}"
        raise PlanError(msg)
    return query


def _explain(args: argparse.Namespace) -> int:
    print(explain(load_query(args.query), partitions=args.partitions))
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
                    "declined), and the rewritten plan.")
    explain_cmd.add_argument("query", metavar="QUERY.py",
                             help="a Python file that defines `query`")
    explain_cmd.add_argument("--partitions", type=int, default=1, metavar="N",
                             help="spread merges over N key partitions (default: 1)")
    explain_cmd.set_defaults(run=_explain)

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
    try:
        code: int = args.run(args)
    except JetstreamError as e:
        print(f"jetstream {args.command}: error: {e}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
