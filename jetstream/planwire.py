"""A query's logical plan as a ``jetstream.v1.QueryPlan`` message: how a query travels.

The user's side runs the query file once and sends its plan; the controller and the sites
rebuild the query from it step by step through the DSL, which checks every step again, so a
plan is refused exactly where a query file would be (schemas are derived, never trusted).
Only a ``map`` function travels as code: pickled with its closure (cloudpickle), and unpickled
only by a reader told ``allow_code`` (a controller or a site started with ``--allow-code``).

:data:`PLAN_VERSION` is the format's version; a reader refuses any other, saying which.

This is the query's codec: its plan, its SLO, and the values and records a plan and a result
hold. The data plane's messages have theirs (:mod:`jetstream.dataplane.codec`), the control
plane's theirs (:mod:`jetstream.control.codec`, results included).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import pickle
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from google.protobuf.message import DecodeError

from jetstream import functions
from jetstream.aggregates import Aggregate
from jetstream.dsl import SLO, Query, Stream, source
from jetstream.errors import DataError, PlanError
from jetstream.expr import (
    _ARITH,
    _COMPARE,
    And,
    Arith,
    Call,
    Col,
    Compare,
    Expr,
    IsIn,
    Lit,
    Neg,
    Not,
    Or,
)
from jetstream.operators import (
    Join,
    Map,
    Operator,
    Phase,
    Select,
    Source,
    TopK,
    Union,
    Where,
    Window,
    WindowAggregate,
    WithColumn,
)
from jetstream.schema import DataType, Schema
from jetstream.tables import Table
from jetstream.v1 import query_pb2 as pb
from jetstream.windows import Sliding, Tumbling, format_duration

__all__ = ["PLAN_VERSION", "query_from_bytes", "query_from_proto", "query_to_bytes",
           "query_to_proto", "record_from_proto", "record_to_proto", "slo_to_proto",
           "value_to_proto"]

_M = TypeVar("_M")

#: The plan format this code writes and reads. Raise it when a reader of the previous
#: format would misread a new plan (a new step is fine: an old reader refuses what it lacks).
PLAN_VERSION = 1


# -- writing --------------------------------------------------------------------------------
def query_to_proto(query: Query) -> pb.QueryPlan:
    """``query``'s plan as written (not rewritten) as a message; refuses what cannot travel."""
    plan = query.plan()
    order = plan.topological()
    index = {node: i for i, node in enumerate(order)}
    msg = pb.QueryPlan(version=PLAN_VERSION, name=query.name, slo=slo_to_proto(query.slo))
    tables: dict[str, Table] = {}
    for node in order:
        op = plan.op(node)
        step = _step_to_proto(op, query.name)
        step.inputs.extend(index[n] for n in plan.inputs(node))
        msg.steps.append(step)
        if isinstance(op, Join):
            known = tables.setdefault(op.table.name, op.table)
            if known is not op.table:
                problem = (f"query {query.name}: two different tables are named "
                           f"{op.table.name!r}; give each its own name")
                raise PlanError(problem)
    for table in tables.values():
        msg.tables.append(pb.Table(name=table.name, schema=_schema_to_proto(table.schema),
                                   origin=table.origin,
                                   rows=[_in_plan(record_to_proto, row) for row in table.rows]))
    if index[plan.sink] != len(order) - 1:  # topological order ends at the only sink
        problem = f"query {query.name}: the plan has steps that do not lead to its output"
        raise PlanError(problem)
    return msg


