"""The live dashboard: its JSON state against a global controller with fake sites, the page
and the API over HTTP, and the page itself in headless Chromium (Debian's ``chromium``;
skipped without it): on fake sites, then on a real cluster running the CDN top-k on live logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from jetstream.aggtree.loader import load_topology
from jetstream.approx.profile import LevelFigures
from jetstream.control.codec import status_to_proto
from jetstream.control.dashboard import (
    RATE_SPAN_S,
    Dashboard,
    DashboardState,
    serve_dashboard,
)
from jetstream.control.global_controller import GlobalController
from jetstream.control.launch import LocalCluster, free_port
from jetstream.control.servicers import GlobalControllerServicer
from jetstream.control.state import LinkReport, Placement
from jetstream.control.status_view import render_status
from jetstream.errors import ControlPlaneError
from jetstream.formats import InputMeter
from jetstream.lab.loggen import LogSpec, write_live
from jetstream.results import WindowResult
from jetstream.v1 import control_pb2 as pb
from tests.conftest import plan_of
from tests.test_control import (
    EXAMPLE,
    QUERY,
    SITES,
    TIMEOUT_S,
    FakeClock,
    FakeSites,
    register_all,
)

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "local-3dc.yaml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs headless Chromium on PATH (apt-get install chromium)")


class WallClock:
    """The sampler's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_767_225_600.0

    def __call__(self) -> float:
        return self.now


def window(start_s: int, *domains: tuple[str, int], revision: int = 0) -> WindowResult:
    rows = [{"domain": d, "requests": n, "kb": n * 1.5, "lb": n - 2, "ub": n,
             "guaranteed": i == 0, "complete": False,
             "bounds": [{"aggregate": "slowest", "lb": 900, "ub": None}] if i == 0 else []}
            for i, (d, n) in enumerate(domains)]
    return WindowResult(QUERY, start_s * 1000, (start_s + 10) * 1000, rows, exact=False,
                        error_bound=0.004, sites_reporting=3, sites_expected=3,
                        latency_s=1.25, wan_bytes=2_000, revision=revision)


@pytest.fixture
def running() -> GlobalController:
    """A controller whose three fake sites run the CDN top-k."""
    sites = FakeSites()
    controller = GlobalController(load_topology(TOPOLOGY), sites.deploy, sites.stop,
                                  heartbeat_timeout_s=TIMEOUT_S, clock=FakeClock())
    register_all(controller)
    controller.submit(plan_of(EXAMPLE))
    return controller


#: What a link's profile measured (jetstream.approx.profile): TPUT's exact level has no figures.
PROFILE = (LevelFigures("exact", 0.0, 0.0, 0), LevelFigures("top 320", 9_447.0, 0.031, 8),
           LevelFigures("top 20", 1_994.0, 0.53, 8))


def beat(controller: GlobalController, site: str, sent: int, *, level: int = 0,
         input_bytes: int = 0) -> None:
    reports = {} if site == "ams" else {
        QUERY: LinkReport(["exact", "top 20"][level], level, level == 1, sent, PROFILE)}
    controller.heartbeat(site, {}, input_bytes=input_bytes, reports=reports)


# --- the JSON state ----------------------------------------------------------------------------


