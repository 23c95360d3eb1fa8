"""A coordinator record left unanswered because its partition moved to another broker is
an expected hand-over (INFO); a failed disk or replication short of the ISR stays an ERROR."""
from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from semel.coordinator.coordinator_log import CoordinatorLog, sync_failure_level
from semel.protocol.errors import KafkaError
from semel.storage.errors import AppendError, StorageError


@pytest.mark.parametrize("error", [KafkaError.NOT_LEADER_OR_FOLLOWER, KafkaError.NOT_COORDINATOR,
                                   KafkaError.FENCED_LEADER_EPOCH])
def test_a_hand_over_is_info(error):
    assert sync_failure_level(AppendError(error, "moved")) == logging.INFO


@pytest.mark.parametrize("exc", [
    AppendError(KafkaError.NOT_ENOUGH_REPLICAS, "ISR below min.insync.replicas"),
    AppendError(KafkaError.REQUEST_TIMED_OUT, "not replicated in time"),
    StorageError("fsync: EIO"),
    RuntimeError("a bug"),
])
def test_anything_else_is_an_error(exc):
    assert sync_failure_level(exc) == logging.ERROR


class _FailingFlusher:
    def __init__(self, exc: Exception):
        self.exc = exc

    async def sync(self, plog, upto_offset: int, stamp: int | None = None) -> None:
        raise self.exc


def _write_through(exc: Exception) -> tuple[str, int]:
    """One record whose durability wait raises `exc`: what its `unsynced` callback
    returned and the level the log gave it for its own line."""
    seen = []

    async def main():
        tasks = []
        clog = CoordinatorLog("__transaction_state", _FailingFlusher(exc),
                              lambda coro: tasks.append(asyncio.ensure_future(coro)))
        clog.plog = SimpleNamespace()

        def unsynced(error):
            seen.append(clog.failure_level)
            return "unsynced"

        fut = clog.write(lambda: SimpleNamespace(last_offset=0, fsync_stamp=None), lambda info: "applied",
                         lambda error: "failed",
                         unsynced=unsynced)
        return await fut

    return asyncio.run(main()), seen[0]


def test_a_moved_partition_logs_no_error(caplog):
    caplog.set_level(logging.DEBUG, logger="semel.coordinator.log")
    result, level = _write_through(AppendError(KafkaError.NOT_LEADER_OR_FOLLOWER, "__transaction_state-0 moved"))
    assert result == "unsynced" and level == logging.INFO
    # Only the coordinator's own lines: a thread another test left behind may log meanwhile.
    assert [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("semel.coordinator")] == []
    assert any("moved to another broker" in r.getMessage() for r in caplog.records)


def test_a_failed_fsync_still_logs_an_error(caplog):
    caplog.set_level(logging.DEBUG, logger="semel.coordinator.log")
    result, level = _write_through(StorageError("fsync: EIO"))
    assert result == "unsynced" and level == logging.ERROR
    assert any(r.levelno == logging.ERROR and "fsync of __transaction_state failed" in r.getMessage()
               for r in caplog.records)
