"""The exception family: one base class and one subclass per phase."""

from __future__ import annotations

__all__ = [
    "ControlPlaneError",
    "DataError",
    "JetstreamError",
    "PlacementError",
    "PlanError",
    "RewriteError",
]


class JetstreamError(Exception):
    """Base of every error JetStream-py raises on purpose."""


class PlanError(JetstreamError):
    """A query is malformed: raised while it is built, naming the step and the column."""


class RewriteError(JetstreamError):
    """A rewrite rule was asked to do something that would change a query's meaning."""


class PlacementError(JetstreamError):
    """A plan cannot be placed on a topology: a link or a node would be over capacity."""


class ControlPlaneError(JetstreamError):
    """A controller, a site or the CLI could not carry out a control-plane call."""


class DataError(JetstreamError):
    """Input data or user code misbehaved while a query ran."""
