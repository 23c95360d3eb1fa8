"""Hanging transactions found and cleared by an operator, and the KIP-664 APIs
read by Kafka's own admin client (kafka-python's KafkaAdminClient; confluent-kafka
2.16 has no transaction admin calls).

A hanging transaction is made on purpose the way they arise: a producer leaves a
transaction open in a partition and the coordinator's state is lost (its log
directory removed while the broker is down), so nothing will ever write the
marker and read_committed readers stop at the partition's last stable offset.
"""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from support import wait
from support.brokers import module_broker
from support.read_end import read_to_end
from support.txn import RawTxn
from support.wire import call, connect

from semel.client import Client
from semel.protocol.errors import KafkaError
from semel.protocol.messages import request_class

TOPIC = "payments"


def semel(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "semel", *args], capture_output=True, text=True, timeout=timeout)


def _commit(bootstrap: str, txn_id: str, values: list[str]) -> None:
    """One committed transaction of confluent-kafka into partition 0 of TOPIC."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    p.init_transactions(30)
    p.begin_transaction()
    for v in values:
        p.produce(TOPIC, v.encode(), partition=0)
    p.commit_transaction(30)
    p.flush(30)


@pytest.fixture(scope="module")
def ops_broker(tmp_path_factory):
    """One broker for the tests that need no restart (each uses its own topic)."""
    with module_broker(tmp_path_factory, "ops-txn") as b:
        yield b


def _open_txn(c: Client, txn_id: str, topic: str, *values: bytes, timeout_ms: int = 30_000) -> tuple[RawTxn, int]:
    """A transaction left open in partition 0 of topic: (producer, first offset of its data)."""
    t = RawTxn(c, txn_id, timeout_ms=timeout_ms)
    assert t.init() == KafkaError.NONE
    assert t.add((topic, 0)) == {(topic, 0): KafkaError.NONE}
    err, first = t.produce(topic, 0, *values)
    assert err == KafkaError.NONE
    return t, first


def _kafka_admin(bootstrap: str):
    from kafka.admin import KafkaAdminClient
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)


def test_hanging_transaction_found_and_aborted(start_broker, tmp_path):
    data = tmp_path / "data"
    b = start_broker("--group-initial-rebalance-delay-ms", "0", data_dir=data)
    bootstrap = ["--bootstrap", b.bootstrap]
    with Client(b.bootstrap) as c:
        assert c.create_topic(TOPIC, 1) == KafkaError.NONE
    _commit(b.bootstrap, "before", ["a", "b", "c"])
    with Client(b.bootstrap) as c:
        stuck, start_offset = _open_txn(c, "lost-coordinator-state", TOPIC, b"never-decided-1", b"never-decided-2")
    b.stop()
    shutil.rmtree(data / "__transaction_state-0")   # the coordinator forgets the open transaction
    b.start()
    _commit(b.bootstrap, "after", ["d", "e"])
    assert sorted(read_to_end(b.bootstrap, TOPIC, 1)) == ["a", "b", "c"]   # stuck at the LSO

    r = semel("txn", "find-hanging", *bootstrap)
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()[1:]]
    assert [(t, p, pid, off) for t, p, pid, _, _, off, _, _ in rows] == [
        (TOPIC, "0", str(stuck.pid), str(start_offset))]
    assert "no live transaction at the coordinator" in rows[0][7]
    # Kafka's admin client sees the same producer holding the partition back
    from kafka.structs import TopicPartition
    admin = _kafka_admin(b.bootstrap)
    try:
        producers = admin.describe_producers([TopicPartition(TOPIC, 0)])[TopicPartition(TOPIC, 0)]
        open_ones = [p for p in producers.active_producers if p.current_transaction_start_offset >= 0]
        assert [(p.producer_id, p.current_transaction_start_offset) for p in open_ones] == [
            (stuck.pid, start_offset)]
        assert all(t.transactional_id != "lost-coordinator-state"
                   for ts in admin.list_transactions().values() for t in ts)
    finally:
        admin.close()

    r = semel("txn", "abort", "--topic", TOPIC, "--partition", "0", "--producer-id", str(stuck.pid), *bootstrap)
    assert r.returncode == 0, r.stderr
    assert f"started at offset {start_offset}" in r.stdout
    assert sorted(read_to_end(b.bootstrap, TOPIC, 1)) == ["a", "b", "c", "d", "e"]
    assert semel("txn", "find-hanging", *bootstrap).stdout.strip() == "no hanging transactions"
    with Client(b.bootstrap) as c:
        assert c.list_offset(TOPIC, 0, -1, isolation=1) == c.list_offset(TOPIC, 0, -1)
    # a second abort finds nothing left to abort: one readable line, nothing written
    r = semel("txn", "abort", "--topic", TOPIC, "--partition", "0", "--producer-id", str(stuck.pid), *bootstrap)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "no open transaction" in r.stderr


def test_live_transaction_is_not_hanging_and_only_fencing_aborts_it(ops_broker):
    b, topic = ops_broker, "live"
    bootstrap = ["--bootstrap", b.bootstrap]
    with Client(b.bootstrap) as c:
        assert c.create_topic(topic, 1) == KafkaError.NONE
        live, _ = _open_txn(c, "live-one", topic, b"pending", timeout_ms=600_000)
        end = c.list_offset(topic, 0, -1)

        assert semel("txn", "find-hanging", "--topic", topic, *bootstrap).stdout.strip() == "no hanging transactions"
        # an admin ABORT marker would contradict the coordinator that owns the transaction: refused
        r = semel("txn", "abort", "--topic", topic, "--partition", "0", "--producer-id", str(live.pid), *bootstrap)
        assert r.returncode == 2 and "--transactional-id" in r.stderr
        assert c.list_offset(topic, 0, -1) == end   # nothing written

        listed = semel("txn", "list", *bootstrap).stdout.splitlines()
        assert f"live-one\t{live.pid}\tOngoing" in listed
        described = semel("txn", "describe", "live-one", *bootstrap).stdout
        assert "state: Ongoing" in described and f"partitions: {topic}-0" in described

        r = semel("txn", "abort", "--transactional-id", "live-one", *bootstrap)
        assert r.returncode == 0, r.stderr
        assert "its open transaction was aborted" in r.stdout
        assert c.list_offset(topic, 0, -1, isolation=1) == c.list_offset(topic, 0, -1)
        assert live.end(True) == KafkaError.PRODUCER_FENCED
        assert read_to_end(b.bootstrap, topic, 1) == []   # LSO == high watermark above
        assert "state: Empty" in semel("txn", "describe", "live-one", *bootstrap).stdout


def test_kafka_admin_reads_what_semel_txn_shows(ops_broker):
    b, topic = ops_broker, "admin-read"
    with Client(b.bootstrap) as c:
        assert c.create_topic(topic, 2) == KafkaError.NONE
        open_txn = RawTxn(c, "adm-open", timeout_ms=120_000)
        assert open_txn.init() == KafkaError.NONE
        open_txn.add((topic, 0), (topic, 1))
        open_txn.produce(topic, 1, b"x")
        done = RawTxn(c, "adm-done")
        assert done.init() == KafkaError.NONE
        done.add((topic, 0))
        done.produce(topic, 0, b"y")
        assert done.end(True) == KafkaError.NONE
    from kafka.admin._transactions import TransactionState
    admin = _kafka_admin(b.bootstrap)
    try:
        listed = {t.transactional_id: (t.producer_id, t.state.value) for ts in admin.list_transactions().values()
                  for t in ts if t.transactional_id.startswith("adm-")}
        assert listed == {"adm-open": (open_txn.pid, "Ongoing"), "adm-done": (done.pid, "CompleteCommit")}
        # the wire value: kafka-python 3.0.12 encodes a TransactionState member as "TransactionState.ONGOING"
        ongoing = admin.list_transactions(state_filters=[TransactionState.ONGOING.value],
                                          producer_id_filters=[open_txn.pid, done.pid])
        assert [t.transactional_id for ts in ongoing.values() for t in ts] == ["adm-open"]
        d = admin.describe_transactions(["adm-open"])["adm-open"]
        assert (d.producer_id, d.producer_epoch, d.transaction_timeout_ms) == (open_txn.pid, open_txn.epoch, 120_000)
        assert {(tp.topic, tp.partition) for tp in d.topic_partitions} == {(topic, 0), (topic, 1)}
        assert d.transaction_start_time_ms > 0
        assert admin.find_hanging_transactions() == []
    finally:
        admin.close()
    r = semel("txn", "list", "--bootstrap", b.bootstrap)
    assert [line for line in r.stdout.splitlines() if line.startswith("adm-")] == [
        f"adm-done\t{done.pid}\tCompleteCommit", f"adm-open\t{open_txn.pid}\tOngoing"]


def test_transaction_admin_bad_input_on_the_wire(ops_broker):
    b, topic = ops_broker, "bad-input"
    with Client(b.bootstrap) as c:
        assert c.create_topic(topic, 1) == KafkaError.NONE
    s = connect(b.bootstrap)
    try:
        r = call(s, 65, 0, transactional_ids=["nobody", ""])
        assert [t.error_code for t in r.transaction_states] == [KafkaError.TRANSACTIONAL_ID_NOT_FOUND] * 2
        r = call(s, 66, 2, state_filters=["Ongoing", "Sleeping"], producer_id_filters=[], duration_filter=-1,
                 transactional_id_pattern=None)
        assert r.error_code == 0 and list(r.unknown_state_filters) == ["Sleeping"]
        # Kafka's name of a state no listed transaction is in: known, and it matches nothing.
        r = call(s, 66, 2, state_filters=["PrepareEpochFence"], producer_id_filters=[], duration_filter=-1,
                 transactional_id_pattern=None)
        assert r.error_code == 0 and list(r.unknown_state_filters) == [] and list(r.transaction_states) == []
        r = call(s, 66, 2, state_filters=[], producer_id_filters=[], duration_filter=-1,
                 transactional_id_pattern="([unclosed")
        assert r.error_code == KafkaError.INVALID_REGULAR_EXPRESSION
        T = request_class(61).TopicRequest
        r = call(s, 61, 0, topics=[T(name="missing", partition_indexes=[0]), T(name=topic, partition_indexes=[7]),
                                   T(name="__transaction_state", partition_indexes=[0])])
        assert [p.error_code for t in r.topics for p in t.partitions] == [
            KafkaError.UNKNOWN_TOPIC_OR_PARTITION] * 3
        M = request_class(27).WritableTxnMarker
        r = call(s, 27, 1, markers=[M(producer_id=1, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
                                      topics=[M.WritableTxnMarkerTopic(name=topic, partition_indexes=[0])])])
        assert r.markers[0].topics[0].partitions[0].error_code == KafkaError.INVALID_REQUEST   # no admin commits
    finally:
        s.close()
    with Client(b.bootstrap) as c:
        assert c.list_offset(topic, 0, -1) == 0   # nothing was written


@pytest.mark.parametrize("args, message", [
    (("abort", "--topic", TOPIC), "--partition"),
    (("abort", "--topic", TOPIC, "--partition", "0"), "--producer-id or --start-offset"),
    (("abort", "--transactional-id", "nobody"), "no transactional id"),
    (("describe", "nobody"), "no transactional id"),
    (("stats", "--metrics", "127.0.0.1:1"), "cannot read metrics"),
])
def test_txn_cli_errors_are_one_line(ops_broker, args, message):
    r = semel("txn", *args, "--bootstrap", ops_broker.bootstrap)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_transaction_past_its_timeout_is_hanging_until_fenced(start_broker):
    # The coordinator's own timeout sweep is made too rare to run during the test,
    # which is how a coordinator that cannot complete a transaction looks from outside.
    b = start_broker("--transaction-abort-check-interval-ms", "3600000")
    bootstrap = ["--bootstrap", b.bootstrap]
    with Client(b.bootstrap) as c:
        assert c.create_topic(TOPIC, 1) == KafkaError.NONE
        late, _ = _open_txn(c, "overdue", TOPIC, b"late", timeout_ms=1000)

        def reported():
            r = semel("txn", "find-hanging", "--grace-ms", "0", *bootstrap)
            return r.stdout if "overdue" in r.stdout else None
        out = wait.until(reported, "the transaction outlives its 1000 ms timeout")
        row = out.splitlines()[1].split("\t")
        assert row[:3] == [TOPIC, "0", str(late.pid)] and row[6] == "overdue"
        assert "past its 1000 ms timeout" in row[7]
        # with the default grace (60 s past the timeout) it is not reported yet
        assert semel("txn", "find-hanging", *bootstrap).stdout.strip() == "no hanging transactions"
        r = semel("txn", "abort", "--transactional-id", "overdue", *bootstrap)
        assert r.returncode == 0, r.stderr
        assert c.list_offset(TOPIC, 0, -1, isolation=1) == c.list_offset(TOPIC, 0, -1)
        assert semel("txn", "find-hanging", "--grace-ms", "0", *bootstrap).stdout.strip() == \
            "no hanging transactions"
