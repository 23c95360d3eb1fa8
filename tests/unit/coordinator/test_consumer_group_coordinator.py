"""The group coordinator's consumer groups (KIP-848) on in-memory storage: a heartbeat's
change is invisible until durable, a second heartbeat waits for the first's write, a
restart replays the group, compaction keeps it, a silent member is fenced, and offset
commits are checked against member epochs."""
import asyncio

from test_group_support import FakeClock, MemLogs, async_test, settle, started

from semel.coordinator.consumer_group_rules import Heartbeat
from semel.protocol.errors import KafkaError

TOPICS = {"t": 4}


def hb(member, epoch, owned=None, **kw):
    if epoch == 0:
        kw.setdefault("topics", ("t",))
        owned = frozenset() if owned is None else owned
    return Heartbeat(member, epoch, owned=owned, **kw)


async def join(h, group, member, **kw):
    fut = asyncio.ensure_future(h.coord.consumers.consumer_group_heartbeat(group, hb(member, 0, **kw), TOPICS))
    await asyncio.sleep(0)
    for i, w in enumerate(h.flusher.waiting):
        h.flusher.release(i)
    return await fut


@async_test
async def test_a_join_is_answered_and_visible_only_once_durable():
    h = await started()
    h.flusher.hold = True
    fut = asyncio.ensure_future(h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0), TOPICS))
    for _ in range(3):
        await asyncio.sleep(0)
    assert h.log.log_end_offset > 0 and not fut.done()
    assert h.coord.consumer_group_describe(["g"])[0].error == KafkaError.GROUP_ID_NOT_FOUND
    h.flusher.release(0)
    answer = await fut
    assert answer.error == KafkaError.NONE and answer.member_epoch == 1
    assert answer.assignment == {("t", p) for p in range(4)}
    assert h.coord.consumer_group_describe(["g"])[0].group.current["a"].epoch == 1


@async_test
async def test_a_second_heartbeat_waits_for_the_first_write():
    h = await started()
    h.flusher.hold = True
    first = asyncio.ensure_future(h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0), TOPICS))
    second = asyncio.ensure_future(h.coord.consumers.consumer_group_heartbeat("g", hb("b", 0), TOPICS))
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(h.flusher.waiting) == 1          # b decides only after a's write is applied
    h.flusher.release(0)
    a = await first
    for _ in range(3):
        await asyncio.sleep(0)
    h.flusher.release(1)
    b = await second
    assert (a.member_epoch, b.member_epoch) == (1, 2)
    assert b.assignment == frozenset()          # all four are still a's until it releases them


@async_test
async def test_a_failed_append_changes_nothing_and_a_failed_fsync_leaves_memory_as_the_log():
    h = await started()
    h.log.fail_appends = 1
    answer = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0), TOPICS)
    assert answer.error == KafkaError.COORDINATOR_NOT_AVAILABLE
    assert h.coord.consumer_group_describe(["g"])[0].group is None and h.log.log_end_offset == 0
    h.flusher.fail_next = 1
    answer = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0), TOPICS)
    assert answer.error == KafkaError.COORDINATOR_NOT_AVAILABLE      # the member retries
    replayed = await started(logs=h.logs)
    assert h.coord.consumer_group_describe(["g"])[0].group == replayed.coord.consumer_group_describe(["g"])[0].group
    again = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0), TOPICS)
    assert again.error == KafkaError.NONE and again.assignment == {("t", p) for p in range(4)}


@async_test
async def test_restart_replays_the_group_and_compaction_keeps_it():
    logs, clock = MemLogs(), FakeClock()
    h = await started(logs=logs, clock=clock, compact_records=1)
    a = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0, instance_id="ia"), TOPICS)
    b = await h.coord.consumers.consumer_group_heartbeat("g", hb("b", 0), TOPICS)
    a2 = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", a.member_epoch, owned=a.assignment), TOPICS)
    before = h.coord.consumer_group_describe(["g"])[0].group
    assert before.current["a"].revoking                 # a is giving two partitions up
    h.coord.offset_manager.maybe_compact()
    await settle(h.coord)
    assert h.log.log_start_offset == 0 and len(h.log.batches) > 0
    h2 = await started(logs=logs, clock=clock)
    after = h2.coord.consumer_group_describe(["g"])[0].group
    assert after == before
    # The member goes on at its epoch after the restart.
    a3 = await h2.coord.consumers.consumer_group_heartbeat("g", hb("a", a2.member_epoch, owned=a2.assignment), TOPICS)
    assert a3.error == KafkaError.NONE and a3.member_epoch == after.target_epoch
    assert b.error == KafkaError.NONE