def _step_to_proto(op: Operator, query: str) -> pb.PlanStep:
    if isinstance(op, Source):
        return pb.PlanStep(source=pb.SourceStep(name=op.name, schema=_schema_to_proto(op.schema),
                                                format=op.format or ""))
    if isinstance(op, Where) and not op.pinned:
        return pb.PlanStep(where=expr_to_proto(op.predicate))
    if isinstance(op, WithColumn):
        return pb.PlanStep(with_column=pb.NamedExpr(name=op.name, expr=expr_to_proto(op.expr)))
    if isinstance(op, Select):
        return pb.PlanStep(select=pb.SelectStep(columns=[
            pb.NamedExpr(name=n, expr=expr_to_proto(e)) for n, e in op.columns]))
    if isinstance(op, Map):
        return pb.PlanStep(map=pb.MapStep(
            label=op.label, pickled=_pickled(op), schema=_schema_to_proto(op.schema),
            monotonic=op.monotonic, has_changes=op.changes is not None,
            changes=sorted(op.changes or ())))
    if isinstance(op, Union):
        return pb.PlanStep(union=pb.UnionStep())
    if isinstance(op, Window):
        return pb.PlanStep(window=pb.WindowStep(size_ms=op.spec.size_ms,
                                                every_ms=op.spec.every_ms,
                                                watermark_ms=op.watermark_ms,
                                                early_ms=op.early_ms))
    if isinstance(op, WindowAggregate) and op.phase is Phase.COMPLETE:
        return pb.PlanStep(aggregate=pb.AggregateStep(
            keys=op.keys, aggregates=[_aggregate_to_proto(n, a) for n, a in op.aggregates],
            rollup=[pb.NamedExpr(name=k, expr=expr_to_proto(e)) for k, e in op.rollup]))
    if isinstance(op, TopK) and not op.per_input:
        return pb.PlanStep(top_k=pb.TopKStep(k=op.k, by=op.by))
    if isinstance(op, Join):
        return pb.PlanStep(join=pb.JoinStep(table=op.table.name, on=op.on, how=op.how))
    msg = (f"query {query}: `{op.describe()}` is a step of a rewritten plan; send the query "
           "as written")
    raise PlanError(msg)


def _pickled(op: Map) -> bytes:
    from pyspark import cloudpickle  # pyspark's copy: every site has it

    try:
        return bytes(cloudpickle.dumps(op.fn))
    except Exception as e:  # whatever the closure holds that cannot be pickled
        msg = (f"map {op.label}: the function cannot travel to the sites: pickling it "
               f"failed ({type(e).__name__}: {e})")
        raise PlanError(msg) from None


def expr_to_proto(expr: Expr) -> pb.Expr:
    """An expression as a message."""
    if isinstance(expr, Col):
        return pb.Expr(col=expr.name)
    if isinstance(expr, Lit):
        return pb.Expr(lit=_in_plan(value_to_proto, expr.value))
    if isinstance(expr, Arith | Compare):
        binary = pb.BinaryExpr(op=expr.op, left=expr_to_proto(expr.left),
                               right=expr_to_proto(expr.right))
        return pb.Expr(arith=binary) if isinstance(expr, Arith) else pb.Expr(compare=binary)
    if isinstance(expr, And | Or):
        binary = pb.BinaryExpr(left=expr_to_proto(expr.left), right=expr_to_proto(expr.right))
        return pb.Expr(conjunction=binary) if isinstance(expr, And) else pb.Expr(
            disjunction=binary)
    if isinstance(expr, Neg):
        return pb.Expr(minus=expr_to_proto(expr.operand))
    if isinstance(expr, Not):
        return pb.Expr(negation=expr_to_proto(expr.operand))
    if isinstance(expr, IsIn):
        return pb.Expr(isin=pb.IsInExpr(operand=expr_to_proto(expr.operand),
                                        values=[_in_plan(value_to_proto, v) for v in expr.values]))
    if isinstance(expr, Call):
        return pb.Expr(call=pb.CallExpr(fn=expr.fn, operand=expr_to_proto(expr.operand)))
    msg = f"cannot send the expression {expr} ({type(expr).__name__})"
    raise PlanError(msg)


def _aggregate_to_proto(name: str, agg: Aggregate) -> pb.AggregateSpec:
    spec = pb.AggregateSpec(output=name, function=agg.name)
    if agg.expr is not None:
        spec.input.CopyFrom(expr_to_proto(agg.expr))
    for f in dataclasses.fields(agg):
        if f.name != "expr":
            spec.params[f.name].CopyFrom(_in_plan(value_to_proto, getattr(agg, f.name)))
    return spec


