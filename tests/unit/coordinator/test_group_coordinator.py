"""GroupCoordinator membership: join/sync barrier, heartbeats, timeouts, leave,
static members, describe/list/delete. Storage is in memory, time is a fake clock."""
import asyncio

from test_group_support import async_test, settle, started

from tests.support.coordinators import group_coordinator, start
from semel.coordinator.group import GroupConfig
from semel.coordinator.group_states import GroupState
from semel.coordinator.runtime import Status
from semel.protocol.errors import KafkaError

RANGE = [("range", b"meta")]


def join(coord, member_id="", group="g", protocols=RANGE, session=10_000, rebalance=30_000,
         instance=None, client_id="client", ptype="consumer", require_known=True):
    return coord.join_group(group, member_id, protocol_type=ptype, protocols=list(protocols),
                            session_timeout_ms=session, rebalance_timeout_ms=rebalance,
                            group_instance_id=instance, client_id=client_id,
                            client_host="/127.0.0.1", require_known_member_id=require_known)


async def new_member(h, group="g", **kw):
    """KIP-394 two-step join: the first attempt only hands out a member id."""
    first = await join(h.coord, group=group, **kw)
    assert first.error == KafkaError.MEMBER_ID_REQUIRED
    assert first.member_id.startswith(kw.get("client_id", "client") + "-")
    return first.member_id, join(h.coord, first.member_id, group=group, **kw)


async def stable_group(h, n=2, group="g", **kw):
    """n members joined during the initial delay, assignments synced."""
    futs = []
    for i in range(n):
        mid, fut = await new_member(h, group=group, protocols=[("range", f"m{i}".encode())], **kw)
        futs.append(fut)
    complete_initial(h)
    results = [await f for f in futs]
    leader = results[0].leader
    syncs = [h.coord.sync_group(group, r.generation, r.member_id,
                                assignments={x.member_id: x.member_id.encode() for x in results}
                                if r.member_id == leader else None)
             for r in results]
    await settle(h.coord)
    for s, r in zip(syncs, results):
        assert (await s).assignment == r.member_id.encode()
    return results


def complete_initial(h):
    """Let the initial rebalance delay run out (it is extended once per round in
    which new members arrived)."""
    for _ in range(3):
        h.clock.advance(h.coord.config.initial_rebalance_delay_ms)
        h.coord.fire_timers()


def state(h, group="g"):
    return h.coord.store.groups[group].state


@async_test
async def test_first_join_requires_a_member_id_then_completes_after_initial_delay():
    h = await started()
    mid, fut = await new_member(h)
    await asyncio.sleep(0)
    assert not fut.done()                         # held by the initial rebalance delay
    assert state(h) is GroupState.PREPARING_REBALANCE
    h.clock.advance(299)
    h.coord.fire_timers()
    assert not fut.done()
    h.clock.advance(1)
    h.coord.fire_timers()
    res = await fut
    assert res.error == KafkaError.NONE
    assert (res.member_id, res.leader, res.generation) == (mid, mid, 1)
    assert res.protocol_name == "range" and res.protocol_type == "consumer"
    assert res.members == [(mid, None, b"meta")]
    assert state(h) is GroupState.COMPLETING_REBALANCE


@async_test
async def test_join_v3_style_without_member_id_joins_directly():
    h = await started()
    fut = join(h.coord, require_known=False)
    h.clock.advance(300)
    h.coord.fire_timers()
    res = await fut
    assert res.error == KafkaError.NONE and res.generation == 1 and res.member_id


