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
inter-broker client), one request at a time on it. The client id names the sender as
a coordinator so the receiving handler takes the coordinator path, not the admin-abort
one; the request still needs CLUSTER_ACTION like any WriteTxnMarkers.
"""
from __future__ import annotations

import asyncio
import logging

from ..protocol.errors import KafkaError
from ..protocol.messages import request_class
from .peer import PeerConnection, PeerError

log = logging.getLogger("semel.cluster.txn_markers")

CLIENT_PREFIX = "semel-txn-coordinator-"
_VERSION = 1
# Leaders answer after waiting up to their request timeout for the high watermark;
# the connection waits a little longer so that answer, not our timeout, decides.
_SLACK_S = 5.0


def is_coordinator_client(client_id: str | None) -> bool:
    return bool(client_id) and client_id.startswith(CLIENT_PREFIX)


def local_leader(view, node_id: int, tp: tuple[str, int]) -> bool:
    """Does this broker lead tp now (so the marker is written here)?"""
    st = view.partition(*tp)
    return st is not None and st.leader == node_id


class MarkerChannel:
    def __init__(self, view, node_id: int, timeout_s: float):
        self.view = view
        self.node_id = node_id
        self.timeout_s = timeout_s
        self._conns: dict[int, PeerConnection] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    def leads_here(self, tp: tuple[str, int]) -> bool:
        return local_leader(self.view, self.node_id, tp)

    async def write(self, tp: tuple[str, int], commit: bool, producer_id: int, producer_epoch: int,
                    coordinator_epoch: int) -> KafkaError:
        """Write one marker through tp's current leader (another broker); NONE once it is replicated."""
        st = self.view.partition(*tp)
        if st is None:
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        info = self.view.brokers().get(st.leader)
        if st.leader < 0 or info is None:
            return KafkaError.LEADER_NOT_AVAILABLE
        M = request_class(27).WritableTxnMarker
        marker = M(producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
                   topics=[M.WritableTxnMarkerTopic(name=tp[0], partition_indexes=[tp[1]])],
                   coordinator_epoch=coordinator_epoch)
        lock = self._locks.setdefault(st.leader, asyncio.Lock())
        async with lock:
            try:
                conn = await self._connection(st.leader, info)
                resp = await conn.call(27, _VERSION, self.timeout_s + _SLACK_S, markers=[marker])
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, PeerError) as exc:
                log.info("markers to broker %d: %s; will retry", st.leader, exc or type(exc).__name__)
                self._drop(st.leader)
                return KafkaError.NETWORK_EXCEPTION
        return _partition_error(resp, tp)

    async def _connection(self, node: int, info) -> PeerConnection:
        conn = self._conns.get(node)
        if conn is None:
            conn = await PeerConnection.open(info.host, info.port, f"{CLIENT_PREFIX}{self.node_id}")
            self._conns[node] = conn
        return conn

    def _drop(self, node: int) -> None:
        conn = self._conns.pop(node, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for node in list(self._conns):
            self._drop(node)


def _partition_error(resp, tp: tuple[str, int]) -> KafkaError:
    for m in resp.markers or ():
        for t in m.topics or ():
            for p in t.partitions or ():
                if t.name == tp[0] and p.partition_index == tp[1]:
                    return KafkaError(p.error_code)
    return KafkaError.UNKNOWN_SERVER_ERROR   # the leader did not answer for tp
