"""Branch transactions (semel's extension for the Spark sink's atomic micro-batches):
a parent joins ongoing branches with AddPartitionsToTxn of the pseudo-partition
(`__semel_branch:<branch id>`, 0), and its one decision commits or aborts them all.
Against a real broker, read back by a confluent-kafka read_committed consumer."""
from __future__ import annotations

import pytest

from semel.client import Client
from semel.client import txn as wire
from semel.client.admin import describe_transactions
from semel.protocol.errors import KafkaError
from tests.support.brokers import module_broker
from tests.support.consume import read_values
from tests.support.wait import until

E = KafkaError


@pytest.fixture(scope="module")
def br(tmp_path_factory):
    with module_broker(tmp_path_factory, "branches", "--transaction-abort-check-interval-ms", "100") as b:
        yield b


def join(c: Client, parent: wire.TxnState, *branches: str) -> dict:
    return wire.add_partitions(c, parent, [(f"__semel_branch:{b}", 0) for b in branches])


def open_branch(c: Client, txn_id: str, topic: str, partition: int, values: list[str],
                timeout_ms: int = 60_000) -> wire.TxnState:
    err, st = wire.init_producer_id(c, txn_id, timeout_ms)
    assert err == E.NONE
    assert wire.add_partitions(c, st, [(topic, partition)]) == {(topic, partition): E.NONE}
    err, _ = wire.produce(c, st, topic, partition, [(None, v.encode(), []) for v in values])
    assert err == E.NONE
    return st


def joined_pair(c: Client, name: str) -> tuple[str, wire.TxnState]:
    """Topic br-<name> with 2 partitions, branches <name>.b0/.b1 writing <name>0/<name>1
    to partitions 0/1, both joined to the parent <name>."""
    t = topic(c, f"br-{name}", 2)
    for p in (0, 1):
        open_branch(c, f"{name}.b{p}", t, p, [f"{name}{p}"])
    parent_st = parent(c, name)
    got = join(c, parent_st, f"{name}.b0", f"{name}.b1")
    assert set(got.values()) == {E.NONE}
    return t, parent_st


def parent(c: Client, txn_id: str, timeout_ms: int = 60_000) -> wire.TxnState:
    err, st = wire.init_producer_id(c, txn_id, timeout_ms)
    assert err == E.NONE
    return st


def topic(c: Client, name: str, partitions: int) -> str:
    c.create_topic(name, partitions)
    return name


def test_parent_commit_commits_every_branch_and_refuses_their_own_ending(br):
    with Client(br.bootstrap) as c:
        t = topic(c, "br-commit", 2)
        b0 = open_branch(c, "pc.b0", t, 0, ["x0", "x1"])
        b1 = open_branch(c, "pc.b1", t, 1, ["y0"])
        p = parent(c, "pc")
        assert join(c, p, "pc.b0", "pc.b1") == {("__semel_branch:pc.b0", 0): E.NONE,
                                                ("__semel_branch:pc.b1", 0): E.NONE}
        assert join(c, p, "pc.b0") == {("__semel_branch:pc.b0", 0): E.NONE}  # a retried join
        # joined: the branch's own EndTxn, AddPartitionsToTxn and produce are refused
        assert wire.end_txn(c, "pc.b0", b0.pid, b0.epoch, True) == E.CONCURRENT_TRANSACTIONS
        assert wire.add_partitions(c, b1, [(t, 0)]) == {(t, 0): E.CONCURRENT_TRANSACTIONS}
        assert wire.produce(c, b1, t, 1, [(None, b"late", [])])[0] == E.INVALID_TXN_STATE
        # another parent cannot take a joined branch
        q = parent(c, "pc2")
        assert join(c, q, "pc.b0")[("__semel_branch:pc.b0", 0)] == E.INVALID_TXN_STATE
        assert read_values(br.bootstrap, t, 2, idle_s=0.5) == []
        assert wire.end_txn(c, "pc", p.pid, p.epoch, True) == E.NONE
        assert sorted(read_values(br.bootstrap, t, 2, want=3)) == ["x0", "x1", "y0"]
        # completed with the parent: the branch's own commit now answers as a retry would
        assert wire.end_txn(c, "pc.b0", b0.pid, b0.epoch, True) == E.NONE
        assert wire.end_txn(c, "pc.b1", b1.pid, b1.epoch, False) == E.INVALID_TXN_STATE


