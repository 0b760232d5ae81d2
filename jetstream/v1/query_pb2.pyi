from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Value(_message.Message):
    __slots__ = ("string_value", "int_value", "float_value", "bool_value", "list_value")
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    int_value: int
    float_value: float
    bool_value: bool
    list_value: RecordList
    def __init__(self, string_value: _Optional[str] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., bool_value: _Optional[bool] = ..., list_value: _Optional[_Union[RecordList, _Mapping]] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("fields",)
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.MessageMap[str, Value]
    def __init__(self, fields: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class RecordList(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class SLO(_message.Message):
    __slots__ = ("max_latency_ms", "max_error", "max_wan_kbps")
    MAX_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_WAN_KBPS_FIELD_NUMBER: _ClassVar[int]
    max_latency_ms: int
    max_error: float
    max_wan_kbps: float
    def __init__(self, max_latency_ms: _Optional[int] = ..., max_error: _Optional[float] = ..., max_wan_kbps: _Optional[float] = ...) -> None: ...

class QuerySpec(_message.Message):
    __slots__ = ("name", "python_source", "slo")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PYTHON_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    name: str
    python_source: str
    slo: SLO
    def __init__(self, name: _Optional[str] = ..., python_source: _Optional[str] = ..., slo: _Optional[_Union[SLO, _Mapping]] = ...) -> None: ...

class WindowResult(_message.Message):
    __slots__ = ("query", "window_start_ms", "window_end_ms", "rows", "exact", "error_bound", "sites_reporting", "sites_expected", "latency_s", "wan_bytes", "revision", "warnings", "columns", "missing_sites")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_MS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    ERROR_BOUND_FIELD_NUMBER: _ClassVar[int]
    SITES_REPORTING_FIELD_NUMBER: _ClassVar[int]
    SITES_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    WAN_BYTES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    MISSING_SITES_FIELD_NUMBER: _ClassVar[int]
    query: str
    window_start_ms: int
    window_end_ms: int
    rows: _containers.RepeatedCompositeFieldContainer[Record]
    exact: bool
    error_bound: float
    sites_reporting: int
    sites_expected: int
    latency_s: float
    wan_bytes: int
    revision: int
    warnings: _containers.RepeatedScalarFieldContainer[str]
    columns: _containers.RepeatedScalarFieldContainer[str]
    missing_sites: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, query: _Optional[str] = ..., window_start_ms: _Optional[int] = ..., window_end_ms: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., exact: _Optional[bool] = ..., error_bound: _Optional[float] = ..., sites_reporting: _Optional[int] = ..., sites_expected: _Optional[int] = ..., latency_s: _Optional[float] = ..., wan_bytes: _Optional[int] = ..., revision: _Optional[int] = ..., warnings: _Optional[_Iterable[str]] = ..., columns: _Optional[_Iterable[str]] = ..., missing_sites: _Optional[_Iterable[str]] = ...) -> None: ...
