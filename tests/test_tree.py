"""A three-level tree end to end with real processes: ``topologies/tree-7.yaml``, four PoPs
(each a site process with its own Spark JVM) under two regional datacenters under a root
with three servers, whose final top-k runs as three key partitions on three worker
processes; the regions and the root hold no source and start no JVM. Replayed and live,
every window equals ``js.run_local`` over all four PoPs' logs, also when a worker is killed
mid-run."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from jetstream.control import launch
from jetstream.control.launch import LocalCluster, replay
from jetstream.errors import ControlPlaneError
from jetstream.lab.loggen import LogSpec, write_logs
from jetstream.local import run_local
from jetstream.queryfile import load_query
from jetstream.results import WindowResult

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "tree-7.yaml"
QUERY = ROOT / "examples" / "cdn_topk.py"
POPS = ("pop1", "pop2", "pop3", "pop4")
START_MS = 1_767_225_600_000
# Some records late (the generator's 0.1%, 30 s behind): a site judges them file by file,
# as run_local does (docs/dsl.md, "Late records").
SPEC = LogSpec(domains=40, urls_per_domain=5, clients_per_site=200, out_of_order_s=1.0,
               late_fraction=0.01)


def _final(results: list[WindowResult]) -> dict[tuple[int, int], WindowResult]:
    latest: dict[tuple[int, int], WindowResult] = {}
    for r in results:
        window = (r.window_start, r.window_end)
        if window not in latest or r.revision >= latest[window].revision:
            latest[window] = r
    return latest


def _assert_equal(got: dict[tuple[int, int], WindowResult], want: list[WindowResult]) -> None:
    assert sorted(got) == [(r.window_start, r.window_end) for r in want]
    for w in want:
        g = got[(w.window_start, w.window_end)]
        assert (g.rows, g.exact) == (w.rows, w.exact), f"window {w.window_start}"
        # (A window before the logs began holds only some sites' records stamped late in
        # their first file, which has no file before it to be late to.)
        if w.window_start >= START_MS:
            assert (g.sites_reporting, g.sites_expected) == (4, 4)


def _no_jvm_at_the_mergers(cluster: LocalCluster) -> None:
    for site in ("eu", "us", "core"):
        assert "starting Spark" not in (cluster.logs / f"{site}.log").read_text()
    for site in POPS:
        assert "starting Spark" in (cluster.logs / f"{site}.log").read_text()


def _workers(cluster: LocalCluster, timeout_s: float = 60) -> dict[str, tuple[int, str]]:
    """The root's final partitions: piece -> (pid, state), once all three run on workers."""
    deadline = time.monotonic() + timeout_s
    while True:
        core = next(s for s in cluster.client.status().sites if s.name == "core")
        pieces = {p.piece: (p.pid, p.state) for p in core.placements}
        if len(pieces) == 3 and all(state == "running" for _, state in pieces.values()):
            return pieces
        assert time.monotonic() < deadline, f"the root's workers are not all running: {pieces}"
        time.sleep(0.5)


def _on_workers(cluster: LocalCluster) -> dict[str, tuple[int, str]]:
    """The root's three partitions each run in a worker process of its own, a child of the
    root's site process, and status says which."""
    pieces = _workers(cluster)
    assert sorted(pieces) == ["final 1/3", "final 2/3", "final 3/3"]
    pids = {pid for pid, _ in pieces.values()}
    assert len(pids) == 3 and cluster.processes["core"].pid not in pids
    for pid in pids:
        assert Path(f"/proc/{pid}/stat").read_text().split()[3] == str(
            cluster.processes["core"].pid)
    return pieces


def test_the_three_level_tree_replays_what_run_local_computes(tmp_path: Path) -> None:
    inputs = tmp_path / "input"
    write_logs(inputs, POPS, start_ms=START_MS, duration_s=40, rate=30, spec=SPEC, seed=3)
    want = run_local(load_query(QUERY), inputs)
    assert len(want) >= 4
    with LocalCluster(TOPOLOGY, inputs, replay=True, window_deadline_s=120,
                      logs=tmp_path / "logs") as cluster:
        got = _final(replay(cluster, QUERY, timeout_s=300))
        status = cluster.client.status()
        _no_jvm_at_the_mergers(cluster)
    _assert_equal(got, want)
    plan = next(q for q in status.queries if q.name == "cdn-topk")
    assert dict(plan.parents) == {"pop1": "eu", "pop2": "eu", "pop3": "us", "pop4": "us",
                                  "eu": "core", "us": "core"}
    assert "final over 3 partitions" in plan.plan
    # Each of the root's three servers ran a partition, in a worker process.
    log = (cluster.logs / "core.log").read_text()
    assert "merges core/core-1, core/core-2, core/core-3 (its key partitions, on workers)" in log
    for server in ("core-1", "core-2", "core-3"):
        assert f"cdn-topk at core/{server}: version 0 merges eu, us; sends to core" in log
    # The regions send each worker its part themselves, the PoPs (to regions that merge in
    # their own process) to their region.
    for region in ("eu", "us"):
        assert (f"cdn-topk at {region}: sending to core's 3 workers directly"
                in (cluster.logs / f"{region}.log").read_text())
    assert "directly" not in (cluster.logs / "pop1.log").read_text()


