"""A Spark session as a site, the lab's baselines and its benchmarks start one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["session_builder"]


def session_builder(master: str, app: str, conf: Mapping[str, str]) -> Any:
    """A ``SparkSession`` builder for ``master`` named ``app``, with the settings ``conf``
    (say ``DEFAULT_SPARK_CONF`` under a site's own); settings of the JVM itself, such as
    ``spark.driver.memory``, count only if it starts the JVM."""
    from pyspark.sql import SparkSession  # Spark loads only where a session is made

    builder = SparkSession.builder.master(master).appName(app)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder
