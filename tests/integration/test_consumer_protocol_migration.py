"""Online migration of a live group between the classic protocol and the consumer
protocol (KIP-848) with unmodified clients against a real broker: two classic consumers
(kafka-python or aiokafka, eager; or librdkafka's cooperative-sticky) hold a group; a
confluent-kafka consumer on group.protocol=consumer joins it (the group is upgraded, the
classic members keep working through JoinGroup/SyncGroup/Heartbeat answered by the
server's assignor), then leaves (the group is classic again). Every member's holdings are
sampled throughout: no partition is ever held by two members; every record is consumed;
both kinds commit offsets.
"""
from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.support.brokers import module_broker_fixture
from tests.support.consumer_protocol import (
    PARTITIONS, Member, committed_offsets, group_view, semel_cli, subscribe_knowing_partitions, wait_for,
)

pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")
pytest.importorskip("aiokafka")

broker = module_broker_fixture(
    "consumer-protocol-migration", "--group-consumer-heartbeat-interval-ms", "500",
    "--group-consumer-session-timeout-ms", "6000", "--group-initial-rebalance-delay-ms", "0")

PHASE = 20   # records per partition produced in each of the three phases


class Holdings(threading.Thread):
    """A classic consumer's thread: what it holds (from its rebalance callbacks), what it
    read, how many commits went through, and the error it ended with."""

    def __init__(self):
        super().__init__(daemon=True)
        self.lock = threading.Lock()
        self.assigned: set[tuple[str, int]] = set()
        self.seen: list[tuple[str, int, int]] = []
        self.commits = 0
        self.error: BaseException | None = None
        self.stop_flag = threading.Event()

    def holding(self) -> set[tuple[str, int]]:
        with self.lock:
            return set(self.assigned)

    def read(self) -> set[tuple[str, int, int]]:
        with self.lock:
            return set(self.seen)

    def stop(self):
        self.stop_flag.set()
        self.join(30)


class ClassicMember(Holdings):
    """A kafka-python consumer (classic protocol, eager) whose holdings follow its
    rebalance callbacks; it commits what it read after each poll."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        super().__init__()
        from kafka import ConsumerRebalanceListener, KafkaConsumer
        member = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                with member.lock:
                    member.assigned -= {(tp.topic, tp.partition) for tp in revoked}

            def on_partitions_assigned(self, assigned):
                with member.lock:
                    member.assigned |= {(tp.topic, tp.partition) for tp in assigned}

        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
            auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=300,
            max_poll_interval_ms=30000, metadata_max_age_ms=1000)
        subscribe_knowing_partitions(self.consumer, topic, listener=Listener())

    def run(self):
        from kafka.errors import CommitFailedError, KafkaError
        try:
            while not self.stop_flag.is_set():
                batches = self.consumer.poll(timeout_ms=100)
                with self.lock:
                    for tp, msgs in batches.items():
                        self.seen += [(tp.topic, tp.partition, m.offset) for m in msgs]
                if batches:
                    try:
                        self.consumer.commit()
                        self.commits += 1
                    except (CommitFailedError, KafkaError):
                        pass   # a rebalance took the partitions: the next owner reads them again
        except BaseException as exc:   # reported by the test thread
            self.error = exc
        finally:
            self.consumer.close()

class AioClassicMember(Holdings):
    """An aiokafka consumer (classic protocol, eager) on its own event loop, with the same
    face as ClassicMember: holdings from its rebalance callbacks, commits after each batch."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        super().__init__()
        self.bootstrap, self.group, self.topic = bootstrap, group, topic

    def run(self):
        import asyncio
        try:
            asyncio.run(self._consume())
        except BaseException as exc:   # reported by the test thread
            self.error = exc

    async def _consume(self):
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
        from aiokafka.errors import CommitFailedError, KafkaError
        member = self

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                with member.lock:
                    member.assigned -= {(tp.topic, tp.partition) for tp in revoked}

            async def on_partitions_assigned(self, assigned):
                with member.lock:
                    member.assigned |= {(tp.topic, tp.partition) for tp in assigned}

        c = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=300,
                             max_poll_interval_ms=30000, metadata_max_age_ms=1000)
        c.subscribe([self.topic], listener=Listener())
        await c.start()
        try:
            while not self.stop_flag.is_set():
                batches = await c.getmany(timeout_ms=100)
                with self.lock:
                    for tp, msgs in batches.items():
                        self.seen += [(tp.topic, tp.partition, m.offset) for m in msgs]
                if batches:
                    try:
                        await c.commit()
                        self.commits += 1
                    except (CommitFailedError, KafkaError):
                        pass   # a rebalance took the partitions: the next owner reads them again
        finally:
            await c.stop()


