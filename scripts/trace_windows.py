#!/usr/bin/env python3
"""Where a window's latency goes: each step of its path, read from a traced run's logs.

Usage: python scripts/trace_windows.py FOLDER [--trigger 0.25] [--watermark 5] [--skip 20]
                                              [--slowest 5]

``FOLDER`` is a live run's folder with ``logs/<site>.log`` (each site's log, its workers'
lines included) and ``input/<site>/*.csv`` (the live files, landed at their modification
time), as ``JETSTREAM_TRACE=1 sudo jetstream bench --emulate --only jetstream --out OUT``
leaves in ``OUT/latency-jetstream`` (see :mod:`jetstream.trace`). For every window the root
published with every site in it, the steps are measured from the moment the window could
close (the latency bench's ``window_closes``: when the last site received the record that
moves its watermark past the window's end), at each site for the micro-batch whose
watermark passed the window's end:

- ``trigger``: the first trigger of the site's stream after the batch's earliest file landed
  (Spark's triggers fall on multiples of ``--trigger`` since the epoch);
- ``start``: our ``foreachBatch`` began (Spark listed the folder, logged the offsets and
  planned the batch in between);
- ``collected``: the batch's Spark job was done;
- ``handed on``: the window was handed on (closed) by the stage;
- ``heard``: another site's run heard that the site's watermark passed the window's end;

and ``published``: the root published the window. Prints each step's p50 / p95 over the
windows, then the slowest windows step by step.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from jetstream.lab.latency_bench import Landing, window_closes

LINE = re.compile(r"jetstream\.trace: (\w+) t=(\S+) (.*)$")


@dataclass(frozen=True)
class Mark:
    step: str
    t: float
    fields: dict[str, str]
    log: str  # the log's site

    def number(self, key: str) -> float | None:
        value = self.fields.get(key, "None")
        return None if value == "None" else float(value)


def read_marks(logs: Path) -> list[Mark]:
    marks = []
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if match := LINE.search(line):
                step, t, rest = match.groups()
                fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
                marks.append(Mark(step, float(t), fields, path.stem))
    return marks


def steps_of(marks: list[Mark], closes: dict[int, float], trigger_s: float,
             ) -> dict[int, dict[str, float]]:
    """Each window's steps, in seconds after its close."""
    published = {}
    for m in marks:
        if (m.step == "publish" and m.fields["covers"] == m.fields["expected"]
                and int(m.fields["end"]) not in published):
            published[int(m.fields["end"])] = m.t
    batches: dict[str, list[Mark]] = defaultdict(list)
    heard: dict[str, list[Mark]] = defaultdict(list)
    for m in marks:
        if m.step == "batch":
            batches[m.log].append(m)
        elif m.step == "progress" and m.fields["site"].split("/")[0] != m.fields["origin"]:
            heard[m.fields["origin"]].append(m)
    out: dict[int, dict[str, float]] = {}
    for end, at in sorted(published.items()):
        close = closes.get(end)
        if close is None:
            continue
        steps = {"published": at - close}
        for site, runs in batches.items():
            batch = next((b for b in runs if (b.number("watermark") or -1) >= end), None)
            if batch is None:
                continue
            arrived = (batch.number("arrived") or 0) / 1000
            trigger = (arrived // trigger_s + 1) * trigger_s
            steps[f"{site} trigger"] = trigger - close
            steps[f"{site} start"] = (batch.number("start") or 0) - close
            steps[f"{site} collected"] = (batch.number("collected") or 0) - close
            steps[f"{site} handed on"] = batch.t - close
            told = [h.t for h in heard.get(site, ()) if (h.number("watermark") or -1) >= end
                    and h.t >= batch.t - 1]
            if told:
                steps[f"{site} heard"] = min(told) - close
        out[end] = steps
    return out


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--trigger", type=float, default=0.25,
                        help="the stages' trigger interval, seconds (default: 0.25)")
    parser.add_argument("--watermark", type=float, default=5.0,
                        help="the query's watermark delay, seconds (default: 5)")
    parser.add_argument("--skip", type=float, default=20.0,
                        help="leave out windows that close in the run's first S seconds")
    parser.add_argument("--slowest", type=int, default=5, help="windows shown step by step")
    args = parser.parse_args()
    logs, inputs = args.folder / "logs", args.folder / "input"
    marks = read_marks(logs)
    if not marks:
        sys.exit(f"no trace lines in {logs}/*.log: run the cluster with JETSTREAM_TRACE=1")
    sites = sorted(p.name for p in inputs.iterdir() if p.is_dir())
    landings = []
    for site in sites:
        for path in (inputs / site).glob("*.csv"):
            with contextlib.suppress(ValueError, StopIteration):  # empty, or a header only
                landings.append(Landing.of_file(path))
    if not landings:
        sys.exit(f"no live files with records in {inputs}/<site>/*.csv")
    first = min(landing.at for landing in landings)
    ends = {int(m.fields["end"]) for m in marks if m.step == "publish"}
    closes = {end: at for end, at in window_closes(landings, sites, ends,
                                                   int(args.watermark * 1000)).items()
              if at >= first + args.skip}
    windows = steps_of(marks, closes, args.trigger)
    names = sorted({k for steps in windows.values() for k in steps},
                   key=lambda k: statistics.median(s[k] for s in windows.values() if k in s))
    print(f"{len(windows)} windows; seconds after close, p50 / p95:")
    for name in names:
        values = [s[name] for s in windows.values() if name in s]
        print(f"  {name:22s} {_q(values, 0.5):6.2f} {_q(values, 0.95):6.2f}")
    print("the slowest windows:")
    for end, steps in sorted(windows.items(), key=lambda kv: -kv[1]["published"])[:args.slowest]:
        print(f"  window ending {end}: " + ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(steps.items(), key=lambda kv: kv[1])))


if __name__ == "__main__":
    main()
