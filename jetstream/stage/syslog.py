"""Logs sent to a site over syslog: RFC 5424 or RFC 3164 messages whose text is a JSON object
(an nginx access log's ``log_format ... escape=json``, say), over UDP, TCP or RELP, into the
same :class:`~jetstream.stage.push.Spool` as HTTP pushes: whole ``push-*.jsonl`` files of the
site's input folder, one per roll interval.

What each transport promises:

- **RELP** (rsyslog's ``omrelp``) acknowledges each message, and a site acknowledges one only
  once it is on disk; the sender keeps what is not acknowledged and sends it again after a
  reconnect. So a site killed mid-stream loses nothing acknowledged. A message sent again
  whose first copy was on disk before the kill (its answer lost) is taken twice, unless the
  site is given ``key_field``: a JSON field unique to a record (nginx's ``$request_id``), by
  which a message is taken once, as an HTTP push's ``Idempotency-Key`` is. A sender has at
  most its window (omrelp's ``windowSize``) unacknowledged, so a connection carries at most
  a window per roll interval: size it to the rate.
- **TCP** (RFC 6587: octet-counted frames, or one message a line) pushes back: while the
  spool is full the site stops reading, and the sender's socket fills. Plain TCP carries no
  acknowledgement of the site's own, so what a site had read and not yet written when it dies
  is lost with no one to count it: use RELP where that matters.
- **UDP** (nginx's ``access_log syslog:``; one message a datagram) cannot push back: what the
  kernel drops because the site's socket buffer is full, and what the site drops because its
  spool is, is counted (``jetstream_syslog_dropped_total``), nothing else of a lost datagram
  can be.

An event's time is read from the payload, a JSON field the query's schema names (epoch ms).
``time_field`` fills that field, when a message's payload lacks it, from the syslog header's
timestamp: RFC 5424's carries its zone; RFC 3164's has neither year nor zone, so it is read
as UTC in the year that puts it nearest to now. A header's time is when the message was
written to syslog, not when the request was served: have the edge server put its own time in
the payload where it can (nginx's ``$msec`` is seconds with a fraction: docs/deployment.md
shows the ``map`` that makes it epoch ms).

A message that is not syslog at all (no ``<PRI>``) is taken whole as the payload. A payload
that is no JSON object is counted as malformed and spooled all the same, so the stage counts
it and sets it aside with its reason.
"""

from __future__ import annotations

import calendar
import io
import json
import logging
import queue
import socket
import socketserver
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from prometheus_client import Counter

from jetstream.stage.push import Roll, Spool, SpoolFull

__all__ = ["Intake", "Message", "parse", "serve_syslog"]

log = logging.getLogger(__name__)

SYSLOG_MESSAGES = Counter("jetstream_syslog_messages_total",
                          "Syslog messages a site took, by transport and by what became of "
                          "them: accepted, malformed (accepted too: the stage sets them "
                          "aside), duplicate (a key already taken)",
                          ["site", "transport", "outcome"])
SYSLOG_DROPPED = Counter("jetstream_syslog_dropped_total",
                         "Syslog datagrams lost on a site's UDP listener, by reason: socket "
                         "buffer (dropped by the kernel), spool full (by the site)",
                         ["site", "reason"])

#: The longest message taken, in bytes (rsyslog's default is 8 KiB).
MAX_MESSAGE = 64 << 10
#: Linux's socket option that reports a UDP socket's drops with each datagram.
SO_RXQ_OVFL = 40

_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}


@dataclass(frozen=True)
class Message:
    """A syslog message: its header's time (epoch ms, None if it has none) and its text."""

    time_ms: int | None
    payload: bytes