@async_test
async def test_compaction_rewrite_drops_old_segments_and_keeps_the_group():
    h = await started(compact_records=1)
    for _ in range(3):
        a = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0), TOPICS)
    h.log.delete_segments_before = lambda start: setattr(h.log, "dropped_before", start) or 1
    h.coord.offset_manager.maybe_compact()
    await settle(h.coord)
    rewritten_from = h.log.dropped_before
    logs2 = MemLogs()
    log2 = logs2.logs[("__consumer_offsets", 0)] = type(h.log)()
    log2.batches = [(base, raw) for base, raw in h.log.batches if base >= rewritten_from]
    log2.log_start_offset, log2.log_end_offset = rewritten_from, h.log.log_end_offset
    h2 = await started(logs=logs2)
    assert h2.coord.consumer_group_describe(["g"])[0].group == h.coord.consumer_group_describe(["g"])[0].group
    assert a.error == KafkaError.NONE


@async_test
async def test_a_silent_member_is_fenced_after_its_session():
    h = await started(consumer_session_timeout_ms=1000)
    a = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0), TOPICS)
    await h.coord.consumers.consumer_group_heartbeat("g", hb("b", 0), TOPICS)
    h.clock.advance(600)
    await h.coord.consumers.consumer_group_heartbeat("g", hb("a", a.member_epoch, owned=a.assignment), TOPICS)
    h.clock.advance(600)
    h.coord.fire_timers()                       # b: 1200 ms silent; a heard from 600 ms ago
    await settle(h.coord)
    g = h.coord.consumer_group_describe(["g"])[0].group
    assert set(g.members) == {"a"}
    fenced = await h.coord.consumers.consumer_group_heartbeat("g", hb("b", 2, owned=frozenset()), TOPICS)
    assert fenced.error == KafkaError.UNKNOWN_MEMBER_ID


@async_test
async def test_offset_commits_carry_the_member_epoch():
    h = await started()
    a = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0), TOPICS)
    e = a.member_epoch

    async def commit(epoch, member="a", version=9):
        res = await h.coord.commit_offsets("g", epoch, member, {("t", 0): (5, -1, "")}, api_version=version)
        return res[("t", 0)]

    assert await commit(e) == KafkaError.NONE
    assert await commit(e - 1) == KafkaError.STALE_MEMBER_EPOCH
    assert await commit(e + 1) == KafkaError.FENCED_MEMBER_EPOCH
    assert await commit(e, member="nobody") == KafkaError.UNKNOWN_MEMBER_ID
    assert await commit(-1, member="") == KafkaError.UNKNOWN_MEMBER_ID     # the group has members
    assert await commit(e, version=8) == KafkaError.UNSUPPORTED_VERSION

    async def txn_commit(epoch, member="a"):
        res = await h.coord.txn_commit_offsets(7, 0, "g", epoch, member, None, {("t", 1): (9, -1, "")})
        return res[("t", 1)]

    assert await txn_commit(e) == KafkaError.NONE
    assert await txn_commit(e - 1) == KafkaError.ILLEGAL_GENERATION
    assert await txn_commit(e + 1) == KafkaError.FENCED_MEMBER_EPOCH
    assert await txn_commit(-1, member="") == KafkaError.NONE   # a producer that names no member