@async_test
async def test_two_members_leader_gets_metadata_and_sync_distributes_assignment():
    h = await started()
    a, fa = await new_member(h, protocols=[("roundrobin", b"A1"), ("range", b"A2")])
    b, fb = await new_member(h, protocols=[("range", b"B2")])
    complete_initial(h)
    ra, rb_ = await fa, await fb
    assert ra.generation == rb_.generation == 1
    assert ra.leader == rb_.leader == a
    assert ra.protocol_name == "range"            # the only protocol both support
    assert sorted(ra.members) == sorted([(a, None, b"A2"), (b, None, b"B2")])
    assert rb_.members == []                      # followers learn nothing of the others
    follower_sync = h.coord.sync_group("g", 1, b)
    await asyncio.sleep(0)
    assert not follower_sync.done()               # waits for the leader
    leader_sync = h.coord.sync_group("g", 1, a, assignments={a: b"to-a", b: b"to-b"})
    assert not leader_sync.done()                 # waits for the fsync
    await settle(h.coord)
    assert (await leader_sync).assignment == b"to-a"
    assert (await follower_sync).assignment == b"to-b"
    assert state(h) is GroupState.STABLE
    assert h.flusher.calls >= 1
    late = await h.coord.sync_group("g", 1, b)    # a retried sync in Stable: same answer
    assert late.assignment == b"to-b"


@async_test
async def test_protocol_selection_takes_the_most_preferred_common_protocol():
    h = await started()
    _, f1 = await new_member(h, protocols=[("sticky", b""), ("range", b""), ("rr", b"")])
    _, f2 = await new_member(h, protocols=[("rr", b""), ("sticky", b"")])
    _, f3 = await new_member(h, protocols=[("sticky", b""), ("rr", b"")])
    complete_initial(h)
    assert {(await f).protocol_name for f in (f1, f2, f3)} == {"sticky"}


@async_test
async def test_inconsistent_protocols_are_refused():
    h = await started()
    await stable_group(h, n=1)
    res = await join(h.coord, protocols=[("other", b"")])
    assert res.error == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    res = await join(h.coord, ptype="connect")
    assert res.error == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    res = await join(h.coord, group="fresh", protocols=[])
    assert res.error == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    assert "fresh" not in h.coord.store.groups


@async_test
async def test_session_timeout_bounds():
    h = await started(min_session_timeout_ms=6000, max_session_timeout_ms=1_800_000)
    assert (await join(h.coord, session=5999)).error == KafkaError.INVALID_SESSION_TIMEOUT
    assert (await join(h.coord, session=1_800_001)).error == KafkaError.INVALID_SESSION_TIMEOUT
    assert (await join(h.coord, session=6000)).error == KafkaError.MEMBER_ID_REQUIRED


@async_test
async def test_empty_group_id_is_invalid_for_membership_apis():
    h = await started()
    assert (await join(h.coord, group="")).error == KafkaError.INVALID_GROUP_ID
    assert h.coord.heartbeat("", 1, "m") == KafkaError.INVALID_GROUP_ID
    assert (await h.coord.sync_group("", 1, "m")).error == KafkaError.INVALID_GROUP_ID
    assert h.coord.leave_group("", [("m", None)])[0] == KafkaError.INVALID_GROUP_ID


@async_test
async def test_heartbeat_errors_and_rebalance_signal():
    h = await started()
    a, b = await stable_group(h)
    assert h.coord.heartbeat("g", 1, a.member_id) == KafkaError.NONE
    assert h.coord.heartbeat("g", 0, a.member_id) == KafkaError.ILLEGAL_GENERATION
    assert h.coord.heartbeat("g", 1, "nobody") == KafkaError.UNKNOWN_MEMBER_ID
    assert h.coord.heartbeat("nogroup", 1, a.member_id) == KafkaError.UNKNOWN_MEMBER_ID
    _, fc = await new_member(h)                  # a third member triggers a rebalance
    assert state(h) is GroupState.PREPARING_REBALANCE
    assert h.coord.heartbeat("g", 1, a.member_id) == KafkaError.REBALANCE_IN_PROGRESS
    assert not fc.done()