def parse(raw: bytes, now_s: float | None = None) -> Message:
    """``raw`` (one message, without its framing) read as RFC 5424 or RFC 3164.

    Raises
    ------
    ValueError
        If a ``<PRI>`` header is not followed by one of the two formats' timestamps.
    """
    raw = raw.rstrip(b"\r\n")
    end = raw.find(b">", 1, 5)
    if not raw.startswith(b"<") or end < 0 or not raw[1:end].isdigit():
        return Message(None, raw)
    rest = raw[end + 1:]
    if rest[:2] == b"1 ":
        return _parse_5424(rest[2:])
    return _parse_3164(rest, time.time() if now_s is None else now_s)


def _parse_5424(rest: bytes) -> Message:
    # TIMESTAMP HOSTNAME APP-NAME PROCID MSGID STRUCTURED-DATA [MSG]
    parts = rest.split(b" ", 5)
    if len(parts) < 6:
        msg = "an RFC 5424 message needs a timestamp, host, app, process, id and data"
        raise ValueError(msg)
    stamp, sd_and_msg = parts[0], parts[5]
    time_ms = None
    if stamp != b"-":
        text = stamp.decode("ascii").replace("Z", "+00:00")
        time_ms = round(datetime.fromisoformat(text).timestamp() * 1000)
    payload = sd_and_msg[2:] if sd_and_msg[:2] == b"- " else _after_data(sd_and_msg)
    return Message(time_ms, payload.removeprefix(b"\xef\xbb\xbf"))


def _after_data(text: bytes) -> bytes:
    """What follows RFC 5424's structured data (``[id k="v" ...]...``) and its space."""
    if text == b"-":
        return b""
    at, quoted = 0, False
    while at < len(text):
        c = text[at:at + 1]
        if quoted and c == b"\\":
            at += 2
            continue
        if c == b'"':
            quoted = not quoted
        elif c == b"]" and not quoted and text[at + 1:at + 2] != b"[":
            return text[at + 2:]
        at += 1
    msg = "an RFC 5424 message's structured data is not closed"
    raise ValueError(msg)


def _parse_3164(rest: bytes, now_s: float) -> Message:
    # Mmm dd hh:mm:ss [HOSTNAME] TAG[: ]MSG -- no year, no zone; or rsyslog's variant with
    # an RFC 3339 time in its place
    if rest[:1].isdigit():
        iso, _, body = rest.partition(b" ")
        text = iso.decode("ascii", "replace").replace("Z", "+00:00")
        return Message(round(datetime.fromisoformat(text).timestamp() * 1000), _text(body))
    stamp = rest[:15].decode("ascii", "replace")
    month = _MONTHS.get(stamp[:3])
    try:
        day, clock = int(stamp[4:6]), time.strptime(stamp[7:15], "%H:%M:%S")
    except ValueError:
        month = None
    if month is None or rest[15:16] != b" ":
        msg = "an RFC 3164 message starts with its time, e.g. 'Oct  1 22:14:15'"
        raise ValueError(msg)
    year = time.gmtime(now_s).tm_year
    times = [calendar.timegm((y, month, day, clock.tm_hour, clock.tm_min, clock.tm_sec))
             for y in (year - 1, year, year + 1)]
    return Message(min(times, key=lambda t: abs(t - now_s)) * 1000, _text(rest[16:]))


def _text(body: bytes) -> bytes:
    """An RFC 3164 message's text: what follows its tag (``nginx:``, ``app[42]:``) and the
    host before it, if there is one; all of it if there is no tag."""
    if body.startswith(b"{"):
        return body
    words = body.split(b" ", 2)
    tag_at = 0 if words[0].endswith(b":") else 1
    if len(words) <= tag_at or not words[tag_at].endswith(b":"):
        return body
    return b" ".join(words[tag_at + 1:])


