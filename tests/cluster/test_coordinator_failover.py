"""Coordinator failover on a real local cluster (etcd and three broker processes).

The transaction coordinator is the leader of `__transaction_state` and the group
coordinator the leader of `__consumer_offsets`, both replicated (RF3). SIGKILLing the
broker of either moves the coordinator with its partition's leadership:

- a transaction decided (PrepareCommit logged) whose marker cannot be written yet
  (its only partition is offline) is completed by the next coordinator after the
  first one's broker died: its records become visible to read_committed readers;
- a confluent-kafka consume-transform-produce copy goes on while the transaction
  coordinator's broker is hard-bounced (SIGKILL, restarted once the coordinator
  moved): output == input exactly once, LSO == high watermark on every leader after
  settling;
- committed offsets (plain and transactional) survive killing the group
  coordinator's broker, and the group is served by the new leader.
"""
from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from semel.client.client import Client, ClientError
from semel.eos.kafka import RESTART_SAFE_CONFIG
from semel.protocol.errors import KafkaError
from tests.support.cluster import committed, fill, leader_of, module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.copier import Copier
from tests.support.markers import starts_processes
from tests.support.txn import RawTxn, call
from tests.support.wait import in_background, until

TXN_TOPIC, OFFSETS_TOPIC = "__transaction_state", "__consumer_offsets"
PARTS = 3
N = 300


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    # One partition per internal topic: every id has the coordinators these tests move
    # (several partitions: tests/cluster/test_coordinator_partitions.py).
    with module_cluster(tmp_path_factory, "coord-failover", 3, 2, "--group-initial-rebalance-delay-ms", "0",
                        "--min-insync-replicas", "2", "--transaction-state-partitions", "1",
                        "--offsets-topic-partitions", "1") as c:
        yield c


def find_coordinator(cluster, key_type: int, via: int) -> tuple[int, int]:
    """(error, node id) of FindCoordinator asked of broker `via`."""
    with Client(cluster.brokers[via].bootstrap, timeout_s=10) as c:
        r = c.request(10, key="any", key_type=key_type)
    return r.error_code, r.node_id


def settle(cluster) -> None:
    """Every broker back, and every internal partition's ISR full again."""
    wait_brokers(cluster, {0, 1, 2})
    for topic in (TXN_TOPIC, OFFSETS_TOPIC):
        until(lambda t=topic: len(partitions(cluster, t)[0][3]) == 3, f"{topic}: full ISR", 90)


def create(cluster, topic: str, parts: int = PARTS, assignment=None) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = (NewTopic(topic, len(assignment), replica_assignment=assignment, config={"min.insync.replicas": "1"}) if assignment
           else NewTopic(topic, parts, 3, config={"min.insync.replicas": "2"}))
    admin.create_topics([new])[topic].result(30)
    until(lambda: all(leader >= 0 for leader, *_ in partitions(cluster, topic).values()), f"{topic}: leaders")


def lso_is_hw(cluster, topic: str) -> bool:
    """Every partition's LSO equals its high watermark, asked of its leader."""
    for p, (leader, *_rest) in partitions(cluster, topic).items():
        if leader < 0:
            return False
        with Client(cluster.brokers[leader].bootstrap, timeout_s=10) as c:
            if c.list_offset(topic, p, -1, 1) != c.list_offset(topic, p, -1, 0):
                return False
    return True


def test_find_coordinator_answers_each_internal_partitions_leader(cluster):
    """Both key types, asked of every broker: the leader of the key type's internal
    partition (created at the first FindCoordinator), and only it serves the APIs."""
    for key_type, topic in ((1, TXN_TOPIC), (0, OFFSETS_TOPIC)):
        until(lambda k=key_type: find_coordinator(cluster, k, 0)[0] == 0, "a coordinator")
        leader = leader_of(cluster, topic)
        assert {find_coordinator(cluster, key_type, n) for n in range(3)} == {(0, leader)}
        assert len(partitions(cluster, topic)[0][2]) == 3          # replicated on all three
    txn_leader = leader_of(cluster, TXN_TOPIC)
    for n in range(3):
        with Client(cluster.brokers[n].bootstrap, timeout_s=10) as c:
            t = RawTxn(c, "who-coordinates")
            if n == txn_leader:
                until(lambda t=t: t.init() == KafkaError.NONE, "InitProducerId at the coordinator")
            else:
                assert t.init() == KafkaError.NOT_COORDINATOR


