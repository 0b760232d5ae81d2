"""A site whose Spark is starting stays alive: a real controller and a real site, in a fresh
process so that the site starts a JVM of its own (the tests' shared session would answer at
once), with heartbeats tighter than a JVM start; its local stage shows as starting until it
has warmed up and reads; and the session it starts has the Spark settings of its command
line over the topology's (carried at registration) over the defaults."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jetstream.aggtree.loader import parse_topology
from jetstream.control.client import ControllerClient
from jetstream.control.daemons import run_controller, run_site
from jetstream.control.global_controller import GlobalController
from jetstream.control.site_controller import SiteController
from jetstream.dataplane.options import SiteOptions
from jetstream.dataplane.site import SiteRuntime
from jetstream.security import Security

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cdn_topk.py"
#: Far shorter than a JVM start (10-40 s here), long enough for a loaded 2-core machine.
HEARTBEAT_S, TIMEOUT_S = 0.3, 3.0

TOPOLOGY = """\
name: solo
root: solo
sites:
  - name: solo
    kind: datacenter
    servers: [{name: solo-1, cores: 1, memory_gb: 1}]
    sources: [{name: cdn_logs}]
    spark_master: local[1]
    spark_conf:
      spark.driver.memory: 768m          # read only when the JVM starts
      spark.sql.shuffle.partitions: 3
      spark.jetstream.probe: topology    # the command line's wins
"""
#: What the site is given on its command line (jetstream site --spark-conf).
COMMAND_LINE = {"spark.jetstream.probe": "command line"}


def _probe(folder: Path) -> dict[str, Any]:
    """Run a controller and a site in this process until the site's Spark is up; what was
    seen meanwhile. The controller, the site and Spark are real; the wrappers only note
    when things happened."""
    seen: dict[str, Any] = {"beats": [], "dead": [], "spark": [], "deployed": []}
    sessions: list[Any] = []

    def noting(cls: type, method: str, note: Any) -> None:
        original = getattr(cls, method)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            value = original(self, *args, **kwargs)
            note(value, started, time.monotonic())
            return value

        setattr(cls, method, wrapper)

    noting(GlobalController, "heartbeat", lambda _v, _s, end: seen["beats"].append(end))
    noting(GlobalController, "check_liveness", lambda dead, _s, _e: seen["dead"].extend(dead))
    noting(SiteRuntime, "session", lambda spark, start, end: (
        sessions.append(spark), seen["spark"].append((start, end))))
    noting(SiteController, "deploy", lambda _v, _s, end: seen["deployed"].append(end))

    stop = threading.Event()
    ports: list[int] = []
    controller = threading.Thread(target=run_controller, daemon=True, kwargs=dict(
        topology=parse_topology(TOPOLOGY), port=0, security=Security.plaintext(),
        heartbeat_interval_s=HEARTBEAT_S, heartbeat_timeout_s=TIMEOUT_S, ready=ports.append,
        stop=stop))
    controller.start()
    while not ports:
        time.sleep(0.05)
    address = f"127.0.0.1:{ports[0]}"
    (folder / "input").mkdir()
    options = SiteOptions(input_dir=folder / "input", state_dir=folder / "state",
                          spark_conf=dict(COMMAND_LINE))
    site = threading.Thread(target=run_site, args=("solo", address), daemon=True, kwargs=dict(
        security=Security.plaintext(), options=options, stop=stop))
    site.start()
    client = ControllerClient(address, security=Security.plaintext())
    deadline = time.monotonic() + 30
    while not any(s.alive for s in client.status().sites):
        assert time.monotonic() < deadline, "the site never registered"
        time.sleep(0.05)
    client.submit(EXAMPLE)
    deadline = time.monotonic() + 240
    while not seen["spark"]:
        assert time.monotonic() < deadline, "Spark never started"
        time.sleep(0.1)
    # The local stage is "starting" while Spark starts and the stage warms up, then
    # "running": the states the controller's status showed, in order.
    seen["stage"] = []
    deadline = time.monotonic() + 120
    while seen["stage"][-1:] != ["running"]:
        assert time.monotonic() < deadline, f"the stage never ran: {seen['stage']}"
        states = [p.state for site in client.status().sites for p in site.placements
                  if p.piece == "local stage"]
        if states and seen["stage"][-1:] != states:
            seen["stage"] += states
        time.sleep(0.05)
    time.sleep(2 * TIMEOUT_S)  # a death during the start would be declared by now
    spark = sessions[0]
    seen["conf"] = {key: spark.conf.get(key, None) for key in (
        "spark.sql.adaptive.enabled", "spark.driver.memory", "spark.sql.shuffle.partitions",
        "spark.jetstream.probe")}
    seen["replans"] = [q.replans for q in client.status().queries]
    stop.set()
    site.join(30)
    controller.join(30)
    return seen


def test_a_site_is_not_declared_dead_while_its_spark_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys; from pathlib import Path; "
         "from tests.test_spark_start import _probe; "
         "print('PROBE', json.dumps(_probe(Path(sys.argv[1]))))", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, f"{done.stdout}\n{done.stderr}"
    seen = json.loads(lines[0].removeprefix("PROBE "))
    [(started, up), *_] = seen["spark"]  # the first call started the JVM; the rest found it
    assert up - started > TIMEOUT_S, "Spark started too fast to tell anything"
    beats = [started, *(b for b in seen["beats"] if started < b < up), up]
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert max(gaps) < TIMEOUT_S, f"no heartbeat for {max(gaps):.1f} s while Spark started"
    assert seen["dead"] == []  # while Spark started, warmed up, and then
    assert seen["stage"] == ["starting", "running"]
    assert seen["replans"] == [0]
    # The fragment was taken while the JVM started: deploys do not wait for Spark either.
    assert seen["deployed"] and seen["deployed"][0] < up
    # The session has the defaults, under the topology's settings, under the command line's.
    assert seen["conf"] == {"spark.sql.adaptive.enabled": "false", "spark.driver.memory": "768m",
                            "spark.sql.shuffle.partitions": "3",
                            "spark.jetstream.probe": "command line"}


FAILING_JAVA = """\
#!/bin/sh
# The first launch exits at once, as a JVM that dies before it reports its port; then Java.
if [ ! -e "$0.failed" ]; then touch "$0.failed"; exit 1; fi
exec {java} "$@"
"""


def test_a_site_launches_its_jvm_again_when_the_first_launch_fails(tmp_path: Path) -> None:
    java = Path(subprocess.run(["sh", "-c", "command -v java"], capture_output=True,
                               text=True, check=True).stdout.strip()).resolve()
    home = tmp_path / "java-home"
    (home / "bin").mkdir(parents=True)
    wrapper = home / "bin" / "java"
    wrapper.write_text(FAILING_JAVA.format(java=java))
    wrapper.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-c", "import logging; logging.basicConfig(); "
         "from jetstream.dataplane.options import SiteOptions; "
         "from jetstream.dataplane.site import SiteRuntime; "
         "spark = SiteRuntime('solo', SiteOptions(spark_master='local[1]'), "
         "lambda *_: None).session(); print('ROWS', spark.range(3).count())"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "JAVA_HOME": str(home), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROWS 3" in done.stdout
    assert (home / "bin" / "java.failed").exists()  # the first launch did fail
    assert "Spark's JVM did not start" in done.stderr
    assert "launching it again (2 of 3)" in done.stderr
