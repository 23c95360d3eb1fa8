"""ProducerStateManager rules, through PartitionLog.append where offsets matter."""
from __future__ import annotations

import pytest
from storage_helpers import SMALL, append, batch, values

from semel.protocol.errors import KafkaError
from semel.protocol.records import parse_header
from semel.storage import PartitionLog, ProducerStateError
from semel.storage.producer_state import ProducerStateManager
from semel.storage.types import AppendInfo

E = KafkaError
PID = 7000


def hdr(pid=PID, epoch=0, seq=0, n=1, txn=False, ts=1_000):
    return parse_header(batch([b"r%d" % i for i in range(n)], pid=pid, epoch=epoch, seq=seq, txn=txn, ts=ts))


def applied(state: ProducerStateManager, h, first: int) -> None:
    err, dup = state.check(h)
    assert err == E.NONE and dup is None
    state.update(h, AppendInfo(first, first + h.last_offset_delta))


@pytest.fixture
def plog(tmp_path):
    p = PartitionLog.open(tmp_path / "t-0", SMALL)
    yield p
    p.close()


def produce(p, seq, n=1, epoch=0, pid=PID, txn=False):
    return append(p, batch([b"s%d-%d" % (seq, i) for i in range(n)], pid=pid, epoch=epoch, seq=seq, txn=txn))


def refused(p, error, *args, **kw):
    end, size = p.log_end_offset, p.size_bytes()
    with pytest.raises(ProducerStateError) as exc:
        produce(p, *args, **kw)
    assert exc.value.error == error
    assert (p.log_end_offset, p.size_bytes()) == (end, size)     # nothing written


def test_each_of_the_last_five_batches_is_a_duplicate(plog):
    originals = [produce(plog, seq=2 * i, n=2) for i in range(7)]        # seqs 0-1, 2-3, ... 12-13
    end = plog.log_end_offset
    for i in range(2, 7):                                                 # the last five
        again = produce(plog, seq=2 * i, n=2)
        assert again.duplicate
        assert (again.first_offset, again.last_offset) == (originals[i].first_offset, originals[i].last_offset)
    assert plog.log_end_offset == end
    # an older batch is no longer remembered: it is out of order, not silently accepted
    refused(plog, E.OUT_OF_ORDER_SEQUENCE_NUMBER, seq=2)
    assert not produce(plog, seq=14).duplicate


def test_duplicate_must_match_first_and_last_sequence(plog):
    produce(plog, seq=0, n=3)
    refused(plog, E.OUT_OF_ORDER_SEQUENCE_NUMBER, seq=0, n=2)
    refused(plog, E.OUT_OF_ORDER_SEQUENCE_NUMBER, seq=1, n=2)


def test_sequence_gaps_are_refused(plog):
    produce(plog, seq=0, n=2)
    refused(plog, E.OUT_OF_ORDER_SEQUENCE_NUMBER, seq=3)
    refused(plog, E.OUT_OF_ORDER_SEQUENCE_NUMBER, seq=1)
    assert produce(plog, seq=2).first_offset == 2


def test_stale_epoch_is_fenced_and_new_epoch_starts_at_zero(plog):
    produce(plog, seq=0, epoch=3)
    refused(plog, E.INVALID_PRODUCER_EPOCH, seq=1, epoch=2)
    refused(plog, E.OUT_OF_ORDER_SEQUENCE_NUMBER, seq=1, epoch=4)
    produce(plog, seq=0, epoch=4)
    refused(plog, E.INVALID_PRODUCER_EPOCH, seq=1, epoch=3)
    # batches of the old epoch are no longer duplicates: their epoch is fenced
    refused(plog, E.INVALID_PRODUCER_EPOCH, seq=0, epoch=3)


def test_unknown_producer(plog):
    refused(plog, E.UNKNOWN_PRODUCER_ID, seq=5)
    assert produce(plog, seq=0).first_offset == 0


def test_batches_without_producer_id_are_not_checked(plog):
    append(plog, batch(b"a"), batch(b"b"))
    append(plog, batch(b"a"))
    assert plog.log_end_offset == 3 and len(plog.producers) == 0


def test_sequence_minus_one_gets_only_the_epoch_check(plog):
    produce(plog, seq=-1, epoch=2, txn=True)       # e.g. a coordinator's transactional offset commit
    produce(plog, seq=-1, epoch=2, txn=True)
    refused(plog, E.INVALID_PRODUCER_EPOCH, seq=-1, epoch=1, txn=True)
    assert plog.producers.entry(PID).batches == []


def test_sequence_wraps_at_int32():
    state = ProducerStateManager()
    applied(state, hdr(seq=0), 0)
    state.entry(PID).batches[-1] = (2**31 - 3, 2**31 - 2, 0, 0)   # as if it had produced 2^31-1 records
    h = hdr(seq=2**31 - 1, n=3)                    # sequences 2^31-1, 0, 1
    assert h.last_sequence == 1
    applied(state, h, 1)
    assert state.check(hdr(seq=2))[0] == E.NONE
    assert state.check(hdr(seq=0))[0] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert state.check(hdr(seq=2**31 - 1, n=3))[1].duplicate


