"""Faults with real processes: a site killed mid-window comes back, and no window loses data.

A controller and the three sites of local-3dc run live; each site's logs arrive as files, one
a second. sfo is killed with SIGKILL part way (its open windows exist only in its process and
its snapshot), stays dead long enough for the controller to re-plan without it, and is
started again on the same state folder while its logs keep arriving.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from pathlib import Path

from jetstream.control.launch import LocalCluster
from jetstream.errors import ControlPlaneError
from jetstream.local import run_local
from jetstream.loggen import LogSpec, write_logs
from jetstream.queryfile import load_query
from jetstream.results import WindowResult
from tests.test_distributed import TOPOLOGY, assert_same

ROOT = Path(__file__).resolve().parent.parent
QUERY = ROOT / "examples" / "cdn_topk.py"
SITES = ["ams", "sfo", "sin"]
FILES = 24  # two seconds of logs each, one landing every second


def test_a_site_killed_mid_window_is_marked_missing_then_corrected(tmp_path: Path) -> None:
    # In order and never late: the micro-batch watermark then drops what the reference drops.
    spec = LogSpec(domains=40, out_of_order_s=0, late_fraction=0)
    made = write_logs(tmp_path / "made", SITES, start_ms=1_767_225_600_000, duration_s=2 * FILES,
                      rate=20, spec=spec, seed=5, files=FILES)
    want = run_local(load_query(QUERY), tmp_path / "made")
    inputs = tmp_path / "input"
    for site in SITES:
        (inputs / site).mkdir(parents=True)
    seen: list[WindowResult] = []
    with LocalCluster(TOPOLOGY, inputs, idle_timeout_s=8, logs=tmp_path / "logs") as cluster:
        name = cluster.client.submit(QUERY).query

        def collect() -> None:
            with contextlib.suppress(ControlPlaneError):  # it stops at the end of the test
                seen.extend(cluster.client.results(name, timeout_s=400))

        threading.Thread(target=collect, daemon=True).start()
        for i in range(FILES):
            for site in SITES:  # as a log shipper drops them: whole files
                staged = inputs / f".{site}-{i}"
                shutil.copy(made[site][i], staged)
                staged.rename(inputs / site / made[site][i].name)
            if i == 8:
                cluster.kill("sfo")
            if i == 16:  # dead for 8 s: the controller has re-planned without it
                assert not _alive(cluster, "sfo")
                cluster.restart("sfo")
            time.sleep(1.0)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not _settled(seen, want):
            time.sleep(1.0)
        cluster.check_alive()
    latest = {(r.window_start, r.window_end): r for r in seen}
    assert_same([latest[w] for w in sorted(latest)], want)
    assert all(latest[w].missing_sites == [] for w in latest)
    # While sfo was away, windows went out without it, saying so, and were corrected later.
    marked = {(r.window_start, r.window_end) for r in seen if r.missing_sites == ["sfo"]}
    assert marked, "no window was marked as missing sfo"
    assert all(latest[w].revision > 0 for w in marked)


def _alive(cluster: LocalCluster, site: str) -> bool:
    return any(s.alive for s in cluster.client.status().sites if s.name == site)


def _settled(seen: list[WindowResult], want: list[WindowResult]) -> bool:
    latest = {(r.window_start, r.window_end): r for r in list(seen)}
    return all((w.window_start, w.window_end) in latest
               and not latest[(w.window_start, w.window_end)].missing_sites
               and latest[(w.window_start, w.window_end)].rows == w.rows for w in want)