def test_the_state_holds_the_topology_its_links_and_the_newest_window_with_bounds(
        running: GlobalController) -> None:
    clock = WallClock()
    state = DashboardState(running, clock=clock)
    running.publish(QUERY, [window(0, ("a.com", 50), ("b.com", 20))], False)
    running.publish(QUERY, [window(10, ("c.com", 70), ("a.com", 40))], False)
    running.publish(QUERY, [window(0, ("a.com", 55), ("b.com", 20), revision=1)], False)
    beat(running, "sfo", 1_000, input_bytes=50_000)
    beat(running, "sin", 500, level=1, input_bytes=30_000)
    beat(running, "ams", 0, input_bytes=99_999)  # the root's raw logs cross no link
    running.heartbeat("ams", {}, input_bytes=99_999, placements=[  # as a site reports them
        Placement(QUERY, "local stage", "ams-1", 4100, "127.0.0.1:7100", "running"),
        Placement(QUERY, "final 1/2", "ams-1", 4201, "127.0.0.1:7201", "running"),
        Placement(QUERY, "final 2/2", "ams-2", 4302, "127.0.0.1:7302", "restarting")])
    state.sample()
    snapshot = json.loads(json.dumps(state.snapshot(), allow_nan=False))

    assert (snapshot["topology"], snapshot["root"]) == ("local-3dc", "ams")
    sites = {s["name"]: s for s in snapshot["sites"]}
    assert sorted(sites) == list(SITES) and all(s["alive"] for s in sites.values())
    assert sites["ams"]["y"] < sites["sfo"]["y"] == sites["sin"]["y"]  # the root on top
    assert sites["sfo"]["input_bytes"] == 50_000
    links = {link["name"]: link for link in snapshot["links"]}
    assert sorted(links) == ["sfo->ams", "sin->ams"]
    sin = links["sin->ams"]
    assert (sin["child"], sin["parent"], sin["up"]) == ("sin", "ams", True)
    assert sin["planned_bytes_per_s"] > 0
    assert sin["planned_utilisation"] == pytest.approx(
        sin["planned_bytes_per_s"] * 8 / sin["bandwidth_bps"])
    assert sin["levels"] == {QUERY: {
        "level": "top 20", "index": 1, "pinned": True,
        "profile": [{"name": "exact", "bytes": 0.0, "error": 0.0, "windows": 0},
                    {"name": "top 320", "bytes": 9_447.0, "error": 0.031, "windows": 8},
                    {"name": "top 20", "bytes": 1_994.0, "error": 0.53, "windows": 8}]}}
    assert sin["measured_bytes_per_s"] is None  # one sample says no rate yet

    [query] = snapshot["queries"]
    assert (query["name"], query["state"]) == (QUERY, "running")
    assert query["parents"] == {"sfo": "ams", "sin": "ams"}
    latest = query["latest"]  # the newest window, not the later correction of an older one
    assert (latest["window_start"], latest["revision"]) == (10_000, 0)
    assert [(r["domain"], r["lb"], r["ub"]) for r in latest["rows"]] == [
        ("c.com", 68, 70), ("a.com", 38, 40)]
    assert query["latency"] == [[10_000, 1.25], [20_000, 1.25]]  # first revisions only
    assert snapshot["series"]["raw_bytes"] == [80_000]
    assert snapshot["series"]["wan_bytes"] == [1_500]
    assert snapshot["series"]["levels"] == {"sfo->ams": [0], "sin->ams": [1]}
    # Which process runs each piece, and whether it is up.
    assert [(p["site"], p["piece"], p["pid"], p["state"]) for p in query["pieces"]
            if p["site"] == "ams"] == [("ams", "local stage", 4100, "running"),
                                       ("ams", "final 1/2", 4201, "running"),
                                       ("ams", "final 2/2", 4302, "restarting")]


def test_wide_area_bytes_add_up_across_senders_that_start_again(
        running: GlobalController) -> None:
    clock = WallClock()
    state = DashboardState(running, clock=clock)
    for sent in (1_000, 4_000, 9_000):  # 1 kB/s... then 5 kB/s
        beat(running, "sfo", sent)
        state.sample()
        clock.now += 1
    beat(running, "sfo", 500)  # a re-plan replaced the sender: it counts from 0 again
    state.sample()
    clock.now += 4
    beat(running, "sfo", 2_500)
    state.sample()
    series = state.snapshot()["series"]
    assert series["wan_bytes"] == [1_000, 4_000, 9_000, 9_500, 11_500]
    links = {link["name"]: link for link in state.snapshot()["links"]}
    # Over every sample: they span less than RATE_SPAN_S.
    assert links["sfo->ams"]["measured_bytes_per_s"] == pytest.approx((11_500 - 1_000) / 7)
    clock.now += RATE_SPAN_S - 1
    beat(running, "sfo", 3_500)
    state.sample()
    links = {link["name"]: link for link in state.snapshot()["links"]}
    # Over the newest RATE_SPAN_S (or just more): from the sample at 9,500 bytes on.
    assert links["sfo->ams"]["measured_bytes_per_s"] == pytest.approx(
        (12_500 - 9_500) / (RATE_SPAN_S + 3))


