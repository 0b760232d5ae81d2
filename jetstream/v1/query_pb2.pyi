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
    __slots__ = ("name", "slo", "plan")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    name: str
    slo: SLO
    plan: QueryPlan
    def __init__(self, name: _Optional[str] = ..., slo: _Optional[_Union[SLO, _Mapping]] = ..., plan: _Optional[_Union[QueryPlan, _Mapping]] = ...) -> None: ...

class QueryPlan(_message.Message):
    __slots__ = ("version", "name", "slo", "steps", "tables")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    version: int
    name: str
    slo: SLO
    steps: _containers.RepeatedCompositeFieldContainer[PlanStep]
    tables: _containers.RepeatedCompositeFieldContainer[Table]
    def __init__(self, version: _Optional[int] = ..., name: _Optional[str] = ..., slo: _Optional[_Union[SLO, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[PlanStep, _Mapping]]] = ..., tables: _Optional[_Iterable[_Union[Table, _Mapping]]] = ...) -> None: ...

class PlanStep(_message.Message):
    __slots__ = ("inputs", "source", "where", "with_column", "select", "map", "union", "window", "aggregate", "top_k", "join")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    WITH_COLUMN_FIELD_NUMBER: _ClassVar[int]
    SELECT_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    UNION_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[int]
    source: SourceStep
    where: Expr
    with_column: NamedExpr
    select: SelectStep
    map: MapStep
    union: UnionStep
    window: WindowStep
    aggregate: AggregateStep
    top_k: TopKStep
    join: JoinStep
    def __init__(self, inputs: _Optional[_Iterable[int]] = ..., source: _Optional[_Union[SourceStep, _Mapping]] = ..., where: _Optional[_Union[Expr, _Mapping]] = ..., with_column: _Optional[_Union[NamedExpr, _Mapping]] = ..., select: _Optional[_Union[SelectStep, _Mapping]] = ..., map: _Optional[_Union[MapStep, _Mapping]] = ..., union: _Optional[_Union[UnionStep, _Mapping]] = ..., window: _Optional[_Union[WindowStep, _Mapping]] = ..., aggregate: _Optional[_Union[AggregateStep, _Mapping]] = ..., top_k: _Optional[_Union[TopKStep, _Mapping]] = ..., join: _Optional[_Union[JoinStep, _Mapping]] = ...) -> None: ...

class SchemaSpec(_message.Message):
    __slots__ = ("fields", "event_time")
    class Field(_message.Message):
        __slots__ = ("name", "type")
        NAME_FIELD_NUMBER: _ClassVar[int]
        TYPE_FIELD_NUMBER: _ClassVar[int]
        name: str
        type: str
        def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.RepeatedCompositeFieldContainer[SchemaSpec.Field]
    event_time: str
    def __init__(self, fields: _Optional[_Iterable[_Union[SchemaSpec.Field, _Mapping]]] = ..., event_time: _Optional[str] = ...) -> None: ...

class SourceStep(_message.Message):
    __slots__ = ("name", "schema", "format")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    name: str
    schema: SchemaSpec
    format: str
    def __init__(self, name: _Optional[str] = ..., schema: _Optional[_Union[SchemaSpec, _Mapping]] = ..., format: _Optional[str] = ...) -> None: ...

class NamedExpr(_message.Message):
    __slots__ = ("name", "expr")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXPR_FIELD_NUMBER: _ClassVar[int]
    name: str
    expr: Expr
    def __init__(self, name: _Optional[str] = ..., expr: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class SelectStep(_message.Message):
    __slots__ = ("columns",)
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedCompositeFieldContainer[NamedExpr]
    def __init__(self, columns: _Optional[_Iterable[_Union[NamedExpr, _Mapping]]] = ...) -> None: ...

class MapStep(_message.Message):
    __slots__ = ("label", "pickled", "schema", "monotonic", "has_changes", "changes")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    PICKLED_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    MONOTONIC_FIELD_NUMBER: _ClassVar[int]
    HAS_CHANGES_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    label: str
    pickled: bytes
    schema: SchemaSpec
    monotonic: bool
    has_changes: bool
    changes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, label: _Optional[str] = ..., pickled: _Optional[bytes] = ..., schema: _Optional[_Union[SchemaSpec, _Mapping]] = ..., monotonic: _Optional[bool] = ..., has_changes: _Optional[bool] = ..., changes: _Optional[_Iterable[str]] = ...) -> None: ...

