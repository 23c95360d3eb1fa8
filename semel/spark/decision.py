"""The batch's durable decision: what a task reports to it (BranchMessage), the
decided-yet checks of tasks and commit(), reading the decision from the query's
committed offsets, and recording it (commit_batch: the parent transaction's offsets
and metadata, then the branches' EndTxn). See semel/spark/sink.py for the protocol.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from pyspark.sql.datasource import WriterCommitMessage

from semel.backoff import Backoff
from semel.client.client import ClientError
from semel.client import txn as wire
from semel.client.cluster import COORDINATOR_MOVED, GROUP, TRANSACTION, ClusterRouter
from semel.protocol.api_keys import ApiKey
from semel.protocol.errors import KafkaError
from semel.spark import atomic
from semel.spark.checkpoint import Checkpoint, CheckpointError, shuffle_partitions
from semel.spark.hooks import kill_if
from semel.spark.routing import (BROKEN, connect, end_transaction, fence_transaction, group_coordinator, init_transaction,
                                 on_txn_coordinator, require_ok, resending, reset_connections, retrying, route_key,
                                 txn_coordinator)
from semel.spark.sink_options import TP, SinkError, SinkOptions
from semel.spark.trace import Phases

# Kafka's offset.metadata.max.bytes default (semel's too): the decision must fit.
MAX_DECISION_BYTES = 4096


def _checkpoint(o: SinkOptions) -> Checkpoint:
    try:
        return Checkpoint(o.checkpoint, dict(o.fs))
    except CheckpointError as exc:
        raise SinkError(f"semel sink: {exc}") from None


def batch_offsets(o: SinkOptions, batch: int) -> dict[TP, int]:
    """The source end offsets Spark journaled for `batch` (semel/Kafka-shaped sources
    only), read from the checkpoint: driver side only."""
    if o.checkpoint is None:
        return {}
    try:
        return _kafka_offsets(_checkpoint(o).offset_lines(batch) or [])
    except CheckpointError as exc:
        raise SinkError(f"semel sink: {exc}") from None


@dataclass(frozen=True)
class BatchPlan:
    """What the driver side read from the checkpoint for the micro-batch it plans: the
    batch number (None without a checkpoint) and its source end offsets."""
    batch: int | None = None
    offsets: dict = field(default_factory=dict)
    shuffle_partitions: int | None = None  # as the batch's offset log entry records it


def plan_batch(o: SinkOptions) -> tuple[SinkOptions, BatchPlan]:
    """At streamWriter(), on the driver side: the query's id (on the options) and the
    plan of the batch Spark is about to run, the newest of its offset log."""
    if o.checkpoint is None:
        return o, BatchPlan()
    try:
        ck = _checkpoint(o)
        batch = ck.latest_batch()
        lines = ck.offset_lines(batch) if batch is not None else None
        return (replace(o, query=ck.query_id()),
                BatchPlan(batch, _kafka_offsets(lines or []), shuffle_partitions(lines)))
    except CheckpointError as exc:
        raise SinkError(f"semel sink: {exc}") from None


def _kafka_offsets(lines: list[str]) -> dict[TP, int]:
    out: dict[TP, int] = {}
    for line in lines[2:]:  # "v1", Spark's own metadata, then one line per source
        try:
            doc = json.loads(line)
            out.update({(t, int(p)): int(off) for t, ps in doc.items() for p, off in ps.items()})
        except (ValueError, AttributeError, TypeError):
            continue  # another source's offset shape: nothing the sink commits
    return out


def decision_partitions(o: SinkOptions, offsets: dict[TP, int]) -> list[TP]:
    if offsets:
        return sorted(offsets)
    if o.topic is None:
        raise SinkError("semel sink: no semel source offsets in this batch and no 'topic' option to "
                        "record the batch decision on")
    return [(o.topic, 0)]  # a query without a semel source: record the decision on the output


def read_decision(r: ClusterRouter, o: SinkOptions, parts: list[TP], fence_open: bool = True) -> dict | None:
    """The newest decision the query's committed offsets record, or None.

    UNSTABLE_OFFSET_COMMIT means a parent transaction is open. In commit() (the
    only decider of this run, fence_open) it is a killed or zombie run's: fence it
    (the broker aborts it), then read the settled state. A task (not fence_open)
    must not fence it: a speculative copy still writing while this run's commit()
    decides would abort that commit. For a task an open parent means "not decided
    yet" (None): it cannot include the task's branch, whose message is not sent.
    A group coordinator that moved is asked for again."""
    pace = Backoff(o.request_timeout_ms / 1000)
    while True:
        try:
            got = wire.committed_with_metadata(group_coordinator(r, o), o.group, parts)
            break
        except BROKEN as exc:
            reset_connections(r)   # a read: asked again on a new connection
            if pace.expired():
                raise SinkError(f"semel sink: reading the decision: {exc}") from None
            pace.wait()
        except ClientError as exc:
            moved = r.seen(exc.error, coordinator=(o.group, GROUP)) in COORDINATOR_MOVED
            if not (moved or exc.error == KafkaError.UNSTABLE_OFFSET_COMMIT) or pace.expired():
                raise SinkError(f"semel sink: {exc}") from None
            if moved:
                pace.wait()
            elif not fence_open:
                return None
            else:
                fence_transaction(r, o, o.parent)
    return _decision_in(o, got)


def _decision_in(o: SinkOptions, got: dict) -> dict | None:
    """The newest decision of this run among the committed offsets' metadata."""
    best = None
    for off, meta in got.values():
        if off < 0 or not meta:
            continue
        try:
            doc = json.loads(meta)
        except ValueError:
            continue
        if not isinstance(doc, dict) or doc.get("semel-spark") != 1:
            continue
        if doc.get("query") is not None and doc["query"] != o.query:
            continue  # an earlier checkpoint's batch numbers: not decisions about this run's batches
        if best is None or doc["batch"] > best["batch"]:
            best = doc
    return best


