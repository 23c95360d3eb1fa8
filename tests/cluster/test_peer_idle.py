"""Inter-broker connections across idle gaps, on real processes: etcd and three semel
brokers that close connections idle for 1.5 s (connections.max.idle.ms). The transaction
coordinator's connection to a peer that leads a partition of the transaction is closed
by that peer between two transactions; the second transaction's markers still go
through at once, so the producer's next request finds the transaction complete (no
CONCURRENT_TRANSACTIONS) and read_committed sees both."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from semel.client.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError
from tests.support.admin import error_code
from tests.support.cluster import module_cluster, partitions
from tests.support.consume import read_values
from tests.support.txn import RawTxn, call
from tests.support.wait import until

IDLE_MS = 1500


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "peer-idle", 3, 2, "--connections-max-idle-ms", str(IDLE_MS)) as c:
        yield c


def _txn_round(cluster, txn: RawTxn, coordinator: int, leader: int, tp, value: str | None) -> list[KafkaError]:
    """One transaction of `txn` on new connections (the brokers close idle ones): add tp,
    write `value` there through its leader, commit. The errors of each step, in order."""
    with Client(cluster.brokers[coordinator].bootstrap, timeout_s=30) as c:
        txn.c = c
        errors = [txn.add(tp)[tp]]
    if value is not None:
        seq = txn.seq.get(tp, 0)
        batch = records.build_batch([(None, value.encode())], producer_id=txn.pid, producer_epoch=txn.epoch,
                                    base_sequence=seq, transactional=True)
        with Client(cluster.brokers[leader].bootstrap, timeout_s=30) as c:
            err, _ = c.produce(*tp, batch, transactional_id=txn.txn_id)
        txn.seq[tp] = seq + 1
        errors.append(err)
    with Client(cluster.brokers[coordinator].bootstrap, timeout_s=30) as c:
        txn.c = c
        errors.append(txn.end(commit=True))
    return errors


def _coordinator(cluster, txn_id: str) -> int:
    """The node id FindCoordinator names for `txn_id` (the first ask creates the
    transaction log, so it may answer COORDINATOR_NOT_AVAILABLE for a while)."""
    found = []

    def ask() -> bool:
        with Client(cluster.brokers[0].bootstrap, timeout_s=30) as c:
            r = call(c, 10, 3, key=txn_id, key_type=1)
        found.append(r.node_id)
        return r.error_code == 0
    until(ask, f"a coordinator for {txn_id}")
    return found[-1]


def _marker_retries(cluster, node: int) -> list[str]:
    log = (cluster.data_dir / f"broker-{node}.log").read_text(errors="replace")
    return [line for line in log.splitlines() if "markers to broker" in line]


def test_markers_after_the_peer_closed_the_idle_connection(cluster):
    topic = f"idle-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    assert error_code(admin.create_topics([NewTopic(topic, 3, 3)])[topic]) == KafkaError.NONE
    until(lambda: all(leader >= 0 for leader, *_ in partitions(cluster, topic).values()), f"{topic} led")
    txn_id = f"idle-txn-{uuid.uuid4().hex[:8]}"
    coordinator = _coordinator(cluster, txn_id)
    part, leader = next((p, st[0]) for p, st in sorted(partitions(cluster, topic).items()) if st[0] != coordinator)
    tp = (topic, part)
    txn = RawTxn(None, txn_id)
    with Client(cluster.brokers[coordinator].bootstrap, timeout_s=30) as c:
        txn.c = c
        until(lambda: txn.init() == KafkaError.NONE, "producer id")
    assert _txn_round(cluster, txn, coordinator, leader, tp, "first") == [KafkaError.NONE] * 3
    # the leader closes the coordinator's marker connection, idle past connections.max.idle.ms
    time.sleep(IDLE_MS / 1000 * 2.5)
    assert _txn_round(cluster, txn, coordinator, leader, tp, "second") == [KafkaError.NONE] * 3
    # the second transaction completed within its EndTxn: the next one starts at once
    assert _txn_round(cluster, txn, coordinator, leader, tp, None) == [KafkaError.NONE] * 2
    assert _marker_retries(cluster, coordinator) == []
    assert read_values(cluster.bootstrap, topic, 3, want=2) == ["first", "second"]
