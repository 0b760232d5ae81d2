"""Logs pushed to a site over HTTP: NDJSON POSTed by a log shipper, spooled into the site's
input folder as whole files, answered 200 only once they are durable.

What log shippers' HTTP sinks send (Vector's ``http`` sink, Fluent Bit's ``http`` output,
Logstash's ``http`` output): a POST whose body is JSON lines, gzip-compressed when it says
``Content-Encoding: gzip``. A :class:`Spool` gathers the lines of every request and, once a
roll interval (``roll_s``, 1 s by default), writes them to one file of the site's input
folder the way a shipper drops a file: written under a hidden name, flushed to disk,
renamed into place, the folder flushed too. A request is answered only then -- 200 with how
many lines it carried -- so an answer of 200 means the lines are on disk where the site's
reader takes them; a request that is not answered 200 was not taken, and the sender sends
it again.

A request that carries an ``Idempotency-Key`` header is taken once: the spool remembers the
keys of what it made durable (``keys.log`` beside it, ``KEEP_KEYS`` of them), and a retried
request with a key it holds is answered 200 again without its lines being written twice; one
whose first copy is still waiting for its roll waits for that. Without a key, a retry of a
request whose 200 was lost on the way is written twice: give shippers a key where they can.
(A crash between a file's rename and its keys' record would still take a retry twice: the
keys are written right after the rename.)

The spool holds at most ``max_pending_bytes`` not yet written; a request that would pass it
is answered 429 with ``Retry-After``, and nothing of it is taken. A request's body is at most
``max_request_bytes`` (413 above it, decompressed or not). A line that is no JSON object is
counted as malformed and spooled all the same: the site's stage counts it and sets it aside
with its reason, as for a file. The server listens on loopback unless told otherwise, asks
for the site's token (``Authorization: Bearer``) when given one, and serves TLS with the
site's certificate when it has one.
"""

from __future__ import annotations

import contextlib
import hmac
import http.server
import json
import logging
import os
import ssl
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from prometheus_client import Counter, Gauge

from jetstream.errors import DataError

__all__ = ["KEEP_KEYS", "PushServer", "Roll", "Spool", "SpoolFull", "serve_push"]

log = logging.getLogger(__name__)

#: How many idempotency keys a spool remembers (the oldest are forgotten first).
KEEP_KEYS = 100_000

PUSH_LINES = Counter("jetstream_push_lines_total",
                     "Lines pushed to a site over HTTP, by what became of them: accepted, "
                     "malformed (accepted too: the stage sets them aside), duplicate (a "
                     "retried request with a known idempotency key)", ["site", "outcome"])
PUSH_REQUESTS = Counter("jetstream_push_requests_total",
                        "HTTP push requests to a site, by the status answered",
                        ["site", "code"])
PUSH_PENDING = Gauge("jetstream_push_pending_bytes",
                     "Bytes a site's push spool holds that are not on disk yet", ["site"])
PUSH_FILES = Counter("jetstream_push_files_total",
                     "Files a site's push spool wrote into its input folder", ["site"])


class SpoolFull(DataError):
    """The spool holds as much as it may: the sender should retry later."""