def _schema_to_proto(schema: Schema) -> pb.SchemaSpec:
    msg = pb.SchemaSpec(fields=[pb.SchemaSpec.Field(name=f.name, type=f.dtype.value)
                                for f in schema])
    if schema.event_time is not None:
        msg.event_time = schema.event_time
    return msg


def value_to_proto(value: Any) -> pb.Value:
    """A value as a message: NULL as an empty one, a list of records (a top-k's items, say)
    as a list of records; raises DataError for any other value, or an int beyond 64 bits."""
    if isinstance(value, bool):
        return pb.Value(bool_value=value)
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            msg = f"the integer {value} does not fit 64 bits"
            raise DataError(msg)
        return pb.Value(int_value=value)
    if isinstance(value, float):
        return pb.Value(float_value=value)
    if isinstance(value, str):
        return pb.Value(string_value=value)
    if isinstance(value, list):
        return pb.Value(list_value=pb.RecordList(records=[record_to_proto(r) for r in value]))
    if value is None:
        return pb.Value()
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
    return pb.Record(fields={k: value_to_proto(v) for k, v in record.items() if v is not None})


def record_from_proto(record: pb.Record, columns: tuple[str, ...] = ()) -> dict[str, Any]:
    """A record from a message; ``columns`` that are absent come back as None."""
    out = {c: None for c in columns}
    out.update({k: _value_from_proto(v) for k, v in record.fields.items()})
    return out


def _in_plan(encode: Callable[[Any], _M], value: Any) -> _M:
    """``encode(value)``; a value the plan cannot carry is the plan's error."""
    try:
        return encode(value)
    except DataError as e:
        raise PlanError(f"cannot send {value!r}: {e}") from None


def slo_to_proto(slo: SLO) -> pb.SLO:
    msg = pb.SLO()
    if slo.max_latency_ms is not None:
        msg.max_latency_ms = slo.max_latency_ms
    if slo.max_error is not None:
        msg.max_error = slo.max_error
    if slo.max_wan_kbps is not None:
        msg.max_wan_kbps = slo.max_wan_kbps
    return msg


def query_to_bytes(query: Query) -> bytes:
    """``query``'s plan, serialized (see :func:`query_to_proto`)."""
    return bytes(query_to_proto(query).SerializeToString())


# -- reading --------------------------------------------------------------------------------
def query_from_bytes(data: bytes, *, allow_code: bool = False) -> Query:
    """The query of a serialized plan (see :func:`query_from_proto`)."""
    try:
        msg = pb.QueryPlan.FromString(data)
    except DecodeError:
        problem = "not a query plan (a jetstream.v1.QueryPlan message)"
        raise PlanError(problem) from None
    return query_from_proto(msg, allow_code=allow_code)


def query_from_proto(msg: pb.QueryPlan, *, allow_code: bool = False) -> Query:
    """The query a plan message holds, rebuilt through the DSL (every step checked again).

    Raises PlanError naming the step that is wrong, for a plan of another version, and for
    a ``map`` unless ``allow_code`` (its function is code: only a reader that allows code
    unpickles it).
    """
    name = msg.name or "<unnamed>"
    if msg.version != PLAN_VERSION:
        newer = "newer" if msg.version > PLAN_VERSION else "older"
        problem = (f"query {name}: its plan is of format version {msg.version}, {newer} than "
                   f"the version {PLAN_VERSION} this JetStream-py reads; run the same "
                   "JetStream-py version on the submitting side, the controller and the sites")
        raise PlanError(problem)
    if not msg.steps:
        problem = f"query {name}: the plan has no steps"
        raise PlanError(problem)
    tables = {t.name: _table(t) for t in msg.tables}
    streams: list[Stream] = []
    for i, step in enumerate(msg.steps):
        if any(j >= i for j in step.inputs):
            problem = f"query {name}: step {i + 1} reads a step that does not come before it"
            raise PlanError(problem)
        inputs = [streams[j] for j in step.inputs]
        try:
            streams.append(_apply(step, inputs, tables, allow_code))
        except PlanError as e:
            problem = f"query {name}: step {i + 1}: {e}"
            raise PlanError(problem) from None
    return Query(name, streams[-1], _slo(msg.slo))


