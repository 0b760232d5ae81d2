"""Conversions between core objects and their ``jetstream.v1`` protobuf messages."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from jetstream.dsl import SLO
from jetstream.errors import DataError
from jetstream.results import WindowResult
from jetstream.v1 import query_pb2 as pb

__all__ = ["record_from_proto", "record_to_proto", "result_from_proto", "result_to_proto",
           "slo_to_proto"]


def _value_to_proto(value: Any) -> pb.Value:
    if isinstance(value, bool):
        return pb.Value(bool_value=value)
    if isinstance(value, int):
        return pb.Value(int_value=value)
    if isinstance(value, float):
        return pb.Value(float_value=value)
    if isinstance(value, str):
        return pb.Value(string_value=value)
    if isinstance(value, list):
        return pb.Value(list_value=pb.RecordList(records=[record_to_proto(r) for r in value]))
    msg = f"cannot encode {value!r} ({type(value).__name__}) as a jetstream.v1.Value"
    raise DataError(msg)


def _value_from_proto(value: pb.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "list_value":
        return [record_from_proto(r) for r in value.list_value.records]
    return getattr(value, kind)


def record_to_proto(record: Mapping[str, Any]) -> pb.Record:
    """A record as a message; NULL columns are left out."""
    return pb.Record(fields={k: _value_to_proto(v) for k, v in record.items() if v is not None})


def record_from_proto(record: pb.Record, columns: tuple[str, ...] = ()) -> dict[str, Any]:
    """A record from a message; ``columns`` that are absent come back as None."""
    out = {c: None for c in columns}
    out.update({k: _value_from_proto(v) for k, v in record.fields.items()})
    return out


def result_to_proto(result: WindowResult) -> pb.WindowResult:
    msg = pb.WindowResult(query=result.query, window_start_ms=result.window_start,
                          window_end_ms=result.window_end, exact=result.exact,
                          rows=[record_to_proto(r) for r in result.rows],
                          sites_reporting=result.sites_reporting or 0,
                          sites_expected=result.sites_expected or 0,
                          latency_s=result.latency_s or 0.0, wan_bytes=result.wan_bytes or 0,
                          revision=result.revision, warnings=result.warnings,
                          missing_sites=result.missing_sites, history=result.history,
                          columns=list(dict.fromkeys(c for row in result.rows for c in row)))
    if result.error_bound is not None:
        msg.error_bound = result.error_bound
    return msg


def result_from_proto(msg: pb.WindowResult) -> WindowResult:
    """The result in ``msg``; raises DataError if it cannot be one (see ``_check_result``)."""
    _check_result(msg)
    return WindowResult(query=msg.query, window_start=msg.window_start_ms,
                        window_end=msg.window_end_ms,
                        rows=[record_from_proto(r, tuple(msg.columns)) for r in msg.rows],
                        exact=msg.exact,
                        error_bound=msg.error_bound if msg.HasField("error_bound") else None,
                        sites_reporting=msg.sites_reporting if msg.sites_expected else None,
                        sites_expected=msg.sites_expected or None,
                        latency_s=msg.latency_s if msg.sites_expected else None,
                        wan_bytes=msg.wan_bytes if msg.sites_expected else None,
                        revision=msg.revision, warnings=list(msg.warnings),
                        missing_sites=list(msg.missing_sites), history=msg.history)


def _check_result(msg: pb.WindowResult) -> None:
    """Refuse an empty window, a NaN or negative error bound, negative counts, or a latency
    that is not finite (it may be negative: site clocks differ)."""
    checks = (
        (f"window [{msg.window_start_ms}, {msg.window_end_ms}) is empty",
         msg.window_end_ms <= msg.window_start_ms),
        (f"error_bound {msg.error_bound!r} is not a finite non-negative number",
         msg.HasField("error_bound") and not 0 <= msg.error_bound < math.inf),
        ("sites_reporting, sites_expected, wan_bytes and revision cannot be negative",
         min(msg.sites_reporting, msg.sites_expected, msg.wan_bytes, msg.revision) < 0),
        (f"latency_s {msg.latency_s!r} is not finite", not math.isfinite(msg.latency_s)))
    for problem, bad in checks:
        if bad:
            text = f"window result of {msg.query or '?'} at {msg.window_start_ms}: {problem}"
            raise DataError(text)


def slo_to_proto(slo: SLO) -> pb.SLO:
    msg = pb.SLO()
    if slo.max_latency_ms is not None:
        msg.max_latency_ms = slo.max_latency_ms
    if slo.max_error is not None:
        msg.max_error = slo.max_error
    if slo.max_wan_kbps is not None:
        msg.max_wan_kbps = slo.max_wan_kbps
    return msg
