"""Tracing a window's path (:mod:`jetstream.trace`) and reading the trace back
(``scripts/trace_windows.py``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jetstream as js
from jetstream import trace
from tests.conftest import log
from tests.test_spark_stage import LOGS, run_stage_on_records

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(trace.ENV, "1")
    assert trace.enable_from_env()
    yield
    trace.log.setLevel(logging.NOTSET)


def test_tracing_is_off_unless_the_environment_asks(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    for off in (None, "", "0"):
        if off is None:
            monkeypatch.delenv(trace.ENV, raising=False)
        else:
            monkeypatch.setenv(trace.ENV, off)
        assert not trace.enable_from_env()
        trace.mark("publish", end=10)
    assert not [r for r in caplog.records if r.name == "jetstream.trace"]


def test_a_stage_marks_each_batch_with_its_watermark(
        traced: None, spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="jetstream.trace")
    query = js.Query("traced", LOGS.window(js.tumbling("10s"), watermark="5s")
                     .group_by("pop").agg(n=js.count()))
    run_stage_on_records(spark, query, [[log(1_000, pop="a")], [log(21_000, pop="b")]],
                         tmp_path)
    batches = [r.getMessage() for r in caplog.records
               if r.name == "jetstream.trace" and r.getMessage().startswith("batch ")]
    assert len(batches) == 2
    assert "query=traced batch=0 " in batches[0] and "watermark=-4000 " in batches[0]
    assert "batch=1 " in batches[1] and "watermark=16000 " in batches[1]
    start, collected, t = (float(batches[1].split(f"{k}=")[1].split()[0])
                           for k in ("start", "collected", "t"))
    assert start <= collected <= t


def test_the_script_measures_each_step_from_the_close(tmp_path: Path) -> None:
    # Two sites; the window [0, 10 s) closes when a record stamped 15 s or later lands at
    # both: at 100.0 at the edge, 100.2 at the root, so its close is 100.2.
    for site, landed in (("edge", 100.0), ("root", 100.2)):
        folder = tmp_path / "input" / site
        folder.mkdir(parents=True)
        for name, ts, at in (("a.csv", 9_000, landed - 1), ("b.csv", 15_500, landed)):
            path = folder / name
            path.write_text(f"ts,k\n{ts},x\n")
            os.utime(path, (at, at))
    logs = tmp_path / "logs"
    logs.mkdir()
    line = "2026-11-27 07:00:00,000 DEBUG jetstream.trace: {}\n"
    (logs / "edge.log").write_text("".join(line.format(m) for m in (
        "batch t=100.5 query=q batch=7 start=100.3 collected=100.45 watermark=10500 "
        "arrived=100000",)))
    (logs / "root.log").write_text("".join(line.format(m) for m in (
        "batch t=100.8 query=q batch=9 start=100.5 collected=100.75 watermark=10500 "
        "arrived=100200",
        "progress t=100.6 query=q site=root/root-1 origin=edge watermark=10500",
        "publish t=101.0 query=q site=root end=10000 covers=2 expected=2")))
    out = subprocess.run([sys.executable, "scripts/trace_windows.py", str(tmp_path),
                          "--skip", "0"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("1 windows")
    steps = {" ".join(line.split()[:-2]): float(line.split()[-2])
             for line in out.splitlines()[1:] if line.startswith("  ") and "window" not in line}
    assert steps == pytest.approx({
        "edge trigger": 0.05, "edge start": 0.1, "edge collected": 0.25, "edge handed on": 0.3,
        "edge heard": 0.4, "root trigger": 0.05, "root start": 0.3, "root collected": 0.55,
        "root handed on": 0.6, "published": 0.8}, abs=0.011)
