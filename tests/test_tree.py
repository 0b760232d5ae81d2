"""A three-level tree end to end with real processes: ``topologies/tree-7.yaml``, four PoPs
(each a site process with its own Spark JVM) under two regional datacenters under a root
with three servers; the regions and the root hold no source and start no JVM. Replayed and
live, every window equals ``js.run_local`` over all four PoPs' logs."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from jetstream.control import launch
from jetstream.control.launch import LocalCluster, replay
from jetstream.errors import ControlPlaneError
from jetstream.local import run_local
from jetstream.loggen import LogSpec, write_logs
from jetstream.queryfile import load_query
from jetstream.results import WindowResult

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "tree-7.yaml"
QUERY = ROOT / "examples" / "cdn_topk.py"
POPS = ("pop1", "pop2", "pop3", "pop4")
START_MS = 1_767_225_600_000
# No record late at any site: the live path decides lateness per site and micro-batch.
SPEC = LogSpec(domains=40, urls_per_domain=5, clients_per_site=200, out_of_order_s=1.0,
               late_fraction=0.0)


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
        assert (g.sites_reporting, g.sites_expected) == (4, 4)


def _no_jvm_at_the_mergers(cluster: LocalCluster) -> None:
    for site in ("eu", "us", "core"):
        assert "starting Spark" not in (cluster.logs / f"{site}.log").read_text()
    for site in POPS:
        assert "starting Spark" in (cluster.logs / f"{site}.log").read_text()


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


def test_the_three_level_tree_live_equals_run_local(tmp_path: Path) -> None:
    inputs, staged = tmp_path / "input", tmp_path / "staged"
    for pop in POPS:
        (inputs / pop).mkdir(parents=True)
    with LocalCluster(TOPOLOGY, inputs, idle_timeout_s=3, logs=tmp_path / "logs") as cluster:
        cluster.client.submit(QUERY)
        # The logs land while the query runs, in two files a PoP, each renamed in whole.
        files = write_logs(staged, POPS, start_ms=START_MS, duration_s=40, rate=30,
                           spec=SPEC, seed=5, files=2)
        want = run_local(load_query(QUERY), staged)
        for part in range(2):
            for pop in POPS:
                path = files[pop][part]
                path.rename(inputs / pop / path.name)
        results: list[WindowResult] = []
        for result in cluster.client.results("cdn-topk", timeout_s=240):
            results.append(result)
            latest = _final(results)
            if len(latest) >= len(want) and all(
                    r.sites_reporting == 4 for r in latest.values()):
                break
        _no_jvm_at_the_mergers(cluster)
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