def produce(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for part in range(PARTITIONS):
        for i in range(n):
            p.produce(topic, value=f"{part}-{i}".encode(), partition=part)
    assert p.flush(30) == 0


def group_type(bootstrap: str, group: str) -> str:
    from semel.client import Client
    from semel.protocol.api_keys import ApiKey
    with Client(bootstrap) as c:
        groups = c.request(ApiKey.LIST_GROUPS, states_filter=[], types_filter=[]).groups
    return next((g.group_type for g in groups if g.group_id == group), "")


def classic_member(kind: str, bootstrap: str, group: str, topic: str):
    if kind == "kafka-python-eager":
        return ClassicMember(bootstrap, group, topic)
    if kind == "aiokafka-eager":
        return AioClassicMember(bootstrap, group, topic)
    # librdkafka's classic protocol, cooperative: its JoinGroup reports what it still owns.
    return Member(bootstrap, group, [topic], **{
        "group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 300})


def reads(m) -> set:
    if isinstance(m, Holdings):
        return m.read()
    with m.lock:
        return {tuple(s) for s in m.seen}


def committed_some(m) -> bool:
    return bool(m.commits) if isinstance(m, Holdings) else m.count() > 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["kafka-python-eager", "aiokafka-eager", "confluent-classic-cooperative"])
def test_classic_members_and_a_consumer_protocol_member_share_a_group_through_upgrade_and_downgrade(broker, kind):
    from confluent_kafka.admin import AdminClient, NewTopic
    topic, group = f"mig-{uuid.uuid4().hex[:6]}", f"mig-g-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    produce(broker.bootstrap, topic, PHASE)
    every = [(topic, p) for p in range(PARTITIONS)]

    a, b = (classic_member(kind, broker.bootstrap, group, topic) for _ in range(2))
    members: list = [a, b]
    overlaps: list = []
    sampling = threading.Event()

    def sample():
        while not sampling.is_set():
            held = [m.holding() for m in list(members)]
            for i in range(len(held)):
                for j in range(i + 1, len(held)):
                    if held[i] & held[j]:
                        overlaps.append((i, j, held[i] & held[j]))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    a.start()
    b.start()
    sampler.start()

    def read() -> set:
        out: set = set()
        for m in members:
            out |= reads(m)
        return out

    try:
        wait_for(lambda: len(a.holding()) + len(b.holding()) == PARTITIONS and a.holding() and b.holding(),
                 90, "two classic members sharing the partitions")
        wait_for(lambda: len(read()) == PARTITIONS * PHASE, 60, "phase 1 read")
        assert group_type(broker.bootstrap, group) == "classic"

        c = Member(broker.bootstrap, group, [topic])   # confluent-kafka, group.protocol=consumer
        members.append(c)
        c.start()
        wait_for(lambda: group_type(broker.bootstrap, group) == "consumer", 60, "the group upgraded")
        wait_for(lambda: c.holding() and sorted(a.holding() | b.holding() | c.holding()) == every,
                 90, "the new member holds partitions beside the classic ones")
        # ConsumerGroupDescribe tells the kinds apart (member type 0: classic, 1: consumer).
        assert sorted(m.member_type for m in group_view(broker.bootstrap, group).members) == [0, 0, 1]
        described = semel_cli("group", "describe", group, "--bootstrap", broker.bootstrap)
        assert "consumer protocol (KIP-848)" in described
        assert sum(" classic protocol epoch " in line for line in described.splitlines()) == 2
        produce(broker.bootstrap, topic, PHASE)
        wait_for(lambda: len(read()) == 2 * PARTITIONS * PHASE, 60, "phase 2 read")
        wait_for(lambda: committed_some(a) and committed_some(b) and c.count(), 30, "commits by both kinds")

        c.stop()                                      # the last consumer-protocol member leaves
        members.remove(c)
        wait_for(lambda: group_type(broker.bootstrap, group) == "classic", 60, "the group downgraded")
        wait_for(lambda: sorted(a.holding() | b.holding()) == every, 90, "the classic members hold all again")
        produce(broker.bootstrap, topic, PHASE)
        wait_for(lambda: len(read() | reads(c)) == 3 * PARTITIONS * PHASE, 60,
                 "phase 3 read")
        wait_for(lambda: committed_offsets(broker.bootstrap, group, topic) ==
                 {p: 3 * PHASE for p in range(PARTITIONS)}, 60, "every offset committed")
    finally:
        sampling.set()
        for m in [a, b]:
            m.stop()
        sampler.join(5)
    assert all(getattr(m, "error", None) is None for m in (a, b)), [getattr(m, "error", None) for m in (a, b)]
    assert not overlaps, overlaps[:5]
    assert c.count() > 0 and not [e for e in c.errors if "FENCED" in str(e)]
