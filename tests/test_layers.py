"""The package's structure, read from its code: no import circles, each layer importing only
the layers below it, and no module too long to read.

Every import counts — at module level, inside a function, under ``TYPE_CHECKING`` — since
each is a dependency between the modules either way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "jetstream"

#: The layers, lowest first; a module belongs to the layer of the longest prefix it matches.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("jetstream.errors", "jetstream.units", "jetstream.schema",
                     "jetstream.trace", "jetstream.windows", "jetstream.expr",
                     "jetstream.tables", "jetstream.formats", "jetstream.events",
                     "jetstream.results",
                     "jetstream.security", "jetstream.approx.summaries")),
    # The DSL, its plans, their rewrites and the reference executor; the query's codecs.
    ("the query", ("jetstream", "jetstream.approx")),
    ("the aggregation tree", ("jetstream.aggtree",)),
    # What a local stage makes and the data plane carries.
    ("partial batches", ("jetstream.dataplane.partials", "jetstream.dataplane.keydict",
                         "jetstream.dataplane.codec")),
    ("the local stage", ("jetstream.stage",)),
    ("the data plane", ("jetstream.dataplane", "jetstream.metrics")),
    ("the control plane", ("jetstream.control",)),
    ("the command line", ("jetstream.cli", "jetstream.__main__")),
    ("the lab", ("jetstream.lab",)),
]

#: The longest a module of ours may be (generated code aside).
MAX_LINES = 600


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "v1" in parts:  # generated protobuf code
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports() -> nx.DiGraph:
    """Module -> the modules of ours it imports."""
    known = modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known and target != name:
                    graph.add_edge(name, target)
    return graph


def layer(module: str) -> int:
    matches = [(len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS)
               for prefix in prefixes if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} is in no layer: add it to LAYERS"
    return max(matches)[1]


def test_no_module_imports_another_that_imports_it_back() -> None:
    circles = [sorted(c) for c in nx.strongly_connected_components(imports()) if len(c) > 1]
    assert not circles, circles


def test_each_layer_imports_only_the_layers_below_it() -> None:
    climbing = []
    for a, b in imports().edges:
        if layer(b) > layer(a):
            climbing.append(f"{a} ({LAYERS[layer(a)][0]}) imports {b} ({LAYERS[layer(b)][0]})")
    assert not climbing, "\n".join(sorted(climbing))


def test_the_product_never_imports_the_lab() -> None:
    # The CLI finds the lab's commands through an entry point (jetstream.commands).
    into_lab = {(a, b) for a, b in imports().edges
                if b.startswith("jetstream.lab") and not a.startswith("jetstream.lab")}
    assert not into_lab, into_lab


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_is_too_long_to_read(name: str) -> None:
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name}: {lines} lines"
