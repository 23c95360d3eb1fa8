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

import semel

ROOT = Path(semel.__file__).parent

# layer -> the other layers it may import (docs/architecture.md); a layer may always
# import itself. "semel" is the package's own __init__ and __main__.
ALLOWED: dict[str, frozenset[str]] = {
    "protocol": frozenset(),
    "storage": frozenset({"protocol"}),
    "client": frozenset({"protocol"}),
    "coordinator": frozenset({"protocol", "storage"}),
    "cluster": frozenset({"protocol", "storage", "client"}),
    "broker": frozenset({"protocol", "storage", "coordinator", "cluster", "client"}),
    "eos": frozenset({"protocol", "client"}),
    "spark": frozenset({"protocol", "client", "eos"}),
    "check": frozenset({"protocol", "client", "eos"}),
    "demo": frozenset({"protocol", "client", "eos", "spark"}),
    "cli": frozenset({"protocol", "storage", "client", "coordinator", "cluster", "broker", "eos", "spark",
                      "check", "demo"}),
    "semel": frozenset({"cli"}),
}

# Upward imports that exist today, each (importer, imported). The list may only
# shrink: an entry that no longer exists fails the test, so remove it with the import.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset({
    # Kafka refusals and credentials that belong to the broker layer, built in cluster/.
    ("semel.cluster.security", "semel.broker.auth.acl"),
    ("semel.cluster.security", "semel.broker.auth.users"),
    # Process launchers (etcd, a local cluster) that belong beside cli/process.py,
    # and so the check's cluster mode that uses one.
    ("semel.cluster.etcd", "semel.cli.process"),
    ("semel.cluster.local", "semel.cli.process"),
    ("semel.cluster.local", "semel.broker.config"),
    ("semel.check.cluster", "semel.cluster.local"),
})


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
    """Strongly connected sets of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        members.append(m)
                        if m == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    return "semel" if len(parts) == 1 or parts[1] == "__main__" else parts[1]


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets
            if layer(a) != layer(b) and layer(b) not in ALLOWED[layer(a)]}


def test_every_module_is_in_a_known_layer():
    assert {layer(m) for m in _modules()} <= set(ALLOWED)


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_no_import_against_the_layer_order():
    assert sorted(upward(import_graph()) - KNOWN_VIOLATIONS) == []


def test_known_violations_are_still_there():
    """A violation removed from the code is removed from the list too."""
    assert sorted(KNOWN_VIOLATIONS - upward(import_graph())) == []


def test_the_checks_see_what_they_check():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    known = _modules()
    lazy = ast.parse("def f():\n    from ..cluster.txn_markers import MarkerChannel\n").body[0].body[0]
    assert _imported("semel.coordinator.txn", ROOT / "coordinator" / "txn.py", lazy, known) == [
        "semel.cluster.txn_markers"]
    assert ("semel.storage.log", "semel.broker.server") in upward({"semel.storage.log": {"semel.broker.server"}})
