"""FindCoordinator on a single node: v0-3 (one key) and v4 (several keys, KIP-699) both
name this broker for groups and transactional ids; an unknown key type is refused per key."""
from __future__ import annotations

from semel.client.client import Client
from semel.protocol.errors import KafkaError
from tests.support.brokers import module_broker_fixture
from tests.support.txn import call

broker = module_broker_fixture("find-coordinator")


def test_one_key_and_several_keys_name_this_broker(broker):
    with Client(broker.bootstrap, timeout_s=10) as c:
        port = broker.port
        for version in (0, 1, 2, 3):
            r = call(c, 10, version, key="g", key_type=0)
            assert (r.error_code, r.node_id, r.port) == (0, 0, port)
        for key_type in (0, 1):
            r = call(c, 10, 4, key_type=key_type, coordinator_keys=["a", "b", "c"])
            assert [(x.key, x.error_code, x.node_id, x.port) for x in r.coordinators] == \
                [(k, 0, 0, port) for k in ("a", "b", "c")]
        r = call(c, 10, 4, key_type=7, coordinator_keys=["a", "b"])
        assert [(x.key, x.error_code) for x in r.coordinators] == [("a", KafkaError.INVALID_REQUEST),
                                                                   ("b", KafkaError.INVALID_REQUEST)]
