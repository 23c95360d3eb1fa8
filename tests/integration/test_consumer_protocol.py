"""Kafka 4 consumer groups (KIP-848, group.protocol=consumer) with unmodified
confluent-kafka against a real broker process.

One member reads every record; two members split the partitions between them
(no partition held by both at once, each record read once); when one leaves the
other takes all; a static member comes back under its instance id; a regex
subscription picks up a topic created later; the group survives a broker SIGKILL.
Waiting loops have generous deadlines; no assertion is about time.
"""
from __future__ import annotations

import time
import uuid

import pytest

from tests.support.brokers import module_broker_fixture
from tests.support.consumer_protocol import (
    PARTITIONS, RECORDS, Member, committed_offsets, create_and_fill, admin_describe, group_epoch, group_view,
    member_epochs, semel_cli, wait_for,
)

pytest.importorskip("confluent_kafka")

HEARTBEAT_MS = 500
SESSION_MS = 6000
broker = module_broker_fixture(
    "consumer-protocol", "--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_MS),
    "--group-consumer-session-timeout-ms", str(SESSION_MS))

def test_one_member_reads_every_record(broker):
    topic, group = f"cp-one-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, topic)
    m = Member(broker.bootstrap, group, [topic])
    m.start()
    try:
        wait_for(lambda: m.count() >= PARTITIONS * RECORDS, 60, "100 records")
        desc = admin_describe(broker.bootstrap, group)
        assert str(desc.type).endswith("CONSUMER"), desc.type   # served by ConsumerGroupDescribe
        assert [len(x.assignment.topic_partitions) for x in desc.members] == [PARTITIONS]
    finally:
        m.stop()
    offsets = [(t, p, o) for t, p, o in m.seen]
    assert len(offsets) == len(set(offsets)) == PARTITIONS * RECORDS
    assert committed_offsets(broker.bootstrap, group, topic) == {p: RECORDS for p in range(PARTITIONS)}


def test_two_members_split_then_one_leaves(broker):
    topic, group = f"cp-two-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, topic)
    a = Member(broker.bootstrap, group, [topic])
    b = Member(broker.bootstrap, group, [topic])
    a.start()
    wait_for(lambda: len(a.holding()) == PARTITIONS, 60, "first member holds all partitions")
    b.start()
    overlap_seen = []

    def split():
        ha, hb = a.holding(), b.holding()
        if ha & hb:
            overlap_seen.append((ha, hb))
        return len(ha) == 2 and len(hb) == 2

    wait_for(split, 60, "two members with two partitions each")
    desc = admin_describe(broker.bootstrap, group)
    assert len(desc.members) == 2
    wait_for(lambda: group_view(broker.bootstrap, group).group_state == "Stable", 30, "a stable group")
    # `semel group list|describe` show the protocol, the epochs and who holds what.
    listed = semel_cli("group", "list", "--bootstrap", broker.bootstrap)
    assert f"{group}\tStable\tconsumer\tconsumer" in listed.splitlines()
    view = group_view(broker.bootstrap, group)
    described = semel_cli("group", "describe", group, "--bootstrap", broker.bootstrap)
    assert (f"group {group}: Stable, 2 member(s), consumer protocol (KIP-848), assignor uniform, "
            f"group epoch {view.group_epoch}, assignment epoch {view.assignment_epoch}") in described
    for m in view.members:
        held = ",".join(f"{tp.topic_name}-{p}" for tp in m.assignment.topic_partitions for p in tp.partitions)
        assert f"member {m.member_id} " in described and f"epoch {m.member_epoch} assigned {held}" in described
    wait_for(lambda: a.count() + b.count() >= PARTITIONS * RECORDS, 60, "every record")
    b.stop()
    wait_for(lambda: len(a.holding()) == PARTITIONS, 60, "the remaining member holds all partitions")
    a.stop()
    assert not overlap_seen, f"a partition held by both members: {overlap_seen[:1]}"
    read = a.seen + b.seen
    assert len(read) == len(set(read)) == PARTITIONS * RECORDS
    assert committed_offsets(broker.bootstrap, group, topic) == {p: RECORDS for p in range(PARTITIONS)}