def _apply(step: pb.PlanStep, inputs: list[Stream], tables: dict[str, Table],
           allow_code: bool) -> Stream:
    kind = step.WhichOneof("op")
    if kind is None:
        msg = "a step of a kind this JetStream-py does not know (a newer plan?)"
        raise PlanError(msg)
    wants = {"source": 0, "union": None}.get(kind, 1)
    if wants is not None and len(inputs) != wants:
        msg = f"{kind} takes {wants} input(s), the plan gives {len(inputs)}"
        raise PlanError(msg)
    if kind == "source":
        return source(step.source.name, _schema(step.source.schema),
                      step.source.format or None)
    if kind == "union":
        if len(inputs) < 2:
            msg = "union takes at least two inputs"
            raise PlanError(msg)
        return inputs[0].union(*inputs[1:])
    stream = inputs[0]
    if kind == "where":
        return stream.where(expr_from_proto(step.where))
    if kind == "with_column":
        return stream.with_column(step.with_column.name, expr_from_proto(step.with_column.expr))
    if kind == "select":
        columns = {c.name: expr_from_proto(c.expr) for c in step.select.columns}
        if len(columns) != len(step.select.columns):
            msg = "select: a column is selected twice"
            raise PlanError(msg)
        return stream.select(**columns)
    if kind == "map":
        return _map(stream, step.map, allow_code)
    if kind == "window":
        w = step.window
        spec = (Tumbling(w.size_ms, w.every_ms) if w.size_ms == w.every_ms
                else Sliding(w.size_ms, w.every_ms))
        if (w.size_ms <= 0 or not 0 < w.every_ms <= w.size_ms or w.watermark_ms < 0
                or w.early_ms < 0):
            msg = (f"window: size {w.size_ms} ms, every {w.every_ms} ms, watermark "
                   f"{w.watermark_ms} ms, early {w.early_ms} ms is not a window")
            raise PlanError(msg)
        early = dt.timedelta(milliseconds=w.early_ms) if w.HasField("early_ms") else None
        return stream.window(spec, watermark=dt.timedelta(milliseconds=w.watermark_ms),
                             early=early)
    if kind == "aggregate":
        aggregates = {a.output: _aggregate(a) for a in step.aggregate.aggregates}
        if len(aggregates) != len(step.aggregate.aggregates):
            msg = "agg: an aggregate is named twice"
            raise PlanError(msg)
        rollup = {r.name: expr_from_proto(r.expr) for r in step.aggregate.rollup}
        if len(rollup) != len(step.aggregate.rollup):
            msg = "group_by: a key's rollup is given twice"
            raise PlanError(msg)
        return stream.group_by(*step.aggregate.keys, rollup=rollup).agg(**aggregates)
    if kind == "top_k":
        return stream.top_k(step.top_k.k, step.top_k.by)
    if kind == "join":
        table = tables.get(step.join.table)
        if table is None:
            msg = f"join: the plan has no table {step.join.table!r}"
            raise PlanError(msg)
        return stream.join(table, on=step.join.on, how=step.join.how)
    msg = "a step of a kind this JetStream-py does not know (a newer plan?)"
    raise PlanError(msg)


def _map(stream: Stream, step: pb.MapStep, allow_code: bool) -> Stream:
    if not allow_code:
        msg = (f"map {step.label}: this process does not run code sent with a query; start "
               "the controller and the sites with --allow-code to accept map functions "
               "(jetstream run and demo do), or write the step with with_column and where")
        raise PlanError(msg)
    try:
        fn = pickle.loads(step.pickled)  # code: only where the controller allows it
    except Exception as e:
        msg = (f"map {step.label}: cannot load the function ({type(e).__name__}: {e}); the "
               "sites need the packages it uses")
        raise PlanError(msg) from None
    return stream.map(fn, schema=_schema(step.schema), monotonic=step.monotonic,
                      changes=list(step.changes) if step.has_changes else None,
                      name=step.label)


_FUNCTIONS: dict[str, Callable[..., Aggregate]] = {
    name: getattr(functions, name) for name in functions.__all__}