def branch_id(o: SinkOptions, batch: int, partition: int, attempt: int) -> str:
    return atomic.branch_name(o.parent, f"{o.parent}.b{batch}.p{partition}.a{attempt}")



@dataclass
class BranchMessage(WriterCommitMessage):
    partition: int
    attempt: int
    pid: int = -1
    epoch: int = -1
    rows: int = 0
    skipped: bool = False  # the batch was decided before this attempt wrote anything
    counts: dict = field(default_factory=dict)



def is_decided(r: ClusterRouter, o: SinkOptions, batch: int, parts: list[TP]) -> bool:
    """Task side: whether `batch` is decided (an open parent counts as not yet); `parts`:
    the batch's decision partitions (decision_partitions of the plan's offsets)."""
    done = read_decision(r, o, parts, fence_open=False)
    return done is not None and done["batch"] >= batch


def is_decided_call(o: SinkOptions, batch: int, parts: list[TP]):
    """is_decided() as a (call, result) pair that goes in one write with other requests; the
    result is None where the group coordinator moved (then is_decided() asks on its own)."""
    call = wire.committed_call(o.group, parts)
    fetched = wire.committed_result(o.group)

    def result(r) -> bool:
        try:
            done = _decision_in(o, fetched(r))
        except ClientError as exc:
            if exc.error in COORDINATOR_MOVED:
                return None
            if exc.error != KafkaError.UNSTABLE_OFFSET_COMMIT:
                raise SinkError(f"semel sink: {exc}") from None
            return False  # an open parent: not decided yet (see read_decision)
        return done is not None and done["batch"] >= batch
    return call, result



def written_winners(winners: list[BranchMessage]) -> list[BranchMessage]:
    """Branches with rows. A task that wrote nothing (an empty partition) left its
    branch Empty: no transaction to join or commit (EndTxn would be INVALID_TXN_STATE)."""
    return [m for m in winners if m.rows > 0]


def pick_winners(messages) -> list[BranchMessage]:
    return [m for m in messages if isinstance(m, BranchMessage) and not m.skipped and m.pid >= 0]

def end_branch(r: ClusterRouter, o: SinkOptions, batch: int, b: list) -> None:
    part, attempt, pid, epoch = b
    bid = branch_id(o, batch, part, attempt)
    err = retrying(o, "EndTxn", lambda: end_transaction(r, o, bid, pid, epoch, True))
    if err != KafkaError.NONE:
        raise SinkError(f"semel sink: batch {batch} is committed but its branch {bid} cannot be: {err.name} "
                        "(aborted by the broker's transaction timeout? see semel.restartWindowMs)")


