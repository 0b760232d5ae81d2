#!/usr/bin/env python3
"""What a live micro-batch of the local stage costs: Spark's phases and the JVM's CPU.

Usage: python scripts/bench_live_batch.py [--files 80] [--skip 20] [--lines 500]
       [--every 0.5] [--queries 1] [--streams] [--conf KEY=VALUE ...] [--hold 0]
       [--jfr FILE.jfr] [--backlog N [--read-files archive|keep]]

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
site --read-files``; archived by default, as a site does).
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
from pathlib import Path

from bench_stage import write_logs
from pyspark.sql import SparkSession

import jetstream as js
from jetstream.lab.load_bench import QUERIES
from jetstream.runtime import DEFAULT_SPARK_CONF
from jetstream.stage.archive import Archive, ReadFiles
from jetstream.stage.job import DEFAULT_TRIGGER_S, LocalStage
from jetstream.stage.reader import SourceReader

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
    parser.add_argument("--queries", type=int, default=1, help="standing queries, 1 to 6")
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
    parser.add_argument("--jfr", type=Path, metavar="FILE.jfr",
                        help="record the JVM with Java Flight Recorder over the counted files")
    args = parser.parse_args()
    if not 0 <= args.skip < args.files:
        parser.error("--skip must be at least 0 and below --files")
    conf = dict(DEFAULT_SPARK_CONF) | dict(kv.split("=", 1) for kv in args.conf)
    builder = SparkSession.builder.master("local[2]")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    jvm = int(subprocess.check_output(["pgrep", "-P", str(os.getpid()), "java"]).split()[0])
    queries = [js.optimize(q) for q in QUERIES[:args.queries]]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_logs(work / "logs", args.files * args.lines, 2000)
        lines = [line for part in sorted((work / "logs").iterdir())
                 for line in part.read_text().splitlines(keepends=True)[1:]]
        header = (work / "logs" / "part-0000.csv").read_text().split("\n", 1)[0] + "\n"
        folder = work / "in"
        folder.mkdir()
        backlog(folder, header, lines, args.backlog)
        seconds: list[float] = []
        stages = [LocalStage(spark, query, folder, checkpoint_dir=work / f"checkpoint-{i}",
                             quarantine_dir=work / "quarantine", emit=lambda *_: None,
                             snapshot=work / f"stage-{i}.json",
                             on_batch=(lambda _, s: seconds.append(s)) if i == 0 else None)
                  for i, query in enumerate(queries)]
        if args.streams:
            streams = [stage.start() for stage in stages]
            stream = streams[0]
        else:
            archive = Archive(folder, work / "archive", ReadFiles(args.read_files))
            reader = SourceReader(spark, folder, stages[0].text_schema, "ts",
                                  work / "reader" / "checkpoint", DEFAULT_TRIGGER_S,
                                  hold_s=args.hold, archive=archive)
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
            stream = reader._stream
        jvm_before, ours_before, compiled_before = Counter[str](), 0.0, 0
        for i in range(args.files):
            if i == args.skip:
                jvm_before, ours_before = thread_ticks(jvm), sum(os.times()[:2])
                compiled_before = compilations(spark)
                if args.jfr:
                    subprocess.run(["jcmd", str(jvm), "JFR.start", "name=bench",
                                    "settings=profile", f"filename={args.jfr.resolve()}"],
                                   check=True, capture_output=True)
            staged = work / f"f{i}.csv"
            staged.write_text(header + "".join(lines[i * args.lines:(i + 1) * args.lines]))
            staged.rename(folder / staged.name)
            time.sleep(args.every)
        jvm_after, ours_after = thread_ticks(jvm), sum(os.times()[:2])
        if args.jfr:
            subprocess.run(["jcmd", str(jvm), "JFR.stop", "name=bench"],
                           check=True, capture_output=True)
        compiled = compilations(spark) - compiled_before
        if not args.streams:
            print(f"after the live files: {len(os.listdir(folder))} files in the folder")
        counted = args.files - args.skip
        progress = [json.loads(p.json) if hasattr(p, "json") else p
                    for p in stream.recentProgress]
        progress = [p for p in progress if p["numInputRows"] > 0][-15:]
        for stage in stages:
            stage.stop()
        if not args.streams:
            reader.stop()
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