class UnionStep(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WindowStep(_message.Message):
    __slots__ = ("size_ms", "every_ms", "watermark_ms", "early_ms")
    SIZE_MS_FIELD_NUMBER: _ClassVar[int]
    EVERY_MS_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    EARLY_MS_FIELD_NUMBER: _ClassVar[int]
    size_ms: int
    every_ms: int
    watermark_ms: int
    early_ms: int
    def __init__(self, size_ms: _Optional[int] = ..., every_ms: _Optional[int] = ..., watermark_ms: _Optional[int] = ..., early_ms: _Optional[int] = ...) -> None: ...

class AggregateSpec(_message.Message):
    __slots__ = ("output", "function", "input", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    output: str
    function: str
    input: Expr
    params: _containers.MessageMap[str, Value]
    def __init__(self, output: _Optional[str] = ..., function: _Optional[str] = ..., input: _Optional[_Union[Expr, _Mapping]] = ..., params: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class AggregateStep(_message.Message):
    __slots__ = ("keys", "aggregates", "rollup")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    AGGREGATES_FIELD_NUMBER: _ClassVar[int]
    ROLLUP_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    aggregates: _containers.RepeatedCompositeFieldContainer[AggregateSpec]
    rollup: _containers.RepeatedCompositeFieldContainer[NamedExpr]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., aggregates: _Optional[_Iterable[_Union[AggregateSpec, _Mapping]]] = ..., rollup: _Optional[_Iterable[_Union[NamedExpr, _Mapping]]] = ...) -> None: ...

class TopKStep(_message.Message):
    __slots__ = ("k", "by")
    K_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    k: int
    by: str
    def __init__(self, k: _Optional[int] = ..., by: _Optional[str] = ...) -> None: ...

class JoinStep(_message.Message):
    __slots__ = ("table", "on", "how")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ON_FIELD_NUMBER: _ClassVar[int]
    HOW_FIELD_NUMBER: _ClassVar[int]
    table: str
    on: str
    how: str
    def __init__(self, table: _Optional[str] = ..., on: _Optional[str] = ..., how: _Optional[str] = ...) -> None: ...

class Table(_message.Message):
    __slots__ = ("name", "schema", "origin", "rows")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    name: str
    schema: SchemaSpec
    origin: str
    rows: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, name: _Optional[str] = ..., schema: _Optional[_Union[SchemaSpec, _Mapping]] = ..., origin: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class Expr(_message.Message):
    __slots__ = ("col", "lit", "arith", "minus", "compare", "conjunction", "disjunction", "negation", "isin", "call")
    COL_FIELD_NUMBER: _ClassVar[int]
    LIT_FIELD_NUMBER: _ClassVar[int]
    ARITH_FIELD_NUMBER: _ClassVar[int]
    MINUS_FIELD_NUMBER: _ClassVar[int]
    COMPARE_FIELD_NUMBER: _ClassVar[int]
    CONJUNCTION_FIELD_NUMBER: _ClassVar[int]
    DISJUNCTION_FIELD_NUMBER: _ClassVar[int]
    NEGATION_FIELD_NUMBER: _ClassVar[int]
    ISIN_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    col: str
    lit: Value
    arith: BinaryExpr
    minus: Expr
    compare: BinaryExpr
    conjunction: BinaryExpr
    disjunction: BinaryExpr
    negation: Expr
    isin: IsInExpr
    call: CallExpr
    def __init__(self, col: _Optional[str] = ..., lit: _Optional[_Union[Value, _Mapping]] = ..., arith: _Optional[_Union[BinaryExpr, _Mapping]] = ..., minus: _Optional[_Union[Expr, _Mapping]] = ..., compare: _Optional[_Union[BinaryExpr, _Mapping]] = ..., conjunction: _Optional[_Union[BinaryExpr, _Mapping]] = ..., disjunction: _Optional[_Union[BinaryExpr, _Mapping]] = ..., negation: _Optional[_Union[Expr, _Mapping]] = ..., isin: _Optional[_Union[IsInExpr, _Mapping]] = ..., call: _Optional[_Union[CallExpr, _Mapping]] = ...) -> None: ...

class BinaryExpr(_message.Message):
    __slots__ = ("op", "left", "right")
    OP_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    RIGHT_FIELD_NUMBER: _ClassVar[int]
    op: str
    left: Expr
    right: Expr
    def __init__(self, op: _Optional[str] = ..., left: _Optional[_Union[Expr, _Mapping]] = ..., right: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class IsInExpr(_message.Message):
    __slots__ = ("operand", "values")
    OPERAND_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    operand: Expr
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, operand: _Optional[_Union[Expr, _Mapping]] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class CallExpr(_message.Message):
    __slots__ = ("fn", "operand")
    FN_FIELD_NUMBER: _ClassVar[int]
    OPERAND_FIELD_NUMBER: _ClassVar[int]
    fn: str
    operand: Expr
    def __init__(self, fn: _Optional[str] = ..., operand: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class WindowResult(_message.Message):
    __slots__ = ("query", "window_start_ms", "window_end_ms", "rows", "exact", "error_bound", "sites_reporting", "sites_expected", "latency_s", "wan_bytes", "revision", "warnings", "columns", "missing_sites", "history", "rolled_up", "final", "provisional")
    class RolledUpEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
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
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    ROLLED_UP_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    PROVISIONAL_FIELD_NUMBER: _ClassVar[int]
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
    history: bool
    rolled_up: _containers.ScalarMap[str, str]
    final: bool
    provisional: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, query: _Optional[str] = ..., window_start_ms: _Optional[int] = ..., window_end_ms: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., exact: _Optional[bool] = ..., error_bound: _Optional[float] = ..., sites_reporting: _Optional[int] = ..., sites_expected: _Optional[int] = ..., latency_s: _Optional[float] = ..., wan_bytes: _Optional[int] = ..., revision: _Optional[int] = ..., warnings: _Optional[_Iterable[str]] = ..., columns: _Optional[_Iterable[str]] = ..., missing_sites: _Optional[_Iterable[str]] = ..., history: _Optional[bool] = ..., rolled_up: _Optional[_Mapping[str, str]] = ..., final: _Optional[bool] = ..., provisional: _Optional[_Iterable[str]] = ...) -> None: ...
