"""Prometheus metrics: they move when the runtime does things, `promtool check metrics` accepts
what a real process exposes, and a real Prometheus server scrapes a running topology.

The first tests run in this process, without Spark: two sites over real gRPC, and the global
controller with stand-in sites. The last starts a controller and three sites as processes
(each site's local stage in its own Spark JVM: a minute or two) and a Prometheus server that
scrapes them every second. `promtool` and `prometheus` come with Debian's prometheus package
(`apt-get install prometheus`); without them those tests are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest

from jetstream.aggtree.loader import load_topology
from jetstream.aggtree.planner import Fragment
from jetstream.control.global_controller import GlobalController
from jetstream.control.launch import LocalCluster, free_port
from jetstream.control.server import start_server
from jetstream.dataplane.options import Assignment, SiteOptions
from jetstream.dataplane.partials import ENDED
from jetstream.dataplane.site import SiteRuntime
from jetstream.lab.loggen import LogSpec, write_logs
from jetstream.queryfile import query_from_source
from jetstream.results import WindowResult
from jetstream.stage.job import StageStats
from jetstream.v1 import dataplane_pb2_grpc as rpc
from tests.conftest import log, plan_of, spec_of
from tests.test_control import FakeSites, address
from tests.test_merger import site_batches, split

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "local-3dc.yaml"
EXAMPLE = ROOT / "examples" / "cdn_topk.py"
SOURCE = """
import jetstream as js
logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)
query = js.Query('metered', logs.window(js.tumbling('1s'), watermark='0s').group_by('domain')
                 .agg(requests=js.count()).top_k(5, by='requests'))
