"""Transactions in the log: markers, LSO, the aborted-transaction index, and how
producer state and the index survive reopen and crashes."""
from __future__ import annotations

import os

import pytest
from storage_helpers import append, batch, fill, segment_path

from semel.protocol.errors import KafkaError
from semel.protocol.records import CONTROL_ABORT, CONTROL_COMMIT, iter_batches
from semel.storage import LogConfig, PartitionLog, ProducerStateError, StorageError
from semel.storage.checkpoint import FILE_NAME as CHECKPOINT
from semel.storage.producer_state import list_snapshots

ABORT, COMMIT = CONTROL_ABORT, CONTROL_COMMIT
CFG = LogConfig(segment_bytes=2048, index_interval_bytes=128,
                checkpoint_interval_bytes=1 << 40, checkpoint_interval_ms=1 << 40)


class Producer:
    """A transactional producer writing to one partition log."""

    def __init__(self, plog: PartitionLog, pid: int, epoch: int = 0):
        self.plog, self.pid, self.epoch, self.seq = plog, pid, epoch, 0

    def send(self, n: int = 1, txn: bool = True):
        info = append(self.plog, batch([b"p%d-%d" % (self.pid, self.seq + i) for i in range(n)],
                                       pid=self.pid, epoch=self.epoch, seq=self.seq, txn=txn))
        self.seq += n
        return info

    def end(self, kind: int, coordinator_epoch: int = 0):
        return self.plog.append_control(kind, self.pid, self.epoch, coordinator_epoch)


def reopen(plog: PartitionLog, fs=None) -> PartitionLog:
    return PartitionLog.open(plog.directory, CFG, fs)


def test_lso_follows_open_commit_and_abort(p):
    a, b = Producer(p, 1), Producer(p, 2)
    fill(p, 2)
    assert p.last_stable_offset == p.high_watermark == 2
    a.send(2)                                  # offsets 2-3: a's transaction begins at 2
    b.send()                                   # offset 4: b's at 4
    a.send()
    assert p.last_stable_offset == 2 and p.high_watermark == 6
    assert p.producers.ongoing_first_offsets() == {1: 2, 2: 4}
    info = a.end(COMMIT)                       # marker at 6
    assert info.first_offset == info.last_offset == 6
    assert p.last_stable_offset == 4
    b.end(ABORT)
    assert p.last_stable_offset == p.high_watermark == 8
    assert p.producers.first_unstable_offset() is None


def test_markers_are_control_batches_in_the_log(p):
    a = Producer(p, 9)
    a.send()
    a.end(ABORT, coordinator_epoch=4)
    data = p.read(0, 10_000)
    hdrs = [h for _, h in iter_batches(data)]
    assert [(h.base_offset, h.is_control, h.is_transactional, h.producer_id) for h in hdrs] == \
        [(0, False, True, 9), (1, True, True, 9)]
    assert p.producers.entry(9).coordinator_epoch == 4


def test_markers_of_several_producers_end_their_transactions_in_one_write(p):
    """append_controls: one write whose control batches all land before the LSO moves,
    so no instant shows one of the transactions committed and another still open."""
    a, b, c = Producer(p, 1), Producer(p, 2), Producer(p, 3)
    a.send(2)                                  # 0-1
    b.send()                                   # 2
    c.send()                                   # 3
    writes = []
    real = p.write_batches
    p.write_batches = lambda *args, **kw: writes.append(1) or real(*args, **kw)
    info = p.append_controls(COMMIT, [(1, 0), (2, 0)], 0)
    assert writes == [1]
    assert (info.first_offset, info.last_offset) == (4, 5)
    assert p.last_stable_offset == 3           # c's transaction still holds it
    hdrs = [h for _, h in iter_batches(p.read(4, 10_000))]
    assert [(h.base_offset, h.is_control, h.producer_id) for h in hdrs] == [(4, True, 1), (5, True, 2)]
    p.append_controls(ABORT, [(3, 0)], 0)
    assert p.last_stable_offset == p.high_watermark == 7
    assert p.aborted_transactions(0, 7) == [(3, 3)]


def test_one_refused_marker_refuses_the_whole_write(p):
    a, b = Producer(p, 1, epoch=2), Producer(p, 2)
    a.send()
    b.send()
    end = p.log_end_offset
    with pytest.raises(ProducerStateError) as exc:
        p.append_controls(COMMIT, [(2, 0), (1, 1)], 0)     # producer 1's epoch is older than its data
    assert exc.value.error == KafkaError.INVALID_PRODUCER_EPOCH
    assert p.log_end_offset == end and p.last_stable_offset == 0
    assert p.producers.ongoing_first_offsets() == {1: 0, 2: 1}


