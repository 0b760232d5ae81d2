"""The control plane without processes: the global controller (fake sites, fake clock), site
placement, the results hub, and the gRPC API served in-process."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

import jetstream as js
from jetstream.aggtree.loader import load_topology, parse_topology
from jetstream.aggtree.planner import Fragment
from jetstream.aggtree.topology import Server, Topology
from jetstream.approx.profile import LevelFigures
from jetstream.control.client import ControllerClient
from jetstream.control.daemons import (
    PROFILE_REPORT_S,
    ProfileReports,
    heartbeat_interval,
    link_measurements,
    link_reports,
)
from jetstream.control.global_controller import GlobalController
from jetstream.control.launch import free_port
from jetstream.control.links import REPLAN_BANDWIDTH_CHANGE
from jetstream.control.results_hub import ResultsHub
from jetstream.control.server import start_server
from jetstream.control.servicers import GlobalControllerServicer
from jetstream.control.site_calls import (
    MAX_HEARTBEAT_SPACING_S,
    SiteCalls,
    beat_spacing,
    heartbeat_spacing,
)
from jetstream.control.site_controller import SiteController
from jetstream.control.state import Piece, QueryState
from jetstream.dataplane.options import Assignment, LinkState
from jetstream.errors import ControlPlaneError, PlacementError, PlanError
from jetstream.results import WindowResult
from jetstream.security import Security
from jetstream.v1 import control_pb2 as pb
from jetstream.v1 import control_pb2_grpc as rpc
from jetstream.v1.query_pb2 import QueryPlan, QuerySpec
from tests.conftest import plan_of

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cdn_topk.py"
TOPOLOGY = ROOT / "topologies" / "local-3dc.yaml"
SITES = ("ams", "sfo", "sin")
QUERY = "cdn-topk"
TIMEOUT_S = 6.0
SERVICE = "jetstream.v1.GlobalController"

# The example query with a typo in a column name: refused while it is built.
BAD_QUERY = """\
import jetstream as js
logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
query = js.Query("typo", logs.where(js.col("stauts") < 500)
                 .window(js.tumbling("10s")).agg(n=js.count()))
"""


def address(site: str) -> str:
    return f"{site}.test:7100"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeSites:
    """Stands in for the site controllers: records every deploy and stop; ``failing``
    addresses refuse deploys the way an unreachable site does."""

    deploys: list[tuple[str, Fragment, int]] = field(default_factory=list)
    stops: list[tuple[str, str]] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)

    def deploy(self, address: str, fragment: Fragment, state: QueryState
               ) -> list[tuple[str, str]]:
        if address in self.failing:
            msg = f"site at {address}: UNAVAILABLE: connection refused"
            raise ControlPlaneError(msg)
        self.deploys.append((address, fragment, state.version))
        pieces = [("local stage", f"{fragment.site}-1")] if fragment.sources else []
        if fragment.final:
            pieces.append(("final", f"{fragment.site}-1"))
        return pieces

    def stop(self, address: str, query: str) -> None:
        self.stops.append((address, query))

    def fragments_at(self, addr: str) -> list[Fragment]:
        return [f for a, f, _ in self.deploys if a == addr]

    def versions_at(self, addr: str) -> list[int]:
        return [v for a, _, v in self.deploys if a == addr]


@pytest.fixture(scope="module")
def topology() -> Topology:
    return load_topology(TOPOLOGY)


@pytest.fixture(scope="module")
def source() -> QueryPlan:
    """The example query's plan, as the CLI sends it."""
    return plan_of(EXAMPLE)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sites() -> FakeSites:
    return FakeSites()


@pytest.fixture
def controller(topology: Topology, sites: FakeSites, clock: FakeClock) -> GlobalController:
    return GlobalController(topology, sites.deploy, sites.stop, heartbeat_timeout_s=TIMEOUT_S,
                            clock=clock)


def register_all(controller: GlobalController) -> None:
    for site in SITES:
        controller.register_site(site, address(site))


def beat(controller: GlobalController, *names: str) -> None:
    for name in names:
        controller.heartbeat(name, {})


def kill_sfo(controller: GlobalController, clock: FakeClock) -> list[str]:
    """Let sfo go silent past the timeout while ams and sin keep beating."""
    clock.advance(TIMEOUT_S - 1)
    beat(controller, "ams", "sin")
    clock.advance(2)
    return controller.check_liveness()


# --- the global controller: deploying ------------------------------------------------------


def _placed(controller: GlobalController, site: str) -> list[tuple[str, str, str]]:
    """(query, piece, server) of what the controller knows runs at ``site``."""
    return [(p.query, p.piece, p.server) for p in controller.sites[site].placements]


