"""The transaction coordinator's connections to its peers across idle gaps and peer
restarts, on real processes: etcd and three semel brokers. The connection to a peer
that leads a partition of the transaction is closed by that peer between two
transactions (idle past its connections.max.idle.ms, 1.5 s here; or the peer restarts);
the next transaction's markers still go through at once, so the producer's next request
finds the transaction complete (no CONCURRENT_TRANSACTIONS) and read_committed sees
what was committed."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from semel.protocol.errors import KafkaError
from tests.support.admin import error_code
from tests.support.cluster import marker_retries, module_cluster, partitions, raw_txn, txn_round, wait_brokers
from tests.support.consume import read_values
from tests.support.markers import starts_processes
from tests.support.wait import until

IDLE_MS = 1500


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "peer-idle", 3, 2, "--connections-max-idle-ms", str(IDLE_MS)) as c:
        yield c


def _create(cluster, topic: str, **how) -> None:
    """A topic led on every partition; `how`: NewTopic's partition count and replication
    factor, or its replica_assignment (the first replica of each leads it)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    assert error_code(admin.create_topics([NewTopic(topic, **how)])[topic]) == KafkaError.NONE
    until(lambda: all(leader >= 0 for leader, *_ in partitions(cluster, topic).values()), f"{topic} led")


def test_markers_after_the_peer_closed_the_idle_connection(cluster):
    topic = f"idle-{uuid.uuid4().hex[:8]}"
    _create(cluster, topic, num_partitions=3, replication_factor=3)
    txn, coordinator = raw_txn(cluster, f"idle-txn-{uuid.uuid4().hex[:8]}")
    part, leader = next((p, st[0]) for p, st in sorted(partitions(cluster, topic).items()) if st[0] != coordinator)
    tp = (topic, part)
    assert txn_round(cluster, txn, coordinator, leader, tp, "first") == [KafkaError.NONE] * 3
    # the leader closes the coordinator's marker connection, idle past connections.max.idle.ms
    time.sleep(IDLE_MS / 1000 * 2.5)
    assert txn_round(cluster, txn, coordinator, leader, tp, "second") == [KafkaError.NONE] * 3
    # the second transaction completed within its EndTxn: the next one starts at once
    assert txn_round(cluster, txn, coordinator, leader, tp, None) == [KafkaError.NONE] * 2
    assert marker_retries(cluster, coordinator) == []
    assert read_values(cluster.bootstrap, topic, 3, want=2) == ["first", "second"]


@pytest.fixture(scope="module")
@starts_processes
def kept_cluster(tmp_path_factory):
    """Brokers that keep idle connections (Kafka's default 10 minutes)."""
    with module_cluster(tmp_path_factory, "peer-restart", 3, 2) as c:
        yield c


def test_markers_after_the_peer_restarted(kept_cluster):
    cluster = kept_cluster
    txn, coordinator = raw_txn(cluster, f"restart-txn-{uuid.uuid4().hex[:8]}")
    peer = next(n for n in range(3) if n != coordinator)
    others = [n for n in range(3) if n != peer]
    before, after = f"before-{uuid.uuid4().hex[:8]}", f"after-{uuid.uuid4().hex[:8]}"
    _create(cluster, before, num_partitions=1, replica_assignment=[[peer, *others]])
    assert txn_round(cluster, txn, coordinator, peer, (before, 0), "first") == [KafkaError.NONE] * 3
    cluster.brokers[peer].stop()       # the coordinator's connection to it ends with it
    cluster.brokers[peer].start()
    wait_brokers(cluster, {0, 1, 2})
    _create(cluster, after, num_partitions=1, replica_assignment=[[peer, *others]])     # led by the restarted peer
    assert txn_round(cluster, txn, coordinator, peer, (after, 0), "second") == [KafkaError.NONE] * 3
    assert txn_round(cluster, txn, coordinator, peer, (after, 0), None) == [KafkaError.NONE] * 2
    assert marker_retries(cluster, coordinator) == []
    assert read_values(cluster.bootstrap, after, 1, want=1) == ["second"]
