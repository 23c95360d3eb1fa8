"""The anomaly analyses of Jepsen's Kafka workload, as pure functions of the facts.

Each analysis returns a list of cases (JSON-able dicts). An empty list means
that analysis found nothing. Definitions (the docs repeat them with examples):

aborted-read        a read_committed poll returned a record of a transaction
                    the client certainly aborted.
lost-write          a record that must have committed sits below a record some
                    reader of that isolation returned, yet no such reader ever
                    returned it.
duplicate           one value found at two or more offsets of a key.
inconsistent-offsets  two or more values found at one offset of a key.
poll-skip           one consumer process read offset a, then offset b > a of
                    the same key with no reassignment in between, while a record
                    it should have seen lies between a and b.
nonmonotonic-poll   ... read offset a, then b <= a (goes back or repeats).
nonmonotonic-send   one producer process learned offset a for a send, then
                    b <= a for a later send to the same key.
precommitted-read   a transaction read its own uncommitted records, or a
                    read_committed poll returned a record before its writer
                    even asked the broker to commit.
unseen              records of acknowledged commits no read_committed poll
                    returned by the end of the run (the run ends with a drain).
torn-transaction    a read_committed reader saw some of a transaction's records
                    while readers moved past others of it without seeing them.
unexpected-value    a poll returned a value nobody sent to that key.
G0, G1c             cycles in the transaction dependency graph (see graph.py).
incomplete          the run could not finish its fence or drain (a broker that
                    stopped answering, a stuck last stable offset): the other
                    analyses saw less than they should, so no clean verdict.
"""
from __future__ import annotations

from .facts import ABORTED, READ_COMMITTED, Facts, isolation_of
from .graph import find_cycles
from .history import NEMESIS, Op

SAMPLE = 8  # values listed per case where a case concerns many


def _vals(values: list) -> dict:
    return {"values": list(values[:SAMPLE]), "count": len(values)}


def aborted_reads(facts: Facts) -> list:
    cases = []
    for op in facts.reading_ops():
        if isolation_of(op) != READ_COMMITTED:
            continue
        for r in op.reads:
            w = facts.writer_of.get((r.key, r.value))
            if w is not None and facts.status(w) == ABORTED:
                cases.append({"key": r.key, "offset": r.offset, "value": r.value,
                              "writer": w.ref(), "reader": op.ref()})
    return cases


def unexpected_values(facts: Facts) -> list:
    cases = []
    for op in facts.reading_ops():
        for r in op.reads:
            if (r.key, r.value) in facts.writer_of:
                continue
            elsewhere = sorted(facts.keys_of_value.get(r.value, ()), key=str)
            cases.append({"key": r.key, "offset": r.offset, "value": r.value, "reader": op.ref(),
                          "sent_to": elsewhere})
    return cases


def inconsistent_offsets(facts: Facts) -> list:
    cases = []
    for key, offsets in facts.log.items():
        for offset, values in sorted(offsets.items()):
            if len(values) > 1:
                cases.append({"key": key, "offset": offset, "values": sorted(values)})
    return cases


