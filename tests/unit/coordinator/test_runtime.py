"""The coordinator runtime on its own: status table, load by replay, the write path's
commit point and log order, unload, timers and periodic passes, driven with an
in-memory log and a writer the test releases by hand."""
import asyncio

import pytest
from hypothesis import given, strategies as st

from test_group_support import FakeClock, GateFlusher, MemLog, async_test

from semel.coordinator.runtime import ERRORS, CoordinatorRuntime, IllegalTransition, Status, TRANSITIONS
from semel.protocol import records as rb
from semel.protocol.errors import KafkaError


class Recorder:
    """A shard that remembers the batches replayed into it."""

    def __init__(self):
        self.keys: list[bytes] = []
        self.cleared = 0

    def clear(self):
        self.cleared += 1
        self.keys.clear()

    def replay(self, buf, pos, hdr):
        self.keys += [r.key for r in rb.iter_records(buf, pos)]


def runtime(writer=None, clock=None) -> tuple[CoordinatorRuntime, MemLog]:
    rt = CoordinatorRuntime("__test", writer, clock=clock, timer_clock=clock)
    plog = MemLog()
    rt.log.plog = plog
    return rt, plog


def put(rt: CoordinatorRuntime, key: bytes, applied: list[bytes]) -> "asyncio.Future":
    return rt.log.write(lambda: rt.log.append_records([(key, b"v")]),
                        lambda info: applied.append(key) or KafkaError.NONE, lambda err: err)


def test_each_status_answers_requests_with_its_error():
    rt, _ = runtime()
    assert rt.error() == KafkaError.COORDINATOR_NOT_AVAILABLE and not rt.serving()
    for status, error in ERRORS.items():
        rt.status = status
        assert rt.error() == error
        assert rt.serving() == (status is Status.ACTIVE)


@given(st.lists(st.sampled_from(["start", "load", "serve", "unload", "stop"]), max_size=30))
def test_status_follows_the_table_and_serves_only_after_a_load(events):
    rt, _ = runtime()
    loaded_since_unload = False
    for event in events:
        expected = TRANSITIONS.get((rt.status, event))
        if expected is None:
            with pytest.raises(IllegalTransition):
                rt.move(event)
            continue
        assert rt.move(event) is expected
        if event == "load":
            loaded_since_unload = True
        elif event in ("unload", "stop"):
            loaded_since_unload = False
        # Serving needs a load since the last unload or stop.
        assert not rt.serving() or loaded_since_unload


def test_load_clears_the_shard_and_replays_every_batch_in_log_order():
    rt, plog = runtime()
    for key in (b"a", b"b", b"c"):
        rt.log.append_records([(key, b"1")])
    rt.log.append_records([(b"d", b"1"), (b"e", None)])
    shard = Recorder()
    shard.keys.append(b"stale")
    assert rt.load(shard, plog, epoch=7) == 5
    assert shard.cleared == 1 and shard.keys == [b"a", b"b", b"c", b"d", b"e"]
    assert rt.status is Status.LOADING and rt.epoch == 7 and rt.log.records_since_compaction == 5
    rt.serve()
    assert rt.serving()


@async_test
async def test_a_write_applies_only_after_its_commit_point_and_in_log_order():
    writer = GateFlusher()
    writer.hold = True
    rt, _ = runtime(writer)
    applied: list[bytes] = []
    first, second = put(rt, b"1", applied), put(rt, b"2", applied)
    await asyncio.sleep(0)
    assert len(writer.waiting) == 2 and applied == []
    writer.release(1)                      # the later record commits first: nothing applies yet
    await asyncio.sleep(0.01)
    assert applied == [] and not second.done()
    writer.release(0)
    assert await first == KafkaError.NONE and await second == KafkaError.NONE
    assert applied == [b"1", b"2"]


@async_test
async def test_unload_answers_waiting_writes_and_cancels_the_shards_tasks():
    writer = GateFlusher()
    writer.hold = True
    rt, plog = runtime(writer)
    rt.move("start")
    rt.load(Recorder(), plog, None)
    rt.serve()
    applied: list[bytes] = []
    waiting = put(rt, b"1", applied)
    sleeper = rt.spawn(asyncio.sleep(60))
    await asyncio.sleep(0)
    rt.unload(cancel_tasks=True)
    assert await waiting == KafkaError.NOT_COORDINATOR and applied == []
    await asyncio.gather(sleeper, return_exceptions=True)
    assert sleeper.cancelled() and rt.error() == KafkaError.NOT_COORDINATOR


@async_test
async def test_timers_are_scheduled_operations_fired_by_the_clock_or_the_loop():
    clock = FakeClock(0)
    rt, _ = runtime(clock=clock)
    fired: list[str] = []
    rt.timers.set("expire", 100, lambda: fired.append("expire"))
    assert rt.fire_timers() == 0
    clock.advance(100)
    assert rt.fire_timers() == 1 and fired == ["expire"]

    real, _ = runtime()
    real.start(run_timers=True)
    real.timers.set("soon", 10, lambda: fired.append("soon"))
    for _ in range(200):
        if "soon" in fired:
            break
        await asyncio.sleep(0.01)
    await real.stop(cancel_tasks=True)
    assert "soon" in fired


@async_test
async def test_a_periodic_pass_runs_only_while_serving_and_survives_a_failure():
    rt, plog = runtime()
    rt.start(run_timers=False)
    passes: list[bool] = []

    async def job() -> None:
        passes.append(rt.serving())
        raise RuntimeError("one bad pass")

    rt.every(0.005, "job", job)
    await asyncio.sleep(0.05)
    assert passes == []                    # stopped: never runs
    rt.load(Recorder(), plog, None)
    rt.serve()
    await asyncio.sleep(0.05)
    assert len(passes) >= 2 and all(passes)  # failed passes do not stop the next
    await rt.stop(cancel_tasks=False)
    count = len(passes)
    await asyncio.sleep(0.03)
    assert len(passes) == count and rt.status is Status.STOPPED


@async_test
async def test_stop_waits_for_background_tasks_unless_told_to_cancel():
    rt, _ = runtime()
    rt.start(run_timers=False)
    done: list[int] = []

    async def work() -> None:
        await asyncio.sleep(0.01)
        done.append(1)

    rt.spawn(work())
    await rt.stop(cancel_tasks=False)
    assert done == [1] and not rt.tasks
