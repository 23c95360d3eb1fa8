"""What a history tells us, indexed once for every analysis.

Offsets come from two witnesses: a producer's delivery report (where its
record landed) and a consumer's poll (where it found a record). Both feed one
log per key: offset -> set of values. Nothing here judges; the analyses do.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .history import READ_COMMITTED, History, Op

COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"


def writer_status(op: Op) -> str:
    """ok: the commit (or plain send) was acknowledged; fail: it certainly did not
    take effect (the client aborted it, or the send was refused); info: unknown."""
    return {"ok": COMMITTED, "fail": ABORTED}.get(op.type, UNKNOWN)


def isolation_of(op: Op) -> str:
    # A poll without a stated isolation is held to the stricter standard.
    return op.isolation or READ_COMMITTED


@dataclass
class Order:
    """The offsets of one key's values, sorted, for "what lies between" questions."""

    offsets: list = field(default_factory=list)
    values: list = field(default_factory=list)

    def between(self, lo: int, hi: int) -> list:
        """Values at offsets strictly between lo and hi."""
        i = bisect.bisect_right(self.offsets, lo)
        j = bisect.bisect_left(self.offsets, hi)
        return self.values[i:j]

    def below(self, hi: int) -> list:
        return self.values[:bisect.bisect_left(self.offsets, hi)]


@dataclass
class Facts:
    history: History
    writer_of: dict = field(default_factory=dict)       # (key, value) -> Op that sent it
    keys_of_value: dict = field(default_factory=dict)   # value -> set of keys it was sent to
    log: dict = field(default_factory=dict)             # key -> {offset: set(values)}
    first_offset: dict = field(default_factory=dict)    # (key, value) -> lowest offset seen
    readers_of: dict = field(default_factory=dict)      # (key, value) -> [Op] that read it
    seen_rc: set = field(default_factory=set)           # (key, value) read at read_committed
    seen_any: set = field(default_factory=set)
    bound_rc: dict = field(default_factory=dict)        # key -> (offset, reader Op) highest rc read
    bound_ru: dict = field(default_factory=dict)
    rc_order: dict = field(default_factory=dict)        # key -> Order of values that must be visible
    all_order: dict = field(default_factory=dict)       # key -> Order of every value in the log
    committed_ops: set = field(default_factory=set)     # id(op) of writers that must have committed

    def status(self, op: Op) -> str:
        return writer_status(op)

    def must_have_committed(self, op: Op) -> bool:
        return id(op) in self.committed_ops

    def reading_ops(self) -> list[Op]:
        return [op for op in self.history.ops if op.reads]

    def writing_ops(self) -> list[Op]:
        return [op for op in self.history.ops if op.sends]


def _add_to_log(facts: Facts, key, offset: int, value: int) -> None:
    facts.log.setdefault(key, {}).setdefault(offset, set()).add(value)
    kv = (key, value)
    cur = facts.first_offset.get(kv)
    if cur is None or offset < cur:
        facts.first_offset[kv] = offset


def gather(history: History) -> Facts:
    facts = Facts(history)
    for op in history.ops:
        for s in op.sends:
            # A value is sent once; if a history repeats it, the first sender is its writer.
            facts.writer_of.setdefault((s.key, s.value), op)
            facts.keys_of_value.setdefault(s.value, set()).add(s.key)
            if s.offset is not None and s.offset >= 0:
                _add_to_log(facts, s.key, s.offset, s.value)
    for op in history.ops:
        rc = isolation_of(op) == READ_COMMITTED
        bound = facts.bound_rc if rc else facts.bound_ru
        for r in op.reads:
            kv = (r.key, r.value)
            _add_to_log(facts, r.key, r.offset, r.value)
            facts.readers_of.setdefault(kv, []).append(op)
            facts.seen_any.add(kv)
            if rc:
                facts.seen_rc.add(kv)
            if r.key not in bound or r.offset > bound[r.key][0]:
                bound[r.key] = (r.offset, op)
    _decide_commits(facts)
    _build_orders(facts)
    return facts


def _decide_commits(facts: Facts) -> None:
    """A writer must have committed if it was acknowledged, or if its outcome is
    unknown but a read_committed reader saw one of its records."""
    for op in facts.writing_ops():
        st = writer_status(op)
        if st == COMMITTED or (st == UNKNOWN and any((s.key, s.value) in facts.seen_rc for s in op.sends)):
            facts.committed_ops.add(id(op))


def _build_orders(facts: Facts) -> None:
    for key, offsets in facts.log.items():
        rc, every = Order(), Order()
        for offset in sorted(offsets):
            for value in sorted(offsets[offset]):
                if facts.first_offset[(key, value)] != offset:
                    continue  # a duplicate: counted once, at its first offset
                every.offsets.append(offset)
                every.values.append(value)
                w = facts.writer_of.get((key, value))
                if w is not None and facts.must_have_committed(w):
                    rc.offsets.append(offset)
                    rc.values.append(value)
        facts.rc_order[key] = rc
        facts.all_order[key] = every
