"""Disk faults at each transaction-coordinator step of a real broker process.

The broker runs with `SEMEL_FS_FAULTS=control_file=PATH` (semel/storage/fs.py): a
test writes a fault spec to PATH at the moment it chooses, and the next matching
write or fsync inside the broker fails (EIO, or a torn write that leaves half the
bytes). Each step is hit in turn: InitProducerId, AddPartitionsToTxn, the
PrepareCommit/PrepareAbort record, the markers (data partition and
__consumer_offsets), the Complete record.

For every case: the client gets an error or a truthful answer; after a SIGKILL the
log files hold only whole, CRC-valid batches; after the restart the coordinator and
the partitions agree with what the client was told, or with a legal roll-forward of
a logged decision; a commit decision is never reversed.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from test_txn_protocol import READ_UNCOMMITTED, leo, lso, visible

from tests.support.txn import RawTxn, call
from tests.support.wait import until

from semel.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError

E = KafkaError
TXN_LOG = "__transaction_state-0/00000000000000000000.log"
OFFSETS_LOG = "__consumer_offsets-0/00000000000000000000.log"
OUT1_LOG = "out-1/00000000000000000000.log"
FOREVER = 1_000_000


@pytest.fixture
def fbroker(start_broker, tmp_path):
    ctl = tmp_path / "faults"
    b = start_broker("--transaction-abort-check-interval-ms", "200",
                     env={"SEMEL_FS_FAULTS": f"control_file={ctl}"})
    b.control_file = ctl
    with Client(b.bootstrap) as c:
        for name in ("out", "in"):
            assert c.create_topic(name, 2) == E.NONE
    return b


def arm(broker, spec: str) -> None:
    """Arm faults inside the running broker; returns once it took them."""
    ctl = Path(broker.control_file)
    tmp = ctl.with_name(ctl.name + ".tmp")
    tmp.write_text(spec)
    os.replace(tmp, ctl)
    deadline = time.monotonic() + 30
    while ctl.exists():
        assert not ctl.with_name(ctl.name + ".rejected").exists(), f"broker rejected {spec!r}"
        assert time.monotonic() < deadline, "the broker never picked up the fault spec"
        time.sleep(0.01)


def assert_logs_whole(data_dir: Path) -> None:
    """Every segment file is a sequence of complete batches with valid CRCs: an error
    path never leaves a half-written record behind (checked before recovery runs)."""
    files = sorted(Path(data_dir).glob("*-*/*.log"))
    assert files
    for f in files:
        buf = f.read_bytes()
        pos = 0
        while pos < len(buf):
            assert len(buf) - pos >= records.LOG_OVERHEAD, f"{f}: torn batch header at byte {pos}"
            size = records.batch_size_at(buf, pos)
            assert pos + size <= len(buf), f"{f}: torn batch at byte {pos}"
            assert records.crc_ok(buf, pos, size), f"{f}: bad CRC at byte {pos}"
            pos += size


def crash_and_restart(broker, *txns: RawTxn) -> Client:
    broker.kill()
    assert_logs_whole(broker.data_dir)
    broker.restart()
    c = Client(broker.bootstrap)
    for t in txns:
        t.c = c
    return c


def begin(t: RawTxn, tag: bytes) -> list[bytes]:
    """Add out-0 and out-1, write two records to each; returns the values written."""
    assert t.add(("out", 0), ("out", 1)) == {("out", 0): E.NONE, ("out", 1): E.NONE}
    written = []
    for p in (0, 1):
        vals = [tag + b"-%d-%d" % (p, i) for i in range(2)]
        assert t.produce("out", p, *vals)[0] == E.NONE
        written += vals
    return written


def assert_outcome(c: Client, t: RawTxn, committed: list[bytes], aborted: list[bytes]) -> None:
    """Nothing left open, committed values visible exactly once, aborted ones never."""
    seen = []
    for p in (0, 1):
        assert lso(c, "out", p) == leo(c, "out", p), f"out-{p} still has an open transaction"
        seen += visible(c, "out", p)
    assert sorted(seen) == sorted(committed)
    everything = [v for p in (0, 1) for v in visible(c, "out", p, READ_UNCOMMITTED)]
    assert not set(aborted) & set(seen) and set(aborted) <= set(everything)


def assert_decision(t: RawTxn, commit: bool) -> None:
    """EndTxn retries tell the last decision: the same one is NONE, the other INVALID_TXN_STATE."""
    assert t.end(commit) == E.NONE
    assert t.end(not commit) == E.INVALID_TXN_STATE


def assert_epoch_is(c: Client, t: RawTxn, epoch: int) -> None:
    """KIP-360 bump from the epoch the client holds: accepted only if that is the current one."""
    r = call(c, 22, 4, transactional_id=t.txn_id, transaction_timeout_ms=30_000,
             producer_id=t.pid, producer_epoch=epoch)
    assert (E(r.error_code), r.producer_id, r.producer_epoch) == (E.NONE, t.pid, epoch + 1)
    t.epoch = r.producer_epoch


# A failed fsync's record is cut back before anything else is written to the log
# (storage/fsync_repair.py; drop=1: its bytes are gone from the file too), so every
# fault leaves the coordinator as if the step never happened.
FAULTS = {"write": "fail_next_write=1", "torn": "fail_next_write=1,partial=1", "fsync": "fail_next_fsync=1",
          "fsync-drop": "fail_next_fsync=1,drop=1"}


# --- InitProducerId and AddPartitionsToTxn -------------------------------------------------------------

@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_at_init_producer_id(fbroker, fault):
    c = Client(fbroker.bootstrap)
    t = RawTxn(c, "f-init")
    assert t.init() == E.NONE
    arm(fbroker, f"{FAULTS[fault]},path_contains={TXN_LOG}")
    again = RawTxn(c, "f-init")
    assert again.init() == E.COORDINATOR_NOT_AVAILABLE
    # The failed bump changed nothing: the holder of epoch 0 may still work.
    assert t.end(True) == E.INVALID_TXN_STATE  # changes nothing
    assert again.init() == E.NONE
    assert again.epoch == 1
    written = begin(again, b"i")
    assert again.end(True) == E.NONE
    c = crash_and_restart(fbroker, again)
    assert_outcome(c, again, written, [])
    assert_decision(again, commit=True)
    assert_epoch_is(c, again, again.epoch)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_at_add_partitions(fbroker, fault):
    c = Client(fbroker.bootstrap)
    t = RawTxn(c, "f-add")
    assert t.init() == E.NONE
    arm(fbroker, f"{FAULTS[fault]},path_contains={TXN_LOG}")
    assert t.add(("out", 0), ("out", 1)) == {("out", 0): E.COORDINATOR_NOT_AVAILABLE,
                                             ("out", 1): E.COORDINATOR_NOT_AVAILABLE}
    # Nothing was added: refused before append.
    assert t.produce("out", 0, b"early")[0] == E.INVALID_TXN_STATE
    assert leo(c, "out", 0) == 0
    written = begin(t, b"a")     # the client retries the addition
    assert t.end(True) == E.NONE
    c = crash_and_restart(fbroker, t)
    assert_outcome(c, t, written, [])
    assert_decision(t, commit=True)


# --- the decision: PrepareCommit / PrepareAbort ------------------------------------------------------------

@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_at_prepare(fbroker, fault, commit):
    c = Client(fbroker.bootstrap)
    t = RawTxn(c, "f-prepare")
    assert t.init() == E.NONE
    written = begin(t, b"p")
    arm(fbroker, f"{FAULTS[fault]},path_contains={TXN_LOG}")
    assert t.end(commit) == E.COORDINATOR_NOT_AVAILABLE
    # Nothing was decided: the transaction is still open, and a retry decides it.
    assert lso(c, "out", 0) == 0 < leo(c, "out", 0)
    assert t.end(commit) == E.NONE
    assert_outcome(c, t, written if commit else [], [] if commit else written)
    c = crash_and_restart(fbroker, t)
    assert_outcome(c, t, written if commit else [], [] if commit else written)
    assert_decision(t, commit)


def test_a_commit_whose_prepare_fsync_failed_was_not_decided(fbroker):
    """The Prepare fsync fails and markers cannot be written: the client is told
    COORDINATOR_NOT_AVAILABLE and the record is cut back before anything else is
    logged (storage/fsync_repair.py), so nothing was decided. The client aborts
    instead; that logged decision is the one carried out, and is never reversed by a
    later commit, before or after the broker dies. (A logged commit is never reversed:
    test_marker_failures_hold_the_transaction_until_written.)"""
    c = Client(fbroker.bootstrap)
    t = RawTxn(c, "f-reverse")
    assert t.init() == E.NONE
    written = begin(t, b"r")
    arm(fbroker, f"fail_next_write={FOREVER},path_contains={OUT1_LOG}")
    arm(fbroker, f"fail_next_fsync=1,path_contains={TXN_LOG}")
    assert t.end(True) == E.COORDINATOR_NOT_AVAILABLE
    assert t.end(False) == E.NONE
    assert t.end(True) == E.CONCURRENT_TRANSACTIONS
    c = crash_and_restart(fbroker, t)
    assert_outcome(c, t, [], written)
    assert_decision(t, commit=False)


# --- markers ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("then", ["heal", "crash", "crash-still-failing"])
def test_marker_failures_hold_the_transaction_until_written(fbroker, then):
    c = Client(fbroker.bootstrap)
    t = RawTxn(c, "f-marker")
    assert t.init() == E.NONE
    written = begin(t, b"m")
    arm(fbroker, f"fail_next_write={FOREVER},path_contains={OUT1_LOG}")
    assert t.end(True) == E.NONE            # the decision is logged: the commit will happen
    # out-0 got its marker, out-1 cannot: it stays unstable, nothing new may start.
    assert lso(c, "out", 0) == leo(c, "out", 0)
    assert lso(c, "out", 1) == 0 < leo(c, "out", 1)
    assert t.add(("out", 0)) == {("out", 0): E.CONCURRENT_TRANSACTIONS}
    assert t.add_offsets("g") == E.CONCURRENT_TRANSACTIONS
    # A late write into the completing transaction would hang it (KIP-890): refused.
    end0 = leo(c, "out", 0)
    assert t.produce("out", 0, b"late")[0] == E.INVALID_TXN_STATE
    assert leo(c, "out", 0) == end0
    assert t.end(True) == E.CONCURRENT_TRANSACTIONS
    assert t.end(False) == E.CONCURRENT_TRANSACTIONS
    with Client(fbroker.bootstrap) as c2:
        assert RawTxn(c2, "f-marker").init() == E.CONCURRENT_TRANSACTIONS
    if then == "heal":
        arm(fbroker, "clear=1")
        until(lambda: t.end(True) == E.NONE, "the commit completes once the disk heals")
    elif then == "crash":
        # Rolled forward once the coordinator loads, in the background as in a cluster:
        # EndTxn answers CONCURRENT_TRANSACTIONS until every marker is written.
        c = crash_and_restart(fbroker, t)
        until(lambda: t.end(True) == E.NONE, "the roll-forward after the restart completes the commit")
    else:
        # The roll-forward at start cannot write the marker either: the broker still
        # starts, holds the transaction, and finishes it once the disk heals.
        env = fbroker.env["SEMEL_FS_FAULTS"]
        fbroker.env["SEMEL_FS_FAULTS"] = f"{env},fail_next_write={FOREVER},path_contains={OUT1_LOG}"
        try:
            c = crash_and_restart(fbroker, t)
        finally:
            fbroker.env["SEMEL_FS_FAULTS"] = env
        assert t.end(False) == E.CONCURRENT_TRANSACTIONS
        assert lso(c, "out", 1) == 0 < leo(c, "out", 1)
        arm(fbroker, "clear=1")
        until(lambda: t.end(True) == E.NONE, "the rolled-forward commit completes once the disk heals")
    assert_outcome(c, t, written, [])
    assert_decision(t, commit=True)
    written2 = begin(t, b"m2")              # the id is usable again
    assert t.end(False) == E.NONE
    assert_outcome(c, t, written, written2)


@pytest.mark.parametrize("fault", ["torn", "fsync"])
def test_single_marker_fault_is_retried_without_harm(fbroker, fault):
    c = Client(fbroker.bootstrap)
    t = RawTxn(c, "f-marker-once")
    assert t.init() == E.NONE
    written = begin(t, b"o")
    arm(fbroker, f"{FAULTS[fault]},path_contains={OUT1_LOG}")
    assert t.end(False) == E.NONE
    until(lambda: t.end(False) == E.NONE and lso(c, "out", 1) == leo(c, "out", 1), "abort completes")
    assert_outcome(c, t, [], written)
    c = crash_and_restart(fbroker, t)
    assert_outcome(c, t, [], written)
    assert_decision(t, commit=False)


@pytest.mark.parametrize("then", ["heal", "crash"])
def test_offsets_marker_failure_commits_offsets_after_all(fbroker, then):
    from confluent_kafka import Consumer, TopicPartition
    c = Client(fbroker.bootstrap)
    t = RawTxn(c, "f-offsets")
    assert t.init() == E.NONE
    written = begin(t, b"g")
    assert t.add_offsets("fg") == E.NONE
    assert t.commit_offsets("fg", {("in", 0): 42}) == {("in", 0): E.NONE}
    arm(fbroker, f"fail_next_write={FOREVER},path_contains={OFFSETS_LOG}")
    assert t.end(True) == E.NONE
    assert t.end(True) == E.CONCURRENT_TRANSACTIONS
    if then == "heal":
        arm(fbroker, "clear=1")
        until(lambda: t.end(True) == E.NONE, "the commit completes once the disk heals")
    else:
        c = crash_and_restart(fbroker, t)
    assert_outcome(c, t, written, [])
    assert_decision(t, commit=True)
    consumer = Consumer({"bootstrap.servers": fbroker.bootstrap, "group.id": "fg"})
    try:
        assert consumer.committed([TopicPartition("in", 0)], timeout=15)[0].offset == 42
    finally:
        consumer.close()


# --- the Complete record ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_at_complete_then_next_transaction(fbroker, fault):
    """The Complete record (the 2nd txn-log write after the Prepare) fails. The next
    transaction of the same id must not be overwritten by a late retry of the first
    one's completion (it was, when a failed fsync reloaded the whole coordinator
    state under the feet of the retry: the new transaction's partitions were
    forgotten and their LSO stuck for ever)."""
    c = Client(fbroker.bootstrap)
    t = RawTxn(c, "f-complete")
    assert t.init() == E.NONE
    first = begin(t, b"c")
    arm(fbroker, f"{FAULTS[fault]},skip=1,path_contains={TXN_LOG}")
    assert t.end(True) == E.NONE
    until(lambda: t.add(("out", 1)) == {("out", 1): E.NONE}, "the next transaction can start")
    assert t.produce("out", 1, b"second")[0] == E.NONE
    time.sleep(0.5)   # room for a stale completion retry to strike (it used to, within 0.1 s)
    assert lso(c, "out", 1) < leo(c, "out", 1)
    assert t.end(False) == E.NONE
    assert_outcome(c, t, first, [b"second"])
    c = crash_and_restart(fbroker, t)
    assert_outcome(c, t, first, [b"second"])
    assert_decision(t, commit=False)