def test_aborted_transactions_overlapping_a_range(p):
    fill(p, 3)                                 # 0-2 plain
    a, b = Producer(p, 1), Producer(p, 2)
    a.send(2)                                  # 3-4
    b.send()                                   # 5
    a.end(ABORT)                               # marker 6
    b.end(COMMIT)                              # 7
    fill(p, 2)                                 # 8-9
    assert p.aborted_transactions(0, 3) == []
    assert p.aborted_transactions(0, 4) == [(1, 3)]
    assert p.aborted_transactions(6, 10) == [(1, 3)]        # the marker itself is in range
    assert p.aborted_transactions(7, 10) == []
    assert p.aborted_transactions(0, 10) == [(1, 3)]


def test_aborted_index_spans_segments(p):
    a = Producer(p, 1)
    a.send()                                   # begins in the first segment
    for _ in range(60):
        fill(p, 1)                             # other traffic rolls several segments
    a.send()
    assert len(p.segment_bases) >= 3
    marker = a.end(ABORT).first_offset
    b = Producer(p, 2)
    b.send()
    b.end(ABORT)
    mid = p.segment_bases[1]
    assert p.aborted_transactions(mid, mid + 1) == [(1, 0)]
    assert p.aborted_transactions(0, p.log_end_offset) == [(1, 0), (2, marker + 1)]
    assert p.aborted_transactions(marker + 1, p.log_end_offset) == [(2, marker + 1)]


def test_fenced_markers_change_nothing(p):
    a = Producer(p, 1, epoch=5)
    a.send()
    end = p.log_end_offset
    with pytest.raises(ProducerStateError) as exc:
        p.append_control(ABORT, 1, 4, 0)
    assert exc.value.error == KafkaError.INVALID_PRODUCER_EPOCH
    a.end(COMMIT, coordinator_epoch=3)
    a.send()
    with pytest.raises(ProducerStateError) as exc:
        p.append_control(ABORT, 1, 5, 2)       # from a coordinator that was replaced
    assert exc.value.error == KafkaError.TRANSACTION_COORDINATOR_FENCED
    assert p.log_end_offset == end + 2 and p.last_stable_offset == end + 1
    with pytest.raises(ValueError):
        p.append_control(7, 1, 5, 3)


def test_marker_with_a_bumped_epoch_fences_the_old_one(p):
    a = Producer(p, 1, epoch=0)
    a.send(2)
    p.append_control(ABORT, 1, 1, 0)           # coordinator aborts while bumping the epoch
    assert p.last_stable_offset == p.high_watermark
    with pytest.raises(ProducerStateError) as exc:
        a.send()
    assert exc.value.error == KafkaError.INVALID_PRODUCER_EPOCH
    b = Producer(p, 1, epoch=1)
    b.seq = 3
    with pytest.raises(ProducerStateError) as exc:
        b.send()                               # a new epoch starts at sequence 0
    assert exc.value.error == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    b.seq = 0
    b.send()


def test_dedup_survives_a_clean_reopen(p):
    a = Producer(p, 3)
    firsts = [a.send(txn=False).first_offset for _ in range(4)]
    p.close()
    q = reopen(p)
    assert q.recovery.clean
    again = append(q, batch(b"p3-3", pid=3, epoch=0, seq=3))
    assert again.duplicate and again.first_offset == firsts[3]
    assert append(q, batch(b"p3-4", pid=3, epoch=0, seq=4)).first_offset == 4
    q.close()


@pytest.mark.parametrize("lose_checkpoint", [False, True])
def test_dedup_survives_a_crash(p, fs, lose_checkpoint):
    a = Producer(p, 3)
    for _ in range(3):
        a.send(txn=False)
    p.flush(checkpoint=True)
    tail = [a.send(txn=False).first_offset for _ in range(50)]   # unflushed, across rolls
    p.abandon()
    if lose_checkpoint:
        os.unlink(p.directory / CHECKPOINT)
    q = reopen(p, fs)
    for i, seq in enumerate(range(49, 52)):
        again = append(q, batch(b"p3-%d" % seq, pid=3, epoch=0, seq=seq))
        assert again.duplicate and again.first_offset == tail[seq - 3]
    assert append(q, batch(b"next", pid=3, epoch=0, seq=53)).first_offset == 53
    q.close()


