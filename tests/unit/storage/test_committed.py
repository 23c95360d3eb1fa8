"""Committed: a record counts as committed only once fsynced and past the high watermark
of its partition; anything else is an AppendError (or an error value per partition), and
a CoordinatorLog then does not answer the write as done. On a single node (OneNode) the
high-watermark wait returns at once and an fsync wakes the readers."""
from __future__ import annotations

import asyncio

import pytest

from semel.coordinator.coordinator_log import CoordinatorLog
from semel.protocol.errors import KafkaError as E
from semel.storage.committed import Committed, OneNode
from semel.storage.errors import AppendError, StorageError


class Log:
    def __init__(self, end: int):
        self.log_end_offset = end


class Inner:
    def __init__(self, fail=()):
        self.calls, self.fail = [], fail

    async def sync(self, plog, upto, failures=None, stamp=None):
        self.calls.append(upto)
        if plog in self.fail:
            raise StorageError("fsync failed")

    async def sync_each(self, targets, begun=None, stamps=None):
        out = []
        for plog, upto in targets:
            try:
                await self.sync(plog, upto)
                out.append(None)
            except StorageError as exc:
                out.append(exc)
        return out


class Replicas:
    """wait_for_hw answers once the test moves the high watermark or fails the wait."""
    def __init__(self):
        self.hw, self.error, self.asked, self.flushes = 0, None, [], []

    def flushed(self, topic, partition):
        self.flushes.append((topic, partition))

    async def wait_for_hw(self, topic, partition, upto, timeout_s):
        self.asked.append((topic, partition, upto))
        while self.hw < upto and self.error is None:
            await asyncio.sleep(0)
        return self.error or E.NONE


def test_fsync_then_high_watermark():
    async def go():
        inner, replicas = Inner(), Replicas()
        f = Committed(inner, lambda: replicas, 5.0).writer("__transaction_state", 0)
        task = asyncio.ensure_future(f.sync(Log(10), 12))      # capped at the log end
        for _ in range(5):
            await asyncio.sleep(0)
        assert inner.calls == [12] and replicas.asked == [("__transaction_state", 0, 10)] and not task.done()
        assert replicas.flushes == [("__transaction_state", 0)]
        replicas.hw = 10
        await task
    asyncio.run(go())


@pytest.mark.parametrize("error", [E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                                   E.REQUEST_TIMED_OUT])
def test_not_replicated_is_an_append_error(error):
    async def go():
        replicas = Replicas()
        replicas.error = error
        f = Committed(Inner(), lambda: replicas, 5.0).writer("__consumer_offsets", 0)
        with pytest.raises(AppendError) as info:
            await f.sync(Log(3), 3)
        assert info.value.error == error
    asyncio.run(go())


def test_no_replication_running_is_not_coordinator():
    async def go():
        with pytest.raises(AppendError) as info:
            await Committed(None, lambda: None, 5.0, E.NOT_COORDINATOR).writer("__consumer_offsets", 0).sync(Log(1), 1)
        assert info.value.error == E.NOT_COORDINATOR
    asyncio.run(go())


class Info:
    def __init__(self, last):
        self.last_offset = last
        self.fsync_stamp = None   # a log never cut back


def test_coordinator_log_applies_only_past_the_high_watermark():
    """Through an unchanged CoordinatorLog: writes are applied in log order once the high
    watermark passes them; one whose wait fails gets `unsynced`, never `apply`."""
    async def go():
        replicas, tasks = Replicas(), []
        clog = CoordinatorLog("__transaction_state", Committed(Inner(), lambda: replicas, 5.0).writer(
                                  "__transaction_state", 0),
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


def test_one_node_commits_once_fsynced_and_wakes_readers():
    """A cluster of one: the high-watermark wait returns at once, each fsync notifies."""
    async def go():
        woken = []
        good, bad = Log(5), Log(5)
        inner = Inner(fail={bad})
        c = Committed(inner, lambda: OneNode(lambda t, p: woken.append((t, p))), 5.0)
        errors = await c.wait_each([("a", 0, good, 5, None), ("b", 1, bad, 5, None)])
        assert errors == [E.NONE, E.KAFKA_STORAGE_ERROR]
        assert inner.calls == [5, 5] and woken == [("a", 0)]
        await c.wait("a", 0, good, 5)
        with pytest.raises(StorageError):
            await c.wait("b", 1, bad, 5)
    asyncio.run(go())


def test_no_fsync_asked_for_waits_only_for_the_high_watermark():
    async def go():
        replicas = Replicas()
        replicas.hw = 4
        c = Committed(None, lambda: replicas, 5.0)
        assert await c.wait_each([("t", 0, Log(4), 4, None)]) == [E.NONE]
        assert replicas.flushes == [] and replicas.asked == [("t", 0, 4)]
    asyncio.run(go())


class Flushed(Log):
    def __init__(self, end: int, flushed: int):
        super().__init__(end)
        self.flushed_offset = flushed


def test_already_committed_needs_the_fsync_and_the_high_watermark():
    one = OneNode(lambda t, p: None)
    assert Committed(Inner(), lambda: one, 5.0).already([("t", 0, Flushed(5, 5), 5, None)])
    assert not Committed(Inner(), lambda: one, 5.0).already([("t", 0, Flushed(5, 4), 5, None)])
    assert Committed(None, lambda: one, 5.0).already([("t", 0, Flushed(5, 0), 5, None)])   # no fsync asked for
    assert not Committed(None, lambda: None, 5.0).already([("t", 0, Flushed(5, 5), 5, None)])

    class Behind(Replicas):
        def reached(self, topic, partition, upto):
            return False
    assert not Committed(Inner(), lambda: Behind(), 5.0).already([("t", 0, Flushed(5, 5), 5, None)])