def test_a_saturated_link_is_drawn_against_its_measured_bandwidth(
        running: GlobalController) -> None:
    configured = running.topology.link("sin", "ams").bandwidth_bps
    running.heartbeat("sin", {"ams": configured / 10})  # its sender stepped down: saturated
    links = {link["name"]: link for link in DashboardState(running).snapshot()["links"]}
    sin, sfo = links["sin->ams"], links["sfo->ams"]
    assert (sin["bandwidth_bps"], sin["measured_bandwidth_bps"]) == (configured, configured / 10)
    assert sin["planned_utilisation"] == pytest.approx(
        sin["planned_bytes_per_s"] * 8 / (configured / 10))
    assert sfo["measured_bandwidth_bps"] is None
    assert sfo["planned_utilisation"] == pytest.approx(
        sfo["planned_bytes_per_s"] * 8 / sfo["bandwidth_bps"])


def test_a_dead_site_and_its_link_show_as_down(running: GlobalController) -> None:
    clock = running.clock
    assert isinstance(clock, FakeClock)
    beat(running, "sfo", 100, level=1)
    clock.advance(TIMEOUT_S + 1)
    beat(running, "ams", 0)
    beat(running, "sin", 0)
    assert running.check_liveness() == ["sfo"]
    state = DashboardState(running)
    assert state.sample().levels == {"sin->ams": 0}  # not the dead site's last level
    snapshot = state.snapshot()
    sites = {s["name"]: s for s in snapshot["sites"]}
    assert not sites["sfo"]["alive"] and sites["sfo"]["registered"]
    links = {link["name"]: link for link in snapshot["links"]}
    assert not links["sfo->ams"]["up"] and links["sin->ams"]["up"]
    assert links["sfo->ams"]["levels"] == {}
    assert snapshot["queries"][0]["state"] == "degraded"


def test_history_is_a_bounded_ring(running: GlobalController) -> None:
    state = DashboardState(running, history=5)
    for _ in range(12):
        state.sample()
    assert len(state.snapshot()["series"]["t"]) == 5


def test_a_heartbeat_carries_the_raw_input_and_the_links_levels(
        running: GlobalController) -> None:
    servicer = GlobalControllerServicer(running, 1.0)
    servicer.Heartbeat(pb.HeartbeatRequest(site="sfo", input_bytes=123, query_links=[
        pb.LinkReport(query=QUERY, level="top 20", level_index=1, pinned=True, sent_bytes=77,
                      profile=[pb.LevelProfile(level=f.name, bytes=f.bytes, error=f.error,
                                               windows=f.windows) for f in PROFILE])]),
        context=SimpleNamespace(auth_context=dict))  # a plaintext call's: nobody checked
    assert running.sites["sfo"].input_bytes == 123
    assert running.sites["sfo"].links == {QUERY: LinkReport("top 20", 1, True, 77, PROFILE)}
    # A heartbeat without the profile (not changed, or too soon) keeps the last one.
    servicer.Heartbeat(pb.HeartbeatRequest(site="sfo", query_links=[
        pb.LinkReport(query=QUERY, level="exact", level_index=0, sent_bytes=99)]),
        context=SimpleNamespace(auth_context=dict))
    assert running.sites["sfo"].links == {QUERY: LinkReport("exact", 0, False, 99, PROFILE)}
    servicer.Heartbeat(pb.HeartbeatRequest(site="sfo", query_links=[
        pb.LinkReport(query=QUERY, level="top 20", level_index=1, pinned=True, sent_bytes=77,
                      profile=[pb.LevelProfile(level=f.name, bytes=f.bytes, error=f.error,
                                               windows=f.windows) for f in PROFILE])]),
        context=SimpleNamespace(auth_context=dict))
    # jetstream status shows the level and the profile of each query's link.
    status = render_status(status_to_proto(running.view()))
    shown = Console(width=200, record=True)
    shown.print(status)
    text = shown.export_text()
    assert "sfo -> ams" in text and "top 20 (pinned)" in text
    assert "* top 20: 1,994 B, error 0.53 (8 windows)" in text
    assert "  top 320: 9,447 B, error 0.031 (8 windows)" in text


