"""A whole topology as processes on this machine: what ``jetstream run`` (and the demo) start.

:class:`LocalCluster` starts a global controller and one ``jetstream site`` process per site
of the topology (each its own Python process and, once it runs a local stage, its own Spark
JVM), waits until every site has registered, and stops them all on the way out, also after an
error; they talk over mutual TLS with a token, from a development CA it makes for them.
:func:`replay` submits a query to such a cluster in replay mode and collects the final
version of every window's result.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from jetstream.aggtree.loader import load_topology
from jetstream.control.client import ControllerClient
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError
from jetstream.results import WindowResult
from jetstream.security import Security, make_dev_certs

__all__ = ["LocalCluster", "free_port", "replay"]

#: How long the start-up of a cluster may go on with no site registering and none starting
#: its Spark JVM; a JVM still starting counts as progress, as long as ``STARTUP_LIMIT_S``.
STARTUP_TIMEOUT_S = 60.0
#: How long the processes of a cluster may take to come up and register, at most.
STARTUP_LIMIT_S = 600.0
#: How long a process may take to stop after SIGTERM (a site stops its Spark streams and JVM).
STOP_TIMEOUT_S = 30.0
#: How long :meth:`LocalCluster.wait_for_stages` waits for the local stages to read.
STAGES_TIMEOUT_S = 180.0

Say = Callable[[str], None]


#: Where :func:`free_port` looks first: below Linux's default ephemeral range (32768-60999),
#: where the kernel hands out the ports other processes bind to 0 for (a site's JVM binds
#: several while it starts), so that a port chosen now is not taken before it is used.
_CHOSEN_PORTS = (20_000, 32_000)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may take it)."""
    for _ in range(50):
        port = random.randint(*_CHOSEN_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # that range is busy: any port the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalCluster:
    """A controller and every site of ``topology`` as local processes.

    ``input_dir`` holds one folder per site (``DIR/<site>/*.csv``); with ``replay`` every
    site processes what its folder holds and then ends. Process output goes to ``logs``.
    ``host`` is where the controller listens; ``site_host`` and ``site_prefix`` give each
    site's listening address and a command prefix to start it with (the emulator puts each
    site in its own network namespace with them); ``site_args`` more flags for a site's
    command. The controller keeps its state in ``logs/controller-state``, so that
    :meth:`restart` of a killed controller takes up its queries again. ``tls_dir`` holds the
    certificates and token every process uses (see :mod:`jetstream.security`); by
    default a development CA is made for the cluster in ``logs/tls``, for those addresses,
    with a certificate per site (``logs/tls/<site>``), one for the controller and one for the
    CLI, whose folder ``tls_dir`` then is.
    ``metrics_port`` gives a process (``"controller"`` or a site's name) the port it serves
    Prometheus metrics on, at its listening address; 0, the default, is none.
    ``dashboard_port``: the controller serves its live dashboard there, at ``host``.
    ``allow_code``: the controller and the sites accept queries whose ``map`` functions
    travel as code (``--allow-code``), as ``jetstream run`` and ``demo`` have it.
    ``read_files``: what a live site does with the files it has read (``jetstream site
    --read-files``); kept by
    default here, where results are checked against ``run_local`` over the inputs after.
    """

    topology: Path
    input_dir: Path | None = None
    replay: bool = False
    window_deadline_s: float | None = None
    idle_timeout_s: float | None = None
    logs: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="jetstream-run-")))
    say: Say = lambda line: None
    host: str = "127.0.0.1"
    site_host: Callable[[str], str] = lambda site: "127.0.0.1"
    site_prefix: Callable[[str], list[str]] = lambda site: []
    site_args: Callable[[str], list[str]] = lambda site: []  # more flags for a site
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    tls_dir: Path | None = None
    metrics_port: Callable[[str], int] = lambda name: 0
    dashboard_port: int = 0
    allow_code: bool = True
    read_files: str = "keep"

    def __post_init__(self) -> None:
        sites = load_topology(self.topology).sites
        self.masters = {s.name: s.master for s in sites}
        # Only a site with a source reads logs: the others (datacenters that merge) get no
        # input folder, and so start no Spark JVM.
        self.readers = {s.name for s in sites if s.sources}
        # Given its master, a site starts Spark before it registers: it needs the
        # topology's settings up front too.
        self.spark_confs = {s.name: s.spark_conf for s in sites}
        self.sites = list(self.masters)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._commands: dict[str, tuple[tuple[str, ...], list[str] | None]] = {}
        self.address = f"{self.host}:{free_port()}"
        self._tls: dict[str, Path] = {}  # each process's TLS folder, when not all share one
        if self.tls_dir is None:
            hosts = sorted({self.host, *(self.site_host(s) for s in self.sites)})
            self._tls = make_dev_certs(self.logs / "tls", hosts, days=7, force=True,
                                       sites=self.sites).folders
            self.tls_dir = self._tls["cli"]
        # The folder's token, not one in the environment: the children use the folder's too.
        self.security = Security.resolve(self.tls_dir, env={})
        self.client = ControllerClient(self.address, security=self.security)

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        port = self.address.rsplit(":", 1)[1]
        self.say(f"starting the controller of {self.topology} and {len(self.sites)} sites "
                 f"(logs in {self.logs})")
        self._spawn("controller", "controller", "--topology", str(self.topology),
                    "--host", self.host, "--port", port, "--heartbeat-interval", "1",
                    "--state-dir", str(self.logs / "controller-state"),
                    *(("--allow-code",) if self.allow_code else ()),
                    *(("--dashboard-port", str(self.dashboard_port), "--dashboard-host",
                       self.host) if self.dashboard_port else ()))
        state = self.logs / "state"
        for site in self.sites:
            args = ["site", "--name", site, "--controller", self.address,
                    "--host", self.site_host(site),
                    "--state-dir", str(state), "--spark-master", self.masters[site],
                    *(f"--spark-conf={key}={value}" for key, value in self.spark_confs[site])]
            if self.input_dir is not None and site in self.readers:
                args += ["--input", str(self.input_dir / site)]
            if self.allow_code:
                args.append("--allow-code")
            if self.replay:
                args.append("--replay")
            else:
                args += ["--read-files", self.read_files]
            if self.window_deadline_s is not None:
                args += ["--window-deadline", str(self.window_deadline_s)]
            if self.idle_timeout_s is not None:
                args += ["--idle-timeout", str(self.idle_timeout_s)]
            self._spawn(site, *args, *self.site_args(site), prefix=self.site_prefix(site))
        self._wait_for_sites()

    def _spawn(self, name: str, *args: str, prefix: list[str] | None = None) -> None:
        self._commands[name] = (args, prefix)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("JETSTREAM_TOKEN", None)
        args = (*args, "--tls-dir", str(self._tls.get(name, self.tls_dir)))
        if port := self.metrics_port(name):
            args = (*args, "--metrics-port", str(port))
        with (self.logs / f"{name}.log").open("ab") as out:  # the child keeps its own handle
            # A session of its own: Ctrl-C in a terminal reaches the process that started
            # the cluster, which stops it in order (see stop), rather than every process at
            # once while its streams run.
            self.processes[name] = subprocess.Popen(
                [*(prefix or []), sys.executable, "-m", "jetstream", *args], stdout=out,
                stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _wait_for_sites(self) -> None:
        """Wait until every site has registered, saying how far they are every 10 s: as long
        as a site registers or a Spark JVM is starting every ``STARTUP_TIMEOUT_S`` (a loaded
        machine starts JVMs slowly), up to ``STARTUP_LIMIT_S`` in all."""
        started = time.monotonic()
        progressed, shown, said = started, "", started
        while True:
            now = time.monotonic()
            if now - progressed > STARTUP_TIMEOUT_S or now - started > STARTUP_LIMIT_S:
                waited = now - started
                msg = (f"the sites did not all register: {shown or 'no answer'} after "
                       f"{waited:.0f}s, with nothing happening for "
                       f"{now - progressed:.0f}s\n{self.tail()}")
                raise ControlPlaneError(msg)
            self.check_alive()
            with contextlib.suppress(ControlPlaneError):
                alive = sorted(s.name for s in self.client.status().sites if s.alive)
                # A site starts its Spark JVM before it registers: the slow part, so say so.
                spark = [s for s in self.sites if s not in alive and "starting Spark" in
                         self.tail(s, lines=50)]
                line = (f"sites up: {len(alive)}/{len(self.sites)} {' '.join(alive)}".rstrip()
                        + (f"; starting Spark: {' '.join(spark)}" if spark else ""))
                if line != shown or spark:
                    progressed = now
                if line != shown or now - said >= 10:
                    self.say(line if line != shown else f"{line} ({now - started:.0f}s)")
                    shown, said = line, now
                if len(alive) == len(self.sites):
                    return
            time.sleep(0.3)

    def wait_for_stages(self, query: str, timeout_s: float = STAGES_TIMEOUT_S) -> float:
        """Wait until ``query`` is deployed at every site that reads logs and no local stage
        of it is starting (Spark starting, or warming up: :mod:`jetstream.stage.warm`), as
        the sites' heartbeats report them; the seconds it took."""
        started = time.monotonic()
        waiting: list[str] = sorted(self.readers)
        while waiting:
            if time.monotonic() - started > timeout_s:
                msg = (f"the local stages of {query} were not all reading within "
                       f"{timeout_s:.0f}s; waiting for {', '.join(waiting)}\n{self.tail()}")
                raise ControlPlaneError(msg)
            self.check_alive()
            with contextlib.suppress(ControlPlaneError):
                placed = {site.name: [p for p in site.placements if p.query == query]
                          for site in self.client.status().sites}
                # Reading once its heartbeat says so: a stage is "" (not reported yet) from
                # the deploy to the site's next heartbeat, then "starting" until it reads.
                waiting = sorted(site for site in self.readers if not placed.get(site) or any(
                    p.piece == "local stage" and p.state != "running" for p in placed[site]))
            time.sleep(0.3)
        return time.monotonic() - started

    def kill(self, name: str) -> None:
        """Kill a process at once (SIGKILL: no clean-up), as a crash would."""
        process = self.processes[name]
        process.kill()
        process.wait()

    def restart(self, name: str) -> None:
        """Start a killed process again, as it was started (its log goes on)."""
        args, prefix = self._commands[name]
        self._spawn(name, *args, prefix=prefix)

    def check_alive(self) -> None:
        """Raise, with its last log lines, if any process has exited."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                msg = f"{name} exited with code {process.returncode}\n{self.tail(name)}"
                raise ControlPlaneError(msg)

    def tail(self, name: str | None = None, lines: int = 15) -> str:
        names = [name] if name else list(self.processes)
        out = []
        for n in names:
            path = self.logs / f"{n}.log"
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            out += [f"--- {path} (last {lines} lines)", *text[-lines:]]
        return "\n".join(out)

    def stop(self) -> None:
        """SIGTERM the sites and wait for them, then the controller; kill what is left
        after ``STOP_TIMEOUT_S``. Sites go first so that each stops its streams while the
        controller still answers, and none logs a lost controller on the way out."""
        sites = [p for name, p in self.processes.items() if name != "controller"]
        controller = [p for name, p in self.processes.items() if name == "controller"]
        for group in (sites, controller):
            for process in group:
                if process.poll() is None:
                    process.terminate()
            for process in group:
                try:
                    process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def replay(cluster: LocalCluster, query: Query | Path, *, timeout_s: float,
           say: Say = lambda line: None) -> list[WindowResult]:
    """Submit ``query`` (or a query file) and wait until every window is final; the last
    revision of each window's result, in window order."""
    response = cluster.client.submit(query)
    say(f"submitted {response.query}; replaying the input through every site")
    latest: dict[tuple[int, int], WindowResult] = {}
    for result in _results(cluster, response.query, timeout_s):
        latest[(result.window_start, result.window_end)] = result
        say(f"window [{result.window_start}, {result.window_end}): {len(result.rows)} rows "
            f"from {result.sites_reporting}/{result.sites_expected} sites"
            + (f" (revision {result.revision})" if result.revision else ""))
    state = next((q for q in cluster.client.status().queries if q.name == response.query),
                 None)
    if state is None or state.state != "finished":
        msg = (f"query {response.query} did not finish within {timeout_s:.0f}s "
               f"({state.state if state else 'gone'})\n{cluster.tail()}")
        raise ControlPlaneError(msg)
    if state.failures:
        failed = "; ".join(f"{site}: {error}" for site, error in sorted(state.failures.items()))
        msg = (f"query {response.query}: the local stage failed at "
               f"{len(state.failures)} site(s), whose records the results lack: {failed}")
        raise ControlPlaneError(msg)
    return [latest[w] for w in sorted(latest)]


def _results(cluster: LocalCluster, query: str, timeout_s: float) -> Iterator[WindowResult]:
    yield from cluster.client.results(query, timeout_s)
    cluster.check_alive()
