"""The console's writes: abort a transaction, reset a group's offsets, delete records.

Each is planned from the latest snapshot (what it will do, in words, for the
confirmation the page asks for) and then done over its own connections, so a write
never waits behind the poller. A refusal comes back as ActionError in plain words.
"""
from __future__ import annotations

from ..client import admin, share_admin
from ..client.client import ClientError
from ..protocol.errors import KafkaError
from .snapshot import Connect, Snapshot, TxnRow, explain, plain

INACTIVE_GROUP = ("Empty", "Dead")


class ActionError(Exception):
    """A write the cluster refused or that cannot be done; one line for the page."""


def _address(snap: Snapshot, node: int) -> str:
    b = next((b for b in snap.brokers if b.node_id == node and b.live), None)
    if b is None:
        raise ActionError(f"broker {node} is not reachable; try again once it is back or another took over")
    return b.address


def find_txn(snap: Snapshot, key: str) -> TxnRow:
    row = next((t for t in snap.txns if t.key == key), None)
    if row is None:
        raise ActionError(f"no open transaction {key!r} any more (it ended, or the page is out of date)")
    return row


def abort_plan(row: TxnRow) -> str:
    parts = ", ".join(f"{t}-{p}" for t, p in row.partitions) or "no partitions yet"
    if row.transactional_id is not None:
        return (f"Abort transaction {row.transactional_id!r} (producer {row.producer_id}, epoch "
                f"{row.producer_epoch}) at its coordinator: it writes ABORT markers to {parts} and fences the "
                f"producer, whose next call fails.")
    return (f"Write an ABORT marker for producer {row.producer_id}'s open transaction in {parts} "
            f"(no coordinator transaction owns it).")


def abort(connect: Connect, snap: Snapshot, key: str) -> str:
    """Abort an open transaction: at its coordinator (InitProducerId fences the id and
    aborts), or, for producer state no coordinator owns, by markers at the leaders
    (WriteTxnMarkers, Kafka's admin abort)."""
    row = find_txn(snap, key)
    try:
        if row.transactional_id is not None:
            return _abort_at_coordinator(connect, snap, row)
        return _abort_in_partitions(connect, snap, row)
    except (ClientError, OSError) as exc:
        raise ActionError(f"abort {key}: {explain(exc)}") from None


def _abort_at_coordinator(connect: Connect, snap: Snapshot, row: TxnRow) -> str:
    assert row.transactional_id is not None
    with connect(_address(snap, row.coordinator)) as c:
        err, pid, epoch = admin.fence_until_settled(c, row.transactional_id, row.timeout_ms or 60_000)
    if err:
        raise ActionError(f"abort {row.transactional_id}: {plain(err)}")
    return f"aborted {row.transactional_id!r}; producer id {pid} epoch {epoch} now belongs to no one"


def _abort_in_partitions(connect: Connect, snap: Snapshot, row: TxnRow) -> str:
    done: list[str] = []
    for tp in row.partitions:
        p = snap.partition(*tp)
        if p is None:
            raise ActionError(f"{tp[0]}-{tp[1]} is not in the cluster's metadata any more")
        with connect(_address(snap, p.leader)) as c:
            err = admin.abort_partition(c, tp[0], tp[1], row.producer_id, row.producer_epoch, row.coordinator_epoch)
        if err:
            raise ActionError(f"abort in {tp[0]}-{tp[1]}: {plain(err)}"
                              + (f" (done in {', '.join(done)})" if done else ""))
        done.append(f"{tp[0]}-{tp[1]}")
    return f"aborted producer {row.producer_id}'s transaction in {', '.join(done)}"


def reset_plan(snap: Snapshot, group_id: str, to: str) -> dict[tuple[str, int], int]:
    """{partition: new committed offset} for a reset to "earliest" or "latest"."""
    g = next((g for g in snap.groups if g.group_id == group_id), None)
    if g is None:
        raise ActionError(f"no group {group_id!r} in the latest view")
    if g.state not in INACTIVE_GROUP:
        raise ActionError(f"group {group_id!r} is {g.state} with {len(g.members)} member(s): offsets can be reset "
                          f"only while it has none (stop its consumers first)")
    plan = {}
    # A share group commits no offsets: what moves is each share-partition's start offset.
    partitions = [tp for tp, _ in g.share] if g.group_type == "share" else [(r.topic, r.partition) for r in g.lags]
    for topic, partition in partitions:
        p = snap.partition(topic, partition)
        if p is None or p.high_watermark < 0:
            raise ActionError(f"{topic}-{partition} has no readable offsets now ({p.error if p else 'gone'})")
        plan[(topic, partition)] = p.log_start if to == "earliest" else p.high_watermark
    if not plan:
        raise ActionError(f"group {group_id!r} has no committed offsets to reset")
    return plan


def reset_offsets(connect: Connect, snap: Snapshot, group_id: str, to: str) -> str:
    plan = reset_plan(snap, group_id, to)
    g = next(g for g in snap.groups if g.group_id == group_id)
    try:
        with connect(_address(snap, g.coordinator)) as c:
            if g.group_type == "share":
                err, result = share_admin.alter_share_start_offsets(c, group_id, plan)
            else:
                err, result = KafkaError.NONE, admin.commit_offsets(c, group_id, plan)
    except (ClientError, OSError) as exc:
        raise ActionError(f"reset {group_id}: {explain(exc)}") from None
    if err:
        raise ActionError(f"reset {group_id}: {plain(err)}; nothing reset")
    failed = {tp: e for tp, e in result.items() if e}
    if failed:
        (topic, partition), err = sorted(failed.items())[0]
        raise ActionError(f"reset {group_id}: {topic}-{partition}: {plain(err)}; "
                          f"{len(failed)} of {len(plan)} partition(s) refused")
    return f"reset {len(plan)} partition(s) of group {group_id} to the {to} offsets"


def delete_records(connect: Connect, snap: Snapshot, topic: str, partition: int, before: int) -> str:
    p = snap.partition(topic, partition)
    if p is None:
        raise ActionError(f"no partition {topic}-{partition}")
    try:
        with connect(_address(snap, p.leader)) as c:
            (err, low), = admin.delete_records(c, topic, {partition: before}).values()
    except (ClientError, OSError) as exc:
        raise ActionError(f"delete records of {topic}-{partition}: {explain(exc)}") from None
    if err == KafkaError.OFFSET_OUT_OF_RANGE:
        raise ActionError(f"{topic}-{partition}: offset {before} is past its high watermark {p.high_watermark}")
    if err:
        raise ActionError(f"delete records of {topic}-{partition}: {plain(err)}")
    return f"{topic}-{partition}: records before {before} deleted; log start now {low}"
