"""A site's workers: one process per server its site controller places key partitions on.

When the plan spreads a site's merge (or the root's final step) over key partitions, the site
controller (:class:`~jetstream.control.site_controller.SiteController`) runs each partition
on a worker of its own server: a ``jetstream worker`` process with a data plane and a site
controller service of its own, which registers with its site (``RegisterWorker``: its server,
address and pid) and then takes the partition's fragment like any site would
(``DeployFragment``). The site's process routes its inputs to the workers
(:mod:`jetstream.dataplane.router`) and merges what they send back.

:class:`WorkerPool` starts the workers as child processes of the site's, watches them, and
starts a dead one again (with a higher ``--epoch``, so that what it sends replaces what the
dead one sent); when it registers, the site controller deploys its partitions to it again
and the router sends it everything the partitions need. A worker ends when its site's
process does. Workers on other machines, started there by hand, are not supported yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from jetstream.aggtree.topology import Server
from jetstream.errors import ControlPlaneError
from jetstream.security import Security

__all__ = ["REGISTER_TIMEOUT_S", "WorkerPool", "WorkerState"]

log = logging.getLogger(__name__)

#: How long a deploy waits for a worker to start and register before it fails (the
#: controller deploys again later; the worker goes on starting); under DEPLOY_TIMEOUT_S.
REGISTER_TIMEOUT_S = 25.0
#: How often the pool looks for workers that died, and a worker for a parent that died.
WATCH_S = 0.5


@dataclass
class WorkerState:
    """One server's worker, as its site sees it."""

    server: str
    address: str = ""
    pid: int = 0
    process: subprocess.Popen[bytes] | None = None  # None: started by hand elsewhere
    restarts: int = 0
    registered: threading.Event = field(default_factory=threading.Event)

    @property
    def state(self) -> str:
        if self.registered.is_set():
            return "running"
        return "restarting" if self.restarts else "starting"


class WorkerPool:
    """The workers of one site: started on demand, one per server, and kept running.

    ``register_at`` is the site's own gRPC address, where a worker registers;
    ``on_restart(server)`` is called (on a thread of its own) when a worker that had
    registered before registers again, at its new address.
    """

    def __init__(self, site: str, servers: list[Server], register_at: str, *,
                 security: Security, host: str = "127.0.0.1", deadline_s: float | None = None,
                 allow_code: bool = False,
                 on_restart: Callable[[str], None] = lambda server: None) -> None:
        self.site, self.register_at, self.host = site, register_at, host
        self.deadline_s = deadline_s  # the site's --window-deadline, for its workers too
        self.allow_code = allow_code  # and its --allow-code
        self._servers = {s.name for s in servers}
        self._security, self.on_restart = security, on_restart
        self._lock = threading.Lock()
        self._workers: dict[str, WorkerState] = {}
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="workers", daemon=True).start()

    def warm_up(self) -> None:
        """Start every server's worker now, so that the first partitioned deploy finds them
        up (a Python process takes a second or two to start on a busy machine)."""
        with self._lock:
            for server in sorted(self._servers - self._workers.keys()):
                self._start(self._workers.setdefault(server, WorkerState(server)))

    def address(self, server: str, timeout_s: float = REGISTER_TIMEOUT_S) -> str:
        """The address of ``server``'s worker, started (and waited for) if need be."""
        with self._lock:
            worker = self._workers.get(server)
            if worker is None:
                worker = self._workers[server] = WorkerState(server)
                self._start(worker)
        if not worker.registered.wait(timeout_s):
            msg = (f"site {self.site}: the worker of server {server} did not register within "
                   f"{timeout_s:.0f}s (see the site's log)")
            raise ControlPlaneError(msg)
        return worker.address

    def register(self, server: str, address: str, pid: int) -> None:
        """A worker says where it listens."""
        if server not in self._servers:
            msg = f"site {self.site} has no server {server!r} (it has {sorted(self._servers)})"
            raise ControlPlaneError(msg)
        with self._lock:
            worker = self._workers.setdefault(server, WorkerState(server))
            again = bool(worker.address) and worker.address != address
            worker.address, worker.pid = address, pid
            worker.registered.set()
        log.info("site %s: worker of %s registered at %s (pid %d)", self.site, server,
                 address, pid)
        if again:
            threading.Thread(target=self.on_restart, args=(server,),
                             name=f"worker-{server}-again", daemon=True).start()

    def states(self) -> dict[str, WorkerState]:
        with self._lock:
            return dict(self._workers)

    def channel(self, address: str) -> grpc.Channel:
        return self._security.channel(address)

    def close(self) -> None:
        """Stop every worker this pool started."""
        self._closed.set()
        with self._lock:
            processes = [w.process for w in self._workers.values() if w.process is not None]
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _start(self, worker: WorkerState) -> None:
        command = [sys.executable, "-m", "jetstream", "worker", "--site", self.site,
                   "--server", worker.server, "--register", self.register_at,
                   "--host", self.host, "--parent-pid", str(os.getpid()),
                   "--epoch", str(worker.restarts)]
        if self.deadline_s is not None:
            command += ["--window-deadline", str(self.deadline_s)]
        if self.allow_code:
            command.append("--allow-code")
        env = dict(os.environ)
        if self._security.insecure:
            command.append("--insecure")
        else:
            command += ["--tls-dir", str(self._security.tls_dir)]
            if self._security.token:  # in the environment, not on a command line `ps` shows
                env["JETSTREAM_TOKEN"] = self._security.token
        worker.registered.clear()
        # A session of its own: a Ctrl-C at the site's terminal reaches the site, which stops
        # its workers itself, rather than killing them under it (and being restarted).
        worker.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        worker.pid = worker.process.pid
        log.info("site %s: started the worker of %s (pid %d)", self.site, worker.server,
                 worker.pid)

    def _watch(self) -> None:
        while not self._closed.wait(WATCH_S):
            with self._lock:
                for worker in self._workers.values():
                    code = None if worker.process is None else worker.process.poll()
                    if code is None or self._closed.is_set():
                        continue
                    log.warning("site %s: the worker of %s (pid %d) exited with %s; starting "
                                "it again", self.site, worker.server, worker.pid, code)
                    worker.restarts += 1
                    self._start(worker)
