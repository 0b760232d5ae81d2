"""The control plane as real processes on loopback, driven by the CLI: a controller and three
site controllers come up, a query is placed on them, a killed site is planned around, and the
query is cancelled. Every hop is mutual TLS with a token, from a development CA."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jetstream.control.launch import free_port
from jetstream.security import make_dev_certs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cdn_topk.py"
TOPOLOGY = ROOT / "topologies" / "local-3dc.yaml"
SITES = ("ams", "sfo", "sin")
QUERY = "cdn-topk"

_SCRIPT = Path(sys.executable).parent / "jetstream"
JETSTREAM = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "jetstream"]
# Wide enough that `jetstream status` tables do not wrap names.
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "COLUMNS": "200",
       "JETSTREAM_TLS_DIR": str(make_dev_certs(Path(tempfile.mkdtemp(prefix="js-tls-"))).folder)}
ENV.pop("JETSTREAM_TOKEN", None)
#: The longest any one change may take to show in `jetstream status`.
DEADLINE_S = 20.0

Status = dict[str, Any]


@dataclass
class Cluster:
    """The processes of one test, their output files, and the CLI pointed at them."""

    address: str
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> None:
        with (self.logs / f"{name}.log").open("wb") as out:  # the child keeps its own handle
            self.processes[name] = subprocess.Popen([*JETSTREAM, *args], stdout=out,
                                                    stderr=subprocess.STDOUT, cwd=ROOT, env=ENV)

    def output(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}"
                         for p in sorted(self.logs.glob("*.log")))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*JETSTREAM, *args, "--controller", self.address],
                              capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=15)

    def ok(self, *args: str) -> str:
        done = self.cli(*args)
        assert done.returncode == 0, (f"jetstream {' '.join(args)}: {done.stderr}\n"
                                      f"{self.output()}")
        return done.stdout

    def ok_status(self) -> Status:
        return dict(json.loads(self.ok("status", "--json")))

    def status(self) -> Status | None:
        done = self.cli("status", "--json")
        return json.loads(done.stdout) if done.returncode == 0 else None

    def wait_for(self, what: str, holds: Callable[[Status], bool]) -> Status:
        """Poll `jetstream status --json` until ``holds``; fail after DEADLINE_S."""
        deadline = time.monotonic() + DEADLINE_S
        last = None
        while time.monotonic() < deadline:
            if self.processes["controller"].poll() is not None:
                pytest.fail(f"the controller exited while waiting for {what}\n{self.output()}")
            last = self.status()
            if last is not None and holds(last):
                return last
            time.sleep(0.1)
        pytest.fail(f"no {what} after {DEADLINE_S}s; last status:\n"
                    f"{json.dumps(last, indent=2)}\n{self.output()}")


@contextlib.contextmanager
def running(logs: Path, *, allow_code: tuple[str, ...] = ()) -> Iterator[Cluster]:
    """A controller and the sites on loopback; ``allow_code``: the processes (the controller,
    sites) started with --allow-code."""
    cluster = Cluster(f"127.0.0.1:{free_port()}", logs)
    code = {name: ("--allow-code",) if name in allow_code else () for name in
            ("controller", *SITES)}
    try:
        cluster.start("controller", "controller", "--topology", str(TOPOLOGY),
                      "--port", cluster.address.rsplit(":", 1)[1],
                      "--heartbeat-interval", "0.3", "--heartbeat-timeout", "1.5",
                      *code["controller"])
        cluster.wait_for("answer from the controller", lambda status: True)
        for site in SITES:
            cluster.start(site, "site", "--name", site, "--controller", cluster.address,
                          *code[site])
        yield cluster
    finally:
        for process in cluster.processes.values():
            if process.poll() is None:
                process.kill()
        for process in cluster.processes.values():
            process.wait(timeout=10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running(tmp_path) as started:
        yield started


def sites(status: Status) -> dict[str, Status]:
    return {s["name"]: s for s in status["sites"]}


def query(status: Status) -> Status:
    [only] = [q for q in status["queries"] if q["name"] == QUERY]
    return only


def pieces(status: Status, site: str) -> list[tuple[str, str]]:
    return sorted((p["piece"], p["server"]) for p in sites(status)[site]["placements"]
                  if p["query"] == QUERY)


EXPECTED_PIECES = {
    "ams": [("final 1/2", "ams-1"), ("final 2/2", "ams-2"), ("local stage", "ams-1")],
    "sfo": [("local stage", "sfo-1")],
    "sin": [("local stage", "sin-1")],
}


def test_a_query_is_placed_planned_around_a_dead_site_and_cancelled(cluster: Cluster) -> None:
    up = cluster.wait_for("three live sites",
                          lambda s: all(site["alive"] for site in s["sites"]))
    assert (up["topology"], up["root"]) == ("local-3dc", "ams")
    assert sorted(sites(up)) == list(SITES)
    assert all(site["address"].startswith("127.0.0.1:") for site in up["sites"])

    # The query file counts its runs: `submit` runs it once, the controller and sites never.
    counted = cluster.logs / "cdn_topk.py"
    counted.write_text("from pathlib import Path\n"
                       "with open(Path(__file__).parent / 'runs.txt', 'a') as runs:\n"
                       "    runs.write('ran\\n')\n" + EXAMPLE.read_text())
    submitted = cluster.ok("submit", "--query", str(counted))
    assert submitted.startswith(f"submitted {QUERY}\nphysical plan on local-3dc (root ams)")

    placed = cluster.wait_for("placements on every site", lambda s: all(
        pieces(s, site) == expected for site, expected in EXPECTED_PIECES.items()))
    assert (cluster.logs / "runs.txt").read_text() == "ran\n"
    running = query(placed)
    assert (running["state"], running["replans"]) == ("running", 0)
    assert running["parents"] == {"sfo": "ams", "sin": "ams"}
    assert sum(link["planned_bytes_per_s"] for link in placed["links"]) > 0

    table = cluster.ok("status")
    for word in (*SITES, "local-3dc", QUERY, "sfo -> ams", "sin -> ams", "local stage"):
        assert word in table, f"{word!r} missing from `jetstream status`:\n{table}"

    cluster.processes["sfo"].send_signal(signal.SIGKILL)
    cluster.processes["sfo"].wait(timeout=5)

    def planned_around_sfo(status: Status) -> bool:
        q = query(status)
        return (not sites(status)["sfo"]["alive"] and q["replans"] >= 1
                and "sfo" not in q["parents"])

    degraded = cluster.wait_for("re-plan without sfo", planned_around_sfo)
    after = query(degraded)
    assert after["state"] == "degraded"
    assert "sfo" in after["detail"]
    assert after["parents"] == {"sin": "ams"}
    assert "sfo:" not in after["plan"]
    assert sites(degraded)["ams"]["alive"] and sites(degraded)["sin"]["alive"]
    assert sites(degraded)["sfo"]["placements"] == []
    survivors = cluster.wait_for("the new plan on ams and sin", lambda s: all(
        pieces(s, site) == EXPECTED_PIECES[site] for site in ("ams", "sin")))
    assert query(survivors)["replans"] == after["replans"]  # one death, one re-plan
    assert "dead" in cluster.ok("status")

    assert cluster.ok("cancel", QUERY).strip() == f"cancelled {QUERY}"
    # Heartbeats say what runs where: one sent while the stop was on its way may still list
    # the pieces, the next ones may not.
    cluster.wait_for("cancelled query, no piece left on any site", lambda s: (
        query(s)["state"] == "cancelled" and all(pieces(s, site) == [] for site in SITES)))
    for name in ("controller", "ams", "sin"):
        assert cluster.processes[name].poll() is None, f"{name} exited\n{cluster.output()}"

    # A site stopped with SIGTERM says so in its last heartbeat: not taken for dead while its
    # stage stops (which takes longer than this controller's 1.5-s heartbeat timeout).
    cluster.processes["sin"].terminate()
    assert cluster.processes["sin"].wait(timeout=30) == 0
    gone = cluster.wait_for("sin down", lambda s: not sites(s)["sin"]["alive"])
    assert sites(gone)["ams"]["alive"]
    said = (cluster.logs / "controller.log").read_text()
    assert "site sin is shutting down; re-planning without it" in said, said
    assert "site sin missed its heartbeats" not in said, said


MAPPED = """
import jetstream as js
logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
query = js.Query("mapped", logs.map(lambda r: r, name="same").window(js.tumbling("10s"))
                 .group_by("domain").agg(n=js.count()))
