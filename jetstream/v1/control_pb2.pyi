from jetstream.v1 import dataplane_pb2 as _dataplane_pb2
from jetstream.v1 import query_pb2 as _query_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitQueryRequest(_message.Message):
    __slots__ = ("query", "since_ms")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    query: _query_pb2.QuerySpec
    since_ms: int
    def __init__(self, query: _Optional[_Union[_query_pb2.QuerySpec, _Mapping]] = ..., since_ms: _Optional[int] = ...) -> None: ...

class SubmitQueryResponse(_message.Message):
    __slots__ = ("query", "plan", "backfill")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    BACKFILL_FIELD_NUMBER: _ClassVar[int]
    query: str
    plan: str
    backfill: str
    def __init__(self, query: _Optional[str] = ..., plan: _Optional[str] = ..., backfill: _Optional[str] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("query",)
    QUERY_FIELD_NUMBER: _ClassVar[int]
    query: _query_pb2.QuerySpec
    def __init__(self, query: _Optional[_Union[_query_pb2.QuerySpec, _Mapping]] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SiteStatus(_message.Message):
    __slots__ = ("name", "kind", "address", "alive", "seconds_since_heartbeat", "placements", "links", "behind")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    address: str
    alive: bool
    seconds_since_heartbeat: float
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    links: _containers.RepeatedCompositeFieldContainer[LinkReport]
    behind: _containers.RepeatedCompositeFieldContainer[InputLag]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., address: _Optional[str] = ..., alive: _Optional[bool] = ..., seconds_since_heartbeat: _Optional[float] = ..., placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., links: _Optional[_Iterable[_Union[LinkReport, _Mapping]]] = ..., behind: _Optional[_Iterable[_Union[InputLag, _Mapping]]] = ...) -> None: ...

class InputLag(_message.Message):
    __slots__ = ("folder", "files_waiting", "lag_s")
    FOLDER_FIELD_NUMBER: _ClassVar[int]
    FILES_WAITING_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    folder: str
    files_waiting: int
    lag_s: float
    def __init__(self, folder: _Optional[str] = ..., files_waiting: _Optional[int] = ..., lag_s: _Optional[float] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("query", "piece", "server", "pid", "address", "state")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    query: str
    piece: str
    server: str
    pid: int
    address: str
    state: str
    def __init__(self, query: _Optional[str] = ..., piece: _Optional[str] = ..., server: _Optional[str] = ..., pid: _Optional[int] = ..., address: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class LinkStatus(_message.Message):
    __slots__ = ("a", "b", "bandwidth_bps", "planned_bytes_per_s", "utilisation")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_BPS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    a: str
    b: str
    bandwidth_bps: float
    planned_bytes_per_s: float
    utilisation: float
    def __init__(self, a: _Optional[str] = ..., b: _Optional[str] = ..., bandwidth_bps: _Optional[float] = ..., planned_bytes_per_s: _Optional[float] = ..., utilisation: _Optional[float] = ...) -> None: ...

class QueryStatus(_message.Message):
    __slots__ = ("name", "state", "detail", "plan", "replans", "parents", "failures", "late_records")
    class ParentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class FailuresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LateRecordsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    REPLANS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    LATE_RECORDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    detail: str
    plan: str
    replans: int
    parents: _containers.ScalarMap[str, str]
    failures: _containers.ScalarMap[str, str]
    late_records: _containers.ScalarMap[str, int]
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., detail: _Optional[str] = ..., plan: _Optional[str] = ..., replans: _Optional[int] = ..., parents: _Optional[_Mapping[str, str]] = ..., failures: _Optional[_Mapping[str, str]] = ..., late_records: _Optional[_Mapping[str, int]] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("topology", "root", "sites", "queries", "links")
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    topology: str
    root: str
    sites: _containers.RepeatedCompositeFieldContainer[SiteStatus]
    queries: _containers.RepeatedCompositeFieldContainer[QueryStatus]
    links: _containers.RepeatedCompositeFieldContainer[LinkStatus]
    def __init__(self, topology: _Optional[str] = ..., root: _Optional[str] = ..., sites: _Optional[_Iterable[_Union[SiteStatus, _Mapping]]] = ..., queries: _Optional[_Iterable[_Union[QueryStatus, _Mapping]]] = ..., links: _Optional[_Iterable[_Union[LinkStatus, _Mapping]]] = ...) -> None: ...

class CancelQueryRequest(_message.Message):
    __slots__ = ("query",)
    QUERY_FIELD_NUMBER: _ClassVar[int]
    query: str
    def __init__(self, query: _Optional[str] = ...) -> None: ...

class CancelQueryResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamResultsRequest(_message.Message):
    __slots__ = ("query",)
    QUERY_FIELD_NUMBER: _ClassVar[int]
    query: str
    def __init__(self, query: _Optional[str] = ...) -> None: ...

class RegisterSiteRequest(_message.Message):
    __slots__ = ("site", "address", "allows_code")
    SITE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALLOWS_CODE_FIELD_NUMBER: _ClassVar[int]
    site: str
    address: str
    allows_code: bool
    def __init__(self, site: _Optional[str] = ..., address: _Optional[str] = ..., allows_code: _Optional[bool] = ...) -> None: ...

class Server(_message.Message):
    __slots__ = ("name", "cores", "memory_gb")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    name: str
    cores: int
    memory_gb: float
    def __init__(self, name: _Optional[str] = ..., cores: _Optional[int] = ..., memory_gb: _Optional[float] = ...) -> None: ...

class RegisterSiteResponse(_message.Message):
    __slots__ = ("topology", "heartbeat_interval_s", "servers", "kind", "spark_master", "spark_conf")
    class SparkConfEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SPARK_MASTER_FIELD_NUMBER: _ClassVar[int]
    SPARK_CONF_FIELD_NUMBER: _ClassVar[int]
    topology: str
    heartbeat_interval_s: float
    servers: _containers.RepeatedCompositeFieldContainer[Server]
    kind: str
    spark_master: str
    spark_conf: _containers.ScalarMap[str, str]
    def __init__(self, topology: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., servers: _Optional[_Iterable[_Union[Server, _Mapping]]] = ..., kind: _Optional[str] = ..., spark_master: _Optional[str] = ..., spark_conf: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PublishResultsRequest(_message.Message):
    __slots__ = ("query", "results", "finished")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    query: str
    results: _containers.RepeatedCompositeFieldContainer[_query_pb2.WindowResult]
    finished: bool
    def __init__(self, query: _Optional[str] = ..., results: _Optional[_Iterable[_Union[_query_pb2.WindowResult, _Mapping]]] = ..., finished: _Optional[bool] = ...) -> None: ...

class PublishResultsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LinkMeasurement(_message.Message):
    __slots__ = ("peer", "bandwidth_bps")
    PEER_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_BPS_FIELD_NUMBER: _ClassVar[int]
    peer: str
    bandwidth_bps: float
    def __init__(self, peer: _Optional[str] = ..., bandwidth_bps: _Optional[float] = ...) -> None: ...

class LinkReport(_message.Message):
    __slots__ = ("query", "level", "level_index", "pinned", "sent_bytes", "profile")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    LEVEL_INDEX_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    query: str
    level: str
    level_index: int
    pinned: bool
    sent_bytes: int
    profile: _containers.RepeatedCompositeFieldContainer[LevelProfile]
    def __init__(self, query: _Optional[str] = ..., level: _Optional[str] = ..., level_index: _Optional[int] = ..., pinned: _Optional[bool] = ..., sent_bytes: _Optional[int] = ..., profile: _Optional[_Iterable[_Union[LevelProfile, _Mapping]]] = ...) -> None: ...

class LevelProfile(_message.Message):
    __slots__ = ("level", "bytes", "error", "windows")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    level: str
    bytes: float
    error: float
    windows: int
    def __init__(self, level: _Optional[str] = ..., bytes: _Optional[float] = ..., error: _Optional[float] = ..., windows: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("site", "links", "running", "input_bytes", "query_links", "placements", "failures", "leaving", "interval_s", "behind", "late_records")
    class LateRecordsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SITE_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    INPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUERY_LINKS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    BEHIND_FIELD_NUMBER: _ClassVar[int]
    LATE_RECORDS_FIELD_NUMBER: _ClassVar[int]
    site: str
    links: _containers.RepeatedCompositeFieldContainer[LinkMeasurement]
    running: _containers.RepeatedScalarFieldContainer[str]
    input_bytes: int
    query_links: _containers.RepeatedCompositeFieldContainer[LinkReport]
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    failures: _containers.RepeatedCompositeFieldContainer[StageFailure]
    leaving: bool
    interval_s: float
    behind: _containers.RepeatedCompositeFieldContainer[InputLag]
    late_records: _containers.ScalarMap[str, int]
    def __init__(self, site: _Optional[str] = ..., links: _Optional[_Iterable[_Union[LinkMeasurement, _Mapping]]] = ..., running: _Optional[_Iterable[str]] = ..., input_bytes: _Optional[int] = ..., query_links: _Optional[_Iterable[_Union[LinkReport, _Mapping]]] = ..., placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[StageFailure, _Mapping]]] = ..., leaving: _Optional[bool] = ..., interval_s: _Optional[float] = ..., behind: _Optional[_Iterable[_Union[InputLag, _Mapping]]] = ..., late_records: _Optional[_Mapping[str, int]] = ...) -> None: ...

class StageFailure(_message.Message):
    __slots__ = ("query", "error")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    query: str
    error: str
    def __init__(self, query: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("queries",)
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queries: _Optional[_Iterable[str]] = ...) -> None: ...

class Fragment(_message.Message):
    __slots__ = ("query", "spec", "sources", "children", "parent", "parent_address", "partitions", "final", "version", "covers", "expected", "part", "parts", "rounds", "uplink_bps", "resend_from_ms", "level")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    PARENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COVERS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    UPLINK_BPS_FIELD_NUMBER: _ClassVar[int]
    RESEND_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    query: str
    spec: _query_pb2.QuerySpec
    sources: _containers.RepeatedScalarFieldContainer[str]
    children: _containers.RepeatedScalarFieldContainer[str]
    parent: str
    parent_address: str
    partitions: int
    final: bool
    version: int
    covers: _containers.RepeatedScalarFieldContainer[str]
    expected: _containers.RepeatedScalarFieldContainer[str]
    part: int
    parts: int
    rounds: bool
    uplink_bps: float
    resend_from_ms: int
    level: int
    def __init__(self, query: _Optional[str] = ..., spec: _Optional[_Union[_query_pb2.QuerySpec, _Mapping]] = ..., sources: _Optional[_Iterable[str]] = ..., children: _Optional[_Iterable[str]] = ..., parent: _Optional[str] = ..., parent_address: _Optional[str] = ..., partitions: _Optional[int] = ..., final: _Optional[bool] = ..., version: _Optional[int] = ..., covers: _Optional[_Iterable[str]] = ..., expected: _Optional[_Iterable[str]] = ..., part: _Optional[int] = ..., parts: _Optional[int] = ..., rounds: _Optional[bool] = ..., uplink_bps: _Optional[float] = ..., resend_from_ms: _Optional[int] = ..., level: _Optional[int] = ...) -> None: ...

class DeployFragmentRequest(_message.Message):
    __slots__ = ("fragment",)
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    fragment: Fragment
    def __init__(self, fragment: _Optional[_Union[Fragment, _Mapping]] = ...) -> None: ...

class DeployFragmentResponse(_message.Message):
    __slots__ = ("placements",)
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    def __init__(self, placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ...) -> None: ...

class StopFragmentRequest(_message.Message):
    __slots__ = ("query",)
    QUERY_FIELD_NUMBER: _ClassVar[int]
    query: str
    def __init__(self, query: _Optional[str] = ...) -> None: ...

class StopFragmentResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("site", "server", "address", "pid")
    SITE_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    site: str
    server: str
    address: str
    pid: int
    def __init__(self, site: _Optional[str] = ..., server: _Optional[str] = ..., address: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetLevelRequest(_message.Message):
    __slots__ = ("query", "site", "level")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    query: str
    site: str
    level: str
    def __init__(self, query: _Optional[str] = ..., site: _Optional[str] = ..., level: _Optional[str] = ...) -> None: ...

class SetLevelResponse(_message.Message):
    __slots__ = ("link", "level", "pinned", "levels")
    LINK_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    link: str
    level: str
    pinned: bool
    levels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, link: _Optional[str] = ..., level: _Optional[str] = ..., pinned: _Optional[bool] = ..., levels: _Optional[_Iterable[str]] = ...) -> None: ...

class HistoryRequest(_message.Message):
    __slots__ = ("query", "since_ms", "until_ms")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    query: _query_pb2.QuerySpec
    since_ms: int
    until_ms: int
    def __init__(self, query: _Optional[_Union[_query_pb2.QuerySpec, _Mapping]] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ...) -> None: ...

class HistoryResponse(_message.Message):
    __slots__ = ("results", "stored", "resolution_ms", "bytes")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_MS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_query_pb2.WindowResult]
    stored: str
    resolution_ms: int
    bytes: int
    def __init__(self, results: _Optional[_Iterable[_Union[_query_pb2.WindowResult, _Mapping]]] = ..., stored: _Optional[str] = ..., resolution_ms: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ReadCubesRequest(_message.Message):
    __slots__ = ("query", "start_ms", "end_ms", "resolution_ms", "max_bytes", "max_level", "stored")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_LEVEL_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    query: str
    start_ms: int
    end_ms: int
    resolution_ms: int
    max_bytes: int
    max_level: int
    stored: _query_pb2.QueryPlan
    def __init__(self, query: _Optional[str] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., resolution_ms: _Optional[int] = ..., max_bytes: _Optional[int] = ..., max_level: _Optional[int] = ..., stored: _Optional[_Union[_query_pb2.QueryPlan, _Mapping]] = ...) -> None: ...

class ReadCubesResponse(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[_dataplane_pb2.PartialBatch]
    def __init__(self, batches: _Optional[_Iterable[_Union[_dataplane_pb2.PartialBatch, _Mapping]]] = ...) -> None: ...
