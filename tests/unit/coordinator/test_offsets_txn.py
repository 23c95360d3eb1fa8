"""Transactional offsets (TxnOffsetCommit + markers): pending until the COMMIT
marker, dropped by ABORT, UNSTABLE_OFFSET_COMMIT for require_stable, KIP-447
fencing, and replay that reproduces pending/committed state exactly."""
from types import SimpleNamespace

import pytest
from test_group_coordinator import complete_initial, join, stable_group
from test_group_support import async_test, settle, started

from semel.protocol.errors import KafkaError

PID, EPOCH = 4000, 2


def fetch(h, group, tps=None, stable=False):
    err, rows = h.coord.fetch_offsets(group, tps, stable)
    assert err == KafkaError.NONE
    return {(r.topic, r.partition): (r.offset, r.error) for r in rows}


async def txn_commit(h, offsets, group="g", generation=-1, member="", instance=None, pid=PID, epoch=EPOCH):
    return await h.coord.txn_commit_offsets(pid, epoch, group, generation, member, instance, offsets)


@async_test
async def test_pending_offsets_are_invisible_until_commit_marker():
    h = await started()
    await h.coord.commit_offsets("g", -1, "", {("t", 0): (3, -1, "")})
    res = await txn_commit(h, {("t", 0): (10, -1, "txn"), ("t", 1): (20, -1, "")})
    assert res == {("t", 0): KafkaError.NONE, ("t", 1): KafkaError.NONE}
    batch = h.log.batches[-1][1]
    from semel.protocol.records import parse_header
    hdr = parse_header(batch)
    assert hdr.is_transactional and (hdr.producer_id, hdr.producer_epoch, hdr.base_sequence) == (PID, EPOCH, -1)
    assert fetch(h, "g", [("t", 0), ("t", 1)]) == {("t", 0): (3, KafkaError.NONE), ("t", 1): (-1, KafkaError.NONE)}
    assert fetch(h, "g", [("t", 0), ("t", 1)], stable=True) == {
        ("t", 0): (-1, KafkaError.UNSTABLE_OFFSET_COMMIT), ("t", 1): (-1, KafkaError.UNSTABLE_OFFSET_COMMIT)}
    assert fetch(h, "g", None, stable=True) == {("t", 0): (-1, KafkaError.UNSTABLE_OFFSET_COMMIT)}
    assert h.coord.has_pending_offsets(PID)
    assert await h.coord.complete_txn(PID, EPOCH, 0, commit=True) == KafkaError.NONE
    assert fetch(h, "g", [("t", 0), ("t", 1)], stable=True) == {
        ("t", 0): (10, KafkaError.NONE), ("t", 1): (20, KafkaError.NONE)}
    assert not h.coord.has_pending_offsets(PID)


@async_test
async def test_abort_marker_drops_pending_offsets():
    h = await started()
    await h.coord.commit_offsets("g", -1, "", {("t", 0): (3, -1, "")})
    await txn_commit(h, {("t", 0): (10, -1, "")})
    assert await h.coord.complete_txn(PID, EPOCH, 0, commit=False) == KafkaError.NONE
    assert fetch(h, "g", [("t", 0)], stable=True) == {("t", 0): (3, KafkaError.NONE)}


@async_test
async def test_aborted_only_group_is_forgotten():
    h = await started()
    await txn_commit(h, {("t", 0): (10, -1, "")}, group="only-txn")
    assert "only-txn" in h.coord.store.groups
    await h.coord.complete_txn(PID, EPOCH, 0, commit=False)
    assert "only-txn" not in h.coord.store.groups


