"""Idempotent produce against a real broker process, driven byte-exact with the raw client.

What Kafka promises an idempotent producer, and what is checked here:
- InitProducerId without a transactional id hands out producer ids that are never
  reused, also across a SIGKILL and restart of the broker;
- sequences are tracked per (producer id, partition): a gap is
  OUT_OF_ORDER_SEQUENCE_NUMBER, a retry of any of the last 5 batches gets the
  original offsets back and appends nothing, an older retry is out of order;
- an older epoch is INVALID_PRODUCER_EPOCH; a producer the partition does not know
  must start at sequence 0 (semel answers UNKNOWN_PRODUCER_ID otherwise; Kafka
  since 2.5 accepts any sequence there, semel refuses to guess);
- the producer state survives a SIGKILL (snapshot written at a clean stop + replay
  of the log tail), so a retry after the restart is still recognised;
- KIP-360: InitProducerId v3+ carrying the current producer id/epoch;
- a disk fault while appending (EIO, torn write, failed fsync) gives the producer an
  error, and its retry is stored exactly once.
"""
from __future__ import annotations

import urllib.request

import pytest

from semel.client import Client
from semel.launch.process import free_port
from semel.protocol import records
from semel.protocol.errors import KafkaError

E = KafkaError


@pytest.fixture
def ibroker(start_broker):
    metrics_port = free_port()
    b = start_broker("--metrics-port", str(metrics_port))
    b.metrics_port = metrics_port
    with Client(b.bootstrap) as c:
        assert c.create_topic("t", 2) == E.NONE
    return b


