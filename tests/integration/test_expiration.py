"""Expiration of transactional ids and of idle idempotent producers (real broker process).

Memory must stay bounded however many producers come and go:
- a transactional id idle (no transaction open) for --transactional-id-expiration-ms
  is forgotten (a tombstone in the coordinator log, so a restart does not bring it
  back); its next InitProducerId starts afresh with a new producer id at epoch 0,
  as in Kafka; an id with an open transaction is never expired;
- an idempotent producer idle in a partition for --producer-id-expiration-ms is
  forgotten at the next retention check; it then gets UNKNOWN_PRODUCER_ID for a
  sequence other than 0 (it must re-initialise), a producer with an open
  transaction is kept.
Waits here are for the broker's own housekeeping to happen (generous deadlines),
never claims about how fast it is.
"""
from __future__ import annotations

import re
import time

from test_txn_protocol import leo, lso, visible

from tests.support.txn import RawTxn
from tests.support.wait import until

from semel.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError

E = KafkaError


def loaded_txn_ids(broker) -> int:
    """How many transactional ids the coordinator loaded at its last start (from its log)."""
    found = re.findall(r"transaction coordinator loaded (\d+) transactional id", broker.log_path.read_text())
    assert found, "the coordinator did not report its start"
    return int(found[-1])


def test_idle_transactional_ids_expire_and_restart_fresh(start_broker):
    broker = start_broker("--transactional-id-expiration-ms", "1000",
                          "--transaction-abort-check-interval-ms", "100")
    c = Client(broker.bootstrap)
    assert c.create_topic("out", 1) == E.NONE
    idle = [RawTxn(c, f"idle-{i}") for i in range(30)]
    for t in idle:
        assert t.init() == E.NONE
    used = idle[0]
    assert used.add(("out", 0)) == {("out", 0): E.NONE}
    assert used.produce("out", 0, b"committed")[0] == E.NONE
    assert used.end(True) == E.NONE
    busy = RawTxn(c, "busy", timeout_ms=120_000)      # keeps a transaction open throughout
    assert busy.init() == E.NONE
    assert busy.add(("out", 0)) == {("out", 0): E.NONE}
    assert busy.produce("out", 0, b"open")[0] == E.NONE
    busy_since = time.monotonic()

    # EndTxn retries change nothing, so they can watch for the expiry: a commit retry is
    # NONE while the id is known, INVALID_PRODUCER_ID_MAPPING once it is forgotten.
    until(lambda: used.end(True) == E.INVALID_PRODUCER_ID_MAPPING, "the idle id expires")
    until(lambda: all(t.end(False) == E.INVALID_PRODUCER_ID_MAPPING for t in idle[1:]), "all idle ids expire")
    # Give the open transaction more than its chance to be (wrongly) expired too.
    time.sleep(max(0.0, busy_since + 2.0 - time.monotonic()))
    assert busy.add(("out", 0)) == {("out", 0): E.NONE}       # still the current instance
    assert busy.end(True) == E.NONE
    assert visible(c, "out", 0) == [b"committed", b"open"]
    assert lso(c, "out", 0) == leo(c, "out", 0)

    # The forgetting is in the coordinator log: after a SIGKILL only "busy" comes back.
    broker.kill()
    broker.restart()
    assert loaded_txn_ids(broker) == 1
    c = Client(broker.bootstrap)
    for t in idle:
        t.c = c
        assert t.end(True) == E.INVALID_PRODUCER_ID_MAPPING
    busy.c = c
    assert busy.end(True) == E.NONE                             # a retry: still known

    # An expired id starts over: a new producer id at epoch 0; the old one means nothing.
    old_pid = used.pid
    assert used.init() == E.NONE
    assert used.pid != old_pid and used.epoch == 0
    stale = RawTxn(c, used.txn_id)
    stale.pid, stale.epoch = old_pid, 0
    assert stale.add(("out", 0)) == {("out", 0): E.INVALID_PRODUCER_ID_MAPPING}
    assert used.add(("out", 0)) == {("out", 0): E.NONE}
    assert used.produce("out", 0, b"again")[0] == E.NONE
    assert used.end(True) == E.NONE
    assert visible(c, "out", 0) == [b"committed", b"open", b"again"]