@async_test
async def test_one_marker_completes_all_groups_of_the_producer_and_no_other_producer():
    h = await started()
    await txn_commit(h, {("t", 0): (1, -1, "")}, group="g1")
    await txn_commit(h, {("t", 0): (2, -1, "")}, group="g2")
    await txn_commit(h, {("t", 0): (3, -1, "")}, group="g1", pid=PID + 1, epoch=0)
    await h.coord.complete_txn(PID, EPOCH, 0, commit=True)
    assert fetch(h, "g1", [("t", 0)], stable=True)[("t", 0)] == (-1, KafkaError.UNSTABLE_OFFSET_COMMIT)
    assert fetch(h, "g1", [("t", 0)])[("t", 0)] == (1, KafkaError.NONE)
    assert fetch(h, "g2", [("t", 0)], stable=True)[("t", 0)] == (2, KafkaError.NONE)
    await h.coord.complete_txn(PID + 1, 0, 0, commit=True)
    assert fetch(h, "g1", [("t", 0)], stable=True)[("t", 0)] == (3, KafkaError.NONE)


@async_test
async def test_later_plain_commit_beats_an_earlier_transactional_one():
    h = await started()
    await txn_commit(h, {("t", 0): (10, -1, "")})
    await h.coord.commit_offsets("g", -1, "", {("t", 0): (50, -1, "")})   # later in the log
    await h.coord.complete_txn(PID, EPOCH, 0, commit=True)
    assert fetch(h, "g", [("t", 0)])[("t", 0)][0] == 50
    await h.coord.commit_offsets("g", -1, "", {("t", 1): (5, -1, "")})
    await txn_commit(h, {("t", 1): (60, -1, "")})                           # later in the log
    await h.coord.complete_txn(PID, EPOCH, 0, commit=True)
    assert fetch(h, "g", [("t", 1)])[("t", 1)][0] == 60
    # and a replay decides the same way
    h2 = await started(logs=h.logs)
    assert fetch(h2, "g", [("t", 0), ("t", 1)]) == {("t", 0): (50, KafkaError.NONE), ("t", 1): (60, KafkaError.NONE)}


@async_test
async def test_kip447_generation_and_member_checks():
    h = await started()
    a, b = await stable_group(h)
    ok = await txn_commit(h, {("t", 0): (1, -1, "")}, generation=1, member=a.member_id)
    assert ok[("t", 0)] == KafkaError.NONE
    assert (await txn_commit(h, {("t", 0): (1, -1, "")}, generation=0, member=a.member_id))[("t", 0)] \
        == KafkaError.ILLEGAL_GENERATION
    assert (await txn_commit(h, {("t", 0): (1, -1, "")}, generation=1, member="zombie"))[("t", 0)] \
        == KafkaError.UNKNOWN_MEMBER_ID
    # generation -1 and no member: the pre-KIP-447 form skips the checks
    assert (await txn_commit(h, {("t", 0): (1, -1, "")}))[("t", 0)] == KafkaError.NONE
    # unknown group: treated as an empty group of generation 0
    assert (await txn_commit(h, {("t", 0): (1, -1, "")}, group="new", generation=2))[("t", 0)] \
        == KafkaError.ILLEGAL_GENERATION
    assert (await txn_commit(h, {("t", 0): (1, -1, "")}, group="new2", member="m"))[("t", 0)] \
        == KafkaError.UNKNOWN_MEMBER_ID


@async_test
async def test_kip447_static_member_fencing():
    h = await started()
    fut = join(h.coord, instance="inst")
    complete_initial(h)
    res = await fut
    out = await txn_commit(h, {("t", 0): (1, -1, "")}, generation=res.generation, member="old-id",
                           instance="inst")
    assert out[("t", 0)] == KafkaError.FENCED_INSTANCE_ID


@async_test
async def test_failures_leave_pending_state_unchanged():
    h = await started()
    h.log.fail_appends = 1
    res = await txn_commit(h, {("t", 0): (10, -1, "")})
    assert res[("t", 0)] == KafkaError.COORDINATOR_NOT_AVAILABLE
    assert not h.coord.has_pending_offsets(PID)
    await txn_commit(h, {("t", 0): (10, -1, "")})
    h.log.fail_appends = 1
    assert await h.coord.complete_txn(PID, EPOCH, 0, commit=True) == KafkaError.KAFKA_STORAGE_ERROR
    assert h.coord.has_pending_offsets(PID)                         # still pending, retry works
    h.flusher.fail_next = 1
    assert await h.coord.complete_txn(PID, EPOCH, 0, commit=True) == KafkaError.KAFKA_STORAGE_ERROR
    assert h.coord.has_pending_offsets(PID)
    assert await h.coord.complete_txn(PID, EPOCH, 0, commit=True) == KafkaError.NONE
    assert fetch(h, "g", [("t", 0)], stable=True)[("t", 0)] == (10, KafkaError.NONE)