@dataclass
class Roll:
    """What waits for the next file: the lines, their keys, and who waits for them."""

    data: bytearray = field(default_factory=bytearray)
    keys: dict[str, None] = field(default_factory=dict)  # in order
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class Spool:
    """Lines handed to it go into ``folder`` as whole ``push-*.jsonl`` files, one per roll
    interval; ``state`` keeps the keys of what is durable. Thread-safe."""

    def __init__(self, folder: Path, state: Path, *, site: str = "", roll_s: float = 1.0,
                 max_pending_bytes: int = 64 << 20) -> None:
        if not roll_s > 0 or max_pending_bytes <= 0:
            msg = f"push spool: roll_s and max_pending_bytes must be > 0, not {roll_s!r}"
            raise DataError(msg)
        self.folder, self.site = folder, site
        self.roll_s, self.max_pending_bytes = roll_s, max_pending_bytes
        folder.mkdir(parents=True, exist_ok=True)
        state.mkdir(parents=True, exist_ok=True)
        for half_written in folder.glob(".push-*.part"):  # a crash's: never answered 200
            half_written.unlink(missing_ok=True)
        self._keys_path = state / "keys.log"
        self._durable: OrderedDict[str, None] = OrderedDict()
        kept = self._keys_path.read_text().splitlines() if self._keys_path.exists() else []
        for key in kept[-KEEP_KEYS:]:
            self._durable[key] = None
        self._keys = self._compact()
        self._lock = threading.Lock()
        self._roll = Roll()
        self._writing = Roll()  # the roll being written: its keys are not durable yet
        self._sequence = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="push-spool", daemon=True)
        self._thread.start()

    def put(self, lines: bytes, key: str | None = None) -> Roll | None:
        """Take ``lines`` (whole lines, each ending in a newline) for the next file: the
        roll they are in, whose ``done`` is set once it is written (``error`` says why not);
        None for a ``key`` (the request's idempotency key) already durable.

        Raises
        ------
        SpoolFull
            If taking them would pass ``max_pending_bytes``: nothing is taken.
        """
        with self._lock:
            if key is not None:
                if key in self._durable:
                    return None
                for roll in (self._roll, self._writing):  # on its way: wait for it
                    if key in roll.keys:
                        return roll
            if len(self._roll.data) + len(lines) > self.max_pending_bytes:
                msg = (f"push spool of {self.site or self.folder}: holds "
                       f"{len(self._roll.data):,} bytes not yet on disk, at most "
                       f"{self.max_pending_bytes:,}")
                raise SpoolFull(msg)
            self._roll.data += lines
            if key is not None:
                self._roll.keys[key] = None
            PUSH_PENDING.labels(self.site).set(len(self._roll.data))
            return self._roll

    def _compact(self) -> TextIO:
        """``keys.log`` rewritten to hold the keys kept, open to append to."""
        staged = self._keys_path.with_name(".keys.log")
        with staged.open("w") as out:
            out.write("".join(f"{k}\n" for k in self._durable))
            out.flush()
            os.fsync(out.fileno())
        os.replace(staged, self._keys_path)
        self._logged = len(self._durable)
        return self._keys_path.open("a")

    def close(self) -> None:
        """Write what waits, then stop."""
        self._stop.set()
        self._thread.join(10)
        self._keys.close()

    def _run(self) -> None:
        while not self._stop.wait(self.roll_s):
            self._write()
        self._write()

    def _write(self) -> None:
        with self._lock:
            roll = self._writing = self._roll
            self._roll = Roll()
            PUSH_PENDING.labels(self.site).set(0)
        if not roll.data:
            roll.done.set()
            return
        self._sequence += 1
        name = f"push-{time.time_ns() // 1_000_000:013d}-{os.getpid()}-{self._sequence:06d}.jsonl"
        staged = self.folder / f".{name}.part"  # hidden: no reader takes it half-written
        try:
            with staged.open("wb") as out:
                out.write(roll.data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(staged, self.folder / name)
            _fsync_dir(self.folder)
            if roll.keys:
                self._keys.write("".join(f"{k}\n" for k in roll.keys))
                self._keys.flush()
                os.fsync(self._keys.fileno())
                self._logged += len(roll.keys)
        except OSError as e:
            log.exception("push spool of %s: writing %s failed", self.site, name)
            roll.error = f"the spool could not write its file: {e}"
            with contextlib.suppress(OSError):
                staged.unlink()
        else:
            PUSH_FILES.labels(self.site).inc()
            with self._lock:
                for key in roll.keys:
                    self._durable[key] = None
                while len(self._durable) > KEEP_KEYS:
                    self._durable.popitem(last=False)
            if self._logged > 2 * KEEP_KEYS:  # the log holds what is kept, not much more
                try:
                    self._keys.close()
                    self._keys = self._compact()
                except OSError:
                    log.exception("push spool of %s: compacting keys.log failed", self.site)
                    self._keys = self._keys_path.open("a")
        with self._lock:
            self._writing = Roll()
        roll.done.set()


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lines(body: bytes) -> tuple[bytes, int, int]:
    """The body's lines, each ending in a newline (blank ones dropped), how many, and how
    many are no JSON object."""
    kept, malformed = [], 0
    for line in body.splitlines():
        if not line.strip():
            continue
        try:
            if not isinstance(json.loads(line), dict):
                malformed += 1
        except (ValueError, RecursionError):
            malformed += 1
        kept.append(line + b"\n")
    return b"".join(kept), len(kept), malformed


class PushServer(http.server.ThreadingHTTPServer):
    """The HTTP front of a :class:`Spool`."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], spool: Spool, *, token: str | None = None,
                 max_request_bytes: int = 16 << 20, wait_s: float = 30.0) -> None:
        super().__init__(address, _Handler)
        self.spool, self.token = spool, token
        self.max_request_bytes, self.wait_s = max_request_bytes, wait_s


class _Handler(http.server.BaseHTTPRequestHandler):
    server: PushServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        log.debug("push %s: " + format, self.client_address[0], *args)

    def do_POST(self) -> None:
        server = self.server
        if server.token is not None:
            given = self.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {server.token}".encode()):
                self._answer(401, {"error": "a token is required: Authorization: Bearer ..."})
                return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._answer(411, {"error": "a body needs its Content-Length"})
            return
        if length > server.max_request_bytes:
            self._answer(413, {"error": f"a request is at most {server.max_request_bytes:,} "
                                        "bytes"}, close=True)
            return
        body = self.rfile.read(length)
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            try:
                body = _gunzip(body, server.max_request_bytes)
            except (OSError, EOFError, zlib.error) as e:
                self._answer(400, {"error": f"the body is no gzip stream: {e}"})
                return
            except ValueError as e:
                self._answer(413, {"error": str(e)})
                return
        lines, count, malformed = _lines(body)
        key = self.headers.get("Idempotency-Key") or None
        try:
            roll = server.spool.put(lines, key)
        except SpoolFull as e:
            self._answer(429, {"error": str(e)}, retry_after=max(1, round(server.spool.roll_s)))
            return
        site = server.spool.site
        if roll is None:
            PUSH_LINES.labels(site, "duplicate").inc(count)
            self._answer(200, {"accepted": count, "malformed": malformed, "duplicate": True})
            return
        if not roll.done.wait(server.wait_s) or roll.error is not None:
            self._answer(503, {"error": roll.error or "not on disk in time; send it again"})
            return
        PUSH_LINES.labels(site, "accepted").inc(count - malformed)
        PUSH_LINES.labels(site, "malformed").inc(malformed)
        self._answer(200, {"accepted": count, "malformed": malformed, "duplicate": False})

    def _answer(self, code: int, body: dict[str, object], *, retry_after: int | None = None,
                close: bool = False) -> None:
        PUSH_REQUESTS.labels(self.server.spool.site, str(code)).inc()
        data = (json.dumps(body) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        if close:  # what is left of its body is not read
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)


def _gunzip(body: bytes, limit: int) -> bytes:
    """``body`` decompressed (every gzip member of it), at most ``limit`` bytes of it (a
    ValueError past that)."""
    out = bytearray()
    while True:
        stream = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        out += stream.decompress(body, limit + 1 - len(out))
        if len(out) > limit or stream.unconsumed_tail:
            msg = f"a request is at most {limit:,} bytes decompressed"
            raise ValueError(msg)
        if not stream.eof:
            msg = "the gzip stream is cut off"
            raise EOFError(msg)
        body = stream.unused_data
        if not body:
            return bytes(out)


def serve_push(address: tuple[str, int], spool: Spool, *, token: str | None = None,
               tls: tuple[Path, Path] | None = None, **options: float) -> PushServer:
    """Serve ``spool`` over HTTP at ``address`` on a thread of its own (TLS with the
    ``(certificate, key)`` files of ``tls``, if given); ``server.shutdown()`` stops it."""
    server = PushServer(address, spool, token=token, **options)  # type: ignore[arg-type]
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="push-http", daemon=True).start()
    log.info("taking pushed logs on http%s://%s:%d%s", "s" if tls else "",
             *server.server_address[:2], " (token required)" if token else "")
    return server

