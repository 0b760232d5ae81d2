"""`jetstream bench --quick` end to end: both systems on the same generated logs, one report."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jetstream.cli import main
from jetstream.errors import PlanError
from jetstream.lab.baseline import Receiver, ship
from jetstream.lab.latency_bench import (
    Landing,
    LatencyPhase,
    WindowLatency,
    run_latency,
    window_closes,
)
from jetstream.queryfile import load_query

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cdn_topk.py"


def test_bench_quick_compares_jetstream_with_the_backhaul(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    run = subprocess.run([sys.executable, "-m", "jetstream", "bench", "--quick", "--out",
                          str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())
    total = report["total"]
    assert report["sites"] == ["ams", "sfo", "sin"] and len(report["windows"]) >= 3
    # The same records cross the wide area as partials or as gzipped raw logs.
    assert 0 < total["jetstream_bytes"] < total["backhaul_bytes"] < total["raw_bytes"]
    # No exact top-k ships less than each edge site's own top k rows.
    assert 0 < total["lower_bound_bytes"] <= total["jetstream_bytes"]
    assert "the lower bound (each edge site's top k rows a window)" in run.stderr
    assert total["jetstream_windows_missing"] == 0
    assert total["jetstream_windows_exact"] == len(report["windows"])
    assert total["jetstream_min_recall"] == 1.0
    assert total["backhaul_min_recall"] == 1.0  # over the windows its watermark let out
    speed = report["throughput_records_per_s"]
    assert speed["jetstream_local_stage"] > 0 and speed["backhaul_spark_job"] > 0
    assert (out / "bytes.png").read_bytes()[:4] == b"\x89PNG"
    assert "fewer than the backhaul" in run.stderr
    # Accuracy per degradation level: exact is exact, and every coarser level costs less.
    levels = report["levels"]
    assert levels[0] == {**levels[0], "level": "exact", "min_recall": 1.0, "max_error": 0.0}
    sizes = [entry["wan_bytes"] for entry in levels]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
    assert (out / "levels.png").read_bytes()[:4] == b"\x89PNG"


def test_the_backhaul_ships_whole_gzipped_files_over_tcp(tmp_path: Path) -> None:
    folder, inbox = tmp_path / "logs", tmp_path / "inbox"
    folder.mkdir()
    receiver = Receiver(("127.0.0.1", 0), inbox)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    stop = threading.Event()
    shipper = threading.Thread(target=ship, args=(folder, "sfo", receiver.server_address),
                               kwargs={"poll_s": 0.05, "stop": stop}, daemon=True)
    shipper.start()
    texts = {f"live-{i}.csv": f"ts,domain\n{i},d{i}.example.com\n" * (i + 1) for i in range(3)}
    try:
        for name, text in texts.items():  # as the generator does: whole files, one by one
            staged = tmp_path / f".{name}"
            staged.write_text(text)
            staged.rename(folder / name)
            time.sleep(0.1)
        deadline = time.monotonic() + 10
        while len(list(inbox.glob("*.gz"))) < len(texts) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        shipper.join(timeout=5)
        receiver.shutdown()
        receiver.server_close()
    landed = {p.name: gzip.decompress(p.read_bytes()).decode() for p in inbox.glob("*.gz")}
    assert landed == {f"sfo-{name}.gz": text for name, text in texts.items()}
    assert receiver.received == {"sfo": sum(p.stat().st_size for p in inbox.glob("*.gz"))}


def window(end_s: float, after_close_s: float, *, given: bool = True,
           recall: float | None = 1.0, reported_s: float | None = None) -> WindowLatency:
    """A window that closed 6 s after its end, as the CDN query's do (5 s watermark)."""
    return WindowLatency(end_s, end_s + 6, after_close_s + 6, after_close_s, given,
                         recall if given else None, reported_s)


