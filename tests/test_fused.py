"""The stages of one folder fused into one Spark plan (``jetstream.stage.fused``) group a
batch's records as each stage's own plan does: the same rows, stage by stage, and the same
counters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Observation
from pyspark.sql import functions as F

import jetstream as js
from jetstream import col
from jetstream.approx.summaries import datasketches
from jetstream.errors import PlanError
from jetstream.lab.load_bench import QUERIES
from jetstream.lab.loggen import LogSpec, write_logs
from jetstream.stage.batches import batch_counters, read_files
from jetstream.stage.fused import FusedPlan
from jetstream.stage.job import LocalStage

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
POPS = js.Table("pops", js.Schema.of({"pop": js.DataType.STRING, "region": js.DataType.STRING}),
                 tuple({"pop": p, "region": r} for p, r in (("sfo", "us"), ("ams", "eu"))))


def _tag(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "tag": record["domain"][:3].upper()}


#: Beyond the load bench's six: a sliding window, a sum of doubles (banded), a select, a
#: map, joins inner and left, min and max.
MORE = [
    js.Query("sliding", LOGS.where(col("status") >= 300)
             .window(js.sliding("10s", every="5s"), watermark="3s").group_by("status")
             .agg(n=js.count(), lat=js.sum(col("latency_ms") * 0.37), hi=js.max("latency_ms"))),
    js.Query("selected", LOGS.select(d=col("domain"), b=col("bytes"), ts=col("ts"))
             .window(js.tumbling("5s"), watermark="2s").group_by("d")
             .agg(n=js.count(), lo=js.min("b"), kb=js.avg(col("b") / 1024))),
    js.Query("mapped", LOGS.map(_tag, name="tag", schema={
        **{f.name: f.dtype for f in js.CDN_LOG_SCHEMA}, "tag": js.DataType.STRING})
             .window(js.tumbling("10s"), watermark="5s")
             .group_by("tag").agg(n=js.count(), hi=js.max("status"))),
    js.Query("inner", LOGS.join(POPS, on="pop").window(js.tumbling("10s"), watermark="5s")
             .group_by("region").agg(n=js.count(), lo=js.min("latency_ms"))),
    js.Query("left", LOGS.join(POPS, on="pop", how="left")
             .window(js.tumbling("10s"), watermark="5s").group_by("region")
             .agg(n=js.count())),
]


def _stage(spark: Any, query: js.Query, tmp: Path, k: int) -> LocalStage:
    return LocalStage(spark, js.optimize(query), tmp / "in" / "sfo",
                      checkpoint_dir=tmp / f"checkpoint-{k}", quarantine_dir=tmp / "quarantine",
                      emit=lambda *_: None)


def _comparable(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row with each sketch read as its estimate (a sketch's bytes depend on the order
    its values came in)."""
    ds = datasketches()
    out = []
    for v in row:
        if isinstance(v, bytes | bytearray):
            try:
                v = ("hll", round(ds.hll_sketch.deserialize(bytes(v)).get_estimate(), 6))
            except Exception:  # not an HLL sketch: a KLL one
                kll = ds.kll_doubles_sketch.deserialize(bytes(v))
                v = ("kll", kll.n, kll.get_min_value(), kll.get_max_value())
        elif isinstance(v, list):
            v = tuple(sorted(v, key=repr))
        out.append(v)
    return tuple(out)


def test_the_fused_plan_groups_each_stages_rows_as_its_own_plan_does(
        spark: Any, tmp_path: Path) -> None:
    write_logs(tmp_path / "in", ["sfo"], start_ms=1_700_000_000_000, duration_s=40, rate=40,
               spec=LogSpec(domains=50, late_fraction=0.05, late_s=12.0), files=4)
    bad = tmp_path / "in" / "sfo" / "part-bad.csv"
    bad.write_text(",".join(js.CDN_LOG_SCHEMA.names) + "\nnot,a,record\n")
    stages = [_stage(spark, q, tmp_path, k) for k, q in enumerate([*QUERIES, *MORE])]
    paths = sorted(str(p) for p in (tmp_path / "in" / "sfo").iterdir())
    raw = read_files(spark, paths, stages[0].layout)

    plan = FusedPlan(stages)
    prepared = plan.prepare(stages[0].typed(raw))
    observed = Observation("fused")
    counted = prepared.observe(observed, *batch_counters(F.col("_q") == -1))  # a record's row
    fused = plan.split(plan.grouped(counted).collect())

    for stage, rows in zip(stages, fused, strict=True):
        planned = stage.plan(stage.prepare(raw), None)
        own = [tuple(r) for r in planned.grouped.collect()
               if r[0] is not None]  # (a record not kept: a row of no window)
        assert own, stage.name
        assert sorted(map(_comparable, rows), key=repr) == sorted(
            map(_comparable, own), key=repr), stage.name
        counters = {k: sorted(v) if isinstance(v, list) else v
                    for k, v in planned.observation.get.items()}
        assert counters == {k: sorted(v) if isinstance(v, list) else v
                            for k, v in observed.get.items()}, stage.name
    assert observed.get["records"] == 4 * 10 * 40 and observed.get["wrong field count"] == 1


def test_a_frequent_items_sketch_is_not_fused(spark: Any, tmp_path: Path) -> None:
    items = js.Query("items", LOGS.window(js.tumbling("10s"), watermark="5s")
                     .agg(top=js.top_k("url", 3)))
    with pytest.raises(PlanError, match="counts items in a job of its own"):
        FusedPlan([_stage(spark, items, tmp_path, 0)])
