"""Dynamic broker configs on a real cluster (etcd and three broker processes), changed
with unmodified admin clients as an operator would and applied without a restart:
kafka-python for one broker's settings and for describing; the cluster-wide default
(its Kafka name "", which the admin clients here refuse to send) over semel's wire client."""
from __future__ import annotations

import socket

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from semel.client.client import Client
from semel.protocol.errors import KafkaError
from semel.protocol.messages import request_class
from tests.support.admin import alter_broker_config
from tests.support.cluster import module_cluster
from tests.support.wait import until
from tests.support.markers import starts_processes

DYNAMIC = {"log.retention.ms", "log.retention.bytes", "auto.create.topics.enable", "connections.max.idle.ms"}


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "broker-configs", 3, 2) as c:
        yield c


@pytest.fixture()
def kp(cluster):
    a = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
    yield a
    a.close()


def broker_configs(kp, node: int, flt: str = "all") -> dict:
    res = KPConfigResource(ConfigResourceType.BROKER, str(node))
    return kp.describe_configs([res], config_filter=flt)["broker"][str(node)]


def set_default(cluster, name: str, value: str | None) -> None:
    err, msg = alter_broker_config(cluster.brokers[0].bootstrap, "", name, value)
    assert err == 0, msg


def auto_creates(cluster, node: int, topic: str) -> bool:
    """Metadata for an unknown topic asking for auto-creation, sent to broker `node`."""
    cls = request_class(3)
    with Client(cluster.brokers[node].bootstrap, timeout_s=10) as c:
        md = c.request(3, topics=[cls.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=True)
    return md.topics[0].error_code in (KafkaError.NONE, KafkaError.LEADER_NOT_AVAILABLE)


def test_a_broker_lists_its_dynamic_settings_as_alterable(cluster, kp):
    dyn = broker_configs(kp, 0, "dynamic")
    assert set(dyn) == DYNAMIC
    assert dyn["auto.create.topics.enable"]["value"] == "false"
    assert {c["config_source"] for c in dyn.values()} == {"STATIC_BROKER_CONFIG"}


def test_one_brokers_auto_create_with_kafka_python(cluster, kp):
    assert not auto_creates(cluster, 1, "auto-before")
    res = KPConfigResource(ConfigResourceType.BROKER, "1", configs={"auto.create.topics.enable": "true"})
    kp.alter_configs([res])
    assert auto_creates(cluster, 1, "auto-on-1")            # at once, no restart
    assert not auto_creates(cluster, 0, "auto-not-on-0")    # only broker 1's setting
    got = broker_configs(kp, 1)["auto.create.topics.enable"]
    assert (got["value"], got["config_source"]) == ("true", "DYNAMIC_BROKER_CONFIG")
    kp.alter_configs([KPConfigResource(ConfigResourceType.BROKER, "1",
                                       configs={"auto.create.topics.enable": ("DELETE", None)})])
    assert not auto_creates(cluster, 1, "auto-after")
    assert broker_configs(kp, 1)["auto.create.topics.enable"]["config_source"] == "STATIC_BROKER_CONFIG"


def test_cluster_wide_retention_default_reaches_every_broker_and_topic(cluster, kp):
    set_default(cluster, "log.retention.ms", "3600000")
    try:
        for node in range(3):
            got = until(lambda n=node: broker_configs(kp, n)["log.retention.ms"], "described")
            assert (got["value"], got["config_source"]) == ("3600000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
        ck = AdminClient({"bootstrap.servers": cluster.bootstrap})
        ck.create_topics([NewTopic("retained", 1, 3)])["retained"].result(30)
        for node in range(3):   # a topic without its own retention follows the default on every broker
            with Client(cluster.brokers[node].bootstrap, timeout_s=10) as c:
                cls = request_class(32)
                r = c.request(32, resources=[cls.DescribeConfigsResource(
                    resource_type=2, resource_name="retained", configuration_keys=["retention.ms"])],
                    include_synonyms=False, include_documentation=False)
            assert r.results[0].configs[0].value == "3600000"
    finally:
        set_default(cluster, "log.retention.ms", None)
    assert until(lambda: broker_configs(kp, 2)["log.retention.ms"]["config_source"] == "STATIC_BROKER_CONFIG",
                 "the default removed")


def test_idle_limit_applies_to_open_connections_without_restart(cluster):
    s = socket.create_connection((cluster.brokers[2].host, cluster.brokers[2].port))
    try:
        set_default(cluster, "connections.max.idle.ms", "1000")
        s.settimeout(30)
        assert s.recv(1) == b""       # closed by the broker for idleness, under the new limit
    finally:
        s.close()
        set_default(cluster, "connections.max.idle.ms", None)


def test_settings_that_are_not_dynamic_are_refused(cluster, kp):
    for configs in ({"num.network.threads": "4"}, {"log.retention.ms": "soon"}):
        out = kp.alter_configs([KPConfigResource(ConfigResourceType.BROKER, "0", configs=configs)],
                               raise_on_unknown=False)
        assert "InvalidConfig" in repr(out)
    assert broker_configs(kp, 0)["log.retention.ms"]["config_source"] == "STATIC_BROKER_CONFIG"
