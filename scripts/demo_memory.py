#!/usr/bin/env python3
"""Peak resident memory of the whole demo: every process it starts, summed, sampled each second.

Usage: python scripts/demo_memory.py [--duration 60] [-- more jetstream demo options]

Runs ``jetstream demo --no-dashboard --duration D`` and, while it runs, sums the resident set
(VmRSS in /proc) of the demo and every process under it (the controller, the sites, their
Spark JVMs); prints the peak of that sum, the peak per kind of process, and when it was reached,
and the latency after close (``latency_s``) of each complete window the demo showed. Shared
pages count once per process, so the sum is an upper bound of what the machine used.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
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


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _kind(pid: int) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    text = b" ".join(command).decode(errors="replace")
    if "java" in command[0].decode(errors="replace"):
        return "Spark JVMs"
    if " worker " in text:
        return "workers"
    if " site " in text:
        return "site processes"
    if " controller " in text:
        return "controller"
    return "demo (CLI)"


def sample(root: int) -> Counter[str]:
    tree, todo, seen = _children(), [root], Counter[str]()
    while todo:
        pid = todo.pop()
        seen[_kind(pid)] += _rss_mb(pid)
        todo += tree.get(pid, [])
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0)
    args, rest = parser.parse_known_args()
    command = [sys.executable, "-m", "jetstream", "demo", "--no-dashboard",
               "--duration", str(args.duration), *rest]
    started = time.monotonic()
    view = tempfile.TemporaryFile("w+")  # noqa: SIM115 (read back after the demo ends)
    demo = subprocess.Popen(command, stdout=view, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "160"})
    peak, peak_at, peak_kinds = 0.0, 0.0, Counter[str]()
    while demo.poll() is None:
        kinds = sample(demo.pid)
        if sum(kinds.values()) > peak:
            peak, peak_at, peak_kinds = sum(kinds.values()), time.monotonic() - started, kinds
        time.sleep(1.0)
    print(demo.stderr.read() if demo.stderr else "", end="", file=sys.stderr)
    print(f"peak resident memory of the demo, every process: {peak:,.0f} MB "
          f"({peak / 1024:.2f} GiB), {peak_at:.0f} s in")
    for kind, mb in sorted(peak_kinds.items()):
        print(f"  {kind}: {mb:,.0f} MB")
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