def test_latency_percentiles_split_at_the_drop_and_count_missing_windows() -> None:
    phase = LatencyPhase("backhaul", drop_at_s=30, windows=[
        window(10, 0.5), window(20, 0.7), window(30, 0.9, recall=0.8),
        window(40, 25.0, given=False)])
    summary = phase.summary()
    close = summary["after_close"]
    # Split where the window closed: the one ending at 20 s closed at 26 s, before the drop.
    assert close["before_drop"] == {"windows": 2, "p50_s": 0.5, "p95_s": 0.7, "p99_s": 0.7}
    assert close["after_drop"]["p95_s"] == 25.0  # a missing window counts as its wait so far
    assert (close["all"]["p50_s"], close["all"]["p99_s"]) == (0.7, 25.0)
    assert summary["after_end"]["all"]["p50_s"] == 6.7
    assert "reported" not in summary  # the backhaul's results carry no latency of their own
    assert (summary["windows_before_drop"], summary["windows_after_drop"]) == (2, 2)
    assert summary["windows_not_given"] == 1 and summary["min_recall"] == 0.8


def test_links_that_come_back_split_the_windows_a_third_time() -> None:
    phase = LatencyPhase("fixed", drop_at_s=30, recover_at_s=60, windows=[
        window(10, 0.5), window(30, 4.0), window(50, 9.0), window(60, 0.8)])
    summary = phase.summary()
    # Split where each window closed (6 s after its end): 16 | 36, 56 | 66.
    assert (summary["windows_before_drop"], summary["windows_after_drop"],
            summary["windows_after_recovery"]) == (1, 2, 1)
    assert summary["after_close"]["after_recovery"]["p50_s"] == 0.8
    assert summary["max_error_bound_all"] is None  # no result stated one
    assert "windows_after_recovery" not in LatencyPhase("jetstream", drop_at_s=30).summary()


def test_the_results_own_latency_is_summarised_beside_the_measured_one() -> None:
    phase = LatencyPhase("jetstream", drop_at_s=100, windows=[
        window(10, 0.6, reported_s=0.5), window(20, 0.8, reported_s=0.7),
        window(30, 9.0, given=False)])
    reported = phase.summary()["reported"]["all"]
    assert reported == {"windows": 2, "p50_s": 0.5, "p95_s": 0.7, "p99_s": 0.7}


def test_a_window_closes_when_the_last_site_receives_the_record_past_its_end() -> None:
    end = 1_767_225_610_000  # a window [..., end) of a query that waits 5 s for late records
    landings = [
        # ams: the file landing at 104.0 holds a record at end + 5 s (the mark): it closes.
        Landing("ams", 102.0, end + 3_000), Landing("ams", 104.0, end + 5_000),
        Landing("ams", 105.0, end + 6_000),
        # sfo (listed out of order): the file at 103.5 reaches end + 4.9 s only; 106.2 passes.
        Landing("sfo", 106.2, end + 6_400), Landing("sfo", 103.5, end + 4_900),
        Landing("sfo", 107.0, end + 4_000),  # behind what sfo has read: moves nothing
        Landing("lhr", 101.0, end + 9_000),  # not a site of the query
    ]
    closes = window_closes(landings, ["ams", "sfo"], [end, end + 1_000, end + 10_000], 5_000)
    # The later site decides; the window ending 1 s later waits for ams's file at 105.0 and
    # sfo's at 106.2; none has closed the window after it at either site.
    assert closes == {end: 106.2, end + 1_000: 106.2}
    assert window_closes(landings, ["ams"], [end + 1_000], 5_000) == {end + 1_000: 105.0}
    assert window_closes(landings, ["ams", "sin"], [end], 5_000) == {}  # sin never closed it


def test_a_latency_run_of_one_system_is_refused_without_emulate_or_of_an_unknown_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--only", "jetstream", "--out", str(tmp_path)]) == 1
    assert "--only and --recover shape the latency part" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything ran
    with pytest.raises(PlanError, match="no system named spark; choose from jetstream, "
                       "fixed, backhaul"):
        run_latency(ROOT / "topologies" / "local-3dc.yaml", load_query(EXAMPLE), tmp_path,
                    phase_s=1, rate=1, link="200kbit", seed=0, say=print, systems=["spark"])


