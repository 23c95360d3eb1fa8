"""One view of a cluster, read over the Kafka protocol.

Every broker the cluster has named is asked for what it alone knows: a partition's
offsets and producers from its leader, the transactions and groups a broker
coordinates from that broker (ListTransactions and ListGroups answer with the
coordinator's own). A broker that does not answer is shown as down and what it
would have told is missing from the view, with the reason in plain words; the rest
of the view is still read.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..client import admin, share_admin
from ..client.client import Client, ClientError
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..protocol.messages import request_class

TP = tuple[str, int]
Connect = Callable[[str], Client]

# Coordinator states whose transaction still owns its partitions.
LIVE_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
EARLIEST, LATEST = -2, -1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1

# The admin APIs each page needs; a broker without one shows less, and the brokers page says so.
FEATURES = {ApiKey.LIST_TRANSACTIONS: "transactions", ApiKey.DESCRIBE_PRODUCERS: "producer state",
            ApiKey.LIST_GROUPS: "groups", ApiKey.CONSUMER_GROUP_DESCRIBE: "KIP-848 groups",
            ApiKey.DELETE_RECORDS: "delete records"}

# Kafka errors an operator meets here, in words.
_WORDS = {
    KafkaError.NOT_COORDINATOR: "this broker no longer coordinates it (it moved; the next refresh asks the new one)",
    KafkaError.COORDINATOR_NOT_AVAILABLE: "its coordinator is not available yet (a broker is starting or down)",
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS: "its coordinator is still loading its state",
    KafkaError.CONCURRENT_TRANSACTIONS: "the coordinator is still completing this transaction's markers",
    KafkaError.NOT_LEADER_OR_FOLLOWER: "leadership moved while the console asked",
    KafkaError.LEADER_NOT_AVAILABLE: "the partition has no leader right now",
    KafkaError.UNKNOWN_TOPIC_OR_PARTITION: "no such topic or partition (deleted, or not led here)",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "the console's user may not read this topic",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "the console's user lacks the cluster permission this needs",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "the console's user may not describe this transactional id",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "the console's user may not describe this group",
    KafkaError.NON_EMPTY_GROUP: "the group has live members (stop its consumers first)",
    KafkaError.INVALID_PRODUCER_EPOCH: "the producer's epoch moved on (the transaction ended meanwhile)",
}


def plain(err: KafkaError) -> str:
    """A Kafka error as an operator reads it: the words, then the code's name."""
    words = _WORDS.get(err)
    return f"{words} ({err.name})" if words else err.name


def explain(exc: BaseException) -> str:
    """A failed call in one line."""
    err = getattr(exc, "error", None)
    if isinstance(err, KafkaError) and err in _WORDS:
        return f"{exc} — {_WORDS[err]}"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


class Pool:
    """One connection per broker address, opened when first needed and dropped when a
    call on it fails (the next refresh opens it again)."""

    def __init__(self, connect: Connect):
        self.connect = connect
        self.conns: dict[str, Client] = {}

    def get(self, address: str) -> Client:
        c = self.conns.get(address)
        if c is not None and not c.idle_open():   # the broker closed it, or died, since the last read
            self.drop(address)
            c = None
        if c is None:
            c = self.conns[address] = self.connect(address)
        return c

    def call(self, address: str, op: Callable[[Client], object]):
        """op(connection); a failure closes that connection and raises on."""
        c = self.get(address)
        try:
            return op(c)
        except (ClientError, OSError) as exc:
            if getattr(exc, "error", None) is None:   # the connection broke, not a Kafka answer
                self.drop(address)
            raise

    def drop(self, address: str) -> None:
        c = self.conns.pop(address, None)
        if c is not None:
            c.close()

    def close(self) -> None:
        for address in list(self.conns):
            self.drop(address)


@dataclass
class BrokerRow:
    node_id: int
    address: str
    live: bool
    controller: bool = False
    registered: bool = True     # named by the cluster's Metadata
    error: str = ""
    apis: str = ""              # the admin APIs it serves (their highest versions)
    missing: tuple[str, ...] = ()