def commit_batch(o: SinkOptions, messages, batch: int, offsets: dict[TP, int] | None = None) -> None:
    """`offsets`: the batch's source end offsets where the caller has them (the writer's
    plan), else they are read from the checkpoint."""
    if offsets is None:
        offsets = batch_offsets(o, batch)
    parts = decision_partitions(o, offsets)
    winners = pick_winners(messages)
    ph = Phases(o, "commit", batch)
    with connect(o) as r:
        ph.mark("connect")
        st, done = _init_and_read(r, o, parts)
        ph.mark("init_and_read")
        if done is not None and done["batch"] >= batch:
            _roll_forward(r, o, done, batch, winners)
            return
        written = written_winners(winners)
        branches = [[m.partition, m.attempt, m.pid, m.epoch] for m in written]
        # Mode (a) records no branches: the parent's decision carries them on the broker,
        # which keeps the metadata small however many tasks the batch has.
        meta = json.dumps({"semel-spark": 1, "batch": batch, "branches": [] if o.atomic else branches,
                           "atomic": o.atomic, "query": o.query}, separators=(",", ":"))
        if len(meta) > MAX_DECISION_BYTES:
            raise SinkError(f"semel sink: batch {batch} has {len(branches)} writing tasks, too many to record in "
                            f"offset metadata ({len(meta)} > {MAX_DECISION_BYTES} bytes) in mode (b): "
                            "coalesce the output or use a semel broker (mode a)")
        marks = offsets or {tp: batch for tp in parts}
        _join_and_offsets(r, o, st, [branch_id(o, batch, m.partition, m.attempt) for m in written], marks, meta)
        ph.mark("join_and_offsets")
        kill_if("commit:parent-offsets", batch)
        _decide(r, o, st)
        ph.mark("end_txn")
        kill_if("commit:decided", batch)
        # Mode (a): the parent's EndTxn has completed every joined branch already (the
        # broker's own doing, crash or not), so there is nothing to end one by one.
        for i, b in enumerate([] if o.atomic else branches):
            end_branch(r, o, batch, b)
            if i == 0:
                kill_if("commit:branch", batch)
        ph.mark("end_branches")
        fence_losers(r, o, batch, winners)
        ph.mark("fence_losers")
        ph.done(branches=len(written))


def _init_and_read(r: ClusterRouter, o: SinkOptions, parts: list[TP]) -> tuple[wire.TxnState, dict | None]:
    """InitProducerId of the parent, then the decision read. The InitProducerId goes
    first: it fences a zombie's parent and aborts one a killed run left open, so the read
    that follows finds settled offsets; for a batch decided already the new epoch is
    unused (the next batch's commit() takes another). Where one broker coordinates both
    the parent and the group, both go in one write; where that broker was still ending
    that parent, both are done again one at a time."""
    c = txn_coordinator(r, o, o.parent)
    if c is not group_coordinator(r, o):
        st = init_transaction(r, o, o.parent)
        return st, read_decision(r, o, parts)
    fetched = wire.committed_result(o.group)

    def read(resp):
        try:
            return fetched(resp)
        except ClientError as exc:
            return exc
    try:
        (err, st), got = wire.pipelined(c, (wire.init_producer_id_call(o.parent, o.restart_window_ms),
                                            wire.init_producer_id_result(o.parent)),
                                        (wire.committed_call(o.group, parts), read))
    except BROKEN:
        reset_connections(r)
        err, got = KafkaError.NETWORK_EXCEPTION, None
    if err != KafkaError.NONE or isinstance(got, ClientError):
        r.seen(err, coordinator=(o.parent, TRANSACTION))
        done = read_decision(r, o, parts)
        return init_transaction(r, o, o.parent), done
    return st, _decision_in(o, got)


def _join_and_offsets(r: ClusterRouter, o: SinkOptions, st: wire.TxnState, branch_ids: list[str],
                      marks: dict[TP, int], meta: str) -> None:
    """Mode (a): join the branches; then AddOffsetsToTxn and TxnOffsetCommit of the
    batch's offsets with the decision metadata, all in one write where one broker
    coordinates the parent and the group (it handles them in order). What failed is done
    again one at a time, with its retries; nothing here is the decision (EndTxn is), so a
    failure leaves at most an open parent."""
    c = txn_coordinator(r, o, o.parent)
    if c is not group_coordinator(r, o):
        join_branches(r, o, st, branch_ids)
        _offsets(r, o, st, marks, meta)
        return
    join = o.atomic and bool(branch_ids)
    calls = [(wire.add_partitions_call(c, st, [atomic.pseudo_partition(b) for b in branch_ids]),
              wire.add_partitions_result)] if join else []
    calls += [(wire.add_offsets_call(st, o.group), wire.error_result),
              (wire.txn_offset_commit_call(c, st, o.group, marks, meta), wire.txn_offset_commit_result)]
    try:
        got = wire.pipelined(c, *calls)
    except BROKEN:
        reset_connections(r)   # each again on its own, with its retries (a resend of what it did changes nothing)
        join_branches(r, o, st, branch_ids)
        _offsets(r, o, st, marks, meta)
        return
    joined = got.pop(0) if join else {}
    if any(e != KafkaError.NONE for e in joined.values()):
        join_branches(r, o, st, branch_ids)
    added, errs = got
    if added != KafkaError.NONE or any(e != KafkaError.NONE for e in errs.values()):
        _offsets(r, o, st, marks, meta)


