"""Consumer groups with unmodified clients against a real broker process.

For each of kafka-python, confluent-kafka and aiokafka: two members of one group
share a 4-partition topic (the second join rebalances the first), the group
goes back to one member when the other leaves, every record is consumed, and the
committed offsets are what the members committed. Offsets survive a broker
SIGKILL + restart, and a member that stays up across the restart goes on
committing in its generation. Waiting loops have generous deadlines; no
assertion is about time.
"""
from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from tests.support.brokers import module_broker_fixture
from tests.support.consumer_protocol import create_and_fill, subscribe_knowing_partitions, wait_for

# One broker for the module's tests that take `broker` (every test names its own topic and
# group); the SIGKILL test starts its own.
broker = module_broker_fixture("groups-clients", "--group-initial-rebalance-delay-ms", "0",
                               "--group-min-session-timeout-ms", "1000")

PARTITIONS = 4
RECORDS = 40          # per partition
SESSION_MS = 6000


# --- kafka-python ---------------------------------------------------------------------------

class _KPMember(threading.Thread):
    """A kafka-python group member polling in its own thread; commits what it read."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        super().__init__(daemon=True)
        from kafka import KafkaConsumer
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500,
            max_poll_interval_ms=15000, metadata_max_age_ms=1000)
        subscribe_knowing_partitions(self.consumer, topic, PARTITIONS)
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.assigned: set[int] = set()
        self.seen: list[tuple[int, int]] = []
        self.error: BaseException | None = None

    def run(self):
        try:
            while not self.stop_flag.is_set():
                batches = self.consumer.poll(timeout_ms=200)
                with self.lock:
                    for tp, msgs in batches.items():
                        self.seen += [(tp.partition, m.offset) for m in msgs]
                    if batches:
                        self.consumer.commit()
                    self.assigned = {tp.partition for tp in self.consumer.assignment()}
        except BaseException as exc:  # reported by the test thread
            self.error = exc
        finally:
            self.consumer.close()     # LeaveGroup

    def leave(self):
        self.stop_flag.set()
        self.join(30)
        assert self.error is None, self.error


@pytest.mark.timeout(240)
def test_kafka_python_two_members_rebalance_commit_and_leave(broker):
    topic, group = f"kp-{uuid.uuid4().hex[:8]}", f"kp-group-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, topic, n=RECORDS)
    a = _KPMember(broker.bootstrap, group, topic)
    a.start()
    wait_for(lambda: a.assigned == set(range(PARTITIONS)), what="first member owns every partition")
    b = _KPMember(broker.bootstrap, group, topic)
    b.start()
    wait_for(lambda: len(a.assigned) == 2 and len(b.assigned) == 2 and not a.assigned & b.assigned,
          what="two members share the partitions")
    b.leave()
    wait_for(lambda: a.assigned == set(range(PARTITIONS)), what="the remaining member takes everything")
    wait_for(lambda: len(set(a.seen) | set(b.seen)) == PARTITIONS * RECORDS, what="every record consumed")
    a.leave()
    from kafka import KafkaConsumer, TopicPartition
    probe = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        committed = {p: probe.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
    finally:
        probe.close()
    assert committed == {p: RECORDS for p in range(PARTITIONS)}


# --- confluent-kafka ------------------------------------------------------------------------

def _ck_consumer(bootstrap: str, group: str, **extra):
    from confluent_kafka import Consumer
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 500, "max.poll.interval.ms": 15000}
    conf.update(extra)
    return Consumer(conf)


def _ck_poll_until(consumers, cond, seen, timeout_s=60, what="condition"):
    """Poll every consumer in turn (librdkafka runs the protocol in its own threads)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in consumers:
            m = c.poll(0.05)
            if m is not None and not m.error():
                seen.add((m.partition(), m.offset()))
                c.commit(message=m, asynchronous=False)
        if cond():
            return
    raise AssertionError(f"timed out waiting for {what}")


def _parts(c) -> set[int]:
    return {tp.partition for tp in c.assignment()}


@pytest.mark.timeout(240)
def test_confluent_two_members_rebalance_commit_and_leave(broker):
    from confluent_kafka import TopicPartition
    topic, group = f"ck-{uuid.uuid4().hex[:8]}", f"ck-group-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, topic, n=RECORDS)
    seen: set = set()
    a = _ck_consumer(broker.bootstrap, group)
    a.subscribe([topic])
    _ck_poll_until([a], lambda: _parts(a) == set(range(PARTITIONS)), seen, what="first member assigned")
    b = _ck_consumer(broker.bootstrap, group)
    b.subscribe([topic])
    _ck_poll_until([a, b], lambda: len(_parts(a)) == 2 and len(_parts(b)) == 2 and not _parts(a) & _parts(b),
                   seen, what="partitions shared by two members")
    b.close()
    _ck_poll_until([a], lambda: _parts(a) == set(range(PARTITIONS)) and len(seen) == PARTITIONS * RECORDS,
                   seen, what="remaining member owns everything and read it all")
    committed = a.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    assert {tp.partition: tp.offset for tp in committed} == {p: RECORDS for p in range(PARTITIONS)}
    a.close()