@dataclass
class PartitionRow:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    log_start: int = -1
    high_watermark: int = -1
    last_stable: int = -1
    error: str = ""
    min_insync: int = 0         # the topic's min.insync.replicas (0: unknown)

    @property
    def gap(self) -> int:
        """Records read_committed readers cannot reach yet: the high watermark past the LSO."""
        return max(0, self.high_watermark - self.last_stable) if self.last_stable >= 0 else 0

    @property
    def records(self) -> int:
        return max(0, self.high_watermark - self.log_start) if self.log_start >= 0 else 0

    @property
    def offline(self) -> bool:
        return self.leader < 0

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @property
    def below_min_insync(self) -> bool:
        """Fewer replicas than min.insync.replicas: every acks=all write is refused
        (NOT_ENOUGH_REPLICAS), for good, not only while a replica is away."""
        return len(self.replicas) < self.min_insync


@dataclass
class TxnRow:
    """An open transaction: one the coordinator holds, or producer state in a partition
    whose coordinator transaction is gone (transactional_id None)."""
    transactional_id: str | None
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int = 0
    start_ms: int = -1
    coordinator: int = -1
    partitions: tuple[TP, ...] = ()
    holds: dict[TP, int] = field(default_factory=dict)        # partition -> records held behind its LSO
    start_offsets: dict[TP, int] = field(default_factory=dict)
    coordinator_epoch: int = -1
    hanging: str = ""

    def age_s(self, now_ms: int) -> float:
        return max(0, now_ms - self.start_ms) / 1000 if self.start_ms >= 0 else 0.0

    @property
    def key(self) -> str:
        return self.transactional_id if self.transactional_id is not None else f"pid-{self.producer_id}"


@dataclass
class LagRow:
    topic: str
    partition: int
    committed: int
    high_watermark: int
    last_stable: int

    @property
    def lag(self) -> int:
        return max(0, self.high_watermark - self.committed) if self.high_watermark >= 0 else 0

    @property
    def lag_stable(self) -> int:
        return max(0, self.last_stable - self.committed) if self.last_stable >= 0 else 0


@dataclass
class GroupRow:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    group_type: str
    coordinator: int
    members: tuple[admin.GroupMember, ...] = ()
    lags: list[LagRow] = field(default_factory=list)
    error: str = ""
    # A share group's share-partitions (it commits no offsets): start offset, lag, window.
    share: list[tuple[tuple[str, int], share_admin.ShareOffset]] = field(default_factory=list)

    @property
    def lag(self) -> int:
        return sum(r.lag for r in self.lags) + sum(max(o.lag, 0) for _, o in self.share)


