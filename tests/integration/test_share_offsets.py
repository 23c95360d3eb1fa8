"""A share group's start offsets over the wire with a real broker process:
DescribeShareGroupOffsets, AlterShareGroupOffsets and DeleteShareGroupOffsets as Kafka
answers them (kafka-python's codec on a socket: confluent-kafka 2.16's AdminClient has
no share-group offset calls), what confluent-kafka's ShareConsumer reads after each, an
altered start offset surviving a broker SIGKILL, and an acquisition lock released by
the coordinator's timer while nobody fetches (seen in the broker's metrics)."""
from __future__ import annotations

import re
import time
import urllib.request
import uuid

import pytest
from support.wire import call, connect, served_versions

from semel.launch.process import free_port
from semel.protocol.errors import KafkaError
from semel.protocol.messages import request_class
from tests.support.share_wire import fetch, holding, leave
from tests.support.brokers import module_broker
from tests.support.markers import starts_processes
from tests.support.wait import until
from tests.support.share import drain, fill, names, poll_until, share_consumer

pytest.importorskip("confluent_kafka")

DESCRIBE, ALTER, DELETE, HEARTBEAT = 90, 91, 92, 76


@pytest.fixture(scope="module")
@starts_processes
def ops_broker(tmp_path_factory):
    port = free_port()
    with module_broker(tmp_path_factory, "share-offsets", "--metrics-port", str(port)) as b:
        b.metrics_url = f"http://127.0.0.1:{port}/metrics"
        yield b


def describe(sock, group, topics=None, version=1):
    R = request_class(DESCRIBE)
    G = R.DescribeShareGroupOffsetsRequestGroup
    asked = None if topics is None else [G.DescribeShareGroupOffsetsRequestTopic(topic_name=t, partitions=ps)
                                         for t, ps in topics.items()]
    return call(sock, DESCRIBE, version, groups=[G(group_id=group, topics=asked)]).groups[0]


def starts(described) -> dict[tuple[str, int], int]:
    assert described.error_code == 0, described
    return {(t.topic_name, p.partition_index): p.start_offset for t in described.topics for p in t.partitions}


def alter(sock, group, offsets: dict[tuple[str, int], int]):
    R = request_class(ALTER)
    T = R.AlterShareGroupOffsetsRequestTopic
    by_topic: dict[str, list] = {}
    for (t, p), off in offsets.items():
        by_topic.setdefault(t, []).append(T.AlterShareGroupOffsetsRequestPartition(partition_index=p,
                                                                                   start_offset=off))
    return call(sock, ALTER, 0, group_id=group, topics=[T(topic_name=t, partitions=ps) for t, ps in by_topic.items()])


def delete(sock, group, topics):
    T = request_class(DELETE).DeleteShareGroupOffsetsRequestTopic
    return call(sock, DELETE, 0, group_id=group, topics=[T(topic_name=t) for t in topics])


def read(bootstrap, group, topic, n) -> list[tuple[int, int]]:
    """A new ShareConsumer reads `n` records and whatever follows until quiet; sorted
    (partition, offset) of all it got."""
    c = share_consumer(bootstrap, group, topic)
    try:
        seen = poll_until(c, lambda got: len(got) >= n) + drain(c, 2)
    finally:
        c.close()
    return sorted((m.partition(), m.offset()) for m in seen)


def test_offset_apis_are_advertised(ops_broker):
    served = served_versions(ops_broker.bootstrap)
    assert served[DESCRIBE] == (0, 1) and served[ALTER] == (0, 0) and served[DELETE] == (0, 0)


