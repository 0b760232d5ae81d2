"""The ``jetstream`` command line, one module a group of commands: running a query over
finite input (:mod:`~jetstream.cli.queries`), a deployment's processes
(:mod:`~jetstream.cli.deployment`), operating it (:mod:`~jetstream.cli.operate`); what they
share is in :mod:`~jetstream.cli.common`. More commands come from the packages that declare a
``jetstream.commands`` entry point (the lab's demo, benchmarks, emulator and log generator:
:mod:`jetstream.lab.commands`), each a function that adds its commands to the parser's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from jetstream import __version__, trace
from jetstream.cli import deployment, operate, queries
from jetstream.cli.common import query_given
from jetstream.errors import JetstreamError

__all__ = ["COMMANDS_GROUP", "main", "parser"]

#: The entry point group of the commands other packages add (``register(commands)``).
COMMANDS_GROUP = "jetstream.commands"


def parser() -> argparse.ArgumentParser:
    """The command line's parser: our groups of commands, then those of the entry points."""
    top = argparse.ArgumentParser(
        prog="jetstream",
        description="JetStream-py: one streaming query over many sites and thin links.")
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (queries, deployment, operate):
        group.register(commands)
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            entry.load()(commands)
        except Exception as e:  # a broken add-on must not take our own commands with it
            print(f"jetstream: warning: the commands of {entry.name} ({entry.value}) did not "
                  f"load: {e}", file=sys.stderr)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(argv)
    if "old_query" in args and (problem := query_given(args)):
        top.error(f"{args.command}: {problem}")
    if args.command in ("controller", "site", "worker"):
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("py4j").setLevel(logging.WARNING)  # else a line per micro-batch
        trace.enable_from_env()  # JETSTREAM_TRACE=1: a window's steps, see jetstream.trace
    try:
        code: int = args.run(args)
    except (JetstreamError, OSError) as e:
        print(f"jetstream {args.command}: error: {e}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