def test_submit_deploys_each_alive_site_its_fragment(controller: GlobalController,
                                                     sites: FakeSites, source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    assert (state.name, state.state, state.replans, state.detail) == (QUERY, "running", 0, "")
    assert state.plan is not None
    assert sorted(state.plan.fragments) == list(SITES)
    for site in SITES:
        assert sites.fragments_at(address(site)) == [state.plan.fragments[site]]
    root = state.plan.fragments["ams"]
    assert root.final and root.children == ("sfo", "sin") and root.parent is None
    assert state.plan.fragments["sfo"].parent == "ams"
    assert state.deployed == set(SITES)
    assert _placed(controller, "ams") == [(QUERY, "local stage", "ams-1"),
                                                  (QUERY, "final", "ams-1")]
    assert controller.heartbeat("sin", {}) == [QUERY]
    assert sites.stops == []


def test_a_query_no_site_could_run_is_refused_at_submit(controller: GlobalController,
                                                         source: QueryPlan) -> None:
    register_all(controller)
    plain = QueryPlan()
    plain.CopyFrom(source)
    plain.name = "plain"
    del plain.steps[3:]  # source, where, with_column: no window, no aggregate
    with pytest.raises(PlanError, match=r"end the query with \.window\(\.\.\.\)"):
        controller.submit(plain)
    assert "plain" not in controller.queries


def _plan_of_query(query: js.Query) -> QueryPlan:
    from jetstream.planwire import query_to_proto

    return query_to_proto(query)


def test_what_no_site_could_run_is_refused_at_submit_naming_the_step(
        controller: GlobalController, sites: FakeSites) -> None:
    register_all(controller)
    logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
    more = js.source("more_logs", schema=js.CDN_LOG_SCHEMA)
    windowed = [s.window(js.tumbling("10s")).group_by("pop").agg(n=js.count())
                for s in (logs, more)]
    union = js.Query("u", windowed[0].union(windowed[1]))
    with pytest.raises(PlanError, match=r"query u: the local stage runs one partial aggregate, "
                                        r"the plan has 2 .*union the raw streams, then window"):
        controller.submit(_plan_of_query(union))
    mapped = js.Query("m", logs.map(lambda r: r, name="same").window(js.tumbling("10s"))
                      .agg(n=js.count()))
    with pytest.raises(PlanError, match=r"map same: this process does not run code sent "
                                        r"with a query; start the controller and the "
                                        r"sites with --allow-code"):
        controller.submit(_plan_of_query(mapped))
    assert controller.queries == {} and sites.deploys == []


def test_a_map_is_refused_at_submit_where_the_plan_sends_it_to_a_site_that_runs_no_code(
        topology: Topology, sites: FakeSites) -> None:
    controller = GlobalController(topology, sites.deploy, sites.stop, allow_code=True)
    logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
    mapped = _plan_of_query(js.Query("m", logs.map(lambda r: r, name="same")
                                     .window(js.tumbling("10s")).agg(n=js.count())))
    controller.register_site("ams", address("ams"), allows_code=True)
    controller.register_site("sfo", address("sfo"), allows_code=False)
    controller.register_site("sin", address("sin"), allows_code=False)
    with pytest.raises(PlacementError, match=r"query m: map same travels as code, and the plan "
                                             r"sends it to sites that run none \(started "
                                             r"without --allow-code\): sfo, sin; start them"):
        controller.submit(mapped)
    assert controller.queries == {} and sites.deploys == []
    controller.submit(plan_of(EXAMPLE))  # no map: the same sites run it
    assert set(controller.queries) == {"cdn-topk"}
    for site in ("sfo", "sin"):  # once they run code, so does the map
        controller.register_site(site, address(site), allows_code=True)
    controller.submit(mapped)
    assert set(controller.queries) == {"cdn-topk", "m"}


def test_a_stage_that_fails_at_a_site_reaches_status_and_results(
        controller: GlobalController, source: QueryPlan) -> None:
    register_all(controller)
    controller.submit(source)
    controller.publish(QUERY, [WindowResult(QUERY, 0, 10_000, [{"domain": "a.com"}])], False)
    (before,) = controller.results.follow(QUERY, stop=lambda: True)
    assert (before.final, before.provisional, before.warnings) == (True, [], [])
    error = "local stage of cdn-topk at sfo failed: map boom: the function raised ValueError"
    controller.heartbeat("sfo", {}, failures={QUERY: error})
    view = controller.view().query(QUERY)
    assert view is not None
    assert (view.state, dict(view.failures), view.detail) == ("degraded", {"sfo": error}, error)
    # Every window from now on may lack sfo's records (its stage reports its input ended,
    # so the merge does not wait for it): none is final.
    controller.publish(QUERY, [WindowResult(QUERY, 10_000, 20_000, [{"domain": "a.com"}])],
                       False)
    (_, result) = controller.results.follow(QUERY, stop=lambda: True)
    assert result.warnings == [f"the local stage at sfo failed, its records are missing: "
                               f"{error}"]
    assert (result.final, result.provisional) == (False, ["missing site"])


def test_finished_results_stop_the_query_everywhere_and_free_its_name(
        controller: GlobalController, sites: FakeSites, source: QueryPlan) -> None:
    register_all(controller)
    controller.submit(source)
    controller.publish(QUERY, [WindowResult(QUERY, 0, 10_000, [{"domain": "a.com"}])], False)
    assert controller.queries[QUERY].state == "running" and sites.stops == []
    controller.publish(QUERY, [], True)
    assert controller.queries[QUERY].state == "finished"
    assert sorted(sites.stops) == sorted((address(s), QUERY) for s in SITES)
    assert [r.window_start for r in controller.results.follow(QUERY, stop=lambda: False)] == [0]
    assert controller.submit(source).state == "running"  # the name may be used again


def test_a_site_that_registers_late_gets_its_fragment_then(
        controller: GlobalController, sites: FakeSites, source: QueryPlan) -> None:
    controller.register_site("ams", address("ams"))
    state = controller.submit(source)
    assert state.plan is not None
    # Sites not heard from yet are planned for: they only have to show up.
    assert sorted(state.plan.fragments) == list(SITES)
    assert [a for a, _, _ in sites.deploys] == [address("ams")]
    assert state.deployed == {"ams"}

    controller.register_site("sfo", address("sfo"))
    assert [f.site for f in sites.fragments_at(address("sfo"))] == ["sfo"]
    assert sites.fragments_at(address("sin")) == []
    controller.register_site("sin", address("sin"))
    assert [f.site for f in sites.fragments_at(address("sin"))] == ["sin"]
    assert state.deployed == set(SITES)
    assert state.state == "running"
    assert controller.heartbeat("sin", {}) == [QUERY]


def test_a_first_registration_is_not_a_replan(controller: GlobalController, sites: FakeSites,
                                              source: QueryPlan) -> None:
    controller.register_site("ams", address("ams"))
    state = controller.submit(source)
    controller.register_site("sfo", address("sfo"))
    assert (state.replans, state.version, state.detail) == (0, 0, "")
    assert len(sites.fragments_at(address("ams"))) == 1  # ams's plan did not change


def test_a_failed_deploy_is_retried_on_the_sites_next_heartbeat(
        controller: GlobalController, sites: FakeSites, source: QueryPlan) -> None:
    register_all(controller)
    sites.failing.add(address("sfo"))
    state = controller.submit(source)
    assert state.deployed == {"ams", "sin"}  # one bad site does not stop the others
    assert _placed(controller, "sfo") == []
    assert controller.heartbeat("sfo", {}) == [QUERY]  # planned there: keep what runs
    assert state.deployed == {"ams", "sin"}  # still failing

    sites.failing.clear()
    assert controller.heartbeat("sfo", {}) == [QUERY]
    assert state.plan is not None
    assert sites.fragments_at(address("sfo")) == [state.plan.fragments["sfo"]]
    assert _placed(controller, "sfo") == [(QUERY, "local stage", "sfo-1")]
    assert state.deployed == set(SITES)
    assert len(sites.fragments_at(address("ams"))) == 1  # the others are not redeployed


# --- the global controller: liveness -------------------------------------------------------


def test_a_silent_site_is_declared_dead_and_the_query_replanned_without_it(
        controller: GlobalController, sites: FakeSites, clock: FakeClock,
        source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    clock.advance(TIMEOUT_S - 1)
    assert controller.check_liveness() == []  # not yet: ams and sin beat, sfo is merely late
    beat(controller, "ams", "sin")
    clock.advance(2)
    assert controller.check_liveness() == ["sfo"]

    assert controller.sites["sfo"].alive is False
    assert _placed(controller, "sfo") == []
    assert (state.state, state.replans, state.version) == ("degraded", 1, 1)
    assert "sfo" in state.detail
    assert state.plan is not None
    assert sorted(state.plan.fragments) == ["ams", "sin"]
    assert "sfo" not in state.plan.tree
    assert state.plan.fragments["ams"].children == ("sin",)
    assert state.deployed == {"ams", "sin"}
    # The survivors get the new plan; the dead site is not called at all.
    assert sites.fragments_at(address("ams"))[-1] == state.plan.fragments["ams"]
    assert sites.versions_at(address("ams")) == [0, 1]
    assert sites.versions_at(address("sin")) == [0, 1]
    assert sites.versions_at(address("sfo")) == [0]
    assert not [s for s in sites.stops if s[0] == address("sfo")]
    assert "sfo" not in controller.effective_topology().graph()

    assert controller.check_liveness() == []  # dead once, re-planned once
    assert state.replans == 1


def test_a_site_that_shuts_down_is_planned_out_at_once_and_back_in_when_it_registers(
        controller: GlobalController, clock: FakeClock, source: QueryPlan,
        caplog: pytest.LogCaptureFixture) -> None:
    register_all(controller)
    state = controller.submit(source)
    controller.leave("sfo")
    assert controller.sites["sfo"].alive is False
    assert state.plan is not None and sorted(state.plan.fragments) == ["ams", "sin"]
    assert (state.state, state.replans) == ("degraded", 1)
    assert state.detail == "site sfo shut down; no data from sfo"
    controller.leave("sfo")  # said twice: planned out once
    clock.advance(TIMEOUT_S + 1)
    beat(controller, "ams", "sin")
    assert controller.check_liveness() == []  # not dead on top
    assert state.replans == 1
    assert "missed its heartbeats" not in caplog.text
    controller.register_site("sfo", address("sfo"))
    assert "sfo" in state.plan.fragments
    assert state.state == "running"


@pytest.mark.parametrize("how", ["heartbeat", "register"])
def test_a_dead_site_that_comes_back_is_planned_in_again(
        how: str, controller: GlobalController, sites: FakeSites, clock: FakeClock,
        source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    assert kill_sfo(controller, clock) == ["sfo"]
    new_address = address("sfo") if how == "heartbeat" else "sfo.test:7200"
    if how == "heartbeat":
        assert controller.heartbeat("sfo", {}) == [QUERY]
    else:
        controller.register_site("sfo", new_address)

    assert controller.sites["sfo"].alive is True
    assert (state.state, state.replans) == ("running", 2)
    assert "sfo" in state.detail
    assert state.plan is not None
    assert sorted(state.plan.fragments) == list(SITES)
    assert state.plan.fragments["ams"].children == ("sfo", "sin")
    assert sites.fragments_at(new_address)[-1] == state.plan.fragments["sfo"]
    assert sites.deploys[-1][2] == state.version == 2
    assert state.deployed == set(SITES)
    assert _placed(controller, "sfo") == [(QUERY, "local stage", "sfo-1")]


def test_a_site_on_a_thin_link_beats_less_often_and_is_given_longer(
        topology: Topology, sites: FakeSites, clock: FakeClock) -> None:
    thin = dataclasses.replace(topology, links=tuple(
        dataclasses.replace(link, bandwidth_bps=4_000) if "sin" in link.ends else link
        for link in topology.links))
    # 600 B of heartbeat and answer in a twentieth of 4 kbit/s: one every 24 s at most.
    assert heartbeat_spacing(thin, "sin") == pytest.approx(24.0)
    assert heartbeat_spacing(thin, "sfo") < 0.05
    controller = GlobalController(thin, sites.deploy, sites.stop,
                                  heartbeat_timeout_s=TIMEOUT_S, clock=clock)
    assert controller.timeout_of("sin") == pytest.approx(72.0)  # three of its heartbeats
    assert controller.timeout_of("sfo") == TIMEOUT_S
    servicer = GlobalControllerServicer(controller, 0.5)
    plaintext = SimpleNamespace(auth_context=dict)  # a call's context on a plaintext server
    intervals = {site: servicer.RegisterSite(pb.RegisterSiteRequest(
        site=site, address=address(site)), plaintext).heartbeat_interval_s  # type: ignore[arg-type]
        for site in SITES}
    assert intervals == {"ams": 0.5, "sfo": 0.5, "sin": pytest.approx(24.0)}

    clock.advance(TIMEOUT_S + 1)
    beat(controller, "ams")
    assert controller.check_liveness() == ["sfo"]  # sin is not late: it beats every 24 s
    clock.advance(72.0 - TIMEOUT_S)
    beat(controller, "ams")
    assert controller.check_liveness() == ["sin"]


def test_a_site_that_says_its_heartbeats_are_further_apart_is_given_longer(
        controller: GlobalController, clock: FakeClock) -> None:
    register_all(controller)
    # sfo's senders time its link at 20 kbit/s: it beats every 4.8 s, and says so.
    assert beat_spacing(20_000) == pytest.approx(4.8)
    assert beat_spacing(None) == beat_spacing(0) == 0
    assert beat_spacing(10) == MAX_HEARTBEAT_SPACING_S  # however thin, not for ever
    servicer = GlobalControllerServicer(controller, 1.0)
    plaintext = SimpleNamespace(auth_context=dict)  # a call's context on a plaintext server
    servicer.Heartbeat(pb.HeartbeatRequest(site="sfo", interval_s=beat_spacing(20_000)),
                       plaintext)  # type: ignore[arg-type]
    beat(controller, "ams", "sin")
    assert controller.timeout_of("sfo") == pytest.approx(14.4)
    clock.advance(TIMEOUT_S + 1)
    beat(controller, "ams", "sin")
    assert controller.check_liveness() == []  # not late: three of its 4.8 s
    clock.advance(14.4 - TIMEOUT_S)
    beat(controller, "ams", "sin")
    assert controller.check_liveness() == ["sfo"]
    # A site's word is held to the most there is.
    controller.register_site("sfo", address("sfo"))
    assert controller.timeout_of("sfo") == TIMEOUT_S  # registered again: as given
    controller.heartbeat("sfo", {}, interval_s=3_600)
    assert controller.timeout_of("sfo") == 3 * MAX_HEARTBEAT_SPACING_S
    for garbage in (math.nan, -5.0, 0.0):
        controller.heartbeat("sfo", {}, interval_s=garbage)
        assert controller.timeout_of("sfo") == TIMEOUT_S


def test_a_site_beats_less_often_where_its_senders_time_its_links_thin() -> None:
    def link(rate_bps: float | None) -> LinkState:
        return LinkState("ams", "exact", 0, False, 100, None, rate_bps)

    assert heartbeat_interval(1.0, {}) == 1.0  # nothing timed: as given
    assert heartbeat_interval(1.0, {"a": link(None), "b": link(1e9)}) == 1.0  # fast
    assert heartbeat_interval(1.0, {"a": link(20_000)}) == pytest.approx(4.8)
    # By the fastest: the controller is reached by the best way out.
    assert heartbeat_interval(1.0, {"a": link(20_000), "b": link(40_000)}) == pytest.approx(2.4)
    assert heartbeat_interval(30.0, {"a": link(20_000)}) == 30.0  # never shorter than given
    # A link whose policy's throughput is lower (a window slow to be acked capped it) is
    # as thin as that, whatever its last acks of small parts said.
    capped = LinkState("ams", "heaviest 256", 2, False, 100, 2_500.0, 1e9)
    assert heartbeat_interval(1.0, {"a": capped}) == pytest.approx(4.8)


def test_a_link_s_profile_goes_in_a_heartbeat_when_it_changed_at_most_every_30_s() -> None:
    clock = FakeClock()
    reports = ProfileReports(clock=clock)
    figures = (LevelFigures("exact", 9_000.0, 0.0, 3), LevelFigures("top 20", 900.0, 0.4, 3))
    link = LinkState("ams", "exact", 0, False, 100, None, None, figures)
    assert reports({"q": link})["q"].profile == figures  # the first
    clock.now += 5.0
    assert reports({"q": link})["q"].profile == ()  # unchanged
    changed = dataclasses.replace(link, profile=figures[:1])
    assert reports({"q": changed})["q"].profile == ()  # changed, but too soon
    clock.now += PROFILE_REPORT_S
    assert reports({"q": changed})["q"].profile == figures[:1]
    assert reports({"q": dataclasses.replace(link, profile=())})["q"].profile == ()


def test_the_root_dying_degrades_the_query_instead_of_raising(
        controller: GlobalController, clock: FakeClock, sites: FakeSites,
        source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    clock.advance(TIMEOUT_S - 1)
    beat(controller, "sfo", "sin")
    clock.advance(2)
    assert controller.check_liveness() == ["ams"]
    assert state.state == "degraded"
    assert "the root ams is down" in state.detail, state.detail
    # Restarted elsewhere: the same tree, but its children must learn the new address.
    controller.register_site("ams", "ams.test:7200")
    assert (state.state, state.version) == ("running", 1)
    assert sites.versions_at("ams.test:7200") == [1]
    assert sites.versions_at(address("sfo")) == sites.versions_at(address("sin")) == [0, 1]


def test_a_site_that_does_not_answer_holds_up_no_heartbeat_and_no_other_site(
        topology: Topology, clock: FakeClock, source: QueryPlan) -> None:
    """With each site's calls made on a thread of its own, a deploy that waits on a site
    holds neither the controller's lock nor the calls to the other sites; when it lands
    after a re-plan, it is not taken for the newer version."""
    sites, answer = FakeSites(), threading.Event()

    def deploy(at: str, fragment: Fragment, state: QueryState) -> list[tuple[str, str]]:
        if at == address("sfo"):
            assert answer.wait(10), "never answered"
        return sites.deploy(at, fragment, state)

    calls = SiteCalls()
    controller = GlobalController(topology, deploy, sites.stop, heartbeat_timeout_s=TIMEOUT_S,
                                  clock=clock, dispatch=calls)
    try:
        register_all(controller)
        state = controller.submit(source)  # back at once, sfo's deploy still under way
        deadline = time.monotonic() + 10
        while state.deployed != {"ams", "sin"} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state.deployed == {"ams", "sin"}
        clock.advance(TIMEOUT_S - 1)
        beat(controller, "ams", "sfo")  # answered; sfo's deploy is not asked for twice
        clock.advance(2)
        assert controller.check_liveness() == ["sin"]  # version 1, without sin
        answer.set()
        while state.deployed != {"ams", "sfo"} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sites.versions_at(address("sfo")) == [0, 1]
        assert (state.version, state.deployed) == (1, {"ams", "sfo"})
        assert [p[0] for p in controller.sites["sfo"].placements] == [QUERY]
    finally:
        answer.set()
        calls.close()


# --- the global controller: measured bandwidth ---------------------------------------------


@pytest.mark.parametrize(("factor", "replans"), [
    (0.7, 1),  # 30% slower
    (1.3, 1),  # 30% faster
    (0.8, 0),  # 20%: within the tolerance
    (1.0 + REPLAN_BANDWIDTH_CHANGE, 0),  # exactly at the threshold
])
def test_a_large_bandwidth_change_replans_and_a_small_one_does_not(
        factor: float, replans: int, controller: GlobalController, sites: FakeSites,
        topology: Topology, source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    planned = topology.link("sfo", "ams").bandwidth_bps
    assert controller.heartbeat("sfo", {"ams": planned * factor}) == [QUERY]
    assert state.replans == replans
    assert state.state == "running"
    # Three sites in a star: any bandwidth gives the same tree, so nothing is deployed again.
    assert (len(sites.deploys), state.version) == (3, 0)
    if replans:
        assert "bandwidth" in state.detail and "sfo-ams" in state.detail
    # The measurement is what later plans use, re-planned now or not.
    link = controller.effective_topology().link("ams", "sfo")
    assert link.bandwidth_bps == pytest.approx(planned * factor)


def test_a_measurement_of_a_link_the_topology_lacks_is_ignored(
        controller: GlobalController, source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    assert controller.heartbeat("sfo", {"sin": 1.0, "nowhere": 5.0}) == [QUERY]
    assert state.replans == 0


def test_a_bandwidth_drifting_away_from_the_plan_in_small_steps_replans(
        controller: GlobalController, topology: Topology, source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    planned = topology.link("sfo", "ams").bandwidth_bps
    controller.heartbeat("sfo", {"ams": planned * 0.8})  # 20% below the plan: fine
    assert state.replans == 0
    controller.heartbeat("sfo", {"ams": planned * 0.62})  # 38% below the plan
    assert state.replans == 1


def test_a_link_measured_below_what_exact_partials_need_is_planned_as_configured(
        controller: GlobalController, clock: FakeClock, sites: FakeSites,
        source: QueryPlan) -> None:
    """A saturated link's measurement is below what its exact partials need: the plan falls
    back to the configured bandwidths (the link degrades) rather than failing, and later
    re-plans (a site that dies and comes back) go on working."""
    register_all(controller)
    state = controller.submit(source)
    controller.heartbeat("sfo", {"ams": 100.0})  # 100 bit/s: no tree fits
    assert (state.state, state.replans) == ("running", 1)
    assert "measured bandwidth of sfo-ams changed" in state.detail
    assert "cannot re-plan" not in state.detail
    assert state.plan is not None and "sfo" in state.plan.fragments
    assert kill_sfo(controller, clock) == ["sfo"]
    assert state.state == "degraded" and "sfo" not in state.plan.fragments
    controller.heartbeat("sfo", {"ams": 100.0})  # back, still saturated
    assert state.state == "running" and "sfo" in state.plan.fragments
    assert sites.fragments_at(address("sfo"))[-1].parent == "ams"


@pytest.mark.parametrize(("factor", "replans_back"), [(0.3, 1), (0.9, 0)])
def test_a_measurement_no_heartbeat_repeats_is_forgotten(
        factor: float, replans_back: int, controller: GlobalController, clock: FakeClock,
        topology: Topology, source: QueryPlan) -> None:
    """A site measures a link only while it is saturated: once its heartbeats stop saying
    so, the link is planned at its configured bandwidth again, re-planned if that is far
    from what the plans assumed."""
    register_all(controller)
    state = controller.submit(source)
    configured = topology.link("sfo", "ams").bandwidth_bps
    controller.heartbeat("sfo", {"ams": configured * factor})
    replans = state.replans
    for _ in range(4):  # repeated: it stands
        clock.advance(TIMEOUT_S / 2)
        controller.heartbeat("sfo", {"ams": configured * factor})
        beat(controller, "ams", "sin")
        assert controller.expire_measurements() == []
    assert controller.effective_topology().link("sfo", "ams").bandwidth_bps == \
        pytest.approx(configured * factor)
    gauge = ("jetstream_link_measured_bandwidth_bytes_per_second", {"link": "sfo->ams"})
    assert REGISTRY.get_sample_value(*gauge) == pytest.approx(configured * factor / 8)
    for _ in range(5):  # no longer said: forgotten after two heartbeat timeouts
        clock.advance(TIMEOUT_S / 2)
        beat(controller, *SITES)
        assert controller.check_liveness() == []
        forgotten = controller.expire_measurements()
    assert forgotten == ["sfo-ams"]
    assert REGISTRY.get_sample_value(*gauge) is None  # not its last value forever
    assert controller.effective_topology().link("sfo", "ams").bandwidth_bps == configured
    assert state.replans == replans + replans_back
    if replans_back:
        assert "no recent measurement of sfo-ams" in state.detail
    assert controller.expire_measurements() == []


def test_a_link_measured_at_zero_does_not_break_the_heartbeat(
        controller: GlobalController, source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    assert controller.heartbeat("sfo", {"ams": 0.0}) == [QUERY]
    assert state.state == "degraded"
    assert "sfo" in state.detail


def test_a_link_measured_at_zero_stays_cut_when_the_plan_falls_back_to_configured(
        controller: GlobalController, source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    controller.heartbeat("sfo", {"ams": 0.0})  # cut
    controller.heartbeat("sin", {"ams": 100.0})  # saturated: no tree fits what it measured
    assert state.plan is not None and sorted(state.plan.fragments) == ["ams", "sin"]
    assert state.state == "degraded" and "no data from sfo" in state.detail


TWO_PATHS = """
name: two-paths
root: dc
sites:
  - {name: pop, kind: pop, servers: [{name: p, cores: 2, memory_gb: 4}],
     sources: [{name: cdn_logs, events_per_s: 5000, distinct_keys: 50000}]}
  - {name: mid0, kind: datacenter, servers: [{name: m0, cores: 4, memory_gb: 8}]}
  - {name: mid1, kind: datacenter, servers: [{name: m1, cores: 4, memory_gb: 8}]}
  - {name: dc, kind: datacenter, servers: [{name: d, cores: 8, memory_gb: 16}]}
links:
  - {between: [pop, mid0], bandwidth: 100mbit, latency: 10ms}
  - {between: [pop, mid1], bandwidth: 100mbit, latency: 20ms}
  - {between: [mid0, dc], bandwidth: 1gbit, latency: 10ms}
  - {between: [mid1, dc], bandwidth: 1gbit, latency: 10ms}
"""


def test_a_measurement_that_moves_the_tree_deploys_a_new_version(
        sites: FakeSites, source: QueryPlan) -> None:
    controller = GlobalController(parse_topology(TWO_PATHS), sites.deploy, sites.stop)
    for site in ("pop", "mid0", "mid1", "dc"):
        controller.register_site(site, address(site))
    state = controller.submit(source)
    assert sites.fragments_at(address("pop"))[-1].parent == "mid0"  # the nearer one
    controller.heartbeat("pop", {"mid0": 100_000.0})  # too thin for exact partials
    assert (state.state, state.replans, state.version) == ("running", 1, 1)
    assert sites.fragments_at(address("pop"))[-1].parent == "mid1"
    assert sorted(a for a, _, v in sites.deploys if v == 1) == [
        address("dc"), address("mid1"), address("pop")]
    assert sites.stops == [(address("mid0"), QUERY)]  # it relays nothing now


# --- the global controller: queries and refusals -------------------------------------------


def test_cancel_stops_every_deployed_site_and_closes_the_results(
        controller: GlobalController, sites: FakeSites, source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    controller.results.publish(WindowResult(QUERY, 0, 10_000, [{"domain": "a.com"}]))
    controller.cancel(QUERY)
    assert sorted(sites.stops) == [(address(s), QUERY) for s in SITES]
    assert (state.state, state.deployed) == ("cancelled", set())
    assert all(_placed(controller, s) == [] for s in SITES)
    assert controller.heartbeat("ams", {}) == []
    # Closed: a follower gets what was published and then the end, without waiting.
    started = time.monotonic()
    assert [r.window_start for r in controller.results.follow(QUERY, stop=lambda: False)] == [0]
    assert time.monotonic() - started < 0.4
    assert controller.link_load()[0][1] == 0.0  # a cancelled query plans no load


def test_cancel_leaves_a_dead_site_alone(controller: GlobalController, sites: FakeSites,
                                         clock: FakeClock, source: QueryPlan) -> None:
    register_all(controller)
    controller.submit(source)
    kill_sfo(controller, clock)
    controller.cancel(QUERY)
    assert sorted(sites.stops) == [(address("ams"), QUERY), (address("sin"), QUERY)]


def test_the_same_query_twice_is_refused_until_cancelled(
        controller: GlobalController, sites: FakeSites, source: QueryPlan) -> None:
    register_all(controller)
    first = controller.submit(source)
    with pytest.raises(ControlPlaneError, match="query cdn-topk is already running; cancel it"):
        controller.submit(source)
    assert controller.queries[QUERY] is first
    assert len(sites.deploys) == 3

    controller.cancel(QUERY)
    again = controller.submit(source)
    assert again is not first and again.state == "running"
    assert len(sites.deploys) == 6


def test_a_resubmitted_query_has_a_fresh_open_result_stream(
        controller: GlobalController, source: QueryPlan) -> None:
    register_all(controller)
    controller.submit(source)
    controller.results.publish(WindowResult(QUERY, 0, 10_000))
    controller.cancel(QUERY)
    controller.submit(source)

    seen: list[WindowResult] = []
    follower = threading.Thread(target=lambda: seen.extend(
        controller.results.follow(QUERY, stop=lambda: False)), daemon=True)
    follower.start()
    follower.join(0.5)
    try:
        assert follower.is_alive(), f"the stream ended at once after yielding {seen}"
        assert seen == []
    finally:
        controller.results.close(QUERY)
        follower.join(2)


def test_a_bad_plan_is_refused_naming_the_step_and_the_column(
        controller: GlobalController, sites: FakeSites, source: QueryPlan) -> None:
    """The controller checks a plan step by step as the DSL checks a query file: a plan
    whose filter reads a column no step makes (a client's bug, or a forged plan) is refused."""
    register_all(controller)
    bad = QueryPlan()
    bad.CopyFrom(source)
    bad.steps[1].where.compare.left.col = "stauts"
    with pytest.raises(PlanError, match=r"cdn-topk: step 2: where: unknown column 'stauts'"):
        controller.submit(bad)
    with pytest.raises(PlanError, match="stauts"):
        controller.explain(bad)
    assert controller.queries == {}
    assert sites.deploys == []


def test_unknown_sites_and_heartbeats_before_registering_are_refused(
        controller: GlobalController) -> None:
    with pytest.raises(ControlPlaneError, match="sfo sent a heartbeat before registering"):
        controller.heartbeat("sfo", {})
    with pytest.raises(ControlPlaneError, match=r"no site named 'lhr'.*ams, sfo, sin"):
        controller.heartbeat("lhr", {})
    with pytest.raises(ControlPlaneError, match="no site named 'lhr'"):
        controller.register_site("lhr", "lhr.test:7100")
    with pytest.raises(ControlPlaneError, match="no query named 'nope'"):
        controller.cancel("nope")
    assert not any(s.alive for s in controller.sites.values())


def test_explain_shows_the_rewrites_and_the_plan_on_the_live_topology(
        controller: GlobalController, clock: FakeClock, source: QueryPlan) -> None:
    register_all(controller)
    text = controller.explain(source)
    assert "rewrites" in text and "physical plan on local-3dc (root ams)" in text
    assert "  sfo: local stage -> ams" in text
    kill_sfo(controller, clock)
    assert "  sfo:" not in controller.explain(source)
    assert controller.queries == {}  # explaining submits nothing


# --- the site controller -------------------------------------------------------------------


SERVERS = [Server("small", 1, 1.0), Server("big", 4, 8.0), Server("mid", 2, 4.0),
           Server("also-mid", 2, 4.0)]


def test_the_local_stage_runs_on_the_biggest_server() -> None:
    site = SiteController("lhr", SERVERS)
    leaf = Fragment("q", "lhr", sources=("cdn_logs",), parent="ams")
    assert site.deploy(leaf, 0) == [Piece("q", "local stage", "big")]
    assert site.running() == ["q"]


def test_merge_and_final_partitions_spread_over_servers_largest_first() -> None:
    site = SiteController("lhr", SERVERS)
    merge = Fragment("m", "lhr", children=("a", "b"), parent="ams", partitions=4)
    # Equal cores: by name. A partition per server (the planner makes no more).
    assert [(p.name, p.server) for p in site.deploy(merge, 0)] == [
        ("merge 1/4", "big"), ("merge 2/4", "also-mid"), ("merge 3/4", "mid"),
        ("merge 4/4", "small")]
    with pytest.raises(ControlPlaneError, match="lhr has 4 servers for the 5 partitions of x"):
        site.deploy(Fragment("x", "lhr", children=("a",), parent="ams", partitions=5), 0)
    root = Fragment("r", "lhr", sources=("cdn_logs",), children=("a",), final=True,
                    partitions=2)
    assert [(p.name, p.server) for p in site.deploy(root, 0)] == [
        ("local stage", "big"), ("final 1/2", "big"), ("final 2/2", "also-mid")]
    single = Fragment("s", "lhr", children=("a",), final=True)
    assert [p.name for p in site.deploy(single, 0)] == ["final"]
    assert site.running() == ["m", "r", "s"]
    assert len(site.pieces()) == 4 + 3 + 1


def test_an_older_fragment_version_is_refused() -> None:
    site = SiteController("lhr", SERVERS)
    v1 = Fragment("q", "lhr", sources=("cdn_logs",), parent="ams")
    v2 = Fragment("q", "lhr", sources=("cdn_logs",), children=("x",), parent="ams")
    site.deploy(v1, 1)
    assert [p.name for p in site.deploy(v2, 2)] == ["local stage", "merge"]
    with pytest.raises(ControlPlaneError,
                       match="runs version 2 of q; refusing the older version 1"):
        site.deploy(v1, 1)
    assert [p.name for p in site.pieces()] == ["local stage", "merge"]  # untouched
    assert [p.name for p in site.deploy(v1, 2)] == ["local stage"]  # the same version: again


def test_a_site_measures_a_link_only_where_the_link_paces_a_query() -> None:
    def link(parent: str, level: str, index: int, sent: int, throughput: float | None,
             saturated: bool) -> LinkState:
        return LinkState(parent, level, index, False, sent, throughput, saturated=saturated)

    links = {
        "a": link("ams", "top 20", 1, 900, 1_000.0, True),  # stepped down
        "b": link("ams", "sketch", 3, 500, 250.0, True),  # saturated too: they share
        "c": link("ams", "exact", 0, 100, 750.0, False),  # exact, on the same link
        "d": link("dc", "top 20", 1, 100, 50.0, False),  # held there, with room to spare
        "e": link("dc", "top 20", 1, 0, None, True),  # nothing acked lately
        "f": link("dc", "exact", 0, 100, 9_000.0, False),  # carries all it has
        "g": link("lhr", "exact", 0, 100, 500.0, True),  # exact only, and the link too slow
    }
    # Every query on a saturated link counts: they share what it carries.
    assert [(m.peer, m.bandwidth_bps) for m in link_measurements(links)] == [
        ("ams", 16_000.0), ("lhr", 4_000.0)]
    assert [(r.query, r.level_index, r.sent_bytes) for r in link_reports(links)][:2] == [
        ("a", 1, 900), ("b", 3, 500)]


def test_stop_and_running() -> None:
    site = SiteController("lhr", SERVERS)
    site.deploy(Fragment("a", "lhr", sources=("cdn_logs",)), 0)
    site.deploy(Fragment("b", "lhr", sources=("cdn_logs",)), 0)
    assert site.stop("a") is True
    assert site.stop("a") is False
    assert site.running() == ["b"]
    assert [p.query for p in site.pieces()] == ["b"]


def test_running_answers_while_a_deploy_or_a_stop_waits_for_the_runtime() -> None:
    """Every heartbeat asks running(); a deploy or a stop may wait for Spark in the runtime
    (a replaced run's stream stopping), and running() must not wait with it."""
    entered, release = threading.Event(), threading.Event()

    class SlowRuntime:  # the runtime's side: as long as Spark takes to stop a stream
        def deploy(self, assignment: Assignment) -> None:
            entered.set()
            release.wait(10)

        def stop(self, query: str) -> None:
            self.deploy(Assignment(Fragment(query, "lhr"), b""))

        def starting(self) -> set[str]:  # asked by pieces(): no stage of a run starts
            return set()

        def run(self, query: str) -> object | None:  # nor is there a run until deploy returns
            return None

    site = SiteController("lhr", SERVERS, SlowRuntime())  # type: ignore[arg-type]
    fragment = Fragment("a", "lhr", sources=("cdn_logs",))
    for change, running in [(lambda: site.deploy(fragment, 1, Assignment(fragment, b"")), ["a"]),
                            (lambda: site.stop("a"), [])]:
        entered.clear()
        release.clear()
        changing = threading.Thread(target=change)
        changing.start()
        assert entered.wait(5)
        asked = time.monotonic()
        assert site.running() == running
        # Listed while the runtime makes the run, the local stage as starting: the stage is
        # not made yet (wait_for_stages must not take it for one that reads).
        assert [(p.query, p.state) for p in site.pieces()] == [(q, "starting") for q in running]
        assert time.monotonic() - asked < 1.0
        release.set()
        changing.join(5)


def test_a_fragment_that_fails_to_start_is_not_listed_as_running() -> None:
    class FailingRuntime:  # the runtime refuses the new version; the old one ran before
        def __init__(self) -> None:
            self.runs: set[str] = set()
            self.fail = False

        def deploy(self, assignment: Assignment) -> None:
            if self.fail:
                raise ControlPlaneError("the local stage cannot start")
            self.runs.add(assignment.fragment.query)

        def run(self, query: str) -> object | None:
            return query if query in self.runs else None

    runtime = FailingRuntime()
    site = SiteController("lhr", SERVERS, runtime)  # type: ignore[arg-type]
    a, b = Fragment("a", "lhr", sources=("cdn_logs",)), Fragment("b", "lhr", sources=("x",))
    site.deploy(a, 1, Assignment(a, b""))
    runtime.fail = True
    with pytest.raises(ControlPlaneError, match="cannot start"):
        site.deploy(b, 1, Assignment(b, b""))
    with pytest.raises(ControlPlaneError, match="cannot start"):
        site.deploy(a, 2, Assignment(a, b""))  # the old version still runs: still listed
    assert site.running() == ["a"]
    runtime.runs.clear()  # the old version is gone too
    with pytest.raises(ControlPlaneError, match="cannot start"):
        site.deploy(a, 3, Assignment(a, b""))
    assert site.running() == []


def test_the_site_controller_refuses_what_is_not_its_own() -> None:
    with pytest.raises(ControlPlaneError, match="site lhr has no servers"):
        SiteController("lhr", [])
    site = SiteController("lhr", SERVERS)
    with pytest.raises(ControlPlaneError, match="site lhr was sent the fragment of site ams"):
        site.deploy(Fragment("q", "ams", sources=("cdn_logs",)), 0)
    assert site.running() == []


# --- the results hub -----------------------------------------------------------------------


def window(start: int, query: str = QUERY) -> WindowResult:
    return WindowResult(query, start, start + 10_000, [{"domain": "a.com", "requests": start}])


def test_follow_yields_past_and_new_results_in_order_and_ends_when_closed() -> None:
    hub = ResultsHub()
    hub.publish(window(0))
    seen: list[WindowResult] = []
    follower = threading.Thread(target=lambda: seen.extend(hub.follow(QUERY, lambda: False)),
                                daemon=True)
    follower.start()
    for start in (10_000, 20_000, 30_000):
        time.sleep(0.01)
        hub.publish(window(start))
        hub.publish(window(start, "other"))
    time.sleep(0.05)
    assert follower.is_alive()  # open until the query closes
    hub.close(QUERY)
    follower.join(2)
    assert not follower.is_alive()
    assert seen == [window(s) for s in (0, 10_000, 20_000, 30_000)]


def test_follow_ends_when_its_subscriber_goes_away() -> None:
    hub = ResultsHub()
    gone = threading.Event()
    seen: list[WindowResult] = []
    follower = threading.Thread(target=lambda: seen.extend(hub.follow(QUERY, gone.is_set)),
                                daemon=True)
    follower.start()
    hub.publish(window(0))
    gone.set()
    follower.join(2)  # the hub wakes up on its own at least every half second
    assert not follower.is_alive()
    assert seen in ([], [window(0)])


# --- the gRPC API, served in-process -------------------------------------------------------


@dataclass
class Served:
    controller: GlobalController
    sites: FakeSites
    address: str

    def client(self, timeout_s: float = 5.0) -> ControllerClient:
        return ControllerClient(self.address, timeout_s=timeout_s,
                                security=Security.plaintext())


@pytest.fixture
def served(topology: Topology) -> Iterator[Served]:
    sites = FakeSites()
    controller = GlobalController(topology, sites.deploy, sites.stop,
                                  heartbeat_timeout_s=TIMEOUT_S)
    server, port = start_server([(rpc.add_GlobalControllerServicer_to_server,
                                  GlobalControllerServicer(controller, 0.5), SERVICE)], 0,
                                security=Security.plaintext())
    try:
        yield Served(controller, sites, f"127.0.0.1:{port}")
    finally:
        server.stop(None)


def test_submit_status_explain_and_cancel_over_grpc(served: Served) -> None:
    served.controller.register_site("ams", "ams.test:7100")
    served.controller.register_site("sfo", "sfo.test:7100")  # sin never registers
    client = served.client()
    response = client.submit(EXAMPLE)
    assert response.query == QUERY
    assert response.plan.startswith("physical plan on local-3dc (root ams)")
    assert [f.site for _, f, _ in served.sites.deploys] == ["ams", "sfo"]

    status = client.status()
    assert (status.topology, status.root) == ("local-3dc", "ams")
    by_name = {s.name: s for s in status.sites}
    assert list(by_name) == list(SITES)
    ams, sin = by_name["ams"], by_name["sin"]
    assert (ams.kind, ams.address, ams.alive) == ("datacenter", "ams.test:7100", True)
    assert 0 <= ams.seconds_since_heartbeat < 5
    assert [(p.query, p.piece, p.server) for p in ams.placements] == [
        (QUERY, "local stage", "ams-1"), (QUERY, "final", "ams-1")]
    assert (sin.address, sin.alive, sin.seconds_since_heartbeat) == ("", False, -1.0)
    assert list(sin.placements) == []
    [query] = status.queries
    assert (query.name, query.state, query.replans, query.detail) == (QUERY, "running", 0, "")
    assert dict(query.parents) == {"sfo": "ams", "sin": "ams"}
    assert query.plan == response.plan
    assert sorted((link.a, link.b) for link in status.links) == [("sfo", "ams"), ("sin", "ams")]
    for link in status.links:
        assert link.bandwidth_bps == 1e9
        assert link.planned_bytes_per_s > 0
        assert link.utilisation == pytest.approx(link.planned_bytes_per_s * 8 / 1e9)

    text = client.explain(EXAMPLE)
    assert "split_aggregates" in text and "physical plan on local-3dc" in text

    client.cancel(QUERY)
    assert [q.state for q in client.status().queries] == ["cancelled"]
    assert sorted(served.sites.stops) == [("ams.test:7100", QUERY), ("sfo.test:7100", QUERY)]


def test_results_stream_while_another_thread_publishes(served: Served) -> None:
    client = served.client()
    client.submit(EXAMPLE)
    published = [WindowResult(QUERY, s, s + 10_000,
                              [{"domain": "a.com", "requests": 3, "kb": 1.5}], True, 0.0)
                 for s in (0, 10_000, 20_000)]

    def publish() -> None:
        for result in published:
            time.sleep(0.05)
            served.controller.results.publish(result)
        served.controller.cancel(QUERY)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    started = time.monotonic()
    received = list(client.results(QUERY, timeout_s=10))
    publisher.join(2)
    assert received == published
    assert time.monotonic() - started < 5  # ended by the cancel, not by the deadline


def test_results_with_a_deadline_end_quietly(served: Served) -> None:
    client = served.client()
    client.submit(EXAMPLE)
    served.controller.results.publish(window(0))
    assert list(client.results(QUERY, timeout_s=0.5)) == [window(0)]


def test_errors_come_back_as_readable_control_plane_errors(served: Served,
                                                           tmp_path: Path) -> None:
    client = served.client()
    with pytest.raises(ControlPlaneError, match=r"^no query named 'nope'$"):
        client.cancel("nope")
    with pytest.raises(ControlPlaneError, match=r"^no query named 'nope'$"):
        list(client.results("nope", timeout_s=5))
    bad = tmp_path / "bad.py"
    bad.write_text(BAD_QUERY, encoding="utf-8")
    # A query file is run by the client: its errors never reach the controller.
    with pytest.raises(PlanError, match=r"bad\.py: where: unknown column 'stauts'"):
        client.submit(bad)
    with pytest.raises(PlanError, match="unknown column 'stauts'"):
        client.explain(bad)
    with pytest.raises(PlanError, match="no such query file"):
        client.submit(tmp_path / "missing.py")
    forged = plan_of(EXAMPLE)
    forged.steps[1].where.compare.left.col = "stauts"
    with pytest.raises(ControlPlaneError, match=r"step 2: where: unknown column 'stauts'"):
        client._call("SubmitQuery", pb.SubmitQueryRequest(query=QuerySpec(plan=forged)))
    client.submit(EXAMPLE)
    with pytest.raises(ControlPlaneError, match="already running"):
        client.submit(EXAMPLE)


def test_sites_register_and_beat_over_grpc(served: Served) -> None:
    stub = rpc.GlobalControllerStub(grpc.insecure_channel(served.address))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Heartbeat(pb.HeartbeatRequest(site="sfo"), timeout=5)
    # What makes a site controller register again (a restarted controller forgot it).
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "before registering" in str(refused.value.details())

    reply = stub.RegisterSite(pb.RegisterSiteRequest(site="ams", address="ams.test:7100"),
                              timeout=5)
    assert (reply.topology, reply.kind, reply.heartbeat_interval_s) == (
        "local-3dc", "datacenter", 0.5)
    assert [(s.name, s.cores) for s in reply.servers] == [("ams-1", 1), ("ams-2", 1)]
    served.controller.submit(plan_of(EXAMPLE))
    beat_reply = stub.Heartbeat(pb.HeartbeatRequest(
        site="ams", links=[pb.LinkMeasurement(peer="sfo", bandwidth_bps=1e9)]), timeout=5)
    assert list(beat_reply.queries) == [QUERY]
    with pytest.raises(grpc.RpcError) as unknown:
        stub.RegisterSite(pb.RegisterSiteRequest(site="lhr", address="x:1"), timeout=5)
    assert unknown.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "no site named 'lhr'" in str(unknown.value.details())


def test_a_heartbeat_listing_no_pieces_clears_what_an_earlier_one_listed(
        served: Served) -> None:
    """A heartbeat sent while a cancel was on its way lists the pieces again after the
    cancel cleared them; the next ones, listing none, must clear them for good."""
    stub = rpc.GlobalControllerStub(grpc.insecure_channel(served.address))
    stub.RegisterSite(pb.RegisterSiteRequest(site="ams", address="ams.test:7100"), timeout=5)
    served.controller.submit(plan_of(EXAMPLE))
    served.controller.cancel(QUERY)
    assert served.controller.sites["ams"].placements == []
    stale = pb.Placement(query=QUERY, piece="local stage", server="ams-1", pid=7,
                         state="running")
    stub.Heartbeat(pb.HeartbeatRequest(site="ams", running=[QUERY], placements=[stale]),
                   timeout=5)
    assert [p.piece for p in served.controller.sites["ams"].placements] == ["local stage"]
    beat = stub.Heartbeat(pb.HeartbeatRequest(site="ams"), timeout=5)
    assert list(beat.queries) == []
    assert served.controller.sites["ams"].placements == []


def test_health_check_and_reflection(served: Served) -> None:
    channel = grpc.insecure_channel(served.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service

    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    [reply] = list(reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
    names = {s.name for s in reply.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= names


def test_a_controller_that_is_not_there_is_reported_as_unreachable() -> None:
    port = free_port()
    client = ControllerClient(f"127.0.0.1:{port}", timeout_s=0.5, security=Security.plaintext())
    started = time.monotonic()
    with pytest.raises(ControlPlaneError,
                       match=rf"cannot reach the controller at 127\.0\.0\.1:{port} "
                             r"\((UNAVAILABLE|DEADLINE_EXCEEDED)\); is `jetstream controller`"):
        client.status()
    assert time.monotonic() - started < 3


# --- the global controller: restarting on its state folder -------------------------------------


def test_a_restarted_controller_takes_up_its_queries_and_results(
        topology: Topology, sites: FakeSites, clock: FakeClock, source: QueryPlan,
        tmp_path: Path) -> None:
    first = GlobalController(topology, sites.deploy, sites.stop, heartbeat_timeout_s=TIMEOUT_S,
                             clock=clock, state_dir=tmp_path)
    register_all(first)
    before = first.submit(source)
    first.publish(QUERY, [WindowResult(QUERY, 0, 10_000, [{"domain": "a.com", "n": 2}],
                                       sites_reporting=2, sites_expected=3,
                                       missing_sites=["sfo"], final=False,
                                       provisional=["deadline"])], False)
    sites.deploys.clear()
    # It dies; a new one starts on the same folder. The sites still run the query and
    # register again: each is sent its fragment under a newer version, nothing is stopped.
    second = GlobalController(topology, sites.deploy, sites.stop, heartbeat_timeout_s=TIMEOUT_S,
                              clock=clock, state_dir=tmp_path)
    state = second.queries[QUERY]
    assert (state.state, state.spec, state.expected) == (
        "running", source.SerializeToString(deterministic=True), before.expected)
    assert sites.deploys == []  # nobody has registered yet
    register_all(second)
    assert state.plan is not None and state.deployed == set(SITES)
    for site in SITES:
        assert sites.versions_at(address(site)) == [before.version + 1]
        assert sites.fragments_at(address(site)) == [state.plan.fragments[site]]
    assert sites.stops == [] and all(beat == [QUERY] for beat in
                                     (second.heartbeat(s, {}) for s in SITES))
    second.publish(QUERY, [WindowResult(QUERY, 0, 10_000, [{"domain": "a.com", "n": 3}],
                                        sites_reporting=3, sites_expected=3, revision=1)], True)
    third = GlobalController(topology, sites.deploy, sites.stop, clock=clock,
                             state_dir=tmp_path)
    assert third.queries[QUERY].state == "finished"
    shown = list(third.results.follow(QUERY, stop=lambda: False))  # closed: it returns
    assert [(r.revision, r.missing_sites, r.rows) for r in shown] == [
        (0, ["sfo"], [{"domain": "a.com", "n": 2}]), (1, [], [{"domain": "a.com", "n": 3}])]


def test_a_damaged_state_file_is_refused_naming_it(topology: Topology, sites: FakeSites,
                                                    tmp_path: Path) -> None:
    (tmp_path / "queries.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ControlPlaneError, match=r"queries\.json: cannot read the saved"):
        GlobalController(topology, sites.deploy, sites.stop, state_dir=tmp_path)


def test_the_hub_keeps_the_newest_results_and_a_late_follower_skips_the_rest(
        tmp_path: Path) -> None:
    from jetstream.control.results_hub import ResultsHub

    hub = ResultsHub(tmp_path, keep=3)
    for start in range(7):
        hub.publish(WindowResult(QUERY, start, start + 1))
    hub.close(QUERY)
    assert [r.window_start for r in hub.follow(QUERY, stop=lambda: False)] == [3, 4, 5, 6]
    with (tmp_path / f"{QUERY}.jsonl").open("a") as out:
        out.write('{"query": "cdn-topk", "window_st')  # a crash cut the last one short
    again = ResultsHub(tmp_path, keep=3)  # a restart reads back no more than it keeps
    again.close(QUERY)
    assert [r.window_start for r in again.follow(QUERY, stop=lambda: False)] == [4, 5, 6]
    again.publish(WindowResult(QUERY, 7, 8))
    assert [r.window_start for r in ResultsHub(tmp_path, keep=3)._results[QUERY]] == [5, 6, 7]


def test_a_site_is_deployed_only_once_its_parent_has_registered(
        topology: Topology, sites: FakeSites, clock: FakeClock, source: QueryPlan,
        tmp_path: Path) -> None:
    """After a restart the edges may register before the root: they are told to go on with
    what they run, and get their fragment (with the root's address) once the root is back."""
    first = GlobalController(topology, sites.deploy, sites.stop, clock=clock,
                             state_dir=tmp_path)
    register_all(first)
    first.submit(source)
    sites.deploys.clear()
    second = GlobalController(topology, sites.deploy, sites.stop, clock=clock,
                              state_dir=tmp_path)
    second.register_site("sfo", address("sfo"))
    assert sites.deploys == [] and second.heartbeat("sfo", {}) == [QUERY]
    second.register_site("ams", address("ams"))
    assert [a for a, _, _ in sites.deploys] == [address("ams"), address("sfo")]


def test_a_declared_cube_runs_from_the_first_registration_and_is_not_started_twice(
        topology: Topology, sites: FakeSites, clock: FakeClock, source: QueryPlan) -> None:
    controller = GlobalController(topology, sites.deploy, sites.stop,
                                  heartbeat_timeout_s=TIMEOUT_S, clock=clock, cubes=[source])
    assert QUERY not in controller.queries
    controller.register_site("sfo", address("sfo"))  # submitted at the first registration
    assert controller.queries[QUERY].active
    register_all(controller)
    state = controller.queries[QUERY]
    assert state.active and sorted(state.deployed) == sorted(SITES) and state.version == 0
    deploys = len(sites.deploys)
    controller.cancel(QUERY)  # an operator's cancel holds: the cube does not come back
    controller.register_site("sin", address("sin"))
    assert controller.queries[QUERY].state == "cancelled" and len(sites.deploys) == deploys


def test_the_hub_keeps_one_result_per_window_and_revision_across_a_root_restart(
        tmp_path: Path) -> None:
    """A restarted root publishes its windows again from revision 0: a repeat is dropped,
    new content under a used revision goes out under the next one, a newer revision as is —
    also after the controller itself restarts (the hub reads its folder back)."""
    hub = ResultsHub(tmp_path)
    first = dataclasses.replace(window(0), final=False, provisional=["deadline"])
    hub.publish(first)
    hub.publish(dataclasses.replace(first, latency_s=9.0, wan_bytes=5))  # the same, again
    fuller = dataclasses.replace(first, rows=[{"domain": "a.com", "requests": 7}])
    hub.publish(fuller)  # new rows under revision 0: published as revision 1
    hub.publish(dataclasses.replace(first, revision=2,
                                    rows=[{"domain": "a.com", "requests": 8}]))
    assert [(r.revision, r.rows[0]["requests"]) for r in hub.newest(QUERY, 10)] == [
        (0, 0), (1, 7), (2, 8)]
    again = ResultsHub(tmp_path)  # the controller restarted
    again.publish(dataclasses.replace(first, revision=2,
                                      rows=[{"domain": "a.com", "requests": 8}]))
    # An older word again, after a newer one: the root's newest word is what counts.
    again.publish(dataclasses.replace(fuller, revision=1))
    assert [(r.revision, r.rows[0]["requests"]) for r in again.newest(QUERY, 10)] == [
        (0, 0), (1, 7), (2, 8), (3, 7)]


def test_the_hub_never_lets_a_final_exact_result_change(tmp_path: Path) -> None:
    """A provisional result is replaced by the next revision; once a window's result is
    final and exact it is never changed: the same again is a repeat, anything else is
    dropped and counted — also after the controller restarts."""
    hub = ResultsHub(tmp_path)
    early = dataclasses.replace(window(0), final=False, provisional=["early"])
    hub.publish(early)
    hub.publish(dataclasses.replace(early, revision=1, final=True, provisional=[]))
    hub.publish(dataclasses.replace(early, revision=2, final=True, provisional=[]))
    assert [(r.revision, r.final) for r in hub.newest(QUERY, 10)] == [(0, False), (1, True)]
    changed = dataclasses.replace(early, revision=3, final=True, provisional=[],
                                  rows=[{"domain": "a.com", "requests": 99}])
    hub.publish(changed)
    assert hub.changed_final == 1 and len(hub.newest(QUERY, 10)) == 2
    again = ResultsHub(tmp_path)  # the controller restarted
    again.publish(changed)
    assert again.changed_final == 1 and len(again.newest(QUERY, 10)) == 2


def test_the_hub_drops_a_result_covering_fewer_sites_and_says_where_a_new_root_starts(
        ) -> None:
    """A root that took over lacks what the dead one merged: its word on a window the dead
    one answered whole is dropped. A new root starts again at the first window whose newest
    result is incomplete, or else at the newest two."""
    hub = ResultsHub()
    assert hub.unsettled_from(QUERY) == 0  # nothing published: everything kept goes again

    def result(start: int, reporting: int, requests: int = 1) -> WindowResult:
        return dataclasses.replace(window(start), sites_reporting=reporting, sites_expected=3,
                                   rows=[{"domain": "a.com", "requests": requests}],
                                   final=reporting == 3,
                                   provisional=[] if reporting == 3 else ["deadline"])

    for start in (0, 10_000, 20_000, 30_000):
        hub.publish(result(start, 3))
    assert hub.unsettled_from(QUERY) == 20_000
    hub.publish(result(10_000, 2, requests=5))  # the new root, without the dead one's records
    assert [r.rows[0]["requests"] for r in hub.newest(QUERY, 10)] == [1, 1, 1, 1]
    hub.publish(result(40_000, 2))  # incomplete, then corrected when the old root is back
    hub.publish(result(50_000, 3))
    assert hub.unsettled_from(QUERY) == 40_000
    hub.publish(result(40_000, 3, requests=2))
    assert hub.unsettled_from(QUERY) == 40_000  # the newest two: 40 s and 50 s
    assert [(r.window_start, r.revision) for r in hub.newest(QUERY, 2)] == [(50_000, 0),
                                                                            (40_000, 1)]


def test_a_dead_root_fails_over_to_the_first_standby_alive_for_good(
        sites: FakeSites, clock: FakeClock, source: QueryPlan, tmp_path: Path) -> None:
    topology = parse_topology(
        TOPOLOGY.read_text().replace("root: ams", "root: ams\nstandby_roots: [sfo, sin]")
        + "  - {between: [sin, sfo], bandwidth: 1gbit, latency: 1ms}\n")
    controller = GlobalController(topology, sites.deploy, sites.stop, clock=clock,
                                  heartbeat_timeout_s=TIMEOUT_S, state_dir=tmp_path)
    register_all(controller)
    state = controller.submit(source)
    controller.publish(QUERY, [dataclasses.replace(window(0), sites_reporting=3,
                                                   sites_expected=3)], False)
    clock.advance(TIMEOUT_S - 1)
    beat(controller, "sin")  # sfo and ams fall silent; sfo comes back before ams is dead
    clock.advance(2)
    beat(controller, "sfo", "sin")
    assert controller.check_liveness() == ["ams"]
    assert controller.root == "sfo"
    assert state.plan is not None and state.plan.fragments["sfo"].final
    assert state.plan.fragments["sin"].parent == "sfo"
    assert "ams" not in state.plan.fragments
    assert state.resend_from_ms == -10_000  # the newest two windows: 0 s and the one before
    assert controller.view().topology.root == "sfo"
    assert (state.state, state.detail) == ("degraded", "site ams stopped sending heartbeats; "
                                           "no data from ams")
    # ams comes back: it rejoins as a site under the new root, which stays.
    controller.register_site("ams", address("ams"))
    assert controller.root == "sfo"
    assert state.plan.fragments["ams"].parent == "sfo"
    assert state.state == "running"
    # A restarted controller keeps the root where it moved.
    again = GlobalController(topology, sites.deploy, sites.stop, clock=clock,
                             heartbeat_timeout_s=TIMEOUT_S, state_dir=tmp_path)
    assert again.root == "sfo"
    assert again.queries[QUERY].resend_from_ms == -10_000


def test_without_a_standby_a_dead_root_leaves_the_query_degraded(
        controller: GlobalController, clock: FakeClock, source: QueryPlan) -> None:
    register_all(controller)
    state = controller.submit(source)
    clock.advance(TIMEOUT_S + 1)
    beat(controller, "sfo", "sin")
    assert controller.check_liveness() == ["ams"]
    assert controller.root == "ams"
    assert state.state == "degraded"
    assert "the root ams is down" in state.detail
