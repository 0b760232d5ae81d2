"""Security on real gRPC servers on loopback: mutual TLS, the token, what is refused, and how a
process chooses (``--tls-dir``, ``--token``, ``--insecure``); ``jetstream certs``'s files."""

from __future__ import annotations

import base64
import logging
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

import jetstream as js
from jetstream.aggtree.loader import load_topology
from jetstream.aggtree.planner import Fragment
from jetstream.cli import main
from jetstream.cli.common import DEFAULT_TOPOLOGY
from jetstream.control.client import ControllerClient
from jetstream.control.daemons import run_controller, run_site
from jetstream.control.launch import free_port
from jetstream.control.server import start_server
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.options import Assignment, SiteOptions
from jetstream.dataplane.partials import PartialBatch
from jetstream.dataplane.servicer import DataPlaneServicer
from jetstream.dataplane.site import SiteRuntime
from jetstream.dataplane.transport import PartialSender
from jetstream.errors import ControlPlaneError
from jetstream.operators import Phase, WindowAggregate
from jetstream.queryfile import query_from_source
from jetstream.security import (
    Identity,
    Security,
    http_authorized,
    make_dev_certs,
    peer_identity,
)
from jetstream.v1 import control_pb2 as pb
from jetstream.v1 import control_pb2_grpc as rpc
from jetstream.v1 import dataplane_pb2 as dataplane_pb
from jetstream.v1 import dataplane_pb2_grpc as dataplane_rpc
from tests.conftest import log, spec_of
from tests.test_merger import site_batches, split


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dev_certs(tmp_path_factory.mktemp("tls")).folder


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second development CA: its certificates look right but nobody here trusts them."""
    return make_dev_certs(tmp_path_factory.mktemp("other")).folder


@dataclass
class Controller:
    address: str
    security: Security

    def client(self, security: Security | None = None) -> ControllerClient:
        return ControllerClient(self.address, timeout_s=5.0, security=security or self.security)


def _serve(target: object, *args: object, **kwargs: object) -> tuple[threading.Event, int]:
    """Run ``run_controller``/``run_site`` in a thread; its stop event and bound port."""
    stop, bound = threading.Event(), threading.Event()
    port: list[int] = []

    def ready(p: int) -> None:
        port.append(p)
        bound.set()

    thread = threading.Thread(target=target, args=args,  # type: ignore[arg-type]
                              kwargs={**kwargs, "ready": ready, "stop": stop}, daemon=True)
    thread.start()
    assert bound.wait(10), "the server did not come up"
    return stop, port[0]


@pytest.fixture(scope="module")
def controller(tls: Path) -> Iterator[Controller]:
    security = Security.resolve(tls, env={})
    stop, port = _serve(run_controller, load_topology(DEFAULT_TOPOLOGY), 0, security=security)
    try:
        yield Controller(f"127.0.0.1:{port}", security)
    finally:
        stop.set()


def _status(channel: grpc.Channel) -> pb.StatusResponse:
    reply: pb.StatusResponse = rpc.GlobalControllerStub(channel).Status(pb.StatusRequest(),
                                                                        timeout=5)
    return reply


# --- mutual TLS and the token on a real controller -----------------------------------------


def test_a_secure_client_and_site_talk_to_a_secure_controller(controller: Controller,
                                                              tmp_path: Path) -> None:
    assert controller.client().status().topology == "local-3dc"
    # A site: its channel to the controller and its own server, both mutual TLS and token.
    stop, port = _serve(run_site, "sfo", controller.address, security=controller.security,
                        options=SiteOptions(state_dir=tmp_path))
    try:
        site = f"127.0.0.1:{port}"
        check = health_pb2.HealthCheckRequest(service="jetstream.v1.DataPlane")
        reply = health_pb2_grpc.HealthStub(controller.security.channel(site)).Check(check,
                                                                                   timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        for caller, code in ((grpc.insecure_channel(site), grpc.StatusCode.UNAVAILABLE),
                             (replace(controller.security, token=None).channel(site),
                              grpc.StatusCode.UNAUTHENTICATED)):
            with pytest.raises(grpc.RpcError) as refused:
                health_pb2_grpc.HealthStub(caller).Check(check, timeout=5)
            assert refused.value.code() is code
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any(s.name == "sfo" and s.alive for s in controller.client().status().sites):
                break
            time.sleep(0.1)
        else:
            pytest.fail("sfo never registered over mutual TLS")
    finally:
        stop.set()


def test_a_client_without_a_certificate_is_refused_by_the_handshake(
        controller: Controller, tls: Path) -> None:
    only_ca = grpc.ssl_channel_credentials(root_certificates=(tls / "ca.pem").read_bytes())
    for channel in (grpc.secure_channel(controller.address, only_ca),
                    grpc.insecure_channel(controller.address)):
        with pytest.raises(grpc.RpcError) as refused:
            _status(channel)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    assert controller.client().status().topology == "local-3dc"  # still serving


def test_a_certificate_of_another_ca_is_refused(controller: Controller, other_ca: Path) -> None:
    # The right token does not help: the handshake fails before any call.
    stranger = replace(controller.security, tls_dir=other_ca)
    with pytest.raises(grpc.RpcError) as refused:
        _status(stranger.channel(controller.address))
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    with pytest.raises(ControlPlaneError, match=r"cannot reach the controller .*UNAVAILABLE.*"
                                                r"with certificates of the CA in"):
        controller.client(stranger).status()


@pytest.mark.parametrize("token", [None, "wrong"])
def test_a_call_without_the_right_token_is_unauthenticated(controller: Controller,
                                                            token: str | None) -> None:
    assert controller.security.token, "the development folder holds a token"
    caller = replace(controller.security, token=token)
    with pytest.raises(grpc.RpcError) as refused:
        _status(caller.channel(controller.address))
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    # A streaming call is refused the same way.
    stream = rpc.GlobalControllerStub(caller.channel(controller.address)).StreamResults(
        pb.StreamResultsRequest(query="cdn-topk"), timeout=5)
    with pytest.raises(grpc.RpcError) as refused:
        list(stream)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(ControlPlaneError, match="refused us: a valid token is required"):
        controller.client(caller).status()
    # Other clients go on being served.
    assert controller.client().status().topology == "local-3dc"


def test_the_cli_uses_the_tls_folder_and_its_token(controller: Controller, tls: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("JETSTREAM_TOKEN", raising=False)
    monkeypatch.delenv("JETSTREAM_TLS_DIR", raising=False)
    assert main(["status", "--json", "--controller", controller.address,
                 "--tls-dir", str(tls)]) == 0
    assert '"topology": "local-3dc"' in capsys.readouterr().out
    monkeypatch.setenv("JETSTREAM_TLS_DIR", str(tls))
    assert main(["status", "--json", "--controller", controller.address]) == 0
    capsys.readouterr()
    assert main(["status", "--controller", controller.address, "--token", "wrong"]) == 1
    assert "refused us: a valid token is required" in capsys.readouterr().err
    monkeypatch.setenv("JETSTREAM_TOKEN", "wrong")
    assert main(["status", "--controller", controller.address]) == 1
    assert "refused us" in capsys.readouterr().err


# --- choosing: --tls-dir, --token, --insecure ------------------------------------------------


def test_neither_tls_nor_insecure_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ControlPlaneError, match=r"give --tls-dir DIR .*--insecure$"):
        Security.resolve(env={})
    with pytest.raises(ControlPlaneError, match="no transport security chosen"):
        Security()
    monkeypatch.delenv("JETSTREAM_TLS_DIR", raising=False)
    for argv in (["status"], ["controller", "--port", "0"], ["site", "--name", "ams"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "no transport security chosen" in err and "--tls-dir" in err, argv
        assert "--insecure" in err, argv


def test_where_the_folder_and_token_come_from(tls: Path, tmp_path: Path) -> None:
    written = (tls / "token").read_text().strip()
    assert Security.resolve(tls, env={}).token == written
    assert Security.resolve(env={"JETSTREAM_TLS_DIR": str(tls)}) == Security(tls, written)
    assert Security.resolve(tls, env={"JETSTREAM_TOKEN": "from-env"}).token == "from-env"
    assert Security.resolve(tls, "flag", env={"JETSTREAM_TOKEN": "from-env"}).token == "flag"
    with pytest.raises(ControlPlaneError, match="cannot be combined"):
        Security.resolve(tls, insecure=True)
    (tmp_path / "ca.pem").write_bytes((tls / "ca.pem").read_bytes())  # only the CA
    with pytest.raises(ControlPlaneError, match=r"cannot read node\.pem \(No such file"):
        Security.resolve(tmp_path, env={})
    # Environment settings give way to an explicit --insecure.
    assert Security.resolve(insecure=True, env={"JETSTREAM_TLS_DIR": str(tls)}).insecure


def test_insecure_is_loud(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        security = Security.resolve(insecure=True, env={})
        server, port = start_server([], 0, security=security)
    server.stop(None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("INSECURE: --insecure given") for m in warnings), warnings
    assert any(m.startswith("INSECURE: serving") and f"reach port {port} can" in m
               for m in warnings), warnings


def test_an_insecure_controller_serves_plaintext_clients(caplog: pytest.LogCaptureFixture) -> None:
    plain = Security.plaintext()
    with caplog.at_level(logging.WARNING):
        stop, port = _serve(run_controller, load_topology(DEFAULT_TOPOLOGY), 0, security=plain)
    try:
        client = ControllerClient(f"127.0.0.1:{port}", security=plain)
        assert client.status().topology == "local-3dc"
        assert any("INSECURE" in r.getMessage() for r in caplog.records)
    finally:
        stop.set()


# --- jetstream certs -------------------------------------------------------------------------


def test_certs_writes_a_ca_a_node_certificate_and_a_token(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tls"
    assert main(["certs", str(out), "--hosts", "sfo.example.net, 10.77.0.2", "--days", "3"]) == 0
    assert "development" in capsys.readouterr().out
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == {"ca.pem": 0o644, "ca-key.pem": 0o600, "node.pem": 0o644,
                     "node-key.pem": 0o600, "token": 0o600}
    assert len((out / "token").read_text().strip()) >= 32

    ca = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    node = x509.load_pem_x509_certificate((out / "node.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert node.issuer == ca.subject
    node.verify_directly_issued_by(ca)
    names = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost", "sfo.example.net"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == [
        "127.0.0.1", "10.77.0.2"]
    usages = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {u._name for u in usages} == {"serverAuth", "clientAuth"}
    lifetime = node.not_valid_after_utc - node.not_valid_before_utc
    assert 3 * 86400 <= lifetime.total_seconds() <= 3 * 86400 + 3600


def test_certs_refuses_to_replace_a_ca_unless_forced(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tls"
    assert main(["certs", str(out)]) == 0
    ca = (out / "ca.pem").read_bytes()
    assert main(["certs", str(out)]) == 1
    assert "holds a CA already" in capsys.readouterr().err
    assert (out / "ca.pem").read_bytes() == ca
    assert main(["certs", str(out), "--force"]) == 0
    assert (out / "ca.pem").read_bytes() != ca
    assert main(["certs", str(tmp_path / "x"), "--days", "0"]) == 1


# --- per-site identity -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def per_site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_dev_certs(tmp_path_factory.mktemp("sites"),
                          sites=["ams", "sfo", "sin"]).folders


def _common_name(folder: Path) -> str:
    cert = x509.load_pem_x509_certificate((folder / "node.pem").read_bytes())
    return str(cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value)


def test_certs_per_site_name_each_holder(per_site: dict[str, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert set(per_site) == {"ams", "sfo", "sin", "controller", "cli"}
    assert {who: _common_name(folder) for who, folder in per_site.items()} == {
        "ams": "jetstream site ams", "sfo": "jetstream site sfo", "sin": "jetstream site sin",
        "controller": "jetstream controller", "cli": "jetstream cli"}
    root = per_site["ams"].parent
    assert not (root / "node.pem").exists()  # no certificate that acts as anyone
    for folder in per_site.values():  # each a whole TLS folder, the token readable by its owner
        security = Security.resolve(folder, env={})
        assert security.token == (root / "token").read_text().strip()
        assert stat.S_IMODE((folder / "node-key.pem").stat().st_mode) == 0o600
    for bad in (["controller"], ["a/b"], ["sfo", "sfo"], [""]):
        with pytest.raises(ControlPlaneError, match="--sites"):
            make_dev_certs(tmp_path / "bad", sites=bad, force=True)
    assert main(["certs", str(tmp_path / "cli"), "--sites", "ams,sfo"]) == 0
    out = capsys.readouterr().out
    assert f"jetstream site --name sfo --tls-dir {tmp_path / 'cli' / 'sfo'}" in out
    assert "registers and sends partials only under the name in its certificate" in out


def _http_get(url: str, authorization: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": authorization}
                                     if authorization else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_a_controller_takes_a_site_only_under_its_certificates_name_and_each_role_its_calls(
        per_site: dict[str, Path], tmp_path: Path) -> None:
    # The controller a real process with its own certificate; every caller presents its own.
    port, metrics, dashboard = free_port(), free_port(), free_port()
    log = (tmp_path / "controller.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "jetstream", "controller", "--port", str(port),
         "--tls-dir", str(per_site["controller"]), "--metrics-port", str(metrics),
         "--dashboard-port", str(dashboard), "--http-token"], stdout=log,
        stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"

    def stub(holder: str) -> rpc.GlobalControllerStub:
        return rpc.GlobalControllerStub(Security.resolve(per_site[holder], env={})
                                        .channel(address))

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _status(Security.resolve(per_site["cli"], env={}).channel(address))
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline, (tmp_path / "controller.log").read_text()
                time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as refused:
            stub("sin").RegisterSite(pb.RegisterSiteRequest(site="sfo", address="x:1"),
                                     timeout=5)
        assert "registering as site 'sfo' refused: the caller's certificate is site sin's" \
            in str(refused.value.details())
        denied, allowed = grpc.StatusCode.PERMISSION_DENIED, None
        calls: list[tuple[str, str, Any, Any]] = [
            # holder, method, request, what comes of it (None: anything but a refusal)
            ("sin", "RegisterSite", pb.RegisterSiteRequest(site="sfo", address="x:1"), denied),
            ("cli", "RegisterSite", pb.RegisterSiteRequest(site="ams", address="x:1"), denied),
            ("controller", "RegisterSite", pb.RegisterSiteRequest(site="ams", address="x:1"),
             denied),
            ("sin", "RegisterSite", pb.RegisterSiteRequest(site="sin", address="x:1"), allowed),
            ("sin", "Heartbeat", pb.HeartbeatRequest(site="sfo"), denied),
            ("sin", "Heartbeat", pb.HeartbeatRequest(site="sin"), allowed),
            # Results come from the root (ams) only.
            ("sin", "PublishResults", pb.PublishResultsRequest(query="q"), denied),
            ("ams", "PublishResults", pb.PublishResultsRequest(query="q"), allowed),
            # Queries are the CLI's to submit and cancel, not a site's.
            ("sfo", "CancelQuery", pb.CancelQueryRequest(query="q"), denied),
            ("cli", "CancelQuery", pb.CancelQueryRequest(query="q"), allowed),
        ]
        for holder, method, request, wanted in calls:
            try:
                getattr(stub(holder), method)(request, timeout=5)
                code = None
            except grpc.RpcError as e:
                code = e.code()
            assert (code is denied) is (wanted is denied), (holder, method, code)
        # A site takes deploys and stops from the controller, not from another site.
        stop, site_port = _serve(run_site, "sin", address,
                                 security=Security.resolve(per_site["sin"], env={}))
        try:
            site = f"127.0.0.1:{site_port}"
            deadline = time.monotonic() + 30
            for holder, code in (("sfo", grpc.StatusCode.PERMISSION_DENIED), ("controller", None)):
                while True:
                    try:
                        rpc.SiteControllerStub(Security.resolve(per_site[holder], env={})
                                               .channel(site)).StopFragment(
                            pb.StopFragmentRequest(query="q"), timeout=5)
                        assert code is None, holder
                        break
                    except grpc.RpcError as e:
                        if e.code() is grpc.StatusCode.UNAVAILABLE:  # not registered yet
                            assert time.monotonic() < deadline
                            time.sleep(0.2)
                            continue
                        assert e.code() is code, (holder, e.details())
                        break
        finally:
            stop.set()

        # /metrics and the dashboard ask for the token.
        token = (per_site["controller"] / "token").read_text().strip()
        basic = "Basic " + base64.b64encode(f"anyone:{token}".encode()).decode()
        for url in (f"http://127.0.0.1:{metrics}/metrics", f"http://127.0.0.1:{dashboard}/"):
            assert _http_get(url) == 401
            assert _http_get(url, "Bearer wrong") == 401
            assert _http_get(url, f"Bearer {token}") == 200
            assert _http_get(url, basic) == 200
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def test_a_site_takes_partials_only_under_the_senders_own_name(
        per_site: dict[str, Path]) -> None:
    delivered: list[str] = []
    aggregate = WindowAggregate(
        schema=js.Schema.of({"domain": js.DataType.STRING, "n": js.DataType.PARTIAL}),
        keys=("domain",), aggregates=(("n", js.count()),), phase=Phase.PARTIAL)
    servicer = DataPlaneServicer(lambda q: aggregate if q == "q" else None,
                                 lambda batch: delivered.append(batch.origin), site="ams")
    server, port = start_server([(dataplane_rpc.add_DataPlaneServicer_to_server, servicer,
                                  "jetstream.v1.DataPlane")], 0,
                                security=Security.resolve(per_site["ams"], env={}))
    sfo = Security.resolve(per_site["sfo"], env={})
    senders = []
    try:
        for origin in ("sin", "sfo"):  # sfo's certificate, sin's name: refused
            sender = PartialSender(f"127.0.0.1:{port}", connect=sfo.channel, max_backoff_s=0.2)
            senders.append(sender)
            sender.send(encode_batch(PartialBatch("q", (0, 10), origin,
                                                  ({"domain": "a", "n": 1},)), aggregate))
        assert senders[1].flush(10) and not senders[0].flush(1)
        assert delivered == ["sfo"] and servicer.refused["sin"] >= 1
        with pytest.raises(grpc.RpcError) as refused:
            list(dataplane_rpc.DataPlaneStub(sfo.channel(f"127.0.0.1:{port}")).Rounds(
                dataplane_pb.RoundsRequest(query="q", origin="sin"), timeout=5))
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    finally:
        for sender in senders:
            sender.close()
        server.stop(grace=0).wait(5)


def test_http_tokens_bearer_or_basic() -> None:
    assert http_authorized("Bearer s3cret", "s3cret")
    assert http_authorized("Basic " + base64.b64encode(b"me:s3cret").decode(), "s3cret")
    for bad in (None, "", "Bearer", "Bearer nope", "Basic !!!", "Token s3cret",
                "Basic " + base64.b64encode(b"s3cret").decode()):
        assert not http_authorized(bad, "s3cret"), bad


def test_a_site_merges_partials_only_from_its_planned_inputs() -> None:
    source = """