def test_status_counts_each_sites_late_records_by_query(running: GlobalController) -> None:
    servicer = GlobalControllerServicer(running, 1.0)
    unauthenticated = SimpleNamespace(auth_context=dict)
    for site, late in (("sfo", 3), ("sin", 0), ("sfo", 1_204)):  # a running total: the newest
        servicer.Heartbeat(pb.HeartbeatRequest(site=site, late_records={QUERY: late,
                                                                        "gone": 9}),
                           context=unauthenticated)
    (view,) = [q for q in running.view().queries if q.name == QUERY]
    assert dict(view.late_records) == {"sfo": 1_204, "sin": 0}
    shown = Console(width=200, record=True)
    shown.print(render_status(status_to_proto(running.view())))
    assert "sfo: 1,204" in shown.export_text() and "sin: 0" not in shown.export_text()


def test_a_site_counts_every_log_file_that_landed_once(tmp_path: Path) -> None:
    meter = InputMeter(tmp_path)
    assert meter() == 0 and InputMeter(None)() == 0 and InputMeter(tmp_path / "none")() == 0
    (tmp_path / "part-000.csv").write_bytes(b"x" * 100)
    (tmp_path / ".part-001.csv").write_bytes(b"x" * 50)  # still being written: hidden
    assert meter() == 100
    (tmp_path / ".part-001.csv").rename(tmp_path / "part-001.csv")
    (tmp_path / "part-000.csv").unlink()  # cleaned up after it was read: it still counted
    assert meter() == 150
    (tmp_path / "part-002.jsonl.gz").write_bytes(b"x" * 7)  # any format's files
    (tmp_path / "notes.txt").write_bytes(b"x" * 1000)  # not a log file
    assert meter() == 157


# --- over HTTP ---------------------------------------------------------------------------------


@pytest.fixture
def served(running: GlobalController) -> Any:
    dashboard = serve_dashboard(running, 0, interval_s=0.2)
    yield dashboard
    dashboard.close()


def get(dashboard: Dashboard, path: str) -> tuple[int, str, bytes]:
    url = f"http://127.0.0.1:{dashboard.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def test_the_page_and_the_api_are_served_read_only(served: Dashboard,
                                                   running: GlobalController) -> None:
    status, kind, page = get(served, "/")
    assert (status, kind) == (200, "text/html; charset=utf-8")
    assert b'<svg id="graph"' in page and b"/api/state" in page
    assert b"http://" not in page.replace(b"http://www.w3.org/2000/svg", b"")  # nothing remote
    running.publish(QUERY, [window(0, ("a.com", 50))], False)
    status, kind, body = get(served, "/api/state")
    assert (status, kind) == (200, "application/json")
    state = json.loads(body)
    assert state["queries"][0]["latest"]["rows"][0]["domain"] == "a.com"
    assert get(served, "/secrets")[0] == 404
    request = urllib.request.Request(f"http://127.0.0.1:{served.port}/api/state", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 501  # no method but GET


# --- the page in headless Chromium -------------------------------------------------------------


class TopK(HTMLParser):
    """The top-k tables of a dumped page: query -> (window start, [[cell, ...] a row]), and
    the revision of each query's window."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, tuple[int, list[list[str]]]] = {}
        self.revisions: dict[str, int] = {}
        self.profiles: dict[str, list[str]] = {}  # query -> "link level" of its profile rows
        self.facts: dict[str, list[str]] = {}  # query -> its lines of facts
        self.polls = 0
        self._query = ""
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "div" and a.get("class") == "query":
            self._query = a.get("data-query") or ""
        elif tag == "span" and a.get("id") == "status":
            self.polls = int(a.get("data-polls") or 0)
        elif tag == "table" and a.get("class") == "topk":
            self.tables[self._query] = (int(a["data-window-start"] or 0), [])
            self.revisions[self._query] = int(a["data-revision"] or 0)
        elif tag == "tr" and a.get("class") == "level":
            self.profiles.setdefault(self._query, []).append(
                f"{a.get('data-link')} {a.get('data-level')}")
        elif tag == "tr" and a.get("class") == "row":
            self._row = []
        elif (tag == "td" and self._row is not None) or (tag == "p" and a.get("class") == "facts"):
            self._cell = []

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "p" and self._row is None and self._cell is not None:
            self.facts.setdefault(self._query, []).append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._query][1].append(self._row)
            self._row = None


def dump(url: str, budget_ms: int = 3000) -> TopK:
    """The page at ``url`` as headless Chromium has it after ``budget_ms`` of (virtual) time."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
         f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
        capture_output=True, text=True, timeout=120, check=True)
    page = TopK()
    page.feed(done.stdout)
    assert page.polls > 0, f"the page never drew the state:\n{done.stdout[:2000]}"
    return page