@pytest.mark.timeout(240)
def test_confluent_admin_lists_describes_and_deletes_groups(broker):
    from confluent_kafka import ConsumerGroupState, TopicPartition
    from confluent_kafka.admin import AdminClient
    topic, group = f"adm-{uuid.uuid4().hex[:8]}", f"adm-group-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, topic, partitions=2, n=5)
    seen: set = set()
    c = _ck_consumer(broker.bootstrap, group)
    c.subscribe([topic])
    _ck_poll_until([c], lambda: len(seen) == 10, seen, what="records consumed")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = admin.list_consumer_groups().result(30)
    assert group in {g.group_id for g in listed.valid}
    desc = admin.describe_consumer_groups([group])[group].result(30)
    assert desc.state == ConsumerGroupState.STABLE and len(desc.members) == 1
    assert {tp.partition for tp in desc.members[0].assignment.topic_partitions} == {0, 1}
    # a group with a member cannot be deleted
    with pytest.raises(Exception):
        admin.delete_consumer_groups([group])[group].result(30)
    c.close()
    admin.delete_consumer_groups([group])[group].result(30)
    probe = _ck_consumer(broker.bootstrap, group)
    try:
        committed = probe.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
        assert all(tp.offset < 0 for tp in committed)    # offsets went with the group
    finally:
        probe.close()


# --- aiokafka -------------------------------------------------------------------------------

@pytest.mark.timeout(240)
def test_aiokafka_two_members_rebalance_commit_and_leave(broker):
    topic, group = f"aio-{uuid.uuid4().hex[:8]}", f"aio-group-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, topic, n=RECORDS)

    async def scenario():
        from aiokafka import AIOKafkaConsumer, TopicPartition
        seen: set = set()

        def member():
            return AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500,
                                    max_poll_interval_ms=15000,
            # kafka-python may run the first assignment before it has the topic's
            # metadata; it rejoins when metadata changes, so refresh it often.
            metadata_max_age_ms=1000)

        async def pump(consumers, cond, what):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                for c in consumers:
                    batches = await c.getmany(timeout_ms=100)
                    for tp, msgs in batches.items():
                        seen.update((tp.partition, m.offset) for m in msgs)
                    if batches:
                        await c.commit()
                if cond():
                    return
            raise AssertionError(f"timed out waiting for {what}")

        def parts(c):
            return {tp.partition for tp in c.assignment()}

        a = member()
        await a.start()
        await pump([a], lambda: parts(a) == set(range(PARTITIONS)), "first member assigned")
        b = member()
        await b.start()
        await pump([a, b], lambda: len(parts(a)) == 2 and len(parts(b)) == 2, "partitions shared")
        await b.stop()
        await pump([a], lambda: parts(a) == set(range(PARTITIONS)) and len(seen) == PARTITIONS * RECORDS,
                   "remaining member owns everything and read it all")
        committed = {p: await a.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
        await a.stop()
        return committed

    assert asyncio.run(scenario()) == {p: RECORDS for p in range(PARTITIONS)}


# --- durability across a broker SIGKILL --------------------------------------------------------

@pytest.mark.timeout(300)
def test_committed_offsets_survive_broker_sigkill(start_broker):
    from confluent_kafka import TopicPartition
    broker = start_broker("--group-initial-rebalance-delay-ms", "0", "--group-min-session-timeout-ms", "1000")
    topic, group = f"kill-{uuid.uuid4().hex[:8]}", f"kill-group-{uuid.uuid4().hex[:6]}"
    simple = f"simple-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, topic, partitions=2, n=20)
    seen: set = set()
    c = _ck_consumer(broker.bootstrap, group)
    c.subscribe([topic])
    _ck_poll_until([c], lambda: len(seen) >= 25, seen, what="some records consumed and committed")
    before = {tp.partition: tp.offset
              for tp in c.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)}
    assert sum(before.values()) >= 25
    # a manual-assignment committer (generation -1) in another group
    s = _ck_consumer(broker.bootstrap, simple)
    s.commit(offsets=[TopicPartition(topic, 0, 7), TopicPartition(topic, 1, 9)], asynchronous=False)
    s.close()

    broker.kill()          # SIGKILL: no shutdown code runs
    broker.start()

    # the member that stayed up goes on committing in its (restored) generation
    deadline = time.monotonic() + 60
    while True:
        try:
            c.commit(offsets=[TopicPartition(topic, 0, before[0])], asynchronous=False)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    c.close()
    probe = _ck_consumer(broker.bootstrap, group)
    try:
        after = {tp.partition: tp.offset
                 for tp in probe.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)}
        assert after == before
    finally:
        probe.close()
    probe = _ck_consumer(broker.bootstrap, simple)
    try:
        got = {tp.partition: tp.offset
               for tp in probe.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)}
        assert got == {0: 7, 1: 9}
    finally:
        probe.close()
    # a new member resumes exactly after the committed positions
    resumed: set = set()
    r = _ck_consumer(broker.bootstrap, group)
    r.subscribe([topic])
    _ck_poll_until([r], lambda: len(resumed) >= 40 - sum(before.values()), resumed,
                   what="the rest of the records")
    assert resumed == {(p, o) for p in range(2) for o in range(before[p], 20)}
    r.close()