def test_the_load_bench_scores_every_revision_and_keeps_the_final_ones_unlike_run_local(
        tmp_path: Path) -> None:
    """Scoring a run against run_local, every revision: windows given right and final at
    once, one given final and exact but wrong (kept in unlike.jsonl beside run_local's rows),
    one final then changed, one provisional then final, one never final, one marked inexact,
    one never given."""
    from jetstream.lab.load_bench import (
        CLOSING_S,
        QUERIES,
        UNLIKE_FILE,
        WARMUP_S,
        Given,
        LoadRun,
        _score,
    )
    from jetstream.lab.loggen import LogSpec, write_logs
    from jetstream.local import run_local

    sites = ["ams", "sfo"]
    write_logs(tmp_path / "input", sites, start_ms=0, duration_s=60, rate=20,
               spec=LogSpec(domains=50), seed=3)
    query = QUERIES[0]
    truth = {(r.window_start, r.window_end): r.rows
             for r in run_local(query, tmp_path / "input")}
    # The logs start WARMUP_S after the run did: every window ending by 50 s is counted.
    started, duration_s = -WARMUP_S, 60 + WARMUP_S
    counted = sorted(w for w in truth if w[1] / 1000 <= started + duration_s - CLOSING_S)
    assert len(counted) >= 6
    wrong, changed, later, never, inexact, missing = counted[:6]
    altered = [dict(row) for row in truth[wrong]]
    altered[0]["requests"] += 1
    arrived = {query.name: {w: [Given(0.0, truth[w], True)] for w in counted if w != missing}}
    arrived[query.name][wrong] = [Given(0.0, altered, True)]
    arrived[query.name][changed] = [Given(0.0, truth[changed], True),
                                    Given(1.0, altered, True, revision=1)]
    arrived[query.name][later] = [Given(0.0, altered, True, final=False),
                                  Given(1.0, truth[later], True, revision=1)]
    arrived[query.name][never] = [Given(0.0, truth[never], True, final=False)]
    arrived[query.name][inexact] = [Given(0.0, altered, False)]
    run = LoadRun("jetstream", 20, 1)
    _score(run, [query], tmp_path / "input", arrived, [], sites, started, duration_s)
    figures = run.figures[query.name]
    assert (figures.windows, figures.unequal, figures.changed, figures.inexact,
            figures.not_final, figures.not_given, figures.final_at_first) == (
        len(counted), 1, 1, 1, 1, 1, len(counted) - 3)
    assert run.records == sum(len(f.read_text().splitlines()) - 1  # (less the header)
                              for f in (tmp_path / "input").glob("*/*.csv")) > 0
    kept = [json.loads(line) for line in (tmp_path / UNLIKE_FILE).read_text().splitlines()]
    assert [(k["query"], k["window"], k["why"]) for k in kept] == [
        (query.name, list(wrong), "unlike"), (query.name, list(changed), "changed")]
    assert kept[0]["given"] == altered and kept[0]["run_local"] == truth[wrong]
    assert kept[1]["then"] == [altered]


def test_the_plain_spark_queries_equal_run_local_window_by_window(spark: Any,
                                                                  tmp_path: Path) -> None:
    # The load bench's baseline: each standing query by hand, a streaming query of its own.
    # Read a file a batch (Spark judges lateness by batch; run_local, file by file), every
    # window it lets out equals run_local's (Spark's own sketches aside), and it lets out
    # every window but the last (no record passes its end by the watermark's 5 s).
    from jetstream.lab.load_bench import QUERIES
    from jetstream.lab.loggen import LogSpec, write_logs
    from jetstream.lab.plain_spark import PLAIN_QUERIES, logs
    from jetstream.local import run_local

    write_logs(tmp_path / "input", ["ams", "sfo"], start_ms=1_800_000_000_000, duration_s=60,
               rate=40, spec=LogSpec(domains=30), seed=5)
    assert [q.name for q in PLAIN_QUERIES] == [q.name for q in QUERIES]
    for plain, query in zip(PLAIN_QUERIES, QUERIES, strict=True):
        truth = {(r.window_start, r.window_end): r.rows
                 for r in run_local(query, tmp_path / "input")}
        given: dict[tuple[int, int], list[dict[str, Any]]] = {}
        read = logs(spark, str(tmp_path / "input" / "*"), maxFilesPerTrigger=1)
        (plain.counts(read).writeStream
         .outputMode("append").foreachBatch(
             lambda batch, _, plain=plain, given=given: given.update(
                 plain.rows(batch.collect())))
         .option("checkpointLocation", str(tmp_path / "checkpoints" / plain.name))
         .trigger(availableNow=True).start().awaitTermination())
        assert len(given) >= len(truth) - 1, (plain.name, sorted(given), sorted(truth))
        for window, rows in given.items():
            if plain.exact:
                assert rows == truth[window], (plain.name, window)
            else:
                assert [set(r) for r in rows] == [set(r) for r in truth[window]]
