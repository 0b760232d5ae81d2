"""Warming a live stage up before its stream starts.

A site's JVM is fresh when its first stage is deployed: the first few dozen micro-batches run
slowly while the JVM compiles Spark's planner, the CSV reader, the code Spark generates for
the stage's plan and the streaming engine around them (in the latency benchmark, the first
three windows took 1.4-2.9 s against 0.7 s later). :func:`warm_up` runs that same work ahead
of the stream: a copy of the stage, its windows thrown away, streams from a scratch folder
with the live trigger, and a made-up file of the source's schema lands there as soon as
the last one was read. Every part of a live micro-batch runs: listing the folder, the offset
and commit logs, the CSV reader, the plan, the call into Python, the window bookkeeping. The
stream then starts with that code compiled; nothing of the warm-up reaches the site's
windows, counters or folders.
"""

from __future__ import annotations

import csv
import json
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jetstream.dsl import Query
from jetstream.formats import DEFAULT_FORMAT, FORMATS
from jetstream.schema import DataType, Schema
from jetstream.stage.check import Chain, source_of

__all__ = ["WARM_UP_S", "WarmUp", "made_up_records", "warm_up"]

#: How long a site warms a stage up by default (``jetstream site --warm-up``). Micro-batches
#: keep getting faster for about a hundred of them: alone on this 2-core machine, 4.6 s
#: the first, a median of 0.69 s over the first ten, 0.32 s over the fifth ten, 0.21-0.25 s
#: from about the hundredth on (scripts/bench_warm_up.py); three JVMs warming up together
#: run about one a second each. No rule tells "warm" from the batch times early: "none of
#: five faster than the fastest before", as they came and went with the other JVMs,
#: stopped after 13-15 batches of 0.9-1.6 s.
WARM_UP_S = 15.0
#: Records in a warm-up batch: about what a live micro-batch of a busy site reads.
RECORDS = 200
#: How far back the made-up event times reach.
SPREAD_MS = 30_000


@dataclass(frozen=True)
class WarmUp:
    seconds: float  # how long it took
    times: tuple[float, ...] = ()  # each micro-batch's, from its file landing to its end
    failure: str = ""  # why it stopped early, if a batch failed
    again: bool = False  # none ran: this JVM warmed this query's stage up before

    @property
    def batches(self) -> int:
        return len(self.times)

    @property
    def first_s(self) -> float:
        return self.times[0] if self.times else 0.0

    @property
    def last_s(self) -> float:
        return self.times[-1] if self.times else 0.0


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
            seconds: float = WARM_UP_S, batches: int | None = None,
            trigger_s: float | None = None,
            stopping: Callable[[], bool] = lambda: False) -> WarmUp:
    """Stream the stage of ``chain`` from ``scratch`` (emptied, then removed) with the live
    trigger (``trigger_s``; the stage's default if None), a file of made-up records at a
    time, landing none after ``seconds``, after ``batches`` (if given) or once ``stopping()``.
    A batch's time is from its file landing to the stage's end of it, as a live window's
    would be.

    A batch that fails ends the warm-up and is reported in :attr:`WarmUp.failure`, not
    raised: a query's ``map`` may refuse made-up values, and the live stage is what counts.
    A query whose stage of the same source this JVM warmed up before runs none again.
    """
    from jetstream.stage.job import DEFAULT_TRIGGER_S, LocalStage  # Spark loads only here

    source = source_of(chain)
    schema = source.schema
    key = (spark.sparkContext.applicationId, query.name, source.name)
    with _lock:
        if key in _warmed:  # a stage started again (a new plan version, a restart)
            return WarmUp(0.0, again=True)
        _warmed.add(key)
    shutil.rmtree(scratch, ignore_errors=True)
    folder, landing = scratch / "input", scratch / "landing"
    folder.mkdir(parents=True)
    landing.mkdir()
    began = time.monotonic()
    times: list[float] = []
    failure = ""
    read = threading.Semaphore(0)  # released at the end of each micro-batch
    stage = None
    try:
        stage = LocalStage(spark, query, folder, chain=chain, emit=_drop,
                           on_batch=lambda *_: read.release(),
                           checkpoint_dir=scratch / "checkpoint",
                           quarantine_dir=scratch / "quarantine")
        stream = stage.start(DEFAULT_TRIGGER_S if trigger_s is None else trigger_s)
        while (time.monotonic() - began < seconds and not stopping()
               and (batches is None or len(times) < batches)):
            landed = _land(schema, source.format or DEFAULT_FORMAT, landing, folder, len(times))
            while not read.acquire(timeout=0.1):
                if not stream.isActive:
                    raise stream.exception() or RuntimeError("the warm-up's stream stopped")
                if stopping():
                    break
            else:
                times.append(time.monotonic() - landed)
    except Exception as e:  # reported: the live stage runs regardless
        lines = str(e).strip().splitlines()
        failure = f"{type(e).__name__}: {lines[0][:300] if lines else ''}"
    finally:
        if stage is not None:
            stage.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return WarmUp(time.monotonic() - began, tuple(times), failure)


def _land(schema: Schema, format: str, landing: Path, folder: Path, n: int) -> float:
    """Write a file of made-up records, in ``format``, and move it into ``folder``, as a log
    shipper does; return when it landed (``time.monotonic()``)."""
    records = made_up_records(schema, RECORDS, time.time_ns() // 1_000_000, seed=n)
    path = landing / f"made-up-{n:05d}{FORMATS[format][0]}"
    if format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({f.name: [f.dtype.parse(r[i]) for r in records]
                                 for i, f in enumerate(schema)}), path)
    elif format == "json":  # a JSON string of each value's text: read from text anyway
        path.write_text("".join(json.dumps(dict(zip(schema.names, r, strict=True))) + "\n"
                                for r in records))
    else:
        with path.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(schema.names)
            writer.writerows(records)
    path.rename(folder / path.name)
    return time.monotonic()


def _drop(*_: Any, **__: Any) -> None:
    """Where a warm-up's windows go: nowhere."""
