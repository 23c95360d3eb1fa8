"""ElectLeaders on a real cluster (etcd and three broker processes) with the balance check
off, used as an operator would: kafka-python's and confluent-kafka's admin clients.

- preferred election after a failover puts leadership back on the first replicas, with
  a new leader epoch, and answers ELECTION_NOT_NEEDED where it already is;
- unclean election happens only when asked: a partition whose in-sync replicas are all
  dead stays leaderless with an out-of-sync replica live, preferred election answers
  PREFERRED_LEADER_NOT_AVAILABLE, and an unclean one elects that replica (losing what
  only the dead replicas had).
"""
from __future__ import annotations

import pytest
from confluent_kafka import ElectionType, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient

from semel.protocol.errors import KafkaError
from tests.support.cluster import module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.wait import until
from tests.support.markers import starts_processes

PREFERRED, UNCLEAN = 0, 1


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "elect", 3, 2, "--auto-leader-rebalance-enable", "false",
                        "--replica-lag-time-max-ms", "1000", "--replica-fetch-wait-max-ms", "100") as c:
        yield c


@pytest.fixture()
def admin(cluster):
    a = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
    yield a
    a.close()


def create(cluster, topic: str, **kw) -> None:
    a = AdminClient({"bootstrap.servers": cluster.bootstrap})
    a.create_topics([NewTopic(topic, **kw)])[topic].result(30)


def results(resp) -> dict[tuple[str, int], int]:
    return {(t.topic, p.partition_id): p.error_code for t in resp.replica_election_results
            for p in t.partition_result}


def produce(cluster, topic: str, values: list[str]) -> None:
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    for v in values:
        p.produce(topic, value=v.encode(), partition=0)
    assert p.flush(30) == 0


def restart(cluster, node: int) -> None:
    cluster.brokers[node].start()
    wait_brokers(cluster, {n for n, b in enumerate(cluster.brokers) if b.alive()})


def test_preferred_election_after_a_failover_with_both_admin_clients(cluster, admin):
    create(cluster, "pref", num_partitions=3, replication_factor=3)
    until(lambda: all(len(p[3]) == 3 for p in partitions(cluster, "pref").values()), "full ISRs")
    before = partitions(cluster, "pref")
    assert all(leader == replicas[0] for leader, _, replicas, _ in before.values())
    cluster.brokers[0].kill()
    until(lambda: all(p[0] not in (0, -1) for p in partitions(cluster, "pref").values()), "leaders off broker 0")
    restart(cluster, 0)
    until(lambda: all(len(p[3]) == 3 for p in partitions(cluster, "pref").values()), "broker 0 back in the ISRs")
    moved = {i for i, (leader, _, replicas, _) in partitions(cluster, "pref").items() if leader != replicas[0]}
    assert moved == {i for i, p in before.items() if p[2][0] == 0}   # no automatic move back: it is off

    resp = admin.elect_leaders(PREFERRED, {"pref": [0, 1, 2]})
    assert resp.error_code == 0
    assert results(resp) == {("pref", i): (0 if i in moved else KafkaError.ELECTION_NOT_NEEDED) for i in range(3)}
    after = partitions(cluster, "pref")
    assert all(leader == replicas[0] for leader, _, replicas, _ in after.values())
    for i in moved:
        assert after[i][1] > before[i][1] + 1      # the failover's epoch, then the election's

    # confluent-kafka: nothing left to elect; each partition says so.
    ck = AdminClient({"bootstrap.servers": cluster.bootstrap})
    got = ck.elect_leaders(ElectionType.PREFERRED, [TopicPartition("pref", i) for i in range(3)]).result(30)
    assert {tp.partition: (err.code() if err else 0) for tp, err in got.items()} == \
        {i: KafkaError.ELECTION_NOT_NEEDED for i in range(3)}


def test_unknown_partitions_are_named_in_the_answer(cluster, admin):
    resp = admin.elect_leaders(PREFERRED, {"no-such-topic": [0]}, raise_errors=False)
    assert results(resp) == {("no-such-topic", 0): KafkaError.UNKNOWN_TOPIC_OR_PARTITION}


def test_unclean_election_only_when_asked(cluster, admin):
    create(cluster, "unclean", num_partitions=1, replica_assignment=[[1, 2]], config={"min.insync.replicas": "1"})
    until(lambda: partitions(cluster, "unclean")[0][3] == (1, 2), "leader 1, both in sync")
    produce(cluster, "unclean", ["both-0", "both-1"])
    cluster.brokers[2].kill()
    until(lambda: partitions(cluster, "unclean")[0][3] == (1,), "broker 2 out of the ISR")
    produce(cluster, "unclean", ["only-on-1"])
    cluster.brokers[1].kill()
    until(lambda: partitions(cluster, "unclean")[0][0] == -1, "leaderless")
    restart(cluster, 2)      # live, but not in sync: no leader unless an operator asks
    wait_brokers(cluster, {0, 2})
    leader, epoch, _, isr = partitions(cluster, "unclean")[0]
    assert (leader, isr) == (-1, (1,))
    # The operator connects now: a client from before may still name a dead controller.
    admin.close()
    admin = KafkaAdminClient(bootstrap_servers=",".join(cluster.brokers[n].bootstrap for n in (0, 2)),
                             request_timeout_ms=30000)

    resp = admin.elect_leaders(PREFERRED, {"unclean": [0]}, raise_errors=False)
    assert results(resp) == {("unclean", 0): KafkaError.PREFERRED_LEADER_NOT_AVAILABLE}
    assert partitions(cluster, "unclean")[0][0] == -1

    resp = admin.elect_leaders(UNCLEAN, {"unclean": [0]})
    assert results(resp) == {("unclean", 0): 0}
    leader, new_epoch, _, isr = partitions(cluster, "unclean")[0]
    assert (leader, isr) == (2, (2,)) and new_epoch == epoch + 1
    # What only broker 1 had is gone: that is what unclean means.
    assert sorted(read_values(cluster.bootstrap, "unclean", 1, "read_uncommitted", want=2)) == ["both-0", "both-1"]

    restart(cluster, 1)      # it follows the new leader, truncating what it alone had
    until(lambda: set(partitions(cluster, "unclean")[0][3]) == {1, 2}, "broker 1 back in the ISR")
    resp = admin.elect_leaders(UNCLEAN, {"unclean": [0]}, raise_errors=False)
    assert results(resp) == {("unclean", 0): KafkaError.ELECTION_NOT_NEEDED}
    assert partitions(cluster, "unclean")[0][0] == 2
    admin.close()