class Intake:
    """What every transport shares: a message turned into a line of ``spool``; ``key_field``
    and ``time_field`` name payload fields (see the module)."""

    def __init__(self, spool: Spool, *, key_field: str | None = None,
                 time_field: str | None = None) -> None:
        self.spool, self.key_field, self.time_field = spool, key_field, time_field

    def take(self, raw: bytes, transport: str) -> Roll | None:
        """Put ``raw`` in the spool: the roll it waits in, None if its key was taken before.

        Raises
        ------
        SpoolFull
            If the spool holds as much as it may: nothing is taken.
        """
        try:
            message = parse(raw)
        except ValueError:
            message = Message(None, raw.rstrip(b"\r\n"))
        try:
            record = json.loads(message.payload)
        except (ValueError, RecursionError):
            record = None
        key, outcome = None, "accepted"
        if isinstance(record, dict):
            line = message.payload
            if self.key_field is not None and record.get(self.key_field) is not None:
                key = str(record[self.key_field]).replace("\n", " ")  # a line of keys.log
            if self.time_field is not None and self.time_field not in record \
                    and message.time_ms is not None:
                record[self.time_field] = message.time_ms
                line = json.dumps(record, separators=(",", ":")).encode()
            elif b"\n" in line or b"\r" in line:
                line = json.dumps(record, separators=(",", ":")).encode()
        else:
            line, outcome = message.payload.replace(b"\n", b" ").replace(b"\r", b" "), "malformed"
        roll = self.spool.put(line + b"\n", key)
        SYSLOG_MESSAGES.labels(self.spool.site, transport,
                               "duplicate" if roll is None else outcome).inc()
        return roll

    def take_waiting(self, raw: bytes, transport: str, stop: threading.Event) -> Roll | None:
        """:meth:`take`, waiting while the spool is full (the sender waits on us then)."""
        while True:
            try:
                return self.take(raw, transport)
            except SpoolFull:
                if stop.wait(self.spool.roll_s):
                    raise


class _UDP:
    """A UDP listener: a datagram a message."""

    def __init__(self, address: tuple[str, int], intake: Intake) -> None:
        self.intake = intake
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.socket.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        self.socket.bind(address)
        self.socket.settimeout(0.5)
        self.address = self.socket.getsockname()
        self.dropped = {"socket buffer": 0, "spool full": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="syslog-udp", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        kernel_drops, site = 0, self.intake.spool.site
        while not self._stop.is_set():
            try:
                data, ancillary, _, _ = self.socket.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4))
            except TimeoutError:
                continue
            except OSError:
                return
            for level, kind, value in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, SO_RXQ_OVFL) and len(value) >= 4:
                    total = struct.unpack("I", value[:4])[0]
                    self._drop("socket buffer", total - kernel_drops, site)
                    kernel_drops = total
            try:
                self.intake.take(data, "udp")
            except SpoolFull:
                self._drop("spool full", 1, site)

    def _drop(self, reason: str, count: int, site: str) -> None:
        if count > 0:
            self.dropped[reason] += count
            SYSLOG_DROPPED.labels(site, reason).inc(count)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.socket.close()


class _StreamServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[socketserver.BaseRequestHandler],
                 intake: Intake, tls: ssl.SSLContext | None) -> None:
        super().__init__(address, handler)
        self.intake, self.tls, self.stop = intake, tls, threading.Event()
        self.address = self.server_address

    def get_request(self) -> tuple[socket.socket, object]:
        conn, peer = super().get_request()
        if self.tls is not None:  # shaken hands on the connection's thread (see _Handler)
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, peer

    def close(self) -> None:
        self.stop.set()
        self.shutdown()
        self.server_close()


def _token(stream: io.BufferedIOBase, limit: int = 16) -> bytes:
    """Bytes up to a space or a newline (taken, not returned); b'' at the end."""
    out = bytearray()
    while len(out) <= limit:
        c = stream.read(1)
        if not c or c in b" \n":
            return bytes(out)
        out += c
    msg = f"a frame's header is longer than {limit} bytes"
    raise ValueError(msg)


class _Handler(socketserver.StreamRequestHandler):
    server: _StreamServer

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(30)
            try:
                self.request.do_handshake()
            finally:
                self.request.settimeout(None)
        super().setup()