@async_test
async def test_join_of_a_new_member_rebalances_and_completes_when_all_rejoined():
    h = await started()
    a, b = await stable_group(h)
    c_id, fc = await new_member(h)
    fa = join(h.coord, a.member_id, protocols=[("range", b"m0")])
    await asyncio.sleep(0)
    assert not fa.done()
    fb = join(h.coord, b.member_id, protocols=[("range", b"m1")])
    # everyone is in: no timer needed for a rebalance of a non-empty group
    ra, rb_, rc = await fa, await fb, await fc
    assert ra.generation == rb_.generation == rc.generation == 2
    assert len(ra.members) == 3 and rb_.members == [] and rc.members == []
    assert state(h) is GroupState.COMPLETING_REBALANCE
    # an old-generation commit or sync is refused
    assert (await h.coord.sync_group("g", 1, b.member_id)).error == KafkaError.ILLEGAL_GENERATION


@async_test
async def test_unchanged_follower_rejoin_in_stable_does_not_rebalance():
    h = await started()
    a, b = await stable_group(h)
    res = await join(h.coord, b.member_id, protocols=[("range", b"m1")])
    assert res.error == KafkaError.NONE and res.generation == 1 and res.members == []
    assert state(h) is GroupState.STABLE
    changed = join(h.coord, b.member_id, protocols=[("range", b"new")])
    assert state(h) is GroupState.PREPARING_REBALANCE
    assert not changed.done()


@async_test
async def test_session_expiry_removes_member_and_rebalances():
    h = await started()
    a, b = await stable_group(h, session=10_000)
    for _ in range(3):                            # a keeps heartbeating, b went silent
        h.clock.advance(4000)
        assert h.coord.heartbeat("g", 1, a.member_id) in (KafkaError.NONE, KafkaError.REBALANCE_IN_PROGRESS)
        h.coord.fire_timers()
    assert b.member_id not in h.coord.store.groups["g"].members
    assert state(h) is GroupState.PREPARING_REBALANCE
    ra = await join(h.coord, a.member_id, protocols=[("range", b"m0")])
    assert ra.generation == 2 and [m[0] for m in ra.members] == [a.member_id]


@async_test
async def test_rebalance_timeout_drops_members_that_did_not_rejoin():
    h = await started()
    a, b = await stable_group(h, rebalance=20_000, session=15_000)
    _, fc = await new_member(h, rebalance=20_000, session=15_000)
    fa = join(h.coord, a.member_id, protocols=[("range", b"m0")], rebalance=20_000, session=15_000)
    for _ in range(4):                            # b heartbeats but never rejoins
        h.clock.advance(5000)
        assert h.coord.heartbeat("g", 1, b.member_id) == KafkaError.REBALANCE_IN_PROGRESS
        h.coord.fire_timers()
    ra, rc = await fa, await fc
    assert ra.generation == 2
    assert {m[0] for m in ra.members} == {a.member_id, rc.member_id}
    assert h.coord.heartbeat("g", 2, b.member_id) == KafkaError.UNKNOWN_MEMBER_ID


@async_test
async def test_a_join_whose_client_went_away_no_longer_holds_the_barrier():
    """A JoinGroup cancelled mid-wait (its connection closed) stops counting as joined:
    the join phase then waits for the rebalance timeout, which drops that member."""
    h = await started()
    a, b = await stable_group(h, rebalance=20_000)
    fb = join(h.coord, b.member_id, protocols=[("range", b"new")], rebalance=20_000)   # rebalances
    assert h.coord.store.groups["g"].members[b.member_id].awaiting_join
    fb.cancel()
    await asyncio.sleep(0)
    assert not h.coord.store.groups["g"].members[b.member_id].awaiting_join
    fa = join(h.coord, a.member_id, protocols=[("range", b"m0")], rebalance=20_000)
    await asyncio.sleep(0)
    assert not fa.done()                          # b no longer counts: a waits
    h.clock.advance(20_000)
    h.coord.fire_timers()
    ra = await fa
    assert ra.generation == 2 and [m[0] for m in ra.members] == [a.member_id]


