"""How the global controller reaches the sites: how often each sends heartbeats on its link,
and the calls to a site, made one at a time on a thread of its own (:class:`SiteCalls`)."""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

from jetstream.aggtree.topology import Topology
from jetstream.errors import ControlPlaneError

__all__ = ["BEATS_PER_TIMEOUT", "HEARTBEAT_SHARE", "HEARTBEAT_WIRE_BYTES",
           "MAX_HEARTBEAT_SPACING_S", "SiteCalls", "beat_spacing", "call_now",
           "heartbeat_spacing"]

log = logging.getLogger(__name__)


#: What a heartbeat and its answer put on a link, both ways, with their TLS, HTTP/2 and
#: TCP/IP framing and the TCP acks (about 600 B, measured on a 4 kbit/s emulated link).
HEARTBEAT_WIRE_BYTES = 600


#: The share of a site's link its heartbeats may take (its fastest: the controller is
#: reached by the best way out). Each one holds up what the link carries behind it: a
#: window's last partial or progress report that meets one waits for it.
HEARTBEAT_SHARE = 0.05


#: The longest a site waits between heartbeats, however thin its link is measured.
MAX_HEARTBEAT_SPACING_S = 30.0


#: A site is taken for dead once it has been silent for this many of its heartbeat intervals,
#: where its interval was stretched for a thin link (else after the controller's timeout).
BEATS_PER_TIMEOUT = 3


def beat_spacing(link_bps: float | None) -> float:
    """The least time between two heartbeats for them to take no more than
    :data:`HEARTBEAT_SHARE` of a link of ``link_bps`` (0 for None: no link known), at most
    :data:`MAX_HEARTBEAT_SPACING_S`."""
    if not link_bps or link_bps <= 0:
        return 0.0
    return min(HEARTBEAT_WIRE_BYTES * 8 / (HEARTBEAT_SHARE * link_bps), MAX_HEARTBEAT_SPACING_S)


def heartbeat_spacing(topology: Topology, site: str) -> float:
    """:func:`beat_spacing` for the fastest of ``site``'s links as configured: a site whose
    every link is thin beats less often. (A site stretches it further where its senders
    measure its links thinner, and says so in each heartbeat.)"""
    return beat_spacing(max((link.bandwidth_bps for link in topology.links
                             if site in link.ends), default=None))


T = TypeVar("T")


def call_now(site: str, call: Callable[[], None]) -> None:
    """Make a call to ``site`` at once, on the caller's thread."""
    call()


class SiteCalls:
    """Makes the global controller's calls to each site controller on a thread of that
    site's, in the order they were asked for, so that no call holds the controller's lock:
    one that waits out its deadline on a site that does not answer delays neither the
    heartbeats nor the calls to other sites."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, queue.SimpleQueue[Callable[[], None] | None]] = {}

    def __call__(self, site: str, call: Callable[[], None]) -> None:
        with self._lock:
            calls = self._queues.get(site)
            if calls is None:
                calls = self._queues[site] = queue.SimpleQueue()
                threading.Thread(target=self._run, args=(site, calls), daemon=True,
                                 name=f"calls-to-{site}").start()
        calls.put(call)

    def wait(self, site: str, call: Callable[[], T], timeout_s: float) -> T:
        """Make ``call`` on the site's thread, after the calls already asked for (a deploy
        under way lands first), and return what it returns or raise what it raises.

        Raises
        ------
        ControlPlaneError
            If it has not been made within ``timeout_s``.
        """
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(call())
            except BaseException as e:
                future.set_exception(e)

        self(site, run)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            msg = f"site {site}: the calls before this one took over {timeout_s:g}s"
            raise ControlPlaneError(msg) from None

    def close(self) -> None:
        """Let each site's thread end once the calls already asked for are made."""
        with self._lock:
            for calls in self._queues.values():
                calls.put(None)
            self._queues.clear()

    @staticmethod
    def _run(site: str, calls: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while (call := calls.get()) is not None:
            try:
                call()
            except Exception:  # one failed call must not stop the site's later ones
                log.exception("a call to site %s failed", site)