def duplicates_metric(broker) -> float:
    """semel_idempotent_duplicates_total as the broker exports it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith("semel_idempotent_duplicates_total "):
            return float(line.split()[1])
    raise AssertionError("semel_idempotent_duplicates_total not exported")


def call(c: Client, api_key: int, version: int, **fields):
    """One request at an exact version (the client otherwise uses its highest)."""
    saved = c.versions[api_key]
    c.versions[api_key] = version
    try:
        return c.request(api_key, **fields)
    finally:
        c.versions[api_key] = saved


def init_pid(c: Client, txn_id=None, producer_id=-1, epoch=-1, version=4, timeout_ms=60_000):
    r = call(c, 22, version, transactional_id=txn_id, transaction_timeout_ms=timeout_ms,
             producer_id=producer_id, producer_epoch=epoch)
    return E(r.error_code), r.producer_id, r.producer_epoch


def batch(pid, seq, n=1, epoch=0, tag=b"v"):
    return records.build_batch([(None, tag + b"%d" % (seq + i)) for i in range(n)],
                               producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def leo(c: Client, topic="t", partition=0) -> int:
    return c.list_offset(topic, partition, -1)


def values(c: Client, topic="t", partition=0) -> list[bytes]:
    data = c.fetch(topic, partition, 0).records
    return [r.value for pos, _ in records.iter_batches(data) for r in records.iter_records(data, pos)]


# --- producer ids -----------------------------------------------------------------------

def test_producer_ids_are_unique_and_never_reused_across_restarts(ibroker):
    seen = []
    for restart in ("kill", "stop", None):
        with Client(ibroker.bootstrap) as c:
            for _ in range(40):
                err, pid, epoch = init_pid(c, version=4)
                assert (err, epoch) == (E.NONE, 0)
                seen.append(pid)
            err, pid, epoch = init_pid(c, version=0)     # the oldest version too
            assert (err, epoch) == (E.NONE, 0)
            seen.append(pid)
        if restart == "kill":
            ibroker.kill()
            ibroker.restart()
        elif restart == "stop":
            ibroker.stop()
            ibroker.start()
    assert len(set(seen)) == len(seen) == 123
    assert min(seen) >= 0


# --- sequence checks ---------------------------------------------------------------------

def test_sequences_are_tracked_per_producer_and_partition(ibroker):
    with Client(ibroker.bootstrap) as c:
        _, p1, _ = init_pid(c)
        _, p2, _ = init_pid(c)
        # Each (producer, partition) pair starts at 0 and counts records, not batches.
        assert c.produce("t", 0, batch(p1, 0, n=3)) == (E.NONE, 0)
        assert c.produce("t", 1, batch(p1, 0, n=2)) == (E.NONE, 0)
        assert c.produce("t", 0, batch(p2, 0)) == (E.NONE, 3)
        assert c.produce("t", 0, batch(p1, 3)) == (E.NONE, 4)
        assert c.produce("t", 1, batch(p1, 2)) == (E.NONE, 2)
        # p1's sequence on partition 0 says nothing about partition 1, and vice versa.
        assert c.produce("t", 1, batch(p1, 4))[0] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert c.produce("t", 0, batch(p2, 2))[0] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert c.produce("t", 0, batch(p2, 1)) == (E.NONE, 5)
        assert (leo(c, "t", 0), leo(c, "t", 1)) == (6, 3)


def test_retry_of_each_of_last_five_batches_appends_nothing(ibroker):
    with Client(ibroker.bootstrap) as c:
        _, pid, _ = init_pid(c)
        sent = []          # (sequence, records, base offset)
        seq = 0
        for i in range(8):
            n = 1 + i % 3
            err, base = c.produce("t", 0, batch(pid, seq, n=n))
            assert err == E.NONE
            sent.append((seq, n, base))
            seq += n
        end = leo(c)
        before = duplicates_metric(ibroker)
        for s, n, base in sent[-5:]:
            assert c.produce("t", 0, batch(pid, s, n=n)) == (E.NONE, base)
        assert leo(c) == end
        assert duplicates_metric(ibroker) == before + 5
        # The 6th-most-recent batch is no longer remembered: Kafka calls that out of order.
        s, n, _ = sent[-6]
        assert c.produce("t", 0, batch(pid, s, n=n))[0] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert leo(c) == end
        # Nothing was stored twice and the next sequence still fits.
        assert c.produce("t", 0, batch(pid, seq)) == (E.NONE, end)
        assert len(values(c)) == len(set(values(c))) == end + 1


def test_gap_unknown_producer_and_stale_epoch_are_refused_before_append(ibroker):
    with Client(ibroker.bootstrap) as c:
        _, pid, _ = init_pid(c)
        assert c.produce("t", 0, batch(pid, 0, n=2)) == (E.NONE, 0)
        assert c.produce("t", 0, batch(pid, 3))[0] == E.OUT_OF_ORDER_SEQUENCE_NUMBER       # gap (2 missing)
        _, stranger, _ = init_pid(c)
        assert c.produce("t", 0, batch(stranger, 7))[0] == E.UNKNOWN_PRODUCER_ID            # must start at 0
        # Epochs: a newer epoch restarts sequences at 0; the older one is then fenced.
        assert c.produce("t", 0, batch(pid, 5, epoch=1))[0] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert c.produce("t", 0, batch(pid, 0, epoch=1)) == (E.NONE, 2)
        assert c.produce("t", 0, batch(pid, 2, epoch=0))[0] == E.INVALID_PRODUCER_EPOCH
        assert c.produce("t", 0, batch(pid, 0, epoch=0))[0] == E.INVALID_PRODUCER_EPOCH   # even a "retry"
        assert leo(c) == 3
        assert c.produce("t", 0, batch(stranger, 0)) == (E.NONE, 3)                       # a clean start works


def test_retry_after_sigkill_is_still_deduplicated(ibroker):
    """Batches before a clean stop come back from the producer-state snapshot, those
    after it from replaying the log tail at recovery; retries of both are recognised."""
    with Client(ibroker.bootstrap) as c:
        _, pid, _ = init_pid(c)
        for s in range(3):
            assert c.produce("t", 0, batch(pid, s)) == (E.NONE, s)
    ibroker.stop()
    assert list(ibroker.data_dir.joinpath("t-0").glob("*.snapshot")), "a clean stop writes a snapshot"
    ibroker.start()
    with Client(ibroker.bootstrap) as c:
        for s in range(3, 6):
            assert c.produce("t", 0, batch(pid, s)) == (E.NONE, s)
    ibroker.kill()
    ibroker.restart()
    with Client(ibroker.bootstrap) as c:
        for s in range(1, 6):                           # the last 5: two from the snapshot, three replayed
            assert c.produce("t", 0, batch(pid, s)) == (E.NONE, s)
        assert c.produce("t", 0, batch(pid, 0))[0] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert c.produce("t", 0, batch(pid, 7))[0] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert leo(c) == 6
        assert c.produce("t", 0, batch(pid, 6)) == (E.NONE, 6)
        assert values(c) == [b"v%d" % i for i in range(7)]
    assert duplicates_metric(ibroker) == 5


def test_kill_during_retries_of_a_multi_batch_request(ibroker):
    """Two batches of one producer in one request: a retry of the pair is a duplicate
    as a whole, also after a SIGKILL; a pair mixing old and new is refused."""
    with Client(ibroker.bootstrap) as c:
        _, pid, _ = init_pid(c)
        pair = batch(pid, 0, n=2) + batch(pid, 2, n=2)
        assert c.produce("t", 0, pair) == (E.NONE, 0)
    ibroker.kill()
    ibroker.restart()
    with Client(ibroker.bootstrap) as c:
        assert c.produce("t", 0, pair) == (E.NONE, 0)
        mixed = batch(pid, 2, n=2) + batch(pid, 4)
        assert c.produce("t", 0, mixed)[0] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert leo(c) == 4


# --- KIP-360 epoch bumps --------------------------------------------------------------------

def test_kip360_idempotent_producer_passing_its_id_gets_a_fresh_one(ibroker):
    """Kafka answers a non-transactional InitProducerId with a new producer id at
    epoch 0 whatever id/epoch it carries; sequences then start over at 0."""
    with Client(ibroker.bootstrap) as c:
        _, pid, _ = init_pid(c)
        assert c.produce("t", 0, batch(pid, 0)) == (E.NONE, 0)
        for version in (3, 4):
            err, new, epoch = init_pid(c, producer_id=pid, epoch=0, version=version)
            assert (err, epoch) == (E.NONE, 0) and new != pid
            end = leo(c)
            assert c.produce("t", 0, batch(new, 0)) == (E.NONE, end)
            pid = new


def test_kip360_transactional_epoch_bump_and_fencing(ibroker):
    with Client(ibroker.bootstrap) as c:
        err, pid, epoch = init_pid(c, "kip360")
        assert (err, epoch) == (E.NONE, 0)
        # The current instance passes its id/epoch: same producer id, epoch + 1.
        assert init_pid(c, "kip360", pid, 0, version=3) == (E.NONE, pid, 1)
        assert init_pid(c, "kip360", pid, 1, version=4) == (E.NONE, pid, 2)
        # A retry of that bump (the answer was lost) is not fenced ...
        err, same, bumped = init_pid(c, "kip360", pid, 1, version=4)
        assert (err, same) == (E.NONE, pid) and bumped >= 2   # Kafka: 2 (no bump), semel: 3
        # ... but an epoch from before that is: PRODUCER_FENCED on v4, INVALID_PRODUCER_EPOCH before.
        assert init_pid(c, "kip360", pid, 0, version=4)[0] == E.PRODUCER_FENCED
        assert init_pid(c, "kip360", pid, 0, version=3)[0] == E.INVALID_PRODUCER_EPOCH
        # A producer id this transactional id never had is fenced too.
        assert init_pid(c, "kip360", pid + 1000, bumped, version=4)[0] == E.PRODUCER_FENCED
        # v0-v2 cannot carry an id: they always bump (a new instance).
        assert init_pid(c, "kip360", version=2) == (E.NONE, pid, bumped + 1)


# --- disk faults while appending ---------------------------------------------------------------

@pytest.mark.parametrize("fault", ["fail_next_write=1", "fail_next_write=1,partial=1", "fail_next_fsync=1",
                                   "fail_next_fsync=1,drop=1"])
def test_retry_after_disk_fault_is_stored_exactly_once(start_broker, tmp_path, fault):
    """A failed write is cut back; a failed fsync leaves the log's unflushed tail
    untrusted (with drop=1 its bytes are gone from the file, as Linux may drop the
    pages of a failed fsync), and the retry's append cuts it back first: the retry is
    written and fsynced again, not answered as a duplicate of bytes a power cut or
    the page cache could take (storage/fsync_repair.py)."""
    from test_txn_faults import arm, assert_logs_whole
    b = start_broker(env={"SEMEL_FS_FAULTS": f"control_file={tmp_path / 'faults'}"})
    b.control_file = tmp_path / "faults"
    with Client(b.bootstrap) as c:
        assert c.create_topic("t", 1) == E.NONE
        _, pid, _ = init_pid(c)
        assert c.produce("t", 0, batch(pid, 0)) == (E.NONE, 0)
        arm(b, f"{fault},path_contains=t-0/00000000000000000000.log")
        assert c.produce("t", 0, batch(pid, 1))[0] == E.KAFKA_STORAGE_ERROR
        # Not written (write fault) or cut back before the retry (fsync fault): one copy.
        assert c.produce("t", 0, batch(pid, 1)) == (E.NONE, 1)
        assert c.produce("t", 0, batch(pid, 2)) == (E.NONE, 2)
    b.kill()
    assert_logs_whole(b.data_dir)
    b.restart()
    with Client(b.bootstrap) as c:
        assert c.produce("t", 0, batch(pid, 1)) == (E.NONE, 1)
        assert values(c) == [b"v0", b"v1", b"v2"]
