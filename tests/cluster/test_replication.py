"""Replication data plane on three in-process brokers sharing a MemoryClusterView
(tests/support/memcluster.py): acks=all, ISR shrink and expansion, min.insync.replicas,
exactly-once state across a leader change, truncation of a diverged follower (by the
diverging epoch a leader answers a follower's Fetch with).

Elections are made by hand on the table (the controller's job in a real cluster);
the clients are unmodified confluent-kafka and semel's own wire client.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import time

import pytest
from confluent_kafka import KafkaException, Producer

from semel.client.client import Client
from semel.cluster.replica_fetcher import REFETCH_MAX_S
from semel.protocol.errors import KafkaError
from semel.protocol.records import build_batch, iter_batches, iter_records
from tests.support.consume import read_values
from tests.support.memcluster import MemCluster

LATEST = -1


# Followers write fetched data of 64 KiB or more in a worker thread (the default) and
# smaller on their event loop; 0 sends every write to a thread, so these tests cover the
# pending write across role changes, truncation and failover on small records too.
WRITE_PATHS = pytest.mark.parametrize("write_thread_bytes", [64 * 1024, 0], ids=["default", "all-in-thread"])


@pytest.fixture
def cluster(tmp_path):
    clusters = []

    def make(**config) -> MemCluster:
        c = MemCluster(tmp_path / f"c{len(clusters)}", **config).start()
        clusters.append(c)
        return c
    yield make
    for c in clusters:
        c.close()


def produce_all(bootstrap: str, topic: str, values: list[bytes], **conf) -> list:
    """Produce with confluent-kafka and return the delivery reports (error or offset)."""
    reports = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, **conf})
    for v in values:
        p.produce(topic, value=v, partition=0, on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    assert p.flush(60) == 0
    return reports


def same_log_end(c: MemCluster, topic: str, nodes=(0, 1, 2)):
    return lambda: len({c.log(i, topic).log_end_offset for i in nodes}) == 1


def record_values(data: bytes) -> list[bytes]:
    return [r.value for _, h in iter_batches(data) if not h.is_control
            for r in iter_records(data[_:_ + h.size])]


@WRITE_PATHS
def test_rf3_acks_all_is_on_all_three_logs_byte_for_byte(cluster, write_thread_bytes):
    c = cluster(replica_write_thread_bytes=write_thread_bytes)
    c.create_topic("t", [(0, 1, 2)])
    values = [b"v%04d" % i for i in range(500)]
    reports = produce_all(c.bootstrap(), "t", values)
    assert all(err is None for err, _ in reports)
    leader = c.log(0, "t")
    # An acknowledged acks=all record is below the leader's high watermark, so on every ISR member.
    assert leader.high_watermark == leader.log_end_offset == 500
    c.wait(same_log_end(c, "t"), "followers caught up")
    logs = [c.log_bytes(i, "t") for i in range(3)]
    assert logs[0] == logs[1] == logs[2]
    assert record_values(logs[0]) == values
    # The leader stamped its epoch on every batch; followers kept it (and the offsets).
    assert {h.leader_epoch for _, h in iter_batches(logs[2])} == {0}
    assert c.run(lambda: c.log(2, "t").epochs.entries) == [(0, 0)]


def test_a_leader_alone_in_the_isr_commits_at_once(cluster):
    c = cluster()
    c.create_topic("one", [(1,)])
    c.create_topic("t", [(0, 1, 2)])
    reports = produce_all(c.bootstrap(), "one", [b"r%d" % i for i in range(20)])
    assert [off for _, off in reports] == list(range(20))
    assert read_values(c.bootstrap(), "one", 1, "read_uncommitted", idle_s=1.0, want=20) == [
        "r%d" % i for i in range(20)]
    c.set_isr("t", 0, (0,))      # the controller took both followers out
    with Client(c.bootstrap(0)) as cl:
        assert cl.produce("t", 0, build_batch([(None, b"x")], timestamp_ms=1), acks=-1) == (KafkaError.NONE, 0)
        assert cl.list_offset("t", 0, LATEST) == 1


def test_a_record_appended_without_produce_wakes_the_followers_fetches(cluster):
    """A coordinator appends its records without a Produce request (which notifies the
    long-polling fetches itself). Waiting for the high watermark past such a record wakes
    the followers' fetches: here they would otherwise wait 120 s, four times the wait's
    own timeout, and the wait would end REQUEST_TIMED_OUT."""
    c = cluster(replica_fetch_wait_max_ms=120_000)
    c.create_topic("t", [(0, 1, 2)])
    progress = lambda: c.brokers[0].role.replicas.leading[("t", 0)].progress  # noqa: E731
    c.wait(lambda: all(p.leo == 0 for p in progress().values()), "both followers fetching")   # on the loop

    async def append_and_wait():
        from semel.protocol.records import split_batches
        plog = c.log(0, "t")
        batch = build_batch([(None, b"coordinator record")], timestamp_ms=1)
        info = plog.append(batch, split_batches(batch)[0])
        plog.flush()     # as a coordinator does first: the high watermark counts the leader's fsynced end
        return await c.brokers[0].role.replicas.wait_for_hw("t", 0, info.last_offset + 1, 30)
    assert c.run(append_and_wait, timeout=90) == KafkaError.NONE
    assert c.log(0, "t").high_watermark == 1
    c.wait(same_log_end(c, "t"), "both followers hold the record")


def test_a_restarted_replica_keeps_its_high_watermark(cluster):
    c = cluster()
    c.create_topic("t", [(0, 1, 2)])
    assert all(err is None for err, _ in produce_all(c.bootstrap(), "t", [b"h%d" % i for i in range(10)]))
    c.wait(lambda: c.log(2, "t").high_watermark == 10, "the follower learned the high watermark")
    for i in (0, 1, 2):
        c.stop_broker(i)
    c.start_broker(2)                 # its leader is gone: nothing to fetch, only the checkpoint
    assert c.log(2, "t").high_watermark == 10


def test_follower_that_stops_fetching_leaves_the_isr_and_rejoins(cluster):
    c = cluster(replica_lag_time_max_ms=600)
    c.create_topic("t", [(0, 1, 2)])
    c.run(lambda: setattr(c.brokers[2].role.replicas, "fetching_paused", True))
    # acks=all waits for broker 2 until it is out of the ISR, then completes.
    reports = produce_all(c.bootstrap(), "t", [b"a%d" % i for i in range(50)])
    assert all(err is None for err, _ in reports)
    assert c.state("t").isr == (0, 1)
    assert c.log(2, "t").log_end_offset == 0
    c.run(lambda: setattr(c.brokers[2].role.replicas, "fetching_paused", False))
    c.wait(lambda: c.state("t").isr == (0, 1, 2), "broker 2 back in the ISR")
    c.wait(same_log_end(c, "t"), "broker 2 caught up")
    assert c.log_bytes(2, "t") == c.log_bytes(0, "t")


def test_batch_damaged_on_the_leaders_disk_is_refused_by_followers_and_consumers(cluster, caplog):
    """The leader serves followers' fetches without re-checking CRCs (a follower checks
    every batch before appending): a batch damaged on the leader's disk reaches the
    followers, which refuse it whole and fetch it again after a growing delay, warning
    when it starts and then once per delay cap, so their logs stop before it and neither
    the leader nor the log is flooded; a consumer's fetch keeps the leader's check and
    gets a storage error, not the batch. Once the bytes are good again the followers
    take them."""
    caplog.set_level(logging.WARNING)
    c = cluster(replica_lag_time_max_ms=400)
    c.create_topic("t", [(0, 1, 2)])
    assert all(err is None for err, _ in produce_all(c.bootstrap(), "t", [b"ok%d" % i for i in range(10)]))
    c.wait(same_log_end(c, "t"), "replicated")
    good = c.log_bytes(0, "t")
    # Followers that stopped fetching (out of the ISR, so no fetch of theirs is still out)
    # see the next batch only once it is damaged.
    for i in (1, 2):
        c.run(lambda i=i: setattr(c.brokers[i].role.replicas, "fetching_paused", True))
    c.wait(lambda: c.state("t").isr == (0,), "the followers left the ISR")
    with Client(c.bootstrap(0)) as cl:
        err, base = cl.produce("t", 0, build_batch([(None, b"payload-to-damage")], timestamp_ms=1), acks=1)
        assert (err, base) == (KafkaError.NONE, 10)
        c.wait(lambda: c.log(0, "t").high_watermark == base + 1, "the leader alone committed it")
        path = c.log(0, "t").segment_path(base)
        at = len(good) + c.log_bytes(0, "t")[len(good):].index(b"payload-to-damage")
        fd = os.open(path, os.O_RDWR)
        try:
            os.pwrite(fd, b"P", at)          # one byte of a record value: only the CRC tells
            assert cl.fetch("t", 0, base).error == KafkaError.KAFKA_STORAGE_ERROR
            served = count_replica_fetches(c, 0, "t", base)
            caplog.clear()
            started = time.monotonic()
            for i in (1, 2):
                c.run(lambda i=i: setattr(c.brokers[i].role.replicas, "fetching_paused", False))

            def refused(i):
                return sum(f"broker-{i}" in r.getMessage() and "CORRUPT_MESSAGE" in r.getMessage()
                           for r in caplog.records)
            c.wait(lambda: served[1] >= 3 and served[2] >= 3,
                   "both followers were served the damaged batch three times or more")
            time.sleep(2)                    # a window in which a fetch every round would send dozens
            elapsed = time.monotonic() - started
            for i in (1, 2):
                assert refused(i) >= 1
                # Delays of at least 40, 80, 160 ms... (50 ms doubling, less 20 % jitter)
                # up to 4 s: 7 refetches in the first 5 s, one per 4 s after.
                assert served[i] <= 8 + elapsed / 4, (served, elapsed)
                assert refused(i) <= 1 + elapsed / REFETCH_MAX_S, [r.getMessage() for r in caplog.records]
                assert c.log(i, "t").log_end_offset == base
                assert c.log_bytes(i, "t") == good
            os.pwrite(fd, b"p", at)          # repaired: the next refetch takes it
        finally:
            os.close(fd)
    c.wait(same_log_end(c, "t"), "the followers took the repaired batch")
    assert c.log_bytes(1, "t") == c.log_bytes(2, "t") == c.log_bytes(0, "t")
    assert record_values(c.log_bytes(2, "t"))[-1] == b"payload-to-damage"


def count_replica_fetches(c: MemCluster, leader: int, topic: str, offset: int) -> dict[int, int]:
    """From now on, how many fetches of `offset` each follower sends the leader (counted
    where the leader's replica manager takes them)."""
    served: dict[int, int] = collections.Counter()
    replicas = c.brokers[leader].role.replicas
    take = replicas.replica_fetch

    def counted(t, partition, replica_id, fetch_offset, *args, **kwargs):
        if (t, partition, fetch_offset) == (topic, 0, offset):
            served[replica_id] += 1
        return take(t, partition, replica_id, fetch_offset, *args, **kwargs)
    c.run(lambda: setattr(replicas, "replica_fetch", counted))
    return served


def test_follower_behind_the_leaders_log_start_starts_over_there(cluster):
    c = cluster(replica_lag_time_max_ms=400)
    c.create_topic("t", [(0, 1, 2)])
    c.run(lambda: setattr(c.brokers[2].role.replicas, "fetching_paused", True))
    assert all(err is None for err, _ in produce_all(c.bootstrap(), "t", [b"r%d" % i for i in range(30)]))
    c.wait(lambda: c.state("t").isr == (0, 1), "broker 2 out of the ISR")
    assert c.run(lambda: c.log(0, "t").delete_records_before(20)) == 20   # DeleteRecords past broker 2's end
    c.run(lambda: setattr(c.brokers[2].role.replicas, "fetching_paused", False))
    c.wait(same_log_end(c, "t"), "broker 2 caught up from the leader's log start")
    follower = c.log(2, "t")
    assert follower.log_start_offset == 20
    # The leader's batch holding offset 20 may begin below it: both keep it whole.
    assert c.log_bytes(2, "t") == c.log_bytes(0, "t")
    assert record_values(c.log_bytes(2, "t"))[-10:] == [b"r%d" % i for i in range(20, 30)]
    c.wait(lambda: c.state("t").isr == (0, 1, 2), "broker 2 back in the ISR")


def test_acks_all_below_min_insync_is_refused_and_nothing_acknowledged_is_lost(cluster):
    c = cluster(replica_lag_time_max_ms=400)
    c.create_topic("t", [(0, 1, 2)], {"min.insync.replicas": "2"})
    acked = produce_all(c.bootstrap(), "t", [b"before%d" % i for i in range(20)])
    assert all(err is None for err, _ in acked)
    c.wait(same_log_end(c, "t"), "replicated")
    for i in (1, 2):
        c.run(lambda i=i: setattr(c.brokers[i].role.replicas, "fetching_paused", True))
    with Client(c.bootstrap(0)) as cl:
        # Appended while the ISR still had three members, acknowledged only after the
        # high watermark passed it: by then the ISR had shrunk below two.
        err, _ = cl.produce("t", 0, build_batch([(None, b"during")], timestamp_ms=1), acks=-1)
        assert err == KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        assert c.state("t").isr == (0,)
        err, _ = cl.produce("t", 0, build_batch([(None, b"refused")], timestamp_ms=1), acks=-1)
        assert err == KafkaError.NOT_ENOUGH_REPLICAS
        err, _ = cl.produce("t", 0, build_batch([(None, b"acks1")], timestamp_ms=1), acks=1)
        assert err == KafkaError.NONE   # acks=1 does not ask for replicas (Kafka's rule)
    assert b"refused" not in record_values(c.log_bytes(0, "t"))
    for i in (1, 2):
        c.run(lambda i=i: setattr(c.brokers[i].role.replicas, "fetching_paused", False))
    c.wait(lambda: len(c.state("t").isr) == 3, "ISR whole again")
    again = produce_all(c.bootstrap(), "t", [b"after"])
    assert again[0][0] is None
    c.wait(same_log_end(c, "t"), "replicated again")
    for i in range(3):
        got = record_values(c.log_bytes(i, "t"))
        assert got[:20] == [b"before%d" % i for i in range(20)]
        assert got[-1] == b"after"


@WRITE_PATHS
def test_new_leader_deduplicates_a_retry_of_a_batch_the_old_leader_stored(cluster, write_thread_bytes):
    c = cluster(replica_write_thread_bytes=write_thread_bytes)
    c.create_topic("t", [(0, 1, 2)])
    pid, epoch = 4242, 0
    first = build_batch([(None, b"one"), (None, b"two")], timestamp_ms=1, producer_id=pid, producer_epoch=epoch,
                        base_sequence=0)
    with Client(c.bootstrap(0)) as cl:
        err, base = cl.produce("t", 0, first, acks=-1)
    assert (err, base) == (KafkaError.NONE, 0)
    c.wait(same_log_end(c, "t"), "replicated")
    c.set_leader("t", 0, 1)
    c.stop_broker(0)
    with Client(c.bootstrap(1)) as cl:
        err, base = cl.produce("t", 0, first, acks=-1)          # the producer's retry
        assert (err, base) == (KafkaError.NONE, 0)              # Kafka: the original offset, nothing written
        gap = build_batch([(None, b"gap")], timestamp_ms=1, producer_id=pid, producer_epoch=epoch, base_sequence=5)
        assert cl.produce("t", 0, gap, acks=-1)[0] == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
        nxt = build_batch([(None, b"three")], timestamp_ms=1, producer_id=pid, producer_epoch=epoch,
                          base_sequence=2)
        assert cl.produce("t", 0, nxt, acks=-1) == (KafkaError.NONE, 2)
    c.wait(same_log_end(c, "t", (1, 2)), "broker 2 follows the new leader")
    for i in (1, 2):
        assert record_values(c.log_bytes(i, "t")) == [b"one", b"two", b"three"]
    assert c.log_bytes(1, "t") == c.log_bytes(2, "t")


@WRITE_PATHS
def test_idempotent_producer_across_a_leader_change_writes_each_record_once(cluster, write_thread_bytes):
    c = cluster(replica_write_thread_bytes=write_thread_bytes)
    c.create_topic("t", [(0, 1, 2)])
    p = Producer({"bootstrap.servers": c.bootstrap(), "acks": "all", "enable.idempotence": True,
                  "linger.ms": 2, "retry.backoff.ms": 20, "topic.metadata.refresh.interval.ms": 200})
    errors = []
    cb = lambda err, msg: errors.append(err) if err else None   # noqa: E731
    for i in range(300):
        p.produce("t", value=b"x%d" % i, partition=0, on_delivery=cb)
    assert p.flush(30) == 0
    c.set_leader("t", 0, 2)
    c.stop_broker(0)
    for i in range(300, 600):
        p.produce("t", value=b"x%d" % i, partition=0, on_delivery=cb)
    assert p.flush(60) == 0
    assert errors == []
    c.wait(same_log_end(c, "t", (1, 2)), "replicated on 1 and 2")
    got = record_values(c.log_bytes(2, "t"))
    assert sorted(got, key=lambda v: int(v[1:])) == [b"x%d" % i for i in range(600)]
    assert len(got) == len(set(got)) == 600
    assert c.log_bytes(1, "t") == c.log_bytes(2, "t")


@WRITE_PATHS
def test_new_leader_keeps_lso_and_aborted_ranges(cluster, write_thread_bytes):
    c = cluster(replica_write_thread_bytes=write_thread_bytes)
    c.create_topic("t", [(0, 1, 2)])
    p = Producer({"bootstrap.servers": c.bootstrap(0), "transactional.id": "tx-1", "acks": "all"})
    p.init_transactions(30)
    for tag, commit in (("c1", True), ("ab", False), ("c2", True)):
        p.begin_transaction()
        for i in range(5):
            p.produce("t", value=f"{tag}-{i}".encode(), partition=0)
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)
    p.begin_transaction()
    p.produce("t", value=b"open-0", partition=0)
    p.flush(30)
    open_first = c.log(0, "t").log_end_offset - 1
    c.wait(same_log_end(c, "t"), "replicated with markers")
    with Client(c.bootstrap(0)) as cl:
        assert cl.list_offset("t", 0, LATEST, isolation=1) == open_first
    c.set_leader("t", 0, 1)
    c.stop_broker(0)
    with Client(c.bootstrap(1)) as cl:
        assert cl.list_offset("t", 0, LATEST, isolation=1) == open_first    # the open txn still holds the LSO
        assert cl.list_offset("t", 0, LATEST, isolation=0) == open_first + 1
    new_leader = c.log(1, "t")
    aborted = c.run(lambda: new_leader.aborted_transactions(0, new_leader.log_end_offset))
    assert len(aborted) == 1
    seen = read_values(c.bootstrap(1), "t", 1, "read_committed", idle_s=1.0, want=10)
    assert sorted(seen) == sorted([f"c1-{i}" for i in range(5)] + [f"c2-{i}" for i in range(5)])
    try:
        p.abort_transaction(1)
    except KafkaException:
        pass   # its coordinator (broker 0) is gone; only the test's tidy-up


