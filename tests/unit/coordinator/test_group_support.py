"""Test doubles for the group coordinator's storage seam (no tests here).

`MemLogs` / `MemLog` keep the promised LogManager / PartitionLog API in memory
(append with offsets assigned, read of whole batches, control markers with
producer-epoch fencing, injected append failures); `GateFlusher` lets a test
decide when (and whether) each fsync completes; `FakeClock` drives timeouts.
"""
from __future__ import annotations

import asyncio
import functools
from types import SimpleNamespace

from tests.support.coordinators import group_coordinator, start
from semel.coordinator.group import GroupConfig
from semel.storage.errors import ProducerStateError, StorageError
from semel.protocol import records as rb
from semel.protocol.errors import KafkaError


def async_test(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return wrapper


class FakeClock:
    def __init__(self, now: int = 1_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def _storage_error(msg: str) -> Exception:
    return StorageError(msg)


def _fenced() -> Exception:
    return ProducerStateError(KafkaError.INVALID_PRODUCER_EPOCH, "fenced")


class _NeverCut:
    """A FsyncRepair of a log that never cuts its tail back (storage/fsync_repair.py)."""
    trusted = True

    def lost(self, stamp, upto) -> bool:
        return False


class MemLog:
    def __init__(self):
        self.batches: list[tuple[int, bytes]] = []   # (base offset, bytes)
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.fail_appends = 0
        self.epochs: dict[int, int] = {}
        self.fsync_repair = _NeverCut()

    def _check_epoch(self, producer_id: int, epoch: int) -> None:
        if producer_id < 0:
            return
        if epoch < self.epochs.get(producer_id, -1):
            raise _fenced()

    def _store(self, data: bytes, batches) -> SimpleNamespace:
        if self.fail_appends:
            self.fail_appends -= 1
            raise _storage_error("injected append failure")
        for _, hdr in batches:
            self._check_epoch(hdr.producer_id, hdr.producer_epoch)
        buf = bytearray(data)
        first = self.log_end_offset
        for pos, hdr in batches:
            rb.set_base_offset(buf, pos, self.log_end_offset)
            size = hdr.size
            self.batches.append((self.log_end_offset, bytes(buf[pos:pos + size])))
            self.log_end_offset += hdr.last_offset_delta + 1
            if hdr.producer_id >= 0:
                self.epochs[hdr.producer_id] = hdr.producer_epoch
        return SimpleNamespace(first_offset=first, last_offset=self.log_end_offset - 1, fsync_stamp=None)

    def append(self, data: bytes, batches):
        return self._store(data, batches)

    def append_control(self, kind: int, producer_id: int, producer_epoch: int, coordinator_epoch: int):
        data = rb.build_control_batch(kind, producer_id=producer_id, producer_epoch=producer_epoch,
                                      coordinator_epoch=coordinator_epoch)
        return self._store(data, [(0, rb.parse_header(data))])

    def read(self, offset: int, max_bytes: int, upper_bound=None) -> bytes:
        out = bytearray()
        for base, raw in self.batches:
            hdr = rb.parse_header(raw)
            if hdr.last_offset < offset:
                continue
            if out and len(out) + len(raw) > max_bytes:
                break
            out += raw
        return bytes(out)

    # Memory does not decay: what read() returns is what was stored.
    read_checked = read

    def drop_tail(self, n: int) -> None:
        """Forget the last n batches (a write that never reached the disk)."""
        del self.batches[-n:]
        self.log_end_offset = rb.parse_header(self.batches[-1][1]).next_offset if self.batches else 0


class MemLogs:
    def __init__(self):
        self.logs: dict[tuple[str, int], MemLog] = {}
        self.created: list[tuple[str, dict, bool]] = []

    def get(self, topic: str, partition: int):
        return self.logs.get((topic, partition))

    def topics(self):
        return {t: 1 for t, _ in self.logs}

    def create_topic(self, name, partitions, config=None, internal=False):
        if any(t == name for t, _ in self.logs):
            return KafkaError.TOPIC_ALREADY_EXISTS
        self.created.append((name, dict(config or {}), internal))
        for p in range(partitions):
            self.logs[(name, p)] = MemLog()
        return KafkaError.NONE


class GateFlusher:
    """fsync stand-in. With `hold = True`, each sync waits for its own release."""

    def __init__(self):
        self.calls = 0
        self.fail_next = 0
        self.hold = False
        self.waiting: list[asyncio.Future] = []

    async def sync(self, log, upto_offset: int, stamp: int | None = None) -> None:
        self.calls += 1
        if self.hold:
            fut = asyncio.get_running_loop().create_future()
            self.waiting.append(fut)
            await fut
        if self.fail_next:
            self.fail_next -= 1
            raise _storage_error("injected fsync failure")

    def release(self, index: int) -> None:
        if not self.waiting[index].done():
            self.waiting[index].set_result(None)


def config(**overrides) -> GroupConfig:
    base = dict(initial_rebalance_delay_ms=300, min_session_timeout_ms=100,
                max_session_timeout_ms=60_000)
    base.update(overrides)
    return GroupConfig(**base)


async def started(logs=None, flusher=None, clock=None, **cfg):
    """A started coordinator on in-memory storage, timers driven by the test."""
    logs = logs if logs is not None else MemLogs()
    flusher = flusher if flusher is not None else GateFlusher()
    clock = clock if clock is not None else FakeClock()
    coord = group_coordinator(logs, flusher, config(**cfg), clock, run_timers=False)
    await start(coord)
    return SimpleNamespace(coord=coord, logs=logs, flusher=flusher, clock=clock,
                           log=logs.get("__consumer_offsets", 0))


async def settle(coord) -> None:
    """Let spawned writes and callbacks run."""
    for _ in range(3):
        await coord.idle()
        await asyncio.sleep(0)