@async_test
async def test_initial_delay_is_extended_by_new_members_up_to_the_rebalance_timeout():
    h = await started(initial_rebalance_delay_ms=300)
    _, fa = await new_member(h, rebalance=1000)
    h.clock.advance(200)
    _, fb = await new_member(h, rebalance=1000)
    h.clock.advance(100)
    h.coord.fire_timers()                         # 300 ms: b arrived meanwhile -> wait more
    assert not fa.done()
    h.clock.advance(300)
    h.coord.fire_timers()                         # 600 ms: nobody new -> complete
    assert (await fa).generation == (await fb).generation == 1
    assert len((await fa).members) == 2


@async_test
async def test_leave_group_batch_and_last_member_leaving_empties_the_group():
    h = await started()
    a, b = await stable_group(h)
    err, per = h.coord.leave_group("g", [(b.member_id, None), ("ghost", None)])
    assert err == KafkaError.NONE and per == [KafkaError.NONE, KafkaError.UNKNOWN_MEMBER_ID]
    assert state(h) is GroupState.PREPARING_REBALANCE
    err, per = h.coord.leave_group("g", [(a.member_id, None)])
    assert per == [KafkaError.NONE]
    assert state(h) is GroupState.EMPTY
    group = h.coord.store.groups["g"]
    assert group.generation == 2 and not group.members
    await settle(h.coord)
    assert group.persisted                        # the empty snapshot was written
    err, per = h.coord.leave_group("missing", [("x", None)])
    assert err == KafkaError.NONE and per == [KafkaError.UNKNOWN_MEMBER_ID]


@async_test
async def test_leader_leaving_during_completing_rebalance_resets_waiting_syncs():
    h = await started()
    a, b = await stable_group(h)
    fa = join(h.coord, a.member_id, protocols=[("range", b"changed")])
    fb = join(h.coord, b.member_id, protocols=[("range", b"m1")])
    ra, rb_ = await fa, await fb
    assert state(h) is GroupState.COMPLETING_REBALANCE
    waiting = h.coord.sync_group("g", rb_.generation, b.member_id)
    h.coord.leave_group("g", [(ra.leader, None)])
    assert (await waiting).error == KafkaError.REBALANCE_IN_PROGRESS
    assert h.coord.store.groups["g"].leader == b.member_id


@async_test
async def test_assignment_store_failure_answers_error_and_rebalances():
    h = await started()
    _, fa = await new_member(h)
    h.clock.advance(300)
    h.coord.fire_timers()
    ra = await fa
    h.log.fail_appends = 1
    res = await h.coord.sync_group("g", 1, ra.member_id, assignments={ra.member_id: b"x"})
    assert res.error == KafkaError.COORDINATOR_NOT_AVAILABLE
    group = h.coord.store.groups["g"]
    assert group.members[ra.member_id].assignment == b""
    assert group.state is GroupState.PREPARING_REBALANCE
    assert h.log.log_end_offset == 0


@async_test
async def test_assignment_fsync_failure_answers_error_and_leaves_assignment_unset():
    h = await started()
    _, fa = await new_member(h)
    h.clock.advance(300)
    h.coord.fire_timers()
    ra = await fa
    h.flusher.fail_next = 1
    res = await h.coord.sync_group("g", 1, ra.member_id, assignments={ra.member_id: b"x"})
    assert res.error == KafkaError.COORDINATOR_NOT_AVAILABLE
    assert h.coord.store.groups["g"].members[ra.member_id].assignment == b""
    assert state(h) is GroupState.PREPARING_REBALANCE


@async_test
async def test_member_that_never_syncs_is_removed_after_the_rebalance_timeout():
    h = await started()
    _, fa = await new_member(h, rebalance=5000)
    _, fb = await new_member(h, rebalance=5000)
    complete_initial(h)
    ra, rb_ = await fa, await fb
    leader, follower = (ra, rb_) if ra.member_id == ra.leader else (rb_, ra)
    s = h.coord.sync_group("g", 1, leader.member_id, assignments={})
    await settle(h.coord)
    assert (await s).error == KafkaError.NONE
    h.clock.advance(5000)
    h.coord.heartbeat("g", 1, leader.member_id)
    h.coord.fire_timers()
    assert follower.member_id not in h.coord.store.groups["g"].members
    assert state(h) is GroupState.PREPARING_REBALANCE


