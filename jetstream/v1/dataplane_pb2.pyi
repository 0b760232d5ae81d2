from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SummaryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUMMARY_KIND_UNSPECIFIED: _ClassVar[SummaryKind]
    SUMMARY_KIND_ROWS: _ClassVar[SummaryKind]
    SUMMARY_KIND_TRUNCATED_TOP: _ClassVar[SummaryKind]
    SUMMARY_KIND_FREQUENT_ITEMS: _ClassVar[SummaryKind]
    SUMMARY_KIND_HLL: _ClassVar[SummaryKind]
    SUMMARY_KIND_KLL: _ClassVar[SummaryKind]
SUMMARY_KIND_UNSPECIFIED: SummaryKind
SUMMARY_KIND_ROWS: SummaryKind
SUMMARY_KIND_TRUNCATED_TOP: SummaryKind
SUMMARY_KIND_FREQUENT_ITEMS: SummaryKind
SUMMARY_KIND_HLL: SummaryKind
SUMMARY_KIND_KLL: SummaryKind

class RoundsRequest(_message.Message):
    __slots__ = ("query", "origin")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    query: str
    origin: str
    def __init__(self, query: _Optional[str] = ..., origin: _Optional[str] = ...) -> None: ...

class RoundAsk(_message.Message):
    __slots__ = ("window_start_ms", "window_end_ms", "top", "by_threshold", "threshold", "keys")
    WINDOW_START_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_MS_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    BY_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    window_start_ms: int
    window_end_ms: int
    top: int
    by_threshold: bool
    threshold: float
    keys: str
    def __init__(self, window_start_ms: _Optional[int] = ..., window_end_ms: _Optional[int] = ..., top: _Optional[int] = ..., by_threshold: _Optional[bool] = ..., threshold: _Optional[float] = ..., keys: _Optional[str] = ...) -> None: ...

class RoutesRequest(_message.Message):
    __slots__ = ("query",)
    QUERY_FIELD_NUMBER: _ClassVar[int]
    query: str
    def __init__(self, query: _Optional[str] = ...) -> None: ...

class RoutesResponse(_message.Message):
    __slots__ = ("workers", "epochs")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedScalarFieldContainer[str]
    epochs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, workers: _Optional[_Iterable[str]] = ..., epochs: _Optional[_Iterable[str]] = ...) -> None: ...

class PushMessage(_message.Message):
    __slots__ = ("batch", "progress", "part")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    batch: PartialBatch
    progress: Progress
    part: Part
    def __init__(self, batch: _Optional[_Union[PartialBatch, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., part: _Optional[_Union[Part, _Mapping]] = ...) -> None: ...

class Part(_message.Message):
    __slots__ = ("data", "last")
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    last: bool
    def __init__(self, data: _Optional[bytes] = ..., last: _Optional[bool] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("query", "origin", "watermark_ms", "ended", "sequence", "received_bytes", "received_ms")
    class ReceivedBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    QUERY_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_MS_FIELD_NUMBER: _ClassVar[int]
    query: str
    origin: str
    watermark_ms: int
    ended: bool
    sequence: int
    received_bytes: _containers.ScalarMap[str, int]
    received_ms: int
    def __init__(self, query: _Optional[str] = ..., origin: _Optional[str] = ..., watermark_ms: _Optional[int] = ..., ended: _Optional[bool] = ..., sequence: _Optional[int] = ..., received_bytes: _Optional[_Mapping[str, int]] = ..., received_ms: _Optional[int] = ...) -> None: ...

class PartialBatch(_message.Message):
    __slots__ = ("query", "window_start_ms", "window_end_ms", "origin", "partition", "attempt", "sequence", "kind", "level", "payload", "compressed", "events", "error_bound", "complete", "covers", "wan_bytes", "closed_at_ms", "revision", "ranked_by", "items_extra", "warnings", "rounds", "early")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_MS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_BOUND_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    COVERS_FIELD_NUMBER: _ClassVar[int]
    WAN_BYTES_FIELD_NUMBER: _ClassVar[int]
    CLOSED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RANKED_BY_FIELD_NUMBER: _ClassVar[int]
    ITEMS_EXTRA_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    EARLY_FIELD_NUMBER: _ClassVar[int]
    query: str
    window_start_ms: int
    window_end_ms: int
    origin: str
    partition: int
    attempt: int
    sequence: int
    kind: SummaryKind
    level: int
    payload: bytes
    compressed: bool
    events: int
    error_bound: float
    complete: bool
    covers: _containers.RepeatedScalarFieldContainer[str]
    wan_bytes: int
    closed_at_ms: int
    revision: int
    ranked_by: str
    items_extra: float
    warnings: _containers.RepeatedScalarFieldContainer[str]
    rounds: bool
    early: bool
    def __init__(self, query: _Optional[str] = ..., window_start_ms: _Optional[int] = ..., window_end_ms: _Optional[int] = ..., origin: _Optional[str] = ..., partition: _Optional[int] = ..., attempt: _Optional[int] = ..., sequence: _Optional[int] = ..., kind: _Optional[_Union[SummaryKind, str]] = ..., level: _Optional[int] = ..., payload: _Optional[bytes] = ..., compressed: _Optional[bool] = ..., events: _Optional[int] = ..., error_bound: _Optional[float] = ..., complete: _Optional[bool] = ..., covers: _Optional[_Iterable[str]] = ..., wan_bytes: _Optional[int] = ..., closed_at_ms: _Optional[int] = ..., revision: _Optional[int] = ..., ranked_by: _Optional[str] = ..., items_extra: _Optional[float] = ..., warnings: _Optional[_Iterable[str]] = ..., rounds: _Optional[bool] = ..., early: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("query", "window_start_ms", "origin", "partition", "sequence", "revision", "progress", "part", "held_s")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_MS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    HELD_S_FIELD_NUMBER: _ClassVar[int]
    query: str
    window_start_ms: int
    origin: str
    partition: int
    sequence: int
    revision: int
    progress: bool
    part: bool
    held_s: float
    def __init__(self, query: _Optional[str] = ..., window_start_ms: _Optional[int] = ..., origin: _Optional[str] = ..., partition: _Optional[int] = ..., sequence: _Optional[int] = ..., revision: _Optional[int] = ..., progress: _Optional[bool] = ..., part: _Optional[bool] = ..., held_s: _Optional[float] = ...) -> None: ...
