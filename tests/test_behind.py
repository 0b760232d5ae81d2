"""A site that falls behind says so and stays right, with real processes.

local-3dc runs live; each site's logs land as files, one a second, with late records among
them. Part way, sfo's Spark JVM is stopped (SIGSTOP: the site process and its heartbeats go
on) for 45 s while its files keep landing, then continued. While it is stopped the
controller's status shows sfo behind (files waiting, how long); windows go out without it
marked provisional, naming it; once it has caught up every window is final. Every result ever
marked final and exact equals ``js.run_local`` over the files as they landed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from jetstream import finality
from jetstream.control.launch import LocalCluster
from jetstream.errors import ControlPlaneError
from jetstream.lab.loggen import LogSpec, write_logs
from jetstream.lab.soak import jvm_pids
from jetstream.local import run_local
from jetstream.queryfile import load_query
from jetstream.results import WindowResult
from tests.test_distributed import TOPOLOGY

ROOT = Path(__file__).resolve().parent.parent
QUERY = ROOT / "examples" / "cdn_topk.py"
SITES = ["ams", "sfo", "sin"]
FILES = 70  # a second of logs each, one landing every second
STOP_AT, STOP_S = 12, 45
START_MS = 1_767_225_600_000


@pytest.mark.slow
def test_a_stalled_site_shows_its_lag_and_no_window_is_final_and_wrong(tmp_path: Path) -> None:
    spec = LogSpec(domains=40, late_fraction=0.01, late_s=30)  # a record in 100, 30 s late
    made = write_logs(tmp_path / "made", SITES, start_ms=START_MS,
                      duration_s=FILES, rate=30, spec=spec, seed=7, files=FILES)
    inputs = tmp_path / "input"
    for site in SITES:
        (inputs / site).mkdir(parents=True)
    seen: list[WindowResult] = []
    behind: list[tuple[int, float]] = []  # sfo's (files waiting, lag) while stopped
    done = threading.Event()
    with LocalCluster(TOPOLOGY, inputs, idle_timeout_s=8, logs=tmp_path / "logs") as cluster:
        name = cluster.client.submit(QUERY).query
        cluster.wait_for_stages(name)  # their JVMs up and warmed: a stall, not a start

        def collect() -> None:
            with contextlib.suppress(ControlPlaneError):
                seen.extend(cluster.client.results(name, timeout_s=600))

        threading.Thread(target=collect, daemon=True).start()
        stopped: list[int] = []
        for i in range(FILES):
            for site in SITES:  # as a log shipper drops them: whole files
                staged = inputs / f".{site}-{i}"
                shutil.copy(made[site][i], staged)
                staged.rename(inputs / site / made[site][i].name)
            if i == STOP_AT:
                stopped = jvm_pids(cluster, "sfo")
                assert stopped, "sfo runs no JVM"
                for pid in stopped:
                    os.kill(pid, signal.SIGSTOP)
            if stopped and i == STOP_AT + STOP_S:
                for pid in stopped:
                    os.kill(pid, signal.SIGCONT)
                stopped = []
            if stopped and i >= STOP_AT + 20:
                sfo = next(s for s in cluster.client.status().sites if s.name == "sfo")
                behind += [(b.files_waiting, b.lag_s) for b in sfo.behind]
            time.sleep(1.0)
        reference = run_local(load_query(QUERY), inputs)
        want = {(r.window_start, r.window_end): r for r in reference}
        # Every window the sites' watermarks have all passed, from when the logs begin (one
        # before holds only some sites' records stamped late in their first file, and a
        # root that merges over workers cannot know the others had nothing there): each is
        # final in the end.
        closing = min(max(r["ts"] for r in _records(made[s])) for s in SITES) - 5_000
        closed = [w for w in want if w[0] >= START_MS and w[1] <= closing]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not all(
                (last := _newest(seen).get(w)) is not None and last.final for w in closed):
            time.sleep(1.0)
        done.set()
        # The late records the sites dropped (the window had gone on final) are the
        # reference's, counted in status by site (heartbeats bring them).
        late: dict[str, int] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(late.values()) != reference.stats.late_records:
            (status,) = [q for q in cluster.client.status().queries if q.name == name]
            late = dict(status.late_records)
            time.sleep(1.0)
        cluster.check_alive()
    assert reference.stats.late_records > 0
    assert sum(late.values()) == reference.stats.late_records, (late, reference.stats)
    assert behind and max(files for files, _ in behind) >= 10, behind
    assert max(lag for _, lag in behind) >= 15, behind
    newest = _newest(seen)
    for window in closed:
        assert newest[window].final, (window, newest[window].provisional)
        assert newest[window].rows == want[window].rows, window
    wrong = [r for r in seen if r.final and r.exact
             and r.rows != want[(r.window_start, r.window_end)].rows]
    assert not wrong, [(r.window_start, r.revision) for r in wrong]
    # Out without sfo while it was stopped: provisional, at a deadline (the root's, or its
    # parent's merge below it), naming it.
    waiting = [r for r in seen if not r.final]
    assert any({finality.DEADLINE, finality.INCOMPLETE_INPUT} & set(r.provisional)
               and r.missing_sites == ["sfo"] for r in waiting), [
        (r.window_start, r.provisional, r.missing_sites) for r in waiting]
    assert sum(1 for r in seen if r.final) <= len(newest)  # final once a window


def _newest(seen: list[WindowResult]) -> dict[tuple[int, int], WindowResult]:
    newest: dict[tuple[int, int], WindowResult] = {}
    for result in list(seen):
        window = (result.window_start, result.window_end)
        if window not in newest or result.revision >= newest[window].revision:
            newest[window] = result
    return newest


def _records(files: list[Path]) -> list[dict[str, int]]:
    out = []
    for path in files:
        lines = path.read_text().splitlines()
        ts = lines[0].split(",").index("ts")
        out += [{"ts": int(line.split(",")[ts])} for line in lines[1:]]
    return out