import jetstream as js
logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)
query = js.Query('q', logs.window(js.tumbling('1s')).group_by('domain').agg(n=js.count()))
"""
    _, site_query, partial = split(query_from_source(source, "<test>"))
    events = [log(100, "a.com"), log(200, "b.com")]
    (batch,) = site_batches(site_query, partial, "sfo", events)
    site = SiteRuntime("dc", SiteOptions(deadline_s=30), lambda *_: None)
    # dc merges sfo's partials and sends them on (to nowhere here).
    site.deploy(Assignment(Fragment("q", "dc", children=("sfo",), parent="ams"),
                           spec_of(source), parent_address=f"127.0.0.1:{free_port()}",
                           covers=("sfo",)))
    server, port = start_server([(dataplane_rpc.add_DataPlaneServicer_to_server,
                                  site.servicer, "jetstream.v1.DataPlane")], 0)
    senders = [PartialSender(f"127.0.0.1:{port}", max_backoff_s=0.2) for _ in range(2)]
    try:
        run = site.run("q")
        assert run is not None
        senders[0].send(encode_batch(replace(batch, origin="sin"), partial))  # not a child
        senders[1].send(encode_batch(batch, partial))
        assert senders[1].flush(10)
        assert not senders[0].flush(1)  # refused, and tried again: a re-plan may make it one
        senders[1].send_progress(dataplane_pb.Progress(query="q", origin="sfo",
                                                       watermark_ms=10_000, sequence=99))
        uplink = run.uplink
        assert uplink is not None
        deadline = time.monotonic() + 20
        while not uplink.sender.pending():  # the window, merged, waits for ams's ack
            assert time.monotonic() < deadline
            time.sleep(0.1)
        (merged,) = uplink.sender.pending()
        assert decode_batch(merged, partial).rows == batch.rows  # sfo's alone, not sin's too
    finally:
        for sender in senders:
            sender.close()
        server.stop(grace=0).wait(5)
        site.close()


@pytest.mark.parametrize("common_name, who, sfo", [
    ("jetstream site sfo", Identity("site", "sfo"), True),
    ("jetstream site sin", Identity("site", "sin"), False),
    ("jetstream controller", Identity("controller"), False),
    ("jetstream cli", Identity("cli"), False),
    ("jetstream node", Identity("any"), True),  # the shared development certificate
    ("sfo.example.com", Identity("any"), True),  # one's own CA's, naming no role
])
def test_a_certificates_common_name_says_who_holds_it(common_name: str, who: Identity,
                                                      sfo: bool) -> None:
    context = SimpleNamespace(auth_context=lambda: {"x509_common_name": [common_name.encode()]})
    identity = peer_identity(context)  # type: ignore[arg-type]
    assert identity == who and identity.acts_as("sfo") is sfo
    assert peer_identity(SimpleNamespace(auth_context=dict)) is None  # type: ignore[arg-type]


def test_certs_keep_refuses_a_ca_made_without_the_sites_folders(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", str(tmp_path / "tls")]) == 0  # shared, from before --sites
    assert main(["certs", str(tmp_path / "tls"), "--keep", "--sites", "ams"]) != 0
    assert "no certificate for ams, controller, cli" in capsys.readouterr().err
    assert main(["certs", str(tmp_path / "tls"), "--force", "--sites", "ams"]) == 0
    assert main(["certs", str(tmp_path / "tls"), "--keep", "--sites", "ams"]) == 0


def test_http_token_without_a_token_is_refused_at_start(tls: Path) -> None:
    untokened = replace(Security.resolve(tls, env={}), token=None)
    with pytest.raises(ControlPlaneError, match="--http-token: this process has no token"):
        run_controller(load_topology(DEFAULT_TOPOLOGY), 0, security=untokened,
                       metrics_port=free_port(), http_token=True)