def duplicates(facts: Facts) -> list:
    where: dict = {}
    for key, offsets in facts.log.items():
        for offset, values in offsets.items():
            for v in values:
                where.setdefault((key, v), []).append(offset)
    cases = []
    for (key, value), offsets in sorted(where.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        if len(offsets) > 1:
            cases.append({"key": key, "value": value, "offsets": sorted(offsets)})
    # A value found under a key it was never sent to is a duplicate across partitions.
    for value, keys in facts.keys_of_value.items():
        if len(keys) > 1:
            cases.append({"value": value, "keys": sorted(keys, key=str)})
    return cases


def lost_writes(facts: Facts) -> list:
    cases = []
    for iso, bounds in ((READ_COMMITTED, facts.bound_rc), ("read_uncommitted", facts.bound_ru)):
        seen = facts.seen_rc if iso == READ_COMMITTED else facts.seen_any
        for key, (bound, reader) in bounds.items():
            order = facts.rc_order.get(key)
            if order is None:
                continue
            for value in order.below(bound):
                if (key, value) in seen:
                    continue
                w = facts.writer_of[(key, value)]
                cases.append({"key": key, "value": value, "offset": facts.first_offset[(key, value)],
                              "isolation": iso, "writer": w.ref(), "read_past_by": reader.ref(),
                              "read_past_offset": bound})
    return cases


def _reset_keys(op: Op) -> set:
    return {k for keys in op.rebalance for k in keys}


def poll_order_cases(facts: Facts) -> tuple[list, list]:
    """poll-skip and nonmonotonic-poll, per consumer process, in and across ops."""
    skips, backs = [], []
    for process, ops in facts.history.by_process().items():
        last: dict = {}  # key -> (offset, value, op)
        for op in ops:
            if op.f in ("assign", "subscribe"):
                if op.type == "ok":
                    last = {}  # a new assignment may legally start anywhere
                continue
            # A rebalance restarts its keys from the committed offsets, also when the
            # poll that reports it returned nothing (a whole-cluster outage: the commit
            # before it failed, so the records after the committed offsets come again).
            for k in _reset_keys(op):
                last.pop(k, None)
            if not op.reads:
                continue
            order = facts.rc_order if isolation_of(op) == READ_COMMITTED else facts.all_order
            for key, reads in op.reads_by_key().items():
                prev = last.get(key)
                for r in reads:
                    if prev is not None:
                        case = _compare_polls(order.get(key), key, prev, r, op)
                        if case is not None:
                            (skips if case.pop("kind") == "skip" else backs).append(case)
                    prev = (r.offset, r.value, op)
                last[key] = prev
    return skips, backs


def _compare_polls(order, key, prev, r, op) -> dict | None:
    o1, v1, op1 = prev
    base = {"key": key, "process": op.process, "from": [o1, v1], "to": [r.offset, r.value],
            "within_op": op1 is op, "ops": [op1.ref()] if op1 is op else [op1.ref(), op.ref()]}
    if r.offset <= o1:
        return dict(base, kind="back", delta=r.offset - o1)
    missed = order.between(o1, r.offset) if order is not None else []
    if missed:
        return dict(base, kind="skip", skipped=_vals(missed))
    return None


def nonmonotonic_sends(facts: Facts) -> list:
    cases = []
    for process, ops in facts.history.by_process().items():
        last: dict = {}  # key -> (offset, value, op)
        for op in ops:
            for s in op.sends:
                if s.offset is None or s.offset < 0:
                    continue
                prev = last.get(s.key)
                if prev is not None and s.offset <= prev[0]:
                    cases.append({"key": s.key, "process": process, "from": [prev[0], prev[1]],
                                  "to": [s.offset, s.value], "within_op": prev[2] is op,
                                  "ops": [prev[2].ref(), op.ref()]})
                last[s.key] = (s.offset, s.value, op)
    return cases


def precommitted_reads(facts: Facts) -> list:
    cases = []
    for op in facts.reading_ops():
        own = {(s.key, s.value) for s in op.sends}
        for r in op.reads:
            kv = (r.key, r.value)
            if kv in own:
                cases.append({"kind": "own-write", "key": r.key, "value": r.value, "offset": r.offset,
                              "op": op.ref()})
                continue
            if isolation_of(op) != READ_COMMITTED:
                continue
            w = facts.writer_of.get(kv)
            if w is None or w is op or w.f != "txn" or facts.status(w) == ABORTED or w.commit_ns is None:
                continue
            # op.time is when we learned of the read: the read itself was no later.
            if op.time < w.commit_ns:
                cases.append({"kind": "before-commit", "key": r.key, "value": r.value, "offset": r.offset,
                              "reader": op.ref(), "writer": w.ref(), "commit_ns": w.commit_ns})
    return cases


def unseen(facts: Facts) -> list:
    """Acknowledged values no read_committed poll returned."""
    if not facts.seen_rc and not facts.bound_rc:
        return []  # no read_committed reader at all: nothing to judge with
    cases = []
    for op in facts.writing_ops():
        if op.type != "ok":
            continue
        missing = [s for s in op.sends if (s.key, s.value) not in facts.seen_rc]
        for s in missing:
            cases.append({"key": s.key, "value": s.value, "offset": s.offset, "writer": op.ref()})
    return cases


def unseen_series(facts: Facts) -> list:
    """(time, key -> count of acknowledged-but-not-yet-read values), for the plot."""
    events = []
    for op in facts.history.ops:
        if op.type == "ok" and op.sends:
            events.append((op.time, 0, op))
        if op.reads and isolation_of(op) == READ_COMMITTED:
            events.append((op.time, 1, op))
    events.sort(key=lambda e: (e[0], e[1]))
    sent, read = set(), set()
    counts: dict = {}
    series = []
    for t, kind, op in events:
        if kind == 0:
            for s in op.sends:
                kv = (s.key, s.value)
                if kv not in read:
                    sent.add(kv)
                    counts[s.key] = counts.get(s.key, 0) + 1
        else:
            for r in op.reads:
                kv = (r.key, r.value)
                read.add(kv)
                if kv in sent:
                    sent.discard(kv)
                    counts[r.key] -= 1
        series.append((t, dict(counts)))
    return series


def torn_transactions(facts: Facts) -> list:
    cases = []
    for op in facts.writing_ops():
        if op.f != "txn" or len(op.sends) < 2:
            continue
        seen, passed = [], []
        for s in op.sends:
            kv = (s.key, s.value)
            if kv in facts.seen_rc:
                seen.append([s.key, s.value])
                continue
            offset = facts.first_offset.get(kv)
            bound = facts.bound_rc.get(s.key)
            if offset is not None and bound is not None and offset < bound[0]:
                passed.append([s.key, s.value, offset])
        if seen and passed:
            cases.append({"writer": op.ref(), "seen": seen[:SAMPLE], "passed_over": passed[:SAMPLE],
                          "seen_count": len(seen), "passed_over_count": len(passed)})
    return cases


def incomplete(facts: Facts) -> list:
    """Phases the controller recorded as unfinished (its own events in the history)."""
    return [{"what": ev["f"], "detail": ev.get("value"), "time": ev.get("time", 0)}
            for ev in facts.history.events
            if ev.get("process") == NEMESIS and ev.get("f") in ("drain-incomplete", "fence-failed")]


# Report order: the most serious first.
ANALYSES = [
    "aborted-read", "lost-write", "duplicate", "inconsistent-offsets", "torn-transaction",
    "precommitted-read", "poll-skip", "nonmonotonic-poll", "nonmonotonic-send",
    "G0", "G1c", "unseen", "unexpected-value", "incomplete",
]


def run_all(facts: Facts) -> dict:
    skips, backs = poll_order_cases(facts)
    cycles = find_cycles(facts)
    return {
        "aborted-read": aborted_reads(facts),
        "lost-write": lost_writes(facts),
        "duplicate": duplicates(facts),
        "inconsistent-offsets": inconsistent_offsets(facts),
        "torn-transaction": torn_transactions(facts),
        "precommitted-read": precommitted_reads(facts),
        "poll-skip": skips,
        "nonmonotonic-poll": backs,
        "nonmonotonic-send": nonmonotonic_sends(facts),
        "G0": cycles["G0"],
        "G1c": cycles["G1c"],
        "unseen": unseen(facts),
        "unexpected-value": unexpected_values(facts),
        "incomplete": incomplete(facts),
    }