def test_static_member_comes_back_to_its_partitions(broker):
    topic, group = f"cp-static-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, topic)
    a = Member(broker.bootstrap, group, [topic], **{"group.instance.id": "static-a"})
    b = Member(broker.bootstrap, group, [topic])
    a.start()
    b.start()
    wait_for(lambda: len(a.holding()) == 2 and len(b.holding()) == 2, 60, "two members, two partitions each")
    held_a, held_b = a.holding(), b.holding()
    epoch_before = group_epoch(broker.bootstrap, group)
    a.stop()   # a static member's close leaves with epoch -2: its partitions wait for it
    wait_for(lambda: member_epochs(broker.bootstrap, group).get("static-a") == -2, 30, "static leave recorded")
    assert b.holding() == held_b
    again = Member(broker.bootstrap, group, [topic], **{"group.instance.id": "static-a"})
    again.start()
    try:
        wait_for(lambda: again.holding() == held_a, 60, "the static member back on its partitions")
        assert b.holding() == held_b
        assert group_epoch(broker.bootstrap, group) == epoch_before   # no rebalance
    finally:
        again.stop()
        b.stop()


def test_regex_subscription_picks_up_a_new_topic(broker):
    prefix = f"cp-re-{uuid.uuid4().hex[:6]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, f"{prefix}-one", partitions=2, n=10)
    m = Member(broker.bootstrap, group, [f"^{prefix}-.*"])
    m.start()
    try:
        wait_for(lambda: m.count() >= 20, 60, "the first matching topic's records")
        create_and_fill(broker.bootstrap, f"{prefix}-two", partitions=2, n=10)
        create_and_fill(broker.bootstrap, f"other-{prefix}", partitions=1, n=5)   # does not match
        wait_for(lambda: m.count() >= 40, 90, "the new matching topic's records")
        time.sleep(1)
        assert {t for t, _, _ in m.seen} == {f"{prefix}-one", f"{prefix}-two"}
        # The broker matched the regex (librdkafka sends its regexes joined, in parentheses).
        assert f"^{prefix}-.*" in group_view(broker.bootstrap, group).members[0].subscribed_topic_regex
    finally:
        m.stop()
    assert len(m.seen) == len(set(m.seen)) == 40