def test_parent_abort_and_refused_joins(br):
    with Client(br.bootstrap) as c:
        t = topic(c, "br-abort", 1)
        open_branch(c, "pa.b0", t, 0, ["gone"])
        p = parent(c, "pa")
        assert join(c, p, "pa.b0")[("__semel_branch:pa.b0", 0)] == E.NONE
        assert wire.end_txn(c, "pa", p.pid, p.epoch, False) == E.NONE
        # refused joins, all or nothing: an unknown id, an ended branch, itself, a malformed pseudo-partition
        q = parent(c, "pa2")
        assert join(c, q, "nobody")[("__semel_branch:nobody", 0)] == E.INVALID_TXN_STATE
        assert join(c, q, "pa.b0")[("__semel_branch:pa.b0", 0)] == E.INVALID_TXN_STATE
        open_branch(c, "pa2.b0", t, 0, ["later"])
        got = wire.add_partitions(c, q, [("__semel_branch:pa2.b0", 0), ("__semel_branch:pa2", 0)])
        assert got == {("__semel_branch:pa2.b0", 0): E.OPERATION_NOT_ATTEMPTED,
                       ("__semel_branch:pa2", 0): E.INVALID_TXN_STATE}
        assert wire.add_partitions(c, q, [("__semel_branch:pa2.b0", 1)]) == {
            ("__semel_branch:pa2.b0", 1): E.INVALID_TOPIC_EXCEPTION}
        assert read_values(br.bootstrap, t, 1, idle_s=0.5) == []


def test_branch_reinitialised_aborts_the_undecided_parent(br):
    """A task re-run after a crash initialises its branch id again: the batch it was
    joined to had no decision, so the parent and all its branches abort."""
    with Client(br.bootstrap) as c:
        t, p = joined_pair(c, "ri")
        again = open_branch(c, "ri.b0", t, 0, ["new0"])
        assert wire.end_txn(c, "ri", p.pid, p.epoch, True) in (E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH)
        assert wire.end_txn(c, "ri.b0", again.pid, again.epoch, True) == E.NONE
        assert read_values(br.bootstrap, t, 2, want=1) == ["new0"]


def test_joined_branch_outlives_its_own_timeout(br):
    with Client(br.bootstrap) as c:
        t = topic(c, "br-timeout", 1)
        open_branch(c, "to.b0", t, 0, ["kept"], timeout_ms=300)
        open_branch(c, "to.lone", t, 0, ["dropped"], timeout_ms=300)
        p = parent(c, "to")
        assert join(c, p, "to.b0")[("__semel_branch:to.b0", 0)] == E.NONE
        # the unjoined branch times out and is aborted by the broker; the joined one is the parent's
        until(lambda: _state(c, "to.lone") == "CompleteAbort", "unjoined branch aborted by its timeout", 30)
        # (the pass that aborted the lone branch saw the joined one expired too: it began earlier)
        assert _state(c, "to.b0") == "Ongoing"
        assert wire.end_txn(c, "to", p.pid, p.epoch, True) == E.NONE
        assert read_values(br.bootstrap, t, 1, want=1) == ["kept"]


def test_branches_survive_a_broker_restart(br):
    """Joins are in the parent's log records: after a restart the parent's single
    EndTxn still commits every branch."""
    with Client(br.bootstrap) as c:
        t, p = joined_pair(c, "rs")
    br.kill()
    br.start()
    with Client(br.bootstrap) as c:
        until(lambda: wire.end_txn(c, "rs", p.pid, p.epoch, True) == E.NONE, "parent commit after restart", 30)
        assert _state(c, "rs.b0") == "CompleteCommit" and _state(c, "rs.b1") == "CompleteCommit"
    assert sorted(read_values(br.bootstrap, t, 2, want=2)) == ["rs0", "rs1"]


def _state(c: Client, txn_id: str) -> str:
    return describe_transactions(c, [txn_id])[0].state
