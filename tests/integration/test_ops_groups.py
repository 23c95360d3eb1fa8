"""`semel group list|describe|reset-offsets|delete` against a real broker, with a
live confluent-kafka group member, and confluent-kafka's AdminClient reading and
deleting the same groups (ListGroups, DescribeGroups, DeleteGroups, OffsetFetch).
Resetting or deleting a group with live members is refused (Kafka: the reset
needs an inactive group; DeleteGroups answers NON_EMPTY_GROUP) and changes nothing."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
from support import wait
from support.brokers import module_broker

TOPIC, GROUP, PER_PARTITION = "orders", "billing", 10


def semel(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "semel", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    with module_broker(tmp_path_factory, "ops-groups", "--group-initial-rebalance-delay-ms", "0",
                       "--group-min-session-timeout-ms", "1000") as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})   # kept referenced until its futures resolve
        admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(30)
        p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
        for part in (0, 1):
            for i in range(PER_PARTITION):
                p.produce(TOPIC, f"{part}-{i}".encode(), partition=part)
        assert p.flush(30) == 0
        yield b
        _ADMINS.pop(b.bootstrap, None)


def _member(bootstrap: str, group: str):
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "ops-member",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "session.timeout.ms": 6000,
                  "isolation.level": "read_committed"})
    c.subscribe([TOPIC])
    return c


def _consume(c, want: int, idle_s: float = 2.0) -> list[str]:
    """Poll until `want` records arrived, then `idle_s` more to catch any extra."""
    got: list[str] = []
    deadline = None
    start = time.monotonic()
    while deadline is None or time.monotonic() < deadline:
        assert time.monotonic() - start < 120, f"only {len(got)} of {want} records"
        m = c.poll(0.2)
        if m is not None and not m.error():
            got.append(m.value().decode())
        if deadline is None and len(got) >= want:
            deadline = time.monotonic() + idle_s
    return got


_ADMINS: dict[str, object] = {}


def _admin(bootstrap: str):
    """One AdminClient per broker, kept alive: a handle collected while its future
    is pending fails the future with _DESTROY."""
    from confluent_kafka.admin import AdminClient
    return _ADMINS.setdefault(bootstrap, AdminClient({"bootstrap.servers": bootstrap}))


def _committed(bootstrap: str, group: str) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions
    res = _admin(bootstrap).list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    return {tp.partition: tp.offset for tp in res.topic_partitions if tp.topic == TOPIC}


def _listed(bootstrap: str) -> dict[str, str]:
    res = _admin(bootstrap).list_consumer_groups(request_timeout=30).result(30)
    return {g.group_id: g.state.name for g in res.valid}


def test_group_with_live_member_is_read_and_protected(filled):
    b = ["--bootstrap", filled.bootstrap]
    c = _member(filled.bootstrap, GROUP)
    try:
        assert len(_consume(c, 2 * PER_PARTITION)) == 2 * PER_PARTITION
        c.commit(asynchronous=False)
        wait.until(lambda: _listed(filled.bootstrap).get(GROUP) == "STABLE", "the group is stable")

        r = semel("group", "list", *b)
        assert f"{GROUP}\tStable\tconsumer\tclassic" in r.stdout.splitlines()
        desc = _admin(filled.bootstrap).describe_consumer_groups([GROUP])[GROUP].result(30)
        assert desc.state.name == "STABLE" and [m.client_id for m in desc.members] == ["ops-member"]
        r = semel("group", "describe", GROUP, *b)
        assert r.returncode == 0, r.stderr
        assert f"group {GROUP}: Stable, 1 member(s)" in r.stdout
        assert f"member {desc.members[0].member_id} client ops-member" in r.stdout
        assert f"{TOPIC}\t0\t{PER_PARTITION}\t{PER_PARTITION}\t0" in r.stdout.splitlines()

        before = _committed(filled.bootstrap, GROUP)
        assert before == {0: PER_PARTITION, 1: PER_PARTITION}
        r = semel("group", "reset-offsets", GROUP, "--all-topics", "--to-earliest", "--execute", *b)
        assert r.returncode == 2 and "1 member(s)" in r.stderr and r.stderr.count("\n") == 1
        r = semel("group", "delete", GROUP, *b)
        assert r.returncode == 2 and "NON_EMPTY_GROUP" in r.stderr
        from confluent_kafka import KafkaError, KafkaException
        with pytest.raises(KafkaException) as exc:
            _admin(filled.bootstrap).delete_consumer_groups([GROUP])[GROUP].result(30)
        assert exc.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
        assert _committed(filled.bootstrap, GROUP) == before   # nothing changed
    finally:
        c.close()


def test_reset_offsets_then_a_member_rereads_exactly_that(filled):
    b = ["--bootstrap", filled.bootstrap]
    group = "reset-me"
    c = _member(filled.bootstrap, group)
    try:
        assert len(_consume(c, 2 * PER_PARTITION)) == 2 * PER_PARTITION
        c.commit(asynchronous=False)
    finally:
        c.close()   # leaves the group: Empty
    wait.until(lambda: _listed(filled.bootstrap).get(group) == "EMPTY", "the group is empty")

    r = semel("group", "reset-offsets", group, "--topic", f"{TOPIC}:0", "--to-offset", "5", *b)
    assert r.returncode == 0, r.stderr
    assert f"{TOPIC}\t0\t{PER_PARTITION}\t5" in r.stdout and "dry run" in r.stdout
    assert _committed(filled.bootstrap, group) == {0: PER_PARTITION, 1: PER_PARTITION}
    r = semel("group", "reset-offsets", group, "--topic", f"{TOPIC}:0", "--to-offset", "5", "--execute", *b)
    assert r.returncode == 0, r.stderr
    assert _committed(filled.bootstrap, group) == {0: 5, 1: PER_PARTITION}
    r = semel("group", "reset-offsets", group, "--all-topics", "--shift-by", "-3", "--execute", *b)
    assert r.returncode == 0, r.stderr
    assert _committed(filled.bootstrap, group) == {0: 2, 1: PER_PARTITION - 3}

    c = _member(filled.bootstrap, group)
    try:
        again = _consume(c, (PER_PARTITION - 2) + 3)
    finally:
        c.close()
    assert sorted(again) == sorted([f"0-{i}" for i in range(2, PER_PARTITION)] +
                                   [f"1-{i}" for i in range(PER_PARTITION - 3, PER_PARTITION)])


def test_delete_groups_by_semel_and_by_kafka_admin(filled):
    b = ["--bootstrap", filled.bootstrap]
    for group in ("to-delete-1", "to-delete-2"):
        # a group that only has offsets (committed outside group management)
        r = semel("group", "reset-offsets", group, "--topic", TOPIC, "--to-latest", "--execute", *b)
        assert r.returncode == 0, r.stderr
    assert {"to-delete-1", "to-delete-2"} <= set(_listed(filled.bootstrap))
    r = semel("group", "delete", "to-delete-1", *b)
    assert r.returncode == 0 and "deleted group to-delete-1" in r.stdout
    _admin(filled.bootstrap).delete_consumer_groups(["to-delete-2"])["to-delete-2"].result(30)
    listed = semel("group", "list", *b).stdout
    assert "to-delete-1" not in listed and "to-delete-2" not in listed
    assert _committed(filled.bootstrap, "to-delete-2") == {}
    r = semel("group", "delete", "to-delete-1", *b)
    assert r.returncode == 2 and "GROUP_ID_NOT_FOUND" in r.stderr
    r = semel("group", "describe", "to-delete-1", *b)
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.parametrize("args, message", [
    (("reset-offsets", "g", "--topic", f"{TOPIC}:9", "--to-earliest"), "partitions 0..1"),
    (("reset-offsets", "g", "--topic", f"{TOPIC}:x", "--to-earliest"), "TOPIC:P,P"),
    (("reset-offsets", "g", "--topic", "no-such-topic", "--to-earliest"), "UNKNOWN_TOPIC_OR_PARTITION"),
    (("reset-offsets", "never-committed", "--all-topics", "--to-earliest"), "no committed offsets"),
])
def test_group_cli_errors_are_one_line(filled, args, message):
    r = semel("group", *args, "--bootstrap", filled.bootstrap)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
