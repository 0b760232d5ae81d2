"""Filter pushback: move every ``where`` as close to the sources as its meaning allows.

The facts it relies on, for a filter σp:

- σp(A ∪ B) = σp(A) ∪ σp(B): a copy goes onto each input of a union.
- σp(f(R)) = f(σp'(R)) for a record-to-record step f, where p' is p with f's expressions
  substituted for the columns f sets (``with_column kb = bytes / 1024`` then ``kb > 10``
  becomes ``bytes / 1024 > 10``). When f is monotonic in the column, p' is then solved for
  it (``bytes > 10240``); where that inverse is not exact (floating point, multiplication)
  the solved filter is relaxed and the original stays above as an exact check.
- Window assignment is per record and watermarks come from the sources, so a filter
  commutes with ``window`` and with a key-partition exchange.
- A filter that reads only group keys removes whole groups, the same ones before or after the
  aggregate, so it moves below it.
- A lookup join adds, to a record, the one table row whose ``on`` equals the record's. A
  filter that reads none of the columns it adds commutes with it. One that reads only the
  added columns keeps exactly the records whose table row passes it, so below the join it
  becomes ``on.isin(the keys of the rows that pass)``: for an inner join always; for a left
  join only when the filter rejects a row of NULLs (an unmatched record's), else unmatched
  records, which it keeps, would be lost. It declines when more than
  :data:`MAX_PUSHED_KEYS` rows pass, or when the filter reads the added columns and the
  record's own together.

It is NOT safe, and the rule declines: past an opaque ``map`` that may change a column the
filter reads (declare ``changes=`` to tell), past ``top_k`` (the rows in the top k depend on
every row), past an aggregate when the filter reads an aggregate value (HAVING), or past a
step that also feeds another branch.

Before: ``source -> with_column kb = bytes / 1024 -> where kb > 10``
After:  ``source -> where bytes / 1024 > 10 -> with_column kb = bytes / 1024``

Before: ``source -> join customers on domain -> where tier == 'gold'``
After:  ``source -> where domain.isin('a.com', 'c.com') -> join customers on domain``
"""

from __future__ import annotations

import dataclasses

import networkx as nx

from jetstream.expr import And, Col, Expr, IsIn
from jetstream.operators import (
    Join,
    KeyPartition,
    Map,
    Operator,
    Select,
    Source,
    TopK,
    Union,
    Where,
    Window,
    WindowAggregate,
    WithColumn,
)
from jetstream.plan import LogicalPlan
from jetstream.rewrite.context import Note, RewriteContext
from jetstream.rewrite.edit import (
    bypass,
    input_of,
    insert_above,
    insert_below,
    op,
    plan_of,
    replace,
)
from jetstream.rewrite.solve import solve

__all__ = ["MAX_PUSHED_KEYS", "push_filters"]

RULE = "push_filters"
#: The most table keys a filter on a join's columns becomes below the join.
MAX_PUSHED_KEYS = 1000


def push_filters(plan: LogicalPlan, context: RewriteContext) -> LogicalPlan:
    """The plan with every filter pushed as far toward the sources as is sound."""
    graph = plan.graph.copy()
    _split_conjunctions(graph)  # so that each condition goes as far as it can on its own
    while any(_push(graph, node, context) for node in nx.lexicographical_topological_sort(graph)
              if _movable(op(graph, node))):
        pass  # each push changes the graph; start again from the sources
    _merge_adjacent(graph)
    _condense(context)
    return plan_of(graph)


def _movable(operator: Operator) -> bool:
    return isinstance(operator, Where) and not operator.pinned


def _split_conjunctions(graph: nx.DiGraph) -> None:
    for node in list(graph):
        where = op(graph, node)
        if not isinstance(where, Where) or where.pinned or not isinstance(where.predicate, And):
            continue
        first, *rest = _conjuncts(where.predicate)
        replace(graph, node, dataclasses.replace(where, predicate=first))
        for condition in rest:
            node = insert_above(graph, node, dataclasses.replace(where, predicate=condition))


