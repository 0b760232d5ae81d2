"""Timings of each step along a window's path, to find where its latency goes.

With ``JETSTREAM_TRACE=1`` in their environment (processes a cluster starts inherit it), the
sites and workers log a line at each step a window passes, to the logger ``jetstream.trace``
at level DEBUG, each with the wall-clock time ``t``:

- ``batch``: a local stage's micro-batch: when our ``foreachBatch`` began (``start``), when
  its Spark job's rows were back (``collected``), the windows it handed on as closed
  (``closed``, their ends) at ``t``, and when its earliest file landed (``arrived``, ms);
- ``receive``: a run took a window's batch from an input (``origin``);
- ``progress``: a run heard how far an input has got (``watermark``, ms);
- ``send`` and ``publish``: a run sent a merged window to its parent, or the root published it.

``scripts/trace_windows.py`` turns a cluster's logs into each window's steps, measured from
the moment it could close. Off by default: a live site would log several lines a second.
"""

from __future__ import annotations

import logging
import os
import time

__all__ = ["ENV", "enable_from_env", "mark"]

#: The environment variable that turns tracing on ("1"; unset, empty or "0": off).
ENV = "JETSTREAM_TRACE"

log = logging.getLogger("jetstream.trace")


def enable_from_env() -> bool:
    """Turn tracing on if the environment asks for it; whether it is on."""
    if os.environ.get(ENV, "") not in ("", "0"):
        log.setLevel(logging.DEBUG)
    return log.isEnabledFor(logging.DEBUG)


def mark(step: str, **fields: object) -> None:
    """Log that ``step`` happened now, with ``fields`` (when tracing is on)."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s t=%.3f %s", step, time.time(),
                  " ".join(f"{key}={value}" for key, value in fields.items()))
