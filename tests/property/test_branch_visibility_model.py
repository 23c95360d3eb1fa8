"""A decision over a batch's branches, stepped: a read_committed reader fetches
between every two writes the coordinator makes while it carries the decision out,
and between every two writes of the roll-forward after a crash.

The real TransactionCoordinator runs in-process on real partition logs. A batch is a
parent transaction that joined N branches (the Spark sink's tasks), each branch
having written rows into some of the output partitions. Every write any log takes
(coordinator records, markers, offsets) is one step; after each one the reader reads
every output partition up to its last stable offset. Seeded: the branch count, which
partitions each branch writes, and where the coordinator dies (once during the
decision, sometimes once more during the roll-forward). After every step:
- in each partition the reader sees none of the batch's rows or all of them;
- nothing it sees was aborted (the decision is commit);
- once a Prepare record of the parent is in the log, the restarted coordinator ends
  with every row visible exactly once and the parent and every branch complete.
"""
from __future__ import annotations

import asyncio
import random

import pytest

from tests.support.coordinators import group_coordinator, start, txn_coordinator
from semel.broker.config import BrokerConfig
from semel.coordinator.group import GroupConfig
from semel.coordinator.producer_ids import ProducerIdManager
from semel.coordinator.txn_states import TxnState
from semel.protocol import records
from semel.protocol.errors import KafkaError
from semel.storage import log as log_module
from semel.storage.flusher import GroupCommitFlusher
from semel.storage.manager import LogManager

E = KafkaError
TOPIC, PARTITIONS = "out", 3
PARENT = "q-parent"


class Crash(BaseException):
    """The broker process dies: raised by the write hook, caught by nothing in semel."""


class Steps:
    """The hook on every partition-log write: check the reader's view, then maybe die."""

    def __init__(self, model: "Model"):
        self.model, self.count, self.crash_at, self.dead, self.checking = model, 0, None, False, False

    def after_write(self) -> None:
        if self.dead:
            raise Crash()     # the old process is gone: it writes nothing more
        if self.checking:
            self.count += 1
            self.model.check_reader()
            if self.count == self.crash_at:
                self.dead = True
                raise Crash()


class Model:
    def __init__(self, tmp_path, seed: int):
        self.rng = random.Random(seed)
        self.dir = tmp_path / "data"
        self.rows: dict[int, set[str]] = {p: set() for p in range(PARTITIONS)}   # the batch's rows per partition
        self.branches: list[str] = []
        self.violations: list[str] = []
        self.logs = self.coord = None

    async def open(self) -> None:
        """A broker process: its logs and coordinator from the data directory (replay)."""
        self.logs = LogManager(self.dir)
        if TOPIC not in self.logs.topics():
            self.logs.create_topic(TOPIC, PARTITIONS)
        flusher = GroupCommitFlusher()
        groups = group_coordinator(self.logs, flusher, GroupConfig(), run_timers=False)
        self.coord = txn_coordinator(self.logs, flusher, groups,
                                     BrokerConfig(data_dir=self.dir, transaction_abort_check_interval_ms=3_600_000),
                                     ProducerIdManager(self.dir / "producer_ids"))
        await start(groups)
        await start(self.coord)
        # The seat's load rolls Prepare* records forward in the background: a restart
        # is over once that finished (a Crash in it is this process dying).
        while self.coord.runtime.tasks:
            await asyncio.gather(*list(self.coord.runtime.tasks))

    async def write_branches(self) -> None:
        for i in range(self.rng.randint(2, 6)):
            b = f"{PARENT}.b{i}"
            err, pid, epoch = await self.coord.init_producer_id(b, 60_000, -1, -1, 4)
            assert err == E.NONE
            parts = sorted(self.rng.sample(range(PARTITIONS), self.rng.randint(1, PARTITIONS)))
            got = await self.coord.add_partitions(b, pid, epoch, [(TOPIC, p) for p in parts], 3)
            assert all(e == E.NONE for e in got.values()), got
            for p in parts:
                values = [f"{b}-p{p}-{n}" for n in range(self.rng.randint(1, 3))]
                data = records.build_batch([(None, v.encode()) for v in values], producer_id=pid,
                                           producer_epoch=epoch, base_sequence=0, transactional=True)
                batches, _ = records.split_batches(data)
                self.logs.get(TOPIC, p).append(data, batches)
                self.rows[p] |= set(values)
            self.branches.append(b)
        err, pid, epoch = await self.coord.init_producer_id(PARENT, 60_000, -1, -1, 4)
        assert err == E.NONE
        got = await self.coord.add_partitions(PARENT, pid, epoch, [(f"__semel_branch:{b}", 0) for b in self.branches], 3)
        assert all(e == E.NONE for e in got.values()), got
        self.parent = (pid, epoch)

    def visible(self, p: int) -> tuple[list[str], list]:
        """What a read_committed fetch of partition p returns: records below the LSO, and
        the aborted transactions the broker would list with them."""
        plog = self.logs.get(TOPIC, p)
        lso = plog.last_stable_offset
        data = bytes(plog.read(0, 1 << 24)) if lso > 0 else b""
        out = []
        for pos, hdr in records.iter_batches(data):
            if hdr.is_control or hdr.base_offset >= lso:
                continue
            out += [r.value.decode() for r in records.iter_records(data, pos)]
        return out, plog.aborted_transactions(0, lso)

    def check_reader(self) -> None:
        for p in range(PARTITIONS):
            seen, aborted = self.visible(p)
            if aborted:
                self.violations.append(f"p{p}: aborted transactions {aborted} in a committed batch")
            if seen and set(seen) != self.rows[p]:
                self.violations.append(f"p{p}: part of the batch visible: {sorted(seen)} of {sorted(self.rows[p])}")
            if len(seen) != len(set(seen)):
                self.violations.append(f"p{p}: a row twice")

    def settled(self) -> bool:
        states = [self.coord.txns[t].state for t in [PARENT] + self.branches]
        return all(s == TxnState.COMPLETE_COMMIT for s in states)