def _aggregate(spec: pb.AggregateSpec) -> Aggregate:
    fn = _FUNCTIONS.get(spec.function)
    if fn is None:
        msg = f"agg {spec.output}: unknown aggregate {spec.function!r}"
        raise PlanError(msg)
    params = {k: _scalar(v) for k, v in spec.params.items()}
    args = [expr_from_proto(spec.input)] if spec.HasField("input") else []
    try:
        return fn(*args, **params)
    except TypeError as e:
        msg = f"agg {spec.output}: {spec.function} does not take these arguments ({e})"
        raise PlanError(msg) from None


def expr_from_proto(msg: pb.Expr) -> Expr:
    """The expression a message holds; raises PlanError for one that is not well formed."""
    kind = msg.WhichOneof("kind")
    if kind == "col":
        if not msg.col:
            problem = "a column reference without a name"
            raise PlanError(problem)
        return Col(msg.col)
    if kind == "lit":
        value = _scalar(msg.lit)
        if value is None:
            problem = "a literal without a value"
            raise PlanError(problem)
        return Lit(value)
    if kind in ("arith", "compare"):
        binary = getattr(msg, kind)
        ops = _ARITH if kind == "arith" else _COMPARE
        if binary.op not in ops:
            problem = f"unknown operator {binary.op!r}"
            raise PlanError(problem)
        node = Arith if kind == "arith" else Compare
        return node(binary.op, expr_from_proto(binary.left), expr_from_proto(binary.right))
    if kind in ("conjunction", "disjunction"):
        binary = getattr(msg, kind)
        node2 = And if kind == "conjunction" else Or
        return node2(expr_from_proto(binary.left), expr_from_proto(binary.right))
    if kind == "minus":
        return Neg(expr_from_proto(msg.minus))
    if kind == "negation":
        return Not(expr_from_proto(msg.negation))
    if kind == "isin":
        return IsIn(expr_from_proto(msg.isin.operand),
                    tuple(_scalar(v) for v in msg.isin.values))
    if kind == "call":
        return Call(msg.call.fn, expr_from_proto(msg.call.operand))
    problem = "an expression of a kind this JetStream-py does not know, or none"
    raise PlanError(problem)


def _scalar(value: pb.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        msg = "a list where a single value belongs"
        raise PlanError(msg)
    if kind == "float_value" and not math.isfinite(value.float_value):
        msg = f"{value.float_value} is not a finite number"
        raise PlanError(msg)
    return None if kind is None else getattr(value, kind)


_TYPES = {t.value: t for t in DataType if t is not DataType.PARTIAL}


def _schema(msg: pb.SchemaSpec) -> Schema:
    fields = {}
    for f in msg.fields:
        if f.type not in _TYPES:
            problem = f"column {f.name!r} has an unknown type {f.type!r}"
            raise PlanError(problem)
        if not f.name or f.name in fields:
            problem = f"the schema names column {f.name!r} twice, or not at all"
            raise PlanError(problem)
        fields[f.name] = _TYPES[f.type]
    time = msg.event_time if msg.HasField("event_time") else None
    if time is not None and fields.get(time) is not DataType.INT:
        problem = f"the event time column {time!r} is not an int column of the schema"
        raise PlanError(problem)
    return Schema.of(fields, time)


def _table(msg: pb.Table) -> Table:
    schema = _schema(msg.schema)
    rows = tuple({f.name: _scalar(r.fields[f.name]) if f.name in r.fields else None
                  for f in schema} for r in msg.rows)
    for r in msg.rows:
        if unknown := sorted(set(r.fields) - set(schema.names)):
            problem = f"table {msg.name}: a row has a column {unknown[0]!r} not in its schema"
            raise PlanError(problem)
    return Table(msg.name, schema, rows, msg.origin or "<plan>")


def _slo(msg: pb.SLO) -> SLO:
    latency = format_duration(msg.max_latency_ms) if msg.HasField("max_latency_ms") else None
    return SLO(max_latency=latency,
               max_error=msg.max_error if msg.HasField("max_error") else None,
               max_wan_kbps=msg.max_wan_kbps if msg.HasField("max_wan_kbps") else None)