def test_group_survives_a_broker_sigkill(start_broker):
    b = start_broker("--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_MS),
                     "--group-consumer-session-timeout-ms", "30000")
    topic, group = "cp-kill", "g-kill"
    create_and_fill(b.bootstrap, topic)
    m = Member(b.bootstrap, group, [topic])
    m.start()
    try:
        wait_for(lambda: m.count() >= PARTITIONS * RECORDS, 60, "every record before the kill")
        wait_for(lambda: committed_offsets(b.bootstrap, group, topic) == {p: RECORDS for p in range(PARTITIONS)},
              30, "commits")
        before = group_view(b.bootstrap, group)
        b.kill()
        b.restart()
        after = group_view(b.bootstrap, group)
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
        wait_for(lambda: m.count() >= PARTITIONS * (RECORDS + 1), 60, "records produced after the restart")
        assert [x.member_id for x in group_view(b.bootstrap, group).members] == [before.members[0].member_id]
    finally:
        m.stop()
    assert len(m.seen) == len(set(m.seen)) == PARTITIONS * (RECORDS + 1)
    assert committed_offsets(b.bootstrap, group, topic) == {p: RECORDS + 1 for p in range(PARTITIONS)}
    assert group_view(b.bootstrap, group).members == []   # it left when it closed


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

    # A copier stuck in librdkafka after a broker restart (issue 5511, tests/support/copier.py)
    # stops after --stall-s without a commit; its successor gets the partitions once the
    # stuck member's session has run out: a 3 s session and a 10 s stall keep that short,
    # and still give a new copier (up by the session's end) time for its first commit.
    b = start_broker("--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_MS),
                     "--group-consumer-session-timeout-ms", "3000",
                     "--transaction-abort-check-interval-ms", "200")
    # 30 a partition, four a transaction: 30 transactions, so both kills (after the
    # first commit and after 40 records) come while the copy is under way.
    per_partition = 30
    total = PARTITIONS * per_partition
    with Client(b.bootstrap) as c:
        c.create_topic("sink", PARTITIONS)
    create_and_fill(b.bootstrap, "source", n=per_partition)
    script = Path(__file__).resolve().parents[1] / "support" / "consumer_protocol_copier.py"

    def start_copier():
        return subprocess.Popen([sys.executable, str(script), "--bootstrap", b.bootstrap, "--source", "source",
                                 "--sink", "sink", "--group", "copier", "--txn-id", "copier-1",
                                 "--batch", "4", "--pause-ms", "200", "--stall-s", "10"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "copier.err", "ab"))

    def progress() -> int:
        # Offsets the copier committed (a read of the sink would wait for the copy to pause).
        nonlocal copier
        if copier.poll() is not None:   # it stops on any error; a new one takes over
            copier = start_copier()
        return sum(max(0, o) for o in committed_offsets(b.bootstrap, "copier", "source").values())

    copier = start_copier()
    at_kills = []
    try:
        for _ in range(2):
            wait_for(lambda: progress() > len(at_kills) * 40, 60,
                  f"progress after {at_kills}: {_tail(tmp_path / 'copier.err')}")
            at_kills.append(progress())
            b.kill()
            time.sleep(0.3)
            b.restart()
        wait_for(lambda: progress() >= total, 180, "every record copied")
        time.sleep(2)   # a duplicate would show up after the count is reached
    finally:
        copier.kill()
        copier.wait()
    copied = read_values(b.bootstrap, "sink", PARTITIONS, idle_s=2.0, want=total)
    source = read_values(b.bootstrap, "source", PARTITIONS, idle_s=2.0, want=total)
    assert sorted(copied) == sorted(source) and len(set(copied)) == len(copied) == total
    assert at_kills[-1] < total, f"the broker was killed only after the copy had finished: {at_kills}"
    assert committed_offsets(b.bootstrap, "copier", "source") == {p: per_partition for p in range(PARTITIONS)}


def _heartbeat(c, version: int, **fields):
    from semel.protocol.api_keys import ApiKey
    base = dict(group_id="wire", member_id="", member_epoch=0, instance_id=None, rack_id=None,
                rebalance_timeout_ms=30000, subscribed_topic_names=None, server_assignor=None,
                topic_partitions=None)
    if version >= 1:
        base["subscribed_topic_regex"] = None
    base.update(fields)
    (answer,) = c.request_many([(ApiKey.CONSUMER_GROUP_HEARTBEAT, {**base, "_version": version})])
    return answer