def test_transactional_expiry_keeps_count_bounded_across_restarts(start_broker):
    """Ids that keep coming and going: the coordinator only ever holds the recent ones."""
    broker = start_broker("--transactional-id-expiration-ms", "500",
                          "--transaction-abort-check-interval-ms", "100")
    for wave in range(3):
        with Client(broker.bootstrap) as c:
            waves = [RawTxn(c, f"wave{wave}-{i}") for i in range(25)]
            for t in waves:
                assert t.init() == E.NONE
            until(lambda: all(t.end(True) == E.INVALID_PRODUCER_ID_MAPPING for t in waves), "wave expires")
        broker.kill()
        broker.restart()
        assert loaded_txn_ids(broker) == 0


def _batch(pid: int, seq: int, epoch: int = 0, n: int = 1) -> bytes:
    return records.build_batch([(None, b"s%d" % (seq + i)) for i in range(n)],
                               producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def _init_idempotent(c: Client) -> int:
    r = c.request(22, transactional_id=None, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1)
    assert r.error_code == 0
    return r.producer_id


def test_idle_idempotent_producers_expire(start_broker):
    broker = start_broker("--producer-id-expiration-ms", "1000", "--retention-check-interval-ms", "100",
                          "--transaction-abort-check-interval-ms", "100")
    c = Client(broker.bootstrap)
    assert c.create_topic("t", 2) == E.NONE
    pid = _init_idempotent(c)
    for seq in range(3):
        assert c.produce("t", 0, _batch(pid, seq)) == (E.NONE, seq)
    crowd = [_init_idempotent(c) for _ in range(40)]           # many short-lived producers on t-1
    for i, other in enumerate(crowd):
        assert c.produce("t", 1, _batch(other, 0)) == (E.NONE, 2 * i)
        assert c.produce("t", 1, _batch(other, 1)) == (E.NONE, 2 * i + 1)
    txn = RawTxn(c, "long-txn", timeout_ms=120_000)            # its producer must survive expiry
    assert txn.init() == E.NONE
    assert txn.add(("t", 0)) == {("t", 0): E.NONE}
    assert txn.produce("t", 0, b"held")[0] == E.NONE
    end = leo(c, "t", 0)
    assert c.produce("t", 0, _batch(pid, 2)) == (E.NONE, 2)   # a retry is recognised ...

    # ... until the producer is forgotten (retries do not refresh it).
    until(lambda: c.produce("t", 0, _batch(pid, 2))[0] == E.UNKNOWN_PRODUCER_ID, "the idle producer expires")
    assert c.produce("t", 0, _batch(pid, 3))[0] == E.UNKNOWN_PRODUCER_ID    # continuing is refused too
    # (probing with retries of sequence 1: a duplicate while known, UNKNOWN_PRODUCER_ID
    # once forgotten; a probe at sequence 0 would be a legal fresh start)
    until(lambda: all(c.produce("t", 1, _batch(o, 1))[0] == E.UNKNOWN_PRODUCER_ID for o in crowd),
          "all idle producers expire")
    assert leo(c, "t", 0) == end and leo(c, "t", 1) == 2 * len(crowd)  # nothing appended meanwhile

    # The open transaction's producer was kept: its state still fences and completes.
    assert lso(c, "t", 0) < leo(c, "t", 0)
    assert txn.end(True) == E.NONE
    assert lso(c, "t", 0) == leo(c, "t", 0)
    assert b"held" in visible(c, "t", 0)

    # Starting over works: a fresh producer id, or (as Kafka allows) the old id from sequence 0.
    fresh = _init_idempotent(c)
    base = leo(c, "t", 0)
    assert c.produce("t", 0, _batch(fresh, 0)) == (E.NONE, base)
    assert c.produce("t", 0, _batch(pid, 0)) == (E.NONE, base + 1)
    assert c.produce("t", 0, _batch(pid, 1)) == (E.NONE, base + 2)
    assert c.produce("t", 0, _batch(pid, 1)) == (E.NONE, base + 2)     # and is deduplicated again

    # A SIGKILL may replay forgotten producers from the log tail; the next check forgets them again.
    broker.kill()
    broker.restart()
    c = Client(broker.bootstrap)
    until(lambda: all(c.produce("t", 1, _batch(o, 1))[0] == E.UNKNOWN_PRODUCER_ID for o in crowd),
          "replayed idle producers expire again")
    assert leo(c, "t", 1) == 2 * len(crowd)
