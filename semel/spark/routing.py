"""The exactly-once sink's requests routed as a Kafka producer routes them
(semel.client.cluster.ClusterRouter): transaction requests to the transactional id's
coordinator, offsets and the decision read to the group's coordinator, Produce to each
partition's leader; their retries, and the ACL an authorization error names.
"""
from __future__ import annotations

import time

from semel.backoff import Backoff
from semel.client.client import CONNECTION_BROKEN, Client, ClientError
from semel.client import txn as wire
from semel.client.cluster import GROUP, TRANSACTION, ClusterRouter
from semel.protocol.errors import KafkaError
from semel.protocol.txn_hash import java_string_hash
from semel.spark import pool
from semel.spark.sink_options import TP, SinkError, SinkOptions

def _open(o: SinkOptions) -> ClusterRouter:
    try:
        return ClusterRouter(o.bootstrap, timeout_s=o.request_timeout_ms / 1000, client_id=o.producer.client_id,
                       topics=[o.topic] if o.topic else [], fail_fast=True, security=o.security)
    except ClientError as exc:
        raise SinkError(f"semel sink: {exc}") from None


def _usable(r: ClusterRouter) -> bool:
    r.drop_closed()  # connections a broker closed meanwhile are reopened when next needed
    return True


def connect(o: SinkOptions):
    """The connections to the cluster's brokers for one write() or commit(), kept by the
    worker for the next one (semel.spark.pool)."""
    return pool.borrow(("sink", o.bootstrap, o.request_timeout_ms, o.security, o.producer.client_id),
                       lambda: _open(o), _usable, ClusterRouter.close)


BROKEN = CONNECTION_BROKEN


def resending(r: ClusterRouter, step) -> KafkaError:
    """step() -> KafkaError, a connection broken mid-request answered NETWORK_EXCEPTION
    (retriable: the caller's retry loop sends the request again, on new connections).
    Only for requests a resend of which the broker deduplicates or that change nothing
    twice: Produce (same producer id, epoch and sequence), AddPartitionsToTxn,
    AddOffsetsToTxn and TxnOffsetCommit (same epoch), EndTxn (an ended transaction
    answers its own outcome again), InitProducerId of an id whose open transaction is
    to be aborted anyway, and reads."""
    try:
        return step()
    except BROKEN:
        reset_connections(r)
        return KafkaError.NETWORK_EXCEPTION


def reset_connections(r: ClusterRouter) -> None:
    """After a broken request: every connection closed, since a write that went to
    several (a pipelined round) may have left answers unread on any of them; the
    routes stay cached and the connections are opened again when next used."""
    r.close()


def _routed(get, o: SinkOptions | None = None):
    try:
        return get()
    except ClientError as exc:
        needed = _needed(o, exc.error) if o is not None else None
        raise SinkError(f"semel sink: {exc}" + (f"; the user needs {needed}" if needed else "")) from None


def route_key(o: SinkOptions, txn_id: str) -> str:
    """The id whose coordinator serves txn_id. In mode (a) a branch's is its parent's:
    semel coordinates ids that hash alike on one partition and the sink's branch ids hash
    like the parent (atomic.branch_name), so no FindCoordinator per branch. In mode (b)
    each id is asked for on its own (a foreign broker may place ids another way)."""
    if o.atomic and txn_id != o.parent and java_string_hash(txn_id) == java_string_hash(o.parent):
        return o.parent
    return txn_id


def txn_coordinator(r: ClusterRouter, o: SinkOptions, txn_id: str) -> Client:
    """The connection to txn_id's transaction coordinator."""
    key = route_key(o, txn_id)
    return _routed(lambda: r.coordinator(key, TRANSACTION), o)


def group_coordinator(r: ClusterRouter, o: SinkOptions) -> Client:
    """The connection to the query's group coordinator (offsets and the decision)."""
    return _routed(lambda: r.coordinator(o.group, GROUP), o)


def partition_leader(r: ClusterRouter, tp: TP) -> Client:
    return _routed(lambda: r.leader(tp))


def retry_rounds(o: SinkOptions, step) -> KafkaError:
    """step() -> (error, progressed), again until it returns NONE or an error that is not
    retriable, or the request timeout has passed since the last step that made progress
    (a long flush that keeps moving is not cut off by a deadline from its start)."""
    # this module's clock: the router model test runs these rounds on a fake one
    pace = Backoff(o.request_timeout_ms / 1000, clock=lambda: time.monotonic(), sleep=lambda s: time.sleep(s))
    while True:
        err, progressed = step()
        if err == KafkaError.NONE or not err.retriable:
            return err
        if progressed:
            pace.progress()
        elif pace.expired():
            return err
        pace.wait()


def retrying(o: SinkOptions, what: str, call) -> KafkaError:
    """Run call() -> KafkaError until it is not retriable or the request timeout has passed."""
    return retry_rounds(o, lambda: (call(), False))


def on_txn_coordinator(r: ClusterRouter, o: SinkOptions, txn_id: str, call) -> KafkaError:
    """call(connection) -> KafkaError on txn_id's coordinator; an answer saying it moved
    drops the cached one (the retry asks again)."""
    return r.seen(resending(r, lambda: call(txn_coordinator(r, o, txn_id))), coordinator=(route_key(o, txn_id), TRANSACTION))


def end_transaction(r: ClusterRouter, o: SinkOptions, txn_id: str, pid: int, epoch: int, commit: bool) -> KafkaError:
    return on_txn_coordinator(r, o, txn_id, lambda c: wire.end_txn(c, txn_id, pid, epoch, commit))


def require_ok(err: KafkaError, what: str) -> None:
    if err != KafkaError.NONE:
        raise SinkError(f"semel sink: {what}: {err.name}")


def _needed(o: SinkOptions, err: KafkaError | None) -> str | None:
    """The ACL an authorization error of the sink's calls says is missing (the list in
    docs/spark.md, Security)."""
    if err == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return f"Write on the transactional ids with prefix {o.parent!r}"
    if err == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return f"Read on the group {o.group!r}"
    if err == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return f"Write on the topic {o.topic!r}" if o.topic else "Write on the output topics"
    return None


def require_authorized(o: SinkOptions, err: KafkaError | None, what: str) -> None:
    needed = _needed(o, err)
    if needed is not None:
        raise SinkError(f"semel sink: not authorized: {what} was refused with {err.name}; "
                        f"the user needs {needed}")



def init_transaction_or_error(r: ClusterRouter, o: SinkOptions, txn_id: str) -> tuple[KafkaError, wire.TxnState | None]:
    """InitProducerId on txn_id's coordinator, retried while the broker is still ending
    the id's previous transaction (CONCURRENT_TRANSACTIONS) or the coordinator moves,
    within the request timeout."""
    box: dict = {"st": None}

    def call(c: Client) -> KafkaError:
        err, box["st"] = wire.init_producer_id(c, txn_id, o.restart_window_ms)
        return err
    return retrying(o, "InitProducerId", lambda: on_txn_coordinator(r, o, txn_id, call)), box["st"]


def init_transaction(r: ClusterRouter, o: SinkOptions, txn_id: str) -> wire.TxnState:
    err, st = init_transaction_or_error(r, o, txn_id)
    require_ok(err, f"InitProducerId {txn_id}")
    return st


def fence_transaction(r: ClusterRouter, o: SinkOptions, txn_id: str) -> None:
    """InitProducerId on a branch id: the broker aborts what it left open."""
    init_transaction(r, o, txn_id)
