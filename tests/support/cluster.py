"""A local cluster (etcd + broker processes) for a whole test module, and reading
its state over the wire as clients see it."""
from __future__ import annotations

from contextlib import contextmanager

from semel.client.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError

from .txn import call
from .wait import until


@contextmanager
def module_cluster(tmp_path_factory, name: str, nodes: int = 3, lease_ttl_s: int = 2, *broker_args: str):
    """A started LocalCluster whose brokers all see each other; stopped and removed after."""
    from semel.launch.local_cluster import LocalCluster
    c = LocalCluster(tmp_path_factory.mktemp(name), nodes, lease_ttl_s=lease_ttl_s, broker_args=list(broker_args))
    try:
        c.start()
        wait_brokers(c, set(range(nodes)))
        yield c
    finally:
        c.stop()
        c.close()


def metadata(cluster, topics=None):
    """Metadata from the first live broker that answers."""
    md = cluster.metadata(topics)
    assert md is not None, "no broker answers Metadata"
    return md


def agreed(values) -> tuple | None:
    """(v,) when every value is the same v (0 included), else None; for until(). The
    controller all brokers name is the seat's holder: one that knows none names another."""
    distinct = set(values)
    return (distinct.pop(),) if len(distinct) == 1 else None


def partitions(cluster, topic: str) -> dict[int, tuple]:
    """{partition: (leader, leader_epoch, replicas, isr)} as Metadata reports them."""
    (t,) = metadata(cluster, [topic]).topics
    return {p.partition_index: (p.leader_id, p.leader_epoch, tuple(p.replica_nodes), tuple(p.isr_nodes))
            for p in t.partitions}


def create_replicated(cluster, topics, parts: int) -> None:
    """Topics of `parts` partitions, replication factor 3, min.insync.replicas 2."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futs = admin.create_topics([NewTopic(t, parts, 3, config={"min.insync.replicas": "2"}) for t in topics])
    for f in futs.values():
        f.result(30)


def all_led(cluster, topics, full_isr: bool = False) -> bool:
    """Every partition of `topics` has a leader (and, with full_isr, all three in sync)."""
    for topic in topics:
        try:
            parts = partitions(cluster, topic)
        except (AssertionError, ValueError):
            return False
        if not parts or any(p[0] < 0 or (full_isr and len(p[3]) != 3) for p in parts.values()):
            return False
    return True


def wait_brokers(cluster, nodes: set[int]) -> None:
    """Until every live broker lists exactly `nodes` (registration and expiry are asynchronous)."""
    def agreed():
        for b in cluster.brokers:
            if b.alive():
                with cluster.connect(b.bootstrap) as c:
                    if {x.node_id for x in c.metadata([]).brokers} != nodes:
                        return False
        return True
    until(agreed, f"brokers {sorted(nodes)} registered and seen by all")


def fill(cluster, topic: str, n: int, parts: int) -> list[str]:
    """n values v0000.. produced acks=all and idempotent, value i to partition i % parts."""
    from confluent_kafka import Producer
    values = [f"v{i:04d}" for i in range(n)]
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    for i, v in enumerate(values):
        p.produce(topic, value=v.encode(), partition=i % parts)
    assert p.flush(60) == 0
    return values


def key_leader(cluster, topic: str, key: str) -> int:
    """The leader (as Metadata reports it) of `key`'s partition of the internal `topic`:
    the coordinator of that transactional id or group id."""
    from semel.protocol.txn_hash import partition_for
    parts = partitions(cluster, topic)
    return parts[partition_for(key, len(parts))][0]


def committed(cluster, group: str, tps) -> dict[int, int]:
    """{partition: committed offset} of `group` for the confluent-kafka TopicPartitions `tps`."""
    from confluent_kafka import Consumer

    from semel.eos.kafka import RESTART_SAFE_CONFIG
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False,
                  **RESTART_SAFE_CONFIG})
    try:
        return {tp.partition: tp.offset for tp in c.committed(tps, 60)}
    finally:
        c.close()


def txn_round(cluster, txn, coordinator: int, leader: int, tp, value: str | None) -> list[KafkaError]:
    """One transaction of `txn` (a tests.support.txn.RawTxn) on new connections (brokers
    may close idle ones): add tp, write `value` there through its leader (none: no
    record), commit. The errors of each step, in order."""
    with Client(cluster.brokers[coordinator].bootstrap, timeout_s=30) as c:
        txn.c = c
        errors = [txn.add(tp)[tp]]
    if value is not None:
        seq = txn.seq.get(tp, 0)
        batch = records.build_batch([(None, value.encode())], producer_id=txn.pid, producer_epoch=txn.epoch,
                                    base_sequence=seq, transactional=True)
        with Client(cluster.brokers[leader].bootstrap, timeout_s=30) as c:
            err, _ = c.produce(*tp, batch, transactional_id=txn.txn_id)
        txn.seq[tp] = seq + 1
        errors.append(err)
    with Client(cluster.brokers[coordinator].bootstrap, timeout_s=30) as c:
        txn.c = c
        errors.append(txn.end(commit=True))
    return errors


def raw_txn(cluster, txn_id: str):
    """(an initialised tests.support.txn.RawTxn for `txn_id`, its coordinator's node id)."""
    from .txn import RawTxn
    coordinator = txn_coordinator(cluster, txn_id)
    txn = RawTxn(None, txn_id)
    with Client(cluster.brokers[coordinator].bootstrap, timeout_s=30) as c:
        txn.c = c
        until(lambda: txn.init() == KafkaError.NONE, f"a producer id for {txn_id}")
    return txn, coordinator


def txn_coordinator(cluster, txn_id: str) -> int:
    """The node id FindCoordinator names for `txn_id` (the first ask creates the
    transaction log, so it may answer COORDINATOR_NOT_AVAILABLE for a while)."""
    found = []

    def ask() -> bool:
        with Client(cluster.brokers[0].bootstrap, timeout_s=30) as c:
            r = call(c, 10, 3, key=txn_id, key_type=1)
        found.append(r.node_id)
        return r.error_code == 0
    until(ask, f"a coordinator for {txn_id}")
    return found[-1]


def marker_retries(cluster, node: int) -> list[str]:
    """Lines of broker `node`'s log where its transaction coordinator had to retry markers."""
    log = (cluster.data_dir / f"broker-{node}.log").read_text(errors="replace")
    return [line for line in log.splitlines() if "markers to broker" in line]


def leader_of(cluster, topic: str, skip=frozenset()) -> int:
    """Partition 0's live leader as Metadata reports it, not one of `skip` (waits for one)."""
    def lead():
        md = cluster.metadata([topic], skip=skip)
        if md is None or not md.topics or md.topics[0].error_code or not md.topics[0].partitions:
            return None
        leader = md.topics[0].partitions[0].leader_id
        return (leader,) if leader >= 0 and leader not in skip else None   # a tuple: node 0 is falsy
    return until(lead, f"a live leader of {topic}-0", 90)[0]