@needs_chromium
def test_the_page_draws_the_top_k_and_follows_new_windows(served: Dashboard,
                                                          running: GlobalController) -> None:
    url = f"http://127.0.0.1:{served.port}/"
    running.publish(QUERY, [window(0, ("a.com", 50), ("b.com", 20))], False)
    beat(running, "sin", 500, level=1)
    first = dump(url)
    assert first.profiles[QUERY] == ["sin->ams top 320", "sin->ams top 20"]  # the measured
    start, rows = first.tables[QUERY]
    assert start == 0
    assert [(r[0], r[1]) for r in rows] == [("a.com", "50"), ("b.com", "20")]
    assert rows[0][-2:] == ["[48, 50]; slowest [900, ?]", "certain"]
    assert rows[1][-2:] == ["[18, 20]", "likely"]
    assert not any("rolled up" in line for line in first.facts[QUERY])
    rolled = dataclasses.replace(window(10, ("<b>c.com</b>", 70)),
                                 rolled_up={"domain": "domain.lower()"})
    running.publish(QUERY, [rolled], False)
    second = dump(url)
    assert second.tables[QUERY][0] == 10_000
    assert second.tables[QUERY][1][0][0] == "<b>c.com</b>"  # text, never markup
    assert any(line.startswith("window [") and line.endswith(
        "· rolled up: domain to domain.lower()") for line in second.facts[QUERY])


@needs_chromium
@pytest.mark.slow
def test_the_page_shows_the_live_top_k_of_a_running_cluster(tmp_path: Path) -> None:
    inputs, port = tmp_path / "input", free_port()
    stop = threading.Event()
    spec = LogSpec(domains=30, late_fraction=0.01)  # some late: judged as run_local does
    writer = threading.Thread(target=write_live, args=(inputs, list(SITES)), daemon=True,
                              kwargs={"rate": 50, "spec": spec, "seed": 2, "stop": stop})
    writer.start()
    try:
        with LocalCluster(TOPOLOGY, inputs, idle_timeout_s=30, logs=tmp_path / "logs",
                          dashboard_port=port) as cluster:
            name = cluster.client.submit(EXAMPLE).query
            url = f"http://127.0.0.1:{port}/"
            seen: dict[tuple[int, int], WindowResult] = {}  # (window start, revision)

            def collect() -> None:
                with contextlib.suppress(ControlPlaneError):  # the cluster stopped
                    for result in cluster.client.results(name, timeout_s=200):
                        seen[(result.window_start, result.revision)] = result

            threading.Thread(target=collect, daemon=True).start()
            first = wait_for_window(url, cluster, name, after=-1)
            start, rows = first.tables[name]
            assert rows and all(re.fullmatch(r"site\d+\.example\.com", r[0]) for r in rows)
            shown = (start, first.revisions[name])
            deadline = time.monotonic() + 10  # the follower may be a moment behind the page
            while shown not in seen and time.monotonic() < deadline:
                time.sleep(0.2)
            assert shown in seen, "the page shows a window the controller published"
            want = [row["domain"] for row in seen[shown].rows]
            assert [r[0] for r in rows] == want[:len(rows)]
            later = wait_for_window(url, cluster, name, after=start)
            assert later.tables[name][0] >= start + 10_000  # it moved on to a newer window
    finally:
        stop.set()
        writer.join(timeout=10)


def wait_for_window(url: str, cluster: LocalCluster, query: str, *, after: int,
                    timeout_s: float = 180) -> TopK:
    """The page once it shows rows of a window of ``query`` starting later than ``after``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cluster.check_alive()
        page = dump(url)
        start, rows = page.tables.get(query, (after, []))
        if rows and start > after:
            return page
        time.sleep(2)
    msg = f"the page showed no (newer) window within {timeout_s:.0f}s\n{cluster.tail()}"
    raise AssertionError(msg)