def test_new_coordinator_completes_a_prepared_commit(cluster):
    """PrepareCommit logged, its marker blocked (the partition's only replica is paused
    and offline), the coordinator's broker SIGKILLed: the next coordinator rolls the
    decision forward once the partition is back, and the records become visible."""
    settle(cluster)
    coord = leader_of(cluster, TXN_TOPIC)
    holder = next(n for n in range(3) if n != coord)
    create(cluster, "prepared", assignment=[[holder]])
    with Client(cluster.brokers[coord].bootstrap, timeout_s=30) as cc, \
            Client(cluster.brokers[holder].bootstrap, timeout_s=30) as hc:
        txn = RawTxn(cc, "prepared-txn", timeout_ms=120_000)
        until(lambda: txn.init() == KafkaError.NONE, "InitProducerId at the coordinator")
        assert txn.add(("prepared", 0)) == {("prepared", 0): KafkaError.NONE}
        txn.c = hc                                   # the batch goes to the partition's leader
        assert txn.produce("prepared", 0, b"p1", b"p2")[0] == KafkaError.NONE
        txn.c = cc
        cluster.brokers[holder].pause()
        try:
            until(lambda: partitions(cluster, "prepared")[0][0] == -1, "the paused holder's partition offline")
            assert txn.end(True) == KafkaError.NONE          # decided: PrepareCommit replicated
        except BaseException:
            cluster.brokers[holder].resume()
            raise
    cluster.brokers[coord].kill()
    try:
        successor = leader_of(cluster, TXN_TOPIC, skip={coord})
        assert successor not in (coord, holder)
    finally:
        cluster.brokers[holder].resume()
    until(lambda: partitions(cluster, "prepared")[0][0] == holder, "the holder leads its partition again", 90)
    got = until(lambda: read_values(cluster.bootstrap, "prepared", 1, "read_committed", want=2, idle_s=1) or None,
                "the prepared transaction's records committed", 90)
    assert sorted(got) == ["p1", "p2"]
    until(lambda: lso_is_hw(cluster, "prepared"), "LSO == high watermark")
    cluster.brokers[coord].restart()
    settle(cluster)


def test_copy_goes_on_exactly_once_when_the_transaction_coordinator_is_bounced(cluster):
    settle(cluster)
    create(cluster, "fo-in")
    create(cluster, "fo-out")
    values = fill(cluster, "fo-in", N, PARTS)
    ends = {p: sum(1 for i in range(N) if i % PARTS == p) for p in range(PARTS)}
    copier = Copier(cluster, "fo-in", "fo-out", "fo-copy")
    coord = leader_of(cluster, TXN_TOPIC)
    some = threading.Event()
    worker, errors = in_background(lambda: copier.run(ends, lambda commits: commits >= 3 and some.set()), some)
    assert some.wait(120)
    # A hard bounce (Kafka's transactions_test): SIGKILL, and the broker comes back once
    # the coordinator has moved (leadership does not move back to it).
    cluster.brokers[coord].kill()
    try:
        assert leader_of(cluster, TXN_TOPIC, skip={coord}) != coord
    finally:
        cluster.brokers[coord].restart()
    worker.join(300)
    assert not worker.is_alive() and errors == [], copier.failures
    settle(cluster)
    got = read_values(cluster.bootstrap, "fo-out", PARTS, "read_committed", want=N)
    assert sorted(got) == values, copier.failures
    until(lambda: lso_is_hw(cluster, "fo-out"), "LSO == high watermark on every leader")