def test_describe_alter_delete_and_what_a_share_consumer_reads(ops_broker):
    topic, group = names("offs")
    with holding(ops_broker.bootstrap, group, topic, 10, 5) as (s, member, tid):       # holds 0..4
        assert fetch(s, group, member, 1, tid, acks=[(0, 4, 1)], max_records=2).error_code == 0   # 5, 6 held
        d = describe(s, group)
        part = d.topics[0].partitions[0]
        assert (d.topics[0].topic_id, part.start_offset, part.lag) == (tid, 5, 5)     # 5..9 unfinished
        assert (part.in_flight, part.acquired, part.archived) == (2, 2, 0)            # semel's tagged fields
        assert describe(s, group, version=0).topics[0].partitions[0].start_offset == 5
        # Kafka refuses to move the start offset under live members.
        refused = alter(s, group, {(topic, 0): 2})
        assert refused.error_code == KafkaError.NON_EMPTY_GROUP
        assert refused.responses[0].partitions[0].error_code == KafkaError.NON_EMPTY_GROUP
        assert delete(s, group, [topic]).error_code == KafkaError.NON_EMPTY_GROUP
        assert starts(describe(s, group)) == {(topic, 0): 5}
        leave(s, group, member)
        altered = alter(s, group, {(topic, 0): 2})
        assert altered.error_code == 0 and altered.responses[0].partitions[0].error_code == 0
        assert starts(describe(s, group)) == {(topic, 0): 2}
    assert read(ops_broker.bootstrap, group, topic, 8) == [(0, o) for o in range(2, 10)]   # from there, once
    with connect(ops_broker.bootstrap) as s:
        assert starts(describe(s, group)) == {(topic, 0): 10}
        deleted = delete(s, group, [topic])
        assert deleted.error_code == 0 and [(r.topic_name, r.error_code) for r in deleted.responses] == [(topic, 0)]
        assert starts(describe(s, group)) == {}
        assert starts(describe(s, group, {topic: [0]})) == {(topic, 0): -1}   # asked for, no state
    # Forgotten: share.auto.offset.reset (earliest) applies again.
    assert read(ops_broker.bootstrap, group, topic, 10) == [(0, o) for o in range(10)]


def test_bad_requests_get_kafkas_errors(ops_broker):
    from tests.support.consumer_protocol import Member
    topic, group = names("offbad")
    fill(ops_broker.bootstrap, topic, 2)
    cg = f"cg-{uuid.uuid4().hex[:6]}"
    m = Member(ops_broker.bootstrap, cg, [topic])
    m.start()
    try:
        until(lambda: m.count() >= 1, "the consumer group reads", 30)
        with connect(ops_broker.bootstrap) as s:
            unknown = describe(s, f"sg-none-{uuid.uuid4().hex[:6]}")
            assert unknown.error_code == KafkaError.GROUP_ID_NOT_FOUND
            assert delete(s, unknown.group_id, [topic]).error_code == KafkaError.GROUP_ID_NOT_FOUND
            # A consumer group's id is not a share group's, for every one of the three.
            other = describe(s, cg)
            assert other.error_code == KafkaError.GROUP_ID_NOT_FOUND and "not a share group" in other.error_message
            assert alter(s, cg, {(topic, 0): 0}).error_code == KafkaError.GROUP_ID_NOT_FOUND
            assert delete(s, cg, [topic]).error_code == KafkaError.GROUP_ID_NOT_FOUND
            # Per partition: an unknown topic or partition, a negative offset.
            bad = alter(s, group, {("no-such-topic", 0): 0, (topic, 9): 0, (topic, 0): -5})
            codes = {(t.topic_name, p.partition_index): p.error_code for t in bad.responses for p in t.partitions}
            assert codes == {("no-such-topic", 0): KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                             (topic, 9): KafkaError.UNKNOWN_TOPIC_OR_PARTITION, (topic, 0): KafkaError.INVALID_REQUEST}
            assert alter(s, group, {(topic, 0): 1}).error_code == 0
            gone = delete(s, group, ["no-such-topic"])
            assert [(r.topic_name, r.error_code) for r in gone.responses] == [
                ("no-such-topic", KafkaError.UNKNOWN_TOPIC_OR_PARTITION)]
            assert starts(describe(s, group)) == {(topic, 0): 1}      # the bad ones changed nothing
    finally:
        m.stop()


