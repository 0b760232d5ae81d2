"""A short soak under steady live load: memory stays flat, no backlog grows, results flow.

Three minutes of the CDN top-k on local-3dc with real processes; the long run's figures are
in docs/benchmarks.md (scripts/soak.py).
"""

from __future__ import annotations

from pathlib import Path

from jetstream.lab.soak import soak
from jetstream.queryfile import load_query

ROOT = Path(__file__).resolve().parent.parent


def test_steady_load_keeps_memory_flat_and_the_backlog_bounded(tmp_path: Path) -> None:
    samples = soak(ROOT / "topologies" / "local-3dc.yaml",
                   load_query(ROOT / "examples" / "cdn_topk.py"),
                   tmp_path, duration_s=180, rate=100, sample_s=10)
    assert len(samples) >= 15
    warm = samples[len(samples) // 3:]  # Spark and the first windows are behind us
    middle, end = warm[:len(warm) // 2], warm[len(warm) // 2:]
    # Flat: the site processes grow by less than a tenth from the middle to the end.
    assert max(s.python_mb for s in end) <= 1.1 * max(s.python_mb for s in middle), [
        round(s.python_mb) for s in samples]
    # No growing backlog: the sites hold at most a few windows unacked at any time, and the
    # newest result keeps up with the clock.
    assert all(sum(s.held.values()) <= 6 for s in warm), [s.held for s in samples]
    lags = [s.lag_s for s in end]
    assert all(lag is not None and lag < 60 for lag in lags), lags
    # Results keep coming: a 10 s window a sample, give or take.
    assert end[-1].results - end[0].results >= len(end) // 2, [s.results for s in samples]
