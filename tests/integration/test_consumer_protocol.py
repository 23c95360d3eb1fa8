"""Kafka 4 consumer groups (KIP-848, group.protocol=consumer) with unmodified
confluent-kafka against a real broker process.

One member reads every record; two members split the partitions between them
(no partition held by both at once, each record read once); when one leaves the
other takes all; a static member comes back under its instance id; a regex
subscription picks up a topic created later; the group survives a broker SIGKILL.
Waiting loops have generous deadlines; no assertion is about time.
"""
from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.support.brokers import module_broker_fixture

pytest.importorskip("confluent_kafka")

HEARTBEAT_MS = 500
SESSION_MS = 6000
broker = module_broker_fixture(
    "consumer-protocol", "--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_MS),
    "--group-consumer-session-timeout-ms", str(SESSION_MS))

PARTITIONS = 4
RECORDS = 25   # per partition: 100 in all


def _wait(cond, timeout_s: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _create_and_fill(bootstrap: str, topic: str, partitions: int = PARTITIONS, n: int = RECORDS) -> None:
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


def _semel(*args) -> str:
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "semel", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _committed(bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        c.close()
    return {tp.partition: tp.offset for tp in got}


def _describe(bootstrap: str, group: str):
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(30)


def test_one_member_reads_every_record(broker):
    topic, group = f"cp-one-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    _create_and_fill(broker.bootstrap, topic)
    m = Member(broker.bootstrap, group, [topic])
    m.start()
    try:
        _wait(lambda: m.count() >= PARTITIONS * RECORDS, 60, "100 records")
        desc = _describe(broker.bootstrap, group)
        assert str(desc.type).endswith("CONSUMER"), desc.type   # served by ConsumerGroupDescribe
        assert [len(x.assignment.topic_partitions) for x in desc.members] == [PARTITIONS]
    finally:
        m.stop()
    offsets = [(t, p, o) for t, p, o in m.seen]
    assert len(offsets) == len(set(offsets)) == PARTITIONS * RECORDS
    assert _committed(broker.bootstrap, group, topic) == {p: RECORDS for p in range(PARTITIONS)}


def test_two_members_split_then_one_leaves(broker):
    topic, group = f"cp-two-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    _create_and_fill(broker.bootstrap, topic)
    a = Member(broker.bootstrap, group, [topic])
    b = Member(broker.bootstrap, group, [topic])
    a.start()
    _wait(lambda: len(a.holding()) == PARTITIONS, 60, "first member holds all partitions")
    b.start()
    overlap_seen = []

    def split():
        ha, hb = a.holding(), b.holding()
        if ha & hb:
            overlap_seen.append((ha, hb))
        return len(ha) == 2 and len(hb) == 2

    _wait(split, 60, "two members with two partitions each")
    desc = _describe(broker.bootstrap, group)
    assert len(desc.members) == 2
    _wait(lambda: _group_view(broker.bootstrap, group).group_state == "Stable", 30, "a stable group")
    # `semel group list|describe` show the protocol, the epochs and who holds what.
    listed = _semel("group", "list", "--bootstrap", broker.bootstrap)
    assert f"{group}\tStable\tconsumer\tconsumer" in listed.splitlines()
    view = _group_view(broker.bootstrap, group)
    described = _semel("group", "describe", group, "--bootstrap", broker.bootstrap)
    assert (f"group {group}: Stable, 2 member(s), consumer protocol (KIP-848), assignor uniform, "
            f"group epoch {view.group_epoch}, assignment epoch {view.assignment_epoch}") in described
    for m in view.members:
        held = ",".join(f"{tp.topic_name}-{p}" for tp in m.assignment.topic_partitions for p in tp.partitions)
        assert f"member {m.member_id} " in described and f"epoch {m.member_epoch} assigned {held}" in described
    _wait(lambda: a.count() + b.count() >= PARTITIONS * RECORDS, 60, "every record")
    b.stop()
    _wait(lambda: len(a.holding()) == PARTITIONS, 60, "the remaining member holds all partitions")
    a.stop()
    assert not overlap_seen, f"a partition held by both members: {overlap_seen[:1]}"
    read = a.seen + b.seen
    assert len(read) == len(set(read)) == PARTITIONS * RECORDS
    assert _committed(broker.bootstrap, group, topic) == {p: RECORDS for p in range(PARTITIONS)}


def test_static_member_comes_back_to_its_partitions(broker):
    topic, group = f"cp-static-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    _create_and_fill(broker.bootstrap, topic)
    a = Member(broker.bootstrap, group, [topic], **{"group.instance.id": "static-a"})
    b = Member(broker.bootstrap, group, [topic])
    a.start()
    b.start()
    _wait(lambda: len(a.holding()) == 2 and len(b.holding()) == 2, 60, "two members, two partitions each")
    held_a, held_b = a.holding(), b.holding()
    epoch_before = _group_epoch(broker.bootstrap, group)
    a.stop()   # a static member's close leaves with epoch -2: its partitions wait for it
    _wait(lambda: _member_epochs(broker.bootstrap, group).get("static-a") == -2, 30, "static leave recorded")
    assert b.holding() == held_b
    again = Member(broker.bootstrap, group, [topic], **{"group.instance.id": "static-a"})
    again.start()
    try:
        _wait(lambda: again.holding() == held_a, 60, "the static member back on its partitions")
        assert b.holding() == held_b
        assert _group_epoch(broker.bootstrap, group) == epoch_before   # no rebalance
    finally:
        again.stop()
        b.stop()


def _group_view(bootstrap: str, group: str):
    """The group as ConsumerGroupDescribe shows it, read with semel's own client."""
    from semel.client import Client
    from semel.protocol.api_keys import ApiKey
    with Client(bootstrap) as c:
        (g,) = c.request(ApiKey.CONSUMER_GROUP_DESCRIBE, group_ids=[group],
                         include_authorized_operations=False).groups
    return g


def _group_epoch(bootstrap: str, group: str) -> int:
    return _group_view(bootstrap, group).group_epoch


def _member_epochs(bootstrap: str, group: str) -> dict:
    return {m.instance_id or m.member_id: m.member_epoch for m in _group_view(bootstrap, group).members}


def test_regex_subscription_picks_up_a_new_topic(broker):
    prefix = f"cp-re-{uuid.uuid4().hex[:6]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    _create_and_fill(broker.bootstrap, f"{prefix}-one", partitions=2, n=10)
    m = Member(broker.bootstrap, group, [f"^{prefix}-.*"])
    m.start()
    try:
        _wait(lambda: m.count() >= 20, 60, "the first matching topic's records")
        _create_and_fill(broker.bootstrap, f"{prefix}-two", partitions=2, n=10)
        _create_and_fill(broker.bootstrap, f"other-{prefix}", partitions=1, n=5)   # does not match
        _wait(lambda: m.count() >= 40, 90, "the new matching topic's records")
        time.sleep(1)
        assert {t for t, _, _ in m.seen} == {f"{prefix}-one", f"{prefix}-two"}
        # The broker matched the regex (librdkafka sends its regexes joined, in parentheses).
        assert f"^{prefix}-.*" in _group_view(broker.bootstrap, group).members[0].subscribed_topic_regex
    finally:
        m.stop()
    assert len(m.seen) == len(set(m.seen)) == 40


def test_group_survives_a_broker_sigkill(start_broker):
    b = start_broker("--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_MS),
                     "--group-consumer-session-timeout-ms", "30000")
    topic, group = "cp-kill", "g-kill"
    _create_and_fill(b.bootstrap, topic)
    m = Member(b.bootstrap, group, [topic])
    m.start()
    try:
        _wait(lambda: m.count() >= PARTITIONS * RECORDS, 60, "every record before the kill")
        _wait(lambda: _committed(b.bootstrap, group, topic) == {p: RECORDS for p in range(PARTITIONS)},
              30, "commits")
        before = _group_view(b.bootstrap, group)
        b.kill()
        b.restart()
        after = _group_view(b.bootstrap, group)
        # The same group, members, epochs and assignment: it was in __consumer_offsets.
        assert (after.group_epoch, after.assignment_epoch) == (before.group_epoch, before.assignment_epoch)
        assert [(x.member_id, x.member_epoch) for x in after.members] == \
            [(x.member_id, x.member_epoch) for x in before.members]
        # The member goes on (heartbeats at its epoch are accepted) and reads what comes next.
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": b.bootstrap})
        for part in range(PARTITIONS):
            p.produce(topic, value=b"after", partition=part)
        assert p.flush(30) == 0
        _wait(lambda: m.count() >= PARTITIONS * (RECORDS + 1), 60, "records produced after the restart")
        assert [x.member_id for x in _group_view(b.bootstrap, group).members] == [before.members[0].member_id]
    finally:
        m.stop()
    assert len(m.seen) == len(set(m.seen)) == PARTITIONS * (RECORDS + 1)
    assert _committed(b.bootstrap, group, topic) == {p: RECORDS + 1 for p in range(PARTITIONS)}
    assert _group_view(b.bootstrap, group).members == []   # it left when it closed


def _tail(path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(line for line in text if not line.startswith("%"))[-2000:] or " | ".join(text[-lines:])


def test_transactional_copier_exactly_once_through_broker_sigkills(start_broker, tmp_path):
    """consume (consumer protocol) -> produce + offsets in one transaction, the broker
    SIGKILLed twice on the way: the sink holds every source record exactly once."""
    import subprocess
    import sys
    from pathlib import Path

    from semel.client import Client
    from tests.support.consume import read_values

    b = start_broker("--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_MS),
                     "--group-consumer-session-timeout-ms", str(SESSION_MS),
                     "--transaction-abort-check-interval-ms", "200")
    total = PARTITIONS * 50
    with Client(b.bootstrap) as c:
        c.create_topic("sink", PARTITIONS)
    _create_and_fill(b.bootstrap, "source", n=50)
    script = Path(__file__).resolve().parents[1] / "support" / "consumer_protocol_copier.py"

    def start_copier():
        return subprocess.Popen([sys.executable, str(script), "--bootstrap", b.bootstrap, "--source", "source",
                                 "--sink", "sink", "--group", "copier", "--txn-id", "copier-1",
                                 "--batch", "4", "--pause-ms", "400"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "copier.err", "ab"))

    def progress() -> int:
        # Offsets the copier committed (a read of the sink would wait for the copy to pause).
        nonlocal copier
        if copier.poll() is not None:   # it stops on any error; a new one takes over
            copier = start_copier()
        return sum(max(0, o) for o in _committed(b.bootstrap, "copier", "source").values())

    copier = start_copier()
    at_kills = []
    try:
        for _ in range(2):
            _wait(lambda: progress() > len(at_kills) * 40, 60,
                  f"progress after {at_kills}: {_tail(tmp_path / 'copier.err')}")
            at_kills.append(progress())
            b.kill()
            time.sleep(0.3)
            b.restart()
        _wait(lambda: progress() >= total, 180, "every record copied")
        time.sleep(2)   # a duplicate would show up after the count is reached
    finally:
        copier.kill()
        copier.wait()
    copied = read_values(b.bootstrap, "sink", PARTITIONS, idle_s=2.0)
    source = read_values(b.bootstrap, "source", PARTITIONS, idle_s=2.0)
    assert sorted(copied) == sorted(source) and len(set(copied)) == len(copied) == total
    assert at_kills[0] < total, f"the broker was killed only after the copy had finished: {at_kills}"
    assert _committed(b.bootstrap, "copier", "source") == {p: 50 for p in range(PARTITIONS)}
