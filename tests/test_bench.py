"""`jetstream bench --quick` end to end: both systems on the same generated logs, one report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


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