@dataclass
class Snapshot:
    time_ms: int
    cluster_id: str = ""
    controller: int = -1
    brokers: list[BrokerRow] = field(default_factory=list)
    partitions: list[PartitionRow] = field(default_factory=list)
    txns: list[TxnRow] = field(default_factory=list)
    groups: list[GroupRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def lso_gap(self) -> int:
        return sum(p.gap for p in self.partitions)

    @property
    def lag(self) -> int:
        return sum(g.lag for g in self.groups)

    def partition(self, topic: str, partition: int) -> PartitionRow | None:
        return next((p for p in self.partitions if (p.topic, p.partition) == (topic, partition)), None)


# --- reading ---------------------------------------------------------------------------------

def collect(pool: Pool, bootstrap: list[str], known: dict[int, str]) -> Snapshot:
    """One view of the cluster. known: brokers seen before ({node id: address}), kept so
    that one the cluster no longer names is shown as down rather than forgotten; it is
    updated with the brokers this view names."""
    snap = Snapshot(time_ms=int(time.time() * 1000))
    md = _metadata(pool, bootstrap + sorted(set(known.values())), snap)
    if md is None:
        snap.brokers = [BrokerRow(n, a, live=False, registered=False, error="no answer")
                        for n, a in sorted(known.items())]
        return snap
    snap.cluster_id = md.cluster_id or ""
    snap.controller = md.controller_id
    named = {b.node_id: f"{b.host}:{b.port}" for b in md.brokers}
    known.update(named)
    snap.brokers = [_broker(pool, n, a, n in named, md.controller_id) for n, a in sorted(known.items())]
    live = {b.node_id: b.address for b in snap.brokers if b.live}
    snap.partitions = [PartitionRow(t.name, p.partition_index, p.leader_id, tuple(p.replica_nodes),
                                    tuple(p.isr_nodes), tuple(p.offline_replicas or ()),
                                    error="" if not p.error_code else plain(KafkaError(p.error_code)))
                       for t in md.topics if not t.name.startswith("__") and not t.error_code
                       for p in t.partitions]
    snap.partitions.sort(key=lambda p: (p.topic, p.partition))
    by_leader: dict[str, list[PartitionRow]] = {}
    for p in snap.partitions:
        if p.leader in live:
            by_leader.setdefault(live[p.leader], []).append(p)
        elif not p.error:
            p.error = "no live leader"
    if live:
        _min_insync(pool, next(iter(live.values())), snap)
    producers: dict[TP, list[admin.ProducerInfo]] = {}
    for address, rows in by_leader.items():
        _offsets(pool, address, rows, snap)
        producers.update(_producers(pool, address, rows, snap))
    coordinated = [(n, d) for n, a in live.items() for d in _transactions_at(pool, a, snap)]
    snap.txns = open_transactions(coordinated, producers, snap)
    snap.groups = _groups(pool, live, snap)
    return snap


def _metadata(pool: Pool, addresses: list[str], snap: Snapshot):
    why = []
    for address in dict.fromkeys(addresses):
        try:
            return pool.call(address, lambda c: c.metadata(None))
        except (ClientError, OSError) as exc:
            why.append(f"{address}: {explain(exc)}")
    snap.errors.append("no broker answers: " + "; ".join(why))
    return None


def _min_insync(pool: Pool, address: str, snap: Snapshot) -> None:
    """Each topic's min.insync.replicas (DescribeConfigs), so the page can mark a topic
    whose replication factor can never satisfy it."""
    topics = sorted({p.topic for p in snap.partitions})
    try:
        configs = pool.call(address, lambda c: admin.topic_configs(c, topics, ["min.insync.replicas"]))
    except (ClientError, OSError) as exc:   # the page still shows the rest
        snap.errors.append(f"min.insync.replicas from {address}: {explain(exc)}")
        return
    for p in snap.partitions:
        value = configs.get(p.topic, {}).get("min.insync.replicas", "")
        p.min_insync = int(value) if value.isdigit() else 0


def _broker(pool: Pool, node: int, address: str, registered: bool, controller: int) -> BrokerRow:
    row = BrokerRow(node, address, live=False, controller=node == controller, registered=registered)
    try:
        c = pool.get(address)
    except (ClientError, OSError) as exc:
        row.error = explain(exc)
        return row
    row.live = True
    if not registered:
        row.error = "answers, but the cluster does not name it (not registered, or fenced)"
    row.apis = ", ".join(f"{ApiKey(k).name.title().replace('_', '')} v{c.versions[k]}"
                         for k in FEATURES if k in c.versions)
    row.missing = tuple(what for k, what in FEATURES.items() if k not in c.versions)
    return row


def _offsets(pool: Pool, address: str, rows: list[PartitionRow], snap: Snapshot) -> None:
    """Log start, high watermark and LSO of the partitions `address` leads: three
    ListOffsets (earliest; latest; latest under read_committed, which is the LSO)."""
    by_tp = {(p.topic, p.partition): p for p in rows}
    for spec, isolation, attr in ((EARLIEST, READ_UNCOMMITTED, "log_start"), (LATEST, READ_UNCOMMITTED, "high_watermark"),
                                  (LATEST, READ_COMMITTED, "last_stable")):
        try:
            got = pool.call(address, lambda c: list_offsets(c, list(by_tp), spec, isolation))
        except (ClientError, OSError) as exc:
            snap.errors.append(f"offsets from {address}: {explain(exc)}")
            return
        for tp, (err, offset) in got.items():
            if err:
                by_tp[tp].error = plain(err)
            else:
                setattr(by_tp[tp], attr, offset)


def list_offsets(c: Client, tps: list[TP], spec: int, isolation: int) -> dict[TP, tuple[KafkaError, int]]:
    T = request_class(ApiKey.LIST_OFFSETS).ListOffsetsTopic
    topics: dict[str, list[int]] = {}
    for t, p in tps:
        topics.setdefault(t, []).append(p)
    resp = c.request(ApiKey.LIST_OFFSETS, replica_id=-1, isolation_level=isolation, topics=[
        T(name=t, partitions=[T.ListOffsetsPartition(partition_index=p, current_leader_epoch=-1, timestamp=spec)
                              for p in ps]) for t, ps in topics.items()])
    return {(t.name, p.partition_index): (KafkaError(p.error_code), p.offset) for t in resp.topics for p in t.partitions}


def _producers(pool: Pool, address: str, rows: list[PartitionRow], snap: Snapshot) -> dict[TP, list[admin.ProducerInfo]]:
    tps = [(p.topic, p.partition) for p in rows]
    try:
        if ApiKey.DESCRIBE_PRODUCERS not in pool.get(address).versions:
            return {}
        return pool.call(address, lambda c: admin.describe_producers(c, tps))
    except (ClientError, OSError) as exc:
        snap.errors.append(f"producer state from {address}: {explain(exc)}")
        return {}


def _transactions_at(pool: Pool, address: str, snap: Snapshot) -> list[admin.TxnDescription]:
    def read(c: Client) -> list[admin.TxnDescription]:
        if ApiKey.LIST_TRANSACTIONS not in c.versions:
            return []
        listed = admin.list_transactions(c, states=list(LIVE_STATES))
        return [d for d in admin.describe_transactions(c, [t.transactional_id for t in listed])
                if d.error == KafkaError.NONE and d.state in LIVE_STATES]
    try:
        return pool.call(address, read)
    except (ClientError, OSError) as exc:
        snap.errors.append(f"transactions at {address}: {explain(exc)}")
        return []


def open_transactions(coordinated: list[tuple[int, admin.TxnDescription]],
                      producers: dict[TP, list[admin.ProducerInfo]], snap: Snapshot) -> list[TxnRow]:
    """The coordinators' open transactions, and the open producer state no coordinator
    transaction owns, each with the partitions whose LSO it holds back. Hanging, as
    KIP-664 has it: open past its timeout, or producer state without a coordinator
    transaction (nothing will ever write its marker)."""
    rows = {d.producer_id: TxnRow(d.transactional_id, d.producer_id, d.producer_epoch, d.state, d.timeout_ms,
                                  d.start_time_ms, node, d.partitions)
            for node, d in coordinated}
    orphans: dict[int, TxnRow] = {}
    for tp, states in producers.items():
        for s in states:
            if s.txn_start_offset < 0:
                continue
            row = rows.get(s.producer_id)
            if row is None or tp not in row.partitions:
                row = orphans.setdefault(s.producer_id, TxnRow(
                    None, s.producer_id, s.producer_epoch, "no coordinator transaction",
                    start_ms=s.last_timestamp, hanging="open in a partition, but no coordinator "
                                                       "transaction owns it: nothing will end it"))
                row.partitions = tuple(sorted(set(row.partitions) | {tp}))
            row.start_offsets[tp] = s.txn_start_offset
            row.coordinator_epoch = s.coordinator_epoch
            p = snap.partition(*tp)
            if p is not None and p.last_stable == s.txn_start_offset and p.gap:
                row.holds[tp] = p.gap
    now = snap.time_ms
    for row in rows.values():
        if row.transactional_id is not None and row.start_ms >= 0 and now - row.start_ms > row.timeout_ms:
            row.hanging = f"open {row.age_s(now):.0f} s, past its {row.timeout_ms / 1000:g} s timeout"
    return sorted([*rows.values(), *orphans.values()], key=lambda r: (r.start_ms, r.key))


def _groups(pool: Pool, live: dict[int, str], snap: Snapshot) -> list[GroupRow]:
    out: dict[str, GroupRow] = {}
    for node, address in live.items():
        try:
            listed = pool.call(address, lambda c: admin.list_groups(c) if ApiKey.LIST_GROUPS in c.versions else [])
            descs = pool.call(address, lambda c: admin.describe_groups(c, [g[0] for g in listed])) if listed else []
        except (ClientError, OSError) as exc:
            snap.errors.append(f"groups at {address}: {explain(exc)}")
            continue
        for d in descs:
            if d.error in (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE) or d.group_id in out:
                continue
            g = out[d.group_id] = GroupRow(d.group_id, d.state, d.protocol_type, d.protocol, d.group_type, node,
                                           d.members, error="" if not d.error else plain(d.error))
            try:
                if d.group_type == "share":
                    g.share = sorted(pool.call(address, lambda c: share_admin.share_start_offsets(c, d.group_id))
                                     .items())
                    continue
                committed = pool.call(address, lambda c: admin.fetch_offsets(c, d.group_id))
            except (ClientError, OSError) as exc:
                g.error = explain(exc)
                continue
            for (topic, partition), offset in sorted(committed.items()):
                p = snap.partition(topic, partition)
                g.lags.append(LagRow(topic, partition, offset, p.high_watermark if p else -1,
                                     p.last_stable if p else -1))
    return sorted(out.values(), key=lambda g: g.group_id)