def test_a_torn_retry_target_is_accepted_again_after_recovery(p):
    a = Producer(p, 3)
    for _ in range(5):
        a.send(txn=False)
    p.abandon()
    path = segment_path(p.directory, p.segment_bases[-1])
    pos, hdr = list(iter_batches(path.read_bytes()))[-1]
    with open(path, "r+b") as f:
        f.truncate(pos + hdr.size - 1)         # the last batch never fully reached the disk
    q = reopen(p)
    info = append(q, batch(b"p3-4", pid=3, epoch=0, seq=4))
    assert not info.duplicate and info.first_offset == 4
    q.close()


def test_open_transaction_and_aborts_survive_a_crash(p):
    a, b, c = Producer(p, 1), Producer(p, 2), Producer(p, 3)
    a.send()
    a.end(ABORT)                               # aborted before the checkpoint
    p.flush(checkpoint=True)
    b.send(2)
    for _ in range(30):
        fill(p, 1)
    b.end(ABORT)                               # aborted after it: its index entry must be rebuilt
    c.send()                                   # still open at the crash
    lso, aborted = p.last_stable_offset, p.aborted_transactions(0, p.log_end_offset)
    assert len(aborted) == 2
    p.abandon()
    q = reopen(p)
    assert q.last_stable_offset == lso
    assert q.aborted_transactions(0, q.log_end_offset) == aborted
    assert q.producers.ongoing_first_offsets() == {3: lso}
    q.close()
    r = reopen(q)                              # and once more from the clean close
    assert r.last_stable_offset == lso and r.aborted_transactions(0, r.log_end_offset) == aborted
    r.close()


def test_aborts_are_rebuilt_without_any_checkpoint(p):
    a = Producer(p, 1)
    for _ in range(4):
        a.send()
        a.end(ABORT)
    aborted = p.aborted_transactions(0, p.log_end_offset)
    p.close()
    os.unlink(p.directory / CHECKPOINT)
    for name in os.listdir(p.directory):
        if name.endswith(".snapshot") or name.endswith(".txnindex"):
            os.unlink(p.directory / name)
    q = reopen(p)
    assert q.aborted_transactions(0, q.log_end_offset) == aborted == [(1, 0), (1, 2), (1, 4), (1, 6)]
    q.close()


def test_torn_abort_marker_is_cut_and_the_transaction_is_open_again(p):
    a = Producer(p, 1)
    a.send(2)
    p.flush(checkpoint=True)
    a.end(ABORT)
    p.abandon()
    path = segment_path(p.directory, p.segment_bases[-1])
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 3)
    q = reopen(p)
    assert q.log_end_offset == 2
    assert q.last_stable_offset == 0 and q.aborted_transactions(0, 2) == []
    q.append_control(ABORT, 1, 0, 0)           # the coordinator writes it again
    assert q.aborted_transactions(0, 3) == [(1, 0)] and q.last_stable_offset == 3
    q.close()


@pytest.mark.parametrize("partial", [False, True])
def test_failed_marker_write_leaves_state_consistent(p, fs, partial):
    a = Producer(p, 1)
    a.send(2)
    before = (p.log_end_offset, p.size_bytes(), p.last_stable_offset, p.producers.ongoing_first_offsets())
    fs.fail_next_write(path_contains=".log", partial=partial)
    with pytest.raises(StorageError):
        a.end(ABORT)
    assert (p.log_end_offset, p.size_bytes(), p.last_stable_offset, p.producers.ongoing_first_offsets()) == before
    assert p.aborted_transactions(0, 10) == []
    a.end(ABORT)                               # the coordinator retries
    assert p.aborted_transactions(0, 10) == [(1, 0)] and p.last_stable_offset == 3
    p.close()
    fs.clear_faults()
    q = reopen(p, fs)
    assert q.aborted_transactions(0, 10) == [(1, 0)] and q.last_stable_offset == 3
    q.close()


def test_failed_txnindex_fsync_at_checkpoint_keeps_the_data_flushed(p, fs):
    a = Producer(p, 1)
    a.send()
    a.end(ABORT)
    fs.fail_next_fsync(path_contains=".txnindex")
    assert p.flush(checkpoint=True) == 2       # data durable; the checkpoint waits for the next try
    assert p.checkpoints.last_error is not None
    p.abandon()
    q = reopen(p)
    assert q.aborted_transactions(0, 2) == [(1, 0)]
    q.close()


def test_snapshots_are_written_and_pruned(p):
    a = Producer(p, 1)
    for _ in range(80):
        a.send(txn=False)                      # several rolls, each with a snapshot
    p.close()
    snaps = list_snapshots(p.fs, p.directory)
    assert 1 <= len(snaps) <= 2 and snaps[-1] == p.log_end_offset
