"""Transaction dependency graph and its cycles (G0: write cycles; G1c: cycles
through a write-read edge).

Kafka does not order concurrent transactions: two producers whose
transactions overlap in time may interleave their records differently in two
partitions, and a correct broker still commits both. Jepsen's write-write
edges taken straight from offset order would therefore find G0 in every
healthy run. We keep only edges that a correct broker guarantees, each one
implying "A's fate (commit or abort) was fixed before B's":

ww  A's record precedes B's record in some key's offset order, and A and B did
    not overlap: A completed before B was invoked, or both ran under the same
    transactional id (a later incarnation fences the earlier one at start).
wr  B is a transaction that read, at read_committed, a record A wrote. The
    read happened before B asked to commit.

A cycle of such edges is impossible on a correct broker. Writers the client
certainly aborted are left out (reading them is an aborted read already).
"""
from __future__ import annotations

from .facts import ABORTED, READ_COMMITTED, Facts, isolation_of
from .history import Op

WINDOW = 32      # how far along a key's log we look for a non-overlapping writer
MAX_CYCLES = 20  # cycles reported per class


def _txn_id(op: Op):
    return op.extra.get("txn_id")


def precedes(a: Op, b: Op) -> bool:
    """A's fate was fixed before B began, on any correct broker."""
    if a.type != "info" and a.time < b.invoke_time:
        return True
    ta = _txn_id(a)
    return ta is not None and ta == _txn_id(b) and a.invoke_time < b.invoke_time


class Graph:
    def __init__(self):
        self.out: dict = {}     # id(op) -> {id(op): label}
        self.ops: dict = {}     # id(op) -> Op

    def add(self, a: Op, b: Op, kind: str, key, values) -> None:
        if a is b:
            return
        self.ops[id(a)] = a
        self.ops[id(b)] = b
        edges = self.out.setdefault(id(a), {})
        edges.setdefault(id(b), {"type": kind, "key": key, "values": values})
        self.out.setdefault(id(b), {})

    def subgraph(self, kind: str) -> "Graph":
        g = Graph()
        g.ops = self.ops
        for a, edges in self.out.items():
            g.out.setdefault(a, {})
            for b, label in edges.items():
                if label["type"] == kind:
                    g.out[a][b] = label
                    g.out.setdefault(b, {})
        return g


def build_graph(facts: Facts) -> Graph:
    g = Graph()
    writers = {}
    for (key, value), op in facts.writer_of.items():
        if facts.status(op) != ABORTED:
            writers[(key, value)] = op
    for key, order in facts.all_order.items():
        seq = [(o, v, writers.get((key, v))) for o, v in zip(order.offsets, order.values)]
        seq = [s for s in seq if s[2] is not None]
        for i, (o1, v1, a) in enumerate(seq):
            for o2, v2, b in seq[i + 1:i + 1 + WINDOW]:
                if b is a:
                    continue
                forward, backward = precedes(a, b), precedes(b, a)
                if forward or backward:
                    g.add(a, b, "ww", key, [v1, v2])
                if forward:
                    break  # later ones follow from this edge on a correct broker
    for op in facts.reading_ops():
        if not op.sends or isolation_of(op) != READ_COMMITTED:
            continue  # a reader that wrote nothing cannot close a cycle
        for r in op.reads:
            w = writers.get((r.key, r.value))
            if w is not None:
                g.add(w, op, "wr", r.key, [r.value])
    return g


def sccs(g: Graph) -> list[list]:
    """Tarjan's strongly connected components, iteratively (histories are long)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in g.out:
        if root in index:
            continue
        work = [(root, iter(g.out[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(g.out[nxt])))
                    advanced = True
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def _path(g: Graph, src, dst, allowed: set) -> list | None:
    """Shortest path src -> dst inside `allowed` (breadth first)."""
    prev = {src: None}
    frontier = [src]
    while frontier:
        nxt_frontier = []
        for n in frontier:
            for m in g.out.get(n, {}):
                if m in allowed and m not in prev:
                    prev[m] = n
                    if m == dst:
                        path = [m]
                        while prev[path[-1]] is not None:
                            path.append(prev[path[-1]])
                        return path[::-1]
                    nxt_frontier.append(m)
        frontier = nxt_frontier
    return None


def _describe(g: Graph, cycle: list) -> list:
    steps = []
    for a, b in zip(cycle, cycle[1:]):
        label = g.out[a][b]
        steps.append({"from": g.ops[a].ref(), "to": g.ops[b].ref(), "edge": label["type"],
                      "key": label["key"], "values": label["values"]})
    return steps


def find_cycles(facts: Facts) -> dict:
    g = build_graph(facts)
    found = {"G0": [], "G1c": []}
    ww = g.subgraph("ww")
    for comp in sccs(ww):
        if len(found["G0"]) >= MAX_CYCLES:
            break
        members = set(comp)
        start = comp[0]
        for nxt in ww.out[start]:
            if nxt in members:
                back = _path(ww, nxt, start, members)
                if back:
                    found["G0"].append({"steps": _describe(ww, [start] + back)})
                    break
    for comp in sccs(g):
        if len(found["G1c"]) >= MAX_CYCLES:
            break
        members = set(comp)
        cycle = None
        for a in comp:
            for b, label in g.out[a].items():
                if label["type"] == "wr" and b in members:
                    back = _path(g, b, a, members)
                    if back:
                        cycle = [a] + back
                        break
            if cycle:
                break
        if cycle:
            found["G1c"].append({"steps": _describe(g, cycle)})
    return found
