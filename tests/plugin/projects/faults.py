"""An outside project's tests of the faults that need the machine's help: a power cut
(FUSE) and a network partition (network namespaces, root)."""
import time
import uuid

from confluent_kafka import Consumer, Producer


def produce(config, topic, values, timeout_s=30):
    """How many of `values` were not delivered within timeout_s."""
    failed = []
    p = Producer({**config, "message.timeout.ms": int(timeout_s * 1000)})
    for v in values:
        p.produce(topic, v, on_delivery=lambda err, msg: err and failed.append(err))
    left = p.flush(timeout_s + 5)
    return left + len(failed)


def consume(config, topic, n, timeout_s=20):
    c = Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    return got


def test_power_cut_keeps_what_was_acknowledged(semel_broker_factory):
    broker = semel_broker_factory(power_cut=True)
    cfg = broker.client_configs()["confluent"]
    topic = broker.topics("cut").make()
    assert produce({**cfg, "acks": "all"}, topic, [b"a", b"b"]) == 0
    broker.power_cut()
    assert not broker.alive()
    broker.restart()
    assert consume(cfg, topic, 2) == [b"a", b"b"]


def test_power_cut_loses_what_was_never_fsynced(semel_broker_factory):
    broker = semel_broker_factory(power_cut=True, args=("--flush-mode", "never"))
    cfg = broker.client_configs()["confluent"]
    topic = broker.topics("lost").make()
    assert produce({**cfg, "acks": "all"}, topic, [b"a", b"b"]) == 0
    broker.power_cut()
    broker.restart()
    assert consume(cfg, topic, 2, timeout_s=5) == []


def test_partition_then_heal(semel_broker_factory):
    broker = semel_broker_factory(network=True)
    cfg = broker.client_configs()["confluent"]
    topic = broker.topics("net").make()
    assert produce(cfg, topic, [b"before"]) == 0
    broker.partition()
    assert produce(cfg, topic, [b"during"], timeout_s=3) == 1   # dropped, not refused
    broker.heal()
    assert produce(cfg, topic, [b"after"]) == 0
    assert consume(cfg, topic, 2) == [b"before", b"after"]