def test_the_three_level_tree_replays_exactly_with_tput_rounds_into_the_root(
        tmp_path: Path) -> None:
    # Declared with many keys a window, the regions answer the root's TPUT rounds (their
    # PoPs send them exact partials); the root coordinates in one process.
    document = yaml.safe_load(TOPOLOGY.read_text())
    for site in document["sites"]:
        for source in site.get("sources", []):
            source["distinct_keys"] = 400
    topology = tmp_path / "tree-7-many-keys.yaml"
    topology.write_text(yaml.safe_dump(document))
    inputs = tmp_path / "input"
    spec = dataclasses.replace(SPEC, domains=400, urls_per_domain=2)
    write_logs(inputs, POPS, start_ms=START_MS, duration_s=30, rate=80, spec=spec, seed=7)
    want = run_local(load_query(QUERY), inputs)
    with LocalCluster(topology, inputs, replay=True, window_deadline_s=120,
                      logs=tmp_path / "logs") as cluster:
        got = _final(replay(cluster, QUERY, timeout_s=300))
        status = cluster.client.status()
    _assert_equal(got, want)
    plan = next(q for q in status.queries if q.name == "cdn-topk").plan
    assert "eu: merge of 2 -> core" in plan and "TPUT rounds" in plan, plan
    assert "core: final\n" in plan
    # The regions were asked for more than their first rows, and answered.
    assert "asking eu for more of window" in (cluster.logs / "core.log").read_text()
    for region in ("eu", "us"):
        log = (cluster.logs / f"{region}.log").read_text()
        assert "answering core's TPUT rounds" in log and "no longer keeps" not in log
    assert all(r.exact for r in got.values())


def test_the_three_level_tree_live_equals_run_local_across_a_killed_worker(
        tmp_path: Path) -> None:
    inputs, staged = tmp_path / "input", tmp_path / "staged"
    for pop in POPS:
        (inputs / pop).mkdir(parents=True)
    with LocalCluster(TOPOLOGY, inputs, idle_timeout_s=3, window_deadline_s=5,
                      logs=tmp_path / "logs") as cluster:
        cluster.client.submit(QUERY)
        # The logs land while the query runs, in two files a PoP, each renamed in whole.
        files = write_logs(staged, POPS, start_ms=START_MS, duration_s=40, rate=30,
                           spec=SPEC, seed=5, files=2)
        want = run_local(load_query(QUERY), staged)
        for pop in POPS:
            files[pop][0].rename(inputs / pop / files[pop][0].name)
        results: list[WindowResult] = []
        stream = iter(cluster.client.results("cdn-topk", timeout_s=240))
        results.append(next(stream))  # the first half flows through the workers
        before = _on_workers(cluster)
        killed = before["final 2/3"][0]
        os.kill(killed, signal.SIGKILL)  # what it merged is lost with it
        for pop in POPS:
            files[pop][1].rename(inputs / pop / files[pop][1].name)
        for result in stream:
            results.append(result)
            latest = _final(results)
            if len(latest) >= len(want) and all(
                    (r.sites_reporting == 4 or r.window_start < START_MS) and r.exact
                    for r in latest.values()):
                break
        after = _on_workers(cluster)
        _no_jvm_at_the_mergers(cluster)
    assert after["final 2/3"][0] != killed  # started again, in a new process
    assert after["final 1/3"] == before["final 1/3"]
    _assert_equal(_final(results), want)


def test_start_up_waits_while_sites_come_up_and_gives_up_when_nothing_happens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up wait (no processes: the controller's answers and the sites' logs are
    played): a JVM starting, or a site registering, within every STARTUP_TIMEOUT_S keeps it
    waiting past that; silence ends it with an error that says how far the sites got."""
    monkeypatch.setattr(launch, "STARTUP_TIMEOUT_S", 1.0)
    cluster = LocalCluster(TOPOLOGY, logs=tmp_path)
    said: list[str] = []
    cluster.say = said.append
    began = time.monotonic()
    # pop1 registers, then for 1.7 s only JVMs are starting: longer than the timeout.
    timeline = {"pop1": 0.3, "pop2": 2.0, "pop3": 2.1, "pop4": 2.2}

    def status() -> SimpleNamespace:
        now = time.monotonic() - began
        up = [n for n, at in timeline.items() if at <= now]
        for name in POPS:  # a PoP not yet up is starting its JVM
            (tmp_path / f"{name}.log").write_text("site: starting Spark (local[1])\n")
        if now >= 2.3:
            up += ["eu", "us", "core"]
        return SimpleNamespace(sites=[SimpleNamespace(name=n, alive=True) for n in up])

    monkeypatch.setattr(cluster.client, "status", status)
    cluster._wait_for_sites()
    assert time.monotonic() - began >= 2.3
    assert said[-1] == "sites up: 7/7 core eu pop1 pop2 pop3 pop4 us"
    assert any("starting Spark: pop" in line for line in said)

    quiet = LocalCluster(TOPOLOGY, logs=tmp_path / "quiet")
    monkeypatch.setattr(quiet.client, "status",
                        lambda: SimpleNamespace(sites=[SimpleNamespace(name="eu", alive=True)]))
    with pytest.raises(ControlPlaneError, match=r"did not all register: sites up: 1/7 eu "
                                                r"after \d+s, with nothing happening for 1s"):
        quiet._wait_for_sites()
