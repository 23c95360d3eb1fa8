"""The transaction coordinator's side of WriteTxnMarkers (API 27) between brokers.

A marker must be written by the partition's CURRENT leader: a follower's log refuses
local writes, and a marker written anywhere else would never reach the replicas. For
each partition the coordinator asks the cluster view who leads it; when that is
another broker, the marker travels there in a WriteTxnMarkers request and the leader
answers once the marker is durable and replicated (acks=all, like Kafka). Any error
(NOT_LEADER_OR_FOLLOWER after a leader change, a lost connection, a timeout) is
returned as a value; the coordinator keeps the transaction pending and retries, so a
Prepare* transaction completes only when every partition holds its marker.

One connection per destination broker (semel.cluster.peer, the data plane's
inter-broker client, on the inter-broker listener with its TLS and login), one
request at a time on it. The client id names the sender as
a coordinator so the receiving handler takes the coordinator path, not the admin-abort
one; the request still needs CLUSTER_ACTION like any WriteTxnMarkers.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..backoff import FailureLog
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..protocol.messages import request_class
from .peer import PeerAuthError, PeerConnection, PeerDialer, PeerError
from .state import BrokerInfo, ClusterView

log = logging.getLogger("semel.cluster.txn_markers")

CLIENT_PREFIX = "semel-txn-coordinator-"
_VERSION = 1
# Leaders answer after waiting up to their request timeout for the high watermark;
# the connection waits a little longer so that answer, not our timeout, decides.
_SLACK_S = 5.0

# One marker: (producer id, producer epoch, commit, coordinator epoch).
_MarkerKey = tuple[int, int, bool, int]
# Markers queued for one partition, and the future their answer goes to.
_Queued = tuple[list[_MarkerKey], tuple[str, int], "asyncio.Future[KafkaError]"]


def is_coordinator_client(client_id: str | None) -> bool:
    return client_id is not None and client_id.startswith(CLIENT_PREFIX)


def local_leader(view: ClusterView, node_id: int, tp: tuple[str, int]) -> bool:
    """Does this broker lead tp now (so the marker is written here)?"""
    st = view.partition(*tp)
    return st is not None and st.leader == node_id


def partition_gone(view: ClusterView, tp: tuple[str, int]) -> bool:
    """Was tp's topic deleted (or created again with fewer partitions)? Then no marker is
    left to write there, as Kafka's coordinator drops markers of deleted partitions. A
    topic the view does not know at all is not gone: the view may only lag."""
    live = view.topics().get(tp[0])
    if live is not None:
        partitions: int = live.partitions
        return tp[1] >= partitions
    return tp[0] in view.deleted_topics()


class MarkerChannel:
    def __init__(self, view: ClusterView, node_id: int, timeout_s: float, dialer: PeerDialer | None = None):
        self.view = view
        self.node_id = node_id
        self.timeout_s = timeout_s
        self.dialer = dialer or PeerDialer()   # the inter-broker listener and login
        self._conns: dict[int, PeerConnection] = {}
        # Markers waiting for the next request to each broker, and that broker's sender.
        self._queued: dict[int, list[_Queued]] = {}
        self._senders: dict[int, asyncio.Task[None]] = {}
        # A broker unreachable for minutes (killed, cut off) gets a line at its first
        # failure and a count now and then, not a line per retry.
        self._unreachable: dict[int, FailureLog] = {}

    def leads_here(self, tp: tuple[str, int]) -> bool:
        return local_leader(self.view, self.node_id, tp)

    async def write(self, tp: tuple[str, int], commit: bool, producers: list[tuple[int, int]],
                    coordinator_epoch: int) -> KafkaError:
        """Write the markers of `producers` ((producer id, epoch) each: a decision's parent
        and branches) through tp's current leader (another broker), which appends them in
        one write; NONE once they are replicated.

        Markers asked for while a request to the same broker is in flight go together
        in the next one (Kafka sends one WriteTxnMarkers per broker), so a transaction's
        partitions on one broker cost one round trip, not one each."""
        st = self.view.partition(*tp)
        if st is None:
            return KafkaError.NONE if partition_gone(self.view, tp) else KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        if st.leader < 0 or st.leader not in self.view.brokers():
            return KafkaError.LEADER_NOT_AVAILABLE
        done: asyncio.Future[KafkaError] = asyncio.get_running_loop().create_future()
        keys = [(pid, epoch, commit, coordinator_epoch) for pid, epoch in producers]
        self._queued.setdefault(st.leader, []).append((keys, tp, done))
        if st.leader not in self._senders:
            task = asyncio.create_task(self._send_queued(st.leader), name=f"txn-markers-{st.leader}")
            self._senders[st.leader] = task
        return await done

    async def _send_queued(self, node: int) -> None:
        batch: list[_Queued] = []
        try:
            while self._queued.get(node):
                batch = self._queued.pop(node)
                _resolve(batch, await self._send_guarded(node, batch), KafkaError.UNKNOWN_SERVER_ERROR)
        finally:
            self._senders.pop(node, None)
            # Cancelled: nobody sends these now. The batch in flight is among them, or
            # its transactional id would answer CONCURRENT_TRANSACTIONS until unload.
            _resolve(batch + self._queued.pop(node, []), {}, KafkaError.NETWORK_EXCEPTION)

    async def _send_guarded(self, node: int, batch: list[_Queued]) -> dict[tuple[str, int], KafkaError]:
        """_send, with a failure it does not expect turned into an error for each marker:
        the coordinator retries a marker that failed, but waits for ever on one never answered."""
        try:
            return await self._send(node, batch)
        except Exception:
            log.exception("markers to broker %d failed unexpectedly; will retry", node)
            self._drop(node)   # the connection may be mid-answer: start the next request afresh
            return {}

    async def _send(self, node: int, batch: list[_Queued]) -> dict[tuple[str, int], KafkaError]:
        info = self.view.brokers().get(node)
        if info is None:
            return {tp: KafkaError.LEADER_NOT_AVAILABLE for _, tp, _ in batch}
        try:
            resp = await self._call(node, info, _request_markers(batch))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, PeerError) as exc:
            if not isinstance(exc, PeerAuthError):   # (the dialer logs refusals, once a minute)
                self._failure_log(node).failed(exc or type(exc).__name__)
            self._drop(node)
            return {tp: KafkaError.NETWORK_EXCEPTION for _, tp, _ in batch}
        self._failure_log(node).succeeded()
        errors = _partition_errors(resp)
        if KafkaError.CLUSTER_AUTHORIZATION_FAILED in errors.values():
            self.dialer.refused(node, "markers denied: the inter-broker principal needs ClusterAction "
                                      "on the cluster (a super user)")
        return errors

    def _failure_log(self, node: int) -> FailureLog:
        if node not in self._unreachable:
            self._unreachable[node] = FailureLog(log, f"markers to broker {node}")
        return self._unreachable[node]

    async def _call(self, node: int, info: BrokerInfo, markers: list[object]) -> Any:
        # Any: a decoded WriteTxnMarkers answer (kafka-python's message classes are untyped).
        """WriteTxnMarkers on the connection to `node`. A kept connection the peer has
        closed since (idle past its connections.max.idle.ms, or restarted) is replaced
        before use; one found closed only by this send is replaced and the request sent
        once more, so an idle gap costs the transaction no retry round (and its client
        no CONCURRENT_TRANSACTIONS). Sending again is safe: a marker is idempotent (a
        repeat ends no further transaction and indexes no aborted range,
        PartitionLog.append_control), and no new transaction of the producer can start
        on the partition before this one completes."""
        fresh = node not in self._conns or not self._conns[node].usable()
        conn = await self._connection(node, info)
        try:
            return await conn.call(ApiKey.WRITE_TXN_MARKERS, _VERSION, self.timeout_s + _SLACK_S, markers=markers)
        except (ConnectionError, asyncio.IncompleteReadError):
            if fresh:
                raise
        self._drop(node)
        conn = await self._connection(node, info)
        return await conn.call(ApiKey.WRITE_TXN_MARKERS, _VERSION, self.timeout_s + _SLACK_S, markers=markers)

    async def _connection(self, node: int, info: BrokerInfo) -> PeerConnection:
        conn = self._conns.get(node)
        if conn is not None and not conn.usable():
            self._drop(node)
            conn = None
        if conn is None:
            conn = await self.dialer.connect(info, f"{CLIENT_PREFIX}{self.node_id}")
            self._conns[node] = conn
        return conn

    def _drop(self, node: int) -> None:
        conn = self._conns.pop(node, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for task in list(self._senders.values()):
            task.cancel()
        for node in list(self._conns):
            self._drop(node)


def _resolve(batch: list[_Queued], errors: dict[tuple[str, int], KafkaError], missing: KafkaError) -> None:
    """Answer each marker of batch not answered yet: its error, or `missing` when none was given."""
    for _, tp, done in batch:
        if not done.done():
            done.set_result(errors.get(tp, missing))


def _request_markers(batch: list[_Queued]) -> list[object]:
    """One WritableTxnMarker per (producer id, epoch, result, coordinator epoch), its partitions by topic."""
    M = request_class(ApiKey.WRITE_TXN_MARKERS).WritableTxnMarker
    by_marker: dict[_MarkerKey, dict[str, list[int]]] = {}
    for keys, (topic, partition), _ in batch:
        for key in keys:
            parts = by_marker.setdefault(key, {}).setdefault(topic, [])
            if partition not in parts:
                parts.append(partition)
    return [M(producer_id=pid, producer_epoch=epoch, transaction_result=commit, coordinator_epoch=cepoch,
              topics=[M.WritableTxnMarkerTopic(name=t, partition_indexes=ps) for t, ps in topics.items()])
            for (pid, epoch, commit, cepoch), topics in by_marker.items()]


def _partition_errors(resp: Any) -> dict[tuple[str, int], KafkaError]:
    """Per partition, the worst answer (a partition named under two markers of one request)."""
    out: dict[tuple[str, int], KafkaError] = {}
    for m in resp.markers or ():
        for t in m.topics or ():
            for p in t.partitions or ():
                tp = (t.name, p.partition_index)
                if not out.get(tp):
                    out[tp] = KafkaError(p.error_code)
    return out
