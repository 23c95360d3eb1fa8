"""Online migration between the classic protocol and the consumer protocol in the group
coordinator (in-memory storage): a classic group with live members becomes a consumer
group when a member of the consumer protocol joins, its classic members keep working
through JoinGroup/SyncGroup/Heartbeat answered from the consumer group, offsets are
committed by both kinds, a replay finds the same group, and the group is classic again
when the last member of the consumer protocol leaves."""
import asyncio
import struct

from test_group_support import async_test, settle, started

from semel.coordinator.consumer_group_rules import Heartbeat
from semel.protocol.consumer_protocol import decode_assignment, encode_assignment
from semel.protocol.errors import KafkaError

TOPICS = {"t": 4}


def subscription(topics, owned=()) -> bytes:
    """ConsumerProtocolSubscription v1, as a classic consumer writes it."""
    out = struct.pack(">hi", 1, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    out += struct.pack(">i", -1)
    by_topic: dict[str, list[int]] = {}
    for t, p in owned:
        by_topic.setdefault(t, []).append(p)
    out += struct.pack(">i", len(by_topic))
    for t, ps in by_topic.items():
        out += struct.pack(">h", len(t)) + t.encode() + struct.pack(">i", len(ps))
        out += b"".join(struct.pack(">i", p) for p in ps)
    return out


async def classic_join(h, member_id="", owned=(), group="g"):
    fut = h.coord.join_group(group, member_id, protocol_type="consumer",
                             protocols=[("range", subscription(["t"], owned))], session_timeout_ms=10_000,
                             require_known_member_id=False, topics=lambda: TOPICS)
    await settle(h.coord)
    h.coord.fire_timers()
    return await asyncio.wait_for(fut, 5)


async def classic_sync(h, member_id, generation, assignments=None, group="g"):
    fut = h.coord.sync_group(group, generation, member_id, assignments=assignments or {})
    await settle(h.coord)
    return await asyncio.wait_for(fut, 5)


async def stable_classic_group(h):
    """Two classic members holding two partitions each (the leader's assignment)."""
    a = h.coord.join_group("g", "", protocol_type="consumer", protocols=[("range", subscription(["t"]))],
                           session_timeout_ms=10_000, require_known_member_id=False, topics=lambda: TOPICS)
    b = h.coord.join_group("g", "", protocol_type="consumer", protocols=[("range", subscription(["t"]))],
                           session_timeout_ms=10_000, require_known_member_id=False, topics=lambda: TOPICS)
    await settle(h.coord)
    h.coord.fire_timers()
    a, b = await asyncio.wait_for(asyncio.gather(a, b), 5)
    leader = a if a.leader == a.member_id else b
    plan = {a.member_id: encode_assignment([("t", 0), ("t", 1)]),
            b.member_id: encode_assignment([("t", 2), ("t", 3)])}
    sa = h.coord.sync_group("g", a.generation, a.member_id, assignments=plan if leader is a else {})
    sb = h.coord.sync_group("g", b.generation, b.member_id, assignments=plan if leader is b else {})
    await settle(h.coord)
    sa, sb = await asyncio.wait_for(asyncio.gather(sa, sb), 5)
    assert sa.error == sb.error == KafkaError.NONE
    return a, b


async def upgraded_and_a_rejoined():
    """A classic group upgraded by member c; classic member a rejoined (eagerly) and synced."""
    h = await started(initial_rebalance_delay_ms=0)
    a, b = await stable_classic_group(h)
    c = await h.coord.consumers.consumer_group_heartbeat("g", Heartbeat("c", 0, topics=("t",), owned=frozenset()), TOPICS)
    await settle(h.coord)
    ra = await classic_join(h, a.member_id)
    held = decode_assignment((await classic_sync(h, a.member_id, ra.generation)).assignment)
    return h, a, b, c, ra, held


def owners(h, group="g"):
    """partition -> members holding it (assigned or still revoking) in the consumer group."""
    g = h.coord.store.consumer_groups[group]
    out: dict = {}
    for mid, cur in g.current.items():
        for tp in cur.assigned | cur.revoking:
            out.setdefault(tp, []).append(mid)
    return out


@async_test
async def test_a_classic_group_is_upgraded_and_its_classic_members_keep_working():
    h = await started(initial_rebalance_delay_ms=0)
    a, b = await stable_classic_group(h)
    assert (await h.coord.commit_offsets("g", a.generation, a.member_id, {("t", 0): (3, -1, "")}))[("t", 0)] == 0

    c = await h.coord.consumers.consumer_group_heartbeat("g", Heartbeat("c", 0, topics=("t",), owned=frozenset()), TOPICS)
    assert c.error == KafkaError.NONE and c.assignment == frozenset()   # all four still held by a and b
    await settle(h.coord)
    assert h.coord.group_type("g") == "consumer"
    assert h.coord.describe_groups(["g"])[0].error == KafkaError.GROUP_ID_NOT_FOUND
    assert all(len(ms) == 1 for ms in owners(h).values()) and len(owners(h)) == 4

    # The classic members hear of the rebalance on their heartbeat, rejoin (eager: owning
    # nothing) and get what the server's assignor gives them.
    assert h.coord.heartbeat("g", a.generation, a.member_id) == KafkaError.REBALANCE_IN_PROGRESS
    assert (await h.coord.commit_offsets("g", a.generation, a.member_id, {("t", 0): (4, -1, "")}))[("t", 0)] == 0
    ra = await classic_join(h, a.member_id)
    assert ra.error == KafkaError.NONE and ra.leader != ra.member_id and ra.generation > a.generation
    sa = await classic_sync(h, a.member_id, ra.generation)
    got_a = decode_assignment(sa.assignment)
    rb = await classic_join(h, b.member_id)
    got_b = decode_assignment((await classic_sync(h, b.member_id, rb.generation)).assignment)
    assert all(len(ms) == 1 for ms in owners(h).values())
    assert not got_a & got_b
    assert await h.coord.commit_offsets("g", ra.generation - 1, a.member_id, {("t", 0): (5, -1, "")}) == {
        ("t", 0): KafkaError.ILLEGAL_GENERATION}

    # c now gets the partitions the classic members released.
    c2 = await h.coord.consumers.consumer_group_heartbeat(
        "g", Heartbeat("c", c.member_epoch, owned=frozenset()), TOPICS)
    assert c2.assignment and not c2.assignment & (got_a | got_b)
    assert len(got_a) + len(got_b) + len(c2.assignment) == 4
    assert (await h.coord.commit_offsets("g", c2.member_epoch, "c", {("t", 1): (7, -1, "")},
                                         api_version=9))[("t", 1)] == 0
    assert h.coord.heartbeat("g", ra.generation, a.member_id) == KafkaError.NONE

    # A replay finds the consumer group with its classic members.
    replayed = await started(logs=h.logs)
    g = replayed.coord.store.consumer_groups["g"]
    assert set(g.members) == {a.member_id, b.member_id, "c"}
    assert g.members[a.member_id].classic is not None and g.members["c"].classic is None
    assert replayed.coord.group_type("g") == "consumer"

    # The last member of the consumer protocol leaves: classic again, rebalancing.
    left = await h.coord.consumers.consumer_group_heartbeat("g", Heartbeat("c", -1), TOPICS)
    assert left.member_epoch == -1
    await settle(h.coord)
    assert h.coord.group_type("g") == "classic" and "g" not in h.coord.store.consumer_groups
    assert h.coord.describe_groups(["g"])[0].state == "PreparingRebalance"
    assert h.coord.heartbeat("g", ra.generation, a.member_id) == KafkaError.REBALANCE_IN_PROGRESS
    again = await asyncio.gather(classic_join(h, a.member_id), classic_join(h, b.member_id))
    assert [r.error for r in again] == [KafkaError.NONE] * 2
    assert h.coord.describe_groups(["g"])[0].state == "CompletingRebalance"
    assert h.coord.fetch_offsets("g", [("t", 0), ("t", 1)])[1][0].offset == 4
    assert h.coord.fetch_offsets("g", [("t", 1)])[1][0].offset == 7
    replayed = await started(logs=h.logs)
    assert "g" not in replayed.coord.store.consumer_groups and replayed.coord.group_type("g") == "classic"


@async_test
async def test_the_migration_policy_decides():
    h = await started(initial_rebalance_delay_ms=0, consumer_migration_policy="downgrade")
    await stable_classic_group(h)
    refused = await h.coord.consumers.consumer_group_heartbeat("g", Heartbeat("c", 0, topics=("t",), owned=frozenset()),
                                                     TOPICS)
    assert refused.error == KafkaError.GROUP_ID_NOT_FOUND and "disabled" in refused.message
    assert h.coord.group_type("g") == "classic"

    h = await started(initial_rebalance_delay_ms=0, consumer_migration_policy="upgrade")
    a, b = await stable_classic_group(h)
    await h.coord.consumers.consumer_group_heartbeat("g", Heartbeat("c", 0, topics=("t",), owned=frozenset()), TOPICS)
    await settle(h.coord)
    await h.coord.consumers.consumer_group_heartbeat("g", Heartbeat("c", -1), TOPICS)
    await settle(h.coord)
    assert h.coord.group_type("g") == "consumer"     # no downgrade under `upgrade`
    assert set(h.coord.store.consumer_groups["g"].members) == {a.member_id, b.member_id}


@async_test
async def test_a_cooperative_classic_member_gives_partitions_up_before_another_gets_them():
    h = await started(initial_rebalance_delay_ms=0)
    a, b = await stable_classic_group(h)
    held_a = {("t", 0), ("t", 1)}
    c = await h.coord.consumers.consumer_group_heartbeat("g", Heartbeat("c", 0, topics=("t",), owned=frozenset()), TOPICS)
    await settle(h.coord)
    # a rejoins still owning its two partitions (cooperative): it keeps what the target leaves it.
    ra = await classic_join(h, a.member_id, owned=held_a)
    kept = decode_assignment((await classic_sync(h, a.member_id, ra.generation)).assignment)
    assert kept <= held_a
    cur = h.coord.store.consumer_groups["g"].current[a.member_id]
    assert cur.revoking == held_a - kept
    if cur.revoking:
        assert h.coord.heartbeat("g", ra.generation, a.member_id) == KafkaError.REBALANCE_IN_PROGRESS
        c2 = await h.coord.consumers.consumer_group_heartbeat("g", Heartbeat("c", c.member_epoch, owned=frozenset()), TOPICS)
        assert not (c2.assignment or frozenset()) & cur.revoking      # not before a lets go
    await classic_join(h, a.member_id, owned=kept)
    assert h.coord.store.consumer_groups["g"].current[a.member_id].revoking == frozenset()
    assert all(len(ms) == 1 for ms in owners(h).values())


@async_test
async def test_a_classic_member_that_never_rejoins_is_fenced_after_its_rebalance_timeout():
    h, a, b, c, ra, _ = await upgraded_and_a_rejoined()
    # b is told to rejoin and keeps heartbeating (within its session) without ever rejoining.
    for _ in range(4):
        assert h.coord.heartbeat("g", b.generation, b.member_id) == KafkaError.REBALANCE_IN_PROGRESS
        h.coord.heartbeat("g", ra.generation, a.member_id)
        h.clock.advance(2_000)
        h.coord.fire_timers()
        await settle(h.coord)
    assert b.member_id in h.coord.store.consumer_groups["g"].members     # 8 s: within its 10 s
    h.coord.heartbeat("g", ra.generation, a.member_id)
    h.clock.advance(2_500)
    h.coord.fire_timers()
    await settle(h.coord)
    g = h.coord.store.consumer_groups["g"]
    assert set(g.members) == {a.member_id, "c"}
    c2 = await h.coord.consumers.consumer_group_heartbeat("g", Heartbeat("c", c.member_epoch, owned=frozenset()), TOPICS)
    assert c2.assignment and all(len(ms) == 1 for ms in owners(h).values())


@async_test
async def test_an_eager_classic_member_rejoining_on_its_own_gets_its_partitions_back():
    h, a, b, c, ra, held = await upgraded_and_a_rejoined()
    assert held and h.coord.heartbeat("g", ra.generation, a.member_id) == KafkaError.NONE
    # Nothing asked it to, yet it rejoins having revoked everything (as an eager client does
    # after a metadata change): it is given its target again, not left with nothing.
    again = await classic_join(h, a.member_id)
    assert decode_assignment((await classic_sync(h, a.member_id, again.generation)).assignment) == held
    assert c.error == KafkaError.NONE


@async_test
async def test_a_static_classic_member_restarting_takes_its_predecessors_place():
    h = await started(initial_rebalance_delay_ms=0)
    a, b = await stable_classic_group(h)
    await h.coord.consumers.consumer_group_heartbeat("g", Heartbeat("c", 0, topics=("t",), owned=frozenset()), TOPICS)
    await settle(h.coord)
    fut = h.coord.join_group("g", "", protocol_type="consumer", protocols=[("range", subscription(["t"]))],
                             session_timeout_ms=10_000, group_instance_id="i-1", require_known_member_id=False,
                             topics=lambda: TOPICS)
    await settle(h.coord)
    first = await asyncio.wait_for(fut, 5)
    held = decode_assignment((await classic_sync(h, first.member_id, first.generation)).assignment)
    epoch = h.coord.store.consumer_groups["g"].epoch
    fut = h.coord.join_group("g", "", protocol_type="consumer", protocols=[("range", subscription(["t"]))],
                             session_timeout_ms=10_000, group_instance_id="i-1", require_known_member_id=False,
                             topics=lambda: TOPICS)
    await settle(h.coord)
    second = await asyncio.wait_for(fut, 5)
    g = h.coord.store.consumer_groups["g"]
    assert second.member_id != first.member_id and first.member_id not in g.members
    assert g.epoch == epoch                                   # no rebalance for the others
    assert decode_assignment((await classic_sync(h, second.member_id, second.generation)).assignment) == held
    assert h.coord.heartbeat("g", first.generation, first.member_id) == KafkaError.UNKNOWN_MEMBER_ID