class _TCPHandler(_Handler):
    """RFC 6587: ``LEN SP MSG`` frames, or a message a line."""

    def handle(self) -> None:
        intake, stop = self.server.intake, self.server.stop
        try:
            while not stop.is_set():
                first = self.rfile.peek(1)[:1]  # type: ignore[attr-defined]
                if not first:
                    return
                if first.isdigit():
                    length = int(_token(self.rfile))
                    if length > MAX_MESSAGE:
                        raise ValueError(f"a frame of {length:,} bytes")
                    raw = self.rfile.read(length)
                else:
                    raw = self.rfile.readline(MAX_MESSAGE)
                if raw.strip():
                    intake.take_waiting(raw, "tcp", stop)
        except (ValueError, OSError, SpoolFull) as e:
            log.warning("syslog over TCP from %s: %s; closing", self.client_address[0], e)


class _RELPHandler(_Handler):
    """RELP: each ``syslog`` command answered 200 once its message is on disk, in order."""

    def handle(self) -> None:
        answers: queue.Queue[tuple[bytes, Roll | None, bytes] | None] = queue.Queue()
        sender = threading.Thread(target=self._answer, args=(answers,), daemon=True)
        sender.start()
        try:
            self._read(answers)
        except (ValueError, OSError, SpoolFull) as e:
            log.warning("RELP from %s: %s; closing", self.client_address[0], e)
        finally:
            answers.put(None)
            sender.join()

    def _read(self, answers: queue.Queue[tuple[bytes, Roll | None, bytes] | None]) -> None:
        intake, stop = self.server.intake, self.server.stop
        while not stop.is_set():
            txnr, command = _token(self.rfile), _token(self.rfile, 32)
            if not txnr:
                return
            length = int(_token(self.rfile))
            if not 0 <= length <= MAX_MESSAGE:
                raise ValueError(f"a frame of {length:,} bytes")
            data = self.rfile.read(length)
            if length and self.rfile.read(1) != b"\n":
                raise ValueError("a RELP frame does not end in a newline")
            if command == b"open":
                offers = b"200 OK\nrelp_version=0\nrelp_software=jetstream\ncommands=syslog"
                answers.put((txnr, None, offers))
            elif command == b"syslog":
                answers.put((txnr, intake.take_waiting(data, "relp", stop), b"200 OK"))
            elif command == b"close":
                answers.put((txnr, None, b""))
                return
            else:
                answers.put((txnr, None, b"500 this site takes open, syslog and close"))

    def _answer(self, answers: queue.Queue[tuple[bytes, Roll | None, bytes] | None]) -> None:
        while (item := answers.get()) is not None:
            txnr, roll, text = item
            if roll is not None:
                roll.done.wait()
                if roll.error is not None:  # not durable: not answered; the sender resends
                    self.connection.close()
                    return
            frame = b"%s rsp %d" % (txnr, len(text)) + (b" " + text if text else b"") + b"\n"
            try:
                self.wfile.write(frame)
            except OSError:
                return


def serve_syslog(intake: Intake, *, udp: tuple[str, int] | None = None,
                 tcp: tuple[str, int] | None = None, relp: tuple[str, int] | None = None,
                 tls: tuple[Path, Path] | None = None) -> list[_UDP | _StreamServer]:
    """Listen for syslog at the addresses given, each on threads of its own (TCP and RELP
    over TLS with the ``(certificate, key)`` files of ``tls``, if given); ``close()`` each
    listener to stop it."""
    context = None
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
    listeners: list[_UDP | _StreamServer] = []
    for name, address, handler in (("udp", udp, None), ("tcp", tcp, _TCPHandler),
                                   ("relp", relp, _RELPHandler)):
        if address is None:
            continue
        if handler is None:
            listeners.append(_UDP(address, intake))
        else:
            server = _StreamServer(address, handler, intake, context)
            threading.Thread(target=server.serve_forever, name=f"syslog-{name}",
                             daemon=True).start()
            listeners.append(server)
        log.info("taking syslog over %s on %s:%d", name, *listeners[-1].address[:2])
    return listeners