def _offsets(r: ClusterRouter, o: SinkOptions, st: wire.TxnState, marks: dict[TP, int], meta: str) -> None:
    """AddOffsetsToTxn (the parent's coordinator), then TxnOffsetCommit (the group's)."""
    err = retrying(o, "AddOffsetsToTxn",
                   lambda: on_txn_coordinator(r, o, o.parent, lambda c: wire.add_offsets(c, st, o.group)))
    require_ok(err, "AddOffsetsToTxn")
    box: dict = {}

    def commit() -> KafkaError:
        box["errs"] = wire.txn_offset_commit(group_coordinator(r, o), st, o.group, marks, meta)
        bad = [e for e in box["errs"].values() if e != KafkaError.NONE]
        return r.seen(bad[0], coordinator=(o.group, GROUP)) if bad else KafkaError.NONE
    require_ok(retrying(o, "TxnOffsetCommit", lambda: resending(r, commit)), "TxnOffsetCommit")
    bad = {tp: e for tp, e in box["errs"].items() if e != KafkaError.NONE}
    if bad:
        raise SinkError(f"semel sink: TxnOffsetCommit: {', '.join(f'{t}-{p} {e.name}' for (t, p), e in bad.items())}")


def _decide(r: ClusterRouter, o: SinkOptions, st: wire.TxnState) -> None:
    """EndTxn(commit) of the parent: the batch's durable decision."""
    call = (wire.end_txn_call(o.parent, st.pid, st.epoch, True), wire.error_result)
    err = resending(r, lambda: wire.pipelined(txn_coordinator(r, o, o.parent), call)[0])
    if err != KafkaError.NONE:
        r.seen(err, coordinator=(o.parent, TRANSACTION))
        require_ok(retrying(o, "EndTxn", lambda: end_transaction(r, o, o.parent, st.pid, st.epoch, True)),
                   f"EndTxn {o.parent}")


def _loser_ids(o: SinkOptions, batch: int, winners: list[BranchMessage]) -> list[str]:
    """Where the broker cannot list transactions by id (see _open_branches): the losing
    attempts' ids guessed from the winners' attempt numbers, one past the highest
    winner covering a speculative copy that lost."""
    return [branch_id(o, batch, m.partition, attempt) for m in winners
            for attempt in range(0, m.attempt + 2) if attempt != m.attempt]


def _known(r: ClusterRouter, o: SinkOptions, ids: list[str]) -> list[str]:
    """The guessed losers worth fencing. A semel broker (mode a) answers
    DescribeTransactions: an id it has never seen holds no rows, and fencing it would
    only add a coordinator record. Mode (b) keeps to the APIs every broker has and
    fences them all."""
    if not (o.atomic and ids):
        return ids
    try:
        resp = txn_coordinator(r, o, o.parent).request(ApiKey.DESCRIBE_TRANSACTIONS, transactional_ids=list(ids))
    except BROKEN:
        reset_connections(r)
        return ids   # fencing an id never seen costs a record, nothing more
    unknown = {t.transactional_id for t in resp.transaction_states
               if KafkaError(t.error_code) == KafkaError.TRANSACTIONAL_ID_NOT_FOUND}
    return [i for i in ids if i not in unknown]


def _branch_pattern(o: SinkOptions) -> str:
    """A regular expression (Java's and Python's alike) matching this query's branch ids,
    the batch number in its first group (see branch_id, atomic.branch_name)."""
    return "^" + re.escape(f"{o.parent}.b") + r"([0-9]+)\.p[0-9]+\.a[0-9]+\."