def _condense(context: RewriteContext) -> None:
    """One note for a filter's run of plain moves: "moved `p` below `a`, `b`, `c`"."""
    condensed: list[Note] = []
    for note in context.notes:
        last = condensed[-1] if condensed else None
        head, _, step = note.text.partition(" below ")
        if (last is not None and note.rule == last.rule == RULE and note.fired and last.fired
                and head.startswith("moved ") and last.text.startswith(head + " below ")
                and " as " not in note.text + last.text and ", which" not in note.text):
            condensed[-1] = dataclasses.replace(last, text=f"{last.text}, {step}")
        else:
            condensed.append(note)
    context.notes[:] = condensed


def _conjuncts(predicate: Expr) -> list[Expr]:
    if isinstance(predicate, And):
        return _conjuncts(predicate.left) + _conjuncts(predicate.right)
    return [predicate]


def _merge_adjacent(graph: nx.DiGraph) -> None:
    """Join a filter that sits right on another into one condition, for a readable plan."""
    for node in list(nx.lexicographical_topological_sort(graph)):
        where = op(graph, node)
        below_node = input_of(graph, node) if _movable(where) else None
        if below_node is None or graph.out_degree(below_node) != 1:
            continue
        below = op(graph, below_node)
        if isinstance(below, Where) and _movable(below):
            assert isinstance(where, Where)
            replace(graph, below_node,
                    dataclasses.replace(below, predicate=below.predicate & where.predicate))
            bypass(graph, node)


def _push(graph: nx.DiGraph, node: int, context: RewriteContext) -> bool:
    """Move the filter at ``node`` below the next step that is not a filter; whether it moved.

    Filters commute with each other, so the ones on the way are passed over.
    """
    where = op(graph, node)
    assert isinstance(where, Where)
    below_node = input_of(graph, node)
    while isinstance(op(graph, below_node), Where) and graph.out_degree(below_node) == 1:
        below_node = input_of(graph, below_node)
    below = op(graph, below_node)
    text = f"`{where.describe()}`"
    if isinstance(below, Source):
        return False
    if graph.out_degree(below_node) > 1:
        context.declined(RULE, f"{text} stays above `{below.describe()}`, which also feeds "
                               "another step")
        return False
    if isinstance(below, Union):
        bypass(graph, node)
        ports = sorted(p for _, _, p in graph.in_edges(below_node, data="port"))
        for port in ports:
            schema = op(graph, input_of(graph, below_node, port)).schema
            insert_below(graph, below_node, port, dataclasses.replace(where, schema=schema))
        context.fired(RULE, f"copied {text} onto each of the {len(ports)} inputs of the union")
        return True
    reads = where.predicate.columns()
    if isinstance(below, Window | KeyPartition) or (
            isinstance(below, WindowAggregate) and reads <= set(below.keys)):
        _swap(graph, node, below_node, where.predicate)
        context.fired(RULE, f"moved {text} below `{below.describe()}`")
        return True
    if isinstance(below, WithColumn | Select):
        _through_map(graph, node, below_node, context)
        return True
    if isinstance(below, Join):
        return _through_join(graph, node, below_node, context)
    if isinstance(below, Map):
        if below.writes is not None and not reads & below.writes:
            _swap(graph, node, below_node, where.predicate)
            context.fired(RULE, f"moved {text} below `{below.describe()}`, which does not "
                                "change the columns it reads")
            return True
        why = ("may change any column; declare changes=[...] to let filters pass"
               if below.writes is None else
               f"changes {', '.join(sorted(reads & below.writes))}, which the filter reads")
        if below.monotonic:
            why += " (it is monotonic, but its inverse is unknown)"
        context.declined(RULE, f"{text} stays above `{below.describe()}`: the function {why}")
    elif isinstance(below, WindowAggregate):
        values = ", ".join(sorted(reads - set(below.keys)))
        context.declined(RULE, f"{text} stays above `{below.describe()}`: it reads aggregate "
                               f"values ({values}), so it is a HAVING filter")
    elif isinstance(below, TopK):
        context.declined(RULE, f"{text} stays above `{below.describe()}`: which rows are in "
                               "the top k depends on every row")
    return False