@async_test
async def test_fenced_producer_cannot_commit_offsets_or_markers():
    h = await started()
    await txn_commit(h, {("t", 0): (10, -1, "")}, epoch=5)
    assert (await txn_commit(h, {("t", 0): (11, -1, "")}, epoch=4))[("t", 0)] == KafkaError.INVALID_PRODUCER_EPOCH
    assert await h.coord.complete_txn(PID, 4, 0, commit=True) == KafkaError.INVALID_PRODUCER_EPOCH
    assert fetch(h, "g", [("t", 0)], stable=True)[("t", 0)][1] == KafkaError.UNSTABLE_OFFSET_COMMIT


@pytest.mark.parametrize("ending", [None, True, False])
@async_test
async def test_replay_reproduces_pending_and_committed_state(ending):
    h = await started()
    await h.coord.commit_offsets("g", -1, "", {("t", 0): (3, -1, "")})
    await txn_commit(h, {("t", 0): (10, -1, ""), ("t", 1): (11, -1, "")})
    if ending is not None:
        await h.coord.complete_txn(PID, EPOCH, 0, commit=ending)
    h2 = await started(logs=h.logs)
    assert h2.coord.has_pending_offsets(PID) == (ending is None)
    expected = {None: {("t", 0): (-1, KafkaError.UNSTABLE_OFFSET_COMMIT), ("t", 1): (-1, KafkaError.UNSTABLE_OFFSET_COMMIT)},
                True: {("t", 0): (10, KafkaError.NONE), ("t", 1): (11, KafkaError.NONE)},
                False: {("t", 0): (3, KafkaError.NONE), ("t", 1): (-1, KafkaError.NONE)}}[ending]
    assert fetch(h2, "g", [("t", 0), ("t", 1)], stable=True) == expected
    assert fetch(h2, "g", [("t", 0), ("t", 1)], stable=True) == fetch(h, "g", [("t", 0), ("t", 1)], stable=True)
    if ending is None:                         # the marker written after the restart completes it
        assert await h2.coord.complete_txn(PID, EPOCH, 0, commit=True) == KafkaError.NONE
        assert fetch(h2, "g", [("t", 0)], stable=True)[("t", 0)] == (10, KafkaError.NONE)


@pytest.mark.parametrize("ending", [True, False])
@async_test
async def test_deleted_topic_drops_committed_and_pending_offsets_and_replay_agrees(ending):
    """Kafka drops a deleted topic's offsets in every group, a transactional one still
    pending included: its COMMIT marker, written after the tombstone, brings nothing
    back. Other topics' offsets stay; a replay of the log decides the same way."""
    h = await started()
    await h.coord.commit_offsets("g", -1, "", {("t", 0): (3, -1, ""), ("keep", 0): (7, -1, "")})
    await h.coord.commit_offsets("other", -1, "", {("t", 1): (4, -1, "")})
    await txn_commit(h, {("t", 0): (10, -1, ""), ("t", 2): (12, -1, ""), ("keep", 1): (8, -1, "")})
    h.coord.drop_topic_offsets(["t"])
    await settle(h.coord)
    assert await h.coord.complete_txn(PID, EPOCH, 0, commit=ending) == KafkaError.NONE
    want_g = {("t", 0): (-1, KafkaError.NONE), ("t", 2): (-1, KafkaError.NONE), ("keep", 0): (7, KafkaError.NONE),
              ("keep", 1): (8 if ending else -1, KafkaError.NONE)}
    for coord in (h.coord, (await started(logs=h.logs)).coord):
        assert fetch(SimpleNamespace(coord=coord), "g", list(want_g), stable=True) == want_g
        assert fetch(SimpleNamespace(coord=coord), "other") == {}
        assert "other" not in coord.store.groups            # nothing left of it: forgotten