def _gauge(broker, group: str) -> dict[str, float]:
    text = urllib.request.urlopen(broker.metrics_url, timeout=10).read().decode()
    pat = re.compile(r'semel_share_group_records\{group="%s",state="(\w+)"\} (\S+)' % re.escape(group))
    return {state: float(v) for state, v in pat.findall(text)}


def test_a_lock_runs_out_with_no_fetch_in_between(ops_broker):
    topic, group = names("timer")
    with holding(ops_broker.bootstrap, group, topic, 5, 5, share_record_lock_duration_ms="1000"):
        acquired_at = time.monotonic()
        assert _gauge(ops_broker, group)["acquired"] == 5
        # The holder stays a member and sends nothing more; nobody else fetches.
        while _gauge(ops_broker, group)["acquired"]:
            assert time.monotonic() - acquired_at < 10, "the lock was never released"
            time.sleep(0.1)
        assert time.monotonic() - acquired_at >= 0.9        # not before the lock ran out
        assert _gauge(ops_broker, group)["available"] == 5


@starts_processes
def test_an_altered_start_offset_survives_a_broker_sigkill(start_broker):
    b = start_broker()
    topic, group = names("offkill")
    fill(b.bootstrap, topic, 6, partitions=2)
    with connect(b.bootstrap) as s:
        assert alter(s, group, {(topic, 0): 2, (topic, 1): 1}).error_code == 0
    b.kill()
    b.restart()
    with connect(b.bootstrap) as s:
        assert starts(describe(s, group)) == {(topic, 0): 2, (topic, 1): 1}
    assert read(b.bootstrap, group, topic, 3) == [(0, 2), (1, 1), (1, 2)]


def _cli(*args: str):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "semel", *args], capture_output=True, text=True, timeout=60)


def test_cli_resets_a_share_groups_start_offset(ops_broker):
    topic, group = names("offcli")
    boot = ("--bootstrap", ops_broker.bootstrap)
    reset = ("group", "reset-offsets", group, "--topic", topic)
    with holding(ops_broker.bootstrap, group, topic, 6, 6) as (s, member, tid):
        assert fetch(s, group, member, 1, tid, acks=[(0, 5, 1)], max_records=1).error_code == 0
        shown = _cli("group", "describe", group, *boot)
        assert shown.returncode == 0 and f"{topic}\t0\t6\t0\t0\t0\t0" in shown.stdout.splitlines()
        refused = _cli(*reset, "--to-offset", "2", "--execute", *boot)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
        assert "1 member(s)" in refused.stderr and "stop its consumers first" in refused.stderr
        leave(s, group, member)
        dry = _cli(*reset, "--to-offset", "2", *boot)
        assert dry.returncode == 0 and f"{topic}\t0\t6\t2" in dry.stdout and "dry run" in dry.stdout
        assert starts(describe(s, group)) == {(topic, 0): 6}       # a dry run changes nothing
        done = _cli(*reset, "--to-offset", "2", "--execute", *boot)
        assert done.returncode == 0 and "reset the start offset of 1 partition(s)" in done.stdout, done.stderr
        assert starts(describe(s, group)) == {(topic, 0): 2}
    assert read(ops_broker.bootstrap, group, topic, 4) == [(0, o) for o in (2, 3, 4, 5)]
    with connect(ops_broker.bootstrap) as s:
        assert _cli(*reset, "--to-earliest", "--execute", *boot).returncode == 0
        assert starts(describe(s, group)) == {(topic, 0): 0}
        assert _cli(*reset, "--to-latest", "--execute", *boot).returncode == 0
        assert starts(describe(s, group)) == {(topic, 0): 6}
    unknown = _cli("group", "describe", f"sg-none-{uuid.uuid4().hex[:6]}", *boot)
    assert unknown.returncode == 2 and "does not exist" in unknown.stderr
