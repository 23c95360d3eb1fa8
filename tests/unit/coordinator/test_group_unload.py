"""GroupCoordinator.unload / load / serve: what the cluster seat
(semel.cluster.coordinator_host) calls when this broker stops or starts leading
__consumer_offsets. Storage in memory, time a fake clock."""
import asyncio

from test_group_coordinator import join, stable_group
from test_group_support import async_test, settle, started

from semel.protocol.errors import KafkaError

E = KafkaError


@async_test
async def test_unload_answers_everything_waiting_and_load_rebuilds_from_the_log():
    h = await started()
    members = await stable_group(h, n=2)
    gen, (m0, m1) = members[0].generation, (members[0].member_id, members[1].member_id)
    done = h.coord.commit_offsets("g", gen, m0, {("t", 0): (5, -1, "")})
    await settle(h.coord)
    assert (await done) == {("t", 0): E.NONE}
    rejoin = join(h.coord, m0)                          # a rebalance waiting for the other member
    h.flusher.hold = True
    waiting = h.coord.commit_offsets("solo", -1, "", {("t", 1): (7, -1, "")})   # its fsync held
    await settle_loop()
    assert not rejoin.done() and not waiting.done()

    h.coord.unload()
    assert (await rejoin).error == E.NOT_COORDINATOR
    assert (await waiting) == {("t", 1): E.NOT_COORDINATOR}
    assert h.coord.heartbeat("g", gen, m1, None) == E.NOT_COORDINATOR
    assert h.coord.fetch_offsets("g", None) == (E.NOT_COORDINATOR, [])
    assert h.coord.store.groups == {}
    # Every per-group deadline went with the groups; the periodic ones stay.
    assert {k for k in h.coord.timers._live} == {"expire-offsets", "compact"}
    end = h.log.log_end_offset
    h.flusher.release(0)
    await settle_loop()
    assert h.log.log_end_offset == end                 # nothing written for the dropped state

    h.flusher.hold = False
    h.coord.load(h.log, 4)
    assert h.coord.fetch_offsets("g", None)[0] == E.COORDINATOR_LOAD_IN_PROGRESS
    h.coord.serve(4)
    err, fetched = h.coord.fetch_offsets("g", [("t", 0)])
    assert err == E.NONE and [f.offset for f in fetched] == [5]
    # The snapshot written when the assignment was stored brings the members back.
    assert set(h.coord.store.groups["g"].members) == {m0, m1} and h.coord.store.groups["g"].generation == gen
    # The held commit reached the log before the unload: the log, not the answer, decides.
    assert [f.offset for f in h.coord.fetch_offsets("solo", [("t", 1)])[1]] == [7]
    assert h.coord.heartbeat("g", gen, m1, None) == E.NONE


async def settle_loop() -> None:
    for _ in range(5):
        await asyncio.sleep(0)
