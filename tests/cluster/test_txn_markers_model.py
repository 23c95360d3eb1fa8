"""Model test: a transaction's markers racing partition leadership changes.

The coordinator (broker 0 of an in-process MemCluster) decides, then writes each
marker through the partition's leader of the moment, locally or with WriteTxnMarkers
to another broker, retrying after NOT_LEADER_OR_FOLLOWER. Seeded random runs:
transactions over random subsets of three RF3 partitions led by different brokers,
produced to each partition's current leader, committed or aborted at random while
leaders move between the replicas (elections as the controller makes them).

Invariants, after every step (a produce, an election, an ended transaction):
- no transaction is both committed and aborted: every marker of transaction k, on any
  partition and replica, has the kind the client decided;
- no marker precedes the decision (a marker closing k exists only once EndTxn was sent);
and once the cluster settles:
- every transaction ended with a marker on every partition it wrote to (Prepare*
  always completes), and every leader's LSO equals its high watermark.
"""
from __future__ import annotations

import random
import threading

import pytest

from semel.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError
from tests.support.memcluster import MemCluster, all_bytes
from tests.support.txn import RawTxn
from tests.support.wait import until

E = KafkaError
TOPIC = "m"
PARTS = 3
TXNS = 8


def _leader(mc, p: int) -> int:
    return mc.state(TOPIC, p).leader


def _produce(mc, txn: RawTxn, p: int, k: int) -> None:
    """One transactional batch 'k' to p's current leader, retried across leader moves
    (a retry of a stored batch is a duplicate, not a second copy)."""
    seq = txn.seq.get((TOPIC, p), 0)
    data = records.build_batch([(None, str(k).encode())], producer_id=txn.pid, producer_epoch=txn.epoch,
                               base_sequence=seq, transactional=True)
    for _ in range(100):
        with Client(mc.bootstrap(_leader(mc, p)), timeout_s=10) as c:
            err, _ = c.produce(TOPIC, p, data, transactional_id=txn.txn_id)
        if err == E.NONE:
            txn.seq[(TOPIC, p)] = seq + 1
            return
        assert err in (E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS, E.REQUEST_TIMED_OUT), err
    raise AssertionError(f"produce of {k} to {TOPIC}-{p} never succeeded")


def _move_leader(mc, rng, p: int) -> None:
    st = mc.state(TOPIC, p)
    others = [r for r in st.isr if r != st.leader]
    if others:
        mc.set_leader(TOPIC, p, rng.choice(others))


def _markers(mc, node: int, p: int) -> list[tuple[int, int | None]]:
    """(transaction k, marker kind) in replica order: data 'k' opens, a marker closes
    (kind None: k is still open). A marker with nothing open is a harmless repeat and
    is recorded against the last transaction closed."""
    data = mc.run(lambda: all_bytes(mc.log(node, TOPIC, p)))
    out: list[tuple[int, int | None]] = []
    open_k = None
    for pos, h in records.iter_batches(data):
        if h.is_control:
            kind = records.control_type(data, pos)
            if open_k is not None:
                out.append((open_k, kind))
                open_k = None
            elif out:
                out.append((out[-1][0], kind))
        else:
            open_k = int(next(records.iter_records(data, pos)).value)
    if open_k is not None:
        out.append((open_k, None))
    return out


def _check(mc, decided: dict[int, bool], settled: bool) -> None:
    wrote = {p: set() for p in range(PARTS)}
    for node in sorted(mc.brokers):
        for p in range(PARTS):
            for k, kind in _markers(mc, node, p):
                wrote[p].add(k)
                if kind is None:
                    assert not settled, f"transaction {k} still open on {TOPIC}-{p} (replica {node})"
                    continue
                assert k in decided, f"a marker for {k} before its EndTxn"
                want = records.CONTROL_COMMIT if decided[k] else records.CONTROL_ABORT
                assert kind == want, f"transaction {k} has a {kind} marker on {TOPIC}-{p}, decided {want}"


def _settled(mc) -> bool:
    def lso_is_hw():
        for p in range(PARTS):
            plog = mc.log(_leader(mc, p), TOPIC, p)
            if plog.last_stable_offset != plog.high_watermark:
                return False
        return True
    return mc.run(lso_is_hw)


@pytest.mark.parametrize("seed", range(4))
def test_markers_race_leader_changes(tmp_path, seed):
    rng = random.Random(seed)
    mc = MemCluster(tmp_path, 3, coordinator=0).start()
    try:
        mc.create_topic(TOPIC, [(0, 1, 2), (1, 2, 0), (2, 0, 1)])
        coord = Client(mc.bootstrap(0), timeout_s=30)
        txn = RawTxn(coord, "model")
        assert txn.init() == E.NONE
        decided: dict[int, bool] = {}
        for k in range(TXNS):
            parts = sorted(rng.sample(range(PARTS), rng.randint(1, PARTS)))
            # The previous transaction may still be completing: CONCURRENT_TRANSACTIONS until then.
            for _ in range(200):
                added = txn.add(*[(TOPIC, p) for p in parts])
                if set(added.values()) == {E.NONE}:
                    break
                assert set(added.values()) == {E.CONCURRENT_TRANSACTIONS}, added
                threading.Event().wait(0.05)
            else:
                raise AssertionError(f"transaction {k}: partitions never added")
            for p in parts:
                _produce(mc, txn, p, k)
                _check(mc, decided, settled=False)
            commit = rng.random() < 0.6
            decided[k] = commit
            result: list = []
            ender = threading.Thread(target=lambda: result.append(txn.end(commit)))
            ender.start()
            for _ in range(rng.randint(0, 3)):     # elections while the markers are written
                _move_leader(mc, rng, rng.randrange(PARTS))
                _check(mc, decided, settled=False)
                threading.Event().wait(rng.uniform(0, 0.03))
            ender.join(60)
            assert result == [E.NONE]
            _check(mc, decided, settled=False)
        mc.wait(lambda: all(m.state.name.startswith("COMPLETE") and m.pending is None
                            for m in mc.brokers[0].txn_coordinator.transactions()), "every transaction completed")
        until(lambda: _settled(mc), "LSO == high watermark on every leader")
        until(lambda: all(len({mc.log_bytes(n, TOPIC, p) for n in mc.brokers}) == 1 for p in range(PARTS)),
              "every replica caught up")
        _check(mc, decided, settled=True)
        coord.close()
    finally:
        mc.close()