@async_test
async def test_classic_and_consumer_groups_keep_to_their_own_protocol():
    h = await started()
    await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0), TOPICS)
    res = await h.coord.join_group("g", "", protocol_type="consumer", protocols=[("range", b"")],
                                   session_timeout_ms=10_000)
    assert res.error == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    assert h.coord.describe_groups(["g"])[0].error == KafkaError.GROUP_ID_NOT_FOUND
    err, rows = h.coord.list_groups()
    assert ("g", "consumer", "Stable") in rows
    leave = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", -1), TOPICS)
    assert leave.member_epoch == -1
    assert (await h.coord.delete_groups(["g"]))["g"] == KafkaError.NONE
    assert h.coord.consumer_group_describe(["g"])[0].error == KafkaError.GROUP_ID_NOT_FOUND


@async_test
async def test_a_member_that_never_revokes_is_fenced_after_its_rebalance_timeout():
    h = await started(consumer_session_timeout_ms=60_000)
    a = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0, rebalance_timeout_ms=5000), TOPICS)
    b = await h.coord.consumers.consumer_group_heartbeat("g", hb("b", 0), TOPICS)
    told = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", a.member_epoch, owned=a.assignment), TOPICS)
    assert len(told.assignment) == 2          # a must give two partitions up
    for _ in range(4):                        # ...and keeps heartbeating with all four
        h.clock.advance(1000)
        again = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", told.member_epoch, owned=a.assignment), TOPICS)
        assert again.error == KafkaError.NONE
        h.coord.fire_timers()
        await settle(h.coord)
    assert "a" in h.coord.consumer_group_describe(["g"])[0].group.members   # 4 s: within its timeout
    h.clock.advance(1500)
    h.coord.fire_timers()
    await settle(h.coord)
    g = h.coord.consumer_group_describe(["g"])[0].group
    assert set(g.members) == {"b"}
    b2 = await h.coord.consumers.consumer_group_heartbeat("g", hb("b", b.member_epoch, owned=frozenset()), TOPICS)
    assert b2.assignment == {("t", p) for p in range(4)}


@async_test
async def test_a_member_that_revokes_in_time_is_not_fenced():
    h = await started(consumer_session_timeout_ms=60_000)
    a = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0, rebalance_timeout_ms=5000), TOPICS)
    await h.coord.consumers.consumer_group_heartbeat("g", hb("b", 0), TOPICS)
    told = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", a.member_epoch, owned=a.assignment), TOPICS)
    h.clock.advance(1000)
    done = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", told.member_epoch, owned=told.assignment), TOPICS)
    assert done.member_epoch > told.member_epoch
    h.clock.advance(10_000)
    h.coord.fire_timers()
    await settle(h.coord)
    assert set(h.coord.consumer_group_describe(["g"])[0].group.members) == {"a", "b"}


@async_test
async def test_an_emptied_consumer_group_becomes_classic_when_a_classic_member_joins():
    h = await started(initial_rebalance_delay_ms=0)
    a = await h.coord.consumers.consumer_group_heartbeat("g", hb("a", 0), TOPICS)
    await h.coord.commit_offsets("g", a.member_epoch, "a", {("t", 0): (5, -1, "")}, api_version=9)
    await h.coord.consumers.consumer_group_heartbeat("g", hb("a", -1), TOPICS)
    fut = h.coord.join_group("g", "", protocol_type="consumer", protocols=[("range", b"")],
                             session_timeout_ms=10_000, require_known_member_id=False)
    await settle(h.coord)
    h.coord.fire_timers()                      # the (zero) initial rebalance delay
    joined = await asyncio.wait_for(fut, 5)
    assert joined.error == KafkaError.NONE
    await settle(h.coord)
    assert h.coord.group_type("g") == "classic"
    assert "g" not in h.coord.store.consumer_groups                        # its records are tombstoned
    assert h.coord.describe_groups(["g"])[0].error == KafkaError.NONE
    assert [r[0] for r in h.coord.list_groups()[1]] == ["g"]
    assert h.coord.fetch_offsets("g", [("t", 0)])[1][0].offset == 5  # the offsets stay
    replayed = await started(logs=h.logs)
    assert "g" not in replayed.coord.store.consumer_groups
    # Back the other way is refused while the classic member is there.
    back = await h.coord.consumers.consumer_group_heartbeat("g", hb("b", 0), TOPICS)
    assert back.error == KafkaError.GROUP_ID_NOT_FOUND
