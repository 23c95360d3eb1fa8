"""Helpers for share-group tests (KIP-932) with confluent-kafka's ShareConsumer."""
from __future__ import annotations

import time
import uuid

LOCK_MS = 2000   # short locks: the expiry tests wait for them
# One record per log batch: a share fetch acquires whole batches (past MaxRecords if
# need be, as Kafka does), so tests that split records between consumers write them apart.
ONE_PER_BATCH = {"batch.num.messages": 1, "linger.ms": 0}


def names(prefix: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:6]
    return f"{prefix}-{tag}", f"sg-{prefix}-{tag}"


def fill(bootstrap: str, topic: str, n: int = 50, partitions: int = 1) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})   # kept alive until the answer comes
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, **ONE_PER_BATCH})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=i % partitions)
    assert p.flush(30) == 0


def set_group_configs(bootstrap: str, group: str, **values: str) -> None:
    """IncrementalAlterConfigs SET on the GROUP resource (keys with dots as `_`)."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    entries = [ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
               for k, v in values.items()]
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([res])[res].result(30)


def share_consumer(bootstrap: str, group: str, topic: str, **extra: object):
    from confluent_kafka import ShareConsumer
    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "group.id": group}
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    c = ShareConsumer(conf)
    c.subscribe([topic])
    return c


def poll_until(consumer, want, timeout_s: float = 60, on_message=None) -> list:
    """Poll until `want(seen)` holds; returns the messages seen (errors fail the test).
    `on_message(m)` runs for each message (an explicit-mode acknowledgement)."""
    seen: list = []
    deadline = time.time() + timeout_s
    while not want(seen):
        assert time.time() < deadline, f"gave up after {len(seen)} record(s)"
        for m in consumer.poll(0.5):
            assert m.error() is None, m.error()
            seen.append(m)
            if on_message is not None:
                on_message(m)
    return seen


def read_all(bootstrap: str, group: str, topic: str, n: int, quiet_s: float = 2.0) -> list:
    """A new share consumer (implicit mode) reads `n` records, then whatever comes
    until it is quiet for `quiet_s`; closed after."""
    c = share_consumer(bootstrap, group, topic)
    try:
        seen = poll_until(c, lambda s: len(s) >= n)
        return seen + drain(c, quiet_s)
    finally:
        c.close()


def drain(consumer, quiet_s: float = 4.0, on_message=None) -> list:
    """Poll until nothing came for `quiet_s` seconds."""
    seen: list = []
    last = time.time()
    while time.time() - last < quiet_s:
        for m in consumer.poll(0.5):
            assert m.error() is None, m.error()
            seen.append(m)
            last = time.time()
            if on_message is not None:
                on_message(m)
    return seen


def accept_some_then(bootstrap: str, group: str, topic: str, accept_below: int, then) -> tuple[list, list]:
    """An explicit-mode share consumer accepts the records below offset `accept_below`
    and holds the others of the poll that first hands one out (acquired, never
    acknowledged); once its acknowledgements are answered, `then()` runs (a kill, a
    power cut) and the consumer is closed. Returns (accepted, held), each a list of
    (offset, value) pairs."""
    c = share_consumer(bootstrap, group, topic, share_acknowledgement_mode="explicit", max_poll_records=10)
    accepted: list[tuple[int, str]] = []
    held: list[tuple[int, str]] = []
    try:
        def ack(m):
            if m.offset() < accept_below:
                c.acknowledge(m)
                accepted.append((m.offset(), m.value().decode()))
            else:
                held.append((m.offset(), m.value().decode()))
        # Explicit mode polls again only once all is acknowledged: stop at the first
        # poll that hands out a record kept unacknowledged.
        poll_until(c, lambda s: bool(held), on_message=ack)
        c.commit_sync()
        then()
    finally:
        try:
            c.close()
        except Exception:
            pass   # its broker is gone
    return accepted, held


# Run as a child process: a share consumer (explicit mode) that acquires records,
# prints their offsets, and then holds them without acknowledging (the test SIGKILLs it).
HOLDER = """
import sys, time
from confluent_kafka import ShareConsumer
c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                   "share.acknowledgement.mode": "explicit", "max.poll.records": int(sys.argv[4])})
c.subscribe([sys.argv[3]])
while True:
    msgs = c.poll(0.5)
    if len(msgs):
        print(" ".join(str(m.offset()) for m in msgs), flush=True)
        time.sleep(3600)
"""