def test_a_transaction_completes_only_once_its_markers_are_replicated(cluster):
    from semel.coordinator.txn_states import TxnState
    c = cluster()
    c.create_topic("t", [(0, 1, 2)])
    p = Producer({"bootstrap.servers": c.bootstrap(0), "transactional.id": "tx-m", "acks": "all"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("t", value=b"v", partition=0)
    p.flush(30)
    for i in (1, 2):
        c.run(lambda i=i: setattr(c.brokers[i].role.replicas, "fetching_paused", True))
    outcome = []
    committing = threading.Thread(target=lambda: outcome.append(p.commit_transaction(60)))
    committing.start()
    state = lambda: c.brokers[0].txn_coordinator.transaction("tx-m").state   # noqa: E731
    c.wait(lambda: c.log(0, "t").producers.ongoing_first_offsets() == {}, "marker appended on the leader")
    assert c.run(state) == TxnState.PREPARE_COMMIT   # not complete: the followers lack the marker
    assert committing.is_alive()
    for i in (1, 2):
        c.run(lambda i=i: setattr(c.brokers[i].role.replicas, "fetching_paused", False))
    committing.join(60)
    assert outcome == [None] and c.run(state) == TxnState.COMPLETE_COMMIT
    for i in (1, 2):
        assert c.run(lambda i=i: c.log(i, "t").producers.ongoing_first_offsets()) == {}


@WRITE_PATHS
def test_diverged_follower_truncates_to_the_new_leader_and_converges(cluster, write_thread_bytes):
    c = cluster(replica_write_thread_bytes=write_thread_bytes)
    c.create_topic("t", [(0, 1, 2)])
    assert all(err is None for err, _ in produce_all(c.bootstrap(), "t", [b"common%d" % i for i in range(10)]))
    c.wait(same_log_end(c, "t"), "replicated")
    for i in (1, 2):
        c.run(lambda i=i: setattr(c.brokers[i].role.replicas, "fetching_paused", True))
    with Client(c.bootstrap(0)) as cl:   # stored on the old leader only (epoch 0), never acknowledged to all
        for i in range(3):
            assert cl.produce("t", 0, build_batch([(None, b"lost%d" % i)], timestamp_ms=1), acks=1)[0] == 0
    assert c.log(0, "t").log_end_offset == 13
    c.set_leader("t", 0, 1)                 # clean election: 1 was in the ISR
    c.run(lambda: setattr(c.brokers[2].role.replicas, "fetching_paused", False))
    with Client(c.bootstrap(1)) as cl:
        for i in range(5):
            assert cl.produce("t", 0, build_batch([(None, b"new%d" % i)], timestamp_ms=1), acks=-1)[0] == 0
    c.wait(same_log_end(c, "t"), "old leader truncated and caught up")
    logs = [c.log_bytes(i, "t") for i in range(3)]
    assert logs[0] == logs[1] == logs[2]
    assert record_values(logs[0]) == [b"common%d" % i for i in range(10)] + [b"new%d" % i for i in range(5)]
    assert c.run(lambda: c.log(0, "t").epochs.entries) == [(0, 0), (1, 10)]
    # The old leader learnt where to cut from the diverging epoch in a Fetch answer
    # (KIP-320/KIP-595), without an OffsetForLeaderEpoch round trip.
    asked = [c.brokers[i].metrics.registry.get_sample_value("semel_requests_total",
                                                            {"api": "offset_for_leader_epoch"}) for i in range(3)]
    assert asked == [None, None, None]


def test_followers_refuse_clients_and_stale_epochs_are_fenced(cluster):
    c = cluster()
    c.create_topic("t", [(0, 1, 2)])
    with Client(c.bootstrap(1)) as cl:
        err, _ = cl.produce("t", 0, build_batch([(None, b"x")], timestamp_ms=1), acks=1)
        assert err == KafkaError.NOT_LEADER_OR_FOLLOWER
        assert cl.fetch("t", 0, 0).error == KafkaError.NOT_LEADER_OR_FOLLOWER
    # A follower's log takes no local write, whoever asks (a coordinator's marker included).
    assert c.run(lambda: _local_write_error(c.log(1, "t"))) == KafkaError.NOT_LEADER_OR_FOLLOWER
    c.set_leader("t", 0, 1)
    with Client(c.bootstrap(1)) as cl:
        stale = _fetch_at_epoch(cl, "t", 0, current_leader_epoch=0)
        assert stale == KafkaError.FENCED_LEADER_EPOCH
        assert _fetch_at_epoch(cl, "t", 0, current_leader_epoch=2) == KafkaError.UNKNOWN_LEADER_EPOCH
        assert _fetch_at_epoch(cl, "t", 0, current_leader_epoch=1) == KafkaError.NONE


def _local_write_error(plog):
    from semel.protocol.records import split_batches
    from semel.storage.errors import AppendError
    data = build_batch([(None, b"x")], timestamp_ms=1)
    try:
        plog.append(data, split_batches(data)[0])
    except AppendError as exc:
        return exc.error
    return KafkaError.NONE


def _fetch_at_epoch(cl: Client, topic: str, partition: int, current_leader_epoch: int) -> KafkaError:
    from semel.protocol.messages import request_class
    T = request_class(1).FetchTopic
    resp = cl.request(1, replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                      session_id=0, session_epoch=-1, topics=[T(topic=topic, partitions=[T.FetchPartition(
                          partition=partition, current_leader_epoch=current_leader_epoch, fetch_offset=0,
                          last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
                      forgotten_topics_data=[], rack_id="")
    return KafkaError(resp.responses[0].partitions[0].error_code)


def test_a_followers_fetch_is_bounded_by_its_own_size_not_the_consumer_cap(cluster):
    """--replica-fetch-max-bytes above the broker's response cap for consumers (here 64
    KiB) takes effect: fewer, larger fetches per MB replicated. Consumers keep the cap."""
    from semel.protocol.messages import request_class
    from tests.support.wire import call, connect
    cap = 64 * 1024
    c = cluster(max_fetch_response_bytes=cap)
    c.create_topic("t", [(0, 1, 2)])
    values = [bytes([i % 251]) * 1000 for i in range(400)]
    assert all(err is None for err, _ in produce_all(c.bootstrap(), "t", values, **{"batch.size": 16384}))
    c.wait(same_log_end(c, "t"), "replicated")
    assert record_values(c.log_bytes(2, "t")) == values
    T = request_class(1).FetchTopic

    def fetch(replica_id: int, epoch: int) -> int:
        with connect(c.bootstrap(0)) as sock:
            resp = call(sock, 1, 12, replica_id=replica_id, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                        isolation_level=0, session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[],
                        topics=[T(topic="t", partitions=[T.FetchPartition(
                            partition=0, current_leader_epoch=epoch, fetch_offset=0, last_fetched_epoch=-1,
                            log_start_offset=0, partition_max_bytes=1 << 20)])])
        part = resp.responses[0].partitions[0]
        assert part.error_code == 0
        return len(part.records)
    assert fetch(-1, -1) <= cap                  # a consumer: the broker's cap
    assert fetch(1, 0) > 2 * cap                  # a follower: its own max bytes (1 MiB)