async def run(tmp_path, seed: int, crash_at: int | None, again_at: int | None):
    m = Model(tmp_path, seed)
    steps = Steps(m)
    real = log_module.PartitionLog.finish_write

    def hooked(self, w, failure):
        if steps.dead:
            raise Crash()
        info = real(self, w, failure)
        steps.after_write()
        return info
    log_module.PartitionLog.finish_write = hooked
    try:
        await m.open()
        await m.write_branches()
        m.check_reader()
        assert not any(m.visible(p)[0] for p in range(PARTITIONS)), "rows visible before the decision"
        steps.checking, steps.crash_at = True, crash_at
        decided = None
        try:
            decided = await m.coord.end_txn(PARENT, *m.parent, True, 3)
        except Crash:
            pass
        total = steps.count
        for crash in ([again_at] if again_at is not None else []) + [None]:
            if not steps.dead:
                break
            # Restart: a fresh process on the same files, the old one's tasks left behind dead.
            steps.dead, steps.count, steps.crash_at = False, 0, crash
            try:
                await m.open()
            except Crash:
                continue
        await asyncio.sleep(0)
        return m, decided, total
    finally:
        log_module.PartitionLog.finish_write = real


def test_the_decision_without_a_crash_commits_every_branch_in_few_writes(tmp_path):
    m, decided, total = asyncio.run(run(tmp_path, 7, None, None))
    assert decided == E.NONE and m.settled()
    assert m.violations == []
    for p in range(PARTITIONS):
        assert sorted(m.visible(p)[0]) == sorted(m.rows[p])
    # parent Prepare, branches' Prepares, one marker append per partition that has
    # rows, the branches' Completes, the parent's Complete: not one round per branch
    written = sum(1 for p in range(PARTITIONS) if m.rows[p])
    assert total == 4 + written, total


@pytest.mark.parametrize("seed", range(6))
def test_a_reader_between_any_two_steps_never_sees_part_of_the_batch(tmp_path, seed):
    rng = random.Random(seed)
    _, _, total = asyncio.run(run(tmp_path / "dry", seed, None, None))
    for crash_at in range(1, total + 1):
        again = rng.choice([None, None, 1, 2, 3])
        m, decided, _ = asyncio.run(run(tmp_path / f"c{crash_at}", seed, crash_at, again))
        assert m.violations == [], f"crash at step {crash_at}, again at {again}: {m.violations}"
        # The first step is the parent's Prepare record: once it is written, the batch
        # is decided and the restarted coordinator carries it out, never reverses it.
        assert m.settled(), f"crash at step {crash_at}: not rolled forward"
        for p in range(PARTITIONS):
            assert sorted(m.visible(p)[0]) == sorted(m.rows[p]), f"crash at step {crash_at}: p{p}"
