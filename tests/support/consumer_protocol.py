"""Helpers of the consumer group protocol (KIP-848) tests: a confluent-kafka member on
`group.protocol=consumer` polling in its own thread, and readers of the group's state."""
from __future__ import annotations

import threading
import time

PARTITIONS = 4
RECORDS = 25   # per partition: 100 in all


def wait_for(cond, timeout_s: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def subscribe_knowing_partitions(consumer, topic: str, partitions: int = PARTITIONS, **listener) -> None:
    """Subscribe a kafka-python consumer and learn the topic's partitions before its first
    JoinGroup. A leader that assigns without them hands out nothing and rejoins once the
    metadata arrives; kafka-python 3.0.12 loses a rejoin started only by that metadata
    change when poll() times out mid-join (its own assignment clears the reason to rejoin,
    so the finished join is never taken up): the member keeps its heartbeats off, the
    broker expires it after the session timeout and the member never learns of it."""
    consumer.subscribe([topic], **listener)
    assert consumer.partitions_for_topic(topic) == set(range(partitions))


def create_and_fill(bootstrap: str, topic: str, partitions: int = PARTITIONS, n: int = RECORDS) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for part in range(partitions):
        for i in range(n):
            p.produce(topic, key=f"{part}-{i}".encode(), value=f"{topic}-{part}-{i}".encode(), partition=part)
    assert p.flush(30) == 0


class Member(threading.Thread):
    """A confluent-kafka consumer on the consumer protocol, polling in its own thread and
    committing (synchronously) what it read. Records which partitions it holds."""

    def __init__(self, bootstrap: str, group: str, topics: list[str], **extra):
        super().__init__(daemon=True)
        from confluent_kafka import Consumer
        conf = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                "enable.auto.commit": False, "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 1000}
        conf.update(extra)
        self.consumer = Consumer(conf)
        self.topics = topics
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.seen: list[tuple[str, int, int]] = []
        self.errors: list = []
        self.assigned: set[tuple[str, int]] = set()
        self.close_on_stop = True

    def _on_assign(self, consumer, parts):
        with self.lock:
            self.assigned |= {(p.topic, p.partition) for p in parts}

    def _on_revoke(self, consumer, parts):
        with self.lock:
            self.assigned -= {(p.topic, p.partition) for p in parts}

    def run(self):
        self.consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_revoke)
        while not self.stop_flag.is_set():
            msg = self.consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                self.errors.append(msg.error())
                continue
            with self.lock:
                self.seen.append((msg.topic(), msg.partition(), msg.offset()))
            try:
                self.consumer.commit(message=msg, asynchronous=False)
            except Exception as exc:   # a commit refused during reassignment is retried by the next one
                self.errors.append(exc)
        if self.close_on_stop:
            self.consumer.close()

    def holding(self) -> set[tuple[str, int]]:
        with self.lock:
            return set(self.assigned)

    def count(self) -> int:
        with self.lock:
            return len(self.seen)

    def stop(self, close: bool = True):
        self.close_on_stop = close
        self.stop_flag.set()
        self.join(30)


def semel_cli(*args) -> str:
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "semel", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        c.close()
    return {tp.partition: tp.offset for tp in got}


def admin_describe(bootstrap: str, group: str):
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(30)


def group_view(bootstrap: str, group: str):
    """The group as ConsumerGroupDescribe shows it, read with semel's own client."""
    from semel.client import Client
    from semel.protocol.api_keys import ApiKey
    with Client(bootstrap) as c:
        (g,) = c.request(ApiKey.CONSUMER_GROUP_DESCRIBE, group_ids=[group],
                         include_authorized_operations=False).groups
    return g


def group_epoch(bootstrap: str, group: str) -> int:
    return group_view(bootstrap, group).group_epoch


def member_epochs(bootstrap: str, group: str) -> dict:
    return {m.instance_id or m.member_id: m.member_epoch for m in group_view(bootstrap, group).members}


