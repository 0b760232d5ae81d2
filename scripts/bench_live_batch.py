#!/usr/bin/env python3
"""What a live micro-batch of the local stage costs: Spark's phases and the JVM's CPU.

Usage: python scripts/bench_live_batch.py [--files 80] [--skip 20] [--lines 500]
       [--every 0.5] [--queries 1] [--streams] [--conf KEY=VALUE ...] [--hold 0]
       [--jfr FILE.jfr] [--backlog N [--read-files archive|keep]]
       [--folders N] [--master local[2]]

Starts one site's local stage for the CDN top-k query (a site's default Spark settings,
``DEFAULT_SPARK_CONF``, under ``--conf``) live on an empty folder — with ``--queries N``, the
stages of the first N of the load bench's standing queries, attached to one reader of the
folder as a site runs them (``--streams``: each on a stream of its own, as sites did before
the reader) — then renames a file of
``--lines`` log lines into it every ``--every`` seconds, ``--files`` times. Prints the medians of
Spark's phases over the last 15 batches that read records (``recentProgress``), the median
time of our ``foreachBatch``, and the CPU the JVM and this process spent per file after the
first ``--skip`` files, the JVM's split by thread (read from ``/proc``: Linux only).
``--jfr`` records those files with Java Flight Recorder (``jfr print`` reads the file;
``scripts/jfr_top.py`` sums its CPU samples by thread and method). ``--backlog N`` starts the
reader on a folder that already holds N earlier files of two lines each (an hour's worth a
3,600 files, ending before the live ones), says how long it took to read them, and only then
starts the live files; ``--read-files`` says what becomes of the files read (as ``jetstream
site --read-files``; archived by default, as a site does). ``--folders N`` runs N readers, each
on a folder of its own with its own stages, in this one JVM (as sites on one machine would
share one Spark), a file landing in every folder at once; it also prints, for the first
stage of each folder, how long each file took from landing to the end of the micro-batch
that read it (p50 / p95). Run it N times side by side with ``--folders 1 --master local[1]``
for N sites that each have their own Spark. (Several stages on a reader run as their fused
plan, :mod:`jetstream.stage.fused`; ``--streams`` runs a stream each.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_stage import write_logs
from pyspark.sql import SparkSession

import jetstream as js
from jetstream.lab.load_bench import QUERIES
from jetstream.stage.archive import Archive, ReadFiles
from jetstream.stage.job import DEFAULT_TRIGGER_S, LocalStage
from jetstream.stage.reader import SourceReader
from jetstream.stage.spark import DEFAULT_SPARK_CONF

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def thread_ticks(pid: int) -> Counter[str]:
    """CPU ticks of each thread of ``pid`` so far, by name with digits folded."""
    ticks: Counter[str] = Counter()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:  # the thread ended
            continue
        name = re.sub(r"[0-9]+", "N", stat[stat.index("(") + 1:stat.rindex(")")])
        fields = stat.rsplit(")", 1)[1].split()
        ticks[name] += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


def compilations(spark: SparkSession) -> int:
    """How many classes Spark's code generation has compiled in this JVM so far."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics  # type: ignore[union-attr]
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