def test_heartbeat_on_the_wire(broker):
    """v0 (the coordinator names the member) and v1 (the member names itself), and the
    errors Kafka answers with, as values on the wire."""
    from semel.client import Client
    from semel.protocol.errors import KafkaError as E
    topic = f"cp-wire-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, topic, partitions=2, n=1)
    with Client(broker.bootstrap) as c:
        group = f"wire-{uuid.uuid4().hex[:6]}"
        a = _heartbeat(c, 0, group_id=group, subscribed_topic_names=[topic], topic_partitions=[])
        assert a.error_code == 0 and a.member_id and a.member_epoch == 1
        assert a.heartbeat_interval_ms == HEARTBEAT_MS
        assert sorted(p for t in a.assignment.topic_partitions for p in t.partitions) == [0, 1]
        assert _heartbeat(c, 0, group_id=group, member_id=a.member_id, member_epoch=7,
                          topic_partitions=[]).error_code == E.FENCED_MEMBER_EPOCH
        assert _heartbeat(c, 1, group_id=group, member_id="stranger", member_epoch=3,
                          topic_partitions=[]).error_code == E.UNKNOWN_MEMBER_ID
        assert _heartbeat(c, 1, group_id=group, member_id="", subscribed_topic_names=[topic],
                          topic_partitions=[]).error_code == E.INVALID_REQUEST
        assert _heartbeat(c, 1, group_id=group, member_id="m2", subscribed_topic_names=[topic],
                          server_assignor="sticky", topic_partitions=[]).error_code == E.UNSUPPORTED_ASSIGNOR
        assert _heartbeat(c, 1, group_id=group, member_id="m2", subscribed_topic_regex="(",
                          topic_partitions=[]).error_code == E.INVALID_REGULAR_EXPRESSION
        b = _heartbeat(c, 1, group_id=group, member_id="m2", subscribed_topic_names=[topic],
                       server_assignor="range", topic_partitions=[])
        assert b.error_code == 0 and b.member_id == "m2" and b.member_epoch == 2
        assert group_view(broker.bootstrap, group).assignor_name == "range"
        left = _heartbeat(c, 1, group_id=group, member_id="m2", member_epoch=-1)
        assert (left.error_code, left.member_epoch) == (0, -1)
        assert [m.member_id for m in group_view(broker.bootstrap, group).members] == [a.member_id]


def test_offset_fetch_v8_groups_and_v9_member_epochs(broker):
    """OffsetFetch v8 answers several groups in one request; v9 checks the member of a
    consumer-protocol group as Kafka does: its current epoch is served, an older one is
    STALE_MEMBER_EPOCH, an unknown member UNKNOWN_MEMBER_ID, no member at all (-1) served."""
    from semel.client import Client
    from semel.protocol.api_keys import ApiKey
    from semel.protocol.errors import KafkaError as E
    from semel.protocol.messages import request_class
    topic = f"cp-of-{uuid.uuid4().hex[:6]}"
    create_and_fill(broker.bootstrap, topic, partitions=2, n=1)
    group, other = f"of-{uuid.uuid4().hex[:6]}", f"of-{uuid.uuid4().hex[:6]}"
    R = request_class(ApiKey.OFFSET_FETCH)
    with Client(broker.bootstrap) as c:
        a = _heartbeat(c, 1, group_id=group, member_id="m1", subscribed_topic_names=[topic],
                       topic_partitions=[])
        assert a.error_code == 0
        C = request_class(ApiKey.OFFSET_COMMIT)
        T = C.OffsetCommitRequestTopic
        (commit,) = c.request_many([(ApiKey.OFFSET_COMMIT, dict(
            _version=9, group_id=group, generation_id_or_member_epoch=a.member_epoch, member_id="m1",
            group_instance_id=None, topics=[T(version=9, name=topic, partitions=[T.OffsetCommitRequestPartition(
                version=9, partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                committed_metadata="")])]))])
        assert commit.topics[0].partitions[0].error_code == 0

        def fetch(version, *groups):
            (resp,) = c.request_many([(ApiKey.OFFSET_FETCH, dict(
                _version=version, require_stable=True,
                groups=[R.OffsetFetchRequestGroup(version=version, group_id=g, member_id=m, member_epoch=e,
                                                  topics=None) for g, m, e in groups]))])
            return {g.group_id: (g.error_code, {(t.name, p.partition_index): p.committed_offset
                                                for t in g.topics for p in t.partitions}) for g in resp.groups}

        both = fetch(8, (group, None, -1), (other, None, -1))
        assert both == {group: (0, {(topic, 0): 1}), other: (0, {})}
        assert fetch(9, (group, "m1", a.member_epoch))[group] == (0, {(topic, 0): 1})
        assert fetch(9, (group, "m1", a.member_epoch - 1))[group][0] == E.STALE_MEMBER_EPOCH
        assert fetch(9, (group, "stranger", 1))[group][0] == E.UNKNOWN_MEMBER_ID
        assert fetch(9, (group, None, -1))[group] == (0, {(topic, 0): 1})