@async_test
async def test_static_member_replaced_without_rebalance_and_old_instance_fenced():
    h = await started()
    fa = join(h.coord, instance="i-a", protocols=[("range", b"a")])   # no MEMBER_ID_REQUIRED
    fb = join(h.coord, instance="i-b", protocols=[("range", b"b")])
    complete_initial(h)
    ra, rb_ = await fa, await fb
    assert ra.error == rb_.error == KafkaError.NONE
    follower = rb_ if ra.member_id == ra.leader else ra
    inst = "i-b" if follower is rb_ else "i-a"
    s = h.coord.sync_group("g", 1, ra.leader, assignments={follower.member_id: b"part-1"})
    await settle(h.coord)
    await s
    again = await join(h.coord, instance=inst, protocols=[("range", b"b" if inst == "i-b" else b"a")])
    assert again.error == KafkaError.NONE and again.generation == 1
    assert again.member_id != follower.member_id
    assert state(h) is GroupState.STABLE
    assert h.coord.heartbeat("g", 1, follower.member_id, inst) == KafkaError.FENCED_INSTANCE_ID
    fenced = await h.coord.sync_group("g", 1, follower.member_id, group_instance_id=inst)
    assert fenced.error == KafkaError.FENCED_INSTANCE_ID   # the one member rule, as Heartbeat's
    assert (await h.coord.sync_group("g", 1, again.member_id, group_instance_id=inst)).assignment == b"part-1"
    err, per = h.coord.leave_group("g", [("", inst)])
    assert per == [KafkaError.NONE] and state(h) is GroupState.PREPARING_REBALANCE


@async_test
async def test_describe_and_list_groups():
    h = await started()
    a, b = await stable_group(h)
    await new_member(h, group="other")
    [desc, missing] = h.coord.describe_groups(["g", "nope"])
    assert desc.state == "Stable" and desc.protocol == "range" and desc.protocol_type == "consumer"
    assert {m.member_id for m in desc.members} == {a.member_id, b.member_id}
    assert {m.assignment for m in desc.members} == {a.member_id.encode(), b.member_id.encode()}
    assert all(m.client_host == "/127.0.0.1" and m.client_id == "client" for m in desc.members)
    assert missing.state == "Dead" and missing.error == KafkaError.NONE and missing.members == []
    err, rows = h.coord.list_groups()
    assert err == KafkaError.NONE and ("g", "consumer", "Stable") in rows
    assert [r[0] for r in h.coord.list_groups(["stable"])[1]] == ["g"]
    assert "g" not in [r[0] for r in h.coord.list_groups(["Empty", "PreparingRebalance"])[1]]


@async_test
async def test_delete_groups():
    h = await started()
    await stable_group(h)
    await h.coord.commit_offsets("solo", -1, "", {("t", 0): (5, -1, "")})
    res = await h.coord.delete_groups(["g", "solo", "unknown"])
    assert res == {"g": KafkaError.NON_EMPTY_GROUP, "solo": KafkaError.NONE,
                   "unknown": KafkaError.GROUP_ID_NOT_FOUND}
    assert "solo" not in h.coord.store.groups
    assert h.coord.fetch_offsets("solo", [("t", 0)])[1][0].offset == -1
    # the deletion is in the log: a fresh coordinator does not resurrect the group
    h2 = await started(logs=h.logs)
    assert "solo" not in h2.coord.store.groups
    assert "g" in h2.coord.store.groups


@async_test
async def test_requests_while_loading_or_stopped():
    h = await started()
    h.coord.runtime.status = Status.LOADING
    assert h.coord.heartbeat("g", 1, "m") == KafkaError.COORDINATOR_LOAD_IN_PROGRESS
    assert (await join(h.coord)).error == KafkaError.COORDINATOR_LOAD_IN_PROGRESS
    h.coord.runtime.status = Status.ACTIVE
    _, fut = await new_member(h)
    await h.coord.stop()
    assert (await fut).error == KafkaError.NOT_COORDINATOR
    assert h.coord.heartbeat("g", 1, "m") == KafkaError.NOT_COORDINATOR


