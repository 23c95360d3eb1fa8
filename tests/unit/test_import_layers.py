"""The import direction of docs/architecture.md, checked over the source.

Every `import` and `from ... import` under semel/, at module level or inside a
function, is an edge between two modules. The test fails on a circle between modules
(a strongly connected set of more than one) and on an edge from one layer to another
that ALLOWED does not list. Lazy imports count: a circle or an upward import hidden
inside a function is still one.
"""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import semel
from semel.check.graph import sccs

ROOT = Path(semel.__file__).parent

# Modules below every layer, which every layer may import: they import nothing of semel.
BASE = frozenset({"backoff", "clock"})

# layer -> the other layers it may import (docs/architecture.md) besides BASE; a layer
# may always import itself. "semel" is the package's own __init__ and __main__.
ALLOWED: dict[str, frozenset[str]] = {
    "backoff": frozenset(),
    "clock": frozenset(),
    "protocol": frozenset(),
    "storage": frozenset({"protocol"}),
    "client": frozenset({"protocol"}),
    "coordinator": frozenset({"protocol", "storage"}),
    "cluster": frozenset({"protocol", "storage", "client"}),
    "broker": frozenset({"protocol", "storage", "coordinator", "cluster", "client"}),
    "eos": frozenset({"protocol", "client"}),
    "spark": frozenset({"protocol", "client", "eos"}),
    "launch": frozenset({"protocol", "client"}),
    "check": frozenset({"protocol", "client", "eos", "launch"}),
    "demo": frozenset({"protocol", "client", "eos", "spark"}),
    "console": frozenset({"protocol", "client"}),
    "cli": frozenset({"protocol", "storage", "client", "coordinator", "cluster", "broker", "eos", "spark",
                      "launch", "check", "demo", "console"}),
    "semel": frozenset({"cli"}),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("semel",) + path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(module: str, path: Path, node: ast.AST, known) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        # `from pkg import sub` imports the submodule; `from mod import name` the module.
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name not in known and "." in name:   # a name inside a module: the module
            name = name.rsplit(".", 1)[0]
        if name in known and name != module:
            out.append(name)
    return out


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module].update(_imported(module, path, node, known))
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (the checker's Tarjan)."""
    nodes = sorted(set(graph).union(*graph.values()))
    g = SimpleNamespace(out={n: dict.fromkeys(sorted(graph.get(n, ()))) for n in nodes})
    return sorted(sorted(c) for c in sccs(g))


def layer(module: str) -> str:
    parts = module.split(".")
    return "semel" if len(parts) == 1 or parts[1] == "__main__" else parts[1]


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets
            if layer(a) != layer(b) and layer(b) not in ALLOWED[layer(a)] | (BASE - {layer(a)})}


def test_every_module_is_in_a_known_layer():
    assert {layer(m) for m in _modules()} <= set(ALLOWED)


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_no_import_against_the_layer_order():
    assert sorted(upward(import_graph())) == []


def test_the_checks_see_what_they_check():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    known = _modules()
    lazy = ast.parse("def f():\n    from ..cluster.txn_markers import MarkerChannel\n").body[0].body[0]
    assert _imported("semel.coordinator.txn", ROOT / "coordinator" / "txn.py", lazy, known) == [
        "semel.cluster.txn_markers"]
    assert ("semel.storage.log", "semel.broker.server") in upward({"semel.storage.log": {"semel.broker.server"}})
    assert upward({"semel.coordinator.txn": {"semel.backoff"}}) == set()
    assert ("semel.backoff", "semel.protocol.errors") in upward({"semel.backoff": {"semel.protocol.errors"}})


def _untyped_reaches(tree: ast.AST) -> list[str]:
    """`getattr(<the broker or a connection>, "name", ...)` calls: a name read around the
    attribute's declaration, which neither a type checker nor a rename sees."""
    roots = {"broker", "conn", "connection"}
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and node.args):
            continue
        target = node.args[0]
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name in roots:
            out.append(f"{ast.unparse(node)} at line {node.lineno}")
    return out


def test_the_broker_and_connections_are_read_by_their_declared_attributes():
    found = {str(path.relative_to(ROOT)): hits for path in sorted((ROOT / "broker").rglob("*.py"))
             if (hits := _untyped_reaches(ast.parse(path.read_text(), str(path))))}
    assert found == {}


def test_the_attribute_check_sees_what_it_checks():
    tree = ast.parse('l1 = getattr(ctx.connection, "listener", None)\n'
                     'b = getattr(ctx.broker, "replicas", None)\n'
                     'c = getattr(conn, "listener", None)\n'
                     'fine = getattr(topic, "topic_id", None)\n')
    assert [hit.split(" at ")[0] for hit in _untyped_reaches(tree)] == [
        "getattr(ctx.connection, 'listener', None)", "getattr(ctx.broker, 'replicas', None)",
        "getattr(conn, 'listener', None)"]
