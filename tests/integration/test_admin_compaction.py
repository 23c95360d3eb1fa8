"""cleanup.policy=compact honoured by the cleaner on a real broker: superseded
records and aborted transactions' records go, the newest value of every key
stays at its offset, markers stay so read_committed views do not change, and
the compacted log survives a SIGKILL."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from tests.support import wait
from tests.support.brokers import module_broker

KEYS, ROUNDS = 10, 30


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    with module_broker(tmp_path_factory, "admin-compaction", "--retention-check-interval-ms", "200") as b:
        yield b


def _read(b, name, isolation):
    """[(offset, key, value)] of the whole partition."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "r-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "isolation.level": isolation})
    tp = TopicPartition(name, 0)
    _, hi = c.get_watermark_offsets(tp, 30)
    c.assign([TopicPartition(name, 0, 0)])
    out = []
    while True:
        m = c.poll(3)
        if m is None:
            break
        assert not m.error(), m.error()
        out.append((m.offset(), m.key(), m.value()))
    c.close()
    return out, hi


def _fill(b, name):
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "enable.idempotence": True})
    for r in range(ROUNDS):
        for k in range(KEYS):
            p.produce(name, key=f"k{k}".encode(), value=f"r{r}".encode(), partition=0)
        p.flush(30)
    tx = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "tx-" + name, "linger.ms": 0})
    tx.init_transactions(30)
    tx.begin_transaction()
    for k in range(KEYS):
        tx.produce(name, key=f"k{k}".encode(), value=b"aborted", partition=0)
    tx.flush(30)
    tx.abort_transaction(30)
    tx.begin_transaction()
    tx.produce(name, key=b"k0", value=b"committed", partition=0)
    tx.commit_transaction(30)
    # records after the transactions, so the segments holding them close
    for r in range(ROUNDS):
        p.produce(name, key=b"tail", value=f"t{r}".encode(), partition=0)
        p.flush(30)
    assert p.flush(30) == 0


def _latest(rows):
    out = {}
    for off, key, value in rows:
        out[key] = (off, value)
    return out


def test_compaction_keeps_latest_per_key_and_survives_sigkill(mbroker):
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    name = "compact-" + uuid.uuid4().hex[:8]
    # starts as delete so the cleaner leaves it alone until the data is in
    admin.create_topics([NewTopic(name, 1, 1, config={"segment.bytes": "2048"})])[name].result(30)
    _fill(mbroker, name)
    before, hi = _read(mbroker, name, "read_committed")
    assert all(v != b"aborted" for _, _, v in before)
    res = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(30)

    def compacted():
        rows, _ = _read(mbroker, name, "read_uncommitted")
        return rows if len(rows) < len(before) else None
    after = wait.until(compacted, "the cleaner removed superseded records")
    # read_uncommitted now sees no aborted record in the cleaned part, the newest value of
    # each key at its original offset, offsets increasing, the high watermark unchanged
    assert _latest(after) == _latest(before)
    assert [o for o, _, _ in after] == sorted({o for o, _, _ in after})
    committed_after, hi_after = _read(mbroker, name, "read_committed")
    assert hi_after == hi
    assert _latest(committed_after) == _latest(before)
    assert set(committed_after) <= set(before)
    assert sum(1 for _, k, _ in after if k == b"k1") < ROUNDS
    mbroker.kill()
    mbroker.restart()
    reopened, hi_reopened = _read(mbroker, name, "read_committed")
    assert hi_reopened == hi and _latest(reopened) == _latest(before)
    assert set(reopened) <= set(before)


def test_tombstones_go_after_delete_retention_ms(mbroker):
    """A tombstone older than delete.retention.ms is removed with every trace of its key;
    a younger one stays, and goes later on its own (no new write needed for the pass)."""
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    name = "tomb-" + uuid.uuid4().hex[:8]
    retention_ms = 15_000
    admin.create_topics([NewTopic(name, 1, 1, config={
        "segment.bytes": "1024", "cleanup.policy": "compact",
        "delete.retention.ms": str(retention_ms)})])[name].result(30)
    p = Producer({"bootstrap.servers": mbroker.bootstrap, "linger.ms": 0})
    long_ago = int(time.time() * 1000) - 20 * 60_000
    # one flush each: a batch's newest timestamp decides for all its tombstones
    for key, value, ts in [(b"old", b"v", long_ago), (b"old", None, long_ago),
                           (b"young", b"v", 0), (b"young", None, 0)]:
        p.produce(name, key=key, value=value, partition=0, timestamp=ts)
        assert p.flush(30) == 0
    for i in range(60):   # close the segments holding the tombstones
        p.produce(name, key=b"filler", value=b"%d" % i, partition=0)
    assert p.flush(30) == 0

    def keys():
        rows, _ = _read(mbroker, name, "read_uncommitted")
        return {k: v for _, k, v in rows if k != b"filler"}
    assert wait.until(lambda: keys() == {b"young": None} or None,
                      "the old tombstone and its key gone, the young tombstone kept")
    assert wait.until(lambda: keys() == {} or None, "the young tombstone goes once it is old enough",
                      timeout_s=retention_ms / 1000 + 30)