def test_committed_offsets_survive_the_group_coordinators_broker(cluster):
    settle(cluster)
    create(cluster, "go-in")
    tps = [TopicPartition("go-in", p) for p in range(PARTS)]
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "go-plain", "enable.auto.commit": False,
                  **RESTART_SAFE_CONFIG})
    c.commit(offsets=[TopicPartition("go-in", p, 10 + p) for p in range(PARTS)], asynchronous=False)
    c.close()
    with Client(cluster.brokers[leader_of(cluster, TXN_TOPIC)].bootstrap, timeout_s=30) as tc:
        txn = RawTxn(tc, "go-txn")
        until(lambda: txn.init() == KafkaError.NONE, "InitProducerId")
        assert txn.add_offsets("go-txn-group") == KafkaError.NONE
        gc_node = leader_of(cluster, OFFSETS_TOPIC)
        with Client(cluster.brokers[gc_node].bootstrap, timeout_s=30) as gc:
            txn.c = gc
            assert set(txn.commit_offsets("go-txn-group", {("go-in", p): 20 + p for p in range(PARTS)}).values()) \
                == {KafkaError.NONE}
            txn.c = tc
        assert txn.end(True) == KafkaError.NONE
    want_plain = {p: 10 + p for p in range(PARTS)}
    want_txn = {p: 20 + p for p in range(PARTS)}
    until(lambda: committed(cluster, "go-txn-group", tps) == want_txn, "the transactional offsets committed")
    victim = leader_of(cluster, OFFSETS_TOPIC)
    cluster.brokers[victim].kill()
    try:
        successor = leader_of(cluster, OFFSETS_TOPIC, skip={victim})
        assert successor != victim
        assert committed(cluster, "go-plain", tps) == want_plain
        assert committed(cluster, "go-txn-group", tps) == want_txn
        for n in set(range(3)) - {victim}:
            assert find_coordinator(cluster, 0, n) == (0, successor)
    finally:
        cluster.brokers[victim].restart()
    settle(cluster)
    assert committed(cluster, "go-plain", tps) == want_plain


def test_a_broker_that_does_not_lead_offsets_refuses_the_group_apis(cluster):
    settle(cluster)
    create(cluster, "lg-in")
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "lg-group", "enable.auto.commit": False,
                  **RESTART_SAFE_CONFIG})
    c.commit(offsets=[TopicPartition("lg-in", 0, 1)], asynchronous=False)
    c.close()
    gc_node = leader_of(cluster, OFFSETS_TOPIC)
    for n in set(range(3)) - {gc_node}:
        with Client(cluster.brokers[n].bootstrap, timeout_s=10) as c:
            assert c.request(9, group_id="go-plain", topics=None).error_code == KafkaError.NOT_COORDINATOR
            assert call(c, 12, 4, group_id="go-plain", generation_id=1, member_id="m",
                        group_instance_id=None).error_code == KafkaError.NOT_COORDINATOR
            # ListGroups asks every broker: one that coordinates nothing lists nothing, no error.
            r = call(c, 16, 4, states_filter=[])
            assert (r.error_code, r.groups) == (0, [])
    with Client(cluster.brokers[gc_node].bootstrap, timeout_s=10) as c:
        listed = until(lambda: (r := call(c, 16, 4, states_filter=[])).error_code == 0 and r.groups, "groups listed")
        assert "lg-group" in {g.group_id for g in listed}


def test_a_restarted_broker_answers_clients_only_once_it_has_joined(cluster):
    """A broker restarted within its lease's TTL waits for its old session to end before
    it joins. Meanwhile it must not answer: its view is not loaded, and a Metadata listing
    no broker makes librdkafka forget every broker it knew (with
    metadata.recovery.strategy=none for good; the copy above stalled that way in 2 of ~10
    loaded runs). Every answer its port gives, before the kill and after the restart, lists
    the broker itself among the live ones."""
    settle(cluster)
    node = 2
    victim = cluster.brokers[node]
    answers: list[set[int]] = []
    stop = threading.Event()

    def ask():
        while not stop.is_set():
            try:
                with Client(victim.bootstrap, timeout_s=5) as c:
                    answers.append({b.node_id for b in c.metadata([]).brokers})
            except (ClientError, OSError):
                stop.wait(0.01)

    poller = threading.Thread(target=ask, daemon=True)
    poller.start()
    try:
        until(lambda: answers, "an answer before the kill")
        victim.kill()
        before = len(answers)
        victim.restart()             # returns once its port accepts connections
        until(lambda: len(answers) > before, "an answer from the restarted broker")
    finally:
        stop.set()
        poller.join(30)
    assert [a for a in answers if node not in a] == []
    settle(cluster)
