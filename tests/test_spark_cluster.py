"""A site's local stage on a real Spark standalone cluster: a master and a worker started from
the pyspark package (``bin/spark-class``), a one-site topology whose ``spark_master`` is that
``spark://`` address, a replay through ``jetstream run``, and its results against
``js.run_local``. The worker runs the stage's tasks in an executor JVM of its own."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest

from jetstream.control.launch import free_port
from jetstream.local import run_local
from jetstream.queryfile import load_query

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "examples" / "logs"
SPARK_HOME = Path(pyspark.__file__).parent
HOST = "127.0.0.1"


def _spark_class(name: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": HOST,
           "SPARK_NO_DAEMONIZE": "1"}
    with log.open("ab") as out:
        return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), name, *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _wait_for(log: Path, pattern: str, process: subprocess.Popen[bytes],
              timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if re.search(pattern, text):
            return
        if process.poll() is not None:
            pytest.fail(f"{log.name} exited with {process.returncode}:\n{text[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"{log.name}: no {pattern!r} within {timeout_s:.0f}s:\n"
                f"{log.read_text(errors='replace')[-3000:]}")


@dataclass(frozen=True)
class SparkCluster:
    master: str  # spark://host:port
    work: Path  # the worker's folder: one sub-folder per application it ran executors for


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master and one worker (one core, 1 GB) on this machine."""
    folder = tmp_path_factory.mktemp("spark-cluster")
    port = free_port()
    master_url = f"spark://{HOST}:{port}"
    master = _spark_class("org.apache.spark.deploy.master.Master", "--host", HOST,
                          "--port", str(port), "--webui-port", str(free_port()),
                          log=folder / "master.log")
    worker = None
    try:
        _wait_for(folder / "master.log", r"I have been elected leader", master)
        worker = _spark_class("org.apache.spark.deploy.worker.Worker", master_url,
                              "--host", HOST, "--cores", "1", "--memory", "1g",
                              "--webui-port", str(free_port()),
                              "--work-dir", str(folder / "work"), log=folder / "worker.log")
        _wait_for(folder / "worker.log", r"Successfully registered with master", worker)
        yield SparkCluster(master_url, folder / "work")
    finally:
        for process in (worker, master):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def test_a_stage_on_a_standalone_cluster_equals_the_reference(spark_cluster: SparkCluster,
                                                               tmp_path: Path) -> None:
    topology = tmp_path / "cluster.yaml"
    topology.write_text(f"""
name: one-site-on-a-cluster
root: ams
sites:
  - name: ams
    kind: datacenter
    servers:
      - {{name: ams-1, cores: 1, memory_gb: 1}}
    sources:
      - {{name: cdn_logs, events_per_s: 100, bytes_per_event: 110, distinct_keys: 50}}
    spark_master: {spark_cluster.master}
    spark_conf:
      spark.executor.memory: 512m
      spark.cores.max: 1
      spark.driver.host: {HOST}
links: []
""")
    shutil.copytree(LOGS / "ams", tmp_path / "input" / "ams")
    query = ROOT / "examples" / "cdn_topk.py"
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "jetstream", "run", "--topology", str(topology),
         "--query", str(query), "--input", str(tmp_path / "input"), "--output", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-5000:]
    got = [json.loads(line) for line in out.read_text().splitlines()]
    want = run_local(load_query(query), LOGS / "ams")
    assert len(want) >= 3
    assert [(r["window_start"], r["rows"]) for r in got] == [
        (r.window_start, r.rows) for r in want]
    # The tasks ran in the worker's executor, not in the site's own JVM.
    assert list(spark_cluster.work.glob("app-*")), "the worker started no executor"
