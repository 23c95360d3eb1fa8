"""Transactions at the protocol level: exact requests from the raw client to a real broker.

Checks the finer points of KIP-98 / KIP-360 / KIP-447 / KIP-588 / KIP-890 part 1
that the client-library tests (test_transactions.py) cannot aim at: error codes per
request version, all-or-nothing AddPartitionsToTxn, refusal before append, EndTxn
retries and misuse, transaction timeout bounds, generation/member fencing of
TxnOffsetCommit with a real group, aborted ranges and LSO in Fetch/ListOffsets,
and that no control record ever reaches an application through three clients.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from semel.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError
from semel.protocol.messages import request_class
from tests.support.txn import RawTxn, call

E = KafkaError
MAX_TIMEOUT_MS = 60_000
READ_COMMITTED, READ_UNCOMMITTED = 1, 0


@pytest.fixture
def tbroker(start_broker):
    b = start_broker("--group-initial-rebalance-delay-ms", "0", "--group-min-session-timeout-ms", "1000",
                     "--transaction-max-timeout-ms", str(MAX_TIMEOUT_MS))
    with Client(b.bootstrap) as c:
        for name, parts in (("out", 2), ("in", 2)):
            assert c.create_topic(name, parts) == E.NONE
    return b




def leo(c: Client, topic: str, partition: int) -> int:
    return c.list_offset(topic, partition, -1)


def lso(c: Client, topic: str, partition: int) -> int:
    return c.list_offset(topic, partition, -1, isolation=READ_COMMITTED)


def visible(c: Client, topic: str, partition: int, isolation: int = READ_COMMITTED) -> list[bytes]:
    """Record values a consumer would deliver: the client-side rule for aborted ranges
    (drop a listed producer's transactional batches from first_offset to its ABORT
    marker) and no control batches. read_uncommitted gets no aborted list."""
    f = c.fetch(topic, partition, 0, isolation=isolation)
    pending = sorted(f.aborted, key=lambda a: a[1])
    aborting: set[int] = set()
    out = []
    for pos, hdr in records.iter_batches(f.records):
        while pending and pending[0][1] <= hdr.base_offset:
            aborting.add(pending.pop(0)[0])
        if hdr.is_control:
            aborting.discard(hdr.producer_id)
        elif not (hdr.is_transactional and hdr.producer_id in aborting):
            out.extend(r.value for r in records.iter_records(f.records, pos))
    return out


# --- InitProducerId and fencing ------------------------------------------------------------------

def test_reinit_bumps_epoch_and_fences_old_instance_per_version(tbroker):
    with Client(tbroker.bootstrap) as c1, Client(tbroker.bootstrap) as c2:
        old = RawTxn(c1, "fence")
        assert old.init() == E.NONE and old.epoch == 0
        assert old.add(("out", 0)) == {("out", 0): E.NONE}
        assert old.produce("out", 0, b"zombie") == (E.NONE, 0)
        new = RawTxn(c2, "fence")
        assert new.init() == E.NONE
        assert new.pid == old.pid and new.epoch > old.epoch + 1   # one bump aborted old's txn, one is new's
        # The open transaction of the old instance was aborted by the re-init.
        assert lso(c1, "out", 0) == leo(c1, "out", 0) == 2
        assert visible(c1, "out", 0) == []
        # Everything the old instance tries now fails, with the error its request version knows.
        end = leo(c1, "out", 0)
        assert old.produce("out", 0, b"zombie-2")[0] == E.INVALID_PRODUCER_EPOCH
        assert leo(c1, "out", 0) == end
        for version, fenced in ((0, E.INVALID_PRODUCER_EPOCH), (1, E.INVALID_PRODUCER_EPOCH),
                                (2, E.PRODUCER_FENCED), (3, E.PRODUCER_FENCED)):
            assert old.add(("out", 1), version=version) == {("out", 1): fenced}
            assert old.add_offsets("g", version=version) == fenced
            assert old.end(True, version=version) == fenced
            assert old.end(False, version=version) == fenced
        for version, fenced in ((2, E.INVALID_PRODUCER_EPOCH), (3, E.PRODUCER_FENCED)):
            assert new.add_offsets("g") == E.NONE
            assert old.commit_offsets("g", {("in", 0): 5}, version=version) == {("in", 0): fenced}
        # KIP-360 InitProducerId with the fenced epoch: v4 says PRODUCER_FENCED, v3 INVALID_PRODUCER_EPOCH.
        for version, fenced in ((3, E.INVALID_PRODUCER_EPOCH), (4, E.PRODUCER_FENCED)):
            r = call(c1, 22, version, transactional_id="fence", transaction_timeout_ms=30_000,
                     producer_id=old.pid, producer_epoch=old.epoch)
            assert (E(r.error_code), r.producer_id, r.producer_epoch) == (fenced, -1, -1)
        # The new instance is unaffected by all of that.
        assert new.add(("out", 1)) == {("out", 1): E.NONE}
        assert new.produce("out", 1, b"fresh")[0] == E.NONE
        assert new.end(True) == E.NONE
        assert visible(c2, "out", 1) == [b"fresh"]


def test_transaction_timeout_above_broker_maximum_is_refused(tbroker):
    with Client(tbroker.bootstrap) as c:
        for bad in (MAX_TIMEOUT_MS + 1, 0, -5):
            t = RawTxn(c, "timeouts")
            for version in (0, 4):
                assert t.init(version=version, timeout_ms=bad) == E.INVALID_TRANSACTION_TIMEOUT
        t = RawTxn(c, "timeouts")
        assert t.init(timeout_ms=MAX_TIMEOUT_MS) == E.NONE
        assert t.epoch == 0            # the refused attempts created nothing


# --- AddPartitionsToTxn and KIP-890 part 1 ---------------------------------------------------------

def test_add_partitions_is_all_or_nothing(tbroker):
    with Client(tbroker.bootstrap) as c:
        t = RawTxn(c, "aon")
        assert t.init() == E.NONE
        got = t.add(("out", 0), ("nope", 0), ("out", 9))
        assert got == {("out", 0): E.OPERATION_NOT_ATTEMPTED, ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION,
                       ("out", 9): E.UNKNOWN_TOPIC_OR_PARTITION}
        # Nothing was added: producing to out-0 is refused and no transaction exists to end.
        assert t.produce("out", 0, b"x")[0] == E.INVALID_TXN_STATE
        assert leo(c, "out", 0) == 0
        assert t.end(True) == E.INVALID_TXN_STATE
        # A correct request afterwards works, and adding the same partition again is a no-op.
        assert t.add(("out", 0)) == {("out", 0): E.NONE}
        assert t.add(("out", 0), ("out", 1)) == {("out", 0): E.NONE, ("out", 1): E.NONE}
        assert t.produce("out", 0, b"x") == (E.NONE, 0)
        assert t.end(True) == E.NONE


def test_internal_topics_cannot_join_a_transaction(tbroker):
    """A COMMIT marker written into __transaction_state made the coordinator log
    unreadable: the broker could not start again. Only the offsets partition may
    join (that is what AddOffsetsToTxn does)."""
    with Client(tbroker.bootstrap) as c:
        t = RawTxn(c, "internal")
        assert t.init() == E.NONE
        assert t.add(("__transaction_state", 0), ("out", 0)) == {
            ("__transaction_state", 0): E.INVALID_TOPIC_EXCEPTION, ("out", 0): E.OPERATION_NOT_ATTEMPTED}
        assert t.end(True) == E.INVALID_TXN_STATE          # nothing was added
        assert t.add(("__consumer_offsets", 0)) == {("__consumer_offsets", 0): E.NONE}
        assert t.end(True) == E.NONE
    tbroker.kill()
    tbroker.restart()
    with Client(tbroker.bootstrap) as c:
        t.c = c
        assert t.end(True) == E.NONE                       # the coordinator state came back


def test_coordinator_starts_despite_a_control_batch_in_its_log(tbroker):
    """Logs written before that refusal may hold such a marker: it is skipped."""
    from semel.storage import LogConfig, PartitionLog
    with Client(tbroker.bootstrap) as c:
        t = RawTxn(c, "survivor")
        assert t.init() == E.NONE
    tbroker.stop()
    plog = PartitionLog.open(tbroker.data_dir / "__transaction_state-0", LogConfig(retention_ms=-1))
    try:
        plog.append_control(records.CONTROL_COMMIT, t.pid + 77, 0, 0)
    finally:
        plog.close()
    tbroker.start()
    with Client(tbroker.bootstrap) as c:
        t.c = c
        assert t.end(True) == E.INVALID_TXN_STATE          # known, in EMPTY state: not lost
        assert t.init() == E.NONE and t.epoch == 1


def test_produce_to_partition_not_in_transaction_is_refused_before_append(tbroker):
    with Client(tbroker.bootstrap) as c:
        t = RawTxn(c, "kip890")
        assert t.init() == E.NONE
        assert t.produce("out", 0, b"no-txn-yet")[0] == E.INVALID_TXN_STATE       # no transaction at all
        assert t.add(("out", 0)) == {("out", 0): E.NONE}
        assert t.produce("out", 0, b"in") == (E.NONE, 0)
        assert t.produce("out", 1, b"not-added")[0] == E.INVALID_TXN_STATE         # open txn, other partition
        assert leo(c, "out", 1) == 0
        # A non-transactional batch of the same producer inside its open transaction.
        plain = records.build_batch([(None, b"plain")], producer_id=t.pid, producer_epoch=t.epoch,
                                    base_sequence=1)
        assert c.produce("out", 0, plain)[0] == E.INVALID_TXN_STATE
        assert leo(c, "out", 0) == 1
        # A transactional batch under another transactional id's name.
        other = RawTxn(c, "kip890-other")
        assert other.init() == E.NONE
        assert other.add(("out", 1)) == {("out", 1): E.NONE}
        wrong = records.build_batch([(None, b"spoofed")], producer_id=t.pid, producer_epoch=t.epoch,
                                    base_sequence=0, transactional=True)
        assert c.produce("out", 1, wrong, transactional_id="kip890-other")[0] == E.INVALID_PRODUCER_ID_MAPPING
        assert leo(c, "out", 1) == 0
        # A verified batch followed by one of a producer no coordinator knows, in one request:
        # the stranger's batch must not open a transaction nobody would ever end (LSO stuck).
        good = records.build_batch([(None, b"ok")], producer_id=other.pid, producer_epoch=other.epoch,
                                   base_sequence=0, transactional=True)
        phantom = records.build_batch([(None, b"phantom")], producer_id=other.pid + 500, producer_epoch=0,
                                      base_sequence=0, transactional=True)
        assert c.produce("out", 1, good + phantom, transactional_id="kip890-other")[0] == \
            E.INVALID_PRODUCER_ID_MAPPING
        assert leo(c, "out", 1) == 0
        assert other.end(False) == E.NONE
        assert lso(c, "out", 1) == leo(c, "out", 1)
        assert t.end(True) == E.NONE
        # After the commit the partition is no longer in a transaction of this producer.
        assert t.produce("out", 0, b"after")[0] == E.INVALID_TXN_STATE
        assert visible(c, "out", 0) == [b"in"]


# --- EndTxn ----------------------------------------------------------------------------------------

def test_end_txn_misuse_and_retries(tbroker):
    with Client(tbroker.bootstrap) as c:
        t = RawTxn(c, "endtxn")
        assert t.init() == E.NONE
        assert t.end(True) == E.INVALID_TXN_STATE          # no transaction started
        assert t.end(False) == E.INVALID_TXN_STATE
        assert t.add(("out", 0)) == {("out", 0): E.NONE}
        assert t.produce("out", 0, b"c1")[0] == E.NONE
        assert t.end(True) == E.NONE
        assert t.end(True) == E.NONE                        # a retry of the commit
        assert t.end(False) == E.INVALID_TXN_STATE          # abort after commit
        assert t.add(("out", 0)) == {("out", 0): E.NONE}
        assert t.produce("out", 0, b"a1")[0] == E.NONE
        assert t.end(False) == E.NONE
        assert t.end(False) == E.NONE                       # a retry of the abort
        assert t.end(True) == E.INVALID_TXN_STATE           # commit after abort
        assert t.add(("out", 0)) == {("out", 0): E.NONE}   # and the id still works
        assert t.produce("out", 0, b"c2")[0] == E.NONE
        assert t.end(True) == E.NONE
        assert visible(c, "out", 0) == [b"c1", b"c2"]
        assert visible(c, "out", 0, READ_UNCOMMITTED) == [b"c1", b"a1", b"c2"]
        # An empty transactional id is a bad request (Kafka), not "no transactional id".
        empty = RawTxn(c, "")
        assert empty.init() == E.INVALID_REQUEST
        empty.pid, empty.epoch = t.pid, t.epoch
        assert empty.end(True) == E.INVALID_REQUEST
        assert empty.add(("out", 0)) == {("out", 0): E.INVALID_REQUEST}
        assert empty.add_offsets("g") == E.INVALID_REQUEST
        # Unknown transactional id, or a producer id that is not this id's.
        stranger = RawTxn(c, "never-initialised")
        stranger.pid, stranger.epoch = t.pid, t.epoch
        assert stranger.end(True) == E.INVALID_PRODUCER_ID_MAPPING
        t.pid += 1
        assert t.end(True) == E.INVALID_PRODUCER_ID_MAPPING


# --- TxnOffsetCommit v3 (KIP-447) with a real group ---------------------------------------------------

def _join(c: Client, group: str, member: str = "") -> tuple[KafkaError, str, int]:
    P = request_class(11).JoinGroupRequestProtocol
    r = call(c, 11, 5, group_id=group, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
             member_id=member, group_instance_id=None, protocol_type="consumer",
             protocols=[P(name="range", metadata=b"")])
    return E(r.error_code), r.member_id, r.generation_id


def _join_and_sync(c: Client, group: str, member: str = "") -> tuple[str, int]:
    err, member, gen = _join(c, group, member)
    if err == E.MEMBER_ID_REQUIRED:
        err, member, gen = _join(c, group, member)
    assert err == E.NONE
    A = request_class(14).SyncGroupRequestAssignment
    s = call(c, 14, 3, group_id=group, generation_id=gen, member_id=member, group_instance_id=None,
             assignments=[A(member_id=member, assignment=b"")])
    assert s.error_code == E.NONE
    return member, gen


def test_txn_offset_commit_v3_fences_stale_generation_and_unknown_member(tbroker):
    from confluent_kafka import Consumer, TopicPartition
    group = "kip447"
    with Client(tbroker.bootstrap) as c:
        member, gen1 = _join_and_sync(c, group)
        member, gen2 = _join_and_sync(c, group, member)   # the leader rejoining starts a new generation
        assert gen2 == gen1 + 1
        t = RawTxn(c, "kip447-producer")
        assert t.init() == E.NONE
        # Before AddOffsetsToTxn the offsets partition is not part of the transaction.
        assert t.commit_offsets(group, {("in", 0): 1}, generation=gen2, member=member) == {
            ("in", 0): E.INVALID_TXN_STATE}
        assert t.add_offsets(group) == E.NONE
        assert t.commit_offsets(group, {("in", 0): 3}, generation=gen1, member=member) == {
            ("in", 0): E.ILLEGAL_GENERATION}
        assert t.commit_offsets(group, {("in", 0): 4}, generation=gen2, member="ghost") == {
            ("in", 0): E.UNKNOWN_MEMBER_ID}
        assert t.commit_offsets(group, {("in", 0): 7}, generation=gen2, member=member) == {("in", 0): E.NONE}
        # v2 carries no generation or member: nothing to fence on (an older client's commit).
        assert t.commit_offsets(group, {("in", 1): 2}, version=2) == {("in", 1): E.NONE}
        assert t.end(True) == E.NONE
    consumer = Consumer({"bootstrap.servers": tbroker.bootstrap, "group.id": group})
    try:
        got = consumer.committed([TopicPartition("in", 0), TopicPartition("in", 1)], timeout=15)
    finally:
        consumer.close()
    assert [tp.offset for tp in got] == [7, 2]


def test_txn_offset_commit_v2_without_generation_and_abort_drops_offsets(tbroker):
    from confluent_kafka import Consumer, TopicPartition
    with Client(tbroker.bootstrap) as c:
        t = RawTxn(c, "v2-offsets")
        assert t.init() == E.NONE
        assert t.add_offsets("g-v2", version=0) == E.NONE
        assert t.commit_offsets("g-v2", {("in", 1): 11}, version=2) == {("in", 1): E.NONE}
        assert t.end(False) == E.NONE
        assert t.add_offsets("g-v2", version=0) == E.NONE
        assert t.commit_offsets("g-v2", {("in", 0): 12}, version=0) == {("in", 0): E.NONE}
        assert t.end(True) == E.NONE
    consumer = Consumer({"bootstrap.servers": tbroker.bootstrap, "group.id": "g-v2"})
    try:
        got = consumer.committed([TopicPartition("in", 0), TopicPartition("in", 1)], timeout=15)
    finally:
        consumer.close()
    assert [tp.offset for tp in got][0] == 12 and got[1].offset < 0   # the aborted offset never landed


# --- read_committed Fetch and ListOffsets ---------------------------------------------------------------

def _interleaved_transactions(c: Client) -> dict:
    """On out-0: A aborts, B commits, their batches interleaved; then C stays open.
    Returns the offsets of interest."""
    a, b, o = RawTxn(c, "ra"), RawTxn(c, "rb"), RawTxn(c, "ro")
    for t in (a, b, o):
        assert t.init() == E.NONE
        assert t.add(("out", 0)) == {("out", 0): E.NONE}
    at = {}
    at["a1"] = a.produce("out", 0, b"a1", b"a2")[1]          # 0-1
    at["b1"] = b.produce("out", 0, b"b1")[1]                  # 2
    at["a3"] = a.produce("out", 0, b"a3")[1]                  # 3
    assert a.end(False) == E.NONE                             # ABORT marker at 4
    at["b2"] = b.produce("out", 0, b"b2")[1]                  # 5
    assert b.end(True) == E.NONE                              # COMMIT marker at 6
    at["o1"] = o.produce("out", 0, b"o1")[1]                  # 7, stays open
    at["a_pid"], at["b_pid"], at["o_pid"] = a.pid, b.pid, o.pid
    at["open"] = o
    return at


def test_read_committed_fetch_returns_aborted_ranges_and_stops_at_lso(tbroker):
    with Client(tbroker.bootstrap) as c:
        at = _interleaved_transactions(c)
        assert (at["a1"], at["b1"], at["a3"], at["b2"], at["o1"]) == (0, 2, 3, 5, 7)
        hw = leo(c, "out", 0)
        assert hw == 8
        rc = c.fetch("out", 0, 0, isolation=READ_COMMITTED)
        assert rc.high_watermark == 8 and rc.last_stable_offset == 7
        assert rc.aborted == [(at["a_pid"], 0)]
        offsets = [h.base_offset for _, h in records.iter_batches(rc.records)]
        assert offsets and max(offsets) < 7                     # nothing at or past the LSO
        assert visible(c, "out", 0) == [b"b1", b"b2"]
        # From past the abort marker no aborted range overlaps any more.
        later = c.fetch("out", 0, 5, isolation=READ_COMMITTED)
        assert later.aborted == [] and later.last_stable_offset == 7
        # A fetch starting inside the aborted transaction still gets its range.
        inside = c.fetch("out", 0, 3, isolation=READ_COMMITTED)
        assert inside.aborted == [(at["a_pid"], 0)]
        # read_uncommitted: everything up to the high watermark, no aborted list needed.
        ru = c.fetch("out", 0, 0, isolation=READ_UNCOMMITTED)
        assert ru.last_stable_offset == 7 and not ru.aborted
        assert visible(c, "out", 0, READ_UNCOMMITTED) == [b"a1", b"a2", b"b1", b"a3", b"b2", b"o1"]
        # ListOffsets latest: the LSO under read_committed, the high watermark otherwise.
        assert (lso(c, "out", 0), leo(c, "out", 0)) == (7, 8)
        assert (lso(c, "out", 1), leo(c, "out", 1)) == (0, 0)
        assert at["open"].end(True) == E.NONE                   # closing C releases the LSO
        assert lso(c, "out", 0) == leo(c, "out", 0) == 9
        assert visible(c, "out", 0) == [b"b1", b"b2", b"o1"]


def _expected_stream(c: Client):
    """Committed, aborted and committed again, on out-0: returns (committed values,
    all data values, offsets of the control records)."""
    t = RawTxn(c, "clients")
    assert t.init() == E.NONE
    for round_, commit in enumerate((True, False, True)):
        assert t.add(("out", 0)) == {("out", 0): E.NONE}
        assert t.produce("out", 0, *[b"r%d-%d" % (round_, i) for i in range(3)])[0] == E.NONE
        assert t.end(commit) == E.NONE
    data = c.fetch("out", 0, 0).records
    markers = [h.base_offset for _, h in records.iter_batches(data) if h.is_control]
    committed = [b"r0-%d" % i for i in range(3)] + [b"r2-%d" % i for i in range(3)]
    everything = [b"r%d-%d" % (r, i) for r in range(3) for i in range(3)]
    return committed, everything, markers


def _consume_confluent(bootstrap, isolation):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "cc", "isolation.level": isolation,
                  "enable.auto.commit": False})
    c.assign([TopicPartition("out", 0, 0)])
    out, last = [], time.monotonic()
    while time.monotonic() - last < 1.5:
        m = c.poll(0.1)
        if m is not None and not m.error():
            out.append((m.offset(), m.value()))
            last = time.monotonic()
    c.close()
    return out


def _consume_kafka_python(bootstrap, isolation):
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                      group_id=None, consumer_timeout_ms=1500)
    tp = TopicPartition("out", 0)
    c.assign([tp])
    c.seek(tp, 0)
    out = [(m.offset, m.value) for m in c]
    c.close()
    return out


def _consume_aiokafka(bootstrap, isolation):
    async def run():
        from aiokafka import AIOKafkaConsumer, TopicPartition
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
        await c.start()
        try:
            tp = TopicPartition("out", 0)
            c.assign([tp])
            c.seek(tp, 0)
            out = []
            while True:
                got = await c.getmany(tp, timeout_ms=1500)
                if not got:
                    return out
                out.extend((m.offset, m.value) for m in got[tp])
        finally:
            await c.stop()
    return asyncio.run(run())


@pytest.mark.parametrize("consume", [_consume_confluent, _consume_kafka_python, _consume_aiokafka],
                         ids=["confluent-kafka", "kafka-python", "aiokafka"])
def test_control_records_never_reach_client_consumers(tbroker, consume):
    with Client(tbroker.bootstrap) as c:
        committed, everything, markers = _expected_stream(c)
    assert len(markers) == 3
    for isolation, expected in (("read_committed", committed), ("read_uncommitted", everything)):
        got = consume(tbroker.bootstrap, isolation)
        assert [v for _, v in got] == expected, isolation
        assert not {off for off, _ in got} & set(markers), f"{isolation}: a control record was delivered"


# --- timeout abort and KIP-360 resume ---------------------------------------------------------------------

def test_timed_out_transaction_is_aborted_and_producer_may_resume(start_broker):
    b = start_broker("--transaction-abort-check-interval-ms", "100")
    with Client(b.bootstrap) as c:
        assert c.create_topic("out", 1) == E.NONE
        t = RawTxn(c, "slow", timeout_ms=500)
        assert t.init() == E.NONE
        assert t.add(("out", 0)) == {("out", 0): E.NONE}
        assert t.produce("out", 0, b"too-late")[0] == E.NONE
        deadline = time.monotonic() + 60
        while lso(c, "out", 0) < leo(c, "out", 0):    # the coordinator aborts it on its own
            assert time.monotonic() < deadline, "the timed-out transaction was never aborted"
            time.sleep(0.05)
        assert visible(c, "out", 0) == [] and visible(c, "out", 0, READ_UNCOMMITTED) == [b"too-late"]
        # The abort bumped the epoch: the old one is fenced everywhere ...
        end = leo(c, "out", 0)
        assert t.produce("out", 0, b"more")[0] == E.INVALID_PRODUCER_EPOCH
        assert t.end(True) == E.PRODUCER_FENCED
        assert leo(c, "out", 0) == end
        # ... but KIP-360 lets this very producer resume with the epoch it holds.
        r = call(c, 22, 4, transactional_id="slow", transaction_timeout_ms=30_000,
                 producer_id=t.pid, producer_epoch=t.epoch)
        assert r.error_code == E.NONE and r.producer_id == t.pid and r.producer_epoch > t.epoch + 1
        t.epoch, t.seq = r.producer_epoch, {}
        assert t.add(("out", 0)) == {("out", 0): E.NONE}
        assert t.produce("out", 0, b"resumed")[0] == E.NONE
        assert t.end(True) == E.NONE
        assert visible(c, "out", 0) == [b"resumed"]


# --- producer epoch exhaustion ------------------------------------------------------------------------

def _forge_epoch(data_dir, txn_id: str, pid: int, epoch: int, partitions, timeout_ms: int, started_ms: int):
    """With the broker stopped, append a coordinator record that moves txn_id to a high
    epoch (reaching it by InitProducerId would take ~32k requests)."""
    from semel.coordinator.txn_states import TxnMeta, TxnState, encode_value
    from semel.storage import LogConfig, PartitionLog
    plog = PartitionLog.open(data_dir / "__transaction_state-0", LogConfig(retention_ms=-1))
    try:
        meta = TxnMeta(txn_id, pid, epoch, pid, epoch - 1, timeout_ms, TxnState.ONGOING, frozenset(partitions),
                       started_ms, started_ms)
        data = records.build_batch([(txn_id.encode(), encode_value(meta))])
        plog.append(data, records.split_batches(data)[0])
    finally:
        plog.close()


@pytest.mark.parametrize("how", ["reinit", "timeout"])
def test_abort_at_exhausted_epoch_keeps_the_producer_id_of_the_data(start_broker, how):
    """At the last epoch a client may hold (32766), fencing the open transaction must
    write its ABORT markers under the producer id its data carries (epoch 32767); the
    producer id moves on only afterwards. Markers under the next producer id would
    end nothing: the partition's LSO would be stuck for ever."""
    b = start_broker("--transaction-abort-check-interval-ms", "100")
    with Client(b.bootstrap) as c:
        assert c.create_topic("out", 1) == E.NONE
        old = RawTxn(c, "exhausted")
        assert old.init() == E.NONE
        assert old.add(("out", 0)) == {("out", 0): E.NONE}
        assert old.produce("out", 0, b"doomed")[0] == E.NONE
    b.stop()
    now_ms = int(time.time() * 1000)
    started = now_ms - 60_000 if how == "timeout" else now_ms
    _forge_epoch(b.data_dir, "exhausted", old.pid, 32766, [("out", 0)], 1000 if how == "timeout" else 60_000,
                 started)
    b.start()
    with Client(b.bootstrap) as c:
        new = RawTxn(c, "exhausted")
        if how == "reinit":
            assert new.init() == E.NONE
        else:
            deadline = time.monotonic() + 60
            while lso(c, "out", 0) < leo(c, "out", 0):
                assert time.monotonic() < deadline, "the timed-out transaction was never aborted"
                time.sleep(0.05)
            # The LSO moves with the markers, a moment before the Complete record is
            # applied: an InitProducerId in that gap is rightly CONCURRENT_TRANSACTIONS,
            # which clients retry.
            while True:
                r = call(c, 22, 4, transactional_id="exhausted", transaction_timeout_ms=30_000,
                         producer_id=old.pid, producer_epoch=32766)    # KIP-360 resume
                if r.error_code != E.CONCURRENT_TRANSACTIONS:
                    break
                assert time.monotonic() < deadline, "the timed-out abort never completed"
                time.sleep(0.05)
            assert r.error_code == E.NONE
            new.pid, new.epoch = r.producer_id, r.producer_epoch
        assert (new.pid != old.pid, new.epoch) == (True, 0)             # a fresh producer id from here on
        assert lso(c, "out", 0) == leo(c, "out", 0)
        data = c.fetch("out", 0, 0).records
        markers = [h for _, h in records.iter_batches(data) if h.is_control]
        assert [(h.producer_id, h.producer_epoch) for h in markers] == [(old.pid, 32767)]
        assert new.add(("out", 0)) == {("out", 0): E.NONE}
        assert new.produce("out", 0, b"next")[0] == E.NONE
        assert new.end(True) == E.NONE
        assert visible(c, "out", 0) == [b"next"]
