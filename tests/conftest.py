"""Shared fixtures: a CDN log source and helpers that make CDN log records."""

from __future__ import annotations

import os
import sys
from pathlib import Path
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


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local SparkSession for the whole test session (a session takes seconds to start)."""
    from pyspark.sql import SparkSession

    from jetstream.stage.spark import DEFAULT_SPARK_CONF, started

    # A site's own settings, so that the stage is tested as sites run it; a larger heap, as
    # this one session serves every test.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # a map's UDF: this Python
    builder = SparkSession.builder.master("local[2]").appName("jetstream-tests")
    for key, value in {**DEFAULT_SPARK_CONF, "spark.driver.memory": "1g"}.items():
        builder = builder.config(key, value)
    # Launched again if it fails, as a site's is: the tests before have left gRPC threads
    # running, and a JVM forked then can exit before it reports its port.
    session = started(builder, "tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def plan_of(query: str | Path) -> Any:
    """The plan (a QueryPlan message) of a query file's text, or of the file at a path, as
    the CLI sends it to the controller."""
    from jetstream.planwire import query_to_proto
    from jetstream.queryfile import load_query, query_from_source

    loaded = load_query(query) if isinstance(query, Path) else query_from_source(query)
    return query_to_proto(loaded)


def spec_of(source: str) -> bytes:
    """A query file's text as a site is sent it: its serialized plan."""
    return bytes(plan_of(source).SerializeToString(deterministic=True))
