#!/usr/bin/env python3
"""Peak resident memory of the whole demo: every process it starts, summed, sampled each second.

Usage: python scripts/demo_memory.py [--duration 60] [-- more jetstream demo options]

Runs ``jetstream demo --no-dashboard --duration D`` and, while it runs, sums the resident set
(VmRSS in /proc) of the demo and every process under it (the controller, the sites, their
Spark JVMs, the workers); prints the peak of that sum, the peak per kind of process, and when
it was reached, and the latency after close (``latency_s``) of each complete window the demo
showed. Shared pages (the JVM's and Python's libraries, the JDK's class data archive) count
once per process in that sum, an upper bound of what the machine used; so it also sums the
proportional set size (Pss in smaps_rollup: each shared page split between the processes
that map it), which adds up to the memory the demo's processes take from the machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        # The command may hold spaces and parentheses: the fields follow the last ')'.
        fields = text[text.rindex(")") + 2:].split()
        tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return tree


def _field_mb(path: str, name: str) -> float:
    """A "Name:  N kB" line of a /proc file, in MB (0 if the process is gone)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _rss_mb(pid: int) -> float:
    return _field_mb(f"/proc/{pid}/status", "VmRSS:")


def _pss_mb(pid: int) -> float:
    return _field_mb(f"/proc/{pid}/smaps_rollup", "Pss:")


def _kind(cmdline: bytes) -> str:
    command = cmdline.split(b"\0")
    if b"java" in command[0]:
        return "Spark JVMs"
    text = b" ".join(command).decode(errors="replace")
    if " worker " in text:
        return "workers"
    if " site " in text:
        return "site processes"
    if " controller " in text:
        return "controller"
    return "demo (CLI)"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def sample(root: int) -> tuple[dict[str, float], float]:
    """Resident MB per kind of process under ``root``, and the sum of their Pss.

    A child that still runs its parent's command is a fork that has not yet exec'd: a JVM
    starting a command (Hadoop runs ``chmod`` for each checkpoint file it writes) forks with
    CLONE_VM, so until the exec its RSS and Pss are its parent's own pages, read twice. It is
    left out; so is its memory, which it shares with its parent until it writes to it.
    """
    tree, todo, seen, pss = _children(), [(root, b"")], defaultdict[str, float](float), 0.0
    while todo:
        pid, parent_command = todo.pop()
        command = _cmdline(pid)
        if command and command == parent_command:
            continue
        seen[_kind(command)] += _rss_mb(pid)
        pss += _pss_mb(pid)
        todo += [(child, command) for child in tree.get(pid, [])]
    return seen, pss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0)
    args, rest = parser.parse_known_args()
    if rest[:1] == ["--"]:  # the usage's separator before the demo's own options
        rest = rest[1:]
    command = [sys.executable, "-m", "jetstream", "demo", "--no-dashboard",
               "--duration", str(args.duration), *rest]
    started = time.monotonic()
    view = tempfile.TemporaryFile("w+")  # noqa: SIM115 (read back after the demo ends)
    demo = subprocess.Popen(command, stdout=view, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "160"})
    peak, peak_at, peak_pss = 0.0, 0.0, 0.0
    peak_kinds: dict[str, float] = {}
    while demo.poll() is None:
        kinds, pss = sample(demo.pid)
        if sum(kinds.values()) > peak:
            peak, peak_at, peak_kinds = sum(kinds.values()), time.monotonic() - started, kinds
        peak_pss = max(peak_pss, pss)
        time.sleep(1.0)
    print(demo.stderr.read() if demo.stderr else "", end="", file=sys.stderr)
    print(f"peak resident memory of the demo, every process: {peak:,.0f} MB "
          f"({peak / 1024:.2f} GiB), {peak_at:.0f} s in")
    for kind, mb in sorted(peak_kinds.items()):
        print(f"  {kind}: {mb:,.0f} MB")
    print(f"peak proportional set size (Pss) of the demo, every process: {peak_pss:,.0f} MB "
          f"({peak_pss / 1024:.2f} GiB): shared pages counted once")
    view.seek(0)
    latencies: dict[str, float] = {}
    for window, seconds in re.findall(r"cdn-topk \[(\d\d:\d\d:\d\d), [^)]*\) UTC — \d/\d "
                                      r"sites, ([\d.]+)s after close", view.read()):
        latencies.setdefault(window, float(seconds))
    print("latency after close of each complete window shown: "
          + ", ".join(f"{w} {s:.1f}s" for w, s in sorted(latencies.items())))
    sys.exit(demo.returncode)


if __name__ == "__main__":
    main()
