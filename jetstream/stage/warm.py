"""Warming a live stage up before its stream starts.

A site's JVM is fresh when its first stage is deployed: the first few dozen micro-batches run
slowly while the JVM compiles Spark's planner, the CSV reader and the code Spark generates for
the stage's plan (in the latency benchmark, the first three windows took 1.4-2.9 s against
0.7 s later). :func:`warm_up` runs that same work ahead of the stream: the stage's own plan,
read from CSV files by the same reader, over made-up records of the source's schema, on a
copy of the stage whose windows are thrown away. The stream then starts with the code
compiled; nothing of the warm-up reaches the site's windows, counters or folders.
"""

from __future__ import annotations

import csv
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jetstream.dsl import Query
from jetstream.schema import DataType, Schema
from jetstream.stage.check import Chain, source_of

__all__ = ["PATIENCE", "WARM_UP_BATCHES", "WARM_UP_S", "WarmUp", "made_up_records", "warm_up"]

#: At most this many warm-up batches run...
WARM_UP_BATCHES = 40
#: ...none starts after this many seconds...
WARM_UP_S = 15.0
#: ...and they stop once this many in a row were no faster than the fastest before them.
#: (Alone on this 2-core machine, batches of a cold JVM took 5.1 s, 0.9 s, then 0.3-0.8 s,
#: the best 0.26 s at the tenth, and 0.2 s only after forty: the rest warms up live.)
PATIENCE = 5
#: Records in a warm-up batch: about what a live micro-batch of a busy site reads.
RECORDS = 200
#: How far back the made-up event times reach.
SPREAD_MS = 30_000


@dataclass(frozen=True)
class WarmUp:
    batches: int  # warm-up batches run
    seconds: float  # how long they took
    first_s: float  # the first batch's time
    last_s: float  # the last batch's time
    failure: str = ""  # why it stopped early, if a batch failed
    again: bool = False  # none ran: this JVM warmed this query's stage up before


#: (Spark application, query, source) of the stages warmed up in this process.
_warmed: set[tuple[str, str, str]] = set()
_lock = threading.Lock()


def made_up_records(schema: Schema, n: int, now_ms: int, seed: int = 0) -> list[list[str]]:
    """``n`` records of ``schema`` as the text of CSV fields, each value one its column's
    type parses: event times in the last ``SPREAD_MS`` before ``now_ms``, numbers from a
    small range (so that comparisons in a query's ``where`` go both ways), strings from a
    few dozen (so that groups repeat)."""
    rng = random.Random(seed)

    def value(name: str, dtype: DataType) -> str:
        if name == schema.event_time:
            return str(now_ms - rng.randrange(SPREAD_MS))
        if dtype is DataType.INT:
            return str(rng.randrange(1000))
        if dtype is DataType.FLOAT:
            return repr(rng.uniform(0, 1000))
        if dtype is DataType.BOOL:
            return rng.choice(("true", "false"))
        return f"{name}-{rng.randrange(40)}"

    return [[value(f.name, f.dtype) for f in schema] for _ in range(n)]


def warm_up(spark: Any, query: Query, chain: Chain, scratch: Path, *,
            batches: int = WARM_UP_BATCHES, seconds: float = WARM_UP_S,
            stopping: Callable[[], bool] = lambda: False) -> WarmUp:
    """Run the stage of ``chain`` over made-up records in ``scratch`` (emptied, then removed)
    up to ``batches`` times, until its batches get no faster (``PATIENCE``), starting none
    after ``seconds`` or once ``stopping()``.

    A batch that fails ends the warm-up and is reported in :attr:`WarmUp.failure`, not
    raised: a query's ``map`` may refuse made-up values, and the live stage is what counts.
    A query whose stage of the same source this JVM warmed up before runs none again.
    """
    from jetstream.stage.job import LocalStage  # Spark loads only where a stage runs

    source = source_of(chain)
    schema = source.schema
    key = (spark.sparkContext.applicationId, query.name, source.name)
    with _lock:
        if key in _warmed:  # a stage started again (a new plan version, a restart)
            return WarmUp(0, 0.0, 0.0, 0.0, again=True)
        _warmed.add(key)
    shutil.rmtree(scratch, ignore_errors=True)
    folder = scratch / "input"
    folder.mkdir(parents=True)
    with (folder / "made-up.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(schema.names)
        writer.writerows(made_up_records(schema, RECORDS, time.time_ns() // 1_000_000))
    began = time.monotonic()
    times: list[float] = []
    failure = ""
    try:
        stage = LocalStage(spark, query, folder, chain=chain, emit=_drop,
                           checkpoint_dir=scratch / "checkpoint",
                           quarantine_dir=scratch / "quarantine")
        while (len(times) < batches and time.monotonic() - began < seconds
               and not stopping() and not _settled(times)):
            started = time.monotonic()
            stage.process_batch(stage.read_folder(), len(times))
            times.append(time.monotonic() - started)
    except Exception as e:  # reported: the live stage runs regardless
        lines = str(e).strip().splitlines()
        failure = f"{type(e).__name__}: {lines[0][:300] if lines else ''}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return WarmUp(len(times), time.monotonic() - began, times[0] if times else 0.0,
                  times[-1] if times else 0.0, failure)


def _settled(times: list[float]) -> bool:
    """Whether the last ``PATIENCE`` batches were none faster than the fastest before them."""
    return len(times) > PATIENCE and min(times[-PATIENCE:]) >= min(times[:-PATIENCE])


def _drop(*_: Any, **__: Any) -> None:
    """Where a warm-up's windows go: nowhere."""