def _swap(graph: nx.DiGraph, node: int, below_node: int, predicate: Expr) -> None:
    """Move the filter at ``node`` below its input, now testing ``predicate``."""
    where = op(graph, node)
    assert isinstance(where, Where)
    schema = op(graph, input_of(graph, below_node)).schema
    bypass(graph, node)
    insert_below(graph, below_node, 0,
                 dataclasses.replace(where, schema=schema, predicate=predicate))


def _through_join(graph: nx.DiGraph, node: int, below_node: int,
                  context: RewriteContext) -> bool:
    where, join = op(graph, node), op(graph, below_node)
    assert isinstance(where, Where) and isinstance(join, Join)
    reads, text = where.predicate.columns(), f"`{where.describe()}`"
    added = frozenset(join.added)
    if not reads & added:
        _swap(graph, node, below_node, where.predicate)
        context.fired(RULE, f"moved {text} below `{join.describe()}`, which does not add the "
                            "columns it reads")
        return True
    if not reads <= added:
        own = ", ".join(sorted(reads - added))
        context.declined(RULE, f"{text} stays above `{join.describe()}`: it reads the table's "
                               f"columns and the record's ({own}) together")
        return False
    if join.how == "left" and where.predicate.evaluate(dict.fromkeys(join.added)) is True:
        context.declined(RULE, f"{text} stays above `{join.describe()}`: it keeps the records "
                               "the left join finds no row for (NULL columns)")
        return False
    keys = [k for k, row in join.table.index(join.on).items()
            if where.predicate.evaluate(row) is True]
    if len(keys) > MAX_PUSHED_KEYS:
        context.declined(RULE, f"{text} stays above `{join.describe()}`: {len(keys):,} table "
                               f"rows pass it, more than the {MAX_PUSHED_KEYS:,} keys a filter "
                               "below the join may list")
        return False
    predicate = IsIn(Col(join.on), tuple(sorted(keys)))
    _swap(graph, node, below_node, predicate)
    context.fired(RULE, f"moved {text} below `{join.describe()}` as `where {predicate}` (the "
                        f"{join.on} of the {len(keys):,} table rows that pass it)")
    return True


def _through_map(graph: nx.DiGraph, node: int, below_node: int, context: RewriteContext) -> None:
    where, below = op(graph, node), op(graph, below_node)
    assert isinstance(where, Where) and isinstance(below, WithColumn | Select)
    columns = {below.name: below.expr} if isinstance(below, WithColumn) else dict(below.columns)
    predicate = where.predicate.substitute(columns)
    writes = below.writes or frozenset()
    solved = solve(predicate, op(graph, input_of(graph, below_node)).schema) if (
        where.predicate.columns() & writes) else None
    exact = solved is None or solved[1]
    if solved is not None:
        predicate = solved[0]
    text = f"moved `{where.describe()}` below `{below.describe()}`"
    if exact:
        _swap(graph, node, below_node, predicate)
        context.fired(RULE, text + ("" if predicate.same_as(where.predicate) else
                                    f" as `where {predicate}`"))
        return
    # The solved filter is relaxed: push it, and keep the original above as the exact check.
    schema = op(graph, input_of(graph, below_node)).schema
    insert_below(graph, below_node, 0,
                 dataclasses.replace(where, schema=schema, predicate=predicate))
    replace(graph, node, dataclasses.replace(where, pinned=True))
    context.fired(RULE, f"{text} as `where {predicate}` (relaxed; the exact check stays above)")