def _open_branches(r: ClusterRouter, o: SinkOptions, batches: Callable[[int], bool]) -> list[str] | None:
    """The ids of this query's branches still open (Ongoing) whose batch number passes
    `batches`, from ListTransactions with an id pattern (KIP-1152: semel, Kafka 4.1+) on
    the parent's coordinator (a branch hashes like its parent); None where the broker
    cannot filter by id."""
    c = txn_coordinator(r, o, o.parent)
    try:
        if c.version(ApiKey.LIST_TRANSACTIONS) < 2:
            return None
    except ClientError:
        return None   # no ListTransactions at all (Tansu 0.6)
    try:
        resp = c.request(ApiKey.LIST_TRANSACTIONS, state_filters=["Ongoing"], producer_id_filters=[],
                         duration_filter=-1, transactional_id_pattern=_branch_pattern(o))
    except BROKEN:
        reset_connections(r)
        return None   # the losers are guessed instead
    if resp.error_code != KafkaError.NONE:
        return None
    pattern = re.compile(_branch_pattern(o))
    out = []
    for t in resp.transaction_states:
        m = pattern.match(t.transactional_id)
        if m is not None and batches(int(m.group(1))):
            out.append(t.transactional_id)
    return out


def _fence_all(r: ClusterRouter, o: SinkOptions, txn_ids: list[str]) -> None:
    """InitProducerId of every id in one write (each aborts what that id left open); an
    id not answered NONE is fenced again on its own, with retries."""
    if not txn_ids:
        return
    try:
        got = wire.pipelined(txn_coordinator(r, o, o.parent), *[(wire.init_producer_id_call(t, o.restart_window_ms),
                                                      wire.init_producer_id_result(t)) for t in txn_ids])
    except BROKEN:
        reset_connections(r)
        got = [(KafkaError.NETWORK_EXCEPTION, None)] * len(txn_ids)
    for txn_id, (err, _) in zip(txn_ids, got):
        if err != KafkaError.NONE:
            fence_transaction(r, o, txn_id)


def fence_losers(r: ClusterRouter, o: SinkOptions, batch: int, winners: list[BranchMessage],
                  earlier: bool = True) -> None:
    """After `batch` is decided and its winners ended: abort every branch of it still
    open, whatever its attempt number (failed, speculative and killed attempts: an open
    one would hold back read_committed readers of its partitions until its timeout),
    and with `earlier` every branch of an earlier batch left open too (a copy killed
    after that batch's decision, or by a crash of an earlier run). Branches of later
    batches are being written now and are left alone. Where the broker cannot list
    them, the losers are guessed from the attempt numbers (_loser_ids, _known)."""
    keep = {branch_id(o, batch, m.partition, m.attempt) for m in winners}
    found = _open_branches(r, o, (lambda b: b <= batch) if earlier else (lambda b: b == batch))
    if found is None:
        found = _known(r, o, _loser_ids(o, batch, winners))
    _fence_all(r, o, [t for t in found if t not in keep])


def join_branches(r: ClusterRouter, o: SinkOptions, st: wire.TxnState, branch_ids: list[str]) -> None:
    """Mode (a): the parent's EndTxn will decide these branches in one record
    (their own EndTxn afterwards only confirms it)."""
    if not o.atomic:
        return
    try:
        atomic.join(lambda: txn_coordinator(r, o, st.txn_id), st, branch_ids,
                    time.monotonic() + o.request_timeout_ms / 1000,
                    moved=lambda err: r.seen(err, coordinator=(route_key(o, st.txn_id), TRANSACTION)),
                    lost=lambda: reset_connections(r))
    except atomic.AtomicError as exc:
        raise SinkError(f"semel sink: {exc}") from None


def _roll_forward(r: ClusterRouter, o: SinkOptions, done: dict, batch: int, winners: list[BranchMessage]) -> None:
    recorded = {(b[0], b[1]) for b in done.get("branches", [])} if done["batch"] == batch else set()
    if done["batch"] == batch:
        for b in done["branches"]:
            end_branch(r, o, batch, b)
    # This replay's own branches lost (the batch was decided without them), as did every
    # other branch of it or of an earlier batch still open.
    _fence_all(r, o, [branch_id(o, batch, m.partition, m.attempt) for m in winners
                      if (m.partition, m.attempt) not in recorded])
    if done["batch"] == batch:
        fence_losers(r, o, batch, [BranchMessage(b[0], b[1]) for b in done.get("branches", [])])


def abort_batch(o: SinkOptions, messages, batch: int) -> None:
    with connect(o) as r:
        for m in messages:
            if isinstance(m, BranchMessage) and not m.skipped and m.pid >= 0:
                fence_transaction(r, o, branch_id(o, batch, m.partition, m.attempt))
