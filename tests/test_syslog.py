"""Logs sent to a site over syslog (jetstream.stage.syslog): RFC 5424 and RFC 3164 read, the
payload's JSON spooled as pushes are; UDP's drops counted, TCP pushing back, RELP answering
only once a message is on disk and taking a keyed message once."""

from __future__ import annotations

import calendar
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jetstream.security import CA_FILE, CERT_FILE, KEY_FILE, make_dev_certs
from jetstream.stage.push import Spool
from jetstream.stage.syslog import Intake, parse, serve_syslog

RECORD = {"ts": 1764626400123, "pop": "ams", "domain": "a.example", "request_id": "r1"}
LINE = json.dumps(RECORD, separators=(",", ":"))


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    made = Spool(tmp_path / "in", tmp_path / "push", site="ams", roll_s=0.2)
    yield made
    made.close()


def spooled(folder: Path) -> list[str]:
    return [line for path in sorted(folder.glob("push-*.jsonl"))
            for line in path.read_text().splitlines()]


def wait_for(what: object, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.05)


def test_rfc_5424_is_read_with_or_without_structured_data() -> None:
    plain = parse(f"<165>1 2025-12-01T22:00:00.123Z host nginx 42 - - {LINE}".encode())
    assert plain.time_ms == 1764626400123
    assert plain.payload == LINE.encode()
    data = parse(b'<165>1 2025-12-01T23:00:00.5+01:00 host app - id [ex@32473 a="x\\"]"]'
                 b'[b@32473 c="d"] \xef\xbb\xbf' + LINE.encode())
    assert data.time_ms == 1764626400500
    assert data.payload == LINE.encode()
    assert parse(b"<165>1 - - - - - -").payload == b""


def test_rfc_3164_has_no_year_so_the_nearest_one_is_taken() -> None:
    now = calendar.timegm((2026, 1, 1, 0, 5, 0))
    for raw in (f"<190>Dec 31 23:59:58 nginx: {LINE}", f"<190>Dec 31 23:59:58 edge1 nginx: "
                f"{LINE}", f"<13>Dec 31 23:59:58 edge1 app[42]: {LINE}"):
        message = parse(raw.encode(), now_s=now)
        assert message.payload == LINE.encode(), raw
        assert message.time_ms == calendar.timegm((2025, 12, 31, 23, 59, 58)) * 1000
    assert parse(b"<13>Jan  2 00:00:00 h t: x", now_s=now).time_ms == \
        calendar.timegm((2026, 1, 2, 0, 0, 0)) * 1000
    assert parse(f"<13>Jan  2 00:00:00 {LINE}".encode(), now).payload == LINE.encode()
    rsyslog = parse(f"<13>2026-01-02T00:00:00+00:00 h nginx: {LINE}".encode(), now)
    assert (rsyslog.time_ms, rsyslog.payload) == (1767312000000, LINE.encode())
    with pytest.raises(ValueError, match="RFC 3164"):
        parse(b"<13>yesterday h t: x")
    assert parse(LINE.encode()).payload == LINE.encode()  # no header: all of it


def test_the_intake_fills_the_time_takes_a_key_once_and_spools_what_is_malformed(
        spool: Spool) -> None:
    intake = Intake(spool, key_field="request_id", time_field="ts")
    untimed = {**{k: v for k, v in RECORD.items() if k != "ts"}, "request_id": "r0"}
    rolls = [intake.take(f"<190>1 2025-12-01T22:00:01Z h nginx - - - {json.dumps(untimed)}"
                         .encode(), "tcp"),
             intake.take(f"<190>Dec  1 22:00:00 nginx: {LINE}".encode(), "udp"),
             intake.take(b"<190>Dec  1 22:00:00 nginx: not json\nat all", "udp"),
             intake.take(b'{\n "pretty": true\n}', "tcp")]
    for roll in rolls:
        assert roll is not None
        roll.done.wait(10)
    assert intake.take(f"<190>Dec  1 22:00:00 nginx: {LINE}".encode(), "udp") is None
    got = spooled(spool.folder)
    assert json.loads(got[0]) == {**untimed, "ts": 1764626401000}
    assert got[1:] == [LINE, "not json at all", '{"pretty":true}']


def test_udp_counts_what_the_kernel_drops_while_the_site_cannot_read(spool: Spool) -> None:
    intake = Intake(spool)
    [udp] = serve_syslog(intake, udp=("127.0.0.1", 0))
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sent = 0
    try:
        with spool._lock:  # the reader waits on the spool: its socket's buffer fills
            for _ in range(20_000):
                sender.sendto(f"<190>Dec  1 22:00:00 nginx: {LINE}".encode(), udp.address)
                sent += 1
        wait_for(lambda: len(spooled(spool.folder)) > 0)
        sender.sendto(f"<190>Dec  1 22:00:00 nginx: {LINE}".encode(), udp.address)  # reports
        sent += 1
        wait_for(lambda: len(spooled(spool.folder)) + udp.dropped["socket buffer"] == sent)
    finally:
        udp.close()
        sender.close()
    assert udp.dropped["socket buffer"] > 0


