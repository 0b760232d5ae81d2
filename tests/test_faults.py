"""Faults with real processes: whatever dies comes back, and no window loses data.

A controller and the three sites of local-3dc run live; each site's logs arrive as files, one
a second. Part way, one process is killed with SIGKILL (a site, whose open windows exist only
in its process and its snapshot; the root, which has acked what its children sent; or the
global controller) and later started again on the same state folder while the logs keep
arriving. Each time the final results equal the reference executor's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jetstream.control.launch import LocalCluster
from jetstream.errors import ControlPlaneError
from jetstream.lab.chaos import Link
from jetstream.lab.loggen import LogSpec, write_logs
from jetstream.local import run_local
from jetstream.queryfile import load_query
from jetstream.results import WindowResult
from tests.test_distributed import TOPOLOGY, assert_same

ROOT = Path(__file__).resolve().parent.parent
QUERY = ROOT / "examples" / "cdn_topk.py"
SITES = ["ams", "sfo", "sin"]
FILES = 24  # two seconds of logs each, one landing every second
FAILOVER_TOPOLOGY = ROOT / "topologies" / "failover-3dc.yaml"


#: What a test does to the cluster after the i-th file of each site has landed; the third
#: argument gives the results seen so far.
Fault = Callable[[LocalCluster, int, Callable[[], list[WindowResult]]], None]


def run_with(fault: Fault, tmp_path: Path,
             site_args: Callable[[str], list[str]] = lambda site: [],
             topology: Path = TOPOLOGY) -> list[list[WindowResult]]:
    """Ship the logs to a live cluster, calling ``fault`` as they land, and check that the
    final results equal the reference's; every result seen, by a follower that reconnects
    when the controller is away: one list a connection."""
    # In order and never late: the micro-batch watermark then drops what the reference drops.
    spec = LogSpec(domains=40, out_of_order_s=0, late_fraction=0)
    made = write_logs(tmp_path / "made", SITES, start_ms=1_767_225_600_000, duration_s=2 * FILES,
                      rate=20, spec=spec, seed=5, files=FILES)
    want = run_local(load_query(QUERY), tmp_path / "made")
    inputs = tmp_path / "input"
    for site in SITES:
        (inputs / site).mkdir(parents=True)
    streams: list[list[WindowResult]] = []
    done = threading.Event()
    with LocalCluster(topology, inputs, idle_timeout_s=8, logs=tmp_path / "logs",
                      site_args=site_args) as cluster:
        name = cluster.client.submit(QUERY).query

        def collect() -> None:
            while not done.is_set():
                streams.append([])
                with contextlib.suppress(ControlPlaneError):  # the controller is away
                    streams[-1].extend(cluster.client.results(name, timeout_s=400))
                done.wait(1.0)

        threading.Thread(target=collect, daemon=True).start()
        for i in range(FILES):
            for site in SITES:  # as a log shipper drops them: whole files
                staged = inputs / f".{site}-{i}"
                shutil.copy(made[site][i], staged)
                staged.rename(inputs / site / made[site][i].name)
            fault(cluster, i, lambda: _all(streams))
            time.sleep(1.0)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not _settled(_all(streams), want):
            time.sleep(1.0)
        done.set()
        cluster.check_alive()
    latest = {(r.window_start, r.window_end): r for r in _all(streams)}
    assert_same([latest[w] for w in sorted(latest)], want)
    assert all(latest[w].missing_sites == [] for w in latest)
    return [stream for stream in streams if stream]


def kill_and_restart(name: str, kill_at: int, restart_at: int) -> Fault:
    def fault(cluster: LocalCluster, i: int, seen: Callable[[], list[WindowResult]]) -> None:
        if i == kill_at:
            cluster.kill(name)
        if i == restart_at:
            cluster.restart(name)

    return fault


def test_a_site_killed_mid_window_is_marked_missing_then_corrected(tmp_path: Path) -> None:
    def fault(cluster: LocalCluster, i: int, seen: Callable[[], list[WindowResult]]) -> None:
        kill_and_restart("sfo", 8, 16)(cluster, i, seen)
        if i == 15:  # dead for 7 s: the controller has re-planned without it
            assert not _alive(cluster, "sfo")

    seen = _all(run_with(fault, tmp_path))
    latest = {(r.window_start, r.window_end): r for r in seen}
    # While sfo was away, windows went out without it, saying so, and were corrected later.
    marked = {(r.window_start, r.window_end) for r in seen if r.missing_sites == ["sfo"]}
    assert marked, "no window was marked as missing sfo"
    assert all(latest[w].revision > 0 for w in marked)
    for site in SITES:
        # Each file went into the folder the site's stream lists once, killed or not, and
        # what was read has left it; the site's own folder keeps every file.
        live = next((tmp_path / "logs" / "state" / site / "readers").glob("*/live"))
        let_in = (live.parent / "live.names").read_text().split()
        landed = sorted(path.name for path in (tmp_path / "input" / site).iterdir())
        assert sorted(let_in) == landed and len(landed) == FILES
        assert len(os.listdir(live)) < FILES // 2, f"{site}: {sorted(os.listdir(live))}"


def test_the_root_killed_mid_window_loses_nothing_it_had_acked(tmp_path: Path) -> None:
    """ams merges every window and finishes it; killed once results flow, it comes back on
    its state folder with what it had acked from sfo and sin (its inbox) and its own open
    windows."""
    def fault(cluster: LocalCluster, i: int, seen: Callable[[], list[WindowResult]]) -> None:
        if i == 10:  # the logs pause until ams has acked and finished some windows
            # One with ams's own records: a window may go out at its deadline before ams's
            # stage has handed any on, and then its inbox would hold nothing to merge again.
            wait_for(lambda: any("ams" not in r.missing_sites for r in seen()),
                     "a first result with ams's own records")
            cluster.kill("ams")
        if i == 15:
            cluster.restart("ams")

    (stream, *_) = run_with(fault, tmp_path)
    assert "from the inbox" in (tmp_path / "logs" / "ams.log").read_text()
    # The restarted root publishes its windows again: one result per (window, revision).
    published = [(r.window_start, r.revision) for r in stream]
    assert len(published) == len(set(published)), published


def test_a_dead_root_fails_over_to_its_standby_and_rejoins_as_a_site(tmp_path: Path) -> None:
    """ams, the root, is killed once results flow and stays down: the controller makes sfo,
    its standby, the root; sin sends to sfo and both send again what ams may have merged
    without publishing. Results go on without ams's records, saying so; ams, back, rejoins
    under sfo and its windows correct them. No window is lost or counted twice."""
    status: list[tuple[str, dict[str, str]]] = []

    def fault(cluster: LocalCluster, i: int, seen: Callable[[], list[WindowResult]]) -> None:
        if i == 6:
            wait_for(lambda: any("ams" not in r.missing_sites for r in seen()),
                     "a first result with ams's own records")
            cluster.kill("ams")
        if i == 15:  # dead for 9 s: past its heartbeat timeout
            wait_for(lambda: cluster.client.status().root == "sfo", "sfo to become the root")
            wait_for(lambda: any(r.missing_sites == ["ams"] for r in seen()),
                     "a result from sfo without ams")
        if i == 16:
            cluster.restart("ams")
        if i == FILES - 1:
            now = cluster.client.status()
            status.append((now.root, {q.name: q.state for q in now.queries}))

    seen = _all(run_with(fault, tmp_path, topology=FAILOVER_TOPOLOGY))
    assert status[0][0] == "sfo", "the root went back to ams"
    controller = (tmp_path / "logs" / "controller.log").read_text()
    assert "the root ams is dead, sfo takes its place" in controller
    assert "sending sfo again" in (tmp_path / "logs" / "sin.log").read_text()
    latest = {(r.window_start, r.window_end): r for r in seen}
    marked = {(r.window_start, r.window_end) for r in seen if r.missing_sites == ["ams"]}
    assert marked, "no window was marked as missing ams"
    assert all(latest[w].revision > 0 for w in marked)  # corrected once ams was back
    published = [(r.window_start, r.revision) for r in seen]
    assert len(published) == len(set(published)), published


def test_a_restarted_controller_takes_up_the_running_query(tmp_path: Path) -> None:
    """The controller dies; the sites go on, the root holds its results until a controller
    takes them, and the new one (same state folder) knows the query and its results."""
    def fault(cluster: LocalCluster, i: int, seen: Callable[[], list[WindowResult]]) -> None:
        if i == 8:  # the logs pause until the controller has shown a result
            wait_for(lambda: bool(seen()), "a first result")
        kill_and_restart("controller", 8, 12)(cluster, i, seen)

    streams = run_with(fault, tmp_path)
    assert len(streams) >= 2, "the follower never had to reconnect"
    assert streams[1][0] == streams[0][0]  # the new controller shows the results from before


def test_a_partition_marks_windows_partial_and_the_backlog_corrects_them(
        tmp_path: Path) -> None:
    """The root is cut off from both edges: every side goes on processing, ams's windows go
    out without sfo and sin, saying so, and when the link heals what the edges held drains
    and corrects them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    link = Link(port)

    def fault(cluster: LocalCluster, i: int, seen: Callable[[], list[WindowResult]]) -> None:
        if i == 8:  # the logs pause while the link is cut
            wait_for(lambda: bool(seen()), "a first result")
            link.cut()
            wait_for(lambda: any(r.missing_sites == ["sfo", "sin"] for r in seen()),
                     "a window without the edges")
            time.sleep(5)
            link.heal()

    def through_link(site: str) -> list[str]:
        return ["--port", str(port), "--advertise", f"127.0.0.1:{link.port}"] \
            if site == "ams" else []

    try:
        seen = _all(run_with(fault, tmp_path, through_link))
    finally:
        link.close()
    latest = {(r.window_start, r.window_end): r for r in seen}
    marked = {(r.window_start, r.window_end) for r in seen if r.missing_sites == ["sfo", "sin"]}
    assert marked, "no window was marked as missing the edges"
    assert all(latest[w].revision > 0 for w in marked)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f}s"
        time.sleep(0.5)


def _all(streams: list[list[WindowResult]]) -> list[WindowResult]:
    return [result for stream in list(streams) for result in list(stream)]


def _alive(cluster: LocalCluster, site: str) -> bool:
    return any(s.alive for s in cluster.client.status().sites if s.name == site)


def _settled(seen: list[WindowResult], want: list[WindowResult]) -> bool:
    latest = {(r.window_start, r.window_end): r for r in list(seen)}
    return all((w.window_start, w.window_end) in latest
               and not latest[(w.window_start, w.window_end)].missing_sites
               and latest[(w.window_start, w.window_end)].rows == w.rows for w in want)
