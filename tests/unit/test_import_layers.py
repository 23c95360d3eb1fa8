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
    "testing": frozenset({"protocol", "client", "launch"}),
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


def _imported_modules(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The semel modules an import statement names (a `from` import's module itself)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "semel"]
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        return [".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))]
    return [node.module] if node.module and node.module.split(".")[0] == "semel" else []


def unresolved_imports() -> list[str]:
    """Imports of semel modules that do not exist (mypy ignores missing imports, and the
    layer graph would count one as its package)."""
    known = _modules()
    return [f"{module}: {name} (line {node.lineno})"
            for module, path in known.items()
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in _imported_modules(module, path, node) if name not in known]


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


def test_every_semel_import_names_a_module_that_exists():
    assert unresolved_imports() == []


def test_an_import_of_a_removed_module_is_seen():
    code = "from ..cluster.gone import x\nimport semel.nowhere\nfrom . import notify\n"
    tree = ast.parse(code)
    path = ROOT / "broker" / "x.py"
    names = [n for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
             for n in _imported_modules("semel.broker.x", path, node)]
    assert names == ["semel.cluster.gone", "semel.nowhere", "semel.broker"]
    assert not {"semel.cluster.gone", "semel.nowhere"} & set(_modules())


def test_no_import_circle():
    assert circles(import_graph()) == []


def parts_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """`package`'s imports between its direct children, a subpackage taken whole."""
    depth = package.count(".") + 2

    def part(module: str) -> str | None:
        return ".".join(module.split(".")[:depth]) if module.startswith(package + ".") else None
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        if (pa := part(a)) is not None:
            out.setdefault(pa, set()).update(pb for b in targets if (pb := part(b)) not in (None, pa))
    return out


def test_no_import_circle_between_a_packages_parts():
    """A subpackage is one floor: nothing in it imports a sibling that imports it back
    (broker/auth's stores below the router, the gates that use the router beside it)."""
    graph, known = import_graph(), _modules()
    packages = sorted(m for m, path in known.items() if path.name == "__init__.py")
    found = {p: c for p in packages if (c := circles(parts_graph(graph, p)))}
    assert found == {}


def test_the_parts_check_sees_what_it_checks():
    graph = {"semel.b.auth.gate": {"semel.b.router"}, "semel.b.router": {"semel.b.auth.acl"},
             "semel.b.auth.acl": set(), "semel.b.x": {"semel.c"}}
    assert circles(parts_graph(graph, "semel.b")) == [["semel.b.auth", "semel.b.router"]]
    assert circles(graph) == []


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


# What the broker's modules reach by declared attributes: the broker, its services, a
# request context, a connection, and the cluster view (semel.cluster.state.ClusterView).
_DECLARED = {"broker", "services", "ctx", "conn", "connection", "view"}


def _untyped_reaches(tree: ast.AST, roots: set[str] = _DECLARED) -> list[str]:
    """`getattr(<one of roots>, "name", ...)` calls: a name read around the attribute's
    declaration, which neither a type checker nor a rename sees."""
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


def test_the_broker_connections_and_cluster_view_are_read_by_their_declared_attributes():
    paths = [p for package in ("broker", "cluster", "coordinator") for p in sorted((ROOT / package).rglob("*.py"))]
    found = {str(path.relative_to(ROOT)): hits for path in paths
             if (hits := _untyped_reaches(ast.parse(path.read_text(), str(path))))}
    assert found == {}


def test_the_attribute_check_sees_what_it_checks():
    tree = ast.parse('l1 = getattr(ctx.connection, "listener", None)\n'
                     'b = getattr(ctx.broker, "replicas", None)\n'
                     'c = getattr(conn, "listener", None)\n'
                     's = getattr(ctx.services, "replicas", None)\n'
                     'x = getattr(ctx, "services")\n'
                     'v = getattr(self.view, "lease_ttl_s", None)\n'
                     'fine = getattr(topic, "topic_id", None)\n')
    assert [hit.split(" at ")[0] for hit in _untyped_reaches(tree)] == [
        "getattr(ctx.connection, 'listener', None)", "getattr(ctx.broker, 'replicas', None)",
        "getattr(conn, 'listener', None)", "getattr(ctx.services, 'replicas', None)", "getattr(ctx, 'services')",
        "getattr(self.view, 'lease_ttl_s', None)"]


# What a handler reaches the broker through: the request context and its services.
_BROKER_NAMES = {"broker", "services", "ctx"}
# The modules that handle requests: the handlers and the gates around them.
_HANDLING = ["handlers", "router.py", "coordinator_gate.py", "auth_gate.py", "auth_check.py"]


def _untyped_broker(tree: ast.AST) -> list[str]:
    """A request's way to the broker left untyped: a parameter or attribute named
    `broker`, `services` or `ctx` annotated `Any` (or, for a parameter, not annotated:
    an implicit Any), and `.broker` read off a request context."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            out += [f"{node.name}({a.arg}: {ast.unparse(a.annotation) if a.annotation else 'unannotated'})"
                    for a in params if a.arg in _BROKER_NAMES
                    and (a.annotation is None or "Any" in ast.unparse(a.annotation))]
        elif isinstance(node, ast.AnnAssign):
            name = node.target.attr if isinstance(node.target, ast.Attribute) else getattr(node.target, "id", None)
            if name in _BROKER_NAMES and "Any" in ast.unparse(node.annotation):
                out.append(f"{ast.unparse(node.target)}: {ast.unparse(node.annotation)}")
        elif isinstance(node, ast.Attribute) and node.attr == "broker" and ast.unparse(node.value) == "ctx":
            out.append("ctx.broker")
    return out


def test_handlers_reach_the_broker_through_typed_services():
    paths = [p for entry in _HANDLING for p in sorted((ROOT / "broker").glob(entry if entry.endswith(".py")
                                                                              else f"{entry}/*.py"))]
    assert len(paths) > 10
    found = {str(p.relative_to(ROOT)): hits for p in paths if (hits := _untyped_broker(ast.parse(p.read_text())))}
    assert found == {}
    router = ast.parse((ROOT / "broker" / "router.py").read_text())
    context = next(n for n in router.body if isinstance(n, ast.ClassDef) and n.name == "RequestContext")
    fields = {ast.unparse(n.target): ast.unparse(n.annotation) for n in context.body if isinstance(n, ast.AnnAssign)}
    assert fields["services"] == "Services" and "broker" not in fields


def test_the_services_check_sees_what_it_checks():
    tree = ast.parse("def h(ctx, body): ...\n"
                     "def g(ctx: RequestContext, services: Any): ...\n"
                     "class C:\n    broker: Any\n    services: Services\n"
                     "x = ctx.broker.logs\n"
                     "def fine(ctx: RequestContext, services: Services, other): ...\n")
    assert _untyped_broker(tree) == ["h(ctx: unannotated)", "g(services: Any)", "broker: Any", "ctx.broker"]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_imports(module: str, path: Path, tree: ast.AST) -> list[str]:
    """`from <a semel module> import _name`, and `mod._name` of a semel module imported
    as `mod`: a name another module keeps to itself."""
    known, out, aliases = _modules(), [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.asname and a.name in known}
        if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("semel")):
            continue
        out += [f"{'.' * node.level}{node.module or ''} import {a.name} (line {node.lineno})"
                for a in node.names if _private(a.name)]
        targets = _imported(module, path, node, known)
        aliases |= {a.asname or a.name for a in node.names if any(t.endswith(f".{a.name}") for t in targets)}
    out += [f"{ast.unparse(node)} (line {node.lineno})" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
            and node.value.id in aliases]
    return out


def test_no_module_imports_a_private_name_of_another():
    found = {module: hits for module, path in sorted(_modules().items())
             if (hits := _private_imports(module, path, ast.parse(path.read_text(), str(path))))}
    assert found == {}


def test_the_private_name_check_sees_what_it_checks():
    tree = ast.parse("from .groups import _answer, handler\n"
                     "from semel.spark.routing import _connect\n"
                     "from ._native import __version__\n"
                     "from collections import _chain\n"
                     "from semel.spark import routing as r, options\n"
                     "import semel.spark.decision as d\n"
                     "x = r._init(options._parse, d._join, self._own)\n")
    assert _private_imports("semel.broker.handlers.x", ROOT / "broker" / "handlers" / "x.py", tree) == [
        ".groups import _answer (line 1)", "semel.spark.routing import _connect (line 2)",
        "r._init (line 7)", "options._parse (line 7)", "d._join (line 7)"]
