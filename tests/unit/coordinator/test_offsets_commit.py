"""OffsetCommit / OffsetFetch semantics on the coordinator (in-memory storage)."""
import asyncio

from test_group_coordinator import complete_initial, join, new_member, stable_group
from test_group_support import async_test, settle, started

from semel.coordinator.group import CommittedOffset
from semel.coordinator.group_states import GroupState
from semel.protocol.errors import KafkaError


def fetch(h, group, tps=None, stable=False):
    err, rows = h.coord.fetch_offsets(group, tps, stable)
    assert err == KafkaError.NONE
    return {(r.topic, r.partition): (r.offset, r.metadata, r.error) for r in rows}


@async_test
async def test_simple_consumer_commit_and_fetch():
    h = await started()
    res = await h.coord.commit_offsets("simple", -1, "", {("t", 0): (10, 3, "m0"), ("t", 1): CommittedOffset(20)})
    assert res == {("t", 0): KafkaError.NONE, ("t", 1): KafkaError.NONE}
    got = fetch(h, "simple", [("t", 0), ("t", 1), ("t", 2), ("u", 0)])
    assert got[("t", 0)] == (10, "m0", KafkaError.NONE)
    assert got[("t", 1)] == (20, "", KafkaError.NONE)
    assert got[("t", 2)] == (-1, "", KafkaError.NONE) and got[("u", 0)][0] == -1
    assert set(fetch(h, "simple")) == {("t", 0), ("t", 1)}          # topics = null: all
    assert fetch(h, "nobody") == {}
    assert fetch(h, "nobody", [("t", 0)])[("t", 0)][0] == -1
    _, rows = h.coord.fetch_offsets("simple", [("t", 0)])
    assert rows[0].leader_epoch == 3


@async_test
async def test_commit_is_invisible_until_durable_and_one_batch_per_request():
    h = await started()
    h.flusher.hold = True
    fut = h.coord.commit_offsets("g", -1, "", {("t", 0): (5, -1, ""), ("t", 1): (6, -1, "")})
    await asyncio.sleep(0)
    assert len(h.log.batches) == 1 and h.log.log_end_offset == 2   # appended at once
    assert fetch(h, "g", [("t", 0)])[("t", 0)][0] == -1             # ...but not yet visible
    assert not fut.done()
    h.flusher.release(0)
    assert (await fut)[("t", 0)] == KafkaError.NONE
    assert fetch(h, "g", [("t", 0)])[("t", 0)][0] == 5


@async_test
async def test_writes_apply_in_log_order_even_if_durability_is_reported_out_of_order():
    h = await started()
    h.flusher.hold = True
    first = h.coord.commit_offsets("g", -1, "", {("t", 0): (5, -1, "")})
    second = h.coord.commit_offsets("g", -1, "", {("t", 0): (7, -1, "")})
    await asyncio.sleep(0)
    h.flusher.release(1)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not second.done()                      # waits behind the first write
    assert fetch(h, "g", [("t", 0)])[("t", 0)][0] == -1
    h.flusher.release(0)
    await first
    await second
    assert fetch(h, "g", [("t", 0)])[("t", 0)][0] == 7


@async_test
async def test_append_failure_answers_error_and_changes_nothing():
    h = await started()
    await h.coord.commit_offsets("g", -1, "", {("t", 0): (5, -1, "")})
    h.log.fail_appends = 1
    res = await h.coord.commit_offsets("g", -1, "", {("t", 0): (9, -1, ""), ("t", 1): (1, -1, "")})
    assert res == {("t", 0): KafkaError.COORDINATOR_NOT_AVAILABLE, ("t", 1): KafkaError.COORDINATOR_NOT_AVAILABLE}
    assert fetch(h, "g") == {("t", 0): (5, "", KafkaError.NONE)}
    h.log.fail_appends = 1
    res = await h.coord.commit_offsets("fresh", -1, "", {("t", 0): (1, -1, "")})
    assert res[("t", 0)] == KafkaError.COORDINATOR_NOT_AVAILABLE
    assert "fresh" not in h.coord.store.groups         # no group left behind by a failed commit


@async_test
async def test_fsync_failure_answers_error_and_changes_nothing():
    h = await started()
    h.flusher.fail_next = 1
    res = await h.coord.commit_offsets("g", -1, "", {("t", 0): (9, -1, "")})
    assert res[("t", 0)] == KafkaError.COORDINATOR_NOT_AVAILABLE
    assert fetch(h, "g") == {}


@async_test
async def test_metadata_too_large_refuses_only_that_partition():
    h = await started(max_metadata_bytes=10)
    res = await h.coord.commit_offsets("g", -1, "", {("t", 0): (1, -1, "x" * 11), ("t", 1): (2, -1, "short")})
    assert res[("t", 0)] != KafkaError.NONE and res[("t", 1)] == KafkaError.NONE
    assert set(fetch(h, "g")) == {("t", 1)}


