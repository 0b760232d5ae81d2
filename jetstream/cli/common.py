"""What the command line's groups of commands share: the topology and examples they
default to, their options, and the parsers of their values."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jetstream.control.client import DEFAULT_CONTROLLER, ControllerClient
from jetstream.control.launch import free_port
from jetstream.dsl import Query
from jetstream.errors import PlanError
from jetstream.queryfile import load_query
from jetstream.results import WindowResult, write_json_lines
from jetstream.security import Security
from jetstream.windows import parse_duration

__all__ = ["DEFAULT_TOPOLOGY", "EXAMPLES", "archive_retention", "client", "controller_option",
           "dashboard_port", "live_options", "live_query", "metrics_option", "numbers",
           "output", "positive_seconds", "progress", "query_given", "query_option",
           "seconds_or_zero", "security", "security_options", "size"]

#: The topology ``jetstream controller`` runs when given none: everything on this machine.
#: (``topologies/local-3dc.yaml`` links to it.)
DEFAULT_TOPOLOGY = Path(__file__).resolve().parent.parent / "aggtree" / "local-3dc.yaml"
#: The example queries and sample logs of a source checkout (the demo and bench use them).
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


def security(args: argparse.Namespace) -> Security:
    """The process's transport security from ``--tls-dir``/``--token``/``--insecure`` and
    the environment (see :meth:`Security.resolve`)."""
    return Security.resolve(args.tls_dir, args.token, args.insecure)


def client(args: argparse.Namespace) -> ControllerClient:
    return ControllerClient(args.controller, security=security(args))


def progress(command: str) -> Callable[[str], None]:
    """Prints a long command's progress on stderr, each line naming the command."""
    def say(line: str) -> None:
        print(f"jetstream {command}: {line}", file=sys.stderr, flush=True)
    return say


def output(results: list[WindowResult], path: str | None) -> None:
    if path in (None, "-"):
        write_json_lines(results, sys.stdout)
    else:
        with open(path, "w", encoding="utf-8") as out:
            write_json_lines(results, out)


def live_query(args: argparse.Namespace) -> Query:
    """The query of a live run (``--query``, or the CDN top-k example), run once, here,
    and refused before anything starts if it does not load."""
    return load_query(Path(args.query) if args.query else EXAMPLES / "cdn_topk.py")


def dashboard_port(args: argparse.Namespace, host: str, say: Callable[[str], None]) -> int:
    """The port a live run's controller serves its dashboard on (0: none), said to the user."""
    port = 0 if args.no_dashboard else args.dashboard_port or free_port()
    if port:
        say(f"dashboard: http://{host}:{port}/ (once the controller is up)")
    return port


def numbers(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            msg = f"expected a comma-separated list of numbers, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None
    return parse


def positive_seconds(text: str) -> float:
    """A command-line duration in seconds: a finite number above zero."""
    return _duration(text, zero=False)


def seconds_or_zero(text: str) -> float:
    """A command-line duration in seconds: a finite number, zero or above."""
    return _duration(text, zero=True)


def _duration(text: str, *, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf or (zero and value == 0)):
        msg = f"expected a number of seconds, {'0 or more' if zero else 'above 0'}, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def archive_retention(text: str) -> float:
    """``--archive-retention``: a duration above 0 such as ``12h`` or ``7d``, in seconds."""
    try:
        seconds = parse_duration(text, "archive retention") / 1000
    except PlanError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds <= 0:
        msg = (f"expected a duration above 0, such as 12h or 7d, not {text!r} "
               "(to keep no read file, use --read-files delete)")
        raise argparse.ArgumentTypeError(msg)
    return seconds


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def size(text: str) -> int:
    """A number of bytes, with K, M, G or T for powers of 1024: ``500M``, ``20G``."""
    m = _SIZE.match(text)
    value = int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")) if m else 0
    if value <= 0:
        msg = f"expected a size in bytes above 0, such as 500M or 20G, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def security_options(parser: argparse.ArgumentParser) -> None:
    """How a process that serves or dials gRPC secures it (see docs/security.md)."""
    group = parser.add_argument_group(
        "security", "mutual TLS and a token on every call; one of --tls-dir (or "
        "JETSTREAM_TLS_DIR) and --insecure is needed")
    group.add_argument("--tls-dir", metavar="DIR",
                       help="ca.pem, node.pem, node-key.pem and optionally token (`jetstream "
                            "certs DIR` makes a development set; default: $JETSTREAM_TLS_DIR)")
    group.add_argument("--token", metavar="TOKEN",
                       help="the token every call carries and every server requires "
                            "(default: $JETSTREAM_TOKEN, else DIR/token if there is one)")
    group.add_argument("--insecure", action="store_true",
                       help="no TLS and no authentication: anyone who can reach a port can "
                            "use it; for a trusted test network only")


def query_option(parser: argparse.ArgumentParser) -> None:
    """``--query QUERY.py``, as every command that takes a query file takes it. The query
    file as the first argument, as ``explain``, ``submit`` and ``history`` took it before, is
    still accepted, with a warning (:func:`query_given`)."""
    parser.add_argument("--query", metavar="QUERY.py",
                        help="a Python file that defines `query` (required)")
    parser.add_argument("old_query", nargs="?", metavar="QUERY.py", help=argparse.SUPPRESS)


def query_given(args: argparse.Namespace) -> str | None:
    """What is wrong with how ``args`` give the query file (None: nothing), after taking the
    old spelling (the file as the first argument) as ``--query``."""
    old = getattr(args, "old_query", None)
    if old is None:
        return None if args.query else "give the query file: --query QUERY.py"
    if args.query:
        return f"the query file given twice ({old} and --query {args.query}): give --query only"
    print(f"jetstream {args.command}: warning: give the query file as --query {old}; the file "
          "as the first argument will not be accepted in a later version", file=sys.stderr)
    args.query = old
    return None


def controller_option(parser: argparse.ArgumentParser) -> None:
    """Where a command finds the global controller."""
    parser.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT",
                        help=f"the global controller's address (default: {DEFAULT_CONTROLLER})")


def metrics_option(parser: argparse.ArgumentParser) -> None:
    """Where a long-running process serves its Prometheus metrics."""
    parser.add_argument("--metrics-port", type=int, default=0, metavar="PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics, on the "
                             "--host address (default: 0, off; plain HTTP)")
    parser.add_argument("--http-token", action="store_true",
                        help="require the process's token (--token, JETSTREAM_TOKEN or the "
                             "TLS folder's) on /metrics and the dashboard: Authorization: "
                             "Bearer TOKEN, or Basic with the token as password")


def live_options(parser: argparse.ArgumentParser, *, duration_s: float) -> None:
    """The options of a live run on generated logs (demo, emulate)."""
    parser.add_argument("--query", metavar="QUERY.py",
                        help="the query (default: examples/cdn_topk.py)")
    parser.add_argument("--duration", type=float, default=duration_s, metavar="S",
                        help=f"stop S seconds after the first complete window (default: "
                        f"{duration_s:g}; 0: run until Ctrl-C)")
    parser.add_argument("--rate", type=float, default=200.0, metavar="N",
                        help="log records per second at each site (default: 200)")
    parser.add_argument("--seed", type=int, default=0, help="the log generator's seed")
    parser.add_argument("--dashboard-port", type=int, metavar="PORT",
                        help="serve the live dashboard on PORT of the controller's address "
                        "(default: a free port)")
    parser.add_argument("--no-dashboard", action="store_true", help="serve no dashboard")