def backlog(folder: Path, header: str, lines: list[str], files: int) -> None:
    """``files`` earlier files of two lines each in ``folder``, a second of event time apart,
    ending before the first of ``lines``."""
    first = int(lines[0].split(",", 1)[0])
    for i in range(files):
        ts = first - (files - i) * 1000
        body = "".join(f"{ts + k}," + lines[(2 * i + k) % len(lines)].split(",", 1)[1]
                       for k in range(2))
        (folder / f"earlier-{i:06d}.csv").write_text(header + body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=80)
    parser.add_argument("--skip", type=int, default=20,
                        help="files before CPU is counted (the JVM's warm-up)")
    parser.add_argument("--lines", type=int, default=500)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between files")
    parser.add_argument("--queries", type=int, default=1,
                        help="standing queries, 1 to 12 (the six, then the six again)")
    parser.add_argument("--streams", action="store_true",
                        help="a stream per query instead of one reader for all")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--hold", type=float, default=0.0,
                        help="the reader's gate holds a file up to this long (a site's "
                             "--batch-hold; 0, the default here: every file its own batch)")
    parser.add_argument("--backlog", type=int, default=0, metavar="N",
                        help="earlier files in the folder when the reader starts")
    parser.add_argument("--read-files", choices=("archive", "keep"), default="archive",
                        help="what becomes of a file once read (default: archive)")
    parser.add_argument("--folders", type=int, default=1,
                        help="readers on folders of their own, in this one JVM")
    parser.add_argument("--master", default="local[2]", help="Spark's master")
    parser.add_argument("--jfr", type=Path, metavar="FILE.jfr",
                        help="record the JVM with Java Flight Recorder over the counted files")
    args = parser.parse_args()
    if not 0 <= args.skip < args.files:
        parser.error("--skip must be at least 0 and below --files")
    if args.folders < 1 or (args.folders > 1 and (args.streams or args.backlog)):
        parser.error("--folders must be 1 or more, and 1 with --streams or --backlog")
    conf = dict(DEFAULT_SPARK_CONF) | dict(kv.split("=", 1) for kv in args.conf)
    builder = SparkSession.builder.master(args.master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    jvm = int(subprocess.check_output(["pgrep", "-P", str(os.getpid()), "java"]).split()[0])
    # Beyond the six, the six again under other names (as many dashboards' queries alike).
    queries = [js.optimize(js.Query(q.name if i < len(QUERIES) else f"{q.name}-{i}", q.stream,
                                    q.slo))
               for i, q in enumerate((QUERIES * 2)[:args.queries])]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_logs(work / "logs", args.files * args.lines, 2000)
        lines = [line for part in sorted((work / "logs").iterdir())
                 for line in part.read_text().splitlines(keepends=True)[1:]]
        header = (work / "logs" / "part-0000.csv").read_text().split("\n", 1)[0] + "\n"
        folders = [work / f"in-{k}" for k in range(args.folders)]
        for folder in folders:
            folder.mkdir()
            backlog(folder, header, lines, args.backlog)
        seconds: list[float] = []
        reached: list[list[tuple[float, int]]] = [[] for _ in folders]  # (when, latest)

        def on_batch(k: int, stage_of: list[LocalStage]) -> Callable[[Any, float], None]:
            def done(_: Any, took: float) -> None:
                if k == 0:
                    seconds.append(took)
                reached[k].append((time.time(), stage_of[0].windows.latest or 0))
            return done

        readers, every_stage = [], []
        for k, folder in enumerate(folders):
            stages: list[LocalStage] = []
            stages.extend(LocalStage(spark, query, folder,
                                     checkpoint_dir=work / f"checkpoint-{k}-{i}",
                                     quarantine_dir=work / "quarantine", emit=lambda *_: None,
                                     snapshot=work / f"stage-{k}-{i}.json",
                                     on_batch=on_batch(k, stages) if i == 0 else None)
                          for i, query in enumerate(queries))
            every_stage.extend(stages)
            if args.streams:
                streams = [stage.start() for stage in stages]
                stream = streams[0]
                continue
            archive = Archive(folder, work / f"archive-{k}", ReadFiles(args.read_files))
            reader = SourceReader(spark, folder, stages[0].layout, "ts",
                                  work / f"reader-{k}" / "checkpoint", DEFAULT_TRIGGER_S,
                                  hold_s=args.hold, archive=archive)
            readers.append(reader)
            began = time.monotonic()
            for stage in stages:
                reader.attach(stage)
            if args.backlog:
                while reader.gate.released < args.backlog or os.listdir(reader.gate.live):
                    time.sleep(0.1)
                took = time.monotonic() - began
                print(f"backlog: {args.backlog} files read in {took:.0f} s "
                      f"({args.backlog / took:.0f} files/s, {len(seconds)} micro-batches); "
                      f"{len(os.listdir(folder))} left in the folder, {archive.moved} taken "
                      f"out ({args.read_files})")
        if readers:
            assert readers[0]._stream is not None
            stream = readers[0]._stream
        jvm_before, ours_before, compiled_before = Counter[str](), 0.0, 0
        landed: list[tuple[float, int]] = []  # (when, its largest event time), counted files
        for i in range(args.files):
            if i == args.skip:
                jvm_before, ours_before = thread_ticks(jvm), sum(os.times()[:2])
                compiled_before = compilations(spark)
                if args.jfr:
                    subprocess.run(["jcmd", str(jvm), "JFR.start", "name=bench",
                                    "settings=profile", f"filename={args.jfr.resolve()}"],
                                   check=True, capture_output=True)
            part = lines[i * args.lines:(i + 1) * args.lines]
            for folder in folders:
                staged = work / f"f{i}.csv"
                staged.write_text(header + "".join(part))
                staged.rename(folder / staged.name)
            if i >= args.skip:
                landed.append((time.time(), max(int(line.split(",", 1)[0]) for line in part)))
            time.sleep(args.every)
        jvm_after, ours_after = thread_ticks(jvm), sum(os.times()[:2])
        time.sleep(3)  # the last files' micro-batches
        if args.jfr:
            subprocess.run(["jcmd", str(jvm), "JFR.stop", "name=bench"],
                           check=True, capture_output=True)
        compiled = compilations(spark) - compiled_before
        if not args.streams:
            print(f"after the live files: {len(os.listdir(folders[0]))} files in the folder")
        counted = args.files - args.skip
        progress = [json.loads(p.json) if hasattr(p, "json") else p
                    for p in stream.recentProgress]
        progress = [p for p in progress if p["numInputRows"] > 0][-15:]
        for stage in every_stage:
            stage.stop()
        for reader in readers:
            reader.stop()
    waits = sorted(next(t for t, latest in done if latest >= last) - at
                   for done in reached for at, last in landed
                   if any(latest >= last for _, latest in done))
    if waits:
        print(f"landing to read, {len(waits)} files: p50 {statistics.median(waits):.2f} s, "
              f"p95 {waits[int(0.95 * (len(waits) - 1))]:.2f} s")
    phases = sorted({k for p in progress for k in p["durationMs"]})
    print("Spark's phases, median ms:",
          {k: round(statistics.median(p["durationMs"].get(k, 0) for p in progress))
           for k in phases})
    print(f"foreachBatch (ours), median: {statistics.median(seconds[-15:]) * 1000:.0f} ms")
    per_file = {name: (ticks - jvm_before[name]) * 1000 / TICKS / counted
                for name, ticks in jvm_after.items()}
    print(f"CPU per file after the first {args.skip}: JVM {sum(per_file.values()):.0f} ms, "
          f"this process {(ours_after - ours_before) * 1000 / counted:.0f} ms")
    print(f"code generation: {compiled} classes compiled by Janino over the last {counted} files")
    print("JVM threads, ms per file:", {name: round(ms) for name, ms in
                                        sorted(per_file.items(), key=lambda kv: -kv[1])[:8]})
    spark.stop()


if __name__ == "__main__":
    main()