@async_test
async def test_group_member_commit_validation():
    h = await started()
    a, b = await stable_group(h)
    ok = await h.coord.commit_offsets("g", 1, a.member_id, {("t", 0): (3, -1, "")})
    assert ok[("t", 0)] == KafkaError.NONE
    assert (await h.coord.commit_offsets("g", 0, a.member_id, {("t", 0): (4, -1, "")}))[("t", 0)] \
        == KafkaError.ILLEGAL_GENERATION
    assert (await h.coord.commit_offsets("g", 1, "stranger", {("t", 0): (4, -1, "")}))[("t", 0)] \
        == KafkaError.UNKNOWN_MEMBER_ID
    # a simple commit into a group that has members is refused
    assert (await h.coord.commit_offsets("g", -1, "", {("t", 0): (4, -1, "")}))[("t", 0)] \
        == KafkaError.UNKNOWN_MEMBER_ID
    # unknown group with a generation: the committer belongs to a group that is gone
    assert (await h.coord.commit_offsets("gone", 3, "m", {("t", 0): (4, -1, "")}))[("t", 0)] \
        == KafkaError.ILLEGAL_GENERATION
    assert fetch(h, "g", [("t", 0)])[("t", 0)][0] == 3


@async_test
async def test_commit_allowed_while_preparing_refused_while_completing():
    h = await started()
    a, b = await stable_group(h)
    _, fc = await new_member(h)
    assert h.coord.store.groups["g"].state is GroupState.PREPARING_REBALANCE
    res = await h.coord.commit_offsets("g", 1, a.member_id, {("t", 0): (8, -1, "")})
    assert res[("t", 0)] == KafkaError.NONE       # members commit while revoking
    fa = join(h.coord, a.member_id, protocols=[("range", b"m0")])
    fb = join(h.coord, b.member_id, protocols=[("range", b"m1")])
    ra = await fa
    await fb, await fc
    assert h.coord.store.groups["g"].state is GroupState.COMPLETING_REBALANCE
    res = await h.coord.commit_offsets("g", ra.generation, a.member_id, {("t", 0): (9, -1, "")})
    assert res[("t", 0)] == KafkaError.REBALANCE_IN_PROGRESS
    assert fetch(h, "g", [("t", 0)])[("t", 0)][0] == 8


@async_test
async def test_static_member_fencing_on_commit():
    h = await started()
    fut = join(h.coord, instance="inst")
    complete_initial(h)
    res = await fut
    res2 = await h.coord.commit_offsets("g", res.generation, "someone-else", {("t", 0): (1, -1, "")},
                                        group_instance_id="inst")
    assert res2[("t", 0)] == KafkaError.FENCED_INSTANCE_ID


@async_test
async def test_commit_counts_as_heartbeat():
    h = await started()
    a, b = await stable_group(h, session=10_000)
    for _ in range(3):
        h.clock.advance(4000)
        await h.coord.commit_offsets("g", 1, a.member_id, {("t", 0): (1, -1, "")})
        h.coord.heartbeat("g", 1, b.member_id)
        h.coord.fire_timers()
    assert h.coord.store.groups["g"].state is GroupState.STABLE


@async_test
async def test_offsets_of_an_empty_consumer_group_expire_after_retention():
    h = await started(offsets_retention_ms=100_000, offsets_retention_check_interval_ms=10_000)
    a, = await stable_group(h, n=1)
    await h.coord.commit_offsets("g", 1, a.member_id, {("t", 0): (5, -1, "")})
    await h.coord.commit_offsets("simple", -1, "", {("t", 0): (1, -1, "")})
    h.clock.advance(50_000)
    await h.coord.commit_offsets("simple", -1, "", {("t", 1): (2, -1, "")})
    h.coord.leave_group("g", [(a.member_id, None)])           # g becomes empty now
    await settle(h.coord)
    for _ in range(6):                                         # 60 s later
        h.clock.advance(10_000)
        h.coord.heartbeat("g", 1, "x")
        h.coord.fire_timers()
    await settle(h.coord)
    assert set(fetch(h, "simple")) == {("t", 1)}              # each simple offset ages on its own
    assert set(fetch(h, "g")) == {("t", 0)}                   # group empty only 60 s
    for _ in range(6):
        h.clock.advance(10_000)
        h.coord.fire_timers()
    await settle(h.coord)
    assert fetch(h, "g") == {} and fetch(h, "simple") == {}
    assert "g" not in h.coord.store.groups and "simple" not in h.coord.store.groups   # memory is bounded
    h2 = await started(logs=h.logs, clock=h.clock)             # and the log agrees
    assert not h2.coord.store.groups


@async_test
async def test_offsets_of_active_groups_never_expire():
    h = await started(offsets_retention_ms=1000, offsets_retention_check_interval_ms=500)
    a, = await stable_group(h, n=1, session=60_000)
    await h.coord.commit_offsets("g", 1, a.member_id, {("t", 0): (5, -1, "")})
    for _ in range(10):
        h.clock.advance(500)
        h.coord.heartbeat("g", 1, a.member_id)
        h.coord.fire_timers()
    await settle(h.coord)
    assert fetch(h, "g")[("t", 0)][0] == 5


@async_test
async def test_replay_restores_offsets_and_later_writes_win():
    h = await started()
    await h.coord.commit_offsets("g", -1, "", {("t", 0): (1, -1, "a"), ("t", 1): (2, -1, None)})
    await h.coord.commit_offsets("g", -1, "", {("t", 0): (3, 4, "b")})
    await h.coord.commit_offsets("other", -1, "", {("x", 9): (99, -1, "")})
    before = {g: fetch(h, g) for g in ("g", "other")}
    h2 = await started(logs=h.logs)
    assert {g: fetch(h2, g) for g in ("g", "other")} == before
    assert fetch(h2, "g")[("t", 0)] == (3, "b", KafkaError.NONE)
    assert fetch(h2, "g")[("t", 1)] == (2, None, KafkaError.NONE)
