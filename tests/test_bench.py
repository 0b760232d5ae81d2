"""`jetstream bench --quick` end to end: both systems on the same generated logs, one report."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from jetstream.control.latency_bench import LatencyPhase, WindowLatency
from jetstream.stage.baseline import Receiver, ship


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
    assert total["jetstream_windows_missing"] == 0
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


def test_latency_percentiles_split_at_the_drop_and_count_missing_windows() -> None:
    phase = LatencyPhase("backhaul", drop_at_s=30, windows=[
        WindowLatency(10, 6.0, True, 1.0), WindowLatency(20, 7.0, True, 1.0),
        WindowLatency(30, 9.0, True, 0.8), WindowLatency(40, 25.0, False, None)])
    summary = phase.summary()
    assert (summary["p50_before_drop_s"], summary["p95_before_drop_s"]) == (6.0, 7.0)
    assert summary["p95_after_drop_s"] == 25.0  # a missing window counts as its wait so far
    assert summary["p50_s"] == 7.0 and summary["p95_s"] == 25.0
    assert summary["windows_not_given"] == 1 and summary["min_recall"] == 0.8
