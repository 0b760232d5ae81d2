#!/usr/bin/env python3
"""Where a JVM spent its CPU, from a Java Flight Recorder file: samples by thread and method.

Usage: python scripts/jfr_top.py FILE.jfr [--thread SUBSTRING] [--depth 12] [--top 25]

Reads the file's ``jdk.ExecutionSample`` events with the JDK's ``jfr print --json`` and prints,
for the threads whose name holds ``--thread`` (all by default), the samples of each thread,
then the methods found most often anywhere in a sample's top ``--depth`` frames (inclusive:
a method is counted once a sample), then the processes the JVM started (``jdk.ProcessStart``)
and the threads it started, so a fork per micro-batch shows. Record with
``scripts/bench_live_batch.py --jfr FILE.jfr`` or ``jcmd PID JFR.start settings=profile``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import Counter


def events(path: str, kind: str) -> list[dict]:
    out = subprocess.run(["jfr", "print", "--json", "--stack-depth", "64", "--events", kind,
                          path], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["recording"]["events"]


def frame_name(frame: dict) -> str:
    method = frame["method"]
    return f'{method["type"]["name"].replace("/", ".").rsplit(".", 1)[-1]}.{method["name"]}'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--thread", default="", help="only threads whose name holds this")
    parser.add_argument("--depth", type=int, default=12, help="frames of each sample counted")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    threads: Counter[str] = Counter()
    methods: Counter[str] = Counter()
    samples = 0
    for event in events(args.file, "jdk.ExecutionSample"):
        thread = event["values"]["sampledThread"]["javaName"] or "?"
        if args.thread not in thread:
            continue
        samples += 1
        threads[thread] += 1
        frames = event["values"]["stackTrace"]["frames"][:args.depth]
        methods.update({frame_name(frame) for frame in frames})
    print(f"{samples} samples")
    for thread, n in threads.most_common(args.top):
        print(f"  {n:6d}  {thread}")
    print(f"methods in the top {args.depth} frames, share of samples:")
    for method, n in methods.most_common(args.top):
        print(f"  {100 * n / max(samples, 1):5.1f}%  {method}")
    started = Counter(" ".join(e["values"]["command"].split()[:2])
                      for e in events(args.file, "jdk.ProcessStart"))
    print("processes started:", dict(started.most_common(args.top)))
    names = Counter(e["values"]["thread"]["javaName"].rstrip("0123456789")
                    for e in events(args.file, "jdk.ThreadStart"))
    print("threads started:", dict(names.most_common(args.top)))


if __name__ == "__main__":
    main()
