"""Real edge servers for a site: nginx (Debian's package) serving a PoP's traffic, its access
log written as JSON lines (a ``log_format ... escape=json`` with the CDN log's columns) and
sent to the site by rsyslog over RELP, acknowledged once on disk; wrk makes the requests.

An :class:`Edge` runs one PoP's nginx and rsyslog as processes of their own, in a folder of
their own, on loopback ports: nginx's own access log (:attr:`Edge.access_log`) is what it
served, the record the results are checked against. rsyslog reads it (``imfile``) and sends
each line to the site's ``--syslog-relp`` listener (``omrelp``), keeping what the site has not
acknowledged (``queue.saveOnShutdown``) and sending it again after a reconnect, so a site
killed and started again loses nothing of it; nginx's ``$request_id`` goes with each line, so
the site takes a line sent again once (``--syslog-key request_id``).

nginx has no epoch-ms variable: ``$msec`` is seconds with a fraction. The ``map`` blocks below
turn it, and ``$request_time``, into milliseconds by dropping the point (both have exactly
three decimals), which is how docs/deployment.md tells an operator to do it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from jetstream.errors import ControlPlaneError

__all__ = ["Edge", "edge_missing", "site_args"]

#: The Debian packages an edge needs, by the program each provides.
PACKAGES = {"nginx": "nginx", "rsyslogd": "rsyslog", "wrk": "wrk"}
OMRELP = ("/usr/lib/x86_64-linux-gnu/rsyslog/omrelp.so", "/usr/lib/rsyslog/omrelp.so",
          "/usr/lib64/rsyslog/omrelp.so")
#: The domains wrk asks for, and how often (a skewed mix, as a CDN sees).
DOMAINS = {f"site{i}.example": 1.0 / (i + 1) for i in range(20)}
#: The objects each PoP serves (bytes); any other path is a 404.
OBJECTS = {f"/obj/{i}": 200 + 97 * i for i in range(10)}

NGINX_CONF = """\
{user}daemon off;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {folder}/tmp/body;
    proxy_temp_path {folder}/tmp/proxy;
    fastcgi_temp_path {folder}/tmp/fastcgi;
    uwsgi_temp_path {folder}/tmp/uwsgi;
    scgi_temp_path {folder}/tmp/scgi;
    map $msec $jetstream_ms {{ "~^(?<s>[0-9]+)[.](?<f>[0-9]+)$" "$s$f"; }}
    map $request_time $jetstream_latency_ms {{ "~^(?<s>[0-9]+)[.](?<f>[0-9]+)$" "$s$f"; }}
    map $upstream_cache_status $jetstream_cache {{ "" "HIT"; default $upstream_cache_status; }}
    log_format jetstream escape=json '{{"ts":"$jetstream_ms","pop":"{pop}",'
        '"client_ip":"$remote_addr","domain":"$host","url":"$request_uri",'
        '"status":$status,"bytes":$body_bytes_sent,"latency_ms":"$jetstream_latency_ms",'
        '"cache":"$jetstream_cache","request_id":"$request_id"}}';
    access_log {folder}/access.jsonl jetstream;
    server {{
        listen 127.0.0.1:{port};
        server_name _;
        root {folder}/www;
    }}
}}
"""

RSYSLOG_CONF = """\
global(workDirectory="{folder}/rsyslog" maxMessageSize="64k")
module(load="imfile")
module(load="omrelp")
input(type="imfile" file="{folder}/access.jsonl" tag="nginx" ruleset="site"
      freshStartTail="off" reopenOnTruncate="on")