@async_test
async def test_membership_survives_a_restart_through_the_group_snapshot():
    h = await started()
    a, b = await stable_group(h)
    h2 = await started(logs=h.logs, clock=h.clock)
    group = h2.coord.store.groups["g"]
    assert group.state is GroupState.STABLE and group.generation == 1
    assert h2.coord.heartbeat("g", 1, a.member_id) == KafkaError.NONE
    assert (await h2.coord.sync_group("g", 1, b.member_id)).assignment == b.member_id.encode()
    # restored members that never come back expire like any other
    h.clock.advance(6000)
    assert h2.coord.heartbeat("g", 1, a.member_id) == KafkaError.NONE
    h.clock.advance(4001)
    h2.coord.fire_timers()
    assert b.member_id not in h2.coord.store.groups["g"].members
    assert h2.coord.store.groups["g"].state is GroupState.PREPARING_REBALANCE


@async_test
async def test_timer_task_fires_real_timeouts():
    """With the background timer task (real clock), a short initial delay completes
    the join by itself."""
    from test_group_support import GateFlusher, MemLogs
    coord = group_coordinator(MemLogs(), GateFlusher(), GroupConfig(initial_rebalance_delay_ms=20,
                                                                  min_session_timeout_ms=100))
    await start(coord)
    try:
        fut = join(coord, require_known=False)
        res = await asyncio.wait_for(fut, 10)
        assert res.error == KafkaError.NONE and res.generation == 1
    finally:
        await coord.stop()


def test_timers_replace_cancel_and_survive_a_failing_callback():
    from semel.coordinator.group import Timers
    from test_group_support import FakeClock
    clock = FakeClock(0)
    t = Timers(clock)
    fired = []
    t.set("a", 100, lambda: fired.append("a-old"))
    t.set("a", 300, lambda: fired.append("a"))         # replaces the first deadline
    t.set("b", 200, lambda: 1 / 0)                      # a broken callback
    t.set("c", 200, lambda: fired.append("c"))
    t.set("d", 50, lambda: fired.append("d"))
    t.cancel("d")
    for _ in range(500):                                # stale heap entries get compacted
        t.set("e", 1000, lambda: fired.append("e"))
    assert len(t._heap) < 200
    clock.advance(250)
    assert t.fire_due() == 2 and fired == ["c"]
    assert t.next_deadline() == 300
    clock.advance(1000)
    t.fire_due()
    assert fired == ["c", "a", "e"] and t.next_deadline() is None


@async_test
async def test_a_lone_member_may_change_protocol_type():
    h = await started()
    [a] = await stable_group(h, n=1)
    fut = join(h.coord, a.member_id, ptype="connect")
    res = await fut
    assert res.error == KafkaError.NONE and res.protocol_type == "connect" and res.generation == 2


@async_test
async def test_lone_leader_rejoin_completes_at_once_with_a_new_generation():
    h = await started()
    [a] = await stable_group(h, n=1)
    res = await join(h.coord, a.member_id, protocols=[("range", b"m0")])
    assert res.error == KafkaError.NONE and res.generation == 2 and res.leader == a.member_id
    assert state(h) is GroupState.COMPLETING_REBALANCE


@async_test
async def test_unencodable_names_get_an_error_answer_not_a_crash():
    h = await started()
    huge = "i" * 40_000                       # longer than a record string may be
    fut = join(h.coord, instance=huge)
    complete_initial(h)
    res = await fut
    assert res.error == KafkaError.NONE
    s = await h.coord.sync_group("g", 1, res.member_id, group_instance_id=huge, assignments={})
    assert s.error == KafkaError.INVALID_REQUEST
    out = await h.coord.commit_offsets("g2", -1, "", {("t" * 40_000, 0): (1, -1, "")})
    assert set(out.values()) == {KafkaError.INVALID_REQUEST}
    assert h.log.log_end_offset == 0