"""


def test_a_map_goes_only_to_sites_started_with_allow_code(tmp_path: Path) -> None:
    """A map's function is code: a site started without --allow-code says so when it
    registers, so a plan that would send it one is refused at submit, naming it; and a site
    that gets one anyway (it registered after the submit) refuses it, in the query's status."""
    query_file = tmp_path / "mapped.py"
    query_file.write_text(MAPPED)
    with running(tmp_path, allow_code=("controller", "ams", "sfo")) as cluster:
        cluster.wait_for("three live sites", lambda s: all(site["alive"] for site in s["sites"]))
        refused = cluster.cli("submit", "--query", str(query_file))
        assert refused.returncode != 0
        assert ("map same travels as code, and the plan sends it to sites that run none "
                "(started without --allow-code): sin; start them with jetstream site "
                "--allow-code") in refused.stderr, refused.stderr
        assert all(q["name"] != "mapped" for q in cluster.ok_status()["queries"])

        cluster.processes["sin"].send_signal(signal.SIGKILL)
        cluster.processes["sin"].wait(timeout=5)
        cluster.wait_for("sin dead", lambda s: not sites(s)["sin"]["alive"])
        cluster.ok("submit", "--query", str(query_file))  # planned around sin
        cluster.start("sin", "site", "--name", "sin", "--controller", cluster.address)

        def refused_at_sin(status: Status) -> bool:
            [mapped] = [q for q in status["queries"] if q["name"] == "mapped"]
            return "site sin refused its part" in mapped["detail"]

        after = cluster.wait_for("sin refusing the map", refused_at_sin)
        [mapped] = [q for q in after["queries"] if q["name"] == "mapped"]
        assert "this process does not run code sent with a query" in mapped["detail"]
        assert mapped["state"] == "degraded"
        assert sites(after)["sin"]["alive"]
        assert [p for p in sites(after)["sin"]["placements"] if p["query"] == "mapped"] == []
        assert {p["query"] for p in sites(after)["sfo"]["placements"]} == {"mapped"}


def test_the_cli_says_when_no_controller_answers() -> None:
    done = subprocess.run([*JETSTREAM, "status", "--controller", f"127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=30)
    assert done.returncode == 1
    assert "cannot reach the controller at 127.0.0.1:" in done.stderr


def test_a_cube_given_to_the_controller_runs_once_the_sites_register(tmp_path: Path) -> None:
    """`jetstream controller --cube QUERY.py`: the query runs from the start, without a
    submit, so that the sites keep its windows for `jetstream history`."""
    cluster = Cluster(f"127.0.0.1:{free_port()}", tmp_path)
    try:
        cluster.start("controller", "controller", "--topology", str(TOPOLOGY),
                      "--port", cluster.address.rsplit(":", 1)[1], "--cube", str(EXAMPLE))
        for site in SITES:
            cluster.start(site, "site", "--name", site, "--controller", cluster.address)
        placed = cluster.wait_for("the cube placed on every site", lambda s: all(
            pieces(s, site) == expected for site, expected in EXPECTED_PIECES.items()))
        assert query(placed)["state"] == "running"
    finally:
        for process in cluster.processes.values():
            process.kill()
            process.wait(timeout=10)