def test_tcp_takes_both_framings_and_pushes_back_while_the_spool_is_full(
        tmp_path: Path) -> None:
    spool = Spool(tmp_path / "in", tmp_path / "push", site="ams", roll_s=0.2,
                  max_pending_bytes=4 * len(LINE))
    [tcp] = serve_syslog(Intake(spool), tcp=("127.0.0.1", 0))
    message = f"<190>1 2025-12-01T22:00:00Z h nginx - - - {LINE}".encode()
    try:
        with socket.create_connection(tcp.address[:2]) as conn:
            for i in range(40):
                conn.sendall(b"%d %s" % (len(message), message) if i % 2 else message + b"\n")
        wait_for(lambda: len(spooled(spool.folder)) == 40)  # several rolls: the site waited
        assert len(list(spool.folder.glob("push-*.jsonl"))) >= 10
    finally:
        tcp.close()
        spool.close()


class RelpClient:
    """A RELP sender as rsyslog's omrelp is: open, numbered syslog commands, close."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.conn = socket.create_connection(address[:2])
        self.stream = self.conn.makefile("rb")
        self.txnr = 0
        assert self.send(b"open", b"relp_version=0\nrelp_software=test\ncommands=syslog")
        assert b"commands=syslog" in self.read()[1]

    def send(self, command: bytes, data: bytes) -> int:
        self.txnr += 1
        head = b"%d %s %d" % (self.txnr, command, len(data))
        self.conn.sendall(head + (b" " + data if data else b"") + b"\n")
        return self.txnr

    def read(self) -> tuple[int, bytes]:
        """The next answer: its number and its text."""
        header = b""
        while header.count(b" ") < 3 and not header.endswith(b"\n"):
            header += self.stream.read(1)
        parts = header.split(b" ")
        length = int(parts[2])
        text = self.stream.read(length) if length else b""
        if length:
            self.stream.read(1)  # its newline
        return int(parts[0]), text


def keyed(request_id: str) -> bytes:
    return f"<190>1 - h nginx - - - {json.dumps({**RECORD, 'request_id': request_id})}".encode()


def test_relp_answers_each_message_once_it_is_on_disk_and_a_keyed_one_is_taken_once(
        spool: Spool) -> None:
    [relp] = serve_syslog(Intake(spool, key_field="request_id"), relp=("127.0.0.1", 0))
    try:
        client = RelpClient(relp.address)
        sent = [client.send(b"syslog", keyed(f"r{i}")) for i in range(5)]
        for i, txnr in enumerate(sent):
            assert client.read() == (txnr, b"200 OK")
            assert len(spooled(spool.folder)) > i  # answered only once it is on disk
        again = client.send(b"syslog", keyed("r3"))
        assert client.read() == (again, b"200 OK")
        closing = client.send(b"close", b"")
        assert client.read() == (closing, b"")
    finally:
        relp.close()
    assert len(spooled(spool.folder)) == 5  # the one sent again is not written twice


def test_tcp_over_tls_with_the_sites_certificate(spool: Spool, tmp_path: Path) -> None:
    made = make_dev_certs(tmp_path / "tls")
    [tcp] = serve_syslog(Intake(spool), tcp=("127.0.0.1", 0),
                         tls=(made.folder / CERT_FILE, made.folder / KEY_FILE))
    context = ssl.create_default_context(cafile=made.folder / CA_FILE)
    try:
        with socket.create_connection(tcp.address[:2]) as idle:  # shakes no hands: waits
            with socket.create_connection(tcp.address[:2]) as raw, \
                    context.wrap_socket(raw, server_hostname="localhost") as conn:
                conn.sendall(f"<190>1 - h nginx - - - {LINE}\n".encode())
            wait_for(lambda: spooled(spool.folder) == [LINE])
            del idle
    finally:
        tcp.close()


def test_a_peer_that_sends_garbage_is_refused_and_the_others_go_on(spool: Spool) -> None:
    intake = Intake(spool)
    udp, relp = serve_syslog(intake, udp=("127.0.0.1", 0), relp=("127.0.0.1", 0))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(b"<13>Dec  1 22:00:00 nginx: " + b"[" * 50_000, udp.address)
            sender.sendto(f"<13>Dec  1 22:00:00 nginx: {LINE}".encode(), udp.address)
        with socket.create_connection(relp.address[:2]) as bad:
            bad.sendall(b"1 syslog -5 x\n")
            assert bad.recv(100) == b""  # closed on it
        client = RelpClient(relp.address)
        after = client.send(b"syslog", keyed("after"))
        assert client.read() == (after, b"200 OK")
        wait_for(lambda: len(spooled(spool.folder)) == 3)
    finally:
        udp.close()
        relp.close()
    garbage, *fine = spooled(spool.folder)
    assert garbage.startswith("[[[") and len(fine) == 2  # counted malformed, spooled
