"""Shared fixtures: a CDN log source and helpers that make CDN log records."""

from __future__ import annotations

from typing import Any

import pytest

import jetstream as js


@pytest.fixture
def logs() -> js.Stream:
    return js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)


def log(ts: int, domain: str = "a.com", **fields: Any) -> dict[str, Any]:
    """A valid CDN log record at ``ts`` (epoch ms); ``fields`` override the defaults."""
    record: dict[str, Any] = {
        "ts": ts, "pop": "ams", "client_ip": "198.51.100.1", "domain": domain,
        "url": f"http://{domain}/index.html", "status": 200, "bytes": 1000,
        "latency_ms": 12.5, "cache": "HIT",
    }
    record.update(fields)
    return record
