"""Column types, record schemas, and the CDN log schema every demo and test uses."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jetstream.errors import PlanError

__all__ = ["CDN_LOG_SCHEMA", "DataType", "Field", "Schema", "value_order"]


class DataType(enum.Enum):
    """The value types a column can hold."""

    STRING = "string"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    #: A list of records, e.g. the items of a ``top_k`` aggregate; not comparable.
    LIST = "list"
    #: The accumulator of a partial aggregate; only a merge or final aggregate reads it.
    PARTIAL = "partial"

    @property
    def is_numeric(self) -> bool:
        return self in (DataType.INT, DataType.FLOAT)

    def comparable_with(self, other: DataType) -> bool:
        if {self, other} & {DataType.LIST, DataType.PARTIAL}:
            return False
        return self is other or (self.is_numeric and other.is_numeric)

    def accepts(self, value: Any) -> bool:
        """Whether a Python value (not a string to parse) is of this type."""
        if self is DataType.STRING:
            return isinstance(value, str)
        if self is DataType.BOOL:
            return isinstance(value, bool)
        if self is DataType.INT:
            return isinstance(value, int) and not isinstance(value, bool)
        if self is DataType.FLOAT:
            return (isinstance(value, int | float) and not isinstance(value, bool)
                    and math.isfinite(value))
        if self is DataType.LIST:
            return isinstance(value, list)
        return False

    def parse(self, text: str) -> Any:
        """Parse a CSV cell; raises ValueError with a readable reason."""
        if self is DataType.STRING:
            return text
        if self is DataType.INT:
            return int(text)
        if self is DataType.FLOAT:
            value = float(text)
            if not math.isfinite(value):
                msg = f"not a finite number: {text!r}"
                raise ValueError(msg)
            return value
        if self is DataType.BOOL:
            lowered = text.strip().lower()
            if lowered in ("true", "1"):
                return True
            if lowered in ("false", "0"):
                return False
            msg = f"invalid literal for bool: {text!r}"
            raise ValueError(msg)
        msg = f"a {self.value} column cannot be read from text"
        raise ValueError(msg)


@dataclass(frozen=True)
class Field:
    name: str
    dtype: DataType

    def __str__(self) -> str:
        return f"{self.name}:{self.dtype.value}"


@dataclass(frozen=True)
class Schema:
    """An ordered set of named, typed columns; ``event_time`` names the epoch-ms time column."""

    fields: tuple[Field, ...]
    event_time: str | None = None

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for f in self.fields:
            if f.name in seen:
                msg = f"schema: column {f.name!r} appears twice"
                raise PlanError(msg)
            seen.add(f.name)
        if self.event_time is not None:
            if self.event_time not in seen:
                msg = f"schema: event time column {self.event_time!r} is not a column"
                raise PlanError(msg)
            if self.dtype(self.event_time) is not DataType.INT:
                msg = f"schema: event time column {self.event_time!r} must be int (epoch ms)"
                raise PlanError(msg)

    @classmethod
    def of(cls, columns: Mapping[str, DataType], event_time: str | None = None) -> Schema:
        return cls(tuple(Field(n, t) for n, t in columns.items()), event_time)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def __contains__(self, name: object) -> bool:
        return any(f.name == name for f in self.fields)

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def fields_by_name(self) -> dict[str, DataType]:
        return {f.name: f.dtype for f in self.fields}

    def dtype(self, name: str) -> DataType:
        for f in self.fields:
            if f.name == name:
                return f.dtype
        msg = f"unknown column {name!r}; the input has {', '.join(self.names)}"
        raise PlanError(msg)

    def with_field(self, name: str, dtype: DataType) -> Schema:
        """This schema with ``name`` added at the end, or retyped in place if present."""
        if name in self:
            fields = tuple(Field(name, dtype) if f.name == name else f for f in self.fields)
            keeps_time = self.event_time != name or dtype is DataType.INT
            return Schema(fields, self.event_time if keeps_time else None)
        return Schema((*self.fields, Field(name, dtype)), self.event_time)

    def project(self, names: Iterable[str]) -> Schema:
        kept = tuple(Field(n, self.dtype(n)) for n in names)
        time = self.event_time if self.event_time in {f.name for f in kept} else None
        return Schema(kept, time)

    def __str__(self) -> str:
        return "(" + ", ".join(str(f) for f in self.fields) + ")"


#: One line of a CDN access log: CSV with a header row, one file set per site.
CDN_LOG_SCHEMA = Schema.of(
    {
        "ts": DataType.INT,
        "pop": DataType.STRING,
        "client_ip": DataType.STRING,
        "domain": DataType.STRING,
        "url": DataType.STRING,
        "status": DataType.INT,
        "bytes": DataType.INT,
        "latency_ms": DataType.FLOAT,
        "cache": DataType.STRING,
    },
    event_time="ts",
)


def value_order(value: Any) -> tuple[int, Any]:
    """A sort key for any column value: NULL first, then numbers, then text, then the rest by
    repr. The final top-k breaks ties with it, and so does everything that must pick the same
    rows (the truncated partials of a degraded link)."""
    if value is None:
        return (0, 0)
    if isinstance(value, int | float):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, repr(value))
