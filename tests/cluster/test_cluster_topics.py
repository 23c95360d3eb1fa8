"""Topics on a cluster as on one node, with unmodified clients: brokers started with
--auto-create-topics create a topic a producer writes to (default partitions and
replication factor, through etcd as CreateTopics), and an illegal topic name is
INVALID_TOPIC_EXCEPTION on every path, so a producer fails at once instead of retrying.
Real processes: etcd and three semel brokers, one set for the module."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError as CKError, Producer

from semel.client.client import Client
from semel.protocol.errors import KafkaError
from tests.support.admin import ILLEGAL_TOPIC_NAMES, delivery_errors, produce_error
from tests.support.cluster import module_cluster, partitions
from tests.support.consume import read_values
from tests.support.markers import starts_processes
from tests.support.wait import until

DEFAULT_PARTITIONS = 2
DEFAULT_RF = 3


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "cluster-topics", 3, 2, "--auto-create-topics",
                        "--default-partitions", str(DEFAULT_PARTITIONS),
                        "--default-replication-factor", str(DEFAULT_RF)) as c:
        yield c


def _metadata_error(bootstrap: str, topic: str) -> KafkaError:
    with Client(bootstrap, timeout_s=10) as c:
        (t,) = c.metadata([topic]).topics
        return KafkaError(t.error_code)


def test_producer_to_a_new_topic_creates_it_replicated(cluster):
    topic = f"auto-{uuid.uuid4().hex[:8]}"
    values = [f"v{i:03d}" for i in range(200)]
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "message.timeout.ms": 60000})
    errors = []
    for v in values:
        p.produce(topic, value=v.encode(), on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(60) == 0
    assert errors == [None] * len(values)
    parts = partitions(cluster, topic)
    assert sorted(parts) == list(range(DEFAULT_PARTITIONS))
    assert all(len(replicas) == DEFAULT_RF and set(isr) == set(replicas) for _, _, replicas, isr in parts.values())
    assert sorted(read_values(cluster.bootstrap, topic, DEFAULT_PARTITIONS, want=len(values))) == values
    # every broker serves it (each opened its logs from etcd)
    until(lambda: all(_metadata_error(b.bootstrap, topic) == KafkaError.NONE for b in cluster.brokers),
          f"{topic} known to every broker")


def test_metadata_without_auto_creation_creates_nothing(cluster):
    topic = f"asked-{uuid.uuid4().hex[:8]}"
    # semel's client asks with allow_auto_topic_creation=false (as an admin client does)
    assert _metadata_error(cluster.brokers[0].bootstrap, topic) == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    assert produce_error(cluster.brokers[1].bootstrap, "__not-created") == KafkaError.INVALID_TOPIC_EXCEPTION
    assert _metadata_error(cluster.brokers[2].bootstrap, topic) == KafkaError.UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize("bad", ILLEGAL_TOPIC_NAMES)
def test_an_illegal_name_fails_a_producer_at_once(cluster, bad):
    assert [e.code() for e in delivery_errors(cluster.bootstrap, bad)] == [CKError.TOPIC_EXCEPTION]
    for b in cluster.brokers:
        assert _metadata_error(b.bootstrap, bad) == KafkaError.INVALID_TOPIC_EXCEPTION
        assert produce_error(b.bootstrap, bad) == KafkaError.INVALID_TOPIC_EXCEPTION
