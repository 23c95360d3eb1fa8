"""Mode (a): atomic micro-batches on a semel broker.

The batch's parent transaction joins every winning branch (one per task) with a
standard AddPartitionsToTxn of the pseudo-partition `(__semel_branch:<branch id>, 0)`.
On a semel broker the join is part of the parent's log records, so the parent's
single EndTxn decides the whole batch in one coordinator-log record, and the
coordinator writes the markers of all its branches into each partition in one
append: a read_committed reader never sees one task's output of a batch without
the others', and a joined branch is not aborted by its own timeout while the
parent is undecided. See semel/coordinator/txn_branches.py.

Capability detection (option `semel.atomicBatches` = auto | true | false): at
query start the sink asks a probe parent to join a branch that does not exist. A
semel broker with the extension refuses it as INVALID_TXN_STATE (it understood the
request); any other broker refuses the pseudo-topic itself (unknown or invalid
topic) or, like Tansu 0.6, accepts it as if it were a partition (then the probe is
aborted). auto then falls back to mode (b); true refuses to start.
"""
from __future__ import annotations

import time
from typing import Callable

from semel.backoff import Backoff
from semel.client import txn as wire
from semel.client.client import CONNECTION_BROKEN, Client
from semel.protocol.errors import KafkaError
from semel.protocol.txn_hash import aligned

BRANCH_TOPIC = "__semel_branch:"
MODES = ("auto", "true", "false")
# What a broker answers for a pseudo-partition it does not understand.
_NOT_UNDERSTOOD = frozenset({KafkaError.INVALID_TOPIC_EXCEPTION, KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                             KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.INVALID_REQUEST})
# Worth asking again: the parent or a branch is between two transitions.
_AGAIN = frozenset({KafkaError.CONCURRENT_TRANSACTIONS, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                    KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
                    KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION})


class AtomicError(Exception):
    """The broker refused what mode (a) needs; one readable line."""


def pseudo_partition(branch_id: str) -> tuple[str, int]:
    return (BRANCH_TOPIC + branch_id, 0)


def branch_name(parent: str, name: str) -> str:
    """The transactional id of `parent`'s branch `name`: `name.` plus a suffix that makes
    it hash like the parent, so a cluster coordinates both on the same partition of
    __transaction_state whatever its partition count (semel.protocol.txn_hash)."""
    return aligned(parent, name + ".")


def broker_has_branches(c: Client, probe_parent: str, timeout_ms: int) -> bool:
    """Whether the broker speaks the branch extension (no state is changed: the probe
    parent stays empty, the join of a branch that does not exist is refused)."""
    err, st = wire.init_producer_id(c, probe_parent, timeout_ms)
    if err != KafkaError.NONE:
        raise AtomicError(f"InitProducerId {probe_parent}: {err.name}")
    got = wire.add_partitions(c, st, [pseudo_partition(branch_name(probe_parent, f"{probe_parent}.none"))])
    err = next(iter(got.values()))
    if err == KafkaError.INVALID_TXN_STATE:
        return True
    if err == KafkaError.NONE:
        # Accepted a join of nothing: the broker took the pseudo-partition for a
        # partition (Tansu 0.6 does) and knows nothing of branches. Drop the probe.
        wire.end_txn(c, probe_parent, st.pid, st.epoch, False)
        return False
    if err in _NOT_UNDERSTOOD:
        return False
    raise AtomicError(f"AddPartitionsToTxn probe: {err.name}")


def resolve(mode: str, c: Client, probe_parent: str, timeout_ms: int) -> bool:
    """True: run this query in mode (a). `mode` is the option's value."""
    if mode == "false":
        return False
    supported = broker_has_branches(c, probe_parent, timeout_ms)
    if mode == "true" and not supported:
        raise AtomicError("semel.atomicBatches=true but the broker does not support atomic batches "
                          "(not a semel broker?); use auto or false")
    return supported


def join(conn: Callable[[], Client], parent: wire.TxnState, branch_ids: list[str], deadline_s: float,
         moved: Callable[[KafkaError], object] = lambda err: None,
         lost: Callable[[], object] = lambda: None) -> None:
    """Join every branch to the parent, or AtomicError (a branch that is no longer
    ongoing, e.g. aborted by its timeout, fails the batch: never committed in part).
    conn(): the parent's coordinator, asked each try; moved(err) is told each refusal
    (a router drops a coordinator that moved); lost() each connection that broke
    mid-request (the join is sent again: one the broker has is answered NONE)."""
    if not branch_ids:
        return
    pace = Backoff(deadline_s - time.monotonic())
    tps = [pseudo_partition(b) for b in branch_ids]
    while True:
        try:
            got = wire.add_partitions(conn(), parent, tps)
        except CONNECTION_BROKEN:
            lost()
            got = {tp: KafkaError.NETWORK_EXCEPTION for tp in tps}
        bad = {tp[0][len(BRANCH_TOPIC):]: e for tp, e in got.items() if e != KafkaError.NONE}
        for err in set(bad.values()):
            moved(err)
        if not bad:
            return
        if not all(e in _AGAIN or e == KafkaError.OPERATION_NOT_ATTEMPTED for e in bad.values()) \
                or pace.expired():
            raise AtomicError("joining the batch's branches failed: "
                              + ", ".join(f"{b} {e.name}" for b, e in sorted(bad.items())))
        pace.wait()
