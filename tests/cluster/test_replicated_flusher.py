"""ReplicatedFlusher: a coordinator record counts as durable only once fsynced and past
the high watermark of its replicated partition; anything else is an AppendError, and a
CoordinatorLog then does not answer the write as done."""
from __future__ import annotations

import asyncio

import pytest

from semel.cluster.replicated_flusher import ReplicatedFlusher
from semel.coordinator.coordinator_log import CoordinatorLog
from semel.protocol.errors import KafkaError as E
from semel.storage.errors import AppendError


class Log:
    def __init__(self, end: int):
        self.log_end_offset = end


class Inner:
    def __init__(self):
        self.calls = []

    async def sync(self, plog, upto):
        self.calls.append(upto)


class Replicas:
    """wait_for_hw answers once the test moves the high watermark or fails the wait."""
    def __init__(self):
        self.hw, self.error, self.asked = 0, None, []

    async def wait_for_hw(self, topic, partition, upto, timeout_s):
        self.asked.append((topic, partition, upto))
        while self.hw < upto and self.error is None:
            await asyncio.sleep(0)
        return self.error or E.NONE


def test_fsync_then_high_watermark():
    async def go():
        inner, replicas = Inner(), Replicas()
        f = ReplicatedFlusher(inner, lambda: replicas, "__transaction_state", 0, 5.0)
        task = asyncio.ensure_future(f.sync(Log(10), 12))      # capped at the log end
        for _ in range(5):
            await asyncio.sleep(0)
        assert inner.calls == [12] and replicas.asked == [("__transaction_state", 0, 10)] and not task.done()
        replicas.hw = 10
        await task
    asyncio.run(go())


@pytest.mark.parametrize("error", [E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                                   E.REQUEST_TIMED_OUT])
def test_not_replicated_is_an_append_error(error):
    async def go():
        replicas = Replicas()
        replicas.error = error
        f = ReplicatedFlusher(Inner(), lambda: replicas, "__consumer_offsets", 0, 5.0)
        with pytest.raises(AppendError) as info:
            await f.sync(Log(3), 3)
        assert info.value.error == error
    asyncio.run(go())


def test_no_replication_running_is_not_coordinator():
    async def go():
        with pytest.raises(AppendError) as info:
            await ReplicatedFlusher(None, lambda: None, "__consumer_offsets", 0, 5.0).sync(Log(1), 1)
        assert info.value.error == E.NOT_COORDINATOR
    asyncio.run(go())


class Info:
    def __init__(self, last):
        self.last_offset = last


def test_coordinator_log_applies_only_past_the_high_watermark():
    """Through an unchanged CoordinatorLog: writes are applied in log order once the high
    watermark passes them; one whose wait fails gets `unsynced`, never `apply`."""
    async def go():
        replicas, tasks = Replicas(), []
        clog = CoordinatorLog("__transaction_state", ReplicatedFlusher(Inner(), lambda: replicas,
                                                                       "__transaction_state", 0, 5.0),
                              lambda coro: tasks.append(asyncio.ensure_future(coro)))
        clog.plog = Log(0)
        results = []

        def write(n):
            def append():
                clog.plog.log_end_offset = n + 1
                return Info(n)
            return clog.write(append, lambda info: results.append(("applied", info.last_offset)) or "ok",
                              lambda err: results.append(("failed", err)) or err)
        first, second = write(0), write(1)
        for _ in range(5):
            await asyncio.sleep(0)
        assert results == []
        replicas.hw = 1
        assert await first == "ok" and results == [("applied", 0)]
        replicas.error = E.NOT_LEADER_OR_FOLLOWER
        assert await second == E.COORDINATOR_NOT_AVAILABLE
        assert results == [("applied", 0), ("failed", E.COORDINATOR_NOT_AVAILABLE)]
        await asyncio.gather(*tasks)
    asyncio.run(go())
