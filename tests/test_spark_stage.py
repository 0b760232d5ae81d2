"""The Spark local stage: real Spark over CSV files, against the reference executor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import jetstream as js
from jetstream.local import finish_from_partials
from jetstream.queryfile import load_query
from jetstream.stage.job import LocalStage

ROOT = Path(__file__).resolve().parent.parent
LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)


def run_stage(spark: Any, query: js.Query, site_dir: Path, tmp: Path) -> tuple[Any, Any]:
    """The optimized query's results from the stage's partials, and the stage's stats."""
    optimized = js.optimize(query)
    windows: dict[tuple[int, int], list[dict[str, Any]]] = {}
    stage = LocalStage(spark, optimized, site_dir, checkpoint_dir=tmp / "checkpoint",
                       quarantine_dir=tmp / "quarantine",
                       emit=lambda w, rows, events: windows.setdefault(w, []).extend(rows))
    stats = stage.run_available()
    return finish_from_partials(optimized, windows), stats


def test_cdn_top_k_equals_the_reference(spark: Any, tmp_path: Path) -> None:
    query = load_query(ROOT / "examples" / "cdn_topk.py")
    site = ROOT / "examples" / "logs" / "sfo"
    got, stats = run_stage(spark, query, site, tmp_path)
    want = js.run_local(query, site)
    assert got == want
    assert stats.records_in == want.stats.records_in
    assert stats.malformed == {"wrong field count": 1}  # the sample's broken line
    quarantined = [json.loads(line) for f in (tmp_path / "quarantine").glob("*.json")
                   for line in f.read_text().splitlines()]
    assert [q["reason"] for q in quarantined] == ["wrong field count"]
    assert quarantined[0]["line"].startswith("garbage line")


def test_every_splittable_aggregate_and_sliding_windows(spark: Any, tmp_path: Path) -> None:
    query = js.Query("q", LOGS.where(js.col("cache") == "HIT")
                     .with_column("kb", js.col("bytes") / 1024)
                     .window(js.sliding("20s", every="10s"), watermark="5s")
                     .group_by("pop")
                     .agg(n=js.count(), kb=js.sum("kb"), mean=js.avg("latency_ms"),
                          lo=js.min("status"), hi=js.max("bytes"), b=js.sum("bytes")))
    site = ROOT / "examples" / "logs" / "ams"
    got, _ = run_stage(spark, query, site, tmp_path)
    want = js.run_local(query, site)
    assert [(r.window_start, r.window_end) for r in got] == [
        (r.window_start, r.window_end) for r in want]
    for g, w in zip(got, want, strict=True):
        assert len(g.rows) == len(w.rows)
        for gr, wr in zip(g.rows, w.rows, strict=True):
            assert {k: v for k, v in gr.items() if k != "mean"} == {
                k: v for k, v in wr.items() if k != "mean"}
            assert gr["mean"] == pytest.approx(wr["mean"], rel=1e-12)  # Spark sums doubles


def test_sketches_from_spark_stay_within_their_bounds(spark: Any, tmp_path: Path) -> None:
    approx = js.Query("q", LOGS.window(js.tumbling("30s"), watermark="5s").agg(
        users=js.approx_count_distinct("client_ip"), p50=js.approx_quantile("latency_ms"),
        urls=js.top_k("domain", 3)))
    exact = js.Query("q", LOGS.window(js.tumbling("30s"), watermark="5s").agg(
        users=js.count_distinct("client_ip"), p50=js.quantile("latency_ms")))
    site = ROOT / "examples" / "logs" / "sin"
    got, _ = run_stage(spark, approx, site, tmp_path)
    truth = js.run_local(exact, site)
    assert len(got) == len(truth)
    for g, t in zip(got, truth, strict=True):
        assert not g.exact and g.error_bound is not None
        row, true = g.rows[0], t.rows[0]
        assert abs(row["users"] - true["users"]) <= g.error_bound * row["users"] + 1
        assert [u["item"] for u in row["urls"]] == [
            u["item"] for u in js.run_local(approx, site)[got.index(g)].rows[0]["urls"]]
