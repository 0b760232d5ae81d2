"""A real edge server at each PoP (jetstream.lab.edge): nginx serving wrk's requests, its access
log sent by rsyslog to its site over RELP; a site killed mid-stream and started again; the
windows equal run_local over what nginx's own access logs say it served."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import jetstream as js
from jetstream.control.launch import LocalCluster, free_port
from jetstream.lab.edge import Edge, edge_missing, site_args
from jetstream.queryfile import load_query

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "local-3dc.yaml"
SITES = ("ams", "sfo", "sin")
QUERY = """
import jetstream as js
logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA, format="json")
query = js.Query("served", logs.window(js.tumbling("5s"), watermark="2s")
                 .group_by("domain", "status").agg(requests=js.count(), kb=js.sum("bytes")))
"""

needs_edge = pytest.mark.skipif(edge_missing() is not None, reason=str(edge_missing()))


def test_edge_missing_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    missing = edge_missing()
    assert missing is not None
    assert "apt-get install nginx rsyslog wrk" in missing


@needs_edge
def test_nginx_at_each_pop_through_rsyslog_equals_its_own_access_log_with_a_site_killed(
        tmp_path: Path) -> None:
    relp = {site: free_port() for site in SITES}
    for site in SITES:
        (tmp_path / "input" / site).mkdir(parents=True)
    query = tmp_path / "served.py"
    query.write_text(QUERY)
    with ExitStack() as stack:
        cluster = stack.enter_context(LocalCluster(
            TOPOLOGY, tmp_path / "input", idle_timeout_s=3, logs=tmp_path / "logs",
            site_args=lambda s: [*site_args(relp[s]), "--warm-up", "0"]))
        cluster.client.submit(query)
        cluster.wait_for_stages("served")
        edges = {site: stack.enter_context(Edge(site, tmp_path / "edge" / site, free_port(),
                                                relp[site])) for site in SITES}
        loads = [edge.load(seconds=20, connections=2, delay_ms=2, seed=i)
                 for i, edge in enumerate(edges.values())]
        time.sleep(8)
        cluster.kill("sfo")  # what it had not acknowledged, rsyslog sends again
        time.sleep(1)
        cluster.restart("sfo")
        for load in loads:
            assert load.wait(120) == 0
        served = {site: edge.served() for site, edge in edges.items()}
        assert all(n > 5_000 for n in served.values()), served
        for site, edge in edges.items():  # nginx's own record of what it served
            (tmp_path / "served" / site).mkdir(parents=True)
            shutil.copy(edge.access_log, tmp_path / "served" / site / "access.jsonl")
        want = {(r.window_start, r.window_end): r.rows
                for r in js.run_local(load_query(query), tmp_path / "served")}
        got: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for result in cluster.client.results("served", timeout_s=180):
            got[(result.window_start, result.window_end)] = result.rows
            if got == want:
                break
    assert got == want


@needs_edge
def test_the_demo_runs_on_nginx_at_each_site() -> None:
    """``jetstream demo --edge nginx``: complete windows of the domains wrk asked nginx for."""
    jetstream = Path(sys.executable).parent / "jetstream"
    command = [str(jetstream)] if jetstream.exists() else [sys.executable, "-m", "jetstream"]
    demo = subprocess.run([*command, "demo", "--edge", "nginx", "--duration", "5", "--rate",
                           "100", "--no-dashboard"], capture_output=True, text=True,
                          check=True, timeout=300, env={**os.environ, "COLUMNS": "120"})
    assert "the access logs of a real nginx at each site" in demo.stderr
    shown = re.search(r"(\d+) complete windows shown", demo.stderr)
    assert shown and int(shown.group(1)) >= 1, demo.stderr
    assert "site0.example" in demo.stdout, demo.stdout
