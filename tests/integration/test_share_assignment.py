"""The simple assignor with confluent-kafka's ShareConsumer on a real broker: two
consumers of a 4-partition topic are given two partitions each, disjoint (seen in
ShareGroupDescribe once both took their assignment), and each then reads records only
from its own partitions, every record once between them."""
from __future__ import annotations

import time

import pytest
from support.wire import call, connect

from semel.client import Client
from tests.support.brokers import module_broker_fixture
from tests.support.share import names, set_group_configs, share_consumer

pytest.importorskip("confluent_kafka")

broker = module_broker_fixture("share-assign")
DESCRIBE = 77


def _members(bootstrap: str, group: str):
    with connect(bootstrap) as s:
        g = call(s, DESCRIBE, 1, group_ids=[group], include_authorized_operations=False).groups[0]
    return g.group_epoch, {m.member_id: (m.member_epoch, sorted(p for t in m.assignment.topic_partitions
                                                                for p in t.partitions)) for m in g.members}


def test_two_consumers_split_four_partitions(broker):
    from confluent_kafka import Producer
    topic, group = names("assign")
    with Client(broker.bootstrap) as c:
        c.create_topic(topic, 4)
    set_group_configs(broker.bootstrap, group, share_auto_offset_reset="earliest", share_heartbeat_interval_ms="1000")
    consumers = [share_consumer(broker.bootstrap, group, topic, client_id=f"w{i}") for i in range(2)]
    try:
        deadline = time.time() + 60
        while True:   # both joined, and each heartbeat since brought the current assignment
            for c in consumers:
                assert not c.poll(0.2)
            epoch, members = _members(broker.bootstrap, group)
            if len(members) == 2 and all(e == epoch for e, _ in members.values()):
                break
            assert time.time() < deadline, members
        parts = [ps for _, ps in members.values()]
        assert sorted(len(ps) for ps in parts) == [2, 2] and sorted(parts[0] + parts[1]) == [0, 1, 2, 3]
        time.sleep(1)   # the clients apply what their last heartbeat answered
        p = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(40):
            p.produce(topic, value=b"x", partition=i % 4)
        assert p.flush(30) == 0
        seen: list[list[tuple[int, int]]] = [[], []]
        deadline = time.time() + 60
        while sum(map(len, seen)) < 40:
            assert time.time() < deadline, seen
            for i, c in enumerate(consumers):
                seen[i] += [(m.partition(), m.offset()) for m in c.poll(0.2) if m.error() is None]
        from_each = [{part for part, _ in got} for got in seen]
        assert from_each[0].isdisjoint(from_each[1]) and all(len(f) == 2 for f in from_each)
        assert sorted(seen[0] + seen[1]) == sorted((i % 4, i // 4) for i in range(40))
    finally:
        for c in consumers:
            c.close()
