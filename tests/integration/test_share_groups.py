"""Share groups (KIP-932) with confluent-kafka's unmodified ShareConsumer against real
broker processes: every record read once; consumers sharing one partition never get
one record twice; release brings a record back with its delivery count raised; reject
and the delivery limit archive it; a lock that runs out (its holder SIGKILLed) brings it
back; read_committed never delivers aborted records; a broker SIGKILL keeps what was
acknowledged and redelivers what was not; a deleted topic's share-partitions go with it.
Waiting loops have generous deadlines; no assertion is about time."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.support.brokers import module_broker_fixture
from tests.support.share import (
    HOLDER, LOCK_MS, ONE_PER_BATCH, accept_some_then, drain, fill, names, poll_until, read_all, set_group_configs,
    share_consumer,
)

pytest.importorskip("confluent_kafka")

broker = module_broker_fixture("share-groups")


def _offsets(msgs) -> list[int]:
    return [m.offset() for m in msgs]


def test_reads_every_record_after_earliest_reset(broker):
    topic, group = names("all")
    fill(broker.bootstrap, topic, 50)
    set_group_configs(broker.bootstrap, group, share_auto_offset_reset="earliest")
    seen = read_all(broker.bootstrap, group, topic, 50)
    assert sorted(_offsets(seen)) == list(range(50))
    assert {m.value() for m in seen} == {f"v{i}".encode() for i in range(50)}
    assert all(m.delivery_count() == 1 for m in seen)


def test_default_reset_is_latest(broker):
    topic, group = names("latest")
    fill(broker.bootstrap, topic, 10)
    c = share_consumer(broker.bootstrap, group, topic)
    try:
        assert drain(c, 3) == []   # what was there before the group's first fetch is not read
        fill_more(broker.bootstrap, topic, 5)
        seen = poll_until(c, lambda s: len(s) >= 5)
    finally:
        c.close()
    assert sorted(_offsets(seen)) == list(range(10, 15))


def fill_more(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, **ONE_PER_BATCH})
    for i in range(n):
        p.produce(topic, value=f"more{i}".encode())
    assert p.flush(30) == 0


def test_three_consumers_share_one_partition_without_duplicates(broker):
    topic, group = names("split")
    fill(broker.bootstrap, topic, 0)
    set_group_configs(broker.bootstrap, group, share_auto_offset_reset="earliest")
    consumers = [share_consumer(broker.bootstrap, group, topic, max_poll_records=5) for _ in range(3)]
    got: list[list] = [[] for _ in consumers]
    try:
        for c in consumers:   # every one joined and holds a session before records exist
            drain(c, 1)
        fill_more(broker.bootstrap, topic, 300)
        deadline = time.time() + 90
        while sum(map(len, got)) < 300:
            assert time.time() < deadline, f"gave up after {sum(map(len, got))} record(s)"
            for c, mine in zip(consumers, got):
                mine += [m for m in c.poll(0.2) if m.error() is None]
        for c, mine in zip(consumers, got):
            mine += drain(c, 2)
            c.commit_sync()   # the last poll's acceptances, before close releases them
    finally:
        for c in consumers:
            c.close()
    offsets = [o for mine in got for o in _offsets(mine)]
    assert sorted(offsets) == list(range(300))   # every record once, none twice
    assert all(got)                                # the partition was shared by all three


def test_release_redelivers_with_a_raised_delivery_count(broker):
    topic, group = names("release")
    fill(broker.bootstrap, topic, 10)
    set_group_configs(broker.bootstrap, group, share_auto_offset_reset="earliest")
    from confluent_kafka import AcknowledgeType
    c = share_consumer(broker.bootstrap, group, topic, share_acknowledgement_mode="explicit")
    try:
        first = poll_until(c, lambda s: len(s) >= 10,
                           on_message=lambda m: c.acknowledge(m, AcknowledgeType.RELEASE))
        c.commit_sync()
        again = poll_until(c, lambda s: len(s) >= 10, on_message=lambda m: c.acknowledge(m))
        c.commit_sync()
        rest = drain(c, 3, on_message=lambda m: c.acknowledge(m))
    finally:
        c.close()
    assert sorted(_offsets(first)) == sorted(_offsets(again)) == list(range(10))
    assert {m.delivery_count() for m in first} == {1}
    assert {m.delivery_count() for m in again} == {2}
    assert rest == []   # accepted: never again


def test_reject_and_the_delivery_limit_archive(broker):
    topic, group = names("archive")
    fill(broker.bootstrap, topic, 10)
    set_group_configs(broker.bootstrap, group, share_auto_offset_reset="earliest",
                      share_delivery_count_limit="2")
    from confluent_kafka import AcknowledgeType
    c = share_consumer(broker.bootstrap, group, topic, share_acknowledgement_mode="explicit")
    seen: list = []

    def ack(m):
        seen.append((m.offset(), m.delivery_count()))
        # even offsets are rejected, odd ones released every time they come
        c.acknowledge(m, AcknowledgeType.REJECT if m.offset() % 2 == 0 else AcknowledgeType.RELEASE)
    try:
        poll_until(c, lambda s: len(s) >= 10, on_message=ack)
        c.commit_sync()
        drain(c, 4, on_message=ack)
        c.commit_sync()
        assert drain(c, 3, on_message=ack) == []
    finally:
        c.close()
    rejected = [(o, n) for o, n in seen if o % 2 == 0]
    released = [(o, n) for o, n in seen if o % 2 == 1]
    assert sorted(rejected) == [(o, 1) for o in range(0, 10, 2)]              # once, never back
    assert sorted(released) == [(o, n) for o in range(1, 10, 2) for n in (1, 2)]  # until the limit


def test_lock_expiry_redelivers_what_a_killed_consumer_held(broker):
    topic, group = names("lock")
    fill(broker.bootstrap, topic, 20)
    set_group_configs(broker.bootstrap, group, share_auto_offset_reset="earliest",
                      share_record_lock_duration_ms=str(LOCK_MS))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, broker.bootstrap, group, topic, "5"],
                              stdout=subprocess.PIPE, text=True)
    try:
        held = [int(x) for x in holder.stdout.readline().split()]
    finally:
        holder.kill()
        holder.wait()
    assert held, "the holder acquired records"
    seen = read_all(broker.bootstrap, group, topic, 20)
    assert sorted(_offsets(seen)) == list(range(20))
    counts = {m.offset(): m.delivery_count() for m in seen}
    assert all(counts[o] == 2 for o in held)          # delivered again after the lock ran out
    assert set(counts.values()) <= {1, 2}


def test_read_committed_never_delivers_aborted_records(broker):
    from confluent_kafka import Producer
    topic, group = names("txn")
    fill(broker.bootstrap, topic, 0)
    set_group_configs(broker.bootstrap, group, share_auto_offset_reset="earliest",
                      share_isolation_level="read_committed")
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{group}"})
    p.init_transactions(30)
    for outcome in ("commit", "abort", "commit", "abort"):
        p.begin_transaction()
        for i in range(5):
            p.produce(topic, value=f"{outcome}-{i}".encode())
        p.flush(30)
        (p.commit_transaction if outcome == "commit" else p.abort_transaction)(30)
    seen = read_all(broker.bootstrap, group, topic, 10, quiet_s=3)
    values = sorted(m.value().decode() for m in seen)
    assert values == sorted([f"commit-{i}" for i in range(5)] * 2)


def test_broker_sigkill_keeps_acknowledged_and_redelivers_the_rest(start_broker):
    b = start_broker()
    topic, group = names("kill")
    fill(b.bootstrap, topic, 30)
    set_group_configs(b.bootstrap, group, share_auto_offset_reset="earliest")
    accepted_pairs, held_pairs = accept_some_then(b.bootstrap, group, topic, 15, b.kill)
    accepted, held = [o for o, _ in accepted_pairs], [o for o, _ in held_pairs]
    b.restart()
    seen = read_all(b.bootstrap, group, topic, 30 - len(accepted), quiet_s=3)
    assert accepted
    assert sorted(_offsets(seen)) == sorted(set(range(30)) - set(accepted))   # acknowledged: never again
    counts = {m.offset(): m.delivery_count() for m in seen}
    assert all(counts[o] >= 2 for o in held)   # acquired before the kill: delivered again


def test_a_topic_created_again_is_read_from_its_new_start_after_a_restart(start_broker):
    """Deleting a topic drops the share groups' partitions of it, tombstoned in the log: the
    topic made again under its name (offsets 0..4, below the old window's start of 20) is
    read from its start, after a SIGKILL and restart too."""
    from confluent_kafka.admin import AdminClient
    b = start_broker()
    topic, group = names("again")
    fill(b.bootstrap, topic, 20)
    set_group_configs(b.bootstrap, group, share_auto_offset_reset="earliest")
    assert sorted(_offsets(read_all(b.bootstrap, group, topic, 20))) == list(range(20))
    admin = AdminClient({"bootstrap.servers": b.bootstrap})   # kept alive until the answer comes
    admin.delete_topics([topic])[topic].result(30)
    b.kill()
    b.restart()
    fill(b.bootstrap, topic, 5)
    assert sorted(_offsets(read_all(b.bootstrap, group, topic, 5))) == list(range(5))


def test_share_group_gauges(start_broker):
    from confluent_kafka import AcknowledgeType

    from semel.launch.process import free_port
    from tests.integration.test_ops_metrics import scrape
    port = free_port()
    b = start_broker("--metrics-port", str(port))
    topic, group = names("gauge")
    fill(b.bootstrap, topic, 20)
    set_group_configs(b.bootstrap, group, share_auto_offset_reset="earliest")
    holder = share_consumer(b.bootstrap, group, topic, share_acknowledgement_mode="explicit", max_poll_records=10)
    rejecter = share_consumer(b.bootstrap, group, topic, share_acknowledgement_mode="explicit", max_poll_records=10)
    held: list = []
    try:
        held = poll_until(holder, lambda s: len(s) >= 1)   # acquired and kept
        rejected = poll_until(rejecter, lambda s: len(s) >= 1,
                              on_message=lambda m: rejecter.acknowledge(m, AcknowledgeType.REJECT))
        rejecter.commit_sync()

        def gauge(state):
            return scrape(port).get(("semel_share_group_records", (("group", group), ("state", state))))
        deadline = time.time() + 30
        while (gauge("acquired"), gauge("archived")) != (len(held), len(rejected)):
            assert time.time() < deadline, (gauge("acquired"), gauge("archived"), len(held), len(rejected))
            time.sleep(0.2)
        assert gauge("in_flight") == max(m.offset() for m in held + rejected) + 1
    finally:
        for m in held:
            holder.acknowledge(m)
        holder.close()
        rejecter.close()