ruleset(name="site") {{
    action(type="omrelp" target="127.0.0.1" port="{relp}" windowSize="{window}"
           template="RSYSLOG_SyslogProtocol23Format"
           action.resumeRetryCount="-1" action.resumeInterval="1"
           queue.type="LinkedList" queue.size="1000000" queue.filename="site"
           queue.saveOnShutdown="on")
}}
"""

WRK_SCRIPT = """\
local domains = {{{domains}}}
local weights = {{{weights}}}
local paths = {{{paths}}}
local total = 0
for _, w in ipairs(weights) do total = total + w end
math.randomseed({seed})
function delay() return {delay_ms} end
function request()
  local r, d = math.random() * total, #domains
  for i, w in ipairs(weights) do r = r - w; if r <= 0 then d = i; break end end
  return wrk.format("GET", paths[math.random(#paths)], {{Host = domains[d]}})
end
"""


def edge_missing() -> str | None:
    """What to install for an edge to run here, or None if nothing."""
    lacking = sorted({package for program, package in PACKAGES.items()
                      if shutil.which(program, path=_path()) is None})
    if not any(Path(p).exists() for p in OMRELP):
        lacking.append("rsyslog-relp")
    if not lacking:
        return None
    return (f"the nginx edge needs {', '.join(lacking)}: on Debian or Ubuntu, "
            f"sudo apt-get install {' '.join(lacking)}")


def _path() -> str:
    return "/usr/sbin:/usr/bin:/sbin:/bin"


def site_args(relp_port: int, roll_s: float = 0.2) -> list[str]:
    """The options that make a site take its edge's log (:class:`Edge`)."""
    return ["--syslog-relp", f"127.0.0.1:{relp_port}", "--syslog-key", "request_id",
            "--push-roll", str(roll_s)]


@dataclass
class Edge:
    """A PoP's nginx on ``http_port`` and its rsyslog sending to ``relp_port``, in
    ``folder``; a context manager (stopped on leaving)."""

    pop: str
    folder: Path
    http_port: int
    relp_port: int
    window: int = 20_000  # omrelp's window: a roll's worth of lines, and more
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def access_log(self) -> Path:
        return self.folder / "access.jsonl"

    def __enter__(self) -> Edge:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        missing = edge_missing()
        if missing:
            raise ControlPlaneError(missing)
        for sub in ("www/obj", "tmp", "rsyslog"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        for path, size in OBJECTS.items():
            (self.folder / "www" / path.lstrip("/")).write_bytes(b"x" * size)
        self.access_log.touch()
        nginx = self.folder / "nginx.conf"
        as_root = "user root;\n" if os.geteuid() == 0 else ""  # its workers read our folder
        nginx.write_text(NGINX_CONF.format(folder=self.folder, pop=self.pop,
                                           port=self.http_port, user=as_root))
        rsyslog = self.folder / "rsyslog.conf"
        rsyslog.write_text(RSYSLOG_CONF.format(folder=self.folder, relp=self.relp_port,
                                               window=self.window))
        self._spawn("nginx", [shutil.which("nginx", path=_path()) or "nginx", "-c",
                              str(nginx), "-p", str(self.folder)])
        self._spawn("rsyslog", [shutil.which("rsyslogd", path=_path()) or "rsyslogd", "-n",
                                "-f", str(rsyslog), "-i", str(self.folder / "rsyslog.pid")])
        self._wait_for_nginx()

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = (self.folder / f"{name}.out").open("ab")
        self.processes[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL)

    def _wait_for_nginx(self, timeout_s: float = 20) -> None:
        import socket

        deadline = time.monotonic() + timeout_s
        while True:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    log = (self.folder / f"{name}.out").read_text(errors="replace")[-2000:]
                    msg = f"the {self.pop} edge's {name} exited ({process.returncode}): {log}"
                    raise ControlPlaneError(msg)
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.http_port), timeout=1):
                return
            if time.monotonic() > deadline:
                msg = f"the {self.pop} edge's nginx is not serving on {self.http_port}"
                raise ControlPlaneError(msg)
            time.sleep(0.1)

    def load(self, *, seconds: float, connections: int = 2, delay_ms: float = 1.0,
             seed: int = 1) -> subprocess.Popen[bytes]:
        """Start wrk asking this edge for ``seconds`` (each connection waits ``delay_ms``
        between requests: about ``connections * 1000 / delay_ms`` a second at most)."""
        weights = list(DOMAINS.values())
        script = self.folder / "wrk.lua"
        script.write_text(WRK_SCRIPT.format(
            domains=", ".join(f'"{d}"' for d in DOMAINS),
            weights=", ".join(f"{w:.4f}" for w in weights),
            paths=", ".join(f'"{p}"' for p in [*OBJECTS, "/missing"]), seed=seed,
            delay_ms=delay_ms))
        argv = [shutil.which("wrk", path=_path()) or "wrk", "-t1", f"-c{connections}",
                f"-d{max(1, round(seconds))}s", "-s", str(script),
                f"http://127.0.0.1:{self.http_port}/"]
        out = (self.folder / "wrk.out").open("ab")
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)

    def served(self) -> int:
        """How many requests nginx's own log says it served so far."""
        with self.access_log.open("rb") as fh:
            return sum(1 for _ in fh)

    def stop(self) -> None:
        """nginx, then rsyslog (which keeps on disk what the site did not acknowledge)."""
        for name in ("nginx", "rsyslog"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGQUIT if name == "nginx" else signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