def test_unknown_producer_must_start_at_zero():
    state = ProducerStateManager()
    assert state.check(hdr(seq=2**31 - 2))[0] == E.UNKNOWN_PRODUCER_ID


def test_several_batches_of_one_producer_in_one_request(plog):
    info = append(plog, batch(b"a", pid=PID, epoch=0, seq=0), batch([b"b", b"c"], pid=PID, epoch=0, seq=1))
    assert (info.first_offset, info.last_offset) == (0, 2)
    again = append(plog, batch(b"a", pid=PID, epoch=0, seq=0), batch([b"b", b"c"], pid=PID, epoch=0, seq=1))
    assert again.duplicate and (again.first_offset, again.last_offset) == (0, 2)
    with pytest.raises(ProducerStateError) as exc:   # second batch skips a sequence
        append(plog, batch(b"d", pid=PID, epoch=0, seq=3), batch(b"e", pid=PID, epoch=0, seq=5))
    assert exc.value.error == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    with pytest.raises(ProducerStateError):          # a retry mixed with new data is not half-applied
        append(plog, batch([b"b", b"c"], pid=PID, epoch=0, seq=1), batch(b"d", pid=PID, epoch=0, seq=3))
    assert plog.log_end_offset == 3


def test_plain_write_inside_an_open_transaction(plog):
    produce(plog, seq=0, txn=True)
    refused(plog, E.INVALID_TXN_STATE, seq=1, txn=False)
    produce(plog, seq=1, txn=True)


def test_snapshot_round_trip():
    state = ProducerStateManager()
    for pid in range(5):
        for i in range(pid + 3):
            applied(state, hdr(pid=pid, epoch=pid, seq=i, txn=pid % 2 == 1, ts=10 * i), pid * 100 + i)
    state.complete_txn(3, 3, 9, 12345)
    again = ProducerStateManager.from_bytes(state.to_bytes())
    for pid in range(5):
        a, b = state.entry(pid), again.entry(pid)
        assert (a.epoch, a.batches, a.last_timestamp, a.coordinator_epoch, a.txn_first_offset) == \
               (b.epoch, b.batches, b.last_timestamp, b.coordinator_epoch, b.txn_first_offset)
        # pid 3's transaction was completed: its window is sealed to one anchor
        assert len(b.batches) == (1 if pid == 3 else min(5, pid + 3))
    assert again.ongoing_first_offsets() == state.ongoing_first_offsets() == {1: 100}
    data = bytearray(state.to_bytes())
    data[20] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        ProducerStateManager.from_bytes(bytes(data))
    with pytest.raises(ValueError):
        ProducerStateManager.from_bytes(b"junk")


def test_expiration_spares_open_transactions():
    state = ProducerStateManager()
    applied(state, hdr(pid=1, ts=1_000), 0)
    applied(state, hdr(pid=2, ts=1_000, txn=True), 1)
    applied(state, hdr(pid=3, ts=9_000), 2)
    assert state.expire(now_ms=10_000, expiration_ms=5_000) == 1
    assert state.entry(1) is None and state.entry(2) is not None and state.entry(3) is not None
    # after expiry a producer is unknown again: continuing its sequence is refused
    assert state.check(hdr(pid=1, seq=1))[0] == E.UNKNOWN_PRODUCER_ID


def test_expire_producers_on_the_log(plog):
    produce(plog, seq=0)
    assert plog.expire_producers(now_ms=1_000 + plog.config.producer_id_expiration_ms) == 1
    refused(plog, E.UNKNOWN_PRODUCER_ID, seq=1)
    assert values(plog) == [(0, b"s0-0")]


@pytest.mark.parametrize("kind", [0, 1], ids=["abort", "commit"])
def test_a_marker_ends_the_dedup_window(plog, kind):
    """A client that repeats a sequence written before a transaction marker (it
    lost track of a batch the broker did store, then aborted) must not be told
    "duplicate" for what is a new record: it gets OUT_OF_ORDER_SEQUENCE_NUMBER,
    and the next sequence after the anchor is still accepted."""
    produce(plog, seq=0, txn=True)
    produce(plog, seq=1, txn=True)
    plog.append_control(kind, PID, 0, 0)
    refused(plog, E.OUT_OF_ORDER_SEQUENCE_NUMBER, seq=1, txn=True)
    refused(plog, E.OUT_OF_ORDER_SEQUENCE_NUMBER, seq=0, txn=True)
    assert not produce(plog, seq=2, txn=True).duplicate
    assert produce(plog, seq=2, txn=True).duplicate      # within a transaction retries still dedup


def test_sealed_anchor_survives_a_snapshot_round_trip():
    state = ProducerStateManager()
    applied(state, hdr(seq=0, txn=True), 0)
    state.complete_txn(PID, 0, 0, 2_000)
    again = ProducerStateManager.from_bytes(state.to_bytes())
    assert again.check(hdr(seq=0, txn=True))[0] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert again.check(hdr(seq=1, txn=True)) == (E.NONE, None)
