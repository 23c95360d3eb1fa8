"""A single node is a cluster of one: the broker takes the same paths alone as in a
cluster, and what differs is its role's (semel.broker.node_role). A branch between the
two elsewhere in semel/broker would be an `is None` / `is not None` test of a cluster
object (the cluster view, the replica manager, the cluster member, or a local name for
one); this test finds them and fails when a change adds one. (A local list named
`replicas` would be counted too: the count errs on the high side.)"""
from __future__ import annotations

import ast
from pathlib import Path

import semel

BROKER = Path(semel.__file__).parent / "broker"
CLUSTER_OBJECTS = frozenset({"cluster", "replicas", "cluster_member"})
LOCAL_NAMES = CLUSTER_OBJECTS | {"view", "member"}
# Where the two roles differ, by design (semel.broker.node_role): a cluster member's own
# state there (joined or not) is no branch between a single node and a cluster.
ROLES = BROKER / "node_role.py"


def _names_a_cluster_object(node: ast.AST) -> bool:
    """`services.cluster`, `self.replicas`, `ctx.services.cluster_member`, or a local
    `view`, `replicas`, `member`."""
    if isinstance(node, ast.Attribute):
        return node.attr in CLUSTER_OBJECTS
    return isinstance(node, ast.Name) and node.id in LOCAL_NAMES


def _is_none_tests(tree: ast.AST) -> list[int]:
    """Lines of `X is None` / `X is not None` where X names a cluster object."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Compare) and len(node.ops) == 1
            and isinstance(node.ops[0], (ast.Is, ast.IsNot))
            and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None
            and _names_a_cluster_object(node.left)]


def branches() -> list[str]:
    return [f"{path.relative_to(BROKER.parent.parent)}:{line}"
            for path in sorted(BROKER.rglob("*.py")) if path != ROLES for line in _is_none_tests(ast.parse(path.read_text()))]


def test_the_broker_does_not_branch_on_the_cluster():
    found = branches()
    assert found == [], "\n".join(found)


def test_the_count_sees_what_it_counts():
    code = ("if broker.cluster is None: pass\n"
            "if self.replicas is not None: pass\n"
            "if ctx.broker.cluster_member is None: pass\n"
            "if broker.logs is None: pass\n"
            "if broker.cluster == None: pass\n"
            "if view is None: pass\n"
            "if replicas.isr is None: pass\n")
    assert _is_none_tests(ast.parse(code)) == [1, 2, 3, 6]
