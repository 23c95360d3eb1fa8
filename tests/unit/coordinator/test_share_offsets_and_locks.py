"""A share group's start offsets moved and forgotten through the share coordinator's
log (they come back by replay after a crash; refused while the group has members), and
acquisition locks released by the runtime's timer with no fetch in between."""
from __future__ import annotations

from test_group_support import async_test
from test_share_coordinator import Node

from semel.coordinator import share_offsets
from semel.coordinator.share_partition import ACQUIRED, AVAILABLE
from semel.protocol.errors import KafkaError


def _join(share, group="g", member="m"):
    answer = share.heartbeat(group, member, 0, ("t",), None, {"t": 2})
    assert answer.error == KafkaError.NONE


@async_test
async def test_alter_and_delete_are_written_through_the_log(tmp_path):
    node = await Node(tmp_path).start()
    share = node.share
    # A group id nobody used: altering makes it a share group with these start offsets.
    assert await share_offsets.alter_start_offsets(share, "g", {("t", 0): 7, ("t", 1): 3}) == KafkaError.NONE
    assert {tp: sp.start for tp, sp in share_offsets.start_offsets(share, "g").items()} == {("t", 0): 7, ("t", 1): 3}
    assert await share_offsets.delete_topics(share, "g", ["t"]) == KafkaError.NONE
    assert await share_offsets.alter_start_offsets(share, "g", {("t", 1): 5}) == KafkaError.NONE
    await node.crash()
    again = await Node(tmp_path).start()
    assert {tp: sp.start for tp, sp in share_offsets.start_offsets(again.share, "g").items()} == {("t", 1): 5}


@async_test
async def test_a_group_with_members_is_not_altered(tmp_path):
    node = await Node(tmp_path).start()
    share = node.share
    assert share_offsets.group_error(share, "g") == KafkaError.GROUP_ID_NOT_FOUND
    assert await share_offsets.delete_topics(share, "g", ["t"]) == KafkaError.GROUP_ID_NOT_FOUND
    _join(share)
    assert await share_offsets.alter_start_offsets(share, "g", {("t", 0): 1}) == KafkaError.NON_EMPTY_GROUP
    assert await share_offsets.delete_topics(share, "g", ["t"]) == KafkaError.NON_EMPTY_GROUP
    assert share_offsets.start_offsets(share, "g") == {}   # nothing changed


@async_test
async def test_lag_counts_what_is_not_finished(tmp_path):
    node = await Node(tmp_path).start()
    share = node.share
    sp = share.share_partition("g", "t", 0, lambda reset: 10)
    limits = share.state.limits("g")
    sp.acquire("m", 14, 4, node.clock(), limits)
    assert sp.acknowledge("m", 11, 11, [1], limits) == KafkaError.NONE
    assert share_offsets.lag(sp, 20) == 9   # 10..19, less the one accepted


@async_test
async def test_a_lock_that_runs_out_is_released_by_the_timer(tmp_path):
    node = await Node(tmp_path).start()
    share = node.share
    await share.alter_configs("g", {"share.record.lock.duration.ms": "1000"}, False)
    sp = share.share_partition("g", "t", 0, lambda reset: 0)
    limits = share.state.limits("g")
    sp.acquire("m", 3, 3, node.clock(), limits)
    share.locks.arm("g", [("t", 0)])
    node.clock.advance(500)
    sp.acquire("m", 5, 2, node.clock(), limits)   # later locks: the timer set stays
    share.locks.arm("g", [("t", 0)])
    node.clock.advance(499)
    assert share.runtime.fire_timers() == 0
    node.clock.advance(1)
    assert share.runtime.fire_timers() == 1
    assert {o: r.state for o, r in sp.records.items()} == {0: AVAILABLE, 1: AVAILABLE, 2: AVAILABLE,
                                                           3: ACQUIRED, 4: ACQUIRED}
    node.clock.advance(500)   # the timer set itself again for the later locks
    assert share.runtime.fire_timers() == 1
    assert all(r.state == AVAILABLE for r in sp.records.values())
    node.clock.advance(60_000)
    assert share.runtime.fire_timers() == 0   # nothing held: no timer left
    await share.runtime.idle()                # the release was written


@async_test
async def test_lock_timers_stop_when_the_coordinator_unloads(tmp_path):
    node = await Node(tmp_path).start()
    share = node.share
    sp = share.share_partition("g", "t", 0, lambda reset: 0)
    sp.acquire("m", 3, 3, node.clock(), share.state.limits("g"))
    share.locks.arm("g", [("t", 0)])
    share.unload()
    node.clock.advance(60_000)
    assert share.runtime.fire_timers() == 0
