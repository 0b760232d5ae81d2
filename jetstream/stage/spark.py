"""A site's Spark: its settings, and its session as a site, the lab's baselines and its
benchmarks start one."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = ["DEFAULT_SPARK_CONF", "REPLAY_SPARK_CONF", "session_builder", "started", "stop_quietly"]

log = logging.getLogger(__name__)

#: How many times a site launches its Spark JVM before it gives up.
SPARK_START_ATTEMPTS = 3


def _checkpoint_file_manager() -> dict[str, str]:
    """Spark's checkpoint file manager on Hadoop's FileSystem API, under the name the
    installed pyspark has it (its package moved in Spark 4.1); none if it has neither."""
    spec = importlib.util.find_spec("pyspark")
    jars = Path(spec.origin).parent / "jars" if spec and spec.origin else None
    for jar in sorted(jars.glob("spark-sql_*.jar")) if jars else ():
        with contextlib.suppress(OSError, zipfile.BadZipFile), zipfile.ZipFile(jar) as z:
            names = set(z.namelist())
            for package in ("checkpointing.", ""):
                name = ("org.apache.spark.sql.execution.streaming."
                        f"{package}FileSystemBasedCheckpointFileManager")
                if f"{name.replace('.', '/')}.class" in names:
                    return {"spark.sql.streaming.checkpointFileManagerClass": name}
    return {}


# A heap that starts small (the JVM's default start is 1/64 of the machine's memory) and
# gives back what it frees (the serial collector), a smaller code cache: the demo's three
# JVMs peaked at 3.0 GB with Spark's defaults, 1.9 GB with these (scripts/demo_memory.py,
# docs/benchmarks.md). (Not smaller thread stacks: -Xss512k overflowed in java.util.regex on
# URLs.)
_JVM = ("-Xms32m -XX:+UseSerialGC -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30 "
        "-XX:ReservedCodeCacheSize=48m")
# A live site's JVM compiles with C1 only: a micro-batch calls thousands of Spark's planning
# methods a few times each, and the optimising compiler (C2) kept compiling them for minutes,
# on cores the other sites share. With C1 only, at 3,000 records/s a site, ours and the
# plain-Spark baseline each spent a sixth less CPU and answered sooner (docs/benchmarks.md,
# "C1 for live sites").
_LIVE_JIT = "-XX:TieredStopAtLevel=1"
# A replay reads a whole input in large batches, whose per-row loops C2 compiles to run about
# twice as fast as C1's code; it takes a method only after far more calls than by default
# (100,000 rather than 5,000; or 12,000 with 120,000 calls and loop iterations together),
# so that the long tail of planning methods stays with C1 ("Eleventh run").
_REPLAY_JIT = ("-XX:Tier4InvocationThreshold=100000 -XX:Tier4MinInvocationThreshold=12000 "
               "-XX:Tier4CompileThreshold=120000")

#: A site's Spark settings where neither its topology (``spark_conf``) nor ``jetstream site
#: --spark-conf`` says otherwise; values are strings, as Spark reads them.
DEFAULT_SPARK_CONF: Mapping[str, str] = MappingProxyType({
    "spark.ui.enabled": "false",  # no web UI: several site JVMs share one machine's ports
    "spark.ui.showConsoleProgress": "false",  # no progress bars in the site's log
    "spark.ui.retainedJobs": "50",  # a stage runs for days: keep few past jobs, not 1,000
    "spark.ui.retainedStages": "50",  # likewise for stages
    "spark.sql.ui.retainedExecutions": "20",  # likewise for SQL executions
    "spark.sql.streaming.numRecentProgressUpdates": "20",  # likewise for batch progress
    # About the cores of a small site: 1 or 2, under local[1] or local[2], measured within
    # noise of each other on 3,000-record micro-batches (docs/benchmarks.md).
    "spark.sql.shuffle.partitions": "2",
    # The whole local stage lives in the driver's JVM; 512m is the least Spark starts with.
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": f"{_JVM} {_LIVE_JIT}",
    "spark.sql.adaptive.enabled": "false",  # micro-batches are tiny; AQE re-plans each one
    # The offset, commit and source logs written through Hadoop's FileSystem rather than its
    # FileContext, whose local rename runs `readlink` in a child process for every file
    # (pyspark ships no native Hadoop library): a live micro-batch's writes of its offset and
    # commit logs took about 70 ms, now about 20 ms (docs/benchmarks.md).
    **_checkpoint_file_manager(),
    # Local files without Hadoop's checksum files: without a native Hadoop library, every file
    # Hadoop creates on the local file system has its mode set by a `chmod` child process
    # (about 5 ms), the checksum file its own. A micro-batch writes three checkpoint files;
    # this takes three `chmod`s off each, about 15 ms (scripts/bench_live_batch.py).
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    # The file source's log keeps an entry for every file a stream ever read (about 150
    # bytes; Spark never drops one) and, every this many micro-batches, writes them all
    # into one file again (Spark's default is 10): after a day at two files a second, 26 MB
    # every ten batches. Every 1,000 batches, a batch's share of the rewriting is a
    # hundredth of that, and a restart reads at most a thousand small files after the last.
    "spark.sql.streaming.fileSource.log.compactInterval": "1000",
})
#: A replaying site's (``SiteOptions.replay``): ``DEFAULT_SPARK_CONF`` with the JVM's
#: compiler set for large batches.
REPLAY_SPARK_CONF: Mapping[str, str] = MappingProxyType(
    {**DEFAULT_SPARK_CONF, "spark.driver.extraJavaOptions": f"{_JVM} {_REPLAY_JIT}"})


def session_builder(master: str, app: str, conf: Mapping[str, str]) -> Any:
    """A ``SparkSession`` builder for ``master`` named ``app``, with the settings ``conf``
    (say ``DEFAULT_SPARK_CONF`` under a site's own); settings of the JVM itself, such as
    ``spark.driver.memory``, count only if it starts the JVM."""
    from pyspark.sql import SparkSession  # Spark loads only where a session is made

    builder = SparkSession.builder.master(master).appName(app)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder


def started(builder: Any, who: str) -> Any:
    """The builder's session, its JVM launched again if the launch fails: a JVM forked while
    gRPC's threads run can exit before it reports its port (``JAVA_GATEWAY_EXITED``, seen
    in bench runs and CI), and a site that gives up on Spark reads nothing. ``who`` names
    the process in the log (``site ams``, ``the bench's baseline``)."""
    for attempt in range(1, SPARK_START_ATTEMPTS + 1):
        try:
            return builder.getOrCreate()
        except Exception as e:
            if attempt == SPARK_START_ATTEMPTS:
                raise
            log.warning("%s: Spark's JVM did not start (%s): launching it again (%d "
                        "of %d)", who, str(e).strip().splitlines()[0][:300], attempt + 1,
                        SPARK_START_ATTEMPTS)
            time.sleep(attempt)
    raise AssertionError("unreachable")


#: How long a site's Spark waits at a stop for the tasks of cancelled jobs to report back.
QUIET_STOP_S = 5.0


def stop_quietly(spark: Any, wait_s: float = QUIET_STOP_S) -> None:
    """Stop ``spark`` once no task of it runs: its jobs cancelled, then (for at most
    ``wait_s``) until every task has reported back. A task of a job that a stopped stream
    interrupted can report after the scheduler's result threads are gone, and Spark then
    logs a RejectedExecutionException with its stack trace at ERROR, in a site that stopped
    as it was asked to."""
    context = spark.sparkContext
    with contextlib.suppress(Exception):  # a JVM already gone: nothing runs, stop anyway
        context.cancelAllJobs()
        tracker = context._jsc.sc().statusTracker()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (
                tracker.getActiveStageIds() or
                sum(info.numRunningTasks() for info in tracker.getExecutorInfos())):
            time.sleep(0.05)
    spark.stop()