"""
PROMTOOL, PROMETHEUS = shutil.which("promtool"), shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not on PATH (Debian: apt-get install prometheus)")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="prometheus/promtool are not on PATH (Debian: apt-get install prometheus)")


def value(name: str, **labels: str) -> float:
    """A sample of the default registry, 0 when it has none (yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


class TwoSites:
    """An edge site sending one query's partials to the root over real gRPC."""

    def __init__(self) -> None:
        self.results: list[WindowResult] = []
        self.done = threading.Event()
        self.root = SiteRuntime("dc", SiteOptions(deadline_s=30), self._publish)
        self.root.deploy(Assignment(Fragment("metered", "dc", children=("edge",), final=True),
                                    spec_of(SOURCE), covers=("pop",)))
        self.server, port = start_server([(rpc.add_DataPlaneServicer_to_server,
                                           self.root.servicer, "jetstream.v1.DataPlane")], 0)
        self.edge = SiteRuntime("edge", SiteOptions(deadline_s=30), lambda *_: None)
        self.edge.deploy(Assignment(
            Fragment("metered", "edge", children=("pop",), parent="dc"), spec_of(SOURCE),
            parent_address=f"127.0.0.1:{port}", covers=("pop",)))
        run = self.edge.run("metered")
        assert run is not None
        self.run = run

    def _publish(self, name: str, out: list[WindowResult], finished: bool) -> None:
        self.results.extend(out)
        if finished:
            self.done.set()

    def send(self, windows: int) -> None:
        """``windows`` one-second windows of the pop's partials, then the pop's end."""
        _, site_query, partial = split(query_from_source(SOURCE, "<test>"))
        events = [log(w * 1000 + i, f"d{i % 7}.example.com") for w in range(windows)
                  for i in range(20)]
        for batch in site_batches(site_query, partial, "pop", events):
            # Closed now, as a local stage would say: the root's latency is measured from it.
            self.run.merger.add(dataclasses.replace(batch, closed_at_ms=time.time_ns() // 10**6))
            self.run.merger.progress("pop", batch.window[1])
        self.run.merger.progress("pop", ENDED, ended=True)
        assert self.done.wait(30), f"{len(self.results)} results"
        assert self.run.sender is not None and self.run.sender.flush(10)

    def close(self) -> None:
        self.edge.close()
        self.root.close()
        self.server.stop(grace=0).wait(5)


@pytest.fixture
def sites() -> Iterator[TwoSites]:
    pair = TwoSites()
    yield pair
    pair.close()


def test_windows_sent_up_a_link_move_the_link_and_window_metrics(sites: TwoSites) -> None:
    link = {"link": "edge->dc"}
    watched = {
        "sent": ("jetstream_wan_sent_bytes_total", link),
        "received": ("jetstream_wan_received_bytes_total", link),
        "edge rows": ("jetstream_records_out_total", {"site": "edge", "query": "metered"}),
        "root rows": ("jetstream_records_out_total", {"site": "dc", "query": "metered"}),
        "results": ("jetstream_window_result_latency_seconds_count", {"query": "metered"})}
    before = {key: value(name, **labels) for key, (name, labels) in watched.items()}
    assert value("jetstream_link_degradation_level", **link, query="metered") == 0
    sender = sites.run.sender
    assert sender is not None

    sites.send(windows=3)

    moved = {key: value(name, **labels) - before[key]
             for key, (name, labels) in watched.items()}
    assert moved["sent"] == sender.bytes_sent > 0
    # Every message was acked, so the root has counted every byte the edge sent.
    assert moved["received"] == moved["sent"]
    assert value("jetstream_unacked_messages", **link, query="metered") == 0
    assert moved["edge rows"] >= 3 * 5  # three windows of at least the top five domains
    assert moved["root rows"] == sum(len(r.rows) for r in sites.results) == 3 * 5
    assert moved["results"] == len(sites.results) == 3
    assert value("jetstream_window_result_latency_seconds_sum", query="metered") > 0
    # Every input has ended: nothing holds a window back.
    assert REGISTRY.get_sample_value("jetstream_watermark_lag_seconds",
                                     {"site": "edge", "query": "metered"}) == 0

    sites.edge.set_level("metered", "top 10")
    assert value("jetstream_link_degradation_level", **link, query="metered") == 3
    sites.edge.stop("metered")  # a run that is gone leaves no gauges behind
    for gauge in ("jetstream_link_degradation_level", "jetstream_unacked_messages",
                  "jetstream_watermark_lag_seconds"):
        labels = {"site": "edge"} if gauge == "jetstream_watermark_lag_seconds" else link
        assert REGISTRY.get_sample_value(gauge, {**labels, "query": "metered"}) is None, gauge


def test_the_local_stage_counts_per_micro_batch(sites: TwoSites) -> None:
    labels = {"site": "edge", "query": "metered"}
    before = (value("jetstream_records_in_total", **labels),
              value("jetstream_records_late_total", **labels),
              value("jetstream_stage_batch_duration_seconds_count", **labels))
    # The stage's stats are running totals; the metrics take what each micro-batch added,
    # each stage's apart (a union's inputs have a stage each).
    sites.run._stage_batch("edge", StageStats(records_in=100, late_records=2, batches=1,
                                              malformed=Counter({"wrong field count": 3})), 0.3)
    sites.run._stage_batch("edge", StageStats(records_in=150, late_records=2, batches=2,
                                              malformed=Counter({"wrong field count": 3,
                                                                 "ill-typed field": 1})), 0.2)
    sites.run._stage_batch("edge[more]", StageStats(records_in=40, late_records=1, batches=1),
                           0.1)
    assert value("jetstream_records_in_total", **labels) - before[0] == 190
    assert value("jetstream_records_late_total", **labels) - before[1] == 3
    assert value("jetstream_stage_batch_duration_seconds_count", **labels) - before[2] == 3
    assert value("jetstream_records_malformed_total", **labels,
                 reason="wrong field count") >= 3
    assert value("jetstream_records_malformed_total", **labels, reason="ill-typed field") >= 1


def test_the_controller_counts_replans_and_measured_bandwidth() -> None:
    topology = load_topology(TOPOLOGY)
    stand_ins = FakeSites()
    controller = GlobalController(topology, stand_ins.deploy, stand_ins.stop)
    for site in ("ams", "sfo", "sin"):
        controller.register_site(site, address(site))
    state = controller.submit(plan_of(EXAMPLE))
    before = value("jetstream_replans_total", query=state.name)
    planned = topology.link("sfo", "ams").bandwidth_bps
    controller.heartbeat("sfo", {"ams": planned / 10})  # far from the plan: a re-plan
    assert state.replans == 1
    assert value("jetstream_replans_total", query=state.name) - before == 1
    assert value("jetstream_link_measured_bandwidth_bytes_per_second",
                 link="sfo->ams") == planned / 10 / 8


def test_no_metric_has_a_group_key_or_domain_label(sites: TwoSites) -> None:
    sites.send(windows=2)
    allowed = {"site", "query", "link", "reason", "le"}
    for family in REGISTRY.collect():
        if family.name.startswith("jetstream_"):
            for sample in family.samples:
                assert set(sample.labels) <= allowed, (sample.name, sample.labels)
                assert not any("example.com" in v for v in sample.labels.values()), sample


def scrape(port: int, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return str(r.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def promtool_check(exposition: str) -> None:
    assert PROMTOOL is not None
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=exposition.encode(),
                             capture_output=True, check=False, timeout=30)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()


@needs_promtool
def test_promtool_accepts_what_a_controller_process_and_a_site_expose(
        sites: TwoSites, tmp_path: Path) -> None:
    port = free_port()
    controller = subprocess.Popen(
        [sys.executable, "-m", "jetstream", "controller", "--topology", str(TOPOLOGY),
         "--port", str(free_port()), "--insecure", "--metrics-port", str(port)],
        stdout=(tmp_path / "controller.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        exposition = scrape(port)
    finally:
        controller.terminate()
        controller.wait(15)
    assert "# TYPE jetstream_replans_total counter" in exposition
    assert "process_cpu_seconds_total" in exposition  # the default collectors come along
    promtool_check(exposition)
    # A site's metrics, with samples: this process's, after two sites have run a query.
    sites.send(windows=2)
    exposition = generate_latest(REGISTRY).decode()
    assert 'jetstream_wan_sent_bytes_total{link="edge->dc"}' in exposition
    promtool_check(exposition)


def query_prometheus(port: int, expression: str) -> list[dict[str, object]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(
        {"query": expression})
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


@needs_prometheus
def test_prometheus_scrapes_a_running_topology(tmp_path: Path) -> None:
    sites = ["ams", "sfo", "sin"]
    spec = LogSpec(domains=20, out_of_order_s=0, late_fraction=0)
    write_logs(tmp_path / "input", sites, start_ms=int(time.time() * 1000) - 20_000,
               duration_s=20, rate=20, spec=spec, seed=3, files=2)
    ports = {name: free_port() for name in ["controller", *sites]}
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # YAML reads JSON
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "jetstream", "static_configs": [
            {"targets": [f"127.0.0.1:{p}" for p in ports.values()]}]}]}))
    with LocalCluster(TOPOLOGY, tmp_path / "input", idle_timeout_s=3, logs=tmp_path / "logs",
                      metrics_port=lambda name: ports[name]) as cluster:
        for site in sites:  # a site's own exposition, with its data-plane metrics in it
            promtool_check(scrape(ports[site]))
        cluster.client.submit(EXAMPLE)
        with (tmp_path / "prometheus.log").open("wb") as out:
            prometheus = subprocess.Popen(
                [str(PROMETHEUS), f"--config.file={config}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{web}"], stdout=out, stderr=subprocess.STDOUT)
        try:
            wanted = {
                'jetstream_records_in_total{site="sfo"} > 0': 1,
                'jetstream_wan_sent_bytes_total{link="sfo->ams"} > 0': 1,
                'jetstream_wan_received_bytes_total{link="sin->ams"} > 0': 1,
                "jetstream_window_result_latency_seconds_count > 0": 1,
                "jetstream_stage_batch_duration_seconds_count > 0": 3,
                "up == 1": len(ports)}
            deadline, got = time.monotonic() + 240, {}
            while time.monotonic() < deadline:
                cluster.check_alive()
                assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()
                try:
                    got = {e: len(query_prometheus(web, e)) for e in wanted}
                except OSError:  # Prometheus is still starting
                    got = {}
                if got == wanted:
                    break
                time.sleep(2)
            assert got == wanted, f"{got}\n{cluster.tail()}"
        finally:
            prometheus.terminate()
            prometheus.wait(15)
